"""The reconciler of the Kubernetes Lease store: free claims whose pod, by UID, is gone.

Runs once per call: the default install's CronJob (``--all``: every domain of the namespace), an
operator, or the node daemon's GC on a timer (this node's claims, :mod:`rdmanet.ipam.node_gc`). Lease layout
it relies on (one ``coordination.k8s.io/v1`` Lease per address, made by ADD in ``rdmanet/ipam/store/kube.py``)::

    metadata.labels       rdmanet.io/ipam-domain, rdmanet.io/network, rdmanet.io/node, rdmanet.io/pod-uid
    metadata.annotations  the pod's namespace, name and UID (set by ADD from K8S_POD_*)
    spec.holderIdentity   "<containerID>/<ifname>"

Rules (in brackets: what whereabouts, nv-ipam or dranet do wrong that the rule avoids, by upstream issue):
- Only the store's namespace is listed, with the domain's label selector (never every Lease of
  the cluster: kube-node-lease alone is one per node, renewed every 10 s).
- A claim is judged by its pod's **UID**: the pod by namespace/name, from one paginated List of
  the namespace's pods per run (of the node's pods, for the node daemon's GC: a pod that List does
  not show is then looked up by name, since a claim's node label is no proof of where its pod
  runs), and compare UIDs. A pod that is missing (404) or has another UID is a miss; never a decision by name alone
  [whereabouts #176/#182: StatefulSet name reuse freed the new pod's IP] and never from the
  network-status annotation [whereabouts #162/#207]. A static pod's claim carries the kubelet's
  UID, which the API shows in its mirror pod's ``kubernetes.io/config.mirror`` annotation (the
  mirror pod's own UID differs): such a pod is present (Multus documents the same).
- Claims without a pod identity (no UID, namespace or name) are left alone and reported: only a
  claim that can be attributed to a real pod is ever freed [dranet #103].
- Every time is the API server's: a claim's age is its ``creationTimestamp`` against the ``Date``
  of the server's answer to the List, never this node's clock nor the claiming node's
  ``acquireTime``. Claims younger than the grace period are skipped entirely (neither counted
  nor reset).
- A miss is recorded on the Lease itself, in the annotations ``rdmanet.io/reconcile-misses`` and
  ``rdmanet.io/reconcile-missed-at`` (the server time of the miss), and counts only when it is at
  least ``spacing_seconds`` (default grace / misses) after the one before: the CronJob, the node
  GC and CNI GC share the count, and back-to-back runs count once. Written with a
  resourceVersion-guarded PUT: a concurrent change (a repeat ADD, another
  reconciler) wins with 409 and this run leaves the claim alone. The count lives on the object,
  so it survives restarts and is shared by reconcilers on any node.
- When a claim's consecutive misses reach ``misses`` (this run's miss included) it is deleted
  with preconditions {uid, resourceVersion} from the list: a claim re-made for another pod, or
  changed in any way since the list, is never removed (409 -> left, reported as a conflict).
  With ``misses=3`` and a 60 s CronJob a claim goes about 2-3 min after its pod [nv-ipam: >3 x 1 min].
- A claim whose pod is present with its UID has its miss count removed (guarded the same way).
- Of the claims of one pod UID, interface and network, only the one the server made last
  (``creationTimestamp``) is live: a pod has one sandbox at a time, so an older one of another
  container ID belongs to a sandbox the kubelet replaced, whose DEL never came. It counts misses
  as above (never freed in one run); a group the server's clock cannot order is left alone.
- 404 on a write or delete means someone else already freed it: reported, not an error.
- Any other API failure of one claim is reported as an error for that claim; the rest go on.

The ``kubernetes`` client is used for its transport (kubeconfig, TLS, token), with plain JSON
bodies, so the Lease documents are written back exactly as read, apart from the one annotation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Optional
from urllib.parse import quote

from rdmanet.cni.core.errors import INVALID_CONFIG, NOT_AVAILABLE, CNIError

from . import telemetry

from .store.kube import (
    GROUP,
    L_BLOCK_OWNER,
    L_DOMAIN,
    L_NODE,
    L_POD_UID,
    LEASES_PATH,
    Transport,
    Unreachable,
    domain_hash,
    ip_of_name,
    label_value,
    parse_holder,
)
from .store.block_records import A_TAKEN
from .store.lease_names import parse_time, server_date

MISSES_ANNOTATION = f"{GROUP}/reconcile-misses"
MISSED_AT_ANNOTATION = f"{GROUP}/reconcile-missed-at"  # the server time of the last miss counted
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
PODS = "/api/v1/namespaces/{namespace}/pods/{name}"
PODS_OF = "/api/v1/namespaces/{namespace}/pods"
LIST_PAGE = 500
A_POD_NAMESPACE = f"{GROUP}/pod-namespace"
A_POD_NAME = f"{GROUP}/pod-name"
A_POD_UID = f"{GROUP}/pod-uid"
A_NETWORK = f"{GROUP}/network"
A_NODE = f"{GROUP}/node"
A_IP = f"{GROUP}/ip"


def domain_selector(domain: str) -> str:
    """Every claim of a domain, and nothing else in the namespace."""
    return f"{L_DOMAIN}={domain_hash(domain)}"


def _text(doc: dict, key: str) -> str:
    value = doc.get(key)
    return value if isinstance(value, str) else ""


# -- one claim ------------------------------------------------------------------------------------

@dataclass
class LeaseClaim:
    """One Lease as the reconciler and ``rdmanet ipam ls`` see it (not the document: a run over
    100,000 claims keeps these few fields each; a write re-reads the one Lease it changes)."""

    name: str
    uid: str
    resource_version: str
    address: Optional[str]
    network: str
    container_id: str
    ifname: str
    node: Optional[str]
    pod_namespace: Optional[str]
    pod_name: Optional[str]
    pod_uid: Optional[str]
    created: Optional[datetime]
    misses: int
    acquired: Optional[datetime] = None  # spec.acquireTime: the claiming node's clock, shown, never judged by
    record: bool = False  # the claim is also a node block's record: freed by an update, not deleted
    taken: bool = False  # made by taking a free record (an update): ``created`` is the record's, not the claim's
    missed_at: Optional[datetime] = None  # the server time of the last miss counted

    @classmethod
    def from_lease(cls, raw: dict) -> "LeaseClaim":
        meta = raw.get("metadata") or {}
        spec = raw.get("spec") or {}
        labels = meta.get("labels") or {}
        ann = meta.get("annotations") or {}
        holder = parse_holder(spec.get("holderIdentity"))
        try:
            misses = max(0, int(ann.get(MISSES_ANNOTATION, "0")))
        except (TypeError, ValueError):
            misses = 0
        name = str(meta.get("name") or "")
        ip = ip_of_name(name, labels.get(L_DOMAIN, ""))
        uid_label = labels.get(L_POD_UID) or ""
        return cls(
            name=name,
            uid=str(meta.get("uid") or ""),
            resource_version=str(meta.get("resourceVersion") or ""),
            address=str(ip) if ip is not None else (_text(ann, A_IP) or None),
            network=_text(ann, A_NETWORK),
            container_id=holder.container_id if holder else "",
            ifname=holder.ifname if holder else "",
            node=_text(ann, A_NODE) or _text(labels, L_NODE) or None,
            pod_namespace=_text(ann, A_POD_NAMESPACE) or None,
            pod_name=_text(ann, A_POD_NAME) or None,
            # the annotation is exact; the label only when it is not a hash of a too-long value
            pod_uid=_text(ann, A_POD_UID) or (uid_label if uid_label and not uid_label.startswith("h-") else None),
            created=parse_time(meta.get("creationTimestamp")),  # the server's clock
            misses=misses,
            acquired=parse_time(spec.get("acquireTime")) or parse_time(meta.get("creationTimestamp")),
            record=bool(labels.get(L_BLOCK_OWNER)),
            taken=bool(labels.get(L_BLOCK_OWNER)) and ann.get(A_TAKEN) == "true",
            missed_at=parse_time(ann.get(MISSED_AT_ANNOTATION)) if misses else None,
        )

    @property
    def pod(self) -> Optional[str]:
        return f"{self.pod_namespace}/{self.pod_name}" if self.pod_namespace and self.pod_name else None

    @property
    def has_pod_identity(self) -> bool:
        return bool(self.pod_uid and self.pod_namespace and self.pod_name)

    def age(self, now: datetime) -> Optional[float]:
        return None if self.created is None else max(0.0, (now - self.created).total_seconds())


# -- the API --------------------------------------------------------------------------------------

class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}".rstrip(": "))
        self.status = status
        self.message = message


class KubeAPI:
    """JSON requests over the Lease store's transport (the ``kubernetes`` client's ApiClient).
    ``server_time``: the ``Date`` of the latest answer (the API server's clock, never this node's)."""

    def __init__(self, transport: Transport, request_timeout: float = 5.0) -> None:
        self.transport = transport
        self.request_timeout = request_timeout
        self.server_time: Optional[datetime] = None

    def request(self, method: str, path: str, query: Optional[list] = None, body: Any = None) -> dict:
        """The answer's JSON object; ApiError for an HTTP error, CNIError 50 when there is no answer."""
        try:
            resp = self.transport.request(method, path, query or [], body, self.request_timeout)
        except Unreachable as exc:
            raise CNIError(NOT_AVAILABLE, f"Kubernetes API {self.transport.host} unreachable: {exc}",
                           "check the kubeconfig's server and credentials, and that the API server is up") from None
        when = server_date(resp.headers)
        if when is not None:
            self.server_time = when
        doc = resp.doc if isinstance(resp.doc, dict) else {}
        if resp.status >= 400:
            raise ApiError(resp.status, str(doc.get("message") or ""))
        return doc


