"""A plan of node blocks (``rdmanet ipam plan``; docs/lease-ipam.md "Planned blocks"): which free
blocks to give which node, and which planned records of gone nodes to take back. No I/O.

Why: at 20 addresses per node (5,000 nodes on 100,000 addresses) a node that learns only from its
own objects cannot find a free block without spending requests (docs/lease-ipam-design.md, "Where
a node-local design cannot reach one request per ADD"). A plan written before the ADDs hands each
node its blocks for free, as NV-IPAM's controller does with ``perNodeBlockSize``: a planned
record is a free block record labelled ``rdmanet.io/planned=true`` that its node's watch shows.

Rules, per range set (each ADD takes one address of each range set, so a node needs blocks in
each):
- The share per node is ``blocks_per_node`` when given, else floor(usable blocks / nodes).
- **Create**: every listed node holding fewer records than the share (every record it owns counts,
  planned or not) gets free blocks (no record) up to the share: nodes in sorted order, the free
  blocks walked in address order, so each node gets a contiguous run where the pool allows it.
- **Delete**: planned records of nodes that are not listed (gone, or no longer selected), whose
  address is free (no holder). Never a record that is not planned, never a claimed one, never a
  listed node's. Their blocks are free again for this plan's creates.
- Nothing else: blocks are never taken back from listed nodes, even above the share.

The block arithmetic is the store's (:mod:`rdmanet.ipam.store.block_records`), so a planned record is
exactly the record the node itself would make for that block.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

from .ranges import IPAddress, RangeSet
from .store.block_records import block_count, block_position, block_size_in, record_address
from .store.lease_names import block_id

PLAN_BLOCK_LIMIT = 1 << 20  # a range set of more blocks needs an explicit share (a /64 has 2^58 blocks of 64)


class PlanError(ValueError):
    """A plan that cannot be made as asked (the message says which input and the fix)."""


@dataclass(frozen=True)
class PlanBlock:
    """One block a plan may give: its aligned first address, size, the address whose claim Lease
    is its record, the range's subnet as claims spell it, and the range set it is in."""

    first: IPAddress
    size: int
    record_ip: IPAddress
    subnet: str
    range_set: int

    @property
    def id(self) -> str:
        return block_id(self.first, self.size)

    @property
    def last(self) -> int:
        return int(self.first) + self.size - 1


@dataclass(frozen=True)
class Record:
    """A block record as listed: its name, block, owner node and state."""

    name: str
    first: IPAddress
    size: int
    owner: str
    planned: bool
    free: bool  # its address names no attachment
    uid: str = ""
    resource_version: str = ""

    @property
    def last(self) -> int:
        return int(self.first) + self.size - 1


@dataclass(frozen=True)
class BlockSet:
    """The blocks of one range set, in address order (lazily: a /64 has 2^58 of them)."""

    index: int
    count: int  # aligned blocks its ranges touch (an upper bound of the usable ones)
    range_set: RangeSet
    block_size: Optional[int]

    def blocks(self) -> Iterator[PlanBlock]:
        seen: set = set()
        for j in range(self.count):
            r, first = block_position(self.range_set, j, self.block_size)
            ip = record_address(r, first, self.block_size)
            size = block_size_in(r, self.block_size)
            if ip is None or (r.family, first, size) in seen:
                continue  # no usable address; or the block of a second range of its subnet (the first range's record)
            seen.add((r.family, first, size))
            yield PlanBlock(r.address(first), size, ip, str(r.subnet), self.index)


def block_sets(range_sets: Sequence[RangeSet], block_size: Optional[int]) -> list[BlockSet]:
    """The blocks of a network's range sets, as the store counts them for ``block_size``."""
    return [BlockSet(rs.index, block_count(rs, block_size), rs, block_size) for rs in range_sets]


@dataclass(frozen=True)
class Create:
    node: str
    block: PlanBlock


@dataclass
class Plan:
    """What to do, and what the runner may fall back to: ``spare(index)`` is the next free block of
    that range set no create aims at (for a create that meets a 409), in address order."""

    creates: list[Create] = field(default_factory=list)
    deletes: list[Record] = field(default_factory=list)
    shares: dict = field(default_factory=dict)  # range set index -> blocks per node
    held: dict = field(default_factory=dict)  # node -> records it owned before (every range set)
    _spares: dict = field(default_factory=dict, repr=False)  # range set index -> iterator of free blocks

    def spare(self, index: int) -> Optional[PlanBlock]:
        it = self._spares.get(index)
        return next(it, None) if it is not None else None


class _Held:
    """The address intervals records hold, to tell a free block (no record overlaps it)."""

    def __init__(self, records: Sequence[Record]) -> None:
        self.spans = sorted((r.first.version, int(r.first), r.last) for r in records)
        self.starts = [(v, lo) for v, lo, _ in self.spans]
        # the highest end among the spans of that family up to each index (records of other sizes may nest)
        self.reach: list = []
        for i, (v, _, hi) in enumerate(self.spans):
            before = self.reach[i - 1] if i and self.spans[i - 1][0] == v else hi
            self.reach.append(max(before, hi))

    def holds(self, b: PlanBlock) -> bool:
        i = bisect_right(self.starts, (b.first.version, b.last))  # spans starting at or before the block's end
        return i > 0 and self.spans[i - 1][0] == b.first.version and self.reach[i - 1] >= int(b.first)


def _in_set(rec: Record, bs: BlockSet) -> bool:
    return any(rec.first.version == r.family and int(rec.first) <= r.end and rec.last >= r.start
               for r in bs.range_set.ranges)


def make_plan(sets: Sequence[BlockSet], records: Sequence[Record], nodes: Sequence[str],
              blocks_per_node: Optional[int] = None) -> Plan:
    """The plan for ``nodes`` (the listed node names) given the domain's ``records``."""
    if blocks_per_node is not None and blocks_per_node < 0:
        raise PlanError("the blocks per node must not be negative", "give --blocks-per-node 0 or more")
    listed = sorted(set(nodes))
    live = set(listed)
    plan = Plan()
    plan.deletes = sorted((r for r in records if r.planned and r.free and r.owner not in live),
                          key=lambda r: (r.first.version, int(r.first), r.name))
    gone = {r.name for r in plan.deletes}
    kept = [r for r in records if r.name not in gone]
    counts = Counter(r.owner for r in kept)
    plan.held = {node: counts[node] for node in listed}
    held = _Held(kept)
    for bs in sets:
        if blocks_per_node is None and bs.count > PLAN_BLOCK_LIMIT:
            raise PlanError(f"range set {bs.index} ({bs.range_set.describe()}) has {bs.count} blocks: "
                            "too many to share out", "give the blocks each node gets with --blocks-per-node")
        if blocks_per_node is not None:
            share = blocks_per_node
        else:
            share = sum(1 for _ in bs.blocks()) // len(listed) if listed else 0
        plan.shares[bs.index] = share
        owned = Counter(r.owner for r in kept if r.owner in live and _in_set(r, bs))
        free = (b for b in bs.blocks() if not held.holds(b))
        for node in listed:
            for _ in range(max(0, share - owned[node])):
                b = next(free, None)
                if b is None:
                    break
                plan.creates.append(Create(node, b))
        plan._spares[bs.index] = free
    return plan
