"""What the doctor reads about the host: NICs, RDMA devices, SR-IOV, modules, /dev/infiniband, the
RDMA netns mode. Reading only (no judgement here: see ``host_checks``); every path is read under a
root so tests point them at fake trees.

Roots: ``sysfs_root`` stands for "/" when reading ``/sys`` (``rdmanet.cni.linux.sysfs`` resolves links
inside it); ``proc_root`` for "/" when reading ``/proc/modules`` and ``/proc/net/route``;
``dev_root`` for "/" when reading ``/dev/infiniband``.

Kernel facts relied on, besides those in ``rdmanet.cni.linux.sysfs``:

- ``/sys/class/net/<if>/{operstate,carrier,speed,mtu}``: operstate ``up``/``down``/``unknown``...;
  carrier ``1``/``0`` (EINVAL while the link is administratively down); speed in Mb/s (``-1`` or
  EINVAL when unknown).
- ``/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,link_layer,rate}``: ``4: ACTIVE``,
  ``5: LinkUp``, ``Ethernet`` (RoCE) or ``InfiniBand``, ``100 Gb/sec (2X HDR)``; ``fw_ver``.
- ``/sys/class/infiniband_verbs/uverbs<N>/ibdev`` names the RDMA device of ``/dev/infiniband/uverbs<N>``.
- rxe (soft-RoCE) has a ``parent`` attribute naming its netdev; for devices without one, the
  netdev of GID 0 (``ports/1/gid_attrs/ndevs/0``) is the port's netdev.
- ``/proc/modules``: one loaded module per line, name first. ``/sys/module/<name>`` exists for a
  loaded module (with an ``initstate`` file) and for a built-in one that has parameters (ib_core
  has ``netns_mode``; no ``initstate``).
- ``/proc/net/route``: the default route is Destination and Mask ``00000000``.
- InfiniBand (``rdmanet.cni.linux.infiniband``): ``/sys/class/net/<if>/type`` 32 is an IPoIB netdev, whose
  ``pkey`` and ``mode`` the parent shows; ``/sys/class/infiniband/<dev>/node_guid``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Optional

from rdmanet.cni.linux import infiniband, sysfs

from . import nic_models

MODULES = ("mlx5_core", "mlx5_ib", "mlx4_core", "mlx4_ib", "ib_core", "ib_uverbs", "rdma_ucm", "ib_umad",
           "ib_ipoib", "rdma_rxe", "siw", "nvidia", "nvidia_peermem")


@dataclass
class Netdev:
    name: str
    exists: bool
    operstate: Optional[str] = None
    carrier: Optional[bool] = None
    speed: Optional[int] = None  # Mb/s; None when the kernel does not know
    mtu: Optional[int] = None
    rdma: list[str] = field(default_factory=list)
    link_type: Optional[int] = None  # ARPHRD type (``type``): 32 for IPoIB, 1 for Ethernet
    pkey: Optional[int] = None  # IPoIB parent: 15-bit partition key (``pkey``)
    ipoib_mode: Optional[str] = None  # IPoIB parent: datagram / connected (``mode``)


@dataclass
class PciFunction:
    address: str
    vendor: Optional[str]
    device: Optional[str]
    pci_class: Optional[str]
    driver: Optional[str]
    netdevs: list[str]
    rdma: list[str]
    physfn: Optional[str] = None  # the PF of a VF
    sriov_totalvfs: Optional[int] = None
    sriov_numvfs: Optional[int] = None
    vfs: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class RdmaPort:
    number: int
    state: Optional[str]
    phys_state: Optional[str]
    link_layer: Optional[str]
    rate: Optional[str]


@dataclass
class RdmaDevice:
    name: str
    parent_kind: Optional[str]  # "pci", "auxiliary", None (rxe, siw)
    parent_id: Optional[str]
    netdevs: list[str]
    ports: list[RdmaPort]
    uverbs: list[str]
    fw_ver: Optional[str] = None
    node_guid: Optional[int] = None  # 0 for a never-initialised IB VF


@dataclass
class Modules:
    source: str  # where: "<proc_root>/proc/modules", "/sys/module only", or "" (nothing readable)
    state: dict[str, Optional[str]]  # name -> "loaded" | "built-in" | None


@dataclass
class DevInfiniband:
    path: str
    exists: bool
    entries: list[str]


@dataclass
class ModeReading:
    """The RDMA netns mode as RDMA netlink answered (``rdma system``)."""

    status: str  # "ok", "absent" (no RDMA netlink), "unsupported" (kernel < 5.2), "error"
    mode: Optional[str] = None  # "shared" / "exclusive" when status is "ok"
    detail: str = ""


@dataclass
class HostFacts:
    pci: dict[str, PciFunction]
    netdevs: dict[str, Netdev]
    rdma: dict[str, RdmaDevice]
    modules: Modules
    dev: DevInfiniband
    mode: ModeReading
    default_route: Optional[str] = None  # interface of the default route, when /proc says

    def nic_functions(self) -> list[PciFunction]:
        """PCI functions that are not VFs (PFs and plain NICs)."""
        return [f for f in self.pci.values() if f.physfn is None]


# --------------------------------------------------------------------------- RDMA netns mode


def read_netns_mode() -> ModeReading:
    """``rdma system`` over RDMA netlink with the project's nldev client (SYS_GET)."""
    try:
        from rdmanet.cni.linux import rdma_netlink
    except ImportError as exc:  # pyroute2 missing from this install
        return ModeReading("error", None, f"the RDMA netlink client cannot be loaded: {exc}")
    try:
        with rdma_netlink.RdmaNetlink() as nl:
            mode = nl.netns_mode()
    except rdma_netlink.RdmaNetlinkUnavailable:
        return ModeReading("absent", None, "this kernel has no RDMA netlink (the RDMA core, ib_core, is not loaded)")
    except OSError as exc:
        return ModeReading("error", None, f"RDMA netlink SYS_GET failed: {exc.strerror or exc}")
    if mode is None:
        return ModeReading("unsupported", None, "the kernel does not report the mode (RDMA netlink SYS_GET needs Linux 5.2)")
    return ModeReading("ok", mode)