# When a List of pods was refused (403), by credentials (API host, kubeconfig): pods are then read
# by name, and a List is asked for again after POD_LIST_RETRY seconds (RBAC may have changed).
POD_LIST_RETRY = 3600.0
_pod_list_refused: dict[tuple[str, str], float] = {}


@dataclass
class KubeTarget:
    """Claims in the Lease store: which namespace, which selector, which client. By default one
    domain's; ``selector`` widens it (every domain, or every domain's claims of one node).

    Pods are read once per run (:meth:`begin_run`), not once per claim: with ``node`` set (the
    node daemon's GC: only that node's claims) one List of the pods bound to the node
    (``fieldSelector=spec.nodeName``, every namespace); else one List per namespace that holds a
    claim to judge. Both paginated; of each pod only its UID and mirror annotation are kept.
    Credentials that may ``get`` but not ``list`` pods (the node daemon's, deploy/rbac.yaml) read
    one pod per claim by name instead; the refusal is remembered for this process
    (:data:`POD_LIST_RETRY`), so each run does not ask again only to be refused."""

    api: KubeAPI
    namespace: str
    domain: str
    selector: str = ""
    node: Optional[str] = None
    _pods: dict = field(default_factory=dict, repr=False)  # namespace (or "" for the node's) -> {name: pod}
    credentials: tuple[str, str] = ("", "")  # (API host, kubeconfig): whose pod Lists were refused

    @classmethod
    def for_settings(cls, settings: Any, node: Optional[str] = None) -> "KubeTarget":
        """Every lease-ipam claim the settings' credentials reach (the namespace they resolve
        to), or only those made on ``node``."""
        from .kube_config import connect

        conn = connect(settings)
        selector, what = L_DOMAIN, "every domain"
        if node is not None:
            selector, what = f"{L_DOMAIN},{L_NODE}={label_value(node)}", f"node {node}"
        transport = conn.transport()
        return cls(KubeAPI(transport, settings.request_timeout), conn.namespace, what, selector, node,
                   credentials=(transport.host, settings.kubeconfig or "in-cluster"))

    @classmethod
    def from_config(cls, config: dict) -> "KubeTarget":
        from .kube_config import connect, kube_settings
        from .location import store_location

        settings = kube_settings(config)
        if settings is None:
            raise CNIError(INVALID_CONFIG, "the network config's ipam block has no \"kubernetes\" key",
                           "the reconciler serves the Kubernetes Lease store only; add \"kubernetes\": {...} to ipam")
        _, domain = store_location(config)
        conn = connect(settings)
        transport = conn.transport()
        return cls(KubeAPI(transport, settings.request_timeout), conn.namespace, domain,
                   credentials=(transport.host, settings.kubeconfig or "in-cluster"))

    @property
    def leases(self) -> str:
        return LEASES_PATH.format(namespace=quote(self.namespace, safe=""))

    def _pages(self, path: str, query: list, each: Callable[[dict], None], restart: Callable[[], None]) -> None:
        """``each(item)`` for every item of a List, page by page (``limit=LIST_PAGE``); a continue
        token that expired (410) calls ``restart()`` and starts over, a few times at most."""
        cont, restarts = None, 0
        while True:
            page = [*query, ("limit", str(LIST_PAGE))] + ([("continue", cont)] if cont else [])
            try:
                doc = self.api.request("GET", path, page)
            except ApiError as err:
                if err.status == 410 and cont and restarts < 3:
                    restarts, cont = restarts + 1, None
                    restart()
                    continue
                raise
            for item in doc.get("items") or []:
                if isinstance(item, dict):
                    each(item)
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return

    pages = _pages  # the same, for other readers of the store (rdmanet.ipam.block_planner: nodes and block records)

    def list_claims(self) -> list[LeaseClaim]:
        """The claims (objects whose name is not a claim name of their own domain label are
        ignored), parsed page by page."""
        out: list[LeaseClaim] = []

        def each(raw: dict) -> None:
            md = raw.get("metadata") or {}
            dhash = (md.get("labels") or {}).get(L_DOMAIN) or ""
            if ip_of_name(str(md.get("name") or ""), dhash) is not None:
                if (md.get("labels") or {}).get(L_BLOCK_OWNER) and not (raw.get("spec") or {}).get("holderIdentity"):
                    return  # a free block record: its address is free, only its block is held
                out.append(LeaseClaim.from_lease(raw))

        try:
            self._pages(self.leases, [("labelSelector", self.selector or domain_selector(self.domain))], each, out.clear)
        except ApiError as err:
            raise CNIError(NOT_AVAILABLE, f"cannot list Leases in namespace {self.namespace}: {err}",
                           "check that the credentials may list leases in that namespace (RBAC)") from None
        return out

    def list_blocks(self) -> list:
        """The node blocks of the target's domain (:class:`rdmanet.ipam.store.kube.Block`): the
        block records (claims labelled ``block-owner``), read page by page. Blocks are never judged
        by the reconciler: only claims keep addresses."""
        return [block for block, _ in self.list_block_records()]

    def list_block_records(self, annotations: bool = False) -> list:
        """:meth:`list_blocks`, each block with the claim that records it, in address order;
        ``annotations``: and the Lease's annotations, as a third element."""
        from .store.kube import parse_claim

        out: list = []
        part: list = []

        def each(raw: dict) -> None:
            md = raw.get("metadata") or {}
            dhash = (md.get("labels") or {}).get(L_DOMAIN) or ""
            claim = parse_claim(raw, dhash)
            block = claim.as_block() if claim is not None else None
            if block is not None:
                part.append((block, claim, dict(md.get("annotations") or {})) if annotations else (block, claim))

        base = self.selector or domain_selector(self.domain)
        try:
            self._pages(self.leases, [("labelSelector", f"{base},{L_BLOCK_OWNER}")], each, part.clear)
            out.extend(part)
        except ApiError as err:
            raise CNIError(NOT_AVAILABLE, f"cannot list Leases in namespace {self.namespace}: {err}",
                           "check that the credentials may list leases in that namespace (RBAC)") from None
        return sorted(out, key=lambda pair: (pair[0].ip.version, int(pair[0].ip)))

    def begin_run(self) -> None:
        """Forget the pods read by an earlier run (each run reads them afresh, once)."""
        self._pods = {}

    def _index_pods(self, namespace: str) -> dict:
        key = "" if self.node is not None else namespace
        index = self._pods.get(key)
        if isinstance(index, ApiError):
            raise index  # this run's List of them failed: the claims there are errors, not one List each
        if index is not None:
            return index
        index = {}

        def each(pod: dict) -> None:
            md = pod.get("metadata") or {}
            notes = md.get("annotations") or {}
            mirror = notes.get(MIRROR_ANNOTATION)
            slim = {"uid": md.get("uid")}
            if mirror:
                slim["annotations"] = {MIRROR_ANNOTATION: mirror}
            index[(md.get("namespace") or namespace, md.get("name"))] = {"metadata": slim}

        try:
            if self.node is not None:
                self._pages("/api/v1/pods", [("fieldSelector", f"spec.nodeName={self.node}")], each, index.clear)
            else:
                self._pages(PODS_OF.format(namespace=quote(namespace, safe="")), [], each, index.clear)
        except ApiError as err:
            if err.status != 403:
                self._pods[key] = err
            raise
        self._pods[key] = index
        return index

    def get_pod(self, namespace: str, name: str) -> Optional[dict]:
        """The pod (its UID and mirror annotation) as this run read it; None when it is not there.
        A pod missing from the List of a node's pods is looked up by name: the claim's label
        names the node its ADD ran on, which is no proof of where its pod is (a pod is gone only
        when the API says so by its namespace and name)."""
        refused = _pod_list_refused.get(self.credentials)
        if refused is None or time.monotonic() - refused > POD_LIST_RETRY:
            try:
                found = self._index_pods(namespace).get((namespace, name))
            except ApiError as err:
                if err.status != 403:
                    raise
                _pod_list_refused[self.credentials] = time.monotonic()  # may get but not list pods
            else:
                if found is not None or self.node is None:
                    return found
        try:
            return self.api.request("GET", PODS.format(namespace=quote(namespace, safe=""), name=quote(name, safe="")))
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def _reread(self, claim: LeaseClaim) -> tuple[str, dict, dict]:
        """(path, body, metadata) of the Lease as the API server has it now; ApiError 409 when it
        changed since the List (another UID or resourceVersion)."""
        path = f"{self.leases}/{quote(claim.name, safe='')}"
        body = self.api.request("GET", path)
        meta = body.setdefault("metadata", {})
        if str(meta.get("uid") or "") != claim.uid or str(meta.get("resourceVersion") or "") != claim.resource_version:
            raise ApiError(409, f"lease {claim.name} changed since it was listed")
        body.setdefault("apiVersion", "coordination.k8s.io/v1")
        body.setdefault("kind", "Lease")
        return path, body, meta

    def write_misses(self, claim: LeaseClaim, misses: int, when: Optional[datetime] = None) -> dict:
        """PUT the Lease, re-read just now, with the miss count set (0 removes it) and ``when``
        (the server time of this miss); 409 when it changed since the List (re-read with another
        UID or resourceVersion) or since the read."""
        path, body, meta = self._reread(claim)
        ann = dict(meta.get("annotations") or {})
        if misses:
            ann[MISSES_ANNOTATION] = str(misses)
            if when is not None:
                ann[MISSED_AT_ANNOTATION] = when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        else:
            ann.pop(MISSES_ANNOTATION, None)
            ann.pop(MISSED_AT_ANNOTATION, None)
        meta["annotations"] = ann
        meta["resourceVersion"] = claim.resource_version
        return self.api.request("PUT", path, body=body)

    def delete(self, claim: LeaseClaim) -> None:
        """Free the claim: delete it (uid/resourceVersion preconditions). A node block's record is
        updated to name no attachment instead (re-read, same preconditions), so its node keeps
        the block: only the address is freed, as the node's own DEL does."""
        if claim.record:
            self._free_record(claim)
            return
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                "preconditions": {"uid": claim.uid, "resourceVersion": claim.resource_version}}
        self.api.request("DELETE", f"{self.leases}/{quote(claim.name, safe='')}", body=body)

    def _free_record(self, claim: LeaseClaim) -> None:
        path, body, meta = self._reread(claim)
        labels = {k: v for k, v in (meta.get("labels") or {}).items()
                  if k not in (L_POD_UID, f"{GROUP}/attachment", f"{GROUP}/network")}
        if labels.get(L_BLOCK_OWNER):  # free, the record is its block owner's object again (a borrower's claim was not)
            labels[L_NODE] = labels[L_BLOCK_OWNER]
        keep = ("ipam-domain", "range", "ip", "block-owner", "block-size")  # not taken-by-update: free now
        meta["labels"] = labels
        meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items()
                               if k.startswith(f"{GROUP}/") and k[len(GROUP) + 1:] in keep}
        body["spec"] = {}
        self.api.request("PUT", path, body=body)


