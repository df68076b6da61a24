"""A node block's record and arithmetic: what the Lease store, the planner and the reconciler
share about blocks (:mod:`rdmanet.ipam.store.kube_blocks` is how a node acquires, borrows from and
releases them).

A block is an aligned run of ``block_size`` addresses of a range that one node has affinity to.
Its **record** is the claim Lease of the block's first usable address (``lip-<domain hash>-<ip>``,
labelled ``rdmanet.io/block-owner=<node>``).
"""

from __future__ import annotations

import ipaddress
from bisect import bisect_left
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Optional, Sequence

from .. import intervals
from ..ranges import IPAddress, Range, RangeSet
from .lease_names import (GROUP, L_BLOCK, L_BLOCK_GROUP, L_BLOCK_OWNER, L_DOMAIN, L_NODE, L_PLANNED, block_group_id,
                          block_id, domain_hash, label_value, lease_name, parse_block_id)

A_TAKEN = f"{GROUP}/taken-by-update"  # a claim made by taking a free record: its creation time is not the claim's
DEFAULT_BLOCK_SIZE = {4: 16, 6: 64}  # addresses per block (docs/lease-ipam-design.md: how to size blocks)


@dataclass(frozen=True)
class Block:
    """A node's affinity to ``size`` aligned addresses: where it looks for candidates first.
    Never a claim of its other addresses: each one's own Lease is the only proof it is taken."""

    name: str  # the record's name (``lip-…``)
    ip: IPAddress  # the block's first address (aligned; it may lie outside the usable range)
    size: int
    node: str  # the node holding it
    uid: str
    resource_version: str
    time: Optional[datetime]
    record_ip: Optional[IPAddress] = None  # the address whose claim Lease is the record
    planned: bool = False  # given to its node by a plan (``rdmanet ipam plan``): never released for being empty

    @property
    def id(self) -> str:
        return block_id(self.ip, self.size)

    @property
    def last(self) -> int:
        return int(self.ip) + self.size - 1


def record_body(body: dict, owner: str, r: Range, first: int, size: int, planned: bool = False) -> dict:
    """``body`` (a claim Lease) made the record of the ``size`` block at ``first`` of range ``r``
    held by ``owner``; ``planned``: labelled as a plan's (its node keeps it while empty). The
    claim's node label stays the claiming node's: a borrower's claim on another node's record is
    the borrower's (block ownership is not claim ownership)."""
    md = body["metadata"]
    md["labels"].update({L_BLOCK: block_id(r.address(first), size),
                         L_BLOCK_OWNER: label_value(owner), L_BLOCK_GROUP: block_group_id(r.subnet, first, size)})
    md["annotations"].update({f"{GROUP}/block-owner": owner, f"{GROUP}/block-size": str(size)})
    if planned:
        md["labels"][L_PLANNED] = "true"
    return body


def free_record_body(namespace: str, domain: str, ip: IPAddress, block: str, subnet: str, owner: str,
                     planned: bool = False) -> dict:
    """A record of block ``block`` (its id) whose address ``ip`` is free: no holder, no attachment
    or pod labels, the block held by ``owner``; ``subnet``: the range it is in, as the claims'
    ``range`` annotation spells it (its group label comes from it). What a DEL of that address
    writes, and what a plan creates (``planned``: labelled as a plan's)."""
    dhash = domain_hash(domain)
    labels = {L_DOMAIN: dhash, L_NODE: label_value(owner), L_BLOCK: block, L_BLOCK_OWNER: label_value(owner)}
    notes = {"ipam-domain": domain, "range": subnet, "ip": str(ip), "block-owner": owner,
             "freed": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    found = parse_block_id(block)
    if subnet and found is not None:
        try:
            labels[L_BLOCK_GROUP] = block_group_id(ipaddress.ip_network(subnet), int(found[0]), found[1])
            notes["block-size"] = str(found[1])
        except ValueError:
            pass
    if planned:
        labels[L_PLANNED] = "true"
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name(dhash, ip), "namespace": namespace, "labels": labels,
                         "annotations": {f"{GROUP}/{k}": v for k, v in notes.items()}},
            "spec": {}}


def block_size_in(r: Range, block_size: Optional[int]) -> int:
    """Addresses per block in range ``r`` for the config's ``block_size`` (None: the family's
    default), never more than its subnet holds."""
    size = block_size or DEFAULT_BLOCK_SIZE[r.family]
    return max(1, min(size, r.subnet.num_addresses))


def block_count(rs: RangeSet, block_size: Optional[int]) -> int:
    """How many aligned blocks the ranges of ``rs`` touch (counted range by range)."""
    total = 0
    for r in rs.ranges:
        size, net = block_size_in(r, block_size), int(r.subnet.network_address)
        total += (r.end - net) // size - (r.start - net) // size + 1
    return total


def block_position(rs: RangeSet, j: int, block_size: Optional[int]) -> tuple[Range, int]:
    """The ``j``-th block of ``rs`` (its range and first address), counting range by range."""
    for r in rs.ranges:
        size, net = block_size_in(r, block_size), int(r.subnet.network_address)
        lo, hi = (r.start - net) // size, (r.end - net) // size
        if j <= hi - lo:
            return r, net + (lo + j) * size
        j -= hi - lo + 1
    raise IndexError(j)


def record_address(r: Range, first: int, block_size: Optional[int]) -> Optional[IPAddress]:
    """The address whose claim Lease records the block at ``first`` of ``r``: its first usable
    one (None: the block has none)."""
    lo, hi = max(first, r.start), min(first + block_size_in(r, block_size) - 1, r.end)
    value = intervals.lowest_free(lo, hi, r.blocked, ()) if lo <= hi else None
    return r.address(value) if value is not None else None


def any_within(values: Sequence[int], lo: int, hi: int) -> bool:
    """Whether the sorted ``values`` hold one in ``[lo, hi]``."""
    i = bisect_left(values, lo)
    return i < len(values) and values[i] <= hi
