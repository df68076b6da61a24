"""The Kubernetes store: one ``coordination.k8s.io/v1`` Lease per allocated address, claimed by create.

Facts relied on (Kubernetes API conventions):
- POST of an object whose name exists answers 409 AlreadyExists; the name is the lock. So a
  claim is one create: 201 = ours, 409 = taken (try the next candidate). No leader election, no
  shared object rewritten per ADD, no object-size ceiling.
- DELETE with ``preconditions{uid, resourceVersion}`` answers 409 Conflict when the object was
  re-created or changed since it was read, and 404 when it is gone; so DEL never removes a claim
  re-made for another attachment (ABA).
- A label-selected List of one namespace returns current state (no resourceVersion=0: a stale
  watch-cache answer could hide our own claim from a repeat ADD). A GET by name is current too.
- A watch from resourceVersion N delivers the selected changes after N in resourceVersion order
  (so an object's own event follows every earlier change); UIDs are never reused.
- Names are DNS-1123 subdomains (<= 253 chars, [a-z0-9.-]); label values are <= 63 chars of
  [A-Za-z0-9_.-] starting and ending alphanumeric; holderIdentity is a free string.

Objects (namespace from :mod:`rdmanet.ipam.kube_config`)::

    name        lip-<16 hex of sha256(domain)>-<ip>   IPv4 dotted, IPv6 as 32 hex nibbles
    labels      rdmanet.io/ipam-domain=<16 hex>  rdmanet.io/network=<name or h-<hash>>
                rdmanet.io/node=<the node whose ADD made it, or h-<hash>>  rdmanet.io/attachment=<sha224(cid/ifname)>
                rdmanet.io/pod-uid=<uid> (when CNI_ARGS has K8S_POD_UID)
    annotations rdmanet.io/{ipam-domain,network,range,ip,container-id,ifname,node,
                pod-namespace,pod-name,pod-uid,created}
    spec        holderIdentity "<containerID>/<ifname>", acquireTime; no leaseDurationSeconds
                (claims are never renewed)

The claim of a node block's first usable address is also the block's record (labels
``rdmanet.io/block-owner``, ``rdmanet.io/block``, ``rdmanet.io/block-group``): created by the ADD
that acquires the block, freed by an update naming no attachment, taken back by an update, deleted
only when the empty block is released (:mod:`.kube_blocks`).

Per verb, when nothing is contended: ADD = 1 List (domain selector; serves both the repeat-ADD
lookup and the used set) + 1 create per range set; DEL = 1 List (domain+attachment selector) +
1 delete per claim; CHECK = 1 List; GC = 2 Lists (the node's claims, its blocks) + the pods of the
claims its runtime dropped + 1 write per miss or freed claim; STATUS = 1 List of the node's own
objects (never the domain's). Nothing is written locally.

With the watch cache (the node daemon calls :func:`use_watch_cache`; :mod:`.lease_cache` keeps
one informer per domain, List + Watch, started on the domain's first ADD/DEL), once it is in
sync: ADD = 1 create per range set and no List (repeat ADD: 1 GET per held claim instead);
DEL = 1 delete per claim (the attachment's List when the cache shows none); STATUS = 0. The
cache is a hint, never the answer, so nothing depends on its freshness:
- candidates come from its used set, but the create is still the claim (409: the address is
  marked taken in the cache, next candidate); our creates/deletes/GETs are written through;
  "no free address" (ADD 102) is only said after a List of the domain (and STATUS 50 in the daemon
  for ``EXHAUSTED_SECONDS`` after that);
- a claim of the attachment that it shows is confirmed by a GET before a repeat ADD returns it
  (another process may have freed it);
- a claim of the attachment that it does not show yet (made by another process, e.g. the
  in-process fallback while the daemon restarted) is found after the ADD's own creates: the
  watch delivers in resourceVersion order, so once it has delivered our new claims it has
  delivered every earlier one; the attachment's older claim in that range set is returned and
  ours deleted. Without that delivery within ``echo_budget``, a label-selected List of the one
  attachment decides (and the cache is distrusted for a while). DEL does the same after its
  deletes, so a claim the cache had missed is freed too;
- deletes carry the cached uid/resourceVersion as preconditions: a stale one meets 409, the
  Lease is re-read and deleted only while it still names the attachment;
- ADD/DEL of one attachment are serialised in the daemon; an informer not in sync within
  ``sync_budget`` (or failing, e.g. no RBAC for watch) leaves the verb to the List path.

Candidates: round-robin over the domain, cluster-wide: :meth:`RangeSet.next_free` after the cursor,
the address of the domain's most recently made claim in the range set (its ``acquireTime``, from
the List or the cache), over the used set, passing over a per-node count of free addresses
(below ``NODE_WINDOW``, at most 1/16 of the range set; none under 32 addresses) so that nodes
adding at the same instant seldom aim at the same address; a 409 adds the address to the used
set and the walk goes on from it (:mod:`.candidates`).
So a freed address is handed out again only after the range has gone round (whereabouts #288,
Calico #6968). In the daemon, ADDs running at once skip each other's candidates. A range is
never enumerated.

The store holds two collaborators: the domain's Leases (:class:`.domain_leases.DomainLeases`:
every request, with the verb's budget and retries, and every write, written through to the watch
cache) and this node's blocks (:class:`.kube_blocks.NodeBlocks`: acquiring, borrowing, releasing).
Faults: a request the API server does not answer within the verb's budget fails the verb with
code 11 (50 for STATUS); a failed ADD deletes the claims it made before reporting the error.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from bisect import bisect_left, bisect_right, insort
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from rdmanet.cni.core.errors import (
    ADDRESS_UNAVAILABLE,
    IO_FAILURE,
    NOT_AVAILABLE,
    TRY_AGAIN_LATER,
    CNIError,
)

from .. import node_identity, telemetry
from ..location import whereabouts_check
from ..ranges import IPAddress, RangeSet
from . import lease_cache
from .base import Attachment, Reservation, Store, Usage, place_held, refuse_other_request
from .assigned_blocks import AssignedBlocks
from .block_records import Block  # noqa: F401  (re-exported)
from .candidates import next_candidate, round_robin_start
from .claims import (  # noqa: F401  (parse_claim, latest_by_range ... re-exported: tests and tools use them from here)
    Claim, DomainScan, PodInfo, latest_by_range, node_selector, parse_claim, parse_lease,
)
from .domain_leases import LEASES_PATH, LIST_PAGE, DomainLeases  # noqa: F401  (LIST_PAGE re-exported)
from .kube_blocks import NodeBlocks
from .kube_transport import ApiClientTransport, Response, Transport, Unreachable  # noqa: F401  (re-exported)
from .lease_cache import LeaseCache
from .lease_names import (  # noqa: F401  (GROUP, L_POD_UID ... re-exported: tests and tools use them from here)
    GROUP, L_ATTACHMENT, L_BLOCK, L_BLOCK_OWNER, L_DOMAIN, L_NETWORK, L_NODE, L_PLANNED,
    L_POD_UID, parse_time, attachment_hash, block_first, block_id, domain_hash, holder_of,
    ip_of_name, label_value, lease_name, parse_block_id, parse_holder,
)

log = logging.getLogger("rdmanet.ipam")

SEARCH_WINDOW = 8  # open blocks an ADD first searches beyond its creates in flight (see KubeStore._search)
EXHAUSTED_SECONDS = 30.0  # after an ADD here found a range exhausted (it read the domain), STATUS says so for this long
NODE_ENV = node_identity.NODE_ENV
_ROLLBACK_GRACE = 1.0  # a failed ADD's rollback may run this long past the verb's deadline


# -- the store ------------------------------------------------------------------------------------

def use_watch_cache(on: bool = True, **settings: Any) -> None:
    """Keep a Lease watch cache per domain in this process (the node daemon calls this once).

    Off by default: the in-process plugin never starts a thread or a watch. See
    :mod:`rdmanet.ipam.store.lease_cache` for the informers and ``settings``.
    """
    lease_cache.enable(on, **settings)


CacheSource = Callable[[bool], Optional[LeaseCache]]


def cache_key(settings: Any, conn: Any, domain: str, node: str) -> tuple[tuple, tuple]:
    """(connection key, domain key) of the informer for ``node``'s Leases of the domain."""
    return (settings.kubeconfig, settings.api_root, settings.namespace), (conn.namespace, domain_hash(domain), node)


