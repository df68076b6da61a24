"""A claim Lease as the Kubernetes store reads it (:class:`Claim`: the claim of a block's first
usable address is also the block's record), and what an ADD keeps of a List of them
(:class:`DomainScan`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Iterable, Optional

from ..ranges import IPAddress
from .base import Attachment
from .block_records import Block, parse_block
from .lease_names import (GROUP, L_BLOCK, L_BLOCK_OWNER, L_DOMAIN, L_NODE, L_PLANNED, ip_of_name, label_value,
                          parse_block_id, parse_holder, parse_time)


@dataclass(frozen=True)
class PodInfo:
    namespace: str = ""
    name: str = ""
    uid: str = ""


@dataclass(frozen=True, slots=True)  # a daemon's cache holds one per Lease: no per-instance dict
class Claim:
    name: str
    ip: IPAddress
    attachment: Optional[Attachment]
    uid: str
    resource_version: str
    network: str
    time: Optional[datetime]
    range: str = ""  # the subnet annotation: the range the claim was made in (the round-robin cursor)
    block: str = ""  # a block record (the claim Lease of a block's first usable address): the block's id
    owner: str = ""  # a block record: the node that holds the block
    planned: bool = False  # a block record a plan gave its node (``rdmanet ipam plan``): kept while empty

    @property
    def free(self) -> bool:
        """A block record that names no attachment: its address is free, its block still held."""
        return bool(self.block) and self.attachment is None

    def as_block(self) -> Optional[Block]:
        """The block this record holds (None: not a record)."""
        found = parse_block_id(self.block) if self.block else None
        if found is None:
            return None
        return Block(self.name, found[0], found[1], self.owner, self.uid, self.resource_version, self.time, self.ip,
                     self.planned)


def parse_claim(item: Any, dhash: str) -> Optional[Claim]:
    """The claim a Lease of domain ``dhash`` records; None for anything else."""
    if not isinstance(item, dict):
        return None
    md = item.get("metadata") or {}
    name = md.get("name") or ""
    ip = ip_of_name(name, dhash)
    if ip is None:
        return None
    spec = item.get("spec") or {}
    notes = md.get("annotations") or {}
    when = parse_time(spec.get("acquireTime")) or parse_time(md.get("creationTimestamp"))
    block = owner = ""
    labels = md.get("labels") or {}
    if labels.get(L_BLOCK_OWNER):  # a block record: its block and owner
        block, owner = str(labels.get(L_BLOCK) or ""), str(notes.get(f"{GROUP}/block-owner") or "")
    return Claim(name, ip, parse_holder(spec.get("holderIdentity")), str(md.get("uid") or ""),
                 str(md.get("resourceVersion") or ""), sys.intern(str(notes.get(f"{GROUP}/network") or "")), when,
                 sys.intern(str(notes.get(f"{GROUP}/range") or "")),  # shared by every claim of a network
                 block, owner, bool(block) and labels.get(L_PLANNED) == "true")


def parse_lease(item: Any, dhash: str) -> Any:
    """A :class:`Claim`, a :class:`Block`, or None (another domain's or another program's Lease)."""
    return parse_claim(item, dhash) or parse_block(item, dhash)


def latest_by_range(claims: Iterable[Claim]) -> dict[str, Claim]:
    """The most recently made claim per range (its ``range`` annotation): the round-robin cursor."""
    out: dict[str, Claim] = {}
    for c in claims:
        if c.time is None or not c.range:
            continue
        best = out.get(c.range)
        if best is None or (c.time, int(c.ip)) > (best.time, int(best.ip)):
            out[c.range] = c
    return out


class DomainScan:
    """What an ADD keeps of a List of its domain, folded page by page: the used addresses (as
    ints), the attachment's own claims, the round-robin cursor per range, and the holders of the
    requested addresses. Never the whole List."""

    def __init__(self, attachment: Optional[Attachment], wanted: set) -> None:
        self.attachment = attachment
        self.wanted = wanted
        self.used: dict[int, list[int]] = {4: [], 6: []}
        self.mine: list[Claim] = []
        self.by_ip: dict[IPAddress, Claim] = {}
        self.latest: dict[str, Claim] = {}
        self.free: dict[int, Claim] = {}  # free block records by address: taken by an update, not a create
        self.blocks: list[Block] = []  # the blocks the records among these claims hold

    def add(self, c: Claim) -> None:
        if c.block:
            block = c.as_block()
            if block is not None:
                self.blocks.append(block)
            if c.attachment is None:
                self.free[int(c.ip)] = c
                return
        self.used[c.ip.version].append(int(c.ip))
        if self.attachment is not None and c.attachment == self.attachment:
            self.mine.append(c)
        if c.ip in self.wanted:
            self.by_ip[c.ip] = c
        if c.time is not None and c.range:
            best = self.latest.get(c.range)
            if best is None or (c.time, int(c.ip)) > (best.time, int(best.ip)):
                self.latest[c.range] = c

    def sorted_used(self) -> dict[int, list[int]]:
        for values in self.used.values():
            values.sort()
        return self.used


def node_selector(dhash: str, node: str) -> str:
    """A node's own objects of a domain: its claims (borrowed ones too) and its blocks."""
    return f"{L_DOMAIN}={dhash},{L_NODE}={label_value(node)}"
