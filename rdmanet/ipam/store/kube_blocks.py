"""How a node acquires, borrows from and releases its blocks of lease-ipam's Kubernetes store
(docs/lease-ipam-design.md "Node blocks"); the records and their arithmetic are :mod:`.block_records`.

The ADD that needs a block creates the block's record as its own claim, so acquiring a block
costs no request beyond that claim, and a 409 on it means "taken" (a record, or a borrower's
claim of that address). A DEL of that address updates the record to name no attachment ("free,
block held"); an ADD takes it back by an update; both carry the resourceVersion as precondition.
Only an empty block's release deletes it. Every other address is claimed by its own Lease, whose
create is the only arbiter, so two nodes that both believe they hold a block never share an
address.

:class:`NodeBlocks` is the store's collaborator for one node's blocks of one domain: it tells the
node's blocks in a range set apart (:meth:`NodeBlocks.own`), acquires one (the block after its
newest, the free blocks a List showed, its hashed positions, then Lists of one group's records,
at most ``BLOCK_GROUP`` Leases (eight groups in a crowded pool), and when those show none free
one paginated List of every record of the domain), borrows in other nodes' blocks when every
block is held (one block's claims per List), and releases a node's empty blocks after
``block_release_seconds``. Its requests and writes are the domain's :class:`.domain_leases.DomainLeases`.
"""

from __future__ import annotations

import hashlib
import logging
import time
from bisect import bisect_left, insort
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from rdmanet.cni.core.errors import POOL_EXHAUSTED, CNIError

from .. import intervals
from ..ranges import IPAddress, Range, RangeSet
from .base import Attachment
from .block_records import Block, any_within, block_count, block_position, block_size_in, record_address
from .candidates import next_candidate, node_skip, round_robin_start
from .lease_names import BLOCK_GROUP, L_BLOCK, L_BLOCK_GROUP, L_BLOCK_OWNER, L_DOMAIN, block_group_id, block_id, lease_name

if TYPE_CHECKING:
    from .claims import Claim
    from .domain_leases import DomainLeases
    from .lease_cache import LeaseCache

log = logging.getLogger("rdmanet.ipam")
_EPOCH = datetime.fromtimestamp(0, timezone.utc)

BLOCK_PROBES = 8  # hashed block positions tried before a group of records is listed
PROBE_MISSES = 2  # 409s on records before one group's records are listed (a 409 is ~200 B; a group List, <= 64 Leases, tells which are free)
GROUP_LISTS = 6  # groups of records one acquisition lists before it borrows (a group found full is not listed again for FULL_BLOCK_SECONDS)
GROUP_MISSES = 4  # 409s within a listed group (claims of first addresses that are not records) before the next group
SMALL_BLOCK_COUNT = 64  # a range set with at most this many blocks lists its group at once instead of probing
BORROW_BLOCKS = 32  # blocks whose claims one borrowing ADD reads before the domain's
BORROW_BATCH = 8  # blocks one borrowing List reads (`rdmanet.io/block in (...)`), up to BORROW_LEASES addresses
BORROW_LEASES = 128  # addresses of the blocks one borrowing List may read (at most this many Leases, ~120 kB)
NO_FREE_BLOCK_SECONDS = 5.0  # a daemon borrows from the free addresses it read for this long without re-reading
ACQUIRE_PAUSE_SECONDS = 5.0  # after an acquisition found no free block: no new attempt for this long (a doubling pause kept nodes borrowing, and reading, with a fifth of the blocks free)
FULL_BLOCK_SECONDS = 30.0  # a daemon does not read again for this long a block it found full when borrowing
FREE_SEEN_SECONDS = 30.0  # the blocks a List showed free are tried first (before probes or another List) for this long
RECORD_PAGE = 2000  # records per page of that read (only their names are kept: 2,000 Leases, ~2 MB of JSON, one page at a time)
RECORD_SCAN_BLOCKS = 1 << 16  # a range set of at most this many blocks may have its records read whole (<= 33 pages) when groups show none free
NO_BLOCK_AT_ALL_SECONDS = 30.0  # after a read of every record showed no block free: no acquisition attempt for this long
CROWDED_SHARE = 0.5  # the share of blocks held seen lately is at least this: no hashed probes, the next List at once
PROBE_WEIGHT = 0.5  # how much one hashed probe's outcome (409 or not) moves that share (a List sets it)
WIDE_GROUPS = 8  # groups one List reads from CROWDED_SHARE on (a group of a crowded pool often shows none free; at most 8 × BLOCK_GROUP Leases, ~500 kB, in one page)
GROUPS_READ = 16  # groups one acquisition reads at most (in at most GROUP_LISTS Lists: two of WIDE_GROUPS) before the read of every record




@dataclass
class _Acquisition:
    """What the steps of one ADD's acquisition of a block of ``rs`` share."""

    rs: RangeSet
    attachment: Attachment
    network: str
    deadline: float
    notes: dict  # the daemon's notes of the range set (a fresh dict in-process)
    mine: set  # the record names of this node's blocks
    held: set  # the record names this daemon knows held by other nodes
    total: int  # blocks of the range set
    position: int  # the next entry of this node's hashed probe sequence
    misses: int = 0  # 409s met


@dataclass
class _BorrowWalk:
    """Where one borrowing ADD is in this node's hashed sequence of other nodes' blocks."""

    position: int
    listed: int = 0  # blocks read
    looked: int = 0  # positions looked at