def cache_source(settings: Any, conn: Any, domain: str, node: str) -> CacheSource:
    """``source(start)``: the process's informer for ``node``'s Leases of the domain over ``conn``
    (started when ``start`` and none runs), or None when the process has no watch cache. The
    informer watches only the node's own claims and blocks (:func:`node_selector`): a claim made
    on another node is never delivered here."""
    dhash = domain_hash(domain)
    path = LEASES_PATH.format(namespace=conn.namespace)
    connection_key, domain_key = cache_key(settings, conn, domain, node)

    def make(cache_settings: lease_cache.Settings) -> LeaseCache:
        return LeaseCache(ApiClientTransport(conn.api_client, conn.host, conn.renew), path, node_selector(dhash, node),
                          partial(parse_lease, dhash=dhash), owner=conn.api_client,
                          name=f"lease-cache {conn.namespace}/{dhash}/{label_value(node)}", settings=cache_settings)

    return lambda start: lease_cache.informer(connection_key, domain_key, conn.api_client, make, start,
                                              transport=lambda: ApiClientTransport(conn.api_client, conn.host, conn.renew))


class KubeStore(Store):
    """The Lease store of domain ``domain`` for the verbs of node ``node`` (see the module's
    docstring): allocation, release, lookups, GC and STATUS over the domain's Leases
    (``leases``) and this node's blocks (``blocks``)."""

    def __init__(self, transport: Transport, namespace: str, domain: str, *, node: str,
                 pod: PodInfo = PodInfo(), timeout: float = 20.0, request_timeout: float = 5.0,
                 gc_grace: float = 60.0, sleep: Callable[[float], None] = time.sleep,
                 cache: Optional[CacheSource] = None, whereabouts: Optional[str] = None,
                 whereabouts_namespace: Optional[str] = None, block_size: Optional[int] = None,
                 block_release: float = 300.0, gc_misses: int = 3) -> None:
        self.leases = DomainLeases(transport, namespace, domain, node=node, pod=pod, timeout=timeout,
                                   request_timeout=request_timeout, sleep=sleep, block_size=block_size,
                                   whereabouts=whereabouts, whereabouts_namespace=whereabouts_namespace)
        self.blocks = NodeBlocks(self.leases, node, block_size, block_release)
        self.namespace = namespace
        self.domain = domain
        self.dhash = self.leases.dhash
        self.node = node
        self.timeout = timeout
        self.gc_grace = gc_grace
        self.gc_misses = gc_misses  # checks (spaced by gc_grace / gc_misses, server time) before a gone pod's claim goes
        self._cache_source = cache

    @classmethod
    def for_invocation(cls, settings: Any, domain: str, inv: Any) -> "KubeStore":
        from ..kube_config import connect

        conn = connect(settings)
        # the claim's node label: which node's ADD made it (no cleaner judges liveness by it)
        node = node_identity.configured(inv.env).name or socket.gethostname()
        pod = PodInfo(inv.args.get("K8S_POD_NAMESPACE", ""), inv.args.get("K8S_POD_NAME", ""),
                      inv.args.get("K8S_POD_UID", ""))
        source = cache_source(settings, conn, domain, node) if lease_cache.enabled() else None
        nad = inv.config.get("ipam") if isinstance(inv.config.get("ipam"), dict) else {}
        wb_name = nad.get("network_name") if isinstance(nad.get("network_name"), str) else ""
        wb_namespace = nad.get("whereabouts_namespace") if isinstance(nad.get("whereabouts_namespace"), str) else None
        return cls(conn.transport(), conn.namespace, domain, node=node, pod=pod,
                   timeout=settings.timeout, request_timeout=settings.request_timeout, gc_grace=settings.gc_grace,
                   cache=source, whereabouts=wb_name if whereabouts_check(nad) else None,
                   whereabouts_namespace=wb_namespace, block_size=getattr(settings, "block_size", None),
                   block_release=getattr(settings, "block_release", 300.0))

    def place(self, assigned: frozenset[int], block_size: Optional[int]) -> None:
        """The range sets (by index) that are blocks another allocator assigned this node (nv-ipam's:
        :mod:`.assigned_blocks`), and the block size of lease-ipam's own blocks when the config
        sets none (a pool's hint). Called before the verb, by :mod:`rdmanet.ipam.pool_ranges`."""
        size = self.blocks.block_size if self.blocks.block_size is not None else block_size
        self.leases.block_size = size
        self.blocks = AssignedBlocks(self.leases, self.node, assigned, size, self.blocks.block_release)

    # -- allocate -------------------------------------------------------------------------------

    def allocate(self, attachment: Attachment, network: str, range_sets: Sequence[RangeSet],
                 requested: Mapping[int, IPAddress]) -> list[IPAddress]:
        deadline = self.leases.deadline()
        cache = self._synced_cache(deadline)
        if cache is not None:
            with self._holding(cache, attachment, deadline):
                return self._allocate_cached(cache, attachment, network, range_sets, requested, deadline)
        hint = self._hint_cache()
        if hint is not None:
            with self._holding(hint, attachment, deadline):
                mine = self.leases.attachment_claims(attachment, deadline)
                return self._allocate(attachment, network, range_sets, requested, deadline, mine, {4: [], 6: []},
                                      hint.blocks(), hint, hint.latest(), settle=False)
        # Without a watch cache: this node's own claims and blocks, never the domain's; the List
        # is paginated and folded page by page (used ints, the attachment's claims, the cursor).
        scan = DomainScan(attachment, set())
        for page in self.leases.pages(node_selector(self.dhash, self.node), deadline,
                                      f"list leases of domain {self.domain} on node {self.node}"):
            if page is None:
                scan = DomainScan(attachment, set())
                continue
            for item in page:
                got = parse_lease(item, self.dhash)
                if got is not None:
                    scan.add(got)
        return self._allocate(attachment, network, range_sets, requested, deadline, scan.mine, scan.sorted_used(),
                              scan.blocks, None, scan.latest)

    def _allocate_cached(self, cache: LeaseCache, attachment: Attachment, network: str,
                         range_sets: Sequence[RangeSet], requested: Mapping[int, IPAddress],
                         deadline: float) -> list[IPAddress]:
        """ADD from the watch cache of this node's claims and blocks: no List. What the cache
        shows is a hint, never the answer: a held claim is confirmed by a GET (a stale cache may
        show one another process freed); a free candidate is claimed by create (409: taken, try
        the next); and once the watch has delivered our own new claims, every earlier change is
        in the cache, so a claim of this attachment that another process made meanwhile shows
        up then (:meth:`_settle`)."""
        mine = []
        for c in cache.claims_of(attachment):
            fresh = self.leases.get(c.name, deadline, c.uid)
            if fresh is not None and fresh.attachment == attachment:
                mine.append(fresh)
        # ``used`` starts empty: the candidate search reads the cache's used addresses within the
        # blocks it searches (:func:`.candidates.next_candidate`), never a copy of every claim of the node.
        return self._allocate(attachment, network, range_sets, requested, deadline, mine, {4: [], 6: []},
                              cache.blocks(), cache, cache.latest())

    def _allocate(self, attachment: Attachment, network: str, range_sets: Sequence[RangeSet],
                  requested: Mapping[int, IPAddress], deadline: float, mine: list[Claim],
                  used: dict[int, list[int]], blocks: list[Block],
                  cache: Optional[LeaseCache], latest: Mapping[str, Claim], settle: bool = True) -> list[IPAddress]:
        """``used``: per family, the sorted used addresses from a List; with a ``cache``, only what
        this ADD learnt itself (the search reads the cache's own as it goes)."""
        mine = sorted(mine, key=lambda c: (c.ip.version, c.ip))
        placed, spare = place_held(mine, range_sets, lambda c: c.ip)  # spare: ours, in no range set now
        plan: dict[int, IPAddress] = {i: c.ip for i, c in placed.items()}
        blocks = list(blocks)

        created: list[Claim] = []
        try:
            for rs in range_sets:
                want = requested.get(rs.index)
                if rs.index in plan:
                    refuse_other_request(attachment, rs, plan[rs.index], want)
                    continue
                if want is not None:
                    claim, new = self._claim_requested(want, attachment, network, rs, {}, True, deadline)
                    if new:
                        created.append(claim)
                else:
                    claim = self._pick(rs, attachment, network, used[rs.family], deadline, round_robin_start(rs, latest),
                                       blocks, cache)
                    created.append(claim)
                plan[rs.index] = claim.ip
            if cache is not None and settle:
                self._settle(cache, attachment, range_sets, plan, created, deadline)
        except BaseException:
            self._rollback(attachment, created, deadline)
            raise
        self._sweep_uncertain(attachment, set(plan.values()), deadline)
        for c in spare:
            try:
                self.leases.delete(c, deadline)
            except CNIError as err:
                log.warning("could not free %s (outside the configured ranges) of %s: %s", c.ip, attachment, err.msg)
        return [plan[rs.index] for rs in range_sets]

    def _claim_requested(self, want: IPAddress, attachment: Attachment, network: str, rs: RangeSet,
                         by_ip: Mapping[IPAddress, Claim], cached: bool, deadline: float) -> tuple[Claim, bool]:
        """(claim, made by this call) for a requested address; 103 when another attachment holds it.
        The address of a free block record is held by nobody: the record is taken by an update.

        From a List (``by_ip``), a holder it shows is final. From the cache the create decides
        (the cache may be stale either way), and a holder that turns out to be this very
        attachment (a claim made by another process) is adopted."""
        claim = None
        holder = by_ip.get(want)
        wb = self.leases.whereabouts_holder(want, rs, deadline) if holder is None else None
        if wb is not None:
            raise CNIError(ADDRESS_UNAVAILABLE, f"requested address {want} is held by {wb}",
                           "request a free address, or DEL the pod that whereabouts gave it to")
        if holder is None:
            claim = self.leases.create(want, attachment, network, rs, deadline)
            if claim is not None:
                return claim, True
            holder = self.leases.get(lease_name(self.dhash, want), deadline)
            if cached and holder is not None and holder.attachment == attachment:
                return holder, False
        record = holder.as_block() if holder is not None and holder.free else None
        if record is not None:  # a free block record: nothing holds the address, taken by an update
            claim = self.leases.take_record(record, attachment, network, rs, deadline)
            if claim is not None:
                return claim, True
            holder = self.leases.get(lease_name(self.dhash, want), deadline)
        who = holder.attachment if holder is not None else None
        raise CNIError(ADDRESS_UNAVAILABLE, f"requested address {want} is already reserved by {who or 'another attachment'}",
                       "request a free address, or DEL the attachment that holds it")

    def _settle(self, cache: LeaseCache, attachment: Attachment, range_sets: Sequence[RangeSet],
                plan: dict[int, IPAddress], created: list[Claim], deadline: float) -> None:
        """Make a cache-served ADD as exact as a List-served one about the attachment's own claims.

        The cache may not have seen a claim of this attachment that another process made
        (the in-process fallback while the daemon restarted) when we chose to create. The watch
        delivers changes in order, so once it has delivered the claims we just made, the cache
        holds every claim made before them. A range set in which the attachment then turns out
        to hold another claim returns that one, and ours is deleted: a repeat ADD returns what
        the first one did. When the watch does not deliver within ``echo_budget``, a
        label-selected List of this one attachment answers instead (and the cache is not
        trusted for a while: see :meth:`LeaseCache.suspect`).
        """
        if not created:
            return
        budget = min(cache.settings.echo_budget, max(0.0, deadline - time.monotonic()))
        if cache.wait_confirmed([(c.name, c.uid, c.resource_version) for c in created], budget):
            held = cache.claims_of(attachment)
        else:
            log.info("the watch of %s did not deliver our claims within %.2f s: listing %s's claims",
                     self.domain, budget, attachment)
            cache.suspect()
            held = self.leases.attachment_claims(attachment, deadline)
        new = {c.name for c in created}
        for c in list(created):
            rs = next((rs for rs in range_sets if plan.get(rs.index) == c.ip), None)
            if rs is None:
                continue
            taken = set(plan.values())
            others = sorted((h for h in held if h.attachment == attachment and h.name not in new and h.ip not in taken
                             and rs.range_of(h.ip) is not None), key=lambda h: (h.ip.version, h.ip))
            keep = None
            for other in others:  # the cache's word is a hint: only a claim read back just now is returned
                fresh = self.leases.get(other.name, deadline, other.uid)
                if fresh is not None and fresh.attachment == attachment:
                    keep = fresh
                    break
            if keep is None:
                continue
            log.info("%s already holds %s in %s (claimed by another process): returning it, freeing %s",
                     attachment, keep.ip, rs.describe(), c.ip)
            self.leases.delete(c, deadline)
            created.remove(c)
            plan[rs.index] = keep.ip

    def _pick(self, rs: RangeSet, attachment: Attachment, network: str, used: list[int], deadline: float,
              cursor: Optional[IPAddress], blocks: list[Block], cache: Optional[LeaseCache]) -> Claim:
        """A new claim in ``rs``: a free address of one of this node's blocks (round-robin from
        the cursor); when they are full, the record of a block acquired now (the create of the
        block's first usable address, for this attachment: acquiring costs no request of its
        own); when no block is free, in another node's block (borrowing). Each candidate is
        claimed by create (409: taken, by another node's borrowed claim or a
        second owner of the block: marked used, next candidate); a candidate that is this
        node's free block record is claimed by updating it (resourceVersion precondition)."""
        while True:
            candidate, own = self._search(rs, used, cursor, blocks, cache)
            if candidate is None:
                with cache.acquire_lock if cache is not None else nullcontext():
                    if cache is not None:  # another ADD of this daemon may have acquired one meanwhile
                        known = {b.name for b in blocks}
                        fresh = [b for b in cache.blocks() if b.name not in known]
                        if fresh:
                            blocks.extend(fresh)
                            continue
                    claim = self.blocks.acquire(rs, blocks, deadline, cache, attachment, network)
                if claim is None:
                    return self.blocks.borrow(rs, attachment, network, blocks, deadline)
                block = claim.as_block()
                if block is not None:
                    blocks.append(block)
                insort(used, int(claim.ip))
                return claim
            ip = own.ranges[0].address(candidate)
            near = cache.blocks_at(ip.version, candidate) if cache is not None else blocks
            record = next((b for b in near if b.record_ip == ip and b.node == self.node), None)
            try:
                if record is not None:  # our block's record, free: take it back by an update
                    claim = self.leases.take_record(record, attachment, network, rs, deadline)
                else:
                    held_by = self.leases.whereabouts_holder(ip, rs, deadline)
                    claim = self.leases.create(ip, attachment, network, rs, deadline) if held_by is None else None
            finally:
                if self.leases.cache is not None:
                    self.leases.cache.done(rs.family, candidate)  # written through by now (created or taken)
            insort(used, candidate)
            if claim is not None:
                return claim
            cursor = ip  # taken: go on from there

    def _search(self, rs: RangeSet, used: list[int], cursor: Optional[IPAddress], blocks: list[Block],
                cache: Optional[LeaseCache]) -> tuple[Optional[int], Optional[RangeSet]]:
        """The next free address of this node's blocks in ``rs`` after the cursor (round-robin),
        and the node's blocks it was found in (None, None: they are full). With the cache: first
        in a window of the open blocks from the cursor on (:meth:`LeaseCache.open_window`, as many
        as the creates in flight plus a margin), then, only when the window cannot tell (no free
        address in it, or one at or before the cursor: the search wrapped, and the lowest free
        address may be in a block the window left out), in all of them: the same address either
        way."""
        if cache is None:
            own = self.blocks.own(rs, blocks)
            return (next_candidate(self.leases.cache, own, used, cursor, 0) if own is not None else None), own
        start = int(cursor) if cursor is not None and cursor.version == rs.family else None
        window, every = cache.open_window(rs.family, start, len(cache.pending(rs.family)) + SEARCH_WINDOW)
        for wide in (False, True):
            own = self.blocks.own(rs, self._searched_blocks(cache, cursor, None if wide else window))
            candidate = next_candidate(self.leases.cache, own, used, cursor, 0) if own is not None else None
            if wide or every or (candidate is not None and (start is None or candidate > start)):
                return candidate, own
            if candidate is not None:
                cache.done(rs.family, candidate)  # a wrap past open blocks the window left out: not the next
        return None, None

    def _searched_blocks(self, cache: LeaseCache, cursor: Optional[IPAddress],
                         window: Optional[list[Block]] = None) -> list[Block]:
        """The node's blocks a search for a free address looks at: the open ones (the cache's
        index: some address not held; ``window``: some of them) and those holding the cursor
        (where the round-robin resumes, full or not). Every other block is full in the cache's
        view, which the search reads anyway, so the candidate is the one a search of all the
        node's blocks would give, at O(open blocks) instead of O(the node's blocks and claims)
        per ADD."""
        found = cache.open_blocks() if window is None else list(window)
        if cursor is not None:
            found += [b for b in cache.blocks_at(cursor.version, int(cursor)) if b not in found]
        return found

    # -- what a failed or uncertain ADD leaves ----------------------------------------------------

    def _sweep_uncertain(self, attachment: Attachment, kept: set, deadline: float) -> None:
        """A successful ADD passed over candidates whose create had no clear answer (a timed-out
        attempt the server may have served after all): one that turns out to be this
        attachment's is deleted, so the attachment holds only what the ADD returns. (One the
        server serves later still is a claim of the attachment: its DEL, or GC, frees it.)"""
        uncertain, self.leases.uncertain = self.leases.uncertain, []
        for name in uncertain:
            if ip_of_name(name, self.dhash) in kept:
                continue
            try:
                c = self.leases.get(name, deadline)
                if c is not None and c.attachment == attachment:
                    log.info("a create of %s for %s that had no answer was served after all: freeing it", c.ip, attachment)
                    self.leases.delete(c, deadline)
            except CNIError as err:
                log.warning("could not check lease %s of %s (its DEL or GC frees it): %s", name, attachment, err.msg)

    def _rollback(self, attachment: Attachment, created: list[Claim], deadline: float) -> None:
        """Delete the claims a failed ADD made, and those of creates left without an answer,
        within what is left of the verb's budget and at most ``_ROLLBACK_GRACE`` past it (the
        ADD answers 11 within ``timeout_seconds`` + that grace). What it cannot delete stays
        a claim of the attachment: the runtime's DEL after the failed ADD, CNI GC and the
        reconciler free it."""
        uncertain, self.leases.uncertain = self.leases.uncertain, []
        if not created and not uncertain:
            return
        deadline = max(deadline, time.monotonic() + _ROLLBACK_GRACE)
        for c in created:
            try:
                self.leases.delete(c, deadline)
            except CNIError as err:
                log.warning("rollback of failed ADD could not delete lease %s (GC frees it later): %s", c.name, err.msg)
        for name in uncertain:
            try:
                c = self.leases.get(name, deadline)
                if c is not None and c.attachment == attachment:
                    self.leases.delete(c, deadline)
            except CNIError as err:
                log.warning("rollback of failed ADD could not check lease %s (GC frees it later): %s", name, err.msg)

    # -- release / find / list ------------------------------------------------------------------

    def release(self, attachment: Attachment) -> list[IPAddress]:
        deadline = self.leases.deadline()
        cache = self._synced_cache(deadline)
        if cache is None:
            hint = self._hint_cache()
            if hint is None:
                return self._release_listed(attachment, deadline)
            with self._holding(hint, attachment, deadline):
                return self._release_listed(attachment, deadline)
        with self._holding(cache, attachment, deadline):
            freed = self._release_cached(cache, attachment, deadline)
        self.blocks.release_idle(cache, deadline)
        return freed

    def _release_listed(self, attachment: Attachment, deadline: float) -> list[IPAddress]:
        """DEL from a label-selected List of the attachment's claims (no cache, or it shows none)."""
        return [c.ip for c in self.leases.attachment_claims(attachment, deadline) if self.leases.delete(c, deadline)]

    def _release_cached(self, cache: LeaseCache, attachment: Attachment, deadline: float) -> list[IPAddress]:
        """DEL from the watch cache: the claims it shows are deleted with their uid and
        resourceVersion as preconditions (a stale resourceVersion meets 409, is re-read and
        deleted only while the Lease still names this attachment). When it shows none, or none
        of those it shows was still there to delete (it lags), the label-selected List of the
        attachment decides, as without a cache. When we deleted some, the watch delivering our
        deletes means every earlier claim is in the cache: one this attachment holds that the
        cache had not seen (made by another process) is freed too."""
        claims = sorted(cache.claims_of(attachment), key=lambda c: (c.ip.version, c.ip))
        if not claims:
            return self._release_listed(attachment, deadline)
        gone = [g for g in (self.leases.remove(c, deadline) for c in claims) if g is not None]
        if not gone:  # no delete of ours whose echo would prove the cache caught up
            return self._release_listed(attachment, deadline)
        freed = [g.ip for g in gone]
        budget = min(cache.settings.echo_budget, max(0.0, deadline - time.monotonic()))
        end = time.monotonic() + budget
        # deleted claims, and block records updated to free (same uid, a new resourceVersion)
        if cache.wait_deleted([g.uid for g in gone if not g.block], budget) and \
                cache.wait_confirmed([(g.name, g.uid, g.resource_version) for g in gone if g.block],
                                     max(0.0, end - time.monotonic())):
            rest = sorted(cache.claims_of(attachment), key=lambda c: (c.ip.version, c.ip))
        else:
            log.info("the watch of %s did not deliver our deletes within %.2f s: listing %s's claims",
                     self.domain, budget, attachment)
            cache.suspect()
            rest = self.leases.attachment_claims(attachment, deadline)
        freed += [c.ip for c in rest if self.leases.delete(c, deadline)]
        return freed

    # -- the watch cache ------------------------------------------------------------------------

    def _synced_cache(self, deadline: float) -> Optional[LeaseCache]:
        """The domain's informer when this process keeps one and it is (or within the sync
        budget gets) in sync; else None (see :meth:`_hint_cache`)."""
        if self._cache_source is None:
            return None
        cache = self._cache_source(True)
        self.leases.cache = cache
        if cache is None:
            return None
        budget = min(cache.settings.sync_budget, max(0.0, deadline - time.monotonic()))
        return cache if cache.wait_synced(budget) else None

    def _hint_cache(self) -> Optional[LeaseCache]:
        """The informer when it is not to be trusted now (its watch lags: an echo was missed;
        its stream broke or met 410 and it is re-watching or re-Listing) but holds a List's
        state: a hint for candidates, never an answer (the create decides; the attachment's
        own claims come from a List of that one attachment). So a slow API server does not get
        a List of the whole domain per ADD, exactly when it is slow."""
        cache = self.leases.cache
        return cache if cache is not None and cache.has_state() else None

    @contextmanager
    def _holding(self, cache: LeaseCache, attachment: Attachment, deadline: float) -> Iterator[None]:
        """Hold the daemon's lock for this attachment (ADD/DEL of one attachment never overlap here)."""
        lock = cache.attachment_lock(attachment)
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise CNIError(TRY_AGAIN_LATER, f"another ADD or DEL of {attachment} did not finish within {self.timeout:g} s",
                           "retry the call")
        try:
            yield
        finally:
            lock.release()

    def find(self, attachment: Attachment) -> Optional[Reservation]:
        claims = self.leases.attachment_claims(attachment, self.leases.deadline())
        if not claims:
            return None
        when = min((c.time for c in claims if c.time), default=None)
        return Reservation(attachment, claims[0].network, tuple(c.ip for c in claims),
                           when.isoformat(timespec="seconds") if when else "")

    def list(self) -> list[Reservation]:
        claims = self.leases.list_claims(self.leases.claims_selector(), self.leases.deadline(),
                                         f"list leases of domain {self.domain}")
        return _group(claims)

    # -- gc / status ----------------------------------------------------------------------------

    def gc(self, network: str, valid: set[Attachment]) -> list[Reservation]:
        """Judge this node's claims of ``network`` whose attachment is not in ``valid`` by the
        liveness rule every cleaner shares (:func:`rdmanet.ipam.reconcile.reconcile_target`: a
        claim of a pod is freed only after the API said its pod is gone on several checks spaced
        in server time; the runtime's list only picks which claims are judged). A claim with no
        pod (podman, cnitool) has only the runtime to speak for it: freed once older than the
        grace by the API server's clock. Then this node's blocks that hold none of its claims
        and are older than ``block_release`` are released."""
        from ..reconcile import FREED, KubeAPI, KubeTarget, reconcile_target

        deadline = self.leases.deadline()
        target = KubeTarget(KubeAPI(self.leases.transport, self.leases.request_timeout), self.namespace, self.domain,
                            node_selector(self.dhash, self.node), self.node)

        def judged(c) -> bool:
            return c.network == network and bool(c.container_id) and Attachment(c.container_id, c.ifname) not in valid

        outcome = reconcile_target(target, grace_seconds=self.gc_grace, misses=self.gc_misses, only=judged,
                                   freed_by=telemetry.CNI_GC)
        freed = [a.claim for a in outcome.actions if a.action == FREED] + self._free_podless(target, outcome, network)
        gone = {c.name for c in freed}
        claims, blocks = self.leases.list_all(node_selector(self.dhash, self.node), deadline,
                                              f"list leases of {network} on node {self.node}")
        self.blocks.release_empty(blocks, sorted(int(c.ip) for c in claims if not c.free and c.name not in gone),
                                  deadline)
        return _group_freed(freed)

    def _free_podless(self, target: Any, outcome: Any, network: str) -> list[Any]:
        """The claims of the GC's ``outcome`` that have no pod (podman, cnitool) and are older than
        the grace by the API server's clock, freed: the runtime's word is all there is."""
        from ..reconcile import NO_POD, ApiError

        now = target.api.server_time
        freed = []
        for a in outcome.actions:
            c = a.claim
            if a.action != NO_POD or now is None or c.created is None:
                continue
            if (now - c.created).total_seconds() < self.gc_grace:
                log.info("GC spares %s of %s/%s: younger than %g s", c.address, c.container_id, c.ifname, self.gc_grace)
                continue
            try:
                target.delete(c)
            except ApiError as err:
                if err.status not in (404, 409):
                    raise CNIError(IO_FAILURE, f"could not free lease {c.name}: {err}", "the next GC retries") from None
                continue
            freed.append(c)
            telemetry.freed(telemetry.Freed(telemetry.CNI_GC, c.address or c.name, c.network, c.container_id, c.ifname,
                                            c.pod_namespace, c.pod_name, c.pod_uid, self.node,
                                            f"not in {network}'s cni.dev/valid-attachments, no pod to ask about"))
        return freed

    def status(self, range_sets: Sequence[RangeSet]) -> list[int]:
        """Free addresses per range set as this node sees them, never from a List of the domain
        (runtimes ask every few seconds, on every node). A running informer answers with no
        request: the free addresses of this node's blocks, else (the node can still acquire a
        block or borrow) those its view of the range shows; 0 when an ADD here found the range
        exhausted within ``EXHAUSTED_SECONDS`` (that ADD read the domain). Without an informer,
        or when its view shows none free otherwise (it may lag): one paginated List of this
        node's own objects, which also tells that the API answers."""
        cache = self._cache_source(False) if self._cache_source is not None else None
        if cache is not None and cache.has_state():  # a running informer answers; STATUS never starts one
            blocks = cache.open_blocks()  # a full block adds nothing to a count of free addresses
            now = time.monotonic()
            free = []
            for rs in range_sets:
                own = self.blocks.own(rs, blocks)
                count = own.count_free(cache.used_within(rs.family, [(r.start, r.end) for r in own.ranges],
                                                         pending=False)) if own is not None else 0
                exhausted = cache.notes.get(("exhausted", rs.index), -1e9) + EXHAUSTED_SECONDS >= now
                if not count and not exhausted:
                    count = rs.count_free(cache.used(rs.family))
                free.append(count if count or exhausted else None)
            if None not in free:
                return free
        try:
            claims, _ = self.leases.list_all(node_selector(self.dhash, self.node), self.leases.deadline(),
                                             f"list leases of domain {self.domain} on node {self.node}")
        except CNIError as err:
            raise CNIError(NOT_AVAILABLE, f"lease-ipam cannot reach its Lease store: {err.msg}", err.details) from None
        used: dict[int, list[int]] = {4: [], 6: []}
        for c in claims:
            if not c.free:
                used[c.ip.version].append(int(c.ip))
        for values in used.values():
            values.sort()
        return [rs.count_free(used[rs.family]) for rs in range_sets]


    def usage(self, range_sets: Sequence[RangeSet]) -> Optional[Usage]:
        """From the daemon's watch cache of this node's Leases (None without a running one): per
        range set this node's claims and the free addresses of the blocks it holds, and how many
        blocks it holds. Other nodes' claims are theirs to count (``rdmanet ipam ls`` reads them all)."""
        cache = self._cache_source(False) if self._cache_source is not None else None
        if cache is None or not cache.has_state():
            return None
        blocks = [b for b in cache.blocks() if not b.node or b.node == self.node]
        claimed = sorted((c.ip.version, int(c.ip)) for c in cache.claims() if isinstance(c, Claim) and not c.free)
        used, free = [], []
        for rs in range_sets:
            used.append(sum(bisect_right(claimed, (rs.family, r.end)) - bisect_left(claimed, (rs.family, r.start))
                            for r in rs.ranges))
            own = self.blocks.own(rs, blocks)
            free.append(own.count_free(cache.used_within(rs.family, [(r.start, r.end) for r in own.ranges], pending=False))
                        if own is not None else 0)
        return Usage(tuple(used), tuple(free), len({b.id for b in blocks}))


def _group_freed(claims: Sequence[Any]) -> list[Reservation]:
    """The reservations a GC freed (the reconciler's view of each claim)."""
    groups: dict[Attachment, list[Any]] = {}
    for c in claims:
        groups.setdefault(Attachment(c.container_id, c.ifname), []).append(c)
    out = []
    for who, cs in sorted(groups.items()):
        ips = sorted((ipaddress.ip_address(c.address) for c in cs if c.address), key=lambda ip: (ip.version, ip))
        when = min((c.created for c in cs if c.created), default=None)
        out.append(Reservation(who, cs[0].network, tuple(ips), when.isoformat(timespec="seconds") if when else ""))
    return out


def _group(claims: Sequence[Claim]) -> list[Reservation]:
    groups: dict[Attachment, list[Claim]] = {}
    for c in claims:
        if c.attachment is not None:
            groups.setdefault(c.attachment, []).append(c)
    out = []
    for who, cs in sorted(groups.items()):
        cs.sort(key=lambda c: (c.ip.version, c.ip))
        when = min((c.time for c in cs if c.time), default=None)
        out.append(Reservation(who, cs[0].network, tuple(c.ip for c in cs), when.isoformat(timespec="seconds") if when else ""))
    return out


