"""nv-ipam's pools as lease-ipam reads them: the ``IPPool`` and ``CIDRPool`` documents, and the range
set, gateway, exclusions and routes one node gets from each, in one of two modes.

Facts relied on (nv-ipam's README, "IPPool CR" and "CIDRPool CR", and its CRD types of
``nv-ipam.nvidia.com/v1alpha1``):
- ``IPPool.spec``: ``subnet``, ``perNodeBlockSize`` (a count of addresses), ``gateway``,
  ``exclusions`` [{``startIP``, ``endIP``}, inclusive], ``perNodeExclusions`` [{``startIndex``,
  ``endIndex``}, inclusive, counted from the start of the node's block], ``nodeSelector``,
  ``defaultGateway``, ``routes`` [{``dst``}]. ``status.allocations`` [{``nodeName``,
  ``startIP``, ``endIP``}] is each node's block, written by nv-ipam's controller. A pod gets
  the subnet's prefix length; the gateway is never handed out (it may lie in a block).
- ``CIDRPool.spec``: ``cidr``, ``perNodeNetworkPrefix``, ``gatewayIndex`` (the address with that
  index in the node's prefix is its gateway; unset: no gateway), ``exclusions``,
  ``perNodeExclusions`` (counted from the node prefix's network address), ``staticAllocations``
  [{``nodeName``, ``prefix``, ``gateway``}] (a gateway given there wins over ``gatewayIndex``),
  ``nodeSelector``, ``defaultGateway``, ``routes``. ``status.allocations`` [{``nodeName``,
  ``prefix``, ``gateway``}]. A pod gets its node prefix's length: the prefixes are routed.
- ``routes`` are added via the pool's (node's) gateway; ``defaultGateway: true`` adds the
  default route via it.

The modes (docs/lease-ipam.md, "Coming from nv-ipam"). The pool's annotation
``rdmanet.io/node-blocks`` chooses, so that every node and every NAD of a pool switch at once
and a tenant's NAD cannot choose for the pool's other users:
- ``nv-ipam`` (the default: nv-ipam's controller still runs, and its node agent may still
  allocate on other nodes): a node allocates only inside the block ``status.allocations`` gives
  it, never outside, and never borrows; a node without a block waits for the controller.
- ``lease-ipam`` (nv-ipam is gone): an IPPool only defines the range; lease-ipam's own node
  blocks and borrowing apply, ``perNodeBlockSize`` (rounded down to a power of two) as the block
  size unless ``kubernetes.block_size`` says otherwise. ``perNodeExclusions`` have no block to
  count from then and are refused, never ignored.
A CIDRPool's prefixes are per-node subnets (routed), so a node always allocates inside its own
prefix (from ``status.allocations``, or ``staticAllocations``, which come first once nv-ipam is gone).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from pydantic import Field

from rdmanet.cni.core.errors import INVALID_CONFIG, TRY_AGAIN_LATER, CNIError
from rdmanet.cni.core.netconf import Model, load
from rdmanet.cni.core.result import Route

from . import intervals, node_selector
from .config import build_range, check_overlaps, parse_cidr, parse_ip
from .location import bad
from .pool_ref import CIDRPOOL, PoolRef
from .ranges import IPAddress, IPNetwork, RangeSet

MODE_ANNOTATION = "rdmanet.io/node-blocks"
NV_IPAM, LEASE_IPAM = "nv-ipam", "lease-ipam"  # whose node blocks apply
MAX_BLOCK_HINT = 1 << 16  # lease-ipam's largest block (kube_config.MAX_BLOCK_SIZE)


class ExcludeRange(Model):
    startIP: str = Field(description="startIP is the first excluded address")
    endIP: str = Field(description="endIP is the last excluded address")


class ExcludeIndexRange(Model):
    startIndex: int = Field(ge=0, description="startIndex is a non-negative index into the node's block")
    endIndex: int = Field(ge=0, description="endIndex is an index into the node's block, not below startIndex")


class PoolRoute(Model):
    dst: str = Field(description='dst is a CIDR such as "5.5.0.0/24"')


class IPPoolAllocation(Model):
    nodeName: str = ""
    startIP: str = ""
    endIP: str = ""


class CIDRAllocation(Model):
    nodeName: Optional[str] = ""
    prefix: str = Field(description="prefix is a CIDR inside the pool's cidr")
    gateway: Optional[str] = None


class _Spec(Model):
    exclusions: Optional[list[ExcludeRange]] = None
    perNodeExclusions: Optional[list[ExcludeIndexRange]] = None
    nodeSelector: Optional[dict[str, Any]] = None
    defaultGateway: Optional[bool] = None
    routes: Optional[list[PoolRoute]] = None


class IPPoolSpec(_Spec):
    subnet: str = Field(description="spec.subnet is the pool's CIDR")
    perNodeBlockSize: int = Field(ge=1, description="spec.perNodeBlockSize is a count of addresses, at least 1")
    gateway: Optional[str] = None


class CIDRPoolSpec(_Spec):
    cidr: str = Field(description="spec.cidr is the pool's CIDR")
    perNodeNetworkPrefix: int = Field(ge=0, le=128, description="spec.perNodeNetworkPrefix is a prefix length")
    gatewayIndex: Optional[int] = Field(None, ge=0, description="spec.gatewayIndex is a non-negative index")
    staticAllocations: Optional[list[CIDRAllocation]] = None


class IPPoolStatus(Model):
    allocations: Optional[list[IPPoolAllocation]] = None


class CIDRPoolStatus(Model):
    allocations: Optional[list[CIDRAllocation]] = None


class IPPoolDoc(Model):
    spec: IPPoolSpec
    status: IPPoolStatus = Field(default_factory=IPPoolStatus)


class CIDRPoolDoc(Model):
    spec: CIDRPoolSpec
    status: CIDRPoolStatus = Field(default_factory=CIDRPoolStatus)


@dataclass(frozen=True)
class FoundPool:
    """A pool document as the API gave it, and where it was found."""

    ref: PoolRef
    name: str
    namespace: str
    doc: Mapping[str, Any]

    @property
    def where(self) -> str:
        return f"{self.ref.kind_name} {self.namespace}/{self.name}"

    def fix(self) -> str:
        return f"the pool's owner fixes it: kubectl -n {self.namespace} edit {self.ref.plural}.nv-ipam.nvidia.com {self.name}"


@dataclass(frozen=True)
class NodeRange:
    """What one pool gives this node: one range set, whether it is the node's assigned block
    (allocate only inside it, never borrow), lease-ipam's block size hint (``lease-ipam`` mode),
    the routes via the gateway, and a description for messages and ``rdmanet doctor``."""

    range_set: RangeSet
    assigned: bool
    mode: str
    block_hint: Optional[int] = None
    routes: tuple[Route, ...] = ()
    describe: str = ""


Labels = Callable[[], Mapping[str, str]]  # the Node's labels, read only when a selector needs them


def mode_of(found: FoundPool) -> str:
    """Whose node blocks apply to the pool: its ``rdmanet.io/node-blocks`` annotation, else nv-ipam's."""
    value = ((found.doc.get("metadata") or {}).get("annotations") or {}).get(MODE_ANNOTATION, NV_IPAM)
    if value not in (NV_IPAM, LEASE_IPAM):
        raise bad(f"{found.where} metadata.annotations[{MODE_ANNOTATION}]", f"{value!r} is neither {NV_IPAM!r} nor {LEASE_IPAM!r}",
                  f"{NV_IPAM!r} while nv-ipam's controller runs, {LEASE_IPAM!r} once nv-ipam is gone ({found.fix()})")
    return value


