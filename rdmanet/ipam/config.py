"""The ``ipam`` block of lease-ipam: whereabouts keys, host-local's ``ranges`` form, normalised to range sets.

Facts relied on (whereabouts' pkg/config and pkg/types; containernetworking/plugins'
plugins/ipam/host-local/backend/allocator/config.go):
- whereabouts: ``range`` is a CIDR (host bits ignored) or ``first-last/prefix``, which sets
  range_start/range_end; ``range_start``/``range_end``/``exclude`` belong to the top-level range;
  ``ipRanges`` entries are {range, range_start, range_end, exclude}, the top-level range goes
  first, and each entry yields one address (dual-stack). ``network_name``,
  ``enable_overlapping_ranges``, ``datastore``, ``kubernetes`` and ``configuration_path`` (the
  flat file, merged underneath) choose the store and the allocation domain (location.py,
  kube_config.py); ``leader_*`` tune whereabouts' leader election, which lease-ipam does not
  have (accepted, not used). ``addresses`` (static, as the static plugin's) are appended to the
  result after the allocated ones and never reserved, as whereabouts does. ``node_slice_size``
  (whereabouts' node slices) is refused: ignoring it would change allocation silently.
- host-local: ``ranges`` is a list of range sets, each a list of {subnet, rangeStart, rangeEnd,
  gateway}; a set yields one address; a missing gateway defaults to network+1; ``dataDir`` moves
  the store.
- Usable addresses are network+1 .. last-1 for both families, except /31 /32 and /127 /128
  where all are; the gateway is never handed out.

Every error is CNI code 7 naming the field (``ipam.ipRanges[1].range_start``) and the fix.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import Field

from rdmanet.cni.core.netconf import Model, load
from rdmanet.cni.core.result import DNS, IPConfig, Route

from . import intervals
from .location import LOCAL, bad, ipam_block, store_kind, store_location
from .pool_ref import PoolRef, pool_ref
from .ranges import IPAddress, IPNetwork, Range, RangeSet, usable_bounds

_CIDR = 'a CIDR such as "10.1.1.0/24", or "10.1.1.10-10.1.1.20/24" for part of a subnet'
_IP = 'an IP address such as "10.1.1.10"'


class IPRangeEntry(Model):
    range: str = Field(description=f"ipRanges[].range is {_CIDR}")
    range_start: Optional[str] = Field(None, description=f"range_start is {_IP} inside the range")
    range_end: Optional[str] = Field(None, description=f"range_end is {_IP} inside the range")
    exclude: Optional[list[str]] = Field(None, description='exclude is a list of CIDRs or IPs, e.g. ["10.1.1.0/28", "10.1.1.99"]')
    gateway: Optional[str] = Field(None, description=f"gateway is {_IP} inside the range (a lease-ipam extension)")


class HostLocalRange(Model):
    subnet: str = Field(description='ranges[][].subnet is a CIDR such as "10.1.1.0/24"')
    rangeStart: Optional[str] = Field(None, description=f"rangeStart is {_IP} inside the subnet")
    rangeEnd: Optional[str] = Field(None, description=f"rangeEnd is {_IP} inside the subnet")
    gateway: Optional[str] = Field(None, description=f"gateway is {_IP} inside the subnet")


class StaticAddress(Model):
    address: str = Field(description='addresses[].address is an address with its prefix, e.g. "10.1.2.5/24"')
    gateway: Optional[str] = Field(None, description=f"addresses[].gateway is {_IP}")


class RouteConf(Model):
    dst: str = Field(description='routes[].dst is a CIDR such as "0.0.0.0/0"')
    gw: Optional[str] = Field(None, description=f"routes[].gw is {_IP}")


class DNSConf(Model):
    # [] rather than default_factory=list: pydantic copies a mutable default for each instance, and
    # a factory costs the model's build an inspect.signature(list) (tokenize's regex, ~1 ms a process).
    nameservers: list[str] = Field([], description="dns.nameservers is a list of IP strings")
    domain: str = Field("", description="dns.domain is a string")
    search: list[str] = Field([], description="dns.search is a list of domain strings")
    options: list[str] = Field([], description="dns.options is a list of resolv.conf option strings")


class IPAMConf(Model):
    type: str = Field(min_length=1, description='"type" names the IPAM plugin, e.g. "lease-ipam"')
    range: Optional[str] = Field(None, description=f"range is {_CIDR}")
    range_start: Optional[str] = Field(None, description=f"range_start is {_IP} inside range")
    range_end: Optional[str] = Field(None, description=f"range_end is {_IP} inside range")
    exclude: Optional[list[str]] = Field(None, description='exclude is a list of CIDRs or IPs, e.g. ["10.1.1.0/28", "10.1.1.99"]')
    gateway: Optional[str] = Field(None, description=f"gateway is {_IP} inside range")
    ipRanges: Optional[list[IPRangeEntry]] = Field(None, description='ipRanges is a list of {"range": CIDR, "range_start", "range_end", "exclude"}')
    ranges: Optional[list[list[HostLocalRange]]] = Field(None, description='ranges is a list of range sets: [[{"subnet": "10.1.1.0/24"}]]')
    network_name: Optional[str] = Field(None, description="network_name is an allocation domain name matching ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
    routes: Optional[list[RouteConf]] = Field(None, description='routes is a list of {"dst": CIDR, "gw": IP}')
    dns: Optional[DNSConf] = Field(None, description='dns is {"nameservers": [...], "domain": ..., "search": [...], "options": [...]}')
    log_file: Optional[str] = Field(None, description="log_file is a file path")
    log_level: Optional[str] = Field(None, description="log_level is one of debug, verbose, error, panic")
    dataDir: Optional[str] = Field(None, description="dataDir is an absolute directory path for the local store")
    # The Lease store (validated in kube_config.py, which DEL and GC use without pydantic).
    kubernetes: Optional[dict[str, Any]] = Field(None, description='kubernetes is an object such as {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}')
    gc_grace_seconds: Optional[float] = Field(None, description="gc_grace_seconds is a number of seconds (Lease store: GC spares younger claims)")
    # whereabouts' static addresses: added to every ADD's result, after the allocated ones; never reserved.
    addresses: Optional[list[StaticAddress]] = Field(None, description='addresses is a list of {"address": "10.1.2.5/24", "gateway": IP}')
    # The store and the domain (read by location.py, which DEL and GC use without pydantic).
    datastore: Optional[str] = Field(None, description='datastore is "kubernetes" or "local"')
    enable_overlapping_ranges: Optional[bool] = Field(None, description="enable_overlapping_ranges is true or false")
    configuration_path: Optional[str] = Field(None, description="configuration_path is the absolute path of whereabouts' flat file")
    node_slice_size: Any = None  # refused below: lease-ipam has no node slices
    whereabouts_check: Optional[bool] = Field(None, description="whereabouts_check is true or false (default: while whereabouts' flat file exists)")
    whereabouts_namespace: Optional[str] = Field(None, description="whereabouts_namespace is the namespace of whereabouts' IPPools (default: the Leases')")
    # nv-ipam's keys: the ranges come from its IPPool / CIDRPool objects (pool_ref.py, nv_ipam_pools.py).
    poolName: Optional[str] = Field(None, description='poolName names an nv-ipam pool, e.g. "ipoib-pool-a", or "pool-v4,pool-v6"')
    poolType: Optional[str] = Field(None, description='poolType is "ippool" (the default) or "cidrpool"')
    poolNamespace: Optional[str] = Field(None, description="poolNamespace is the namespace of the pools (one the node policy allows)")
    # whereabouts' leader election: lease-ipam has none (a create is the claim); accepted, not used.
    leader_lease_duration: Any = None
    leader_renew_deadline: Any = None
    leader_retry_period: Any = None


@dataclass(frozen=True)
class LeaseIPAMConfig:
    """lease-ipam's validated configuration, resolved for the store and the allocator."""

    range_sets: tuple[RangeSet, ...]
    domain: str  # allocation domain: network_name, else the network's name
    data_dir: str
    routes: tuple[Route, ...] = ()
    dns: DNS = field(default_factory=DNS)
    static: tuple[IPConfig, ...] = ()  # whereabouts' ``addresses``
    log_file: str = ""
    log_level: str = ""
    pools: Optional[PoolRef] = None  # nv-ipam's pools: range_sets come from them, per node (pool_ranges.py)

    def range_set_of(self, ip: IPAddress) -> Optional[RangeSet]:
        for rs in self.range_sets:
            if rs.range_of(ip) is not None:
                return rs
        return None


