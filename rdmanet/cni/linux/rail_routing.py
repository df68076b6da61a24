"""Per-interface policy routing in a pod with several interfaces (a "multi-rail" pod).

When a pod has several interfaces in one address family (eth0 plus one RDMA interface per NIC
rail, often all in one subnet), Linux answers ARP for any of its addresses on any interface and
sends every packet out of whichever interface the main table picks, whatever its source address.
So each attachment this module is asked to route gets, in the pod:

- a routing table of its own, ``TABLE_BASE + slot``: its connected routes, its IPAM routes and a
  default route via its gateway;
- rules at priority ``PRIORITY_BASE + slot``: ``oif <ifname> lookup <table>`` (sockets bound to
  the interface) and ``from <address> lookup <table>`` for each of its addresses (replies, and
  sockets bound to the address, leave by the interface that has the address);
- IPv4 sysctls on the interface: ``arp_ignore=1`` (answer ARP only for an address of the
  receiving interface), ``arp_announce=2`` (ARP with the outgoing interface's own address) and
  ``rp_filter=2`` (loose: a reply arriving on another rail is not dropped).

The slot comes from the interface name (:func:`slot`): its trailing number below 1000 (``net3``
-> 3, ``rail7`` -> 7; Multus names interfaces ``net1``..``netN``), else 1000 + a hash of the name.
Two interfaces of one pod with the same slot (``net1`` and ``rail1``) are refused at ADD.

The main table keeps the kernel's connected routes (traffic bound to no address reaches a rail's
subnet through one of them, with that rail's source) and gets the IPAM's routes other than the
default, with the slot as metric, so one destination routed on several rails coexists. The
pod's default route stays where it was (eth0) unless the config sets ``defaultRoute``: then this
interface's default route replaces it, the replaced route is kept in the *saved* table
``SAVED_TABLE_BASE + slot``, and ``from <address> lookup <saved table>`` rules keep the replaced
interface's own traffic (eth0's replies) on it. DEL puts the replaced route back.

Crash safety: the ``oif`` rule is the first thing :func:`attach` adds and the last thing
:func:`detach` removes. It names the interface, so it marks the slot's tables and rules as this
interface's; a DEL or repeat ADD that finds it removes everything of the slot, also when the
link is gone. Routes through the interface die with it, and its sysctls are its own.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
import zlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable, Optional

from pyroute2.netlink.exceptions import NetlinkError

from rdmanet.cni.core.errors import INVALID_CONFIG, INVALID_ENVIRONMENT, CNIError, check_failed
from rdmanet.cni.core.result import IPConfig, Route

from . import links, netns, sysctl

if TYPE_CHECKING:
    from rdmanet.cni.core.rail_settings import RailSettings

log = logging.getLogger("rdmanet.rail-routing")

TABLE_BASE = 10_000
SAVED_TABLE_BASE = 20_000
PRIORITY_BASE = 10_000
NUMBERED_SLOTS = 1_000  # a name ending in 0..999 takes that number as its slot
SLOTS = 10_000
MAIN_TABLE = 254
RT_SCOPE_LINK = 253
FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}
ARP_SYSCTLS = (("arp_ignore", "1"), ("arp_announce", "2"), ("rp_filter", "2"))
IPV6_LINK_LOCAL = ipaddress.ip_network("fe80::/64")


def slot(ifname: str) -> int:
    """The interface's slot: its trailing number when below NUMBERED_SLOTS, else a hash of the name
    above them."""
    number = re.search(r"(\d+)$", ifname)
    if number and int(number.group(1)) < NUMBERED_SLOTS:
        return int(number.group(1))
    return NUMBERED_SLOTS + zlib.crc32(ifname.encode()) % (SLOTS - NUMBERED_SLOTS)


def table_of(ifname: str) -> int:
    return TABLE_BASE + slot(ifname)


def saved_table_of(ifname: str) -> int:
    return SAVED_TABLE_BASE + slot(ifname)


def priority_of(ifname: str) -> int:
    return PRIORITY_BASE + slot(ifname)


@dataclass(frozen=True)
class Plan:
    """What :func:`attach` does for one interface: the IP versions routed per interface (empty:
    nothing, the main table as without this module) and whether it takes the default route."""

    ifname: str
    index: int
    versions: frozenset
    default_route: bool = False

    @property
    def table(self) -> int:
        return table_of(self.ifname)

    @property
    def saved_table(self) -> int:
        return saved_table_of(self.ifname)

    @property
    def priority(self) -> int:
        return priority_of(self.ifname)


def decide(pod, index: int, ifname: str, ips: list[IPConfig], settings: RailSettings) -> Plan:
    """The plan for interface ``index`` with addresses ``ips``: for ``policyRouting`` "auto", the
    IP versions in which another interface of the pod has a global address; "on": all of its
    versions; "off": none."""
    versions = {ip.family for ip in ips}
    if settings.policyRouting == "off":
        versions = set()
    elif settings.policyRouting == "auto":
        versions = {v for v in versions if _others_have_addresses(pod, index, v)}
    return Plan(ifname, index, frozenset(versions), settings.defaultRoute)


def _others_have_addresses(pod, index: int, version: int) -> bool:
    return any(msg["index"] != index and msg["scope"] == 0 for msg in pod.get_addr(family=FAMILIES[version]))


def main_routes(plan: Plan, routes: list[Route]) -> list[Route]:
    """The IPAM routes that go into the main table: all of them when the plan routes nothing;
    else, in a routed version, the routes other than the default, with the slot as metric (the
    default route goes to the interface's table, and to the main table with ``defaultRoute``)."""
    out = []
    for route in routes:
        if route.dst.version not in plan.versions:
            out.append(route)
        elif route.dst.prefixlen:
            out.append(route if route.priority is not None else replace(route, priority=plan.priority))
    return out


# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Rule:
    """What this module reads of a routing rule."""

    family: int
    priority: int
    table: int
    src: Optional[str] = None
    src_len: int = 0
    oifname: str = ""

    @classmethod
    def from_msg(cls, msg) -> "Rule":
        return cls(family=msg["family"], priority=msg.get("FRA_PRIORITY") or 0,
                   table=msg.get("FRA_TABLE") or msg["table"], src=msg.get("FRA_SRC"), src_len=msg["src_len"],
                   oifname=msg.get("FRA_OIFNAME") or "")

    def spec(self) -> dict:
        spec = {"family": self.family, "priority": self.priority, "table": self.table}
        if self.src is not None:
            spec.update(src=self.src, src_len=self.src_len)
        if self.oifname:
            spec["oifname"] = self.oifname
        return spec

    def describe(self) -> str:
        selector = f"oif {self.oifname}" if self.oifname else f"from {self.src}/{self.src_len}" if self.src else "from all"
        return f"{self.priority}: {selector} lookup {self.table}"


def _rules(pod, tables: Iterable[int]) -> list[Rule]:
    """The rules (every family, one dump) that look up one of ``tables``."""
    wanted = set(tables)
    return [rule for rule in map(Rule.from_msg, pod.get_rules(family=0)) if rule.table in wanted]


def _add_rule(pod, rule: Rule) -> None:
    try:
        pod.rule("add", **rule.spec())
    except NetlinkError as exc:
        raise links.kernel_error(f"add rule {rule.describe()}", exc) from exc


def _delete_rule(pod, rule: Rule) -> None:
    try:
        pod.rule("del", **rule.spec())
    except NetlinkError as exc:
        if exc.code not in (2, 19):  # ENOENT, ENODEV: gone already
            raise links.kernel_error(f"delete rule {rule.describe()}", exc) from exc


def _owners(rules: list[Rule], table: int) -> set[str]:
    """The interfaces the ``oif`` rules of ``table`` name: the slot's owner."""
    return {rule.oifname for rule in rules if rule.table == table and rule.oifname}


# --------------------------------------------------------------------------- routes


def _routes(pod, family: int, table: int) -> list[dict]:
    return [msg for msg in pod.get_routes(family=family, table=table)
            if (msg.get("RTA_TABLE") or msg["table"]) == table]


def _route_spec(msg, table: int) -> dict:
    family = msg["family"]
    dst = msg.get("RTA_DST") or ("0.0.0.0" if family == socket.AF_INET else "::")
    spec = {"dst": f"{dst}/{msg['dst_len']}", "table": table}
    for key, nla in (("oif", "RTA_OIF"), ("gateway", "RTA_GATEWAY"), ("priority", "RTA_PRIORITY")):
        if msg.get(nla) is not None:
            spec[key] = msg.get(nla)
    return spec


def _add_route(pod, what: str, **spec) -> None:
    try:
        pod.route("add", **spec)
    except NetlinkError as exc:
        if exc.code == 17:  # EEXIST: the same route, added again by a repeat
            return
        raise links.kernel_error(f"add route {what}", exc) from exc


def _flush(pod, table: int) -> None:
    for family in FAMILIES.values():
        for msg in _routes(pod, family, table):
            try:
                pod.route("del", **_route_spec(msg, table))
            except NetlinkError as exc:
                if exc.code not in (3, 19):  # ESRCH, ENODEV: gone already
                    raise links.kernel_error(f"flush table {table}", exc) from exc


def _defaults(pod, family: int, table: int) -> list[dict]:
    return [msg for msg in _routes(pod, family, table) if msg["dst_len"] == 0]


# --------------------------------------------------------------------------- ADD / DEL / CHECK


def attach(pod, pod_fd: int, plan: Plan, ips: list[IPConfig], routes: list[Route]) -> None:
    """Policy routing for the interface of ``plan`` (its addresses ``ips``, IPAM routes
    ``routes``): whatever an earlier ADD of the interface left is removed first."""
    if not plan.versions:
        return
    _claim(pod, plan.ifname)
    gateways = {ip.family: ip.gateway for ip in ips if ip.gateway is not None}
    for version in sorted(plan.versions):
        family = FAMILIES[version]
        _add_rule(pod, Rule(family, plan.priority, plan.table, oifname=plan.ifname))  # the slot's marker: first
        own = [ip for ip in ips if ip.family == version]
        _fill_table(pod, plan, own, [r for r in routes if r.dst.version == version], gateways.get(version))
        for ip in own:
            _add_rule(pod, Rule(family, plan.priority, plan.table, str(ip.address.ip), ip.address.max_prefixlen))
        if version == 4:
            with netns.entered_fd(pod_fd):
                for key, value in ARP_SYSCTLS:
                    sysctl.set_interface_sysctl("ipv4", plan.ifname, key, value)
        if plan.default_route:
            _take_default_route(pod, plan, family, _default_gateway(routes, version, gateways.get(version)))
    log.info("%s: policy routing in table %d, rules at priority %d (IPv%s)", plan.ifname, plan.table,
             plan.priority, "/".join(str(v) for v in sorted(plan.versions)))


def _claim(pod, ifname: str) -> None:
    """Clear the slot for ``ifname``: what an earlier ADD of it left goes; a slot held by another
    interface of the pod is an error, one held by an interface that no longer exists is taken."""
    found = _rules(pod, (table_of(ifname), saved_table_of(ifname)))
    for other in sorted(_owners(found, table_of(ifname)) - {ifname}):
        if links.find_link(pod, other) is not None:
            raise CNIError(INVALID_ENVIRONMENT,
                           f"CNI_IFNAME {ifname} would share routing table {table_of(ifname)} with the pod's "
                           f"interface {other} (both end in the same number)",
                           f"give the interfaces distinct trailing numbers (net1, net2, ...), or set "
                           f"\"policyRouting\": \"off\"")
        log.info("%s: table %d was %s's, which is gone: taking it over", ifname, table_of(ifname), other)
        detach(pod, other)
    detach(pod, ifname)


def _fill_table(pod, plan: Plan, own: list[IPConfig], routes: list[Route], gateway) -> None:
    for ip in own:
        network = ip.address.network
        scope = {"scope": RT_SCOPE_LINK} if network.version == 4 else {}
        _add_route(pod, f"{network} dev {plan.ifname} table {plan.table}",
                   dst=str(network), oif=plan.index, table=plan.table, **scope)
    if own and own[0].family == 6:
        _add_route(pod, f"{IPV6_LINK_LOCAL} dev {plan.ifname} table {plan.table}",
                   dst=str(IPV6_LINK_LOCAL), oif=plan.index, table=plan.table)
    has_default = False
    for route in routes:
        gw = route.gw if route.gw is not None else gateway
        spec = {"dst": str(route.dst), "oif": plan.index, "table": plan.table}
        if gw is not None:
            spec["gateway"] = str(gw)
        if route.priority is not None:
            spec["priority"] = route.priority
        has_default = has_default or route.dst.prefixlen == 0
        _add_route(pod, f"{route.dst} via {gw} dev {plan.ifname} table {plan.table}", **spec)
    if gateway is not None and not has_default:
        _add_route(pod, f"default via {gateway} dev {plan.ifname} table {plan.table}",
                   dst="0.0.0.0/0" if gateway.version == 4 else "::/0", gateway=str(gateway), oif=plan.index,
                   table=plan.table)


def _default_gateway(routes: list[Route], version: int, gateway):
    for route in routes:
        if route.dst.version == version and route.dst.prefixlen == 0:
            return route.gw if route.gw is not None else gateway
    return gateway


def _take_default_route(pod, plan: Plan, family: int, gateway) -> None:
    """Make this interface's default route the main table's: the one it replaces goes to the saved
    table first (what DEL puts back), with rules for the addresses of its interface."""
    if gateway is None:
        raise CNIError(INVALID_CONFIG, f"defaultRoute is true but the IPAM gave {plan.ifname} no IPv"
                       f"{6 if family == socket.AF_INET6 else 4} gateway",
                       "give the IPAM range a gateway, or set \"defaultRoute\": false")
    current = [msg for msg in _defaults(pod, family, MAIN_TABLE) if msg.get("RTA_OIF") != plan.index]
    for msg in current:
        _add_route(pod, f"saved default route in table {plan.saved_table}", **_route_spec(msg, plan.saved_table))
    for index in sorted({msg.get("RTA_OIF") for msg in current if msg.get("RTA_OIF")}):
        for msg in pod.get_addr(family=family, index=index):
            if msg["scope"] == 0:
                _add_rule(pod, Rule(family, plan.priority, plan.saved_table, msg.get("IFA_ADDRESS"),
                                    32 if family == socket.AF_INET else 128))
    for msg in current:
        try:
            pod.route("del", **_route_spec(msg, MAIN_TABLE))
        except NetlinkError as exc:
            if exc.code != 3:
                raise links.kernel_error("replace the pod's default route", exc) from exc
    _add_route(pod, f"default via {gateway} dev {plan.ifname}", dst="0.0.0.0/0" if family == socket.AF_INET else "::/0",
               gateway=str(gateway), oif=plan.index, table=MAIN_TABLE)


def detach(pod, ifname: str) -> None:
    """Remove the interface's rules and tables (and put back a default route it replaced), when
    the slot is this interface's: never another interface's, and nothing when there is none."""
    table, saved = table_of(ifname), saved_table_of(ifname)
    found = _rules(pod, (table, saved))
    if not found:
        return
    if _owners(found, table) - {ifname}:
        return  # another interface's slot
    _give_back_default_route(pod, ifname, saved)
    markers = [rule for rule in found if rule.table == table and rule.oifname]
    for rule in found:
        if rule not in markers:
            _delete_rule(pod, rule)
    _flush(pod, table)
    for rule in markers:  # the slot's marker: last
        _delete_rule(pod, rule)
    log.info("%s: policy routing removed (table %d)", ifname, table)


def _give_back_default_route(pod, ifname: str, saved: int) -> None:
    link = links.find_link(pod, ifname)
    for family in FAMILIES.values():
        kept = _defaults(pod, family, saved)
        if not kept:
            continue
        current = _defaults(pod, family, MAIN_TABLE)
        ours = [msg for msg in current if link is not None and msg.get("RTA_OIF") == link.index]
        for msg in ours:
            try:
                pod.route("del", **_route_spec(msg, MAIN_TABLE))
            except NetlinkError as exc:
                if exc.code != 3:
                    raise links.kernel_error(f"remove {ifname}'s default route", exc) from exc
        if len(current) > len(ours):
            log.warning("%s: the pod's default route was changed since ADD: the one saved in table %d is not put back",
                        ifname, saved)
            continue
        for msg in kept:
            _add_route(pod, "the pod's default route", **_route_spec(msg, MAIN_TABLE))
    _flush(pod, saved)


def check(pod, pod_fd: int, ifname: str, index: int, ips: list[IPConfig], settings: RailSettings) -> frozenset:
    """CHECK: the interface's rules, table and sysctls are as ADD left them; the IP versions it
    routes (whose IPAM routes may be in its table rather than the main one)."""
    table, priority = table_of(ifname), priority_of(ifname)
    found = _rules(pod, (table,))
    routed = set()
    for version in sorted({ip.family for ip in ips}):
        family = FAMILIES[version]
        mine = [rule for rule in found if rule.family == family]
        if Rule(family, priority, table, oifname=ifname) not in mine:
            if settings.policyRouting == "on" or (version == 4 and _arp_tuned(pod_fd, ifname)):
                raise check_failed(f"rule \"{priority}: oif {ifname} lookup {table}\" (IPv{version}) is missing")
            continue
        routed.add(version)
        for ip in ips:
            if ip.family == version and Rule(family, priority, table, str(ip.address.ip), ip.address.max_prefixlen) not in mine:
                raise check_failed(f"rule \"{priority}: from {ip.address.ip} lookup {table}\" is missing")
        present = {(msg.get("RTA_DST"), msg["dst_len"]) for msg in _routes(pod, family, table) if msg.get("RTA_OIF") == index}
        for ip in ips:
            network = ip.address.network
            if ip.family == version and (str(network.network_address), network.prefixlen) not in present:
                raise check_failed(f"route {network} dev {ifname} is missing from table {table}")
        if version == 4:
            wrong = [f"{key}={value}" for key, value in ARP_SYSCTLS if _sysctl(pod_fd, ifname, key) != value]
            if wrong:
                raise check_failed(f"{ifname} lacks {', '.join(wrong)}")
        if settings.defaultRoute and not any(msg.get("RTA_OIF") == index for msg in _defaults(pod, family, MAIN_TABLE)):
            raise check_failed(f"the pod's IPv{version} default route is not via {ifname} (defaultRoute is true)")
    return frozenset(routed)


def _sysctl(pod_fd: int, ifname: str, key: str) -> Optional[str]:
    with netns.entered_fd(pod_fd):
        return sysctl.get_interface_sysctl("ipv4", ifname, key)


def _arp_tuned(pod_fd: int, ifname: str) -> bool:
    """arp_ignore as ADD sets it: a trace that the interface was routed, when its rules are gone."""
    return _sysctl(pod_fd, ifname, "arp_ignore") == ARP_SYSCTLS[0][1]


def tables(ifname: str, routed: frozenset) -> tuple[int, ...]:
    """Where CHECK looks for the IPAM routes of an interface routing ``routed`` IP versions."""
    return (MAIN_TABLE, table_of(ifname)) if routed else (MAIN_TABLE,)


def detach_in(netns_path: str, ifname: str) -> None:
    """:func:`detach` in the namespace at ``netns_path`` (nothing when it is gone)."""
    try:
        with links.rtnl_in(netns_path) as pod:
            detach(pod, ifname)
    except netns.NetnsGone:
        pass
