"""What CHECK starts from: the ADD result the runtime passes back as prevResult."""

from __future__ import annotations

from typing import Any, Optional

from .errors import INVALID_CONFIG, CNIError, check_failed
from .invocation import Invocation
from .result import Interface, Result


def previous(prev_result: Optional[dict[str, Any]], inv: Invocation) -> tuple[Result, Interface, int]:
    """prevResult, its interface for (CNI_IFNAME, CNI_NETNS) and that interface's index."""
    if prev_result is None:
        raise CNIError(INVALID_CONFIG, "CHECK: required prevResult missing", "the runtime passes the ADD result as prevResult")
    prev = Result.from_json(prev_result, "prevResult")
    expected = next((i for i in prev.interfaces if i.name == inv.ifname and i.sandbox == inv.netns), None)
    if expected is None:
        raise check_failed(f"prevResult has no interface {inv.ifname} in sandbox {inv.netns}")
    return prev, expected, prev.interfaces.index(expected)
