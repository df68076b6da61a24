"""Addresses the runtime asks for, and which range set each one belongs to.

Facts relied on (host-local in containernetworking/plugins; the CNI conventions,
https://www.cni.dev/docs/conventions/; Multus pkg/multus/multus.go):
- ``runtimeConfig.ips`` (capability ``ips``) and ``args.cni.ips`` are lists of addresses, usually
  CIDRs ("10.1.1.5/24"); both reach the IPAM plugin on the same stdin. We take their union.
- CNI_ARGS ``IP=`` is the legacy form; Multus joins several with commas. It is used only when
  neither list gives an address. A bare IP or a CIDR is accepted; the prefix is ignored (the
  result carries the range's own prefix).
- Each address must fall in the usable part of one range set, not be its gateway or excluded,
  and a range set takes at most one; anything else is error 103 naming the address and source.
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from rdmanet.cni.core.args import split_list
from rdmanet.cni.core.errors import ADDRESS_UNAVAILABLE, INVALID_CONFIG, CNIError
from rdmanet.cni.core.invocation import Invocation

from .ranges import IPAddress

if TYPE_CHECKING:
    from .config import LeaseIPAMConfig


def _parse(text: Any, where: str) -> IPAddress:
    if not isinstance(text, str):
        raise CNIError(INVALID_CONFIG, f"{where}: {text!r} is not a string", 'give addresses as strings such as "10.1.1.5/24"')
    try:
        return ipaddress.ip_interface(text.strip()).ip
    except ValueError:
        raise CNIError(INVALID_CONFIG, f"{where}: {text!r} is not an IP address", 'use "10.1.1.5/24" or "10.1.1.5"') from None


def _list(value: Any, where: str) -> list[tuple[str, IPAddress]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise CNIError(INVALID_CONFIG, f"{where} must be a list of addresses", 'e.g. ["10.1.1.5/24"]')
    return [(f"{where}[{i}]", _parse(item, f"{where}[{i}]")) for i, item in enumerate(value)]


def requested_addresses(inv: Invocation) -> list[tuple[str, IPAddress]]:
    """(source, address) pairs, in order, without duplicates."""
    found = _list(inv.runtime_config.get("ips"), "runtimeConfig.ips") + _list(inv.args_cni.get("ips"), "args.cni.ips")
    if not found and inv.args.get("IP"):
        found = [(f"CNI_ARGS IP[{i}]", _parse(item, f"CNI_ARGS IP[{i}]")) for i, item in enumerate(split_list(inv.args["IP"]))]
    out, seen = [], set()
    for source, ip in found:
        if ip not in seen:
            seen.add(ip)
            out.append((source, ip))
    return out


def assign(config: "LeaseIPAMConfig", wanted: list[tuple[str, IPAddress]]) -> dict[int, IPAddress]:
    """Map each requested address to its range set's index; raises CNIError 103."""
    out: dict[int, IPAddress] = {}
    where: dict[int, str] = {}
    for source, ip in wanted:
        rs = config.range_set_of(ip)
        if rs is None:
            ranges = "; ".join(rs.describe() for rs in config.range_sets)
            raise CNIError(ADDRESS_UNAVAILABLE, f"requested address {ip} ({source}) is outside every range: {ranges}",
                           "request an address inside a configured range, or add a range that holds it")
        reason = rs.range_of(ip).why_unusable(ip)
        if reason:
            raise CNIError(ADDRESS_UNAVAILABLE, f"requested address {ip} ({source}) {reason}", "request another address of the range")
        if rs.index in out:
            raise CNIError(ADDRESS_UNAVAILABLE,
                           f"requested addresses {out[rs.index]} ({where[rs.index]}) and {ip} ({source}) fall in the same range set {rs.describe()}",
                           "a range set gives one address per attachment: request one address per range (e.g. one IPv4 and one IPv6)")
        out[rs.index] = ip
        where[rs.index] = source
    return out
