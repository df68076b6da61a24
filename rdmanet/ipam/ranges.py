"""Normalised allocation ranges: a range set is a list of ranges of one family that yields one address.

Facts relied on:
- A range is ``[start, end]`` (inclusive ints) inside a subnet; the configuration step has already
  clamped it to the usable addresses and checked that start <= end.
- Blocked addresses (the merged excludes plus the gateway) are never handed out, even when
  requested by name.
- host-local's RangeIter order across the ranges of one set: continue after the last reserved
  address in its range, then the following ranges, wrap to the first, and finish with the head
  of the cursor's own range.
- Ranges never overlap (the config rejects it), so an address belongs to at most one range and
  one range set.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional, Sequence, Union

from . import intervals
from .intervals import Interval

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


def usable_bounds(subnet: IPNetwork) -> Interval:
    """network+1 .. last-1, except /31 /32 (v4) and /127 /128 (v6) where every address is usable."""
    first, last = int(subnet.network_address), int(subnet.broadcast_address)
    if subnet.prefixlen >= subnet.max_prefixlen - 1:
        return first, last
    return first + 1, last - 1


@dataclass(frozen=True)
class Range:
    """An address range inside a subnet: [start, end] as integers, its gateway, its exclusions."""

    subnet: IPNetwork
    start: int
    end: int
    gateway: Optional[IPAddress] = None
    excludes: tuple[Interval, ...] = ()

    @property
    def family(self) -> int:
        return self.subnet.version

    @cached_property
    def blocked(self) -> list[Interval]:
        extra = [(int(self.gateway), int(self.gateway))] if self.gateway is not None else []
        return intervals.merge(list(self.excludes) + extra)

    def contains(self, ip: IPAddress) -> bool:
        return ip.version == self.family and self.start <= int(ip) <= self.end

    def why_unusable(self, ip: IPAddress) -> Optional[str]:
        """None when ``ip`` may be handed out from this range, else the reason it may not."""
        if not self.contains(ip):
            return f"is outside range {self.describe()}"
        if self.gateway is not None and ip == self.gateway:
            return f"is the gateway of {self.subnet}"
        if intervals.blocked_end(int(ip), self.excludes) is not None:
            return f"is excluded from {self.subnet}"
        return None

    def address(self, value: int) -> IPAddress:
        return ipaddress.IPv4Address(value) if self.family == 4 else ipaddress.IPv6Address(value)

    def interface(self, ip: IPAddress):
        return ipaddress.ip_interface(f"{ip}/{self.subnet.prefixlen}")

    def describe(self) -> str:
        return f"{self.subnet} ({self.address(self.start)}-{self.address(self.end)})"

    def count_free(self, used: Sequence[int]) -> int:
        return intervals.count_free(self.start, self.end, self.blocked, used)


@dataclass(frozen=True)
class RangeSet:
    """One entry of the normalised config: yields exactly one address per attachment."""

    index: int
    ranges: tuple[Range, ...]
    origin: str = field(default="", compare=False)  # the config field it came from, for messages

    @property
    def family(self) -> int:
        return self.ranges[0].family

    def range_of(self, ip: IPAddress) -> Optional[Range]:
        for r in self.ranges:
            if r.contains(ip):
                return r
        return None

    def next_free(self, used: Sequence[int], cursor: Optional[IPAddress] = None) -> Optional[int]:
        """Round-robin over the ranges from the cursor; ``used`` holds this family's used ints, sorted."""
        home = None
        if cursor is not None:
            home = next((i for i, r in enumerate(self.ranges) if r.contains(cursor)), None)
        if home is None:
            for r in self.ranges:
                found = intervals.lowest_free(r.start, r.end, r.blocked, used)
                if found is not None:
                    return found
            return None
        c = int(cursor)
        r = self.ranges[home]
        found = intervals.lowest_free(c + 1, r.end, r.blocked, used)
        if found is not None:
            return found
        n = len(self.ranges)
        for step in range(1, n):
            other = self.ranges[(home + step) % n]
            found = intervals.lowest_free(other.start, other.end, other.blocked, used)
            if found is not None:
                return found
        return intervals.lowest_free(r.start, c, r.blocked, used)

    def count_free(self, used: Sequence[int]) -> int:
        return sum(r.count_free(used) for r in self.ranges)

    def describe(self) -> str:
        return ", ".join(r.describe() for r in self.ranges)
