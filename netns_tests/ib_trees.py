"""Fake sysfs trees (for ``RDMANET_SYSFS_ROOT``) modelled on real ConnectX InfiniBand ports.

No kernel gives an IB port without an HCA (no software RDMA driver has an InfiniBand link layer:
rdma_rxe and siw report Ethernet), so IB detection, pkeys, GUIDs and the VF/PF topology are tested
against trees laid out as a ConnectX-6 (mlx5) node shows them, with the kernel's relative links
(nstools.fake_pci_function):

    sys/bus/pci/devices/0000:3b:00.0 -> ../../../devices/pci0000:3b/0000:3b:00.0
    sys/devices/pci0000:3b/0000:3b:00.0/
        driver -> ../../../bus/pci/drivers/mlx5_core
        net/ibp59s0f0/{type=32, address=<20 bytes>, pkey=0xffff, mode=datagram, umcast=0,
                       dev_port=0, dev_id=0x0, mtu, device -> ../../../0000:3b:00.0}
        infiniband/mlx5_0/{node_guid=b859:9f03:00d4:6e2a, node_type, hca_type,
                           ports/1/{link_layer=InfiniBand, state=4: ACTIVE, phys_state=5: LinkUp,
                                    rate, lid, sm_lid, pkeys/0..N (0xffff, 0x8001, then 0x0000)}}
        sriov_totalvfs, sriov_numvfs, virtfnN -> ../0000:3b:00.N (PF of IB VFs)
    sys/class/infiniband/mlx5_0 -> ../../devices/pci0000:3b/0000:3b:00.0/infiniband/mlx5_0
    sys/class/net/ibp59s0f0 -> ../../devices/pci0000:3b/0000:3b:00.0/net/ibp59s0f0
    sys/module/ib_ipoib/initstate = live     (the module is loaded)

Used by tests/ (unit, no root) and netns_tests/ (a veth gets the IB identity of ``netdev``).
"""

from __future__ import annotations

import pathlib
from typing import Iterable, Optional

try:
    from netns_tests import nstools
except ImportError:  # pragma: no cover - the test's dir is on sys.path
    import nstools  # type: ignore[no-redef]

PF_PCI = "0000:3b:00.0"
NODE_GUID = "b859:9f03:00d4:6e2a"
# flags 0x80 (connected capable) + QPN 0x000048 + GID fe80::b859:9f03:00d4:6e2b (port GUID)
HWADDR = "80:00:00:48:fe:80:00:00:00:00:00:00:b8:59:9f:03:00:d4:6e:2b"
PKEY_TABLE_SIZE = 128