def _family(ip: IPAddress, subnet: IPNetwork, where: str, found: FoundPool) -> IPAddress:
    if ip.version != subnet.version or ip not in subnet:
        raise bad(where, f"{ip} is outside {subnet}", found.fix())
    return ip


def _exclusions(found: FoundPool, spec: _Spec, subnet: IPNetwork) -> list[intervals.Interval]:
    out = []
    for i, ex in enumerate(spec.exclusions or []):
        where = f"{found.where} spec.exclusions[{i}]"
        start = parse_ip(ex.startIP, where + ".startIP", found.fix())
        end = parse_ip(ex.endIP, where + ".endIP", found.fix())
        if start.version != subnet.version or end.version != subnet.version or int(start) > int(end):
            raise bad(where, f"{start}-{end} is not a range of IPv{subnet.version} addresses, lowest first", found.fix())
        out.append((int(start), int(end)))
    return out


def _node_exclusions(found: FoundPool, spec: _Spec, base: int, last: int) -> list[intervals.Interval]:
    """``perNodeExclusions`` as addresses: indices counted from ``base``, clipped at ``last``."""
    out = []
    for i, ex in enumerate(spec.perNodeExclusions or []):
        if ex.endIndex < ex.startIndex:
            raise bad(f"{found.where} spec.perNodeExclusions[{i}]", f"endIndex {ex.endIndex} is below startIndex "
                                                                    f"{ex.startIndex}", found.fix())
        if base + ex.startIndex <= last:
            out.append((base + ex.startIndex, min(base + ex.endIndex, last)))
    return out


