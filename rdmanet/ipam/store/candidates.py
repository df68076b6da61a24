"""The round-robin walk over a range set's free addresses that the Kubernetes store's ADDs share:
where it resumes (the domain's most recently made claim), how far a node passes over to start
(so that nodes adding at one instant seldom aim at one address), and the next candidate (in a
daemon, passing over the candidates its other ADDs are creating right now)."""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from ..ranges import IPAddress, RangeSet

if TYPE_CHECKING:
    from .claims import Claim
    from .lease_cache import LeaseCache

NODE_WINDOW = 64  # a borrowing node's first candidate passes over fewer free addresses than this


def round_robin_start(rs: RangeSet, latest: Mapping[str, "Claim"]) -> Optional[IPAddress]:
    """The round-robin cursor of a range set: the address of the domain's most recently made
    claim in one of its ranges (None: no claim yet, start at the lowest). The next candidate
    is the first free address after it, so a just-freed address is not handed out again
    until the range has been gone round, whichever node freed it."""
    found = [latest[str(r.subnet)] for r in rs.ranges if str(r.subnet) in latest]
    if not found:
        return None
    return max(found, key=lambda c: (c.time, int(c.ip))).ip


def node_skip(node: str, rs: RangeSet) -> int:
    """How many free addresses after the domain's cursor a borrowing node passes over for its
    first candidate: nodes borrowing at the same instant share the cursor; each starts a few
    free addresses further, by a count of its own (below ``NODE_WINDOW``, at most 1/16 of
    the range set), so that they seldom aim at the same address. Range sets of fewer than
    32 addresses keep the exact order."""
    window = min(NODE_WINDOW, sum(r.end - r.start + 1 for r in rs.ranges) // 16)
    if window <= 1:
        return 0
    return int.from_bytes(hashlib.sha256(f"{node}\0{rs.index}".encode()).digest()[:8], "big") % window


def next_candidate(cache: Optional["LeaseCache"], rs: RangeSet, used: list[int], cursor: Optional[IPAddress],
                   skip: int, listed: bool = False) -> Optional[int]:
    """The ``skip``-th free address after the cursor (fewer when the range runs out: never one
    twice). In a process with a watch cache (``cache``, the daemon's) the ADDs running at once
    all start from the same cursor: each passes over the candidates the others are creating
    right now (:meth:`LeaseCache.choose`), so they do not meet in 409s."""

    def advance() -> Optional[int]:
        candidate = first = rs.next_free(used, cursor)
        for _ in range(skip):
            if candidate is None:
                break
            following = rs.next_free(used, rs.ranges[0].address(candidate))
            if following is None or following == first:
                break
            candidate = following
        return candidate

    if cache is None:
        return advance()

    def choose(pending: Sequence[int]) -> Optional[int]:
        # The creates in flight and what the cache shows held within ``rs`` (read now, under
        # the lock that orders the picks of this process: only the addresses of the blocks
        # searched, O(log n) each) are not candidates. ``listed``: ``used`` comes from a List
        # just made, fresher than the cache (which may lag).
        fresh = pending if listed else cache.used_within(rs.family, [(r.start, r.end) for r in rs.ranges])
        for value in fresh:
            i = bisect_left(used, value)
            if i == len(used) or used[i] != value:
                used.insert(i, value)
        return advance()

    return cache.choose(rs.family, choose)