def _write(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


def ib_device(root: pathlib.Path, pci: str, ibdev: str, *, node_guid: str = NODE_GUID, link_layer: str = "InfiniBand",
              state: str = "4: ACTIVE", phys_state: str = "5: LinkUp", pkeys: Iterable[int] = (0xFFFF, 0x8001),
              hca_type: str = "MT4123") -> pathlib.Path:
    """RDMA device ``ibdev`` of PCI function ``pci`` (created if absent) with port 1."""
    if not (root / "sys" / "bus" / "pci" / "devices" / pci).is_symlink():
        nstools.fake_pci_function(root, pci)
    bridge = f"pci{pci[:7]}"
    dev = root / "sys" / "devices" / bridge / pci / "infiniband" / ibdev
    _write(dev / "node_guid", node_guid)
    _write(dev / "node_type", "1: CA")
    _write(dev / "hca_type", hca_type)
    port = dev / "ports" / "1"
    _write(port / "link_layer", link_layer)
    _write(port / "state", state)
    _write(port / "phys_state", phys_state)
    _write(port / "rate", "200 Gb/sec (4X HDR)" if link_layer == "InfiniBand" else "100 Gb/sec (2X HDR)")
    _write(port / "lid", "0x5" if link_layer == "InfiniBand" else "0x0")
    _write(port / "sm_lid", "0x1" if link_layer == "InfiniBand" else "0x0")
    table = list(pkeys)
    for i in range(PKEY_TABLE_SIZE if link_layer == "InfiniBand" else 1):
        _write(port / "pkeys" / str(i), f"0x{table[i]:04x}" if i < len(table) else "0x0000")
    klass = root / "sys" / "class" / "infiniband"
    klass.mkdir(parents=True, exist_ok=True)
    if not (klass / ibdev).is_symlink():
        (klass / ibdev).symlink_to(f"../../devices/{bridge}/{pci}/infiniband/{ibdev}")
    return root


def ipoib_port(root: pathlib.Path, netdev: str, *, pci: str = PF_PCI, ibdev: str = "mlx5_0", pkey: int = 0xFFFF,
               mode: str = "datagram", mtu: int = 4092, hwaddr: str = HWADDR, ipoib_loaded: bool = True,
               **device: object) -> pathlib.Path:
    """``netdev`` as the IPoIB netdev (ARPHRD 32) of port 1 of ``ibdev`` on ``pci``."""
    nstools.fake_pci_function(root, pci, netdev=netdev)
    ib_device(root, pci, ibdev, **device)  # type: ignore[arg-type]
    net = root / "sys" / "devices" / f"pci{pci[:7]}" / pci / "net" / netdev
    for name, value in (("type", "32"), ("address", hwaddr), ("pkey", f"0x{pkey:04x}"), ("mode", mode),
                        ("umcast", "0"), ("dev_port", "0"), ("dev_id", "0x0"), ("mtu", str(mtu))):
        _write(net / name, value)
    if ipoib_loaded:
        _write(root / "sys" / "module" / "ib_ipoib" / "initstate", "live")
    return root


def roce_port(root: pathlib.Path, netdev: str, *, pci: str = "0000:5e:00.0", ibdev: str = "mlx5_2") -> pathlib.Path:
    """``netdev`` as the Ethernet netdev (ARPHRD 1) of a RoCE port: link layer Ethernet."""
    nstools.fake_pci_function(root, pci, netdev=netdev)
    ib_device(root, pci, ibdev, link_layer="Ethernet", pkeys=(0xFFFF,), node_guid="0c42:a103:0065:8f20")
    net = root / "sys" / "devices" / f"pci{pci[:7]}" / pci / "net" / netdev
    _write(net / "type", "1")
    _write(net / "dev_port", "0")
    return root


def ib_vf(root: pathlib.Path, vf_pci: str, *, pf_pci: str = PF_PCI, vf_index: int = 0, netdev: Optional[str] = None,
          ibdev: Optional[str] = None, node_guid: str = "0000:0000:0000:0000", pf_netdev: Optional[str] = None,
          totalvfs: int = 8) -> pathlib.Path:
    """An IB VF of ``pf_pci`` (mlx5_core): its netdev (ARPHRD 32) and RDMA device with a node
    GUID (all zero: never initialised); the PF gets ``sriov_totalvfs`` and, with ``pf_netdev``,
    its IPoIB netdev."""
    if pf_netdev and not (root / "sys" / "class" / "net" / pf_netdev).exists():
        ipoib_port(root, pf_netdev, pci=pf_pci)
    nstools.fake_pci_function(root, vf_pci, netdev=netdev, pf=pf_pci, vf_index=vf_index)
    _write(root / "sys" / "devices" / f"pci{pf_pci[:7]}" / pf_pci / "sriov_totalvfs", str(totalvfs))
    if netdev:
        net = root / "sys" / "devices" / f"pci{vf_pci[:7]}" / vf_pci / "net" / netdev
        zero_hw = "00:00:0b:a8:fe:80:00:00:00:00:00:00:00:00:00:00:00:00:00:00"
        for name, value in (("type", "32"), ("address", zero_hw), ("pkey", "0xffff"), ("mode", "datagram"),
                            ("dev_port", "0")):
            _write(net / name, value)
    if ibdev:
        ib_device(root, vf_pci, ibdev, node_guid=node_guid, state="2: INIT", hca_type="MT4124")
    return root