# -- the run --------------------------------------------------------------------------------------

# Actions, one per claim:
KEPT = "kept"              # pod present with the claim's UID
RESET = "reset"            # pod present; an earlier miss count was removed
MISS = "miss"              # pod missing or another UID; the count was raised (not yet N)
FREED = "freed"            # N consecutive misses: the Lease was deleted
YOUNG = "skipped-young"    # younger than the grace period
NO_POD = "no-pod-identity"  # no pod UID/namespace/name: left alone
CONFLICT = "conflict"      # the Lease changed (or was re-made) since the list: left for the next run
GONE = "gone"              # the Lease vanished since the list (a DEL): nothing to do
ERROR = "error"            # an API failure for this claim
LATE = "skipped-deadline"  # the run's deadline passed before this claim was judged
SPACED = "skipped-spacing"  # pod gone, but the last miss was counted less than the spacing ago (server time)


@dataclass
class Action:
    claim: LeaseClaim
    action: str
    misses: int
    reason: str = ""

    def to_json(self) -> dict:
        c = self.claim
        return {"lease": c.name, "address": c.address, "network": c.network, "containerID": c.container_id,
                "ifname": c.ifname, "pod": c.pod, "podUID": c.pod_uid, "node": c.node, "action": self.action,
                "misses": self.misses, "reason": self.reason}


