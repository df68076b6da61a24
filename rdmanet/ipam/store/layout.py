"""Names and documents of the local store's directory (see ``local.py`` for the layout).

Facts relied on: CNI container IDs match ``^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$`` and interface names
cannot contain ':' or '/', so ``<containerID>:<ifname>`` names one attachment unambiguously;
NAME_MAX is 255 bytes, so longer keys are hashed. ``str(ipaddress.ip_address(x))`` is the
canonical spelling (dotted quad, RFC 5952 IPv6) and is the only spelling read back as an address.
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Any, Iterable, Optional

from ..ranges import IPAddress
from .base import Attachment, Reservation

LOCK_NAME = "lock"
CURSOR_PREFIX = "last_reserved."
INDEX_DIR = "attachments"
_MAX_INDEX_NAME = 200  # bytes; NAME_MAX is 255


def index_name(attachment: Attachment) -> str:
    """``<containerID>:<ifname>``: neither part may contain ':' (CNI validation), so it is unambiguous."""
    name = f"{attachment.container_id}:{attachment.ifname}"
    if len(name.encode()) > _MAX_INDEX_NAME:
        return "sha256-" + hashlib.sha256(name.encode()).hexdigest()
    return name


def owner_of(doc: Any) -> Optional[Attachment]:
    """The attachment a claim or index document names, or None (garbage, foreign file)."""
    if isinstance(doc, dict) and isinstance(doc.get("containerID"), str) and isinstance(doc.get("ifname"), str):
        return Attachment(doc["containerID"], doc["ifname"])
    return None


def reservations_of(claims: Iterable[tuple[IPAddress, Any]]) -> list[Reservation]:
    """The reservations that address files (address, document) make up, grouped by attachment;
    files naming no attachment are left out."""
    groups: dict[Attachment, tuple[str, list[IPAddress], str]] = {}
    for ip, doc in claims:
        who = owner_of(doc)
        if who is not None:
            network, ips, when = groups.setdefault(who, (str(doc.get("network", "")), [], str(doc.get("time", ""))))
            ips.append(ip)
    return [Reservation(who, network, tuple(sorted(ips, key=lambda ip: (ip.version, ip))), when)
            for who, (network, ips, when) in sorted(groups.items())]


def listed_addresses(doc: Any) -> list[IPAddress]:
    """The ``addresses`` of an index document; entries that are not addresses are skipped."""
    out = []
    if isinstance(doc, dict) and isinstance(doc.get("addresses"), list):
        for text in doc["addresses"]:
            try:
                out.append(ipaddress.ip_address(text))
            except (TypeError, ValueError):
                continue
    return out


def address_name(name: str) -> Optional[IPAddress]:
    """The address a directory entry stands for; only canonical spellings count."""
    if name.startswith(".") or name == LOCK_NAME or name == INDEX_DIR or name.startswith(CURSOR_PREFIX):
        return None
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return None
    return ip if str(ip) == name else None
