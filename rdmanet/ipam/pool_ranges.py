"""A network's nv-ipam pools (``poolName``) turned into this node's range sets, for one ADD, CHECK or
STATUS: the pools read in the namespaces the node policy allows (:mod:`.store.pool_reader`),
what each gives this node (:mod:`.nv_ipam_pools`: its assigned block, or the pool's range under
lease-ipam's own blocks), less the addresses nv-ipam's node agent gave on this node
(:mod:`.nv_ipam_node_store`), and the Lease store told which range sets are assigned blocks and
which block size the others take (:meth:`.store.kube.KubeStore.place`).

The pool namespace is the node owner's to allow, like the Lease namespace: a NAD is tenant
input, and a pool names the addresses a tenant's pods get. ``ipam.poolNamespace`` must be one
of the node policy's ``poolNamespaces``; without it those are looked in, in order.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from rdmanet.cni.core.errors import TRY_AGAIN_LATER, CNIError
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.linux import roots

from .nv_ipam_node_store import held_addresses
from .nv_ipam_pools import NodeRange, node_ranges, placement

if TYPE_CHECKING:
    from .config import LeaseIPAMConfig
    from .store.kube import KubeStore


def namespaces(config: "LeaseIPAMConfig") -> tuple[str, ...]:
    """Where the config's pools are looked for: its ``poolNamespace`` (allowed by the node
    policy, else CNI error 7), or the node policy's ``poolNamespaces`` in order."""
    policy = roots.current()
    if config.pools is not None and config.pools.namespace is not None:
        policy.check_pool_namespace(config.pools.namespace)
        return (config.pools.namespace,)
    return policy.pool_namespaces


def read_ranges(config: "LeaseIPAMConfig", inv: Invocation, store: "KubeStore") -> list[NodeRange]:
    """What each of the config's pools gives the store's node (pools and Node read over the
    store's requests; kept for a while in the node daemon, read again when what was kept gives
    this node no block yet)."""
    from .kube_config import kube_settings
    from .store import lease_cache
    from .store.pool_reader import PoolReader, forget

    assert config.pools is not None
    settings = kube_settings(inv.config)
    connection = (settings.kubeconfig, settings.api_root)
    where = namespaces(config)
    reader = PoolReader(store.leases.call, connection, keep=lease_cache.enabled())
    deadline = store.leases.deadline()
    held = held_addresses()

    def read() -> list[NodeRange]:
        return node_ranges(reader.pools(config.pools, where, deadline), store.node,
                           lambda: reader.labels(store.node, deadline), held)

    try:
        return read()
    except CNIError as err:
        if err.code != TRY_AGAIN_LATER or not reader.keep or reader.read_now:
            raise
    forget(connection)  # what was kept may predate the block nv-ipam's controller assigned since
    return read()


def resolve(config: "LeaseIPAMConfig", inv: Invocation, store: "KubeStore") -> "LeaseIPAMConfig":
    """The config with the range sets (and routes) the pools give this node; the store placed."""
    ranges = read_ranges(config, inv, store)
    assigned, hint = placement(ranges)
    store.place(assigned, hint)
    routes = tuple(route for nr in ranges for route in nr.routes) + config.routes
    return replace(config, range_sets=tuple(nr.range_set for nr in ranges), routes=routes)
