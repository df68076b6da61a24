"""The deadline of the CNI call being served, and whether its caller is still waiting.

A runtime gives a CNI call a bounded time (kubelet's CRI calls: ``--runtime-request-timeout``,
2 min by default) and then kills the plugin and sends DEL. A call that goes on after that (waiting
for a lock, or for a slow foreign IPAM) would finish an ADD nobody waits for, after the DEL that
was meant to undo it. So every call has a :class:`Deadline`, shorter than a runtime's
(:data:`DEFAULT_SECONDS`), that bounds every wait (locks, IPAM execs) and, in the node daemon, also
knows whether the caller hung up (the shim was killed: its connection closed).

Verbs that build something (ADD) call :func:`check` at their step boundaries: past the deadline or
with the caller gone it raises :class:`Abandoned` (CNI error 11, try again later), and the verb
undoes what it had done. Verbs that undo (DEL, GC) use the deadline only to bound their waits: an
undo is better finished than abandoned.

:func:`handle` (rdmanet.cni.core.skel) sets the call's deadline for its duration (a contextvar, per
thread); outside a call :func:`current` gives a fresh default one. Pure logic: no kernel I/O.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Optional

from .errors import TRY_AGAIN_LATER, CNIError

DEFAULT_SECONDS = 50.0  # well below kubelet's 2 min; a node owner may change it (RDMANET_CALL_TIMEOUT)
TIMEOUT_ENV = "RDMANET_CALL_TIMEOUT"


class Abandoned(CNIError):
    """The call ran out of time or its caller went away; what it had done is being undone."""

    def __init__(self, msg: str, details: str = "") -> None:
        super().__init__(TRY_AGAIN_LATER, msg, details)


def _never() -> bool:
    return False


@dataclass
class Deadline:
    """``expires`` on the monotonic clock; ``caller_gone`` says whether nobody waits any more."""

    expires: float
    caller_gone: Callable[[], bool] = field(default=_never)

    @classmethod
    def after(cls, seconds: float, caller_gone: Callable[[], bool] = _never) -> "Deadline":
        return cls(time.monotonic() + seconds, caller_gone)

    def remaining(self) -> float:
        return max(0.0, self.expires - time.monotonic())

    def reason(self) -> Optional[str]:
        """Why the call should stop now, or None."""
        if self.caller_gone():
            return "the caller went away (the runtime killed the plugin or gave up on the call)"
        if time.monotonic() >= self.expires:
            return "the call ran out of time"
        return None

    def check(self, step: str) -> None:
        """Raise :class:`Abandoned` before ``step`` when the call should stop."""
        why = self.reason()
        if why is not None:
            raise Abandoned(f"{why} before {step}", "what the call had done is undone; the runtime retries it")


def seconds_from(environ: Mapping[str, str]) -> float:
    """The call timeout the environment asks for (``RDMANET_CALL_TIMEOUT``), else the default."""
    try:
        value = float(environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return DEFAULT_SECONDS
    return value if value > 0 else DEFAULT_SECONDS


_current: ContextVar[Optional[Deadline]] = ContextVar("rdmanet_call_deadline", default=None)


def active() -> Optional[Deadline]:
    """The deadline of the call being served, None outside a call."""
    return _current.get()


def current() -> Deadline:
    """The deadline of the call being served (outside a call: a default one from now)."""
    found = _current.get()
    return found if found is not None else Deadline.after(seconds_from(os.environ))


def check(step: str) -> None:
    current().check(step)


@contextmanager
def scoped(deadline: Deadline) -> Iterator[Deadline]:
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)
