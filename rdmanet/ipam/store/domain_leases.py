"""One allocation domain's Leases in one namespace, as the Kubernetes store reads and writes them
(:class:`DomainLeases`): every request with the verb's budget and retries, claims created, read
and deleted, block records taken, freed and deleted, each answer written through to the verb's
watch cache. The store (:mod:`.kube`) and its node blocks (:mod:`.kube_blocks`) share one.

Faults: every request has a timeout (``request_timeout_seconds``); 429 (Retry-After honoured),
5xx and transport errors are retried with jittered exponential backoff within the verb's budget
(``timeout_seconds``), after which the verb fails with code 11. A create retried after an
ambiguous failure that then meets 409 reads the Lease back: it may be our own. A delete carries
the uid and resourceVersion it knew as preconditions, so it never removes a claim re-made for
another attachment.
"""

from __future__ import annotations

import logging
import random
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence, TypeVar

from rdmanet.cni.core.errors import IO_FAILURE, TRY_AGAIN_LATER, CNIError

from ..ranges import IPAddress, Range, RangeSet
from .base import Attachment
from .block_records import A_TAKEN, Block, block_size_in, free_record_body, record_body
from .claims import Claim, DomainScan, PodInfo, parse_claim, parse_lease
from .kube_transport import Response, Transport, Unreachable
from .lease_names import (GROUP, KIND_BLOCK, L_ATTACHMENT, L_BLOCK, L_DOMAIN, L_KIND, L_NETWORK, L_NODE, L_POD_UID,
                          _now_micro, attachment_hash, block_first, block_id, domain_hash, holder_of, label_value,
                          lease_name)
from .whereabouts import WhereaboutsView

if TYPE_CHECKING:
    from .lease_cache import LeaseCache

log = logging.getLogger("rdmanet.ipam")

LEASES_PATH = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
LIST_PAGE = 500  # Leases per List page: a List holds one page's JSON at a time
_BACKOFF_BASE = 0.05
_BACKOFF_CAP = 1.0
_T = TypeVar("_T")


