"""A node's blocks when another allocator assigned some of them: nv-ipam's controller gives each node
one block of an IPPool (or one prefix of a CIDRPool), and while its node agents may still
allocate on other nodes, a node must allocate inside its own block only (docs/lease-ipam.md,
"Coming from nv-ipam").

For such a range set (its index in ``assigned``; the range set *is* the node's block):
- candidates are its own addresses (:meth:`AssignedBlocks.own`), claimed one Lease each by create
  as everywhere else, so the create stays the only arbiter;
- no lease-ipam block is acquired in it (it has no block to count: ``_block_count`` is 0), and
  nothing outside it is ever tried: "borrowing" is only the last look at the domain's claims
  inside the block (a claim the node's view missed, freed since) before 102 is answered.
Every other range set (a pool in lease-ipam's mode, or a plain range) keeps lease-ipam's own
blocks (:class:`.kube_blocks.NodeBlocks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

from rdmanet.cni.core.errors import POOL_EXHAUSTED, CNIError

from ..ranges import IPAddress, RangeSet
from .base import Attachment
from .block_records import Block
from .kube_blocks import NodeBlocks

if TYPE_CHECKING:
    from .claims import Claim
    from .domain_leases import DomainLeases


class AssignedBlocks(NodeBlocks):
    """Node ``node``'s blocks, the range sets whose index is in ``assigned`` being blocks another
    allocator gave the node (see the module docstring)."""

    def __init__(self, leases: "DomainLeases", node: str, assigned: frozenset[int], block_size: Optional[int] = None,
                 block_release: float = 300.0) -> None:
        super().__init__(leases, node, block_size, block_release)
        self.assigned = assigned

    def own(self, rs: RangeSet, blocks: Sequence[Block]) -> Optional[RangeSet]:
        return rs if rs.index in self.assigned else super().own(rs, blocks)

    def _block_count(self, rs: RangeSet) -> int:
        return 0 if rs.index in self.assigned else super()._block_count(rs)

    def _log_borrowed(self, rs: RangeSet, ip: IPAddress) -> None:
        if rs.index not in self.assigned:
            super()._log_borrowed(rs, ip)

    def borrow(self, rs: RangeSet, attachment: Attachment, network: str, blocks: list[Block],
               deadline: float) -> "Claim":
        try:
            return super().borrow(rs, attachment, network, blocks, deadline)
        except CNIError as err:
            if rs.index not in self.assigned or err.code != POOL_EXHAUSTED:
                raise
            raise CNIError(POOL_EXHAUSTED, f"no free address in node {self.node}'s assigned block {rs.describe()} "
                                           f"({rs.origin}): nv-ipam's controller assigns the blocks, and no node "
                                           "allocates outside its own while nv-ipam may run",
                           "free addresses on this node (DEL or GC attachments that are gone), or the pool's owner "
                           "raises perNodeBlockSize; once nv-ipam is gone, annotating the pool "
                           "rdmanet.io/node-blocks=lease-ipam lets nodes use lease-ipam's blocks and borrow") from None