@dataclass
class Outcome:
    domain: str
    namespace: str
    dry_run: bool
    grace_seconds: float
    misses: int
    actions: list[Action] = field(default_factory=list)
    blocks: list = field(default_factory=list)  # rdmanet.ipam.gone_nodes.BlockAction: blocks of Nodes that are gone

    @property
    def errors(self) -> list[Action]:
        return [a for a in self.actions if a.action == ERROR]

    def count(self, action: str) -> int:
        return sum(1 for a in self.actions if a.action == action)

    def to_json(self) -> dict:
        summary = {}
        for a in self.actions:
            summary[a.action] = summary.get(a.action, 0) + 1
        return {"domain": self.domain, "namespace": self.namespace, "dryRun": self.dry_run,
                "graceSeconds": self.grace_seconds, "misses": self.misses, "summary": summary,
                "claims": [a.to_json() for a in self.actions], "blocks": [b.to_json() for b in self.blocks]}


def mirror_of(pod: Optional[dict]) -> Optional[str]:
    """The kubelet's UID of the static pod ``pod`` mirrors (its ``kubernetes.io/config.mirror``
    annotation), or None. The kubelet gives CNI the static pod's own UID (K8S_POD_UID), which is
    not the API's mirror pod UID: a claim of a static pod is live while its mirror pod says so."""
    notes = ((pod or {}).get("metadata") or {}).get("annotations") or {}
    value = notes.get(MIRROR_ANNOTATION)
    return value if isinstance(value, str) and value else None


