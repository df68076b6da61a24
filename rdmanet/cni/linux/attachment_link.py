"""Links a plugin creates in a pod netns, findable by a later DEL or repeat ADD after a kill.

A plugin killed at any instant of an ADD (the runtime's timeout, OOM, an upgrade) leaves one of
these states in the pod netns, and the next DEL or repeat ADD of the same attachment must find
each of them without any state file:

1. nothing created yet;
2. a link under the *temporary name* derived from the attachment (created, not yet renamed);
3. a link under ``CNI_IFNAME`` carrying the attachment's in-progress *marker* in ``IFLA_IFALIAS``
   (set in the same request as the rename);
4. the finished attachment: the marker says "done" (the ADD's last step).

States 2 and 3 are an unfinished ADD's leftovers: DEL and a repeat ADD remove them. State 4 is a
finished attachment: DEL removes it, a stray second ADD is refused and leaves it alone.

The temporary name is derived (never random) so state 2 is recognisable, and the marker tells
states 3 and 4 from a link of the same name someone else made. Both are pure functions
of (containerID, ifname); :func:`look_up` finds them in a netns.
"""

from __future__ import annotations

import hashlib
from typing import Optional

from . import links

IFNAMSIZ = 15  # usable characters of a Linux interface name
MARKER_PREFIX = "rdmanet:"
DONE_SUFFIX = " done"


def _digest(container_id: str, ifname: str) -> str:
    return hashlib.sha256(f"{container_id}/{ifname}".encode()).hexdigest()


def temporary_name(prefix: str, container_id: str, ifname: str) -> str:
    """``prefix`` + hex digits of the attachment's hash, filling the 15 characters a name has."""
    if not 1 <= len(prefix) <= 5:
        raise ValueError(f"temporary name prefix {prefix!r} must be 1-5 characters")
    return prefix + _digest(container_id, ifname)[: IFNAMSIZ - len(prefix)]


def marker(container_id: str, ifname: str, *, done: bool = False) -> str:
    """The ``IFLA_IFALIAS`` value that says "made by rdmanet for this attachment": while the ADD
    runs, and with ``done`` once it finished (the last step of an ADD)."""
    base = MARKER_PREFIX + _digest(container_id, ifname)[:32]
    return base + DONE_SUFFIX if done else base


def is_ours(alias: str, container_id: str, ifname: str) -> bool:
    return alias in (marker(container_id, ifname), marker(container_id, ifname, done=True))


def look_up(ipr, prefix: str, kind: str, container_id: str, ifname: str) -> tuple[list, Optional[links.Link]]:
    """What this attachment's links in the netns of ``ipr`` are, one lookup per name:
    ``(leftovers, named)``. ``leftovers``: links of kind ``kind`` that an unfinished ADD of this
    attachment left, the one under the temporary name and the one under ``ifname`` that carries
    this attachment's in-progress marker. ``named``: the link under ``ifname`` when it is not a
    leftover (a finished attachment's link with the done marker, or a link that is not ours),
    else None."""
    found = []
    tmp = links.find_link(ipr, temporary_name(prefix, container_id, ifname))
    if tmp is not None and tmp.kind == kind:
        found.append(tmp)
    named = links.find_link(ipr, ifname)
    if named is not None and named.kind == kind and named.alias == marker(container_id, ifname):
        found.append(named)
        named = None
    return found, named


def is_done(alias: str) -> bool:
    """True for a finished attachment's marker (of any attachment)."""
    return alias.startswith(MARKER_PREFIX) and alias.endswith(DONE_SUFFIX)
