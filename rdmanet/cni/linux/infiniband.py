"""sysfs facts about InfiniBand ports, IPoIB netdevs and IB VFs, read inside a root like sysfs.py.

Kernel facts relied on (drivers/infiniband/core/sysfs.c, drivers/infiniband/ulp/ipoib/ipoib_main.c and
ipoib_vlan.c, include/uapi/linux/if_arp.h):

- ``/sys/class/net/<if>/type`` is the ARPHRD type: 32 (ARPHRD_INFINIBAND) for an IPoIB netdev
  and for nothing else; 1 for Ethernet (RoCE ports included).
- An IPoIB parent (``ib0``, created by ib_ipoib for each IB port) has ``pkey`` (``0xffff``, the
  full-member bit always set), ``mode`` (``datagram``/``connected``) and ``umcast``; children
  made over rtnetlink have none of these files (read them over netlink instead).
  ``dev_port`` is the IB port number minus one (``dev_id`` on old kernels).
- ``/sys/class/infiniband/<dev>/ports/<n>/``: ``link_layer`` (``InfiniBand``/``Ethernet``),
  ``state`` (``4: ACTIVE``, ``2: INIT`` until the subnet manager configures the port),
  ``phys_state`` (``5: LinkUp``), ``pkeys/<i>`` (the port's pkey table, set by the SM: ``0x8001``,
  ``0x0000`` for an empty slot).
- An RDMA device's node GUID: ``/sys/class/infiniband/<dev>/node_guid``
  (``b859:9f03:00d4:6e2a``); a never-initialised mlx5 VF shows all zeros.
- ``/sys/module/ib_ipoib`` exists while the module is loaded (or built in).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from rdmanet.cni.core.infiniband import PKEY_MASK, guid_of_sysfs

from . import sysfs

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32


def netdev_type(ifname: str, root: str = "/") -> Optional[int]:
    """The ARPHRD type of netdev ``ifname`` (``/sys/class/net/<if>/type``), None when unknown."""
    text = sysfs.read_attribute(f"/sys/class/net/{_name(ifname)}/type", root)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def is_ipoib(ifname: str, root: str = "/") -> bool:
    return netdev_type(ifname, root) == ARPHRD_INFINIBAND


def module_loaded(name: str, root: str = "/") -> bool:
    return bool(sysfs.list_names(f"/sys/module/{_name(name)}", root))


@dataclass(frozen=True)
class IpoibParent:
    """What an IPoIB parent netdev's sysfs files say (None where a file is missing)."""

    pkey: Optional[int]  # 15-bit key
    mode: Optional[str]
    umcast: Optional[bool]


def ipoib_parent(ifname: str, root: str = "/") -> IpoibParent:
    base = f"/sys/class/net/{_name(ifname)}"
    pkey_text = sysfs.read_attribute(f"{base}/pkey", root)
    try:
        pkey = int(pkey_text, 16) & PKEY_MASK if pkey_text else None
    except ValueError:
        pkey = None
    mode = sysfs.read_attribute(f"{base}/mode", root)
    umcast = sysfs.read_attribute(f"{base}/umcast", root)
    return IpoibParent(pkey=pkey, mode=mode if mode in ("datagram", "connected") else None,
                       umcast=None if umcast is None else umcast.strip() == "1")


@dataclass(frozen=True)
class IbPort:
    device: str  # RDMA device, e.g. mlx5_0
    port: int

    def describe(self) -> str:
        return f"{self.device} port {self.port}"


def port_of_netdev(ifname: str, root: str = "/") -> Optional[IbPort]:
    """The RDMA device and port behind netdev ``ifname`` (its ``device/infiniband/<dev>`` and
    ``dev_port`` + 1); None unless the netdev has exactly one RDMA device."""
    devices = sysfs.rdma_devices_for_netdev(ifname, root)
    if len(devices) != 1:
        return None
    base = f"/sys/class/net/{_name(ifname)}"
    port = 1
    for attr in ("dev_port", "dev_id"):
        text = sysfs.read_attribute(f"{base}/{attr}", root)
        if text:
            try:
                port = int(text, 0) + 1
                break
            except ValueError:
                continue
    return IbPort(devices[0], port)


def ports(device: str, root: str = "/") -> list[int]:
    return sorted(int(n) for n in sysfs.list_names(f"/sys/class/infiniband/{_name(device)}/ports", root) if n.isdigit())


def _port_attr(port: IbPort, attr: str, root: str) -> Optional[str]:
    return sysfs.read_attribute(f"/sys/class/infiniband/{_name(port.device)}/ports/{port.port}/{attr}", root)


def link_layer(port: IbPort, root: str = "/") -> Optional[str]:
    """``InfiniBand``, ``Ethernet`` (RoCE) or ``Unknown``; None when the port does not exist."""
    return _port_attr(port, "link_layer", root)


def port_state(port: IbPort, root: str = "/") -> Optional[str]:
    """``ACTIVE``, ``INIT``, ``DOWN``, ``ARMED`` ... (the name after ``N: `` in ``state``)."""
    return _state_name(_port_attr(port, "state", root))


def phys_state(port: IbPort, root: str = "/") -> Optional[str]:
    """``LinkUp``, ``Polling``, ``Disabled`` ... (the name after ``N: `` in ``phys_state``)."""
    return _state_name(_port_attr(port, "phys_state", root))


def _state_name(text: Optional[str]) -> Optional[str]:
    if text is None:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def port_pkeys(port: IbPort, root: str = "/") -> Optional[list[int]]:
    """The 15-bit keys in the port's pkey table (empty slots left out), in table order; None when
    the table cannot be read (no ``pkeys`` directory: not an IB port, or no device link)."""
    base = f"/sys/class/infiniband/{_name(port.device)}/ports/{port.port}/pkeys"
    names = [n for n in sysfs.list_names(base, root) if n.isdigit()]
    if not names:
        return None
    keys: list[int] = []
    for name in sorted(names, key=int):
        text = sysfs.read_attribute(f"{base}/{name}", root)
        try:
            key = int(text, 16) & PKEY_MASK if text else 0
        except ValueError:
            continue
        if key and key not in keys:
            keys.append(key)
    return keys


def node_guid(device: str, root: str = "/") -> Optional[int]:
    """The RDMA device's node GUID as a number (0 for an uninitialised VF); None when unreadable."""
    text = sysfs.read_attribute(f"/sys/class/infiniband/{_name(device)}/node_guid", root)
    try:
        return guid_of_sysfs(text) if text else None
    except ValueError:
        return None


def _name(value: str) -> str:
    if not isinstance(value, str) or not value or "/" in value or "\0" in value or value in (".", ".."):
        raise ValueError(f"invalid name {value!r}")
    return value