def parse_ip(text: str, where: str, fix: str = "") -> IPAddress:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise bad(where, f"{text!r} is not an IP address", fix or f"use {_IP}") from None


def parse_cidr(text: str, where: str, fix: str = "") -> IPNetwork:
    """A CIDR; host bits are ignored (Go's ParseCIDR masks them)."""
    try:
        if "/" not in text:
            raise ValueError
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise bad(where, f"{text!r} is not a CIDR", fix or f"use {_CIDR}") from None


def parse_range(text: str, where: str) -> tuple[IPNetwork, Optional[IPAddress], Optional[IPAddress]]:
    """``10.0.0.0/24`` -> (net, None, None); ``10.0.0.10-10.0.0.20/24`` -> (net, .10, .20)."""
    if "-" not in text:
        return parse_cidr(text, where), None, None
    first_text, last_text = text.split("-", 1)
    first = parse_ip(first_text, where, f"use {_CIDR}")
    try:
        if "/" not in last_text:
            raise ValueError
        last = ipaddress.ip_interface(last_text.strip())
    except ValueError:
        raise bad(where, f"{text!r}: {last_text!r} is not an IP/prefix", f"use {_CIDR}") from None
    net = last.network
    if first.version != net.version or first not in net:
        raise bad(where, f"{text!r}: {first} is outside {net}", f"the first address must lie in {net}")
    if int(first) > int(last.ip):
        raise bad(where, f"{text!r}: {first} is after {last.ip}", "write the lower address first")
    return net, first, last.ip


