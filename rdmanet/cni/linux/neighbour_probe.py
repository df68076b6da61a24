"""ARP and IPv6 neighbour-solicitation probes sent from a pod's Ethernet interface: the optional
checks an ADD makes before it answers (rdmanet.cni.linux.pod.configure).

- Duplicate address detection, before the address is set: an ARP probe (RFC 5227: sender address
  0.0.0.0) or a DAD neighbour solicitation (RFC 4862: source ``::``, to the target's
  solicited-node group) for each address; an answer means another host holds it, and its MAC is
  the error's. A Linux host answers both from the kernel.
- Gateway reachability, once the addresses are set: an ARP request or a neighbour solicitation
  for the gateway from the interface's own address; no answer within the timeout is an error.

Frames go out and come back through an AF_PACKET socket bound to the interface, opened in the pod
netns (it stays there), so nothing depends on the pod's routes, rules or neighbour table. Each
probe is sent three times within its timeout (``probeTimeoutMs``); the first answer ends it.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import struct
import time
from typing import Optional

from rdmanet.cni.core.errors import ADDRESS_CONFLICT, GATEWAY_UNREACHABLE, INVALID_CONFIG, CNIError
from rdmanet.cni.core.result import IPConfig

from . import netns

ETH_P_ARP = 0x0806
ETH_P_IPV6 = 0x86DD
ETH_P_IP = 0x0800
ARPHRD_ETHER = 1
PACKET_OUTGOING = 4
SOL_PACKET = 263
PACKET_ADD_MEMBERSHIP = 1
PACKET_MR_ALLMULTI = 2
ICMPV6 = 58
NEIGHBOUR_SOLICITATION = 135
NEIGHBOUR_ADVERTISEMENT = 136
SOURCE_LINK_ADDRESS = 1
TARGET_LINK_ADDRESS = 2
SENDS = 3
BROADCAST = b"\xff" * 6
UNSPECIFIED4 = ipaddress.IPv4Address("0.0.0.0")
UNSPECIFIED6 = ipaddress.IPv6Address("::")


def _mac_bytes(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


def _mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


# --------------------------------------------------------------------------- frames


def arp_request(mac: str, source: ipaddress.IPv4Address, target: ipaddress.IPv4Address) -> bytes:
    """A broadcast ARP request (a probe when ``source`` is 0.0.0.0)."""
    own = _mac_bytes(mac)
    arp = struct.pack("!HHBBH6s4s6s4s", ARPHRD_ETHER, ETH_P_IP, 6, 4, 1, own, source.packed, bytes(6), target.packed)
    return BROADCAST + own + struct.pack("!H", ETH_P_ARP) + arp


def arp_answerer(frame: bytes, target: ipaddress.IPv4Address) -> Optional[str]:
    """The sender MAC of an ARP reply for ``target``, else None."""
    if len(frame) < 42 or struct.unpack_from("!H", frame, 12)[0] != ETH_P_ARP:
        return None
    op, sha, spa = struct.unpack_from("!H6s4s", frame, 20)
    return _mac_text(sha) if op == 2 and spa == target.packed else None


def _solicited_node(target: ipaddress.IPv6Address) -> ipaddress.IPv6Address:
    return ipaddress.IPv6Address(ipaddress.IPv6Address("ff02::1:ff00:0").packed[:13] + target.packed[13:])


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def neighbour_solicitation(mac: str, source: ipaddress.IPv6Address, target: ipaddress.IPv6Address) -> bytes:
    """A neighbour solicitation for ``target`` to its solicited-node group (a DAD probe, without a
    source link-layer address option, when ``source`` is ``::``)."""
    own = _mac_bytes(mac)
    group = _solicited_node(target)
    options = b"" if source == UNSPECIFIED6 else struct.pack("!BB6s", SOURCE_LINK_ADDRESS, 1, own)
    body = struct.pack("!BBHI16s", NEIGHBOUR_SOLICITATION, 0, 0, 0, target.packed) + options
    pseudo = source.packed + group.packed + struct.pack("!I3xB", len(body), ICMPV6)
    body = body[:2] + struct.pack("!H", _checksum(pseudo + body)) + body[4:]
    ipv6 = struct.pack("!IHBB16s16s", 6 << 28, len(body), ICMPV6, 255, source.packed, group.packed)
    return b"\x33\x33" + group.packed[12:] + own + struct.pack("!H", ETH_P_IPV6) + ipv6 + body


def neighbour_answerer(frame: bytes, target: ipaddress.IPv6Address) -> Optional[str]:
    """The link-layer address of a neighbour advertisement for ``target`` (its target link-layer
    address option, else the frame's source MAC), else None."""
    if len(frame) < 14 + 40 + 24 or struct.unpack_from("!H", frame, 12)[0] != ETH_P_IPV6 or frame[20] != ICMPV6:
        return None
    icmp = frame[54:]
    if icmp[0] != NEIGHBOUR_ADVERTISEMENT or icmp[8:24] != target.packed:
        return None
    options = icmp[24:]
    while len(options) >= 8 and options[1]:
        if options[0] == TARGET_LINK_ADDRESS:
            return _mac_text(options[2:8])
        options = options[options[1] * 8:]
    return _mac_text(frame[6:12])


# --------------------------------------------------------------------------- the exchange


def _exchange(pod_fd: int, ifname: str, index: int, mac: str, frame: bytes, protocol: int, answerer,
              timeout: float) -> Optional[str]:
    """Send ``frame`` SENDS times within ``timeout`` seconds; the first ``answerer(frame)`` that is
    not None (another host's frame), else None."""
    with netns.entered_fd(pod_fd):
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.htons(protocol))
    with sock:
        sock.bind((ifname, protocol))
        if protocol == ETH_P_IPV6:  # an advertisement answering a DAD probe goes to all-nodes
            sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, struct.pack("iHH8s", index, PACKET_MR_ALLMULTI, 0, b""))
        own = _mac_bytes(mac)
        start = time.monotonic()
        for n in range(SENDS):
            sock.send(frame)
            until = start + timeout * (n + 1) / SENDS
            while (left := until - time.monotonic()) > 0:
                if not select.select([sock], [], [], left)[0]:
                    break
                data, address = sock.recvfrom(2048)
                if address[2] == PACKET_OUTGOING or data[6:12] == own:
                    continue
                found = answerer(data)
                if found is not None:
                    return found
    return None


