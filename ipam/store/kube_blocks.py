"""Node blocks of lease-ipam's Kubernetes store (issue 17; docs/lease-ipam.md "Node blocks").

A block is an aligned run of ``block_size`` addresses of a range that one node has affinity to,
recorded as a Lease (``lipb-<domain hash>-<first address>-<size>``, holder = the node) made by an
atomic create. It is never a claim: every address is still claimed by its own Lease, whose create
is the only arbiter, so two nodes that both believe they hold a block never share an address.

:class:`NodeBlocks` is the part of :class:`ipam.store.kube.KubeStore` that finds a node's blocks
in a range set, acquires one at the node's hashed positions (a List of the domain's blocks only
after ``PROBE_MISSES`` 409s), borrows in other nodes' blocks when every block is held, and
releases a node's empty blocks after ``block_release_seconds``. It relies on the store's
requests (``_call``, ``_list_all``, ``_fold``), claim creation (``_create``) and candidate walk
(``_start``, ``_skip``, ``_next``).
"""

from __future__ import annotations

import hashlib
import logging
import time
from bisect import bisect_left, insort
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from cni.core.errors import IO_FAILURE, POOL_EXHAUSTED, CNIError

from .. import intervals
from ..ranges import IPAddress, Range, RangeSet
from .base import Attachment
from .lease_names import (GROUP, KIND_BLOCK, L_BLOCK, L_DOMAIN, L_KIND, L_NODE, _now_micro, _parse_time, block_id,
                          block_name, block_of_name, label_value)

if TYPE_CHECKING:
    from .kube import Claim
    from .lease_cache import LeaseCache

log = logging.getLogger("rdmanet.ipam")

DEFAULT_BLOCK_SIZE = {4: 16, 6: 64}  # addresses per block (docs/lease-ipam.md: how to size blocks)
BLOCK_PROBES = 8  # hashed block positions tried before the domain's blocks are listed
PROBE_MISSES = 8  # 409s before the domain's blocks are listed (a List of 6,250 blocks is 13 pages, ~300 kB; a 409 is ~200 B)
SMALL_BLOCK_COUNT = 64  # a range set with at most this many blocks lists them at once instead of probing
BORROW_SCAN = 4096  # blocks looked at beyond the listed ones when searching a free one
BORROW_BLOCKS = 8  # held blocks read one by one before the domain's claims are read
NO_FREE_BLOCK_SECONDS = 5.0  # a daemon that found every block held borrows without re-listing for this long


@dataclass(frozen=True)
class Block:
    """A node's affinity to ``size`` aligned addresses: where it looks for candidates first.
    Never a claim: the per-address Lease stays the only proof that an address is taken."""

    name: str
    ip: IPAddress  # the block's first address (aligned; it may lie outside the usable range)
    size: int
    node: str  # holderIdentity: the node that created it
    uid: str
    resource_version: str
    time: Optional[datetime]
    is_block = True

    @property
    def id(self) -> str:
        return block_id(self.ip, self.size)

    @property
    def last(self) -> int:
        return int(self.ip) + self.size - 1


def parse_block(item: Any, dhash: str) -> Optional[Block]:
    """The block a Lease of domain ``dhash`` records; None for anything else."""
    if not isinstance(item, dict):
        return None
    md = item.get("metadata") or {}
    found = block_of_name(str(md.get("name") or ""), dhash)
    if found is None:
        return None
    spec = item.get("spec") or {}
    holder = spec.get("holderIdentity")
    when = _parse_time(spec.get("acquireTime")) or _parse_time(md.get("creationTimestamp"))
    return Block(md["name"], found[0], found[1], holder if isinstance(holder, str) else "", str(md.get("uid") or ""),
                 str(md.get("resourceVersion") or ""), when)


def _any_within(values: Sequence[int], lo: int, hi: int) -> bool:
    """Whether the sorted ``values`` hold one in ``[lo, hi]``."""
    i = bisect_left(values, lo)
    return i < len(values) and values[i] <= hi


