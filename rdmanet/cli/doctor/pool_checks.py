"""Networks written for nv-ipam (``poolName``): which pools they name, which mode applies to each
(nv-ipam's node blocks while its controller runs, or lease-ipam's own once nv-ipam is gone: the
pool's ``rdmanet.io/node-blocks`` annotation) and what this node would allocate from.

A network whose ``ipam.type`` is still ``nv-ipam`` is told that changing ``type`` to ``lease-ipam``
is the whole switch; one that already says ``lease-ipam`` gets what its next ADD would see, or
the error it would answer. Read-only: one GET per pool (and of the Node when a pool has a
``nodeSelector``), with the credentials the network's store would use (docs/lease-ipam.md,
"Coming from nv-ipam").
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from rdmanet.cni.core.errors import TRY_AGAIN_LATER, CNIError

from .cni_checks import NetworkUse
from .findings import Finding, error, info, ok, warn

NV_IPAM = "nv-ipam"


@dataclass
class PoolFacts:
    network: str
    source: str
    ipam_type: str
    pools: str  # "IPPool ipoib-pool-a", as the network names them
    ranges: list[str] = field(default_factory=list)  # what each pool gives this node, with its mode
    modes: list[str] = field(default_factory=list)
    problem: str = ""  # "", "unread" (not read from here), "error", "wait"
    detail: str = ""
    fix: str = ""


def _names_pools(use: NetworkUse) -> bool:
    from rdmanet.ipam.pool_ref import names_pools

    ipam = use.config.get("ipam")
    return isinstance(ipam, dict) and (use.ipam == NV_IPAM or (use.ipam == "lease-ipam" and names_pools(ipam)))


def _as_lease_ipam(use: NetworkUse) -> dict:
    """The network's config with ``ipam.type`` lease-ipam: what the switch would run."""
    return dict(use.config, ipam=dict(use.config["ipam"], type="lease-ipam"))


def _call(transport: Any, timeout: float):
    def call(method: str, path: str, what: str, deadline: float):
        return transport.request(method, path, [], None, max(0.1, min(timeout, deadline - time.monotonic()))), False
    return call


def _read(facts: PoolFacts, config: dict, timeout: float) -> None:
    from rdmanet.cni.linux import roots
    from rdmanet.ipam import node_identity, nv_ipam_node_store, nv_ipam_pools
    from rdmanet.ipam.kube_config import connect, kube_settings
    from rdmanet.ipam.pool_ref import pool_ref
    from rdmanet.ipam.store.kube_transport import ApiClientTransport
    from rdmanet.ipam.store.pool_reader import PoolReader

    ref = pool_ref(config["ipam"], config.get("name", ""))
    assert ref is not None
    facts.pools = ", ".join(f"{ref.kind_name} {name}" for name in ref.names)
    policy = roots.current()
    if ref.namespace is not None:
        policy.check_pool_namespace(ref.namespace)
    settings = kube_settings(config)
    if settings.kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        facts.problem = "unread"
        facts.detail = "the pools are not read from here: no kubeconfig names the credentials (the in-cluster config works only in a pod)"
        facts.fix = "set ipam.kubernetes.kubeconfig for plugins run on the host, or run doctor in the rdmanet pod"
        return
    conn = connect(settings)
    reader = PoolReader(_call(ApiClientTransport(conn.api_client, conn.host), timeout), None, keep=False)
    deadline = time.monotonic() + timeout
    found = reader.pools(ref, (ref.namespace,) if ref.namespace else policy.pool_namespaces, deadline)
    facts.modes = [nv_ipam_pools.mode_of(f) for f in found]
    node = node_identity.configured().name or socket.gethostname()
    ranges = nv_ipam_pools.node_ranges(found, node, lambda: reader.labels(node, deadline),
                                       nv_ipam_node_store.held_addresses())
    facts.ranges = [nr.describe for nr in ranges]


def gather(uses: list[NetworkUse], timeout: float) -> list[PoolFacts]:
    out = []
    for use in uses:
        if not _names_pools(use):
            continue
        facts = PoolFacts(use.network, use.source, str(use.ipam), "")
        try:
            _read(facts, _as_lease_ipam(use), timeout)
        except CNIError as err:
            facts.problem = "wait" if err.code == TRY_AGAIN_LATER else "error"
            facts.detail, facts.fix = err.msg, err.details
        out.append(facts)
    return out


def _switch(f: PoolFacts) -> str:
    return (f"{f.source} uses nv-ipam ({f.pools}): lease-ipam takes this ipam block as written, change "
            f"ipam.type to lease-ipam and nothing else")


def _finding(f: PoolFacts) -> Finding:
    if f.problem == "unread":
        return info("ipam", f.network, f"{_switch(f) if f.ipam_type == NV_IPAM else f.pools}; {f.detail}", f.fix)
    if f.problem:
        severity = warn if f.problem == "wait" or f.ipam_type == NV_IPAM else error
        prefix = f"{_switch(f)}; it would answer" if f.ipam_type == NV_IPAM else f"{f.pools}: ADD answers"
        return severity("ipam", f.network, f"{prefix}: {f.detail}", f.fix)
    gives = "; ".join(f.ranges)
    if f.ipam_type == NV_IPAM:
        return info("ipam", f.network, f"{_switch(f)}; this node would then allocate from {gives}",
                    "switch every NAD of a pool on a node together: nv-ipam's node agent and lease-ipam do not see "
                    "each other's new addresses")
    return ok("ipam", f.network, f"nv-ipam pools: this node allocates from {gives}")


def check(facts: list[PoolFacts]) -> list[Finding]:
    return [_finding(f) for f in facts]