def _judge(target: KubeTarget, claim: LeaseClaim, now: datetime, grace: float, limit: int, dry_run: bool,
           spacing: float, newer: Optional[LeaseClaim] = None) -> Action:
    """The liveness rule for one claim (every cleaner's): freed only after ``limit`` misses, each
    at least ``spacing`` seconds after the one before, all by the API server's clock (``now``:
    the Date of its answer; ``created``: its creationTimestamp). A miss is the API saying the
    claim's pod (namespace/name) is gone or has another UID, or (``newer``) that the pod's
    claim of the same interface and network made later by the server's clock replaced it."""
    if not claim.has_pod_identity:
        missing = [what for what, v in (("pod UID", claim.pod_uid), ("pod namespace", claim.pod_namespace),
                                        ("pod name", claim.pod_name)) if not v]
        return Action(claim, NO_POD, claim.misses, "no " + ", ".join(missing) + " on the claim: never freed by the reconciler")
    age = claim.age(now)
    if age is None or age < grace:
        return Action(claim, YOUNG, claim.misses,
                      "no creation time" if age is None else f"{int(age)} s old, grace {int(grace)} s")
    pod = target.get_pod(claim.pod_namespace, claim.pod_name)
    live_uid = ((pod or {}).get("metadata") or {}).get("uid")
    if live_uid == claim.pod_uid or mirror_of(pod) == claim.pod_uid:
        if newer is None:
            if claim.misses == 0:
                return Action(claim, KEPT, 0, "pod present")
            if not dry_run:
                target.write_misses(claim, 0)
            return Action(claim, RESET, 0, f"pod present again after {claim.misses} miss(es)")
        why = f"superseded by {newer.container_id[:12]}/{newer.ifname}, a newer sandbox of the same pod"
    else:
        why = "pod not found" if pod is None else f"pod {claim.pod} now has UID {live_uid}"
    if claim.misses and claim.missed_at is not None and (now - claim.missed_at).total_seconds() < spacing:
        return Action(claim, SPACED, claim.misses, f"{why}; the last miss was {int((now - claim.missed_at).total_seconds())} s "
                                                   f"ago, misses are counted {spacing:g} s apart")
    count = claim.misses + 1
    if count >= limit:
        if not dry_run:
            target.delete(claim)
        return Action(claim, FREED, count, f"{why}; miss {count}/{limit}")
    if not dry_run:
        target.write_misses(claim, count, now)
    return Action(claim, MISS, count, f"{why}; miss {count}/{limit}")