def _routes(found: FoundPool, spec: _Spec, gateway: Optional[IPAddress], family: int) -> tuple[Route, ...]:
    out = []
    if spec.defaultGateway and gateway is not None:
        out.append(Route(dst=ipaddress.ip_network("0.0.0.0/0" if family == 4 else "::/0"), gw=gateway))
    for i, route in enumerate(spec.routes or []):
        dst = parse_cidr(route.dst, f"{found.where} spec.routes[{i}].dst", found.fix())
        if dst.version != family:
            raise bad(f"{found.where} spec.routes[{i}].dst", f"{dst} is not IPv{family}", found.fix())
        out.append(Route(dst=dst, gw=gateway))
    return tuple(out)


def _check_selected(found: FoundPool, spec: _Spec, node: str, labels: Labels) -> None:
    if node_selector.selects_every_node(spec.nodeSelector):
        return
    if not node_selector.matches(spec.nodeSelector, node, labels()):
        raise CNIError(INVALID_CONFIG,
                       f"invalid network config: ipam.poolName: node {node} is not selected by {found.where}'s "
                       f"spec.nodeSelector: the pool gives this node no addresses",
                       "run the pod on a node the pool selects (a nodeSelector or node affinity on the pod that "
                       "matches the pool's), or the pool's owner widens spec.nodeSelector")


def _no_block(found: FoundPool, node: str, what: str) -> CNIError:
    return CNIError(TRY_AGAIN_LATER,
                    f"{found.where} has no {what} for node {node} in status.allocations yet "
                    f"(mode {NV_IPAM}: nv-ipam's controller assigns each node's {what})",
                    f"wait for nv-ipam's controller (the kubelet retries); if nv-ipam is gone, the pool's owner "
                    f"switches the pool to lease-ipam's blocks: kubectl -n {found.namespace} annotate "
                    f"{found.ref.plural}.nv-ipam.nvidia.com {found.name} {MODE_ANNOTATION}={LEASE_IPAM}")


def block_hint(size: int) -> int:
    """lease-ipam's block size for a pool's ``perNodeBlockSize``: the largest power of two not above it."""
    return min(1 << (max(size, 1).bit_length() - 1), MAX_BLOCK_HINT)


def _held(held: Sequence[IPAddress], family: int) -> list[intervals.Interval]:
    """The addresses nv-ipam's node agent gave on this node (:mod:`.nv_ipam_node_store`), as exclusions."""
    return [(int(ip), int(ip)) for ip in held if ip.version == family]


def ippool_range(found: FoundPool, index: int, node: str, labels: Labels, held: Sequence[IPAddress] = ()) -> NodeRange:
    pool = load(IPPoolDoc, dict(found.doc), prefix=f"{found.where} ")
    spec, mode = pool.spec, mode_of(found)
    subnet = parse_cidr(spec.subnet, f"{found.where} spec.subnet", found.fix())
    gateway = _family(parse_ip(spec.gateway, f"{found.where} spec.gateway", found.fix()), subnet,
                      f"{found.where} spec.gateway", found) if spec.gateway else None
    excludes = _exclusions(found, spec, subnet) + _held(held, subnet.version)
    _check_selected(found, spec, node, labels)
    routes = _routes(found, spec, gateway, subnet.version)
    where = {"range": f"{found.where} spec.subnet", "gateway": f"{found.where} spec.gateway"}
    if mode == LEASE_IPAM:
        if spec.perNodeExclusions:
            raise bad(f"{found.where} spec.perNodeExclusions",
                      f"counts from nv-ipam's node blocks, which no longer apply ({MODE_ANNOTATION}={LEASE_IPAM}): "
                      "these addresses would be handed out",
                      f"move the addresses to spec.exclusions (startIP/endIP) and remove perNodeExclusions ({found.fix()})")
        r = build_range(subnet, None, None, gateway, tuple(intervals.merge(excludes)),
                        {**where, "start": where["range"], "end": where["range"]})
        rs = RangeSet(index, (r,), f"ipam.poolName ({found.where})")
        return NodeRange(rs, False, mode, block_hint(spec.perNodeBlockSize), routes,
                         f"{found.where}: {r.describe()}, lease-ipam's node blocks and borrowing ({MODE_ANNOTATION}={LEASE_IPAM})")
    mine = [(i, a) for i, a in enumerate(pool.status.allocations or []) if a.nodeName == node]
    if not mine:
        raise _no_block(found, node, "block")
    i, alloc = mine[0]
    at = f"{found.where} status.allocations[{i}]"
    start = _family(parse_ip(alloc.startIP, at + ".startIP", found.fix()), subnet, at + ".startIP", found)
    end = _family(parse_ip(alloc.endIP, at + ".endIP", found.fix()), subnet, at + ".endIP", found)
    excludes += _node_exclusions(found, spec, int(start), int(end))
    r = build_range(subnet, start, end, gateway, tuple(intervals.merge(excludes)),
                    {**where, "start": at + ".startIP", "end": at + ".endIP"})
    rs = RangeSet(index, (r,), f"ipam.poolName ({found.where})")
    return NodeRange(rs, True, mode, None, routes,
                     f"{found.where}: node {node}'s nv-ipam block {start}-{end} of {subnet}, never left, no borrowing "
                     f"({MODE_ANNOTATION}={NV_IPAM})")


