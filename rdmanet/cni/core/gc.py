"""The GC verb's keep-list (CNI 1.1: ``cni.dev/valid-attachments``; libcni also sends the legacy
``cni.dev/attachments``)."""

from __future__ import annotations

from typing import Optional

from .errors import INVALID_CONFIG, CNIError

VALID_KEY = "cni.dev/valid-attachments"
LEGACY_VALID_KEY = "cni.dev/attachments"


def valid_attachments(config: dict) -> Optional[set[tuple[str, str]]]:
    """{(containerID, ifname)} to keep, or None when the config carries neither key.

    None is not an empty list: cnitool sends GC without the key after DELing its own cached
    attachments, and freeing everything then would also free other runtimes' attachments.
    """
    key = VALID_KEY if VALID_KEY in config else LEGACY_VALID_KEY if LEGACY_VALID_KEY in config else None
    if key is None:
        return None
    value = config[key]
    if not isinstance(value, list):
        raise CNIError(INVALID_CONFIG, f"{key} must be a list", 'e.g. [{"containerID": "abc", "ifname": "net1"}]')
    out = set()
    for i, item in enumerate(value):
        if not (isinstance(item, dict) and isinstance(item.get("containerID"), str) and isinstance(item.get("ifname"), str)):
            raise CNIError(INVALID_CONFIG, f"{key}[{i}] must be an object with string containerID and ifname",
                           'e.g. {"containerID": "abc", "ifname": "net1"}')
        out.add((item["containerID"], item["ifname"]))
    return out