def superseded(claims: list[LeaseClaim]) -> dict[str, LeaseClaim]:
    """Claim name -> the newer claim that replaces it: a pod has one sandbox at a time, so of the
    claims of one pod UID, interface and network the one the API server made last (its
    ``creationTimestamp``: never the claiming node's ``acquireTime``, which a node whose clock was
    not yet stepped after a reboot writes wrong) is the live one; an older one of another
    container ID is a sandbox the kubelet replaced whose DEL never arrived (Multus' thick plugin
    swallows a failed DEL). A group the server's clock cannot order (two claims made in the same
    second, or a claim made by taking a free block record, whose creation time is the record's)
    is left to the pod's own liveness."""
    groups: dict[tuple, list[LeaseClaim]] = {}
    for c in claims:
        if c.has_pod_identity and c.container_id:
            groups.setdefault((c.pod_uid, c.ifname, c.network), []).append(c)
    out = {}
    for group in groups.values():
        if len({c.container_id for c in group}) < 2 or any(c.taken or c.created is None for c in group):
            continue
        newest = max(group, key=lambda c: c.created)
        if sum(1 for c in group if c.created == newest.created) > 1:
            continue
        for c in group:
            if c.container_id != newest.container_id:
                out[c.name] = newest
    return out


def reconcile_target(target: KubeTarget, *, grace_seconds: float = 300.0, misses: int = 3, dry_run: bool = False,
                     now: Optional[datetime] = None, deadline_seconds: Optional[float] = None,
                     spacing_seconds: Optional[float] = None,
                     only: Optional[Callable[[LeaseClaim], bool]] = None,
                     freed_by: str = telemetry.RECONCILER) -> Outcome:
    """One pass. Requests: the claims' List (pages of 500), the pods' List once per namespace
    (or once for a node, and a GET per claim whose pod it does not show), and one write per
    claim whose count changes (a GET and a PUT) or that is freed (a DELETE); nothing for a claim
    whose pod is present. ``now``: the API server's time (default: the Date of its List answer;
    none, and nothing is judged); ``spacing_seconds``: the least server time between two
    counted misses (default ``grace_seconds / misses``); ``only``: the claims to judge (the
    CNI GC's: those its runtime no longer knows); ``deadline_seconds``: claims not judged by
    then are left for the next run (reported as ``skipped-deadline``). Each claim freed is
    reported (:func:`rdmanet.ipam.telemetry.freed`, as ``freed_by``)."""
    outcome = Outcome(target.domain, target.namespace, dry_run, grace_seconds, misses)
    end = None if deadline_seconds is None else time.monotonic() + deadline_seconds
    spacing = grace_seconds / max(1, misses) if spacing_seconds is None else spacing_seconds
    target.begin_run()
    claims = sorted(target.list_claims(), key=lambda c: c.name)
    when = now or target.api.server_time
    replaced = superseded(claims)
    for claim in claims:
        if only is not None and not only(claim):
            continue
        if end is not None and time.monotonic() >= end:
            outcome.actions.append(Action(claim, LATE, claim.misses, f"the run's {deadline_seconds:g} s deadline passed"))
            continue
        if when is None:
            outcome.actions.append(Action(claim, YOUNG, claim.misses, "the API server's answer carried no Date: "
                                                                      "nothing is judged by this node's clock"))
            continue
        try:
            action = _judge(target, claim, when, grace_seconds, misses, dry_run, spacing, replaced.get(claim.name))
        except ApiError as err:
            if err.status == 409:
                action = Action(claim, CONFLICT, claim.misses, f"changed since listed, left for the next run ({err.message})")
            elif err.status == 404:
                action = Action(claim, GONE, claim.misses, "deleted since listed")
            else:
                action = Action(claim, ERROR, claim.misses, str(err))
        except CNIError as err:
            action = Action(claim, ERROR, claim.misses, err.msg)
        outcome.actions.append(action)
        if action.action == FREED and not dry_run:
            c = claim
            telemetry.freed(telemetry.Freed(freed_by, c.address or c.name, c.network, c.container_id, c.ifname,
                                            c.pod_namespace, c.pod_name, c.pod_uid, c.node, action.reason))
    return outcome