class NodeBlocks:
    """The block part of KubeStore (a mixin: see the module's docstring)."""

    def _size(self, r: Range) -> int:
        """Addresses per block in range ``r`` (never more than its subnet holds)."""
        size = self.block_size or DEFAULT_BLOCK_SIZE[r.family]
        return max(1, min(size, r.subnet.num_addresses))

    def _span(self, r: Range, first: int) -> Optional[Range]:
        """The addresses of the block at ``first`` that ``r`` may hand out (None: none)."""
        lo, hi = max(first, r.start), min(first + self._size(r) - 1, r.end)
        if lo > hi:
            return None
        span = Range(r.subnet, lo, hi, r.gateway, r.excludes)
        return span if span.count_free(()) > 0 else None

    def _block_range(self, rs: RangeSet, block: Block) -> Optional[Range]:
        """The range of ``rs`` a block belongs to (same subnet, same size, overlapping it)."""
        for r in rs.ranges:
            if block.ip.version == r.family and block.ip in r.subnet and block.size == self._size(r) \
                    and int(block.ip) <= r.end and block.last >= r.start:
                return r
        return None

    def _own(self, rs: RangeSet, blocks: Sequence[Block]) -> Optional[RangeSet]:
        """This node's blocks in ``rs`` as a range set of their own (candidates come from it)."""
        spans = []
        for b in blocks:
            if b.node and b.node != self.node:
                continue
            r = self._block_range(rs, b)
            span = self._span(r, int(b.ip)) if r is not None else None
            if span is not None:
                spans.append(span)
        if not spans:
            return None
        spans.sort(key=lambda x: x.start)
        return RangeSet(rs.index, tuple(spans), rs.origin)

    def _block_count(self, rs: RangeSet) -> int:
        total = 0
        for r in rs.ranges:
            size, net = self._size(r), int(r.subnet.network_address)
            total += (r.end - net) // size - (r.start - net) // size + 1
        return total

    def _position(self, rs: RangeSet, j: int) -> tuple[Range, int]:
        """The ``j``-th block of ``rs`` (its range and first address), counting range by range."""
        for r in rs.ranges:
            size, net = self._size(r), int(r.subnet.network_address)
            lo, hi = (r.start - net) // size, (r.end - net) // size
            if j <= hi - lo:
                return r, net + (lo + j) * size
            j -= hi - lo + 1
        raise IndexError(j)

    def _probe(self, rs: RangeSet, i: int) -> int:
        """The ``i``-th entry of this node's hashed probe sequence over block numbers."""
        digest = hashlib.sha256(f"{self.node}\0{rs.index}\0{i}".encode()).digest()
        return int.from_bytes(digest[:16], "big")

    def _blocks_selector(self) -> str:
        return f"{L_DOMAIN}={self.dhash},{L_KIND}={KIND_BLOCK}"

    def _acquire_block(self, rs: RangeSet, blocks: list[Block], deadline: float,
                       cache: Optional[LeaseCache]) -> Optional[Block]:
        """A block of ``rs`` that no node holds, made ours by creating its Lease (409: another
        node's; next). Creates at this node's hashed positions (a range of more than
        ``SMALL_BLOCK_COUNT`` blocks; on a roomy range the first one succeeds), skipping the
        blocks known held, until ``PROBE_MISSES`` 409s; then one List of the domain's blocks and
        the first unheld one after this node's position. None: every block is held (borrow)."""
        notes = cache.notes if cache is not None else {}
        until, listed = notes.get(("no-free-block", rs.index), (0.0, []))
        if until > time.monotonic():
            self._listed_blocks = listed  # the blocks seen held a moment ago: borrow among them
            return None
        total = self._block_count(rs)
        if total <= 0:
            return None
        mine = {b.name for b in blocks}
        # What this daemon learnt on earlier acquisitions: the blocks other nodes hold (409s, the
        # last List of blocks) and how far along its probe sequence it is, so that a block found
        # held costs one 409 once, not one per acquisition.
        held: set = notes.setdefault(("held", rs.index), set())
        i = notes.get(("probe", rs.index), 0)
        probes, misses, looked = (BLOCK_PROBES if total > SMALL_BLOCK_COUNT else 1), 0, 0
        while misses < min(probes, PROBE_MISSES) and looked < probes * 16:
            looked += 1
            r, first = self._position(rs, self._probe(rs, i) % total)
            i += 1
            name = block_name(self.dhash, r.address(first), self._size(r))
            if name in mine or name in held or self._span(r, first) is None:
                continue
            block = self._create_block(r, first, deadline)
            if block is not None:
                notes[("probe", rs.index)] = i
                return block
            held.add(name)
            misses += 1
        notes[("probe", rs.index)] = i
        _, listed = self._list_all(self._blocks_selector(), deadline, f"list blocks of domain {self.domain}")
        self._listed_blocks = listed
        held.clear()
        held.update(b.name for b in listed if b.name not in mine)
        start = self._probe(rs, i) % total
        taken = held | mine
        for step in range(min(total, len(taken) + BORROW_SCAN)):
            r, first = self._position(rs, (start + step) % total)
            name = block_name(self.dhash, r.address(first), self._size(r))
            if name in taken or self._span(r, first) is None:
                continue
            block = self._create_block(r, first, deadline)
            if block is not None:
                return block
            held.add(name)
            taken.add(name)
        if cache is not None:
            notes[("no-free-block", rs.index)] = (time.monotonic() + NO_FREE_BLOCK_SECONDS, listed)
        return None

    def _create_block(self, r: Range, first: int, deadline: float) -> Optional[Block]:
        size = self._size(r)
        ip = r.address(first)
        name = block_name(self.dhash, ip, size)
        notes = {"ipam-domain": self.domain, "range": str(r.subnet), "first": str(ip),
                 "last": str(r.address(first + size - 1)), "size": str(size), "node": self.node,
                 "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": {L_DOMAIN: self.dhash, L_KIND: KIND_BLOCK, L_NODE: label_value(self.node),
                                        L_BLOCK: block_id(ip, size)},
                             "annotations": {f"{GROUP}/{k}": v for k, v in notes.items()}},
                "spec": {"holderIdentity": self.node, "acquireTime": _now_micro()}}
        for _ in range(3):
            resp, retried = self._call("POST", self.path, f"create lease {name}", deadline, body=body)
            if resp.status in (200, 201):
                block = parse_block(resp.doc, self.dhash)
                if block is None:
                    raise CNIError(IO_FAILURE, f"Kubernetes API answered the create of lease {name} with an unreadable object",
                                   "check that the API server (or a proxy) returns the created object")
                if self.cache is not None:
                    self.cache.created(block)
                log.info("node %s acquired block %s of %s", self.node, block.id, self.domain)
                return block
            if resp.status != 409:
                raise self._refused(resp, f"create lease {name}")
            if not retried:
                return None
            # An earlier attempt may have created it before its answer was lost: read it back.
            current = self._get_block(name, deadline)
            if current is None:
                continue
            return current if current.node == self.node else None
        return None

    def _get_block(self, name: str, deadline: float) -> Optional[Block]:
        resp, _ = self._call("GET", f"{self.path}/{name}", f"get lease {name}", deadline)
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise self._refused(resp, f"get lease {name}")
        block = parse_block(resp.doc, self.dhash)
        if block is not None and self.cache is not None:
            self.cache.observed(block)
        return block

    def _borrow(self, rs: RangeSet, attachment: Attachment, network: str, used: list[int],
                blocks: list[Block], deadline: float) -> Claim:
        """No block of ``rs`` is free: a claim in a held block (another node's, or ours with
        addresses our view thought taken). Up to ``BORROW_BLOCKS`` blocks, in this node's hashed
        order, are read by one List of their label each (at most a block's worth of Leases);
        when two in a row have no free address (or the range set has few blocks), the domain's
        claims are read once, page by page, keeping only their addresses (a daemon then borrows
        from that view for ``NO_FREE_BLOCK_SECONDS``, a 409 correcting it). The pool is usable to
        its last address; "exhausted" (102) is said only after that whole read."""
        cache, memo_key = self.cache, ("borrow", rs.index)
        if cache is not None:  # a daemon that read the domain a moment ago borrows from that view
            with cache.acquire_lock:
                until, seen, latest = cache.notes.get(memo_key, (0.0, None, {}))
                seen = list(seen) if seen is not None and until > time.monotonic() else None
            if seen is not None:
                claim, _ = self._borrow_round_robin(rs, seen, latest, attachment, network, deadline)
                if claim is not None:
                    return claim
        listed = getattr(self, "_listed_blocks", None)
        if listed is None:
            _, listed = self._list_all(self._blocks_selector(), deadline, f"list blocks of domain {self.domain}")
        self._listed_blocks = None
        spans: dict[str, tuple[Block, Range]] = {}
        for b in list(listed) + list(blocks):
            r = self._block_range(rs, b)
            span = self._span(r, int(b.ip)) if r is not None else None
            if span is not None:
                spans.setdefault(b.id, (b, span))
        origin = self._probe(rs, 0)
        order = sorted(spans.values(), key=lambda bs: ((int(bs[0].ip) // bs[0].size - origin) % (1 << 128)))
        taken = 0
        if self._block_count(rs) > SMALL_BLOCK_COUNT:
            full = 0
            for block, span in order[:BORROW_BLOCKS]:
                if full >= 2:
                    break  # two full blocks in a row: the blocks are crowded, read the domain once
                claims = self._list(f"{L_DOMAIN}={self.dhash},{L_BLOCK}={block.id}", deadline,
                                    f"list claims of block {block.id} of domain {self.domain}")
                here = sorted({int(c.ip) for c in claims if c.ip.version == rs.family})
                claim, missed = self._claim_in(rs, [span], here, attachment, network, deadline)
                taken += missed
                full = full + 1 if claim is None else 0
                if claim is not None:
                    if block.node != self.node:
                        log.info("node %s borrowed %s from block %s of node %s", self.node, claim.ip, block.id, block.node)
                    return claim
        # Every address of the range set, whatever block holds it (or none: a block being released),
        # round-robin after the domain's most recently made claim, as before blocks existed.
        everything, latest = self._domain_addresses(rs.family, deadline)
        if cache is not None:
            with cache.acquire_lock:
                cache.notes[memo_key] = (time.monotonic() + NO_FREE_BLOCK_SECONDS, list(everything), latest)
        claim, missed = self._borrow_round_robin(rs, everything, latest, attachment, network, deadline)
        taken += missed
        if claim is not None:
            return claim
        if self.cache is not None:
            self.cache.notes[("exhausted", rs.index)] = time.monotonic()
        raced = f" ({taken} candidates were claimed concurrently or held by whereabouts)" if taken else ""
        raise CNIError(POOL_EXHAUSTED, f"no free address in range {rs.describe()}{raced}",
                       "free addresses (DEL or GC attachments that are gone) or widen the range "
                       "(range_start/range_end, or another ipRanges entry)")

    def _borrow_round_robin(self, rs: RangeSet, used: list[int], latest: Mapping[str, Claim], attachment: Attachment,
                            network: str, deadline: float) -> tuple[Optional[Claim], int]:
        """A claim on the next free address by ``used`` (the domain's claims as read, or as a
        daemon read them a moment ago) after the domain's latest claim; each address met taken
        (409) or claimed is added to the daemon's remembered view. (claim or None, 409s met)."""
        cursor, skip, missed = self._start(rs, latest), self._skip(rs), 0
        while True:
            candidate = self._next(rs, used, cursor, skip, listed=True)
            if candidate is None:
                return None, missed
            ip = rs.ranges[0].address(candidate)
            try:
                held_by = self._whereabouts_holder(ip, rs, deadline)
                claim = self._create(ip, attachment, network, rs, deadline) if held_by is None else None
            finally:
                if self.cache is not None:
                    self.cache.done(rs.family, candidate)
                    with self.cache.acquire_lock:
                        memo = self.cache.notes.get(("borrow", rs.index))
                        if memo is not None and memo[1] is not None:
                            i = bisect_left(memo[1], candidate)
                            if i == len(memo[1]) or memo[1][i] != candidate:
                                memo[1].insert(i, candidate)
            insort(used, candidate)
            if claim is not None:
                log.info("node %s borrowed %s (no block of %s was free)", self.node, ip, self.domain)
                return claim, missed
            missed += 1
            cursor, skip = ip, 0

    def _claim_in(self, rs: RangeSet, spans: Sequence[Range], here: list[int], attachment: Attachment, network: str,
                  deadline: float) -> tuple[Optional[Claim], int]:
        """(a new claim on the lowest free address of ``spans`` by ``here``, candidates met taken)."""
        missed = 0
        for span in spans:
            while True:
                value = intervals.lowest_free(span.start, span.end, span.blocked, here)
                if value is None:
                    break
                ip = span.address(value)
                held_by = self._whereabouts_holder(ip, rs, deadline)
                claim = self._create(ip, attachment, network, rs, deadline) if held_by is None else None
                insort(here, value)
                if claim is not None:
                    return claim, missed
                missed += 1
        return None, missed

    def _release_idle_blocks(self, cache: LeaseCache, deadline: float) -> None:
        """In the daemon, after a DEL: a block of this node that holds none of its claims (nor a
        create in flight) is noted empty; one noted empty ``block_release`` seconds ago and
        still empty is released (its Lease deleted with uid/resourceVersion preconditions).
        Another node's claim in it (borrowed, or an old-version node's) is invisible here and
        does not need to be seen: claims, not blocks, are what keep an address."""
        now = time.monotonic()
        with cache.acquire_lock:
            empty = [b for b in cache.empty_blocks() if b.node == self.node]  # the cache's index: O(empty blocks)
            names = {b.name for b in empty}
            for key in [k for k in list(cache.notes) if isinstance(k, tuple) and k[0] == "empty-since" and k[1] not in names]:
                del cache.notes[key]  # in use again (or gone)
            for b in empty:
                key = ("empty-since", b.name)
                if _any_within(cache.pending(b.ip.version), int(b.ip), b.last):
                    cache.notes.pop(key, None)
                    continue
                since = cache.notes.setdefault(key, now)
                if now - since < self.block_release:
                    continue
                try:
                    self._drop_block(b, deadline)
                except CNIError as err:
                    log.info("could not release block %s (retried after the next DEL): %s", b.id, err.msg)
                    continue
                cache.notes.pop(key, None)

    def _drop_block(self, block: Block, deadline: float) -> bool:
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                "preconditions": {"uid": block.uid, "resourceVersion": block.resource_version}}
        resp, retried = self._call("DELETE", f"{self.path}/{block.name}", f"delete lease {block.name}", deadline, body=body)
        if resp.status in (200, 202) or (resp.status == 404 and retried):
            if self.cache is not None:
                self.cache.deleted(block)
            log.info("node %s released empty block %s of %s", self.node, block.id, self.domain)
            return True
        if resp.status in (404, 409):
            if self.cache is not None and resp.status == 404:
                self.cache.absent(block.name, block.uid)
            return False  # gone already, or changed (re-acquired): left alone
        raise self._refused(resp, f"delete lease {block.name}")
