"""Whether the daemon's node GC runs, and if not, why: it runs only under a Node name
(``RDMANET_NODE_NAME``, or the one install.sh wrote to /etc/default/rdmanet) that the API of a
cluster store confirms (:mod:`rdmanet.ipam.node_identity`). Read-only: one GET of the Node per
store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .cni_checks import NetworkUse
from .findings import Finding, info, ok, warn


@dataclass
class StoreAnswer:
    kubeconfig: str
    confirmed: bool
    reason: str = ""
    fix: str = ""


@dataclass
class NodeFacts:
    name: Optional[str]
    source: str
    stores: list[StoreAnswer] = field(default_factory=list)


def _cluster_stores(uses: list[NetworkUse]) -> list[Any]:
    """The cluster stores the node GC would act on: those the networks name, and those it finds
    itself (rdmanet.ipam.node_gc.known_settings: the DaemonSet's kubeconfig, whereabouts')."""
    from rdmanet.cni.core.errors import CNIError
    from rdmanet.ipam.kube_config import KubeSettings, kube_settings
    from rdmanet.ipam.node_gc import known_settings

    found = {}
    for use in uses:
        if use.ipam != "lease-ipam" and use.plugin != "lease-ipam":
            continue
        try:
            settings = kube_settings(use.config)
        except CNIError:
            continue  # the store check reports it
        if isinstance(settings, KubeSettings):
            found.setdefault((settings.kubeconfig, settings.api_root, settings.namespace), settings)
    for settings in known_settings(lambda *a, **k: None):
        found.setdefault((settings.kubeconfig, settings.api_root, settings.namespace), settings)
    return list(found.values())


def gather(uses: list[NetworkUse], timeout: float) -> NodeFacts:
    from rdmanet.ipam import node_identity
    from rdmanet.ipam.kube_config import connect
    from rdmanet.ipam.reconcile import KubeAPI
    from rdmanet.ipam.store.kube import ApiClientTransport

    configured = node_identity.configured()
    facts = NodeFacts(configured.name, configured.source)
    if configured.name is None:
        return facts
    for settings in _cluster_stores(uses):
        where = settings.kubeconfig or "in-cluster"
        try:
            conn = connect(settings)
            api = KubeAPI(ApiClientTransport(conn.api_client, conn.host), min(timeout, settings.request_timeout))
        except Exception as exc:  # noqa: BLE001 - the store check reports a bad kubeconfig
            facts.stores.append(StoreAnswer(where, False, f"cannot connect: {getattr(exc, 'msg', None) or exc}",
                                            "see the lease-ipam store check"))
            continue
        found = node_identity.confirm(api, configured.name)
        facts.stores.append(StoreAnswer(where, found.name is not None, found.reason, found.fix))
    return facts


def check(facts: NodeFacts) -> list[Finding]:
    from rdmanet.ipam import node_identity

    if facts.name is None:
        return [warn("node", "node GC", f"the daemon runs no node GC: it has no Node name ({node_identity.NODE_ENV} "
                                        f"is set neither in its environment nor in {node_identity.ENVIRONMENT_FILE}); "
                                        "claims of pods that went without a DEL wait for the reconciler CronJob",
                     "host mode: re-run install.sh, which writes the name of the Node matching this host there, or "
                     "install.sh --node-name NAME; the DaemonSet sets it from spec.nodeName")]
    subject = f"node GC ({facts.name}, from {facts.source})"
    if not facts.stores:
        return [info("node", subject, "no cluster store found to confirm the Node with (the daemon confirms it per store "
                                      "before each node GC run)", "give a network config with --network-config FILE")]
    out = []
    for s in facts.stores:
        if s.confirmed:
            out.append(ok("node", subject, f"kubernetes {s.kubeconfig}: the API confirms Node {facts.name}: the node GC "
                                           "runs for this store"))
        else:
            out.append(warn("node", subject, f"kubernetes {s.kubeconfig}: the node GC does not run for this store: "
                                             f"{s.reason}", s.fix or "see the API server's message"))
    return out