def parse_excludes(items: Optional[list[str]], family: int, where: str) -> tuple[intervals.Interval, ...]:
    out = []
    for i, text in enumerate(items or []):
        spot = f"{where}[{i}]"
        try:
            net = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            raise bad(spot, f"{text!r} is neither a CIDR nor an IP address", 'use a CIDR such as "10.1.1.0/28" or an IP such as "10.1.1.99"') from None
        if net.version != family:
            raise bad(spot, f"{text} is IPv{net.version} but the range is IPv{family}", "exclude addresses of the range's own family")
        out.append((int(net.network_address), int(net.broadcast_address)))
    return tuple(intervals.merge(out))


def build_range(subnet: IPNetwork, start: Optional[IPAddress], end: Optional[IPAddress], gateway: Optional[IPAddress],
                excludes: tuple, where: dict[str, str]) -> Range:
    """Check bounds and gateway against the subnet and clamp to the usable addresses.

    ``where`` maps "range", "start", "end", "gateway" to the config field names used in errors.
    """
    for key, ip in (("start", start), ("end", end)):
        if ip is not None and (ip.version != subnet.version or ip not in subnet):
            raise bad(where[key], f"{ip} is outside range {subnet}", f"set {where[key].rsplit('.', 1)[-1]} to an address inside {subnet}, or remove it")
    if start is not None and end is not None and int(start) > int(end):
        raise bad(where["start"], f"{start} is after {where['end'].rsplit('.', 1)[-1]} {end}", "the start must not be after the end: swap them")
    if gateway is not None and (gateway.version != subnet.version or gateway not in subnet):
        raise bad(where["gateway"], f"{gateway} is outside {subnet}", f"set gateway to an address inside {subnet}")
    lo, hi = usable_bounds(subnet)
    lo = max(lo, int(start)) if start is not None else lo
    hi = min(hi, int(end)) if end is not None else hi
    if lo > hi:
        raise bad(where["start"], f"the range {subnet} from {start or subnet[0]} to {end or subnet[-1]} has no usable address",
                  "the network and broadcast addresses are not usable; widen the range")
    return Range(subnet=subnet, start=lo, end=hi, gateway=gateway, excludes=excludes)