class NodeBlocks:
    """Node ``node``'s blocks of the domain of ``leases`` (``block_size`` addresses each, None: the
    family's default; an empty one is released after ``block_release`` seconds). The store calls
    :meth:`own`, :meth:`acquire`, :meth:`borrow`, :meth:`release_idle` and :meth:`release_empty`."""

    def __init__(self, leases: DomainLeases, node: str, block_size: Optional[int] = None,
                 block_release: float = 300.0) -> None:
        self.leases = leases
        self.node = node
        self.dhash = leases.dhash
        self.domain = leases.domain
        self.block_size = block_size
        self.block_release = block_release

    def _size(self, r: Range) -> int:
        """Addresses per block in range ``r`` (never more than its subnet holds)."""
        return block_size_in(r, self.block_size)

    def _span(self, r: Range, first: int) -> Optional[Range]:
        """The addresses of the block at ``first`` that ``r`` may hand out (None: none)."""
        lo, hi = max(first, r.start), min(first + self._size(r) - 1, r.end)
        if lo > hi:
            return None
        span = Range(r.subnet, lo, hi, r.gateway, r.excludes)
        return span if span.count_free(()) > 0 else None

    def _record_ip(self, r: Range, first: int) -> Optional[IPAddress]:
        """The address whose claim Lease records the block at ``first``: its first usable one."""
        return record_address(r, first, self.block_size)

    def _block_range(self, rs: RangeSet, block: Block) -> Optional[Range]:
        """The range of ``rs`` a block belongs to (same subnet, same size, overlapping it)."""
        for r in rs.ranges:
            if block.ip.version == r.family and block.ip in r.subnet and block.size == self._size(r) \
                    and int(block.ip) <= r.end and block.last >= r.start:
                return r
        return None

    def own(self, rs: RangeSet, blocks: Sequence[Block]) -> Optional[RangeSet]:
        """This node's blocks in ``rs`` as a range set of their own (candidates come from it)."""
        spans = []
        seen = set()
        for b in blocks:
            if (b.node and b.node != self.node) or b.id in seen:
                continue
            r = self._block_range(rs, b)
            span = self._span(r, int(b.ip)) if r is not None else None
            if span is not None:
                spans.append(span)
                seen.add(b.id)
        if not spans:
            return None
        spans.sort(key=lambda x: x.start)
        return RangeSet(rs.index, tuple(spans), rs.origin)

    def _block_count(self, rs: RangeSet) -> int:
        return block_count(rs, self.block_size)

    def _position(self, rs: RangeSet, j: int) -> tuple[Range, int]:
        """The ``j``-th block of ``rs`` (its range and first address), counting range by range."""
        return block_position(rs, j, self.block_size)

    def _probe(self, rs: RangeSet, i: int, salt: str = "") -> int:
        """The ``i``-th entry of this node's hashed sequence over block numbers (``salt``: another sequence)."""
        digest = hashlib.sha256(f"{self.node}\0{rs.index}\0{i}{salt}".encode()).digest()
        return int.from_bytes(digest[:16], "big")

    # -- acquisition: the record is the ADD's own claim -------------------------------------------

    def acquire(self, rs: RangeSet, blocks: list[Block], deadline: float, cache: Optional[LeaseCache],
                attachment: Attachment, network: str) -> Optional[Claim]:
        """The ADD's claim on the first usable address of a block of ``rs`` that no node holds,
        made as the block's record: one create acquires the block and claims the address (409:
        a record, or a claim of that address: next block). In this order: the block after the
        node's newest; the blocks a List showed free in the last ``FREE_SEEN_SECONDS`` (best
        first, one 409 and the rest is forgotten); this node's hashed positions (skipping
        blocks this daemon knows held) until ``PROBE_MISSES`` 409s, unless the last List showed
        ``CROWDED_SHARE`` or more of its blocks held (or the creates since, a 409 on the block
        after the newest included, moved that share there, as does that block being one it
        knows held); one List of the records of the
        group of ``BLOCK_GROUP`` blocks at the next position (``WIDE_GROUPS`` adjacent groups
        from ``CROWDED_SHARE`` on), at most ``GROUP_LISTS`` Lists and ``GROUPS_READ``
        groups (a create at the best block each shows free); then, on a range set of more than
        ``SMALL_BLOCK_COUNT`` blocks, one paginated List of the domain's records and a create
        at each block it shows free until one succeeds. None: no block was free (borrow; no
        attempt for ``NO_BLOCK_AT_ALL_SECONDS`` when the whole read showed none)."""
        notes = cache.notes if cache is not None else {}
        until, _ = notes.get(("no-free-block", rs.index), (0.0, 0.0))
        if until > time.monotonic():
            return None  # every block looked held a moment ago: borrow
        total = self._block_count(rs)
        if total <= 0:
            return None
        # What this daemon learnt on earlier acquisitions: the records other nodes hold (409s, the
        # last group Lists) and how far along its probe sequence it is, so that a block found
        # held costs one 409 once, not one per acquisition.
        a = _Acquisition(rs, attachment, network, deadline, notes, {b.name for b in blocks},
                         notes.setdefault(("held", rs.index), set()), total, notes.get(("probe", rs.index), 0))
        try:
            claim = self._acquire_after_newest(a, blocks) or self._acquire_free_seen(a) or self._acquire_probed(a) \
                or self._acquire_listed(a)
            if claim is not None:
                return claim
            claim, pause = self._acquire_read_all(a)
            if claim is not None:
                return claim
        finally:
            notes[("probe", rs.index)] = a.position
        if cache is not None and pause > 0:  # no block free: borrow, and try again after a pause
            notes[("no-free-block", rs.index)] = (time.monotonic() + pause, pause)
        return None

    def _acquire_after_newest(self, a: _Acquisition, blocks: Sequence[Block]) -> Optional[Claim]:
        """The block right after this node's newest one: a node grows a run of adjacent blocks, so
        it meets another node only where its run reaches theirs (then it jumps to its next hashed
        position), instead of a 409 with the probability of the held fraction at every
        acquisition."""
        after = self._after_newest(a.rs, blocks)
        claim, missed = self._try_after_newest(a.rs, after, a.mine, a.held, a.attachment, a.network, a.deadline)
        if claim is not None:
            return claim
        if missed or self._known_held(after, a.held):
            # Its run met another node's (a 409 now, or a List showed that block held): the
            # pool is at least as crowded as a probe's 409 says (a run leaves room ahead of it
            # until the pool fills up).
            self._crowding(a.notes, a.rs, True)
        a.misses += missed
        return None

    def _acquire_free_seen(self, a: _Acquisition) -> Optional[Claim]:
        """The blocks an earlier group List showed free (one List shows every free block of its
        group: at a high fill it serves several acquisitions, not one)."""
        claim, missed = self._try_free_seen(a.rs, a.mine, a.held, a.attachment, a.network, a.deadline, a.notes)
        a.misses += missed
        return claim

    def _acquire_probed(self, a: _Acquisition) -> Optional[Claim]:
        """This node's hashed positions, until ``PROBE_MISSES`` 409s in all. The share f of blocks
        held, as the last List showed it (or the last probes: each 409 moves it up, each success
        down): a hashed probe meets a 409 with about that probability, so two probes before a
        List cost f + 2f² requests on average against the List's 1, more from f = 1/2 on: from
        there, none (list at once)."""
        probes = BLOCK_PROBES if a.total > SMALL_BLOCK_COUNT else 1
        if a.notes.get(("crowded", a.rs.index), 0.0) >= CROWDED_SHARE:
            probes = 0
        looked = 0
        while a.misses < min(probes, PROBE_MISSES) and looked < probes * 16:
            looked += 1
            r, first = self._next_position(a)
            claim, missed = self._try_record(a.rs, r, first, a.mine, a.held, a.attachment, a.network, a.deadline)
            if claim is not None or missed:
                self._crowding(a.notes, a.rs, bool(missed))
            if claim is not None:
                a.notes.pop(("no-free-block", a.rs.index), None)
                return claim
            a.misses += missed
        return None

    def _next_position(self, a: _Acquisition) -> tuple[Range, int]:
        """(range, first address) of the block at the next entry of this node's probe sequence."""
        at = self._position(a.rs, self._probe(a.rs, a.position) % a.total)
        a.position += 1
        return at

    def _acquire_listed(self, a: _Acquisition) -> Optional[Claim]:
        """One List of the records of the group at the next position, and a create at the best
        block it shows free, for at most ``GROUP_LISTS`` Lists and ``GROUPS_READ`` groups; a
        group listed is not listed again for ``FULL_BLOCK_SECONDS`` (what the List showed free
        is remembered instead)."""
        groups: set = set()
        full: dict = a.notes.setdefault(("full-groups", a.rs.index), {})
        now = time.monotonic()
        for g in [g for g, t in full.items() if t <= now]:
            del full[g]
        lists = 0
        for _ in range(GROUP_LISTS * 8):
            if lists >= GROUP_LISTS or len(groups) >= GROUPS_READ:
                break
            r, first = self._next_position(a)
            # A crowded pool's group often shows no free block: then one List reads the
            # adjacent groups around this one (the same request, more Leases).
            width = WIDE_GROUPS if a.notes.get(("crowded", a.rs.index), 0.0) >= CROWDED_SHARE else 1
            ids = [g for g in self._groups(r, first, width) if g not in groups and full.get(g, 0.0) <= now]
            if not ids:
                continue
            lists += 1
            for g in ids:
                groups.add(g)
                full[g] = now + FULL_BLOCK_SECONDS
            claim = self._acquire_in_group(a.rs, r, first, a.mine, a.held, a.attachment, a.network, a.deadline,
                                           a.notes, width)
            if claim is not None:
                a.notes.pop(("no-free-block", a.rs.index), None)
                return claim
        return None

    def _acquire_read_all(self, a: _Acquisition) -> tuple[Optional[Claim], float]:
        """The groups listed had no free block (or this node met 409s on every one it saw free):
        one read of every record of the domain tells where the free blocks are (1/S of the
        claims, none of the other addresses); the ones it shows are tried, and remembered for the
        next acquisitions. (claim or None, how long to pause acquiring: borrow meanwhile)."""
        if not SMALL_BLOCK_COUNT < a.total <= RECORD_SCAN_BLOCKS:  # a small range's groups were just listed
            return None, ACQUIRE_PAUSE_SECONDS
        claim, free = self._acquire_in_records(a.rs, a.mine, a.held, a.attachment, a.network, a.deadline, a.notes)
        if claim is not None:
            a.notes.pop(("no-free-block", a.rs.index), None)
            return claim, 0.0
        # Every block it showed free was taken before this node's create (borrow this once,
        # acquire again on the next ADD), or none was: borrow until blocks come back.
        return None, NO_BLOCK_AT_ALL_SECONDS if not free else 0.0

    def _acquire_in_records(self, rs: RangeSet, mine: set, held: set, attachment: Attachment, network: str,
                            deadline: float, notes: dict) -> tuple[Optional[Claim], int]:
        """One paginated List of the domain's block records (``rdmanet.io/block-owner`` set;
        only their names are kept, page by page), then the ADD's claim made as the record of a
        block of ``rs`` none of them holds, best first (:meth:`_rank_free`), trying each until
        one create succeeds; the others are remembered (:meth:`_try_free_seen`). (claim or
        None, how many blocks the read showed free)."""
        names: set = set()
        for page in self.leases.pages(f"{L_DOMAIN}={self.dhash},{L_BLOCK_OWNER}", deadline,
                                f"list block records of domain {self.domain}", RECORD_PAGE):
            if page is None:
                names.clear()
                continue
            for item in page:
                if isinstance(item, dict):
                    names.add(str((item.get("metadata") or {}).get("name") or ""))
        by_range: dict[Range, list[int]] = {}
        until = time.monotonic() + FREE_SEEN_SECONDS
        total = self._block_count(rs)
        for j in range(total):
            r, first = self._position(rs, j)
            ip = self._record_ip(r, first)
            if ip is None:
                continue
            name = lease_name(self.dhash, ip)
            if name in names:
                if name not in mine:
                    held.add(name)
            elif name not in mine:
                held.discard(name)
                by_range.setdefault(r, []).append(first)
        seen = {at: (r, until, room) for r, frees in by_range.items() for at, room in self._rank_free(self._size(r), frees)}
        notes[("free-seen", rs.index)] = seen
        notes[("crowded", rs.index)] = 1.0 - len(seen) / max(1, total)
        # Just read: every one of them is tried before this ADD borrows (a 409 costs one request,
        # borrowing may read the domain's claims).
        claim, _ = self._try_free_seen(rs, mine, held, attachment, network, deadline, notes, len(seen))
        return claim, len(seen)

    def _try_after_newest(self, rs: RangeSet, after: Optional[tuple[Range, int]], mine: set, held: set,
                          attachment: Attachment, network: str, deadline: float) -> tuple[Optional[Claim], int]:
        """The ADD's claim made as the record of the block after this node's newest one
        (``after``: :meth:`_after_newest`; when it has one there and does not know it held).
        (claim or None, 409s met)."""
        if after is None:
            return None, 0
        return self._try_record(rs, *after, mine, held, attachment, network, deadline)

    def _known_held(self, after: Optional[tuple[Range, int]], held: set) -> bool:
        """Whether this daemon knows the block after its newest one (``after``) held by another
        node (a List or a 409 showed it): its run met another node's as surely as a 409 there
        would say."""
        ip = self._record_ip(*after) if after is not None else None
        return ip is not None and lease_name(self.dhash, ip) in held

    def _after_newest(self, rs: RangeSet, blocks: Sequence[Block]) -> Optional[tuple[Range, int]]:
        """(range, first address) of the block after this node's most recently acquired block of
        ``rs`` (None: it holds none there, or that one is the range's last)."""
        newest = None
        for b in blocks:
            if b.node == self.node and self._block_range(rs, b) is not None:
                if newest is None or (b.time or _EPOCH, int(b.ip)) > (newest.time or _EPOCH, int(newest.ip)):
                    newest = b
        if newest is None:
            return None
        r = self._block_range(rs, newest)
        first = int(newest.ip) + newest.size
        return (r, first) if first <= r.end else None

    def _try_record(self, rs: RangeSet, r: Range, first: int, mine: set, held: set, attachment: Attachment,
                    network: str, deadline: float) -> tuple[Optional[Claim], int]:
        """(the record of the block at ``first`` created as the ADD's claim, or None; 409s met)."""
        ip = self._record_ip(r, first)
        if ip is None:
            return None, 0
        name = lease_name(self.dhash, ip)
        if name in mine or name in held or self.leases.whereabouts_holder(ip, rs, deadline) is not None:
            return None, 0
        claim = self.leases.create(ip, attachment, network, rs, deadline, record=(r, first))
        if claim is None:
            held.add(name)
            return None, 1
        log.info("node %s acquired block %s of %s", self.node, claim.block, self.domain)
        return claim, 0

    @staticmethod
    def _crowding(notes: dict, rs: RangeSet, missed: bool) -> None:
        """A create at a block met a 409 (``missed``) or made its record: the share of blocks
        held this daemon assumes moves ``PROBE_WEIGHT`` of the way to 1 or 0 (a List sets it)."""
        share = notes.get(("crowded", rs.index), 0.0)
        notes[("crowded", rs.index)] = share + PROBE_WEIGHT * ((1.0 if missed else 0.0) - share)

    def _groups_start(self, r: Range, first: int, width: int) -> int:
        """The first address of the ``width`` aligned adjacent groups around the block at ``first``."""
        net, span = int(r.subnet.network_address), self._size(r) * BLOCK_GROUP * width
        return net + (first - net) // span * span

    def _groups(self, r: Range, first: int, width: int = 1) -> list[str]:
        """The groups one List reads for the block at ``first``: its own (``width`` 1), or the
        ``width`` aligned adjacent groups around it that hold blocks of ``r``."""
        size = self._size(r)
        span, start = size * BLOCK_GROUP, self._groups_start(r, first, width)
        return [block_group_id(r.subnet, at, size) for at in range(start, start + span * width, span)
                if at <= r.end and at + span - 1 >= r.start]

    def _acquire_in_group(self, rs: RangeSet, r: Range, first: int, mine: set, held: set, attachment: Attachment,
                          network: str, deadline: float, notes: Optional[dict] = None, width: int = 1) -> Optional[Claim]:
        """One List of the records of the group holding the block at ``first`` (at most
        ``BLOCK_GROUP`` Leases; ``width`` > 1: of that many aligned adjacent groups around it),
        then a record created at the best block they show that none holds (up to
        ``GROUP_MISSES`` 409s: claims of first addresses). ``notes`` (a daemon's): the other
        blocks the List showed free are remembered for the next acquisitions
        (:meth:`_try_free_seen`), and the share of the blocks read that are held tells the next
        acquisition whether hashed probes are worth their 409s and how many groups to read."""
        size = self._size(r)
        ids = self._groups(r, first, width)
        if not ids:
            return None
        selector = f"{L_BLOCK_GROUP}={ids[0]}" if len(ids) == 1 else f"{L_BLOCK_GROUP} in ({','.join(ids)})"
        records, _ = self.leases.list_all(f"{L_DOMAIN}={self.dhash},{selector}", deadline,
                                    f"list block records of group{'s' if len(ids) > 1 else ''} {', '.join(ids)} "
                                    f"of domain {self.domain}", BLOCK_GROUP * len(ids))  # one page: one record per block
        start, count = self._groups_start(r, first, width), BLOCK_GROUP * width
        listed = {c.name for c in records if c.block}
        for k in range(count):  # what the List showed replaces what the 409s told of these groups
            ip = self._record_ip(r, start + k * size)
            if ip is not None:
                held.discard(lease_name(self.dhash, ip))
        held.update(listed - mine)
        frees, blocks_here = [], 0
        for k in range(count):
            at = start + k * size
            ip = self._record_ip(r, at) if r.start <= at + size - 1 and at <= r.end else None
            if ip is None:
                continue
            blocks_here += 1
            name = lease_name(self.dhash, ip)
            if name not in held and name not in mine:
                frees.append(at)
        ranked = self._rank_free(size, frees)
        order = [at for at, _ in ranked]
        if notes is not None and blocks_here:
            notes[("crowded", rs.index)] = 1.0 - len(order) / blocks_here
            seen: dict = notes.setdefault(("free-seen", rs.index), {})
            until = time.monotonic() + FREE_SEEN_SECONDS
            for at, room in ranked[1:]:
                seen[at] = (r, until, room)
        misses = 0
        for at in order:
            if notes is not None:
                notes.get(("free-seen", rs.index), {}).pop(at, None)
            claim, missed = self._try_record(rs, r, at, mine, held, attachment, network, deadline)
            if claim is not None:
                return claim
            misses += missed
            if misses >= GROUP_MISSES:
                break
        return None

    def _spread(self, value: int) -> bytes:
        """A node-specific sort key for ``value``: nodes choosing among the same free blocks
        seldom choose the same one."""
        return hashlib.sha256(f"{self.node}\0{value}".encode()).digest()[:8]

    def _rank_free(self, size: int, frees: Sequence[int]) -> list[tuple[int, int]]:
        """(first address, room) of the free blocks ``frees`` (first addresses, one range),
        best first. Room: how many free blocks this node could grow into from there (it takes
        the block after its newest next) while leaving as many to whoever grows into the run from
        its start: ``min(blocks from it to the run's end, blocks from the run's start to it)``;
        the middle of the longest run of free blocks comes first, so that one acquisition after
        a List is followed by acquisitions of the next blocks at no request of their own. A run's
        first block has no room: it is the block after the newest of the node whose run ends
        there (its next acquisition, at no request if it is free), so it is taken last (a free
        block alone, or the first of two, is exactly where a crowded pool's Lists used to send
        nodes, and the node whose run it continued then met a 409 and a List of its own). Ties
        in a node-specific order."""
        ranked: list[tuple[int, int]] = []
        run: list[int] = []
        for at in sorted(frees) + [None]:  # runs of adjacent free blocks, in one pass
            if run and (at is None or at != run[-1] + size):
                ranked += [(b, min(len(run) - i, i)) for i, b in enumerate(run)]
                run = []
            if at is not None:
                run.append(at)
        ranked.sort(key=lambda x: (-x[1], self._spread(x[0])))
        return ranked

    def _try_free_seen(self, rs: RangeSet, mine: set, held: set, attachment: Attachment, network: str,
                       deadline: float, notes: dict, budget: int = 1) -> tuple[Optional[Claim], int]:
        """The ADD's claim made as the record of a block a List showed free less than
        ``FREE_SEEN_SECONDS`` ago, best first (:meth:`_rank_free`: the nodes that read the same
        free blocks seldom choose the same one), up to ``budget`` 409s. Each is tried once; a
        409 beyond the budget means other nodes took them since: what is left is forgotten
        (while nodes acquire at once, what a List showed is soon stale). (claim or None, 409s met)."""
        seen: dict = notes.get(("free-seen", rs.index)) or {}
        now, misses = time.monotonic(), 0
        order = sorted(seen, key=lambda at: (-seen[at][2], self._spread(at)))
        for at in order:
            if misses >= budget:
                break
            r, until, _ = seen.pop(at)
            if until <= now or r not in rs.ranges:  # old, or seen under another config of the range set
                continue
            claim, missed = self._try_record(rs, r, at, mine, held, attachment, network, deadline)
            if claim is not None:
                return claim, misses
            misses += missed
        if misses >= budget:
            seen.clear()
        return None, misses

    # -- borrowing ------------------------------------------------------------------------------

    def borrow(self, rs: RangeSet, attachment: Attachment, network: str, blocks: list[Block],
               deadline: float) -> Claim:
        """No block of ``rs`` was free: a claim in a held block (another node's, or ours with
        addresses our view thought taken). First the free addresses this daemon saw in blocks
        it read a moment ago; then up to ``BORROW_BLOCKS`` blocks, in this node's hashed order,
        ``BORROW_BATCH`` of them (at most ``BORROW_LEASES`` addresses) read by one List of their
        labels (a block found full is not read again for ``FULL_BLOCK_SECONDS``); a block no record holds is acquired
        on the way. Only when those are all full (or the range set has few blocks) are the
        domain's claims read, page by page, once (a daemon borrows from that view for
        ``NO_FREE_BLOCK_SECONDS``): the pool is usable to its last address, and "exhausted"
        (102) is said only after that whole read."""
        cache = self.leases.cache
        notes = cache.notes if cache is not None else {}
        now = time.monotonic()
        seen: dict[int, Optional[Claim]] = {}
        until, remembered = notes.get(("borrow-free", rs.index), (0.0, {}))
        if until > now:
            seen = remembered
        claim, taken = self._claim_seen(rs, seen, attachment, network, deadline)
        if claim is None and self._block_count(rs) > SMALL_BLOCK_COUNT:
            claim, missed = self._borrow_in_blocks(rs, attachment, network, blocks, deadline, notes, now)
            taken += missed
        if claim is None:
            claim, missed = self._borrow_in_domain(rs, attachment, network, blocks, deadline)
            taken += missed
        if claim is not None:
            return claim
        if self.leases.cache is not None:
            self.leases.cache.notes[("exhausted", rs.index)] = time.monotonic()
        raced = f" ({taken} candidates were claimed concurrently or held by whereabouts)" if taken else ""
        raise CNIError(POOL_EXHAUSTED, f"no free address in range {rs.describe()}{raced}",
                       "free addresses (DEL or GC attachments that are gone) or widen the range "
                       "(range_start/range_end, or another ipRanges entry)")

    def _borrow_in_blocks(self, rs: RangeSet, attachment: Attachment, network: str, blocks: list[Block],
                          deadline: float, notes: dict, now: float) -> tuple[Optional[Claim], int]:
        """The next blocks of this node's hashed sequence (not its own, not found full lately), a
        batch read by one List: a borrower meets full blocks (most are, near a full pool) at
        1/``BORROW_BATCH`` of a request each. (claim or None, 409s met)."""
        full: dict[str, float] = notes.setdefault(("borrow-full", rs.index), {})
        for bid in [b for b, t in full.items() if t <= now]:
            del full[bid]
        mine = {b.id for b in blocks if b.node == self.node}
        walk, taken = _BorrowWalk(notes.get(("borrow-pos", rs.index), 0)), 0
        try:
            while walk.listed < BORROW_BLOCKS and walk.looked < BORROW_BLOCKS * 16:
                batch = self._borrow_batch(rs, walk, full, mine)
                if not batch:
                    break
                walk.listed += len(batch)
                claims = self.leases.list_claims(
                    f"{L_DOMAIN}={self.dhash},{L_BLOCK} in ({','.join(b[4] for b in batch)})", deadline,
                    f"list claims of blocks {', '.join(b[4] for b in batch)} of domain {self.domain}")
                for pos, r, first, span, bid in batch:
                    inside = [c for c in claims if c.ip.version == rs.family and first <= int(c.ip) <= first + self._size(r) - 1]
                    claim, missed, step = self._borrow_in_block(rs, r, first, span, bid, inside, attachment, network,
                                                                blocks, deadline, notes, full)
                    taken += missed
                    if claim is not None:
                        # The next borrowing ADD reads this block again (it has addresses left)
                        # or the one after it (this one is used up, or was acquired).
                        walk.position = pos + step
                        return claim, taken
        finally:
            notes[("borrow-pos", rs.index)] = walk.position
        return None, taken

    def _borrow_batch(self, rs: RangeSet, walk: _BorrowWalk, full: Mapping[str, float],
                      mine: set) -> list[tuple[int, Range, int, Range, str]]:
        """The next at most ``BORROW_BATCH`` blocks (``BORROW_LEASES`` addresses) of this node's
        borrowing sequence worth a read: (position, range, first address, usable span, block id)."""
        batch: list[tuple[int, Range, int, Range, str]] = []
        width = max(1, min(BORROW_BATCH, BORROW_LEASES // max(1, self._size(rs.ranges[0]))))
        total, k = self._block_count(rs), walk.position
        while len(batch) < width and walk.listed + len(batch) < BORROW_BLOCKS and walk.looked < BORROW_BLOCKS * 16:
            walk.looked += 1
            r, first = self._position(rs, self._probe(rs, k, "borrow") % total)
            span = self._span(r, first)
            bid = block_id(r.address(first), self._size(r))
            if span is not None and bid not in full and bid not in mine and all(b[4] != bid for b in batch):
                batch.append((k, r, first, span, bid))
            k += 1
        walk.position = k
        return batch

    def _borrow_in_block(self, rs: RangeSet, r: Range, first: int, span: Range, bid: str, inside: list[Claim],
                         attachment: Attachment, network: str, blocks: list[Block], deadline: float, notes: dict,
                         full: dict[str, float]) -> tuple[Optional[Claim], int, int]:
        """A claim in the block at ``first`` whose claims a List just showed (``inside``): its
        record made when none holds the block (it is acquired on the way), else one of the free
        addresses it shows (remembered for the next borrowing ADDs). (claim or None, 409s met,
        how far the next borrowing ADD moves on: 0 to read this block again)."""
        taken = 0
        if not any(c.block == bid for c in inside):  # no record holds it: acquire it on the way
            held = notes.setdefault(("held", rs.index), set())
            claim, missed = self._try_record(rs, r, first, set(), held, attachment, network, deadline)
            taken += missed
            if claim is not None:
                notes.pop(("no-free-block", rs.index), None)  # a block was free after all
                block = claim.as_block()
                if block is not None:
                    blocks.append(block)
                return claim, taken, 1
        here = sorted(int(c.ip) for c in inside if not c.free)
        free_records = {int(c.ip): c for c in inside if c.free}
        seen: dict[int, Optional[Claim]] = {}
        value = span.start
        while True:
            value = intervals.lowest_free(value, span.end, span.blocked, here)
            if value is None:
                break
            seen[value] = free_records.get(value)
            value += 1
        if not seen:
            full[bid] = time.monotonic() + FULL_BLOCK_SECONDS
            return None, taken, 1
        if self.leases.cache is not None:
            notes[("borrow-free", rs.index)] = (time.monotonic() + NO_FREE_BLOCK_SECONDS, seen)
        claim, missed = self._claim_seen(rs, seen, attachment, network, deadline)
        return claim, taken + missed, 0 if seen else 1

    def _borrow_in_domain(self, rs: RangeSet, attachment: Attachment, network: str, blocks: list[Block],
                          deadline: float) -> tuple[Optional[Claim], int]:
        """Every address of the range set, whatever block holds it (or none: a block being
        released), round-robin after the domain's most recently made claim, as before blocks
        existed: from the domain's claims as this daemon read them a moment ago, else as one
        paginated read of them shows now (a block that read shows free is acquired first).
        (claim or None, 409s met)."""
        claim, taken = self._borrow_in_remembered_domain(rs, attachment, network, deadline)
        if claim is not None:
            return claim, taken
        scan = self.leases.scan_domain(deadline)
        everything, free, latest = scan.sorted_used()[rs.family], scan.free, scan.latest
        claim, missed = self._acquire_seen(rs, scan.blocks + list(blocks), everything, attachment, network, deadline)
        taken += missed
        if claim is not None:
            block = claim.as_block()
            if block is not None:
                blocks.append(block)
            return claim, taken
        cache = self.leases.cache
        if cache is not None:
            with cache.acquire_lock:
                cache.notes[("borrow", rs.index)] = (time.monotonic() + NO_FREE_BLOCK_SECONDS, list(everything), free, latest)
        claim, missed = self._borrow_round_robin(rs, everything, free, latest, attachment, network, deadline)
        return claim, taken + missed

    def _borrow_in_remembered_domain(self, rs: RangeSet, attachment: Attachment, network: str,
                                     deadline: float) -> tuple[Optional[Claim], int]:
        """A daemon that read the domain less than ``NO_FREE_BLOCK_SECONDS`` ago borrows from that
        view. (claim or None, 409s met)."""
        cache = self.leases.cache
        if cache is None:
            return None, 0
        with cache.acquire_lock:
            until, everything, free, latest = cache.notes.get(("borrow", rs.index), (0.0, None, {}, {}))
            everything = list(everything) if everything is not None and until > time.monotonic() else None
        if everything is None:
            return None, 0
        return self._borrow_round_robin(rs, everything, free, latest, attachment, network, deadline)

    def _acquire_seen(self, rs: RangeSet, records: Sequence[Block], used: Sequence[int], attachment: Attachment,
                      network: str, deadline: float) -> tuple[Optional[Claim], int]:
        """After a read of the whole domain: the ADD's claim made as the record of a block the read
        shows free (no record, its first usable address unclaimed), in this node's hashed order,
        so that a node whose acquisition gave up early (409s, groups it thought full) takes one of
        the blocks that are still free instead of borrowing from a view it must re-read; the
        acquisition pause ends. (claim or None, 409s met); at most ``PROBE_MISSES`` 409s."""
        total = self._block_count(rs)
        held = {b.name for b in records}
        taken = set(used)
        notes = self.leases.cache.notes if self.leases.cache is not None else {}
        misses, start = 0, self._probe(rs, 0, "seen") % max(total, 1)
        for k in range(total):
            r, first = self._position(rs, (start + k) % total)
            ip = self._record_ip(r, first)
            if ip is None or lease_name(self.dhash, ip) in held or int(ip) in taken:
                continue
            claim, missed = self._try_record(rs, r, first, set(), set(), attachment, network, deadline)
            if claim is not None:
                notes.pop(("no-free-block", rs.index), None)
                return claim, misses
            misses += missed
            if misses >= PROBE_MISSES:
                break
        return None, misses

    def _claim_at(self, rs: RangeSet, value: int, record: Optional[Claim], attachment: Attachment, network: str,
                  deadline: float) -> Optional[Claim]:
        """Our claim on address ``value`` (a free block record's: taken by an update), or None."""
        ip = rs.ranges[0].address(value)
        if record is not None:
            block = record.as_block()
            return self.leases.take_record(block, attachment, network, rs, deadline) if block is not None else None
        if self.leases.whereabouts_holder(ip, rs, deadline) is not None:
            return None
        return self.leases.create(ip, attachment, network, rs, deadline)

    def _claim_seen(self, rs: RangeSet, seen: dict[int, Optional[Claim]], attachment: Attachment, network: str,
                    deadline: float) -> tuple[Optional[Claim], int]:
        """A claim on one of the free addresses ``seen`` (removed from it as they are tried),
        starting at a node-specific one so that nodes borrowing from one block seldom meet."""
        missed = 0
        while seen:
            values = sorted(seen)
            value = values[node_skip(self.node, rs) % len(values)]
            try:
                record = seen.pop(value)
            except KeyError:
                continue  # another ADD of this daemon is trying it

            try:
                claim = self._claim_at(rs, value, record, attachment, network, deadline)
            finally:
                if self.leases.cache is not None:
                    self.leases.cache.done(rs.family, value)
            if claim is not None:
                if claim.owner != self.node:
                    self._log_borrowed(rs, claim.ip)
                return claim, missed
            missed += 1
        return None, missed

    def _borrow_round_robin(self, rs: RangeSet, used: list[int], free: Mapping[int, Claim],
                            latest: Mapping[str, Claim], attachment: Attachment, network: str,
                            deadline: float) -> tuple[Optional[Claim], int]:
        """A claim on the next free address by ``used`` (the domain's claims as read, or as a
        daemon read them a moment ago) after the domain's latest claim; ``free``: the free block
        records (taken by an update). Each address met taken (409) or claimed is added to the
        daemon's remembered view. (claim or None, 409s met)."""
        cursor, skip, missed = round_robin_start(rs, latest), node_skip(self.node, rs), 0
        while True:
            candidate = next_candidate(self.leases.cache, rs, used, cursor, skip, listed=True)
            if candidate is None:
                return None, missed
            ip = rs.ranges[0].address(candidate)
            try:
                claim = self._claim_at(rs, candidate, free.get(candidate), attachment, network, deadline)
            finally:
                if self.leases.cache is not None:
                    self.leases.cache.done(rs.family, candidate)
                    with self.leases.cache.acquire_lock:
                        memo = self.leases.cache.notes.get(("borrow", rs.index))
                        if memo is not None and memo[1] is not None:
                            i = bisect_left(memo[1], candidate)
                            if i == len(memo[1]) or memo[1][i] != candidate:
                                memo[1].insert(i, candidate)
            insort(used, candidate)
            if claim is not None:
                self._log_borrowed(rs, ip)
                return claim, missed
            missed += 1
            cursor, skip = ip, 0

    def _log_borrowed(self, rs: RangeSet, ip: IPAddress) -> None:
        log.info("node %s borrowed %s (no block of %s was free)", self.node, ip, self.domain)

    # -- release --------------------------------------------------------------------------------

    def release_idle(self, cache: LeaseCache, deadline: float) -> None:
        """In the daemon, after a DEL: a block of this node that holds none of its claims (nor a
        create in flight; its record free) is noted empty; one noted empty ``block_release``
        seconds ago and still empty is released (its record deleted with uid/resourceVersion
        preconditions). Another node's claim in it (a borrowed address) is invisible here and
        does not need to be seen: claims, not blocks, are what keep an address."""
        now = time.monotonic()
        with cache.acquire_lock:
            # the cache's index: O(empty blocks); a plan's blocks stay with their node while empty
            empty = [b for b in cache.empty_blocks() if b.node == self.node and not b.planned]
            names = {b.name for b in empty}
            for key in [k for k in list(cache.notes) if isinstance(k, tuple) and k[0] == "empty-since" and k[1] not in names]:
                del cache.notes[key]  # in use again (or gone)
            for b in empty:
                key = ("empty-since", b.name)
                if any_within(cache.pending(b.ip.version), int(b.ip), b.last):
                    cache.notes.pop(key, None)
                    continue
                since = cache.notes.setdefault(key, now)
                if now - since < self.block_release:
                    continue
                try:
                    self.leases.drop_block(b, deadline)
                except CNIError as err:
                    log.info("could not release block %s (retried after the next DEL): %s", b.id, err.msg)
                    continue
                cache.notes.pop(key, None)

    def release_empty(self, blocks: Sequence[Block], used: Sequence[int], deadline: float) -> None:
        """This node's blocks among ``blocks`` that hold none of the sorted ``used`` addresses (its
        claims) and are older than ``block_release`` (by their record's time), released; a plan's
        blocks stay with their node while empty."""
        wall = datetime.now(timezone.utc)
        for b in blocks:
            if b.node != self.node or b.planned or any_within(used, int(b.ip), b.last):
                continue
            if b.time is not None and (wall - b.time).total_seconds() >= self.block_release:
                self.leases.drop_block(b, deadline)