def _ethernet(link, ifname: str, key: str) -> None:
    if link is None or link.link_type != ARPHRD_ETHER:
        raise CNIError(INVALID_CONFIG, f"{key} needs an Ethernet interface; {ifname} is not one (IPoIB is not supported)",
                       f"set \"{key}\": false")


def refuse_conflicts(pod_fd: int, link, ifname: str, ips: list[IPConfig], timeout: float) -> None:
    """CNI error ADDRESS_CONFLICT when another host answers a DAD probe for one of ``ips``."""
    _ethernet(link, ifname, "detectAddressConflict")
    for ip in ips:
        address = ip.address.ip
        if address.version == 4:
            holder = _exchange(pod_fd, ifname, link.index, link.mac, arp_request(link.mac, UNSPECIFIED4, address),
                               ETH_P_ARP, lambda f: arp_answerer(f, address), timeout)
        else:
            holder = _exchange(pod_fd, ifname, link.index, link.mac, neighbour_solicitation(link.mac, UNSPECIFIED6, address),
                               ETH_P_IPV6, lambda f: neighbour_answerer(f, address), timeout)
        if holder is not None:
            raise CNIError(ADDRESS_CONFLICT, f"address {ip.address} is already in use on {ifname}'s network by the host "
                           f"with MAC {holder}",
                           "free the address on that host, or exclude it from the IPAM range (lease-ipam \"exclude\")")


def require_gateways(pod_fd: int, link, ifname: str, ips: list[IPConfig], timeout: float) -> None:
    """CNI error GATEWAY_UNREACHABLE when a gateway of ``ips`` does not answer ARP / neighbour
    solicitation from the interface within ``timeout`` seconds."""
    _ethernet(link, ifname, "checkGateway")
    for ip in ips:
        gateway = ip.gateway
        if gateway is None:
            continue
        if gateway.version == 4:
            found = _exchange(pod_fd, ifname, link.index, link.mac, arp_request(link.mac, ip.address.ip, gateway),
                              ETH_P_ARP, lambda f: arp_answerer(f, gateway), timeout)
        else:
            found = _exchange(pod_fd, ifname, link.index, link.mac, neighbour_solicitation(link.mac, ip.address.ip, gateway),
                              ETH_P_IPV6, lambda f: neighbour_answerer(f, gateway), timeout)
        if found is None:
            raise CNIError(GATEWAY_UNREACHABLE, f"gateway {gateway} of {ip.address} does not answer on {ifname} "
                           f"(no {'ARP reply' if gateway.version == 4 else 'neighbour advertisement'} in "
                           f"{int(timeout * 1000)} ms)",
                           "check the gateway and the switch port (VLAN) behind the interface, or set "
                           "\"checkGateway\": false")