def _whereabouts_ranges(conf: IPAMConf) -> list[tuple[str, Range, bool]]:
    """(field, range, has_own_gateway) for the top-level range and each ipRanges entry, in that order."""
    entries: list[tuple[str, str, Optional[str], Optional[str], Optional[list[str]], Optional[str]]] = []
    if conf.range is not None:
        entries.append(("ipam.", conf.range, conf.range_start, conf.range_end, conf.exclude, None))
    elif conf.range_start or conf.range_end or conf.exclude:
        raise bad("ipam.range", "range_start/range_end/exclude are set but range is missing", f"set range to {_CIDR}")
    for i, entry in enumerate(conf.ipRanges or []):
        entries.append((f"ipam.ipRanges[{i}].", entry.range, entry.range_start, entry.range_end, entry.exclude, entry.gateway))
    out = []
    for prefix, text, start_text, end_text, exclude, gw_text in entries:
        subnet, start, end = parse_range(text, prefix + "range")
        if start_text is not None:
            start = parse_ip(start_text, prefix + "range_start")
        if end_text is not None:
            end = parse_ip(end_text, prefix + "range_end")
        gateway = parse_ip(gw_text, prefix + "gateway") if gw_text is not None else None
        excludes = parse_excludes(exclude, subnet.version, prefix + "exclude")
        where = {"range": prefix + "range", "start": prefix + "range_start", "end": prefix + "range_end", "gateway": prefix + "gateway"}
        out.append((prefix + "range", build_range(subnet, start, end, gateway, excludes, where), gw_text is not None))
    return out


def _attach_gateway(conf: IPAMConf, found: list[tuple[str, Range, bool]]) -> list[tuple[str, Range]]:
    """The top-level gateway goes to every whereabouts range (without its own) whose subnet holds it."""
    if conf.gateway is None:
        return [(where, r) for where, r, _ in found]
    gw = parse_ip(conf.gateway, "ipam.gateway")
    out, used = [], False
    for where, r, own in found:
        if not own and gw.version == r.family and gw in r.subnet:
            r = Range(subnet=r.subnet, start=r.start, end=r.end, gateway=gw, excludes=r.excludes)
            used = True
        out.append((where, r))
    if not used and found:
        subnets = ", ".join(str(r.subnet) for _, r, _ in found)
        raise bad("ipam.gateway", f"{gw} is outside {subnets}", "set gateway to an address inside the range")
    return out


def _host_local_sets(conf: IPAMConf) -> list[tuple[str, list[Range]]]:
    out = []
    for i, rset in enumerate(conf.ranges or []):
        if not rset:
            raise bad(f"ipam.ranges[{i}]", "is an empty range set", 'give each range set at least one {"subnet": CIDR}')
        members = []
        for j, entry in enumerate(rset):
            prefix = f"ipam.ranges[{i}][{j}]."
            subnet = parse_cidr(entry.subnet, prefix + "subnet")
            start = parse_ip(entry.rangeStart, prefix + "rangeStart") if entry.rangeStart is not None else None
            end = parse_ip(entry.rangeEnd, prefix + "rangeEnd") if entry.rangeEnd is not None else None
            if entry.gateway is not None:
                gateway = parse_ip(entry.gateway, prefix + "gateway")
            elif subnet.prefixlen < subnet.max_prefixlen - 1:
                gateway = subnet[1]  # host-local's default
            else:
                gateway = None
            where = {"range": prefix + "subnet", "start": prefix + "rangeStart", "end": prefix + "rangeEnd", "gateway": prefix + "gateway"}
            members.append(build_range(subnet, start, end, gateway, (), where))
        if len({r.family for r in members}) > 1:
            raise bad(f"ipam.ranges[{i}]", "mixes IPv4 and IPv6 ranges", "put each address family in its own range set (its own inner list)")
        out.append((f"ipam.ranges[{i}]", members))
    return out


def check_overlaps(sets: list[tuple[str, list[Range]]]) -> None:
    spans = sorted(((r.family, r.start, r.end, where) for where, members in sets for r in members))
    for (fam_a, _, end_a, where_a), (fam_b, start_b, _, where_b) in zip(spans, spans[1:]):
        if fam_a == fam_b and start_b <= end_a:
            raise bad(where_b, f"overlaps {where_a}",
                      "give each range its own addresses (split one subnet with range_start/range_end)")