# --------------------------------------------------------------------------- sysfs


def _int(text: Optional[str]) -> Optional[int]:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def read_netdev(name: str, root: str) -> Netdev:
    base = f"/sys/class/net/{name}"
    mtu = _int(sysfs.read_attribute(f"{base}/mtu", root))
    operstate = sysfs.read_attribute(f"{base}/operstate", root)
    if mtu is None and operstate is None:
        return Netdev(name, exists=False)
    carrier = sysfs.read_attribute(f"{base}/carrier", root)
    speed = _int(sysfs.read_attribute(f"{base}/speed", root))
    parent = infiniband.ipoib_parent(name, root)
    return Netdev(name, True, operstate, None if carrier not in ("0", "1") else carrier == "1",
                  speed if speed is not None and speed > 0 else None, mtu, sysfs.rdma_devices_for_netdev(name, root),
                  infiniband.netdev_type(name, root), parent.pkey, parent.mode)


def read_pci_function(address: str, root: str) -> PciFunction:
    base = f"/sys/bus/pci/devices/{address}"
    fn = PciFunction(
        address=address,
        vendor=sysfs.read_attribute(f"{base}/vendor", root),
        device=sysfs.read_attribute(f"{base}/device", root),
        pci_class=sysfs.read_attribute(f"{base}/class", root),
        driver=sysfs.driver_of_pci(address, root),
        netdevs=sysfs.netdevs_of_pci(address, root),
        rdma=sysfs.rdma_devices_for_device_id(address, root),
        physfn=sysfs.pf_of_vf(address, root),
    )
    fn.sriov_totalvfs = sysfs.sriov_totalvfs(address, root)
    if fn.sriov_totalvfs is not None:
        fn.sriov_numvfs = sysfs.sriov_numvfs(address, root)
        fn.vfs = sysfs.vfs_of_pf(address, root)
    return fn


def read_rdma_device(name: str, root: str, uverbs_of: dict[str, list[str]]) -> RdmaDevice:
    base = f"/sys/class/infiniband/{name}"
    parent = sysfs.rdma_device_parent(name, root)
    if parent is None:
        netdev = sysfs.read_attribute(f"{base}/parent", root)
        netdevs = [netdev] if netdev else []
    elif parent[0] == "pci":
        netdevs = sysfs.netdevs_of_pci(parent[1], root)
    else:
        netdevs = sysfs.netdevs_of_auxiliary(parent[1], root)
    if not netdevs:  # siw, or a driver whose netdev hangs elsewhere: the netdev of the port's GID 0
        netdev = sysfs.read_attribute(f"{base}/ports/1/gid_attrs/ndevs/0", root)
        netdevs = [netdev] if netdev else []
    ports = []
    for number in sorted((n for n in sysfs.list_names(f"{base}/ports", root) if n.isdigit()), key=int):
        p = f"{base}/ports/{number}"
        ports.append(RdmaPort(int(number), sysfs.read_attribute(f"{p}/state", root),
                              sysfs.read_attribute(f"{p}/phys_state", root),
                              sysfs.read_attribute(f"{p}/link_layer", root), sysfs.read_attribute(f"{p}/rate", root)))
    return RdmaDevice(name, parent[0] if parent else None, parent[1] if parent else None, netdevs, ports,
                      uverbs_of.get(name, []), sysfs.read_attribute(f"{base}/fw_ver", root), infiniband.node_guid(name, root))