def reconcile(config: dict, *, grace_seconds: float = 300.0, misses: int = 3, dry_run: bool = False,
              deadline_seconds: Optional[float] = None, spacing_seconds: Optional[float] = None) -> Outcome:
    """One reconciler pass over the network config's Lease-store domain."""
    return reconcile_target(KubeTarget.from_config(config), grace_seconds=grace_seconds, misses=misses, dry_run=dry_run,
                            deadline_seconds=deadline_seconds, spacing_seconds=spacing_seconds)


def reconcile_all(config: dict, *, grace_seconds: float = 300.0, misses: int = 3, dry_run: bool = False,
                  deadline_seconds: Optional[float] = None, spacing_seconds: Optional[float] = None) -> Outcome:
    """One reconciler pass over every lease-ipam claim, of every domain, in the namespace the
    config's ``kubernetes`` settings reach (the default install's CronJob); then the blocks of
    Nodes that no longer exist are released (:mod:`rdmanet.ipam.gone_nodes`)."""
    from .gone_nodes import release_blocks_of_gone_nodes
    from .kube_config import kube_settings

    target = KubeTarget.for_settings(kube_settings(config))
    outcome = reconcile_target(target, grace_seconds=grace_seconds, misses=misses, dry_run=dry_run,
                               deadline_seconds=deadline_seconds, spacing_seconds=spacing_seconds)
    outcome.blocks = release_blocks_of_gone_nodes(target, grace_seconds, dry_run=dry_run)
    return outcome
