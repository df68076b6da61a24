"""Per-interface sysctls, written in the namespace the calling thread is in."""

from __future__ import annotations


def set_interface_sysctl(family: str, ifname: str, key: str, value: str) -> bool:
    """Write /proc/sys/net/<family>/conf/<ifname>/<key>; False when the kernel lacks it
    (e.g. IPv6 disabled), which callers treat as "not applicable"."""
    try:
        with open(f"/proc/sys/net/{family}/conf/{ifname}/{key}", "w") as f:
            f.write(value)
        return True
    except FileNotFoundError:
        return False