class DomainLeases:
    """The Leases of domain ``domain`` in ``namespace`` over ``transport``, for the verbs of node
    ``node`` (its claims carry the node's label and the pod's). ``cache``: the verb's watch cache
    (the store sets it when the verb starts), which every answer is written through to; ``calls``
    counts the requests per method; ``uncertain`` holds the creates whose outcome is unknown (no
    answer within the budget), for the ADD to check before it returns."""

    def __init__(self, transport: Transport, namespace: str, domain: str, *, node: str, pod: PodInfo = PodInfo(),
                 timeout: float = 20.0, request_timeout: float = 5.0, sleep: Callable[[float], None] = time.sleep,
                 block_size: Optional[int] = None, whereabouts: Optional[str] = None,
                 whereabouts_namespace: Optional[str] = None) -> None:
        self.transport = transport
        self.namespace = namespace
        self.domain = domain
        self.dhash = domain_hash(domain)
        self.node = node
        self.pod = pod
        self.timeout = timeout
        self.request_timeout = request_timeout
        self.sleep = sleep
        self.path = LEASES_PATH.format(namespace=namespace)
        self.block_size = block_size  # None: DEFAULT_BLOCK_SIZE of the family
        self.calls: dict[str, int] = {}  # per method, for logs and tests
        self.uncertain: list[str] = []  # creates whose outcome is unknown (no answer within the budget)
        self.cache: Optional[LeaseCache] = None  # the informer this verb writes its answers through to
        self.whereabouts = whereabouts  # None: no check; else whereabouts' network_name ("" for none)
        self.whereabouts_namespace = whereabouts_namespace or namespace
        self._wb: Optional[WhereaboutsView] = None

    def deadline(self, budget: Optional[float] = None) -> float:
        return time.monotonic() + (self.timeout if budget is None else budget)

    def _unreachable(self, what: str, last: str, extra: str = "") -> CNIError:
        return CNIError(TRY_AGAIN_LATER,
                        f"Kubernetes API {self.transport.host} did not serve {what} within {self.timeout:g} s: {last}{extra}",
                        "check the API server address (kubeconfig server or kubernetes.k8s_api_root), the network "
                        "and the API server's load; the runtime retries the call")

    def call(self, method: str, path: str, what: str, deadline: float, query: Sequence[tuple[str, str]] = (),
              body: Any = None) -> tuple[Response, bool]:
        """(response, retried): any answer but 429, 5xx or a transport failure, which are retried."""
        attempt, last = 0, "no attempt made"
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0.01:
                raise self._unreachable(what, last)
            self.calls[method] = self.calls.get(method, 0) + 1
            wait = None
            try:
                resp = self.transport.request(method, path, query, body, min(self.request_timeout, remaining))
            except Unreachable as exc:
                last = str(exc)
            else:
                if resp.status != 429 and resp.status < 500:
                    return resp, attempt > 0
                last = f"HTTP {resp.status} {_message(resp)}".rstrip()
                wait = _retry_after(resp)
            told = wait is not None
            backoff = min(_BACKOFF_CAP, _BACKOFF_BASE * 2 ** attempt) * random.uniform(0.5, 1.0)
            wait = backoff if wait is None else wait * random.uniform(1.0, 1.1)
            attempt += 1
            if time.monotonic() + wait >= deadline:
                raise self._unreachable(what, last, f" (Retry-After {wait:.1f} s passes the deadline)" if told else "")
            log.debug("%s %s: %s; retry %d in %.2f s", method, what, last, attempt, wait)
            self.sleep(wait)

    def refused(self, resp: Response, what: str) -> CNIError:
        hint = {401: "the credentials of the kubeconfig were rejected: renew the token or certificate",
                403: f"grant get, list, create and delete on leases.coordination.k8s.io in namespace {self.namespace}",
                404: f"create namespace {self.namespace} or set ipam.kubernetes.namespace"}
        return CNIError(IO_FAILURE, f"Kubernetes API refused {what}: HTTP {resp.status} {_message(resp)}".rstrip(),
                        hint.get(resp.status, "see the API server's message"))

    def claims_selector(self) -> str:
        """Every claim of the domain (old-version claims carry no kind label: != keeps them)."""
        return f"{L_DOMAIN}={self.dhash},{L_KIND}!={KIND_BLOCK}"

    def selector(self, **extra: str) -> str:
        labels = {L_DOMAIN: self.dhash, **extra}
        return ",".join(f"{k}={v}" for k, v in labels.items())

    def pages(self, selector: str, deadline: float, what: str, limit: int = LIST_PAGE) -> Iterator[Optional[list[Any]]]:
        """The selected Leases, one page (``limit``, default ``LIST_PAGE``) at a time: a List never holds more than a
        page of documents in memory. A continue token that expired (410) restarts the List: None
        is yielded then, and what was gathered so far must be dropped."""
        cont, restarts = "", 0
        while True:
            query = [("labelSelector", selector), ("limit", str(limit))]
            if cont:
                query.append(("continue", cont))
            resp, _ = self.call("GET", self.path, what, deadline, query=query)
            if resp.status == 410 and cont and restarts < 3:
                log.info("%s: the continue token expired (HTTP 410): listing again from the start", what)
                self.calls["relist"] = self.calls.get("relist", 0) + 1
                cont, restarts = "", restarts + 1
                yield None
                continue
            if resp.status != 200 or not isinstance(resp.doc, dict):
                raise self.refused(resp, what)
            yield resp.doc.get("items") or []
            cont = (resp.doc.get("metadata") or {}).get("continue") or ""
            if not cont:
                return

    def list_all(self, selector: str, deadline: float, what: str, limit: int = LIST_PAGE,
                  pods: Optional[dict[str, tuple[str, str, str]]] = None) -> tuple[list[Claim], list[Block]]:
        """The selected claims and blocks; ``pods``, when given, gets each claim's pod (namespace,
        name, UID from its annotations, "" where absent) by Lease name."""
        claims: dict[str, Claim] = {}
        blocks: dict[str, Block] = {}
        for page in self.pages(selector, deadline, what, limit):
            if page is None:
                claims.clear()
                blocks.clear()
                continue
            for item in page:
                got = parse_lease(item, self.dhash)
                if isinstance(got, Claim):
                    claims[got.name] = got
                    if pods is not None:
                        notes = (item.get("metadata") or {}).get("annotations") or {}
                        pods[got.name] = tuple(str(notes.get(f"{GROUP}/pod-{k}") or "") for k in ("namespace", "name", "uid"))
                    got = got.as_block()  # a block record: the block too
                if isinstance(got, Block):
                    blocks[got.name] = got
        return list(claims.values()), list(blocks.values())

    def list_claims(self, selector: str, deadline: float, what: str) -> list[Claim]:
        return self.fold(selector, deadline, what, list, list.append)

    def fold(self, selector: str, deadline: float, what: str, start: Callable[[], _T],
              add: Callable[[_T, Claim], Any]) -> _T:
        """``add(acc, claim)`` for each claim the selector matches, ``acc`` made by ``start()``;
        the List is paginated (``limit=LIST_PAGE``) and parsed page by page, so only one page's
        JSON is held at once whatever the domain's size. A continue token that expired (410:
        the server compacted the List's snapshot) starts the List over with a fresh ``acc``;
        every attempt stays within the verb's deadline."""
        acc, cont = start(), ""
        while True:
            query = [("labelSelector", selector), ("limit", str(LIST_PAGE))]
            if cont:
                query.append(("continue", cont))
            resp, _ = self.call("GET", self.path, what, deadline, query=query)
            if resp.status == 410 and cont:
                log.info("%s: the continue token expired (HTTP 410): listing again from the start", what)
                self.calls["relist"] = self.calls.get("relist", 0) + 1
                acc, cont = start(), ""
                continue
            if resp.status != 200 or not isinstance(resp.doc, dict):
                raise self.refused(resp, what)
            for item in resp.doc.get("items") or []:
                claim = self.parse(item)
                if claim is not None:
                    add(acc, claim)
            cont = (resp.doc.get("metadata") or {}).get("continue") or ""
            if not isinstance(cont, str) or not cont:
                return acc

    def scan_domain(self, deadline: float) -> DomainScan:
        """The domain's claims, folded page by page from one paginated List (kept as ints)."""
        return self.fold(self.claims_selector(), deadline, f"list leases of domain {self.domain}",
                          lambda: DomainScan(None, set()), DomainScan.add)

    def parse(self, item: Any) -> Optional[Claim]:
        return parse_claim(item, self.dhash)

    def get(self, name: str, deadline: float, expected_uid: str = "") -> Optional[Claim]:
        """The Lease as it is now (None: there is none). ``expected_uid``: the UID the caller
        knew the name by, which a 404 proves gone (the cache forgets only that one)."""
        resp, _ = self.call("GET", f"{self.path}/{name}", f"get lease {name}", deadline)
        if resp.status == 404:
            if self.cache is not None:
                self.cache.absent(name, expected_uid)
            return None
        if resp.status != 200:
            raise self.refused(resp, f"get lease {name}")
        claim = self.parse(resp.doc)
        if claim is not None and self.cache is not None:
            self.cache.observed(claim)
        return claim

    def body(self, ip: IPAddress, attachment: Attachment, network: str, rs: RangeSet) -> dict:
        r = rs.range_of(ip)
        labels = {L_DOMAIN: self.dhash, L_NETWORK: label_value(network), L_NODE: label_value(self.node),
                  L_ATTACHMENT: attachment_hash(attachment)}
        if r is not None:
            size = block_size_in(r, self.block_size)
            labels[L_BLOCK] = block_id(r.address(block_first(r.subnet, int(ip), size)), size)
        notes = {"ipam-domain": self.domain, "network": network, "range": str(r.subnet) if r else "", "ip": str(ip),
                 "container-id": attachment.container_id, "ifname": attachment.ifname, "node": self.node,
                 "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        if self.pod.uid:
            labels[L_POD_UID] = label_value(self.pod.uid)
            notes["pod-uid"] = self.pod.uid
        if self.pod.namespace:
            notes["pod-namespace"] = self.pod.namespace
        if self.pod.name:
            notes["pod-name"] = self.pod.name
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": lease_name(self.dhash, ip), "namespace": self.namespace, "labels": labels,
                             "annotations": {f"{GROUP}/{k}": v for k, v in notes.items()}},
                "spec": {"holderIdentity": holder_of(attachment), "acquireTime": _now_micro()}}

    def create(self, ip: IPAddress, attachment: Attachment, network: str, rs: RangeSet,
                deadline: float, record: Optional[tuple[Any, int]] = None) -> Optional[Claim]:
        """Our new claim on ``ip``, or None when another attachment holds it. ``record``: (range,
        first address) of the block this claim is made the record of (this node acquires it)."""
        body = self.body(ip, attachment, network, rs)
        if record is not None:
            self._record_body(body, self.node, record[0], record[1])
        name = body["metadata"]["name"]
        ambiguous = False
        for _ in range(3):
            try:
                resp, retried = self.call("POST", self.path, f"create lease {name}", deadline, body=body)
            except CNIError:
                self.uncertain.append(name)  # an attempt may have reached the server: rollback checks
                raise
            if resp.status in (200, 201):
                claim = self.parse(resp.doc)
                if claim is None:
                    raise CNIError(IO_FAILURE, f"Kubernetes API answered the create of lease {name} with an unreadable object",
                                   "check that the API server (or a proxy) returns the created object")
                if self.cache is not None:
                    self.cache.created(claim)  # a repeat ADD in this process sees it before the watch does
                return claim
            if resp.status != 409:
                raise self.refused(resp, f"create lease {name}")
            if not retried:
                if self.cache is not None:
                    self.cache.taken(name, ip)
                return None
            # An earlier attempt may have created it before its answer was lost: read it back.
            current = self.get(name, deadline)
            if current is None:
                ambiguous = True  # an attempt that timed out may still be served later
                continue  # deleted meanwhile: try the create again
            return current if current.attachment == attachment else None
        if ambiguous:
            self.uncertain.append(name)  # checked before the ADD returns (:meth:`_sweep_uncertain`)
        return None

    def delete(self, claim: Claim, deadline: float) -> bool:
        """Delete ``claim`` only while it still names its attachment; True when we removed it."""
        return self.remove(claim, deadline) is not None

    def remove(self, claim: Claim, deadline: float) -> Optional[Claim]:
        """:meth:`_delete`, answering the version of the claim that was deleted (None: not by us).
        A block record is not deleted but updated to name no attachment (its block stays held):
        the answer is then the record as freed."""
        if claim.block:
            return self.free_record(claim, deadline)
        current = claim
        for _ in range(4):
            body = {"apiVersion": "v1", "kind": "DeleteOptions",
                    "preconditions": {"uid": current.uid, "resourceVersion": current.resource_version}}
            resp, retried = self.call("DELETE", f"{self.path}/{current.name}", f"delete lease {current.name}",
                                       deadline, body=body)
            if resp.status in (200, 202):
                if self.cache is not None:
                    self.cache.deleted(current)
                return current
            if resp.status == 404:
                if self.cache is not None:
                    if retried:
                        self.cache.deleted(current)
                    else:
                        self.cache.absent(current.name, current.uid)
                return current if retried else None  # gone: by our own earlier attempt when we retried, else by someone else
            if resp.status != 409:
                raise self.refused(resp, f"delete lease {current.name}")
            # Precondition failed: re-read. Delete again only while it still names the same attachment.
            fresh = self.get(current.name, deadline, current.uid)
            if fresh is None or fresh.attachment != claim.attachment:
                log.info("lease %s was re-made for %s: left alone", current.name, fresh.attachment if fresh else "nobody")
                return None
            current = fresh
        raise CNIError(TRY_AGAIN_LATER, f"lease {claim.name} kept changing while being deleted", "retry the DEL")

    def whereabouts_holder(self, ip: IPAddress, rs: RangeSet, deadline: float) -> Optional[str]:
        """Which of whereabouts' objects holds ``ip`` (None: none, or the check is off)."""
        if self.whereabouts is None:
            return None
        if self._wb is None:
            self._wb = WhereaboutsView(self.whereabouts_namespace, self.whereabouts,
                                       lambda path, what: self.call("GET", path, what, deadline)[0])
        holder = self._wb.holder(ip, rs.range_of(ip))
        if holder is not None:
            log.info("%s is held by %s (a pod whereabouts served): next candidate", ip, holder)
        return holder

    def attachment_claims(self, attachment: Attachment, deadline: float) -> list[Claim]:
        selector = self.selector(**{L_ATTACHMENT: attachment_hash(attachment)})
        claims = self.list_claims(selector, deadline, f"list leases of {attachment}")
        if self.cache is not None:
            for c in claims:
                self.cache.observed(c)
        return sorted((c for c in claims if c.attachment == attachment), key=lambda c: (c.ip.version, c.ip))

    def _record_body(self, body: dict, owner: str, r: Range, first: int, planned: bool = False) -> dict:
        """``body`` (a claim Lease) made the record of the block at ``first`` held by ``owner``
        (``planned``: a record a plan made, which stays one)."""
        return record_body(body, owner, r, first, block_size_in(r, self.block_size), planned)

    def _free_body(self, record: Claim) -> dict:
        """The record ``record`` naming no attachment: its address free, its block still held."""
        body = free_record_body(self.namespace, self.domain, record.ip, record.block, record.range, record.owner,
                                record.planned)
        body["metadata"].update({"uid": record.uid, "resourceVersion": record.resource_version})
        return body

    def _put(self, name: str, body: dict, deadline: float) -> tuple[Any, bool]:
        return self.call("PUT", f"{self.path}/{name}", f"update lease {name}", deadline, body=body)

    def take_record(self, record: Block, attachment: Attachment, network: str, rs: RangeSet,
                     deadline: float) -> Optional[Claim]:
        """Our claim on a free block record's address, made by updating the record (precondition:
        the uid and resourceVersion seen). None: it is not free any more (or gone)."""
        ip = record.record_ip
        r = rs.range_of(ip) if ip is not None else None
        if r is None:
            return None
        for _ in range(3):
            body = self._record_body(self.body(ip, attachment, network, rs), record.node, r, int(record.ip), record.planned)
            # its creationTimestamp is the record's, not this claim's: no cleaner may order it by that
            body["metadata"]["annotations"][A_TAKEN] = "true"
            body["metadata"].update({"uid": record.uid, "resourceVersion": record.resource_version})
            resp, retried = self._put(record.name, body, deadline)
            if resp.status == 200:
                return self._updated(record.name, resp)
            if resp.status == 404:  # the record is gone (released, or a GC deleted it): the block is lost
                if self.cache is not None:
                    self.cache.absent(record.name, record.uid)
                return None
            if resp.status != 409:
                raise self.refused(resp, f"update lease {record.name}")
            current = self.get(record.name, deadline, record.uid)  # changed since read: ours (a retried attempt)? free?
            if current is None or not current.block:
                return None
            if current.attachment == attachment:
                return current
            if current.attachment is not None:
                return None
            found = current.as_block()
            if found is None:
                return None
            record = found
        return None

    def _updated(self, name: str, resp) -> Claim:
        """The record as a 200 answer to its update shows it (written through to the cache)."""
        claim = self.parse(resp.doc)
        if claim is None:
            raise CNIError(IO_FAILURE, f"Kubernetes API answered the update of lease {name} with an "
                           "unreadable object", "check that the API server (or a proxy) returns the object")
        if self.cache is not None:
            self.cache.updated(claim)
        return claim

    def free_record(self, claim: Claim, deadline: float) -> Optional[Claim]:
        """Free the address of block record ``claim`` (an update naming no attachment, with uid
        and resourceVersion preconditions; 409: re-read, freed only while it still names the same
        attachment). The record as freed, or None when it was not ours to free (gone, re-made)."""
        current = claim
        for _ in range(4):
            resp, retried = self._put(current.name, self._free_body(current), deadline)
            if resp.status == 200:
                return self._updated(current.name, resp)
            if resp.status == 404:
                if self.cache is not None:
                    self.cache.absent(current.name, current.uid)
                return None  # gone (a GC deleted the record): the address is free, the block lost
            if resp.status != 409:
                raise self.refused(resp, f"update lease {current.name}")
            fresh = self.get(current.name, deadline, current.uid)
            if fresh is None or fresh.attachment != claim.attachment:
                return fresh if (retried and fresh is not None and fresh.free and fresh.uid == claim.uid) else None
            if not fresh.block:  # deleted and re-made as a plain claim of the same attachment
                return self.remove(fresh, deadline)
            current = fresh
        raise CNIError(IO_FAILURE, f"lease {claim.name} kept changing while being freed", "retry the DEL")

    def drop_block(self, block: Block, deadline: float) -> bool:
        """Delete an empty block's record (or first-design Lease) with uid/resourceVersion
        preconditions: a record that changed since (its address claimed again) is left alone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                "preconditions": {"uid": block.uid, "resourceVersion": block.resource_version}}
        resp, retried = self.call("DELETE", f"{self.path}/{block.name}", f"delete lease {block.name}", deadline, body=body)
        if resp.status in (200, 202) or (resp.status == 404 and retried):
            if self.cache is not None:
                self.cache.deleted(block)
            log.info("node %s released empty block %s of %s", self.node, block.id, self.domain)
            return True
        if resp.status in (404, 409):
            if self.cache is not None and resp.status == 404:
                self.cache.absent(block.name, block.uid)
            return False  # gone already, or changed (re-acquired, its address claimed): left alone
        raise self.refused(resp, f"delete lease {block.name}")


def _message(resp: Response) -> str:
    if isinstance(resp.doc, dict) and isinstance(resp.doc.get("message"), str):
        return resp.doc["message"]
    return ""


def _retry_after(resp: Response) -> Optional[float]:
    value = None
    try:
        value = resp.headers.get("Retry-After")
    except AttributeError:
        pass
    if value is None:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None