def _interesting(fn: PciFunction) -> bool:
    """A network function that is Mellanox/NVIDIA or has an RDMA device."""
    return nic_models.is_network_class(fn.pci_class) and (nic_models.is_mellanox(fn.vendor) or bool(fn.rdma))


def read_sysfs(root: str, extra_netdevs: tuple[str, ...] = ()) -> tuple[dict, dict, dict]:
    """(PCI functions, netdevs, RDMA devices) worth showing, read under ``root``."""
    pci: dict[str, PciFunction] = {}
    for address in sysfs.pci_devices(root):
        pci_class = sysfs.read_attribute(f"/sys/bus/pci/devices/{address}/class", root)
        if not nic_models.is_network_class(pci_class):
            continue
        fn = read_pci_function(address, root)
        if _interesting(fn):
            pci[address] = fn
    uverbs_of: dict[str, list[str]] = {}
    for uverbs in sysfs.list_names("/sys/class/infiniband_verbs", root):
        ibdev = sysfs.read_attribute(f"/sys/class/infiniband_verbs/{uverbs}/ibdev", root)
        if ibdev:
            uverbs_of.setdefault(ibdev, []).append(uverbs)
    rdma = {name: read_rdma_device(name, root, uverbs_of) for name in sysfs.rdma_devices(root)}
    names: list[str] = []
    for fn in pci.values():
        names += fn.netdevs
    for dev in rdma.values():
        names += dev.netdevs
    names += list(extra_netdevs)
    netdevs = {}
    for name in names:
        if name and name not in netdevs:
            try:
                netdevs[name] = read_netdev(name, root)
            except ValueError:  # not a valid interface name (from a config): nothing to read
                netdevs[name] = Netdev(name, exists=False)
    return pci, netdevs, rdma


# --------------------------------------------------------------------------- proc, dev


def read_modules(proc_root: str, sysfs_root: str) -> Modules:
    path = os.path.join(proc_root, "proc/modules")
    loaded: Optional[set[str]] = None
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            loaded = {line.split()[0] for line in f if line.split()}
    except OSError:
        pass
    in_sys = set(sysfs.list_names("/sys/module", sysfs_root))
    if loaded is None and not in_sys:
        return Modules("", {name: None for name in MODULES})
    state: dict[str, Optional[str]] = {}
    for name in MODULES:
        if loaded is not None and name in loaded:
            state[name] = "loaded"
        elif name in in_sys:
            live = sysfs.read_attribute(f"/sys/module/{name}/initstate", sysfs_root) is not None
            state[name] = "loaded" if live else "built-in"
        else:
            state[name] = None
    return Modules(path if loaded is not None else "/sys/module only", state)


def read_dev_infiniband(dev_root: str) -> DevInfiniband:
    path = os.path.join(dev_root, "dev/infiniband")
    try:
        entries = sorted(os.listdir(path))
    except OSError:
        return DevInfiniband(path, False, [])
    return DevInfiniband(path, True, entries)


def read_default_route(proc_root: str) -> Optional[str]:
    """The interface of the default IPv4 route with the lowest metric (``/proc/net/route``)."""
    try:
        with open(os.path.join(proc_root, "proc/net/route"), encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return None
    best: Optional[tuple[int, str]] = None
    for line in lines:
        cols = line.split()
        if len(cols) >= 8 and cols[1] == "00000000" and cols[7] == "00000000":
            metric = int(cols[6]) if cols[6].isdigit() else 0
            if best is None or metric < best[0]:
                best = (metric, cols[0])
    return best[1] if best else None


def gather(sysfs_root: str, proc_root: str, dev_root: str, mode_reader: Callable[[], ModeReading],
           extra_netdevs: tuple[str, ...] = ()) -> HostFacts:
    default_route = read_default_route(proc_root)
    extra = extra_netdevs + ((default_route,) if default_route else ())
    pci, netdevs, rdma = read_sysfs(sysfs_root, extra)
    return HostFacts(pci, netdevs, rdma, read_modules(proc_root, sysfs_root), read_dev_infiniband(dev_root),
                     mode_reader(), default_route)