def cidrpool_range(found: FoundPool, index: int, node: str, labels: Labels,
                   held: Sequence[IPAddress] = ()) -> NodeRange:
    pool = load(CIDRPoolDoc, dict(found.doc), prefix=f"{found.where} ")
    spec, mode = pool.spec, mode_of(found)
    cidr = parse_cidr(spec.cidr, f"{found.where} spec.cidr", found.fix())
    if not cidr.prefixlen <= spec.perNodeNetworkPrefix <= cidr.max_prefixlen:
        raise bad(f"{found.where} spec.perNodeNetworkPrefix", f"/{spec.perNodeNetworkPrefix} does not split {cidr}",
                  found.fix())
    excludes = _exclusions(found, spec, cidr) + _held(held, cidr.version)
    _check_selected(found, spec, node, labels)
    assigned = [(f"status.allocations[{i}]", a) for i, a in enumerate(pool.status.allocations or []) if a.nodeName == node]
    static = [(f"spec.staticAllocations[{i}]", a) for i, a in enumerate(spec.staticAllocations or []) if a.nodeName == node]
    mine = (static + assigned) if mode == LEASE_IPAM else (assigned + static)
    if not mine:
        if mode == LEASE_IPAM:
            raise bad(f"{found.where} spec.staticAllocations", f"names no prefix for node {node}, and nv-ipam's "
                      "controller, which would assign one, is gone: a CIDRPool's prefixes are routed per node",
                      f'add {{"nodeName": "{node}", "prefix": "<a free /{spec.perNodeNetworkPrefix} of {cidr}>"}} '
                      f"to spec.staticAllocations ({found.fix()})")
        raise _no_block(found, node, "prefix")
    field, alloc = mine[0]
    at = f"{found.where} {field}"
    prefix = parse_cidr(alloc.prefix, at + ".prefix", found.fix())
    if prefix.version != cidr.version or not prefix.subnet_of(cidr) or prefix.prefixlen != spec.perNodeNetworkPrefix:
        raise bad(at + ".prefix", f"{prefix} is not a /{spec.perNodeNetworkPrefix} of {cidr}", found.fix())
    if alloc.gateway:
        gateway: Optional[IPAddress] = _family(parse_ip(alloc.gateway, at + ".gateway", found.fix()), prefix,
                                               at + ".gateway", found)
    elif spec.gatewayIndex is not None:
        if spec.gatewayIndex >= prefix.num_addresses:
            raise bad(f"{found.where} spec.gatewayIndex", f"{spec.gatewayIndex} is outside {prefix}", found.fix())
        gateway = prefix[spec.gatewayIndex]
    else:
        gateway = None
    base = int(prefix.network_address)
    excludes += _node_exclusions(found, spec, base, int(prefix.broadcast_address))
    r = build_range(prefix, None, None, gateway, tuple(intervals.merge(excludes)),
                    {"range": at + ".prefix", "start": at + ".prefix", "end": at + ".prefix", "gateway": at + ".gateway"})
    rs = RangeSet(index, (r,), f"ipam.poolName ({found.where})")
    return NodeRange(rs, True, mode, None, _routes(found, spec, gateway, prefix.version),
                     f"{found.where}: node {node}'s prefix {prefix} ({field}), gateway {gateway or 'none'}, never left")


def node_ranges(found: list[FoundPool], node: str, labels: Labels, held: Sequence[IPAddress] = ()) -> list[NodeRange]:
    """What each pool (in ``poolName``'s order) gives node ``node``, without the addresses ``held``
    (nv-ipam's node agent gave them here); CNI error 7 for a pool that is not usable as written or
    a node its selector excludes, 11 for a block not assigned yet."""
    out = [(cidrpool_range if f.ref.kind == CIDRPOOL else ippool_range)(f, i, node, labels, held)
           for i, f in enumerate(found)]
    check_overlaps([(nr.range_set.origin, list(nr.range_set.ranges)) for nr in out])
    return out


def placement(ranges: list[NodeRange]) -> tuple[frozenset[int], Optional[int]]:
    """(indices of the range sets that are assigned blocks, lease-ipam's block size hint): the
    smallest hint of the pools in ``lease-ipam`` mode (a smaller block is always safe)."""
    hints = [nr.block_hint for nr in ranges if nr.block_hint is not None]
    return frozenset(nr.range_set.index for nr in ranges if nr.assigned), (min(hints) if hints else None)

