"""Which nv-ipam pools an ipam block names: ``poolName``, ``poolType`` and ``poolNamespace``.

Read without pydantic and without the API, so DEL and GC (which never read a pool) can tell that
a network uses the Kubernetes store and which domain it allocates in.

Facts relied on (nv-ipam's README, "nv-ipam CNI configuration"; its CRD types ``IPPool`` and
``CIDRPool`` of ``nv-ipam.nvidia.com/v1alpha1``):
- ``poolName`` names the pool; a comma-separated pair names one IPv4 and one IPv6 pool
  (dual-stack: one address from each). Without it nv-ipam takes the network's name.
- ``poolType`` is ``ippool`` (the default) or ``cidrpool``, case-insensitive, for every pool named.
- The pools live in the namespace nv-ipam's controller and node daemon watch
  (``--ippools-namespace``: ``kube-system`` by default; the NVIDIA Network Operator deploys
  nv-ipam in its own namespace, ``nvidia-network-operator``). nv-ipam's CNI config has no key for
  it; lease-ipam adds ``poolNamespace``, which must be one the node policy allows
  (``poolNamespaces``); without it the node policy's namespaces are looked in, in order.
- Pool names are Kubernetes object names (DNS-1123 subdomains).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional


IPPOOL, CIDRPOOL = "ippool", "cidrpool"
KINDS = {IPPOOL: ("IPPool", "ippools"), CIDRPOOL: ("CIDRPool", "cidrpools")}
MAX_POOLS = 2  # nv-ipam: one IPv4 and one IPv6 pool
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class PoolRef:
    """The pools one ipam block names: their kind (``ippool``/``cidrpool``), names in order (one
    range set each) and the namespace it names (None: the node policy's, in order)."""

    kind: str
    names: tuple[str, ...]
    namespace: Optional[str] = None

    @property
    def kind_name(self) -> str:
        return KINDS[self.kind][0]

    @property
    def plural(self) -> str:
        return KINDS[self.kind][1]

    def keys(self) -> list[str]:
        """What stands for the pools' ranges in a domain key (``enable_overlapping_ranges: false``)."""
        return [f"{self.kind}/{name}" for name in self.names]


def names_pools(raw: Mapping[str, Any]) -> bool:
    """The ipam block names nv-ipam pools (``poolName`` or ``poolType``)."""
    return raw.get("poolName") is not None or raw.get("poolType") is not None


def pool_ref(raw: Mapping[str, Any], network: str) -> Optional[PoolRef]:
    """The pools the (merged) ipam block names, or None; CNI error 7 naming the key when one is wrong."""
    from .location import bad  # location reads this module at import

    if not names_pools(raw):
        if raw.get("poolNamespace") is not None:
            raise bad("ipam.poolNamespace", "is set but poolName is not",
                      'name the pool too: "poolName": "my-pool" (nv-ipam\'s key), or remove poolNamespace')
        return None
    kind = raw.get("poolType", IPPOOL)
    if not isinstance(kind, str) or kind.lower() not in KINDS:
        raise bad("ipam.poolType", f"{kind!r} is not a pool type", '"ippool" (the default) or "cidrpool", as for nv-ipam')
    text = raw.get("poolName", network)
    if not isinstance(text, str):
        raise bad("ipam.poolName", f"{text!r} is not a string", 'e.g. "poolName": "pool1", or "pool-v4,pool-v6"')
    names = tuple(part.strip() for part in text.split(","))
    if len(names) > MAX_POOLS:
        raise bad("ipam.poolName", f"{text!r} names {len(names)} pools; at most {MAX_POOLS} (one IPv4, one IPv6)",
                  'name one pool, or two for dual-stack: "pool-v4,pool-v6"')
    for name in names:
        if not _NAME.match(name):
            raise bad("ipam.poolName", f"{name!r} is not a pool name (a Kubernetes object name: lower-case letters, "
                                       "digits, '-' and '.')", 'e.g. "poolName": "ipoib-pool-a"')
    if len(set(names)) != len(names):
        raise bad("ipam.poolName", f"{text!r} names one pool twice", "name each pool once")
    namespace = raw.get("poolNamespace")
    if namespace is not None and (not isinstance(namespace, str) or not _DNS_LABEL.match(namespace)):
        raise bad("ipam.poolNamespace", f"{namespace!r} is not a namespace name", 'e.g. "poolNamespace": "kube-system"')
    return PoolRef(kind.lower(), names, namespace)
