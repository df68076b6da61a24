"""Free-address arithmetic on Python ints over interval sets; a range is never enumerated.

Facts relied on:
- An IPv4 or IPv6 address is an int (``int(ipaddress.ip_address(s))``); Python ints are exact at
  128 bits, so an IPv6 /64 or /48 needs no special case (whereabouts #83 and nv-ipam #266 came
  from 64-bit offsets).
- An interval is ``(lo, hi)`` with both ends inclusive. ``blocked`` lists are sorted, disjoint and
  non-adjacent, as :func:`merge` returns them. ``used`` lists are sorted and free of duplicates.
- In a sorted list of distinct ints, ``used[k] - used[j] >= k - j``, with equality exactly while
  the values from ``j`` to ``k`` are consecutive. That prefix property lets a run of used
  addresses be skipped with one binary search instead of a walk.

Every function here is pure. A search costs O(log n) per blocked interval or used run it steps
over, whatever the size of the range; counting costs O(n) in the used addresses of the span.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Iterable, Optional, Sequence

Interval = tuple[int, int]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sort and coalesce overlapping or adjacent intervals; empty ones (lo > hi) are dropped."""
    out: list[Interval] = []
    for lo, hi in sorted(iv for iv in intervals if iv[0] <= iv[1]):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def blocked_end(x: int, blocked: Sequence[Interval]) -> Optional[int]:
    """The end of the blocked interval containing ``x``, or None."""
    i = bisect_right(blocked, (x, float("inf"))) - 1
    if i >= 0 and blocked[i][0] <= x <= blocked[i][1]:
        return blocked[i][1]
    return None


def _used_run_end(x: int, used: Sequence[int]) -> Optional[int]:
    """The last value of the run of consecutive used addresses starting at ``x``, or None."""
    j = bisect_left(used, x)
    if j == len(used) or used[j] != x:
        return None
    lo, hi = j, len(used) - 1  # largest k with used[k] - used[j] == k - j
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if used[mid] - x == mid - j:
            lo = mid
        else:
            hi = mid - 1
    return used[lo]


def lowest_free(lo: int, hi: int, blocked: Sequence[Interval], used: Sequence[int]) -> Optional[int]:
    """The lowest address in ``[lo, hi]`` that is neither blocked nor used, or None."""
    x = lo
    while x <= hi:
        end = blocked_end(x, blocked)
        if end is None:
            end = _used_run_end(x, used)
            if end is None:
                return x
        x = end + 1
    return None


def first_free(lo: int, hi: int, blocked: Sequence[Interval], used: Sequence[int],
               start_after: Optional[int] = None) -> Optional[int]:
    """Round-robin: the first free address after ``start_after``, wrapping once to ``lo``.

    Without a cursor (or with one outside ``[lo, hi]``) this is :func:`lowest_free`. With one, the
    search covers ``(start_after, hi]`` then ``[lo, start_after]``, so a just-freed address is
    handed out again only after the rest of the range has been tried.
    """
    if start_after is None or not lo <= start_after <= hi:
        return lowest_free(lo, hi, blocked, used)
    found = lowest_free(start_after + 1, hi, blocked, used)
    if found is None:
        found = lowest_free(lo, start_after, blocked, used)
    return found


def blocked_count(lo: int, hi: int, blocked: Sequence[Interval]) -> int:
    """How many addresses of ``[lo, hi]`` the blocked intervals cover."""
    total = 0
    for b_lo, b_hi in blocked[max(bisect_right(blocked, (lo, float("inf"))) - 1, 0):]:
        if b_lo > hi:
            break
        total += max(0, min(hi, b_hi) - max(lo, b_lo) + 1)
    return total


def count_free(lo: int, hi: int, blocked: Sequence[Interval], used: Sequence[int]) -> int:
    """How many addresses of ``[lo, hi]`` are neither blocked nor used (used may overlap blocked)."""
    if lo > hi:
        return 0
    start, stop = bisect_left(used, lo), bisect_right(used, hi)
    used_here = sum(1 for u in used[start:stop] if blocked_end(u, blocked) is None)
    return (hi - lo + 1) - blocked_count(lo, hi, blocked) - used_here
