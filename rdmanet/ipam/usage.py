"""One network's address usage as this process knows it, for the node daemon's metrics: no
request to the API server and no lock wait, so a scrape never slows a CNI call.

- Local store: the address files under ``<dataDir>/<domain>``, read as they are.
- Lease store: the daemon's watch cache of this node's Leases (a node sees only its own): the
  claims made on this node, the free addresses of the blocks it holds, and how many blocks it
  holds. Nothing when no watch runs for the network (no call served it since the daemon started,
  or its watch went idle). The cluster-wide picture is ``rdmanet ipam ls``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .location import store_location


@dataclass(frozen=True)
class NetworkUsage:
    store: str  # "local" or "kubernetes"
    ranges: tuple[str, ...]  # each range set as rdmanet ipam ls describes it
    used: tuple[int, ...]
    free: tuple[int, ...]
    blocks: Optional[int]  # node blocks this node holds (Lease store)


def network_usage(config: dict, node: str) -> Optional[NetworkUsage]:
    """The usage of the network ``config`` (a network config with a lease-ipam block) on ``node``;
    None when this process holds nothing to count from. CNI errors of the config propagate."""
    from .config import parse_ipam_config
    from .kube_config import kube_settings

    parsed = parse_ipam_config(config)
    data_dir, domain = store_location(config)
    settings = kube_settings(config)
    if settings is None:
        from .store.local import LocalStore

        store, kind = LocalStore(data_dir, domain), "local"
    else:
        from .kube_config import connect
        from .store import lease_cache
        from .store.kube import KubeStore, cache_key

        if not lease_cache.enabled():
            return None
        conn = connect(settings)
        running = lease_cache.peek(*cache_key(settings, conn, domain, node))  # a scrape keeps no watch alive
        if running is None:
            return None
        store = KubeStore(conn.transport(), conn.namespace, domain, node=node, block_size=settings.block_size,
                          cache=lambda start: running)
        kind = "kubernetes"
    found = store.usage(parsed.range_sets)
    if found is None:
        return None
    return NetworkUsage(kind, tuple(rs.describe() for rs in parsed.range_sets), found.used, found.free, found.blocks)
