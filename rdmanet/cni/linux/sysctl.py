"""Per-interface sysctls, written in the namespace the calling thread is in."""

from __future__ import annotations

from typing import Optional


def set_interface_sysctl(family: str, ifname: str, key: str, value: str) -> bool:
    """Write /proc/sys/net/<family>/conf/<ifname>/<key>; False when the kernel lacks it
    (e.g. IPv6 disabled), which callers treat as "not applicable"."""
    try:
        with open(f"/proc/sys/net/{family}/conf/{ifname}/{key}", "w") as f:
            f.write(value)
        return True
    except FileNotFoundError:
        return False


def get_interface_sysctl(family: str, ifname: str, key: str) -> Optional[str]:
    """/proc/sys/net/<family>/conf/<ifname>/<key>; None when the kernel lacks it."""
    try:
        with open(f"/proc/sys/net/{family}/conf/{ifname}/{key}") as f:
            return f.read().strip()
    except FileNotFoundError:
        return None
