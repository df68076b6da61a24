"""The addresses nv-ipam's node agent handed out on this node, read from its store file, so that
lease-ipam never gives one of them again while the pods that got them still run.

nv-ipam records each address only in its node agent's file (never in the API), so a node can see
the addresses nv-ipam gave on this node only: lease-ipam takes every address the file records as
taken, in either mode (docs/lease-ipam.md, "Coming from nv-ipam").

Facts relied on (nv-ipam's node store, ``pkg/ipam-node/types``; its default path):
- The file is ``/var/lib/cni/nv-ipam/store``, JSON ``{"version": 1, "checksum": ...,
  "pools": {<pool>: {"name": ..., "entries": {"<containerID>_<ifname>": {"container_id": ...,
  "interface_name": ..., "ip_address": "192.168.5.2", "metadata": {...}}}, ...}}}``.
- The agent replaces the file atomically (a temporary file renamed over it), so a reader never
  sees half of it. A reservation released but kept for a cooldown (``released_at`` set) still
  blocks its address; it is taken here as well.
- No file: nv-ipam never ran on this node (or its store was removed), so it holds nothing.
"""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any

from rdmanet.cni.core.errors import IO_FAILURE, CNIError

from .ranges import IPAddress

STORE_FILE = "/var/lib/cni/nv-ipam/store"
MAX_BYTES = 64 << 20  # a reservation is a few hundred bytes: far more than any node holds


def _unusable(path: str, why: str) -> CNIError:
    return CNIError(IO_FAILURE, f"nv-ipam's node store {path} {why}: the addresses nv-ipam gave on this node are "
                                "unknown, so none is handed out",
                    "let nv-ipam's node agent rewrite it, or remove the file once no pod on this node holds an address "
                    "nv-ipam gave (see docs/lease-ipam.md, \"Coming from nv-ipam\")")


def _read(path: str) -> Any:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _unusable(path, f"cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise _unusable(path, f"is larger than {MAX_BYTES} bytes")
    try:
        return json.loads(data)
    except ValueError:
        raise _unusable(path, "is not JSON") from None


def _entries(doc: Any, path: str) -> list[Any]:
    pools = doc.get("pools") if isinstance(doc, dict) else None
    if not isinstance(pools, dict) or not all(isinstance(p, dict) for p in pools.values()):
        raise _unusable(path, 'has no "pools" object')
    out = []
    for pool in pools.values():
        entries = pool.get("entries") or {}
        if not isinstance(entries, dict):
            raise _unusable(path, 'has a pool whose "entries" is not an object')
        out += entries.values()
    return out


def held_addresses(path: str = "") -> tuple[IPAddress, ...]:
    """Every address the store file at ``path`` (default :data:`STORE_FILE`) records; CNI error 5
    when the file exists and cannot be read as nv-ipam writes it."""
    path = path or STORE_FILE
    doc = _read(path)
    if doc is None:
        return ()
    out = []
    for entry in _entries(doc, path):
        try:
            out.append(ipaddress.ip_address(entry["ip_address"]))
        except (TypeError, KeyError, ValueError):
            raise _unusable(path, f"has a reservation without a valid ip_address: {json.dumps(entry)[:200]}") from None
    return tuple(out)
