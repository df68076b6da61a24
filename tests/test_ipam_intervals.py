"""rdmanet.ipam.intervals against a brute-force model on small ranges, plus huge-range timing."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from rdmanet.ipam import intervals
from rdmanet.ipam.ranges import Range, RangeSet

import ipaddress

SMALL = 64


def brute_free(lo, hi, blocked, used):
    bad = set(used)
    for b_lo, b_hi in blocked:
        bad.update(range(b_lo, b_hi + 1))
    return [x for x in range(lo, hi + 1) if x not in bad]


def brute_first(lo, hi, blocked, used, start_after):
    free = brute_free(lo, hi, blocked, used)
    if start_after is None or not lo <= start_after <= hi:
        return free[0] if free else None
    after = [x for x in free if x > start_after]
    if after:
        return after[0]
    before = [x for x in free if x <= start_after]
    return before[0] if before else None


span = st.tuples(st.integers(0, SMALL), st.integers(0, SMALL))
interval_list = st.lists(span, max_size=6)
point_list = st.lists(st.integers(-2, SMALL + 2), max_size=40)


@st.composite
def case(draw):
    lo = draw(st.integers(0, SMALL))
    hi = draw(st.integers(lo, SMALL))
    blocked = intervals.merge(draw(interval_list))
    used = sorted(set(draw(point_list)))
    cursor = draw(st.one_of(st.none(), st.integers(-2, SMALL + 2)))
    return lo, hi, blocked, used, cursor


@given(interval_list)
def test_merge_matches_set_union(raw):
    merged = intervals.merge(raw)
    covered = set()
    for lo, hi in raw:
        covered.update(range(lo, hi + 1))
    assert {x for lo, hi in merged for x in range(lo, hi + 1)} == covered
    for (_, a_hi), (b_lo, _) in zip(merged, merged[1:]):
        assert b_lo > a_hi + 1  # disjoint and not adjacent


@settings(max_examples=400)
@given(case())
def test_first_free_matches_brute_force(c):
    lo, hi, blocked, used, cursor = c
    assert intervals.first_free(lo, hi, blocked, used, cursor) == brute_first(lo, hi, blocked, used, cursor)


@settings(max_examples=400)
@given(case())
def test_count_free_matches_brute_force(c):
    lo, hi, blocked, used, _ = c
    assert intervals.count_free(lo, hi, blocked, used) == len(brute_free(lo, hi, blocked, used))


@given(case())
def test_lowest_free_is_free_and_lowest(c):
    lo, hi, blocked, used, _ = c
    free = brute_free(lo, hi, blocked, used)
    assert intervals.lowest_free(lo, hi, blocked, used) == (free[0] if free else None)


@settings(max_examples=200)
@given(case())
def test_round_robin_allocation_sequence(c):
    """Allocating until exhaustion from a cursor hands out every free address exactly once."""
    lo, hi, blocked, used, cursor = c
    expected = set(brute_free(lo, hi, blocked, used))
    used = list(used)
    got = []
    while True:
        x = intervals.first_free(lo, hi, blocked, used, cursor)
        if x is None:
            break
        got.append(x)
        used = sorted(used + [x])
        cursor = x
    assert len(got) == len(set(got)) and set(got) == expected


def _net_range(cidr, excludes=(), gateway=None):
    net = ipaddress.ip_network(cidr)
    return Range(subnet=net, start=int(net.network_address) + 1, end=int(net.broadcast_address) - 1,
                 gateway=ipaddress.ip_address(gateway) if gateway else None,
                 excludes=tuple(intervals.merge(excludes)))


@settings(max_examples=200)
@given(st.lists(st.integers(0, 3), max_size=30), st.one_of(st.none(), st.integers(0, 40)))
def test_range_set_round_robin_across_ranges(used_offsets, cursor_offset):
    """A set of three small ranges: next_free equals a brute-force walk in RangeIter order."""
    base = int(ipaddress.ip_address("10.0.0.0"))
    ranges = tuple(_net_range(f"10.0.0.{i * 8}/29") for i in range(3))
    rs = RangeSet(index=0, ranges=ranges)
    order = [x for r in ranges for x in range(r.start, r.end + 1)]
    used = sorted({base + 8 * (k % 3) + 1 + (k // 3) % 6 for k in used_offsets})
    cursor = ipaddress.ip_address(base + cursor_offset) if cursor_offset is not None else None
    got = rs.next_free(used, cursor)
    if cursor is not None and int(cursor) in order:
        i = order.index(int(cursor))
        walk = order[i + 1:] + order[: i + 1]
    else:
        walk = order
    expected = next((x for x in walk if x not in used), None)
    assert got == expected


def test_huge_ranges_never_enumerate():
    for cidr in ("fd00::/64", "fd00::/48", "10.0.0.0/8"):
        net = ipaddress.ip_network(cidr)
        lo, hi = int(net.network_address) + 1, int(net.broadcast_address) - 1
        blocked = intervals.merge([(lo, lo + 2**20), (hi - 5, hi)])
        used = list(range(lo + 2**20 + 1, lo + 2**20 + 5001))  # one long run right after the exclude
        t = time.perf_counter()
        for _ in range(1000):
            x = intervals.first_free(lo, hi, blocked, used, start_after=hi - 3)
        elapsed = time.perf_counter() - t
        assert x == lo + 2**20 + 5001
        assert elapsed < 0.5, f"{cidr}: {elapsed:.3f}s for 1000 calls"
        size = hi - lo + 1
        assert intervals.count_free(lo, hi, blocked, used) == size - (2**20 + 1) - 6 - 5000
