"""nv-ipam's pools, and this node's labels when a pool's ``nodeSelector`` needs them, read from the
API for the ADD, CHECK or STATUS of a network that names pools (``poolName``). Never written.

Facts relied on (nv-ipam's CRDs; Kubernetes API conventions):
- ``IPPool`` and ``CIDRPool`` are namespaced objects of ``nv-ipam.nvidia.com/v1alpha1``
  (plurals ``ippools``, ``cidrpools``), read by name: one GET each. An object that does not
  exist, or a group the server does not serve (nv-ipam's CRDs not installed), answers 404.
- A Node is read by name (``/api/v1/nodes/<name>``), which the node daemon may already do
  (it confirms its Node before a node GC run).

Cost: in-process, one GET per pool (per namespace looked in until it is found) and one of the
Node when a pool has a selector, per verb. The node daemon (a process that keeps the Lease watch
cache) keeps what it read for ``KEEP_SECONDS``: an ADD through the daemon costs no request of
its own for the pool. What was not found, and a pool that gave this node no block yet, is not
kept (the next verb reads again), so a block nv-ipam's controller assigns is used at once.
A pool changed meanwhile is seen within ``KEEP_SECONDS``, about as soon as nv-ipam's own node
agent would see it through its watch.

Errors: a pool found in no allowed namespace is CNI error 7 naming ``ipam.poolName`` and where
it was looked for; a 403 is 5 naming the grant; an unreachable or failing API server is 11
(the store's budget and retries, :meth:`.domain_leases.DomainLeases.call`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Hashable, Mapping, Optional, Sequence
from urllib.parse import quote

from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, CNIError

from ..nv_ipam_pools import FoundPool
from ..pool_ref import PoolRef
from .kube_transport import Response

GROUP_PATH = "/apis/nv-ipam.nvidia.com/v1alpha1"
POOL_PATH = GROUP_PATH + "/namespaces/{namespace}/{plural}/{name}"
NODE_PATH = "/api/v1/nodes/{name}"
KEEP_SECONDS = 10.0

Call = Callable[[str, str, str, float], tuple[Response, bool]]  # (method, path, what, deadline): the store's call

_kept: dict[Hashable, tuple[float, Any]] = {}
_kept_lock = threading.Lock()
MAX_KEPT = 1024  # pools and nodes one daemon keeps (it serves one node: a handful in practice)


def _recall(key: Hashable) -> Optional[Any]:
    with _kept_lock:
        found = _kept.get(key)
    if found is None or time.monotonic() - found[0] >= KEEP_SECONDS:
        return None
    return found[1]


def _keep(key: Hashable, value: Any) -> None:
    with _kept_lock:
        if len(_kept) >= MAX_KEPT:
            _kept.clear()
        _kept[key] = (time.monotonic(), value)


def forget(key_prefix: Hashable) -> None:
    """Drop what is kept for one connection (``key_prefix``): the next verb reads again."""
    with _kept_lock:
        for key in [k for k in _kept if k[0] == key_prefix]:
            del _kept[key]


def clear() -> None:
    with _kept_lock:
        _kept.clear()


class PoolReader:
    """Reads over ``call`` (the store's requests, with the verb's budget and retries). ``keep``:
    this process is the node daemon, which keeps what it read (see the module docstring);
    ``connection``: what identifies the credentials and server in that memory."""

    def __init__(self, call: Call, connection: Hashable, keep: bool) -> None:
        self.call = call
        self.connection = connection
        self.keep = keep
        self.read_now = False  # a verb read something from the API (not all of it was kept)

    def _get(self, path: str, what: str, deadline: float) -> Response:
        self.read_now = True
        resp, _ = self.call("GET", path, what, deadline)
        return resp

    def pools(self, ref: PoolRef, namespaces: Sequence[str], deadline: float) -> list[FoundPool]:
        """Each pool ``ref`` names, from the first of ``namespaces`` that holds it."""
        return [self.pool(ref, name, namespaces, deadline) for name in ref.names]

    def pool(self, ref: PoolRef, name: str, namespaces: Sequence[str], deadline: float) -> FoundPool:
        key = (self.connection, ref.kind, tuple(namespaces), name)
        found = _recall(key) if self.keep else None
        if found is not None:
            return found
        misses = []
        for ns in namespaces:
            what = f"get {ref.kind_name} {ns}/{name}"
            resp = self._get(POOL_PATH.format(namespace=quote(ns, safe=""), plural=ref.plural, name=quote(name, safe="")),
                             what, deadline)
            if resp.status == 200 and isinstance(resp.doc, dict):
                found = FoundPool(ref, name, ns, resp.doc)
                if self.keep:
                    _keep(key, found)
                return found
            if resp.status not in (403, 404):
                raise CNIError(IO_FAILURE, f"Kubernetes API answered HTTP {resp.status} to {what}: {_message(resp)}",
                               "see the API server's message")
            misses.append((ns, resp))
        forbidden = [ns for ns, resp in misses if resp.status == 403]
        if forbidden:
            raise CNIError(IO_FAILURE, f"Kubernetes API refused to get {ref.kind_name} {name} in namespace "
                                       f"{', '.join(forbidden)} (HTTP 403){_not_found(misses)}",
                           f"grant get on {ref.plural}.nv-ipam.nvidia.com to lease-ipam's identity "
                           "(deploy/rbac.yaml: ClusterRole rdmanet-nv-ipam-pool-reader)")
        raise CNIError(INVALID_CONFIG, f"invalid network config: ipam.poolName: {ref.kind_name} {name!r} is not in "
                                       f"namespace {', '.join(namespaces)} (or nv-ipam's CRDs are not installed)",
                       f"create the {ref.kind_name}, or fix poolName / poolType (\"ippool\" or \"cidrpool\"); "
                       "poolNamespace picks one of the namespaces the node policy allows (poolNamespaces)")

    def labels(self, node: str, deadline: float) -> Mapping[str, str]:
        """The labels of Node ``node`` (a pool's ``nodeSelector`` is judged by them)."""
        key = (self.connection, "node", node)
        found = _recall(key) if self.keep else None
        if found is not None:
            return found
        what = f"get Node {node}"
        resp = self._get(NODE_PATH.format(name=quote(node, safe="")), what, deadline)
        if resp.status == 200 and isinstance(resp.doc, dict):
            labels = dict((resp.doc.get("metadata") or {}).get("labels") or {})
            if self.keep:
                _keep(key, labels)
            return labels
        if resp.status == 404:
            raise CNIError(IO_FAILURE, f"Node {node!r} does not exist in the API: a pool's nodeSelector cannot be judged "
                                       "for this node",
                           "the daemon's RDMANET_NODE_NAME must be this node's Node name (the DaemonSet sets it from "
                           "spec.nodeName; host mode: install.sh --node-name NAME)")
        if resp.status == 403:
            raise CNIError(IO_FAILURE, f"Kubernetes API refused to {what} (HTTP 403): a pool's nodeSelector needs the "
                                       "node's labels", "grant get on nodes (deploy/rbac.yaml: ClusterRole rdmanet-node-lister)")
        raise CNIError(IO_FAILURE, f"Kubernetes API answered HTTP {resp.status} to {what}: {_message(resp)}",
                       "see the API server's message")


def _not_found(misses: list[tuple[str, Response]]) -> str:
    absent = [ns for ns, resp in misses if resp.status == 404]
    return f"; not in {', '.join(absent)}" if absent else ""


def _message(resp: Response) -> str:
    return str(resp.doc.get("message", "")) if isinstance(resp.doc, dict) else ""
