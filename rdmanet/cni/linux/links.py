"""Link, address and route operations over rtnetlink (pyroute2), for a socket in some netns.

Every function takes an open ``IPRoute`` (or the :class:`rdmanet.cni.linux.rtnl.Rtnl` that :func:`rtnl_in`
opens inside a namespace: IPRoute's interface without its per-request event loop). Kernel
refusals become CNIError 100 (LINK_FAILURE) with the operation and the errno text, so a user
reads "set MTU 9000 on net1: Invalid argument" rather than a traceback.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import os
import struct
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional

from pyroute2.netlink.exceptions import NetlinkError

from rdmanet.cni.core.errors import LINK_FAILURE, CNIError
from rdmanet.cni.core.result import IPConfig, Route

from . import netns, sysctl
from .rtnl import Rtnl

if TYPE_CHECKING:  # the annotations' type; importing it costs a plugin exec ~30 ms (rdmanet.cni.linux.rtnl)
    from pyroute2.iproute.linux import IPRoute

IFA_F_TENTATIVE = 0x40
IFA_F_DADFAILED = 0x08


@contextmanager
def rtnl_in(netns_path: Optional[str] = None) -> Iterator[IPRoute]:
    """An rtnetlink socket bound to ``netns_path`` (the caller's namespace when None)."""
    if netns_path:
        with netns.entered(netns_path):
            ipr = Rtnl()
    else:
        ipr = Rtnl()
    try:
        yield ipr
    finally:
        ipr.close()


@contextmanager
def rtnl_in_fd(fd: int) -> Iterator[IPRoute]:
    """An rtnetlink socket bound to the namespace open as ``fd``."""
    with netns.entered_fd(fd):
        ipr = Rtnl()
    try:
        yield ipr
    finally:
        ipr.close()


def kernel_error(action: str, exc: NetlinkError, hint: str = "") -> CNIError:
    details = f"{hint} (errno {exc.code})" if hint else f"errno {exc.code}"
    return CNIError(LINK_FAILURE, f"{action}: {exc.args[1] if len(exc.args) > 1 else exc}", details)


MAC_IN_USE_HINT = ("another interface on the same master already has this MAC address; choose another mac "
                   "(config mac, CNI_ARGS MAC or runtimeConfig.mac) or omit it for a random one")


@dataclass
class Link:
    """What a plugin reads of a link: index, name, kind, MAC, MTU, up."""

    index: int
    name: str
    kind: str
    mac: str
    mtu: int
    up: bool
    alias: str = ""
    altnames: tuple = ()
    macvlan_mode: str = ""
    parent_index: int = 0  # IFLA_LINK
    parent_netnsid: Optional[int] = None  # IFLA_LINK_NETNSID when the parent is in another netns
    link_type: int = 0  # ifi_type, the ARPHRD type (32 for IPoIB)
    ipoib_pkey: Optional[int] = None  # IFLA_IPOIB_PKEY of an ipoib link (full-member bit set)
    ipoib_mode: str = ""  # IFLA_IPOIB_MODE of an ipoib link: datagram / connected
    perm_mac: str = ""  # IFLA_PERM_ADDRESS: the burnt-in MAC of a physical device ("" for virtual ones)
    parent_dev: str = ""  # IFLA_PARENT_DEV_NAME: the bus device, e.g. a PCI address ("" for virtual ones)

    @classmethod
    def from_msg(cls, msg) -> "Link":
        attrs = _first_attrs(msg, LINK_NLAS)
        info = attrs.get("IFLA_LINKINFO")
        info_attrs = _first_attrs(info, INFO_NLAS) if info is not None else {}
        data = info_attrs.get("IFLA_INFO_DATA")
        data_attrs = _first_attrs(data, DATA_NLAS) if hasattr(data, "get_attrs") else {}
        return cls(
            index=msg["index"],
            name=attrs.get("IFLA_IFNAME"),
            kind=info_attrs.get("IFLA_INFO_KIND") or "",
            mac=hardware_address(msg),
            mtu=attrs.get("IFLA_MTU") or 0,
            up=bool(msg["flags"] & 1),
            alias=attrs.get("IFLA_IFALIAS") or "",
            altnames=_altnames(attrs.get("IFLA_PROP_LIST")),
            macvlan_mode=data_attrs.get("IFLA_MACVLAN_MODE") or "",
            parent_index=attrs.get("IFLA_LINK") or 0,
            parent_netnsid=attrs.get("IFLA_LINK_NETNSID"),
            link_type=msg.get("ifi_type") or 0,
            ipoib_pkey=data_attrs.get("IFLA_IPOIB_PKEY"),
            ipoib_mode=data_attrs.get("IFLA_IPOIB_MODE") or "",
            perm_mac=(attrs.get("IFLA_PERM_ADDRESS") or "").lower(),
            parent_dev=attrs.get("IFLA_PARENT_DEV_NAME") or "",
        )


# The NLAs Link reads. pyroute2 decodes an NLA's value when it is first read: a link message
# carries some forty, among them the large nested IFLA_AF_SPEC and the statistics, which Link
# never reads and so never pays for.
LINK_NLAS = frozenset(("IFLA_IFNAME", "IFLA_MTU", "IFLA_IFALIAS", "IFLA_PROP_LIST", "IFLA_LINK", "IFLA_LINK_NETNSID",
                       "IFLA_PERM_ADDRESS", "IFLA_PARENT_DEV_NAME", "IFLA_LINKINFO"))
INFO_NLAS = frozenset(("IFLA_INFO_KIND", "IFLA_INFO_DATA"))
DATA_NLAS = frozenset(("IFLA_MACVLAN_MODE", "IFLA_IPOIB_PKEY", "IFLA_IPOIB_MODE"))


def _first_attrs(msg, names: frozenset) -> dict:
    """{NLA name: value of its first occurrence} of the NLAs in ``names``, in one pass (``msg.get``
    scans all NLAs per name), decoding only those."""
    found: dict = {}
    for slot in msg["attrs"]:
        name = slot[0]
        if name in names and name not in found:
            found[name] = slot[1]
    return found


def hardware_address(msg) -> str:
    """IFLA_ADDRESS as colon hex, whatever its length. pyroute2 decodes it as 6 bytes (an
    Ethernet MAC), which cuts a 20-byte IPoIB address short: the raw payload is read instead."""
    for slot in msg["attrs"]:
        if slot[0] != "IFLA_ADDRESS":
            continue
        cell = getattr(slot, "cell", (None, None))[1]
        if cell is None or getattr(cell, "data", None) is None or cell.length is None:
            return (slot[1] or "").lower()
        raw = bytes(cell.data[cell.offset + 4: cell.offset + cell.length])
        return ":".join(f"{b:02x}" for b in raw)
    return ""


def _altnames(props) -> tuple:
    """The IFLA_ALT_IFNAME values of an IFLA_PROP_LIST."""
    return tuple(value for key, value in props["attrs"] if key == "IFLA_ALT_IFNAME") if props else ()


def _get_link(ipr: IPRoute, what: str, **key) -> Optional[Link]:
    try:
        return Link.from_msg(ipr.link("get", **key)[0])
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return None
        raise kernel_error(f"look up link {what}", exc) from exc


def find_link(ipr: IPRoute, name: str) -> Optional[Link]:
    if _absent(ipr, name):
        return None
    return _get_link(ipr, name, ifname=name)


def _absent(ipr: IPRoute, name: str) -> bool:
    """Whether the namespace of ``ipr`` surely has no link ``name`` (SIOCGIFINDEX says ENODEV: a
    few us, where an RTM_GETLINK refused with ENODEV costs ~45 us of pyroute2); False when unsure."""
    return _ioctl_index(ipr, name) == 0


def _ioctl_index(ipr: IPRoute, name: str) -> Optional[int]:
    """The index of link ``name`` by SIOCGIFINDEX on ``ipr``'s socket; 0 when there is surely none
    (ENODEV; no link has index 0); None when the ioctl cannot tell (a name it cannot carry, no
    socket, another error)."""
    raw = name.encode()
    if not 0 < len(raw) < IFNAMSIZ or b"\0" in raw or not hasattr(ipr, "fileno"):
        return None
    try:
        return struct.unpack_from("i", _ifreq(ipr.fileno(), SIOCGIFINDEX, raw), IFNAMSIZ)[0]
    except OSError as exc:
        return 0 if exc.errno == errno.ENODEV else None


@dataclass(frozen=True)
class LinkBasics:
    """What most lookups of a link by name need: its index, primary name, MAC and MTU."""

    index: int
    name: str
    mac: str
    mtu: int


# netdevice(7) ioctls (struct ifreq: the name in 16 bytes, then a 24-byte union), answered for the
# network namespace of the socket they are made on.
SIOCGIFNAME, SIOCGIFMTU, SIOCGIFHWADDR, SIOCGIFINDEX = 0x8910, 0x8921, 0x8927, 0x8933
IFNAMSIZ = 16
ARPHRD_ETHER = 1


def _ifreq(fd: int, request: int, name: bytes = b"", value: int = 0) -> bytes:
    return fcntl.ioctl(fd, request, struct.pack("16si20x", name, value))


def find_basics(ipr: IPRoute, name: str) -> Optional[LinkBasics]:
    """:class:`LinkBasics` of link ``name`` (or an altname of it) in the namespace of ``ipr``;
    None when there is none. An Ethernet link is read with netdevice(7) ioctls on ``ipr``'s
    socket (a few us; an RTM_GETLINK answer carries some forty NLAs for pyroute2 to parse, ~150
    us); anything else, or a link renamed while it was read, through :func:`find_link`."""
    index = _ioctl_index(ipr, name)
    if index == 0:
        return None
    if index is not None:
        fd = ipr.fileno()
        try:
            primary = _ifreq(fd, SIOCGIFNAME, value=index)[:IFNAMSIZ].rstrip(b"\0")
            family, hwaddr = struct.unpack_from("H6s", _ifreq(fd, SIOCGIFHWADDR, primary), IFNAMSIZ)
            mtu = struct.unpack_from("i", _ifreq(fd, SIOCGIFMTU, primary), IFNAMSIZ)[0]
            again = struct.unpack_from("i", _ifreq(fd, SIOCGIFINDEX, primary), IFNAMSIZ)[0]
        except OSError:
            pass  # renamed or removed meanwhile: netlink decides
        else:
            if family == ARPHRD_ETHER and again == index:
                return LinkBasics(index, primary.decode(), ":".join(f"{b:02x}" for b in hwaddr), mtu)
    link = find_link(ipr, name)
    return None if link is None else LinkBasics(link.index, link.name, link.mac, link.mtu)


def link_by_index(ipr: IPRoute, index: int) -> Optional[Link]:
    return _get_link(ipr, f"#{index}", index=index)


def nsid_of(ipr: IPRoute, fd: int) -> Optional[int]:
    """The nsid the namespace of ``ipr`` gives the namespace open as ``fd`` (as its links'
    IFLA_LINK_NETNSID name it); None when it gives none."""
    try:
        nsid = ipr.get_netnsid(fd=fd).get("nsid")
    except NetlinkError:
        return None
    return nsid if isinstance(nsid, int) and nsid >= 0 else None


def link_in(ipr: IPRoute, index: int, nsid: Optional[int]) -> Optional[Link]:
    """Link ``index`` of the namespace the namespace of ``ipr`` knows as ``nsid`` (None: its
    own), as that socket sees it: its IFLA_LINK_NETNSID in the terms of ``ipr``'s namespace."""
    if nsid is None:
        return link_by_index(ipr, index)
    try:
        return Link.from_msg(ipr.get_links(index, IFLA_IF_NETNSID=nsid)[0])
    except NetlinkError as exc:
        if exc.code in (errno.ENODEV, errno.EINVAL, errno.ENOENT):
            return None
        raise kernel_error(f"look up link #{index} of netns id {nsid}", exc) from exc


def default_route_link(ipr: IPRoute) -> Optional[str]:
    """Name of the interface of the first default route (IPv4 first, then IPv6), like Go macvlan."""
    for family in (2, 10):
        for route in ipr.get_routes(family=family, table=254):
            if route["dst_len"] == 0 and route.get("RTA_OIF"):
                link = link_by_index(ipr, route.get("RTA_OIF"))
                if link:
                    return link.name
            for hop in route.get("RTA_MULTIPATH") or []:
                link = link_by_index(ipr, hop["oif"])
                if route["dst_len"] == 0 and link:
                    return link.name
    return None


def create_macvlan(ipr: IPRoute, name: str, master_index: int, mode: str, netns_fd: Optional[int],
                   mac: Optional[str], mtu: Optional[int], master_name: Optional[str] = None) -> None:
    """Create a macvlan of ``master_index``; with ``netns_fd`` it is born inside that namespace.
    ``master_name`` only makes error messages readable."""
    spec = {"ifname": name, "kind": "macvlan", "link": master_index, "macvlan_mode": mode}
    if netns_fd is not None:
        spec["net_ns_fd"] = netns_fd
    if mac:
        spec["address"] = mac
    if mtu:
        spec["mtu"] = mtu
    try:
        ipr.link("add", **spec)
    except NetlinkError as exc:
        master = master_name or f"#{master_index}"
        hint = ""
        if exc.code == errno.EINVAL:
            hint = (f"a master in passthru mode takes exactly one macvlan and passthru needs a master without "
                    f"other macvlans (see 'ip -d link show' for macvlans on {master}); otherwise check mode, mac and mtu")
        elif exc.code == errno.EADDRINUSE:
            hint = MAC_IN_USE_HINT
        raise kernel_error(f"create macvlan on master {master} (mode {mode})", exc, hint) from exc


def set_up(ipr: IPRoute, index: int, name: Optional[str] = None) -> None:
    try:
        ipr.link("set", index=index, state="up")
    except NetlinkError as exc:
        hint = MAC_IN_USE_HINT if exc.code == errno.EADDRINUSE else ""
        raise kernel_error(f"set {name or f'link #{index}'} up", exc, hint) from exc


def set_attrs(ipr: IPRoute, index: int, what: str, **attrs) -> None:
    """One RTM_NEWLINK set request (name, mtu, address, ifalias, net_ns_fd, state ...)."""
    try:
        ipr.link("set", index=index, **attrs)
    except NetlinkError as exc:
        hint = MAC_IN_USE_HINT if exc.code == errno.EADDRINUSE else ""
        raise kernel_error(what, exc, hint) from exc


def drop_altname(ipr: IPRoute, index: int, altname: str) -> None:
    """Remove an alternative name (the kernel may keep the old name as one after a rename)."""
    try:
        ipr.link("property_del", index=index, altname=altname)
    except NetlinkError as exc:
        if exc.code not in (errno.ENOENT, errno.ENODATA, errno.EOPNOTSUPP, errno.EINVAL):
            raise kernel_error(f"drop altname {altname}", exc) from exc


def find_by_alias(ipr: IPRoute, alias: str) -> Optional[Link]:
    for msg in ipr.get_links():
        if msg.get("IFLA_IFALIAS") == alias:
            return Link.from_msg(msg)
    return None


def delete(ipr: IPRoute, index: int) -> None:
    try:
        ipr.link("del", index=index)
    except NetlinkError as exc:
        if exc.code != errno.ENODEV:
            raise kernel_error(f"delete link #{index}", exc) from exc


def addresses(ipr: IPRoute, index: int) -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
    return [
        ipaddress.ip_interface(f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}")
        for a in ipr.get_addr(index=index)
    ]


def routes(ipr: IPRoute, index: int, table: int = 254) -> list[Route]:
    """The routes of ``table`` (the main one by default) through link ``index`` (dst, gw)."""
    out = []
    for family in (2, 10):
        for r in ipr.get_routes(family=family, oif=index, table=table):
            dst = r.get("RTA_DST") or ("0.0.0.0" if family == 2 else "::")
            gw = r.get("RTA_GATEWAY")
            out.append(Route(dst=ipaddress.ip_network(f"{dst}/{r['dst_len']}", strict=False),
                             gw=ipaddress.ip_address(gw) if gw else None))
    return out


def configure(ipr: IPRoute, index: int, ifname: str, ips: list[IPConfig], route_list: list[Route]) -> None:
    """Addresses, link up, then routes; a route without ``gw`` goes via the family's gateway
    (pkg/ipam ConfigureIface). Waits up to 5 s for IPv6 DAD when an IPv6 gateway is used."""
    for ip in ips:
        try:
            ipr.addr("add", index=index, address=str(ip.address.ip), prefixlen=ip.address.network.prefixlen)
        except NetlinkError as exc:
            raise kernel_error(f"add address {ip.address} to {ifname}", exc) from exc
    set_up(ipr, index, ifname)
    gateways = {ip.family: ip.gateway for ip in ips if ip.gateway is not None}
    if 6 in gateways:
        settle_ipv6(ipr, index, timeout=5.0, name=ifname)
    for route in route_list:
        gw = route.gw if route.gw is not None else gateways.get(route.dst.version)
        spec = {"dst": str(route.dst), "oif": index}
        if gw is not None:
            spec["gateway"] = str(gw)
        for key in ("priority", "table", "scope"):
            if getattr(route, key) is not None:
                spec[key] = getattr(route, key)
        try:
            ipr.route("add", **spec)
        except NetlinkError as exc:
            raise kernel_error(f"add route {route.dst} via {gw} dev {ifname}", exc) from exc


def configure_in_pod(pod: IPRoute, pod_fd: int, index: int, ifname: str, ips: list[IPConfig], route_list: list[Route]) -> None:
    """Turn on gratuitous ARP / unsolicited NA for the new link (in the pod netns), then
    :func:`configure` it."""
    with netns.entered_fd(pod_fd):
        sysctl.set_interface_sysctl("ipv4", ifname, "arp_notify", "1")
        sysctl.set_interface_sysctl("ipv6", ifname, "ndisc_notify", "1")
    configure(pod, index, ifname, ips, route_list)


def settle_ipv6(ipr: IPRoute, index: int, timeout: float, name: Optional[str] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        addrs = [(a.get("IFA_ADDRESS"), a.get("IFA_FLAGS", a["flags"])) for a in ipr.get_addr(index=index, family=10)]
        flags = [f for _, f in addrs]
        if failed := [addr for addr, f in addrs if f & IFA_F_DADFAILED]:
            raise CNIError(LINK_FAILURE, f"IPv6 duplicate address detection failed for {', '.join(failed)} on {name or f'link #{index}'}",
                           "another host or pod on the same network already uses the address; free it, or exclude it from the IPAM range")
        if not any(f & IFA_F_TENTATIVE for f in flags):
            return
        time.sleep(0.05)
