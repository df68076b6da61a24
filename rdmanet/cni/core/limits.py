"""Bounds on what one call may ask of a plugin (and of the node daemon serving it).

A network config may be written by a tenant, and in a cluster every call is served by one
long-lived root daemon: no config may make it hang or grow. So, before any plugin looks at it,
the stdin of a call is refused (CNI error 7, naming the limit and where it was passed) when it is
larger than :data:`MAX_CONFIG_BYTES`, nested deeper than :data:`MAX_DEPTH`, or holds a list
(ranges, exclusions, routes, DNS entries, prevResult's addresses, ...) or an object with more
than :data:`MAX_ITEMS` entries. Real configs are a few KiB with lists of tens of entries.
"""

from __future__ import annotations

from typing import Any

from .errors import INVALID_CONFIG, CNIError

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: Multus' own configs and prevResults are a few KiB
MAX_DEPTH = 32  # nesting of JSON objects and lists
MAX_ITEMS = 1024  # entries of any one list or object

FIX = "a network config is a few KiB with lists of tens of entries; split the network or shorten the list"


def check_size(stdin: bytes) -> None:
    if len(stdin) > MAX_CONFIG_BYTES:
        raise CNIError(INVALID_CONFIG, f"network config on stdin is larger than {MAX_CONFIG_BYTES} bytes "
                       f"({len(stdin)} bytes read)", FIX)


def _where(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the config"


def check_shape(document: Any) -> None:
    """Depth and breadth of a decoded config, walked without recursion."""
    stack: list[tuple[Any, tuple]] = [(document, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            children = [(v, path + (k,)) for k, v in node.items()]
        elif isinstance(node, list):
            children = [(v, path + (i,)) for i, v in enumerate(node)]
        else:
            continue
        if len(children) > MAX_ITEMS:
            raise CNIError(INVALID_CONFIG, f"invalid network config: {_where(path)} has {len(children)} entries; "
                           f"at most {MAX_ITEMS} are accepted", FIX)
        if len(path) >= MAX_DEPTH and children:
            raise CNIError(INVALID_CONFIG, f"invalid network config: {_where(path[:8])}... is nested deeper than "
                           f"{MAX_DEPTH} levels", FIX)
        stack.extend(children)
