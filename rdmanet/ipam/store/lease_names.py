"""Names and labels of lease-ipam's Leases: a claim per address (``lip-<domain hash>-<ip>``; the
claim of a block's first usable address is also the block's record, labelled ``block-owner``),
and the holder string of an attachment.

The names are derived from what they stand for, so any node computes the same name for the same
address: the API server's create of that name is the arbiter.
"""

from __future__ import annotations

import email.utils
import hashlib
import ipaddress
import re
from datetime import datetime, timezone
from typing import Any, Optional

from ..ranges import IPAddress
from .base import Attachment

NAME_PREFIX = "lip"
GROUP = "rdmanet.io"
L_DOMAIN = f"{GROUP}/ipam-domain"
L_NETWORK = f"{GROUP}/network"
L_NODE = f"{GROUP}/node"
L_ATTACHMENT = f"{GROUP}/attachment"
L_POD_UID = f"{GROUP}/pod-uid"
L_BLOCK = f"{GROUP}/block"
L_BLOCK_OWNER = f"{GROUP}/block-owner"  # on a block record: the node holding the block
L_BLOCK_GROUP = f"{GROUP}/block-group"  # on a block record: the group of BLOCK_GROUP blocks it is in
L_PLANNED = f"{GROUP}/planned"  # on a block record made by `rdmanet ipam plan` ("true"): its node keeps it while empty
BLOCK_GROUP = 64  # blocks per group: a List of one group's records reads at most this many Leases
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

def domain_hash(domain: str) -> str:
    return hashlib.sha256(domain.encode()).hexdigest()[:16]


def attachment_hash(attachment: Attachment) -> str:
    return hashlib.sha224(str(attachment).encode()).hexdigest()  # 56 hex: fits a label value


def label_value(text: str) -> str:
    """``text`` when it is a valid label value, else ``h-`` and 40 hex of its sha256."""
    if text and len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    return "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def spell(ip: IPAddress) -> str:
    return str(ip) if ip.version == 4 else f"{int(ip):032x}"


def lease_name(dhash: str, ip: IPAddress) -> str:
    return f"{NAME_PREFIX}-{dhash}-{spell(ip)}"


def block_id(first: IPAddress, size: int) -> str:
    """A block's label value: its first address and its size (``10.0.0.16-16``)."""
    return f"{spell(first)}-{size}"


def parse_block_id(text: str) -> Optional[tuple[IPAddress, int]]:
    """(first address, size) of a block id (``10.0.0.16-16``); None for anything else."""
    spelled, _, size = text.rpartition("-")
    first = _parse_spelled(spelled)
    if first is None or not size.isdigit() or not 0 < int(size) <= (1 << 30) or str(int(size)) != size:
        return None
    return first, int(size)


def block_group_id(subnet: Any, first: int, size: int) -> str:
    """The label value of the group of ``BLOCK_GROUP`` aligned blocks that holds the block at ``first``."""
    span = size * BLOCK_GROUP
    net = int(subnet.network_address)
    start = net + (first - net) // span * span
    return f"{spell(ipaddress.IPv4Address(start) if subnet.version == 4 else ipaddress.IPv6Address(start))}-{span}"


def block_first(subnet: Any, value: int, size: int) -> int:
    """The first address of the ``size``-aligned block (counted from the subnet's network
    address) that holds ``value``."""
    net = int(subnet.network_address)
    return net + (value - net) // size * size


def _parse_spelled(rest: str) -> Optional[IPAddress]:
    try:
        if "." in rest:
            ip = ipaddress.IPv4Address(rest)
            return ip if str(ip) == rest else None
        if len(rest) == 32 and re.fullmatch(r"[0-9a-f]{32}", rest):
            return ipaddress.IPv6Address(int(rest, 16))
    except ValueError:
        return None
    return None


def ip_of_name(name: str, dhash: str) -> Optional[IPAddress]:
    """The address a Lease name of this domain stands for; None for any other name."""
    prefix = f"{NAME_PREFIX}-{dhash}-"
    if not name.startswith(prefix):
        return None
    return _parse_spelled(name[len(prefix):])


def holder_of(attachment: Attachment) -> str:
    return f"{attachment.container_id}/{attachment.ifname}"


def parse_holder(text: Any) -> Optional[Attachment]:
    """``<containerID>/<ifname>``: a container ID never holds '/', so the first '/' splits."""
    if not isinstance(text, str) or "/" not in text:
        return None
    cid, ifname = text.split("/", 1)
    return Attachment(cid, ifname) if cid and ifname else None


def _now_micro() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def server_date(headers: Any) -> Optional[datetime]:
    """The API server's time from an answer's ``Date`` header (None: none, or unreadable): what
    every cleaner judges age and the spacing of checks by, never the node's clock."""
    try:
        value = headers.get("Date") or headers.get("date")
    except AttributeError:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value) if isinstance(value, str) else None
    except (TypeError, ValueError):
        return None
    return when if when is not None and when.tzinfo is not None else None


def parse_time(text: Any) -> Optional[datetime]:
    """An API timestamp (RFC 3339: ``2024-05-01T10:00:00Z``, a MicroTime's fraction too)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
