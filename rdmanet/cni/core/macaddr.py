"""MAC addresses in configs and CNI_ARGS, and the precedence runtimes expect."""

from __future__ import annotations

import re
from typing import Optional

from .args import split_list
from .errors import INVALID_CONFIG, CNIError
from .invocation import Invocation

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}([:-][0-9a-fA-F]{2}){5}$")


def normalize_mac(value: str, field: str) -> str:
    if not _MAC_RE.match(value):
        raise ValueError(f"{value!r} is not a MAC address like 0a:58:0a:01:01:05 ({field})")
    mac = value.replace("-", ":").lower()
    if int(mac[:2], 16) & 1:
        raise ValueError(f"{value!r} is a multicast MAC address; use a unicast one ({field})")
    return mac


def effective_mac(config_mac: Optional[str], runtime_mac: Optional[str], inv: Invocation) -> Optional[str]:
    """config ``mac`` < CNI_ARGS ``MAC`` < ``runtimeConfig.mac`` (Go macvlan and sriov-cni)."""
    mac = config_mac
    for value, where in ((inv.args.get("MAC"), "CNI_ARGS MAC"), (runtime_mac, "runtimeConfig.mac")):
        if value:
            try:
                mac = normalize_mac(split_list(value)[0] if where.startswith("CNI") else value, where)
            except ValueError as exc:
                raise CNIError(INVALID_CONFIG, f"invalid network config: {exc}", "give a unicast MAC address such as 0a:58:0a:01:01:05") from None
    return mac