def _routes(conf: IPAMConf) -> tuple[Route, ...]:
    out = []
    for i, route in enumerate(conf.routes or []):
        dst = parse_cidr(route.dst, f"ipam.routes[{i}].dst", 'use a CIDR such as "0.0.0.0/0"')
        gw = parse_ip(route.gw, f"ipam.routes[{i}].gw") if route.gw else None
        if gw is not None and gw.version != dst.version:
            raise bad(f"ipam.routes[{i}].gw", f"{gw} is not of the family of {dst}", "use a gateway of the destination's family")
        out.append(Route(dst=dst, gw=gw))
    return tuple(out)


def _static(conf: IPAMConf) -> tuple[IPConfig, ...]:
    out = []
    for i, entry in enumerate(conf.addresses or []):
        where = f"ipam.addresses[{i}]"
        try:
            iface = ipaddress.ip_interface(entry.address.strip())
            if "/" not in entry.address:
                raise ValueError
        except ValueError:
            raise bad(where + ".address", f"{entry.address!r} is not an address with a prefix", 'use e.g. "10.1.2.5/24"') from None
        gw = parse_ip(entry.gateway, where + ".gateway") if entry.gateway is not None else None
        if gw is not None and gw.version != iface.version:
            raise bad(where + ".gateway", f"{gw} is not of the family of {iface}", "use a gateway of the address's family")
        out.append(IPConfig(address=iface, gateway=gw))
    return tuple(out)


def parse_ipam_config(config: dict) -> LeaseIPAMConfig:
    """Validate the whole network config's ``ipam`` block; raises CNIError code 7."""
    conf = load(IPAMConf, ipam_block(config), prefix="ipam.")
    if conf.node_slice_size not in (None, ""):
        raise bad("ipam.node_slice_size", f"{conf.node_slice_size!r}: lease-ipam has no node slices (whereabouts' Fast IPAM)",
                  "remove node_slice_size: every node claims single addresses from the whole range (one Lease "
                  "each, no leader election), so there is no slice to size; while whereabouts' node slices still "
                  "hold addresses, see the migration steps in docs/lease-ipam.md")
    pools = _pools(ipam_block(config), config)
    sets: list[tuple[str, list[Range]]] = [(where, [r]) for where, r in _attach_gateway(conf, _whereabouts_ranges(conf))]
    sets += _host_local_sets(conf)
    if not sets and pools is None:
        raise bad("ipam.range", "no range configured",
                  'set "range": "10.1.1.0/24" (or "ipRanges": [{"range": ...}] for several, or host-local "ranges")')
    check_overlaps(sets)
    data_dir, domain = store_location(config)
    dns = DNS(**conf.dns.model_dump(include={"nameservers", "domain", "search", "options"})) if conf.dns else DNS()
    return LeaseIPAMConfig(
        range_sets=tuple(RangeSet(index=i, ranges=tuple(members), origin=where) for i, (where, members) in enumerate(sets)),
        domain=domain,
        data_dir=data_dir,
        routes=_routes(conf),
        dns=dns,
        static=_static(conf),
        log_file=conf.log_file or "",
        log_level=conf.log_level or "",
        pools=pools,
    )


def _pools(raw: dict, config: dict) -> Optional[PoolRef]:
    """The nv-ipam pools the block names: they replace the ranges, and live in the cluster."""
    pools = pool_ref(raw, config.get("name", ""))
    if pools is None:
        return None
    for key in ("range", "ipRanges", "ranges"):
        if raw.get(key) is not None:
            raise bad(f"ipam.{key}", "is set, and so is poolName: the pool's subnet is the range",
                      f"remove {key} (the pool gives range, gateway and exclusions), or remove poolName")
    if store_kind(raw) == LOCAL:
        raise bad("ipam.datastore", '"local" cannot read nv-ipam\'s pools, which are Kubernetes objects',
                  'remove "datastore" (poolName selects the Kubernetes store) or set it to "kubernetes"')
    return pools
