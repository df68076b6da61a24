"""The store interface of lease-ipam: whole operations on one allocation domain.

A store owns the reservations of one domain (the ``network_name``, by default the network's
name). Every method is one complete, serialised operation, so a store may implement it with a
file lock (the local store) or with per-address claims made by atomic create (the Kubernetes
Lease store: POST a claim, 201 = ours, 409 = taken, try the next candidate).

Contract every store keeps:
- ``allocate`` returns one address per range set, in range-set order. It is all or nothing:
  when any range set fails, nothing new is left reserved. A repeat call for the same attachment
  returns the addresses it already holds. A requested address that another attachment holds is
  an error (code 103); a range set without a free address is an error (code 102).
- ``release`` is idempotent and succeeds when nothing is reserved; it removes only claims that
  name the attachment, never one re-made for another attachment.
- ``gc`` frees the reservations recorded for ``network`` whose attachment is not in ``valid``;
  reservations recorded for other networks sharing the domain are left alone.
- Failures are :class:`rdmanet.cni.core.errors.CNIError` (5 I/O, 11 try again, 50 unavailable, 102, 103).
Candidate choice is shared: :meth:`rdmanet.ipam.ranges.RangeSet.next_free` from a per-range-set cursor.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TypeVar

from rdmanet.cni.core.errors import ADDRESS_UNAVAILABLE, CNIError

from ..ranges import IPAddress, RangeSet


@dataclass(frozen=True, order=True)
class Attachment:
    """What CNI keys a reservation by: (CNI_CONTAINERID, CNI_IFNAME)."""

    container_id: str
    ifname: str

    def __str__(self) -> str:
        return f"{self.container_id}/{self.ifname}"


@dataclass(frozen=True)
class Reservation:
    """The addresses one attachment holds, as the store recorded them at ADD."""

    attachment: Attachment
    network: str  # the CNI network name given at ADD
    addresses: tuple[IPAddress, ...]
    time: str = ""  # ISO 8601 UTC time of the ADD


@dataclass(frozen=True)
class Usage:
    """What a store knows of a network's addresses without asking anyone (for metrics): per range
    set the addresses in use and free, and the node blocks this node holds (the Lease store)."""

    used: tuple[int, ...]
    free: tuple[int, ...]
    blocks: Optional[int] = None


class Store(abc.ABC):
    @abc.abstractmethod
    def allocate(self, attachment: Attachment, network: str, range_sets: Sequence[RangeSet],
                 requested: Mapping[int, IPAddress]) -> list[IPAddress]:
        """Reserve one address per range set (``requested`` maps a range-set index to an address)."""

    @abc.abstractmethod
    def release(self, attachment: Attachment) -> list[IPAddress]:
        """Free everything the attachment holds; returns what was freed (empty when nothing was)."""

    @abc.abstractmethod
    def find(self, attachment: Attachment) -> Optional[Reservation]:
        """The attachment's reservation (only addresses whose claim still names it), or None."""

    @abc.abstractmethod
    def list(self) -> list[Reservation]:
        """Every reservation in the domain."""

    @abc.abstractmethod
    def gc(self, network: str, valid: set[Attachment]) -> list[Reservation]:
        """Free the reservations of ``network`` whose attachment is not in ``valid``; returns them."""

    @abc.abstractmethod
    def status(self, range_sets: Sequence[RangeSet]) -> list[int]:
        """Free-address counts per range set; raises CNIError 50 when the store cannot serve ADD."""

    def usage(self, range_sets: Sequence[RangeSet]) -> Optional[Usage]:
        """The store's counts from what this process holds already (no request, no lock wait);
        None when it holds nothing to count from."""
        return None


H = TypeVar("H")


def place_held(held: Iterable[H], range_sets: Sequence[RangeSet], ip_of: Callable[[H], Any]) -> tuple[dict[int, H], list[H]]:
    """What an attachment already holds, placed on the range sets of the current config: each
    held item goes to the first range set that contains its address and has none yet; the rest
    (a config changed since ADD) are spare, for the store to release."""
    placed: dict[int, H] = {}
    spare: list[H] = []
    for item in held:
        rs = next((rs for rs in range_sets if rs.index not in placed and rs.range_of(ip_of(item)) is not None), None)
        if rs is None:
            spare.append(item)
        else:
            placed[rs.index] = item
    return placed, spare


def refuse_other_request(attachment: Attachment, rs: RangeSet, held: Any, wanted: Any) -> None:
    """A repeat ADD may not ask for a different address than the one it holds in a range set."""
    if wanted is not None and wanted != held:
        raise CNIError(ADDRESS_UNAVAILABLE,
                       f"requested address {wanted}: attachment {attachment} already holds {held} in {rs.describe()}",
                       "DEL the attachment before asking for another address")
