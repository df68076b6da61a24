"""Undo steps of a failed ADD.

:func:`quietly` runs one step and logs its failure, never raises: it cannot hide the error that
made the ADD fail.

:class:`Undo` is the rollback of a verb whose failure must not lose track of the host: each undo
step is registered *before* the act it undoes (so it must cope with "the act never happened"),
:meth:`Undo.run` runs them newest first, every one of them even after a failure, and returns the
failures, so the caller can keep its state ("needs repair") instead of forgetting a device it
could not put back.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger("rdmanet")


def quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:  # rollback must not hide the original error
        log.warning("rollback step %s failed: %s", getattr(fn, "__name__", fn), exc)


def _describe(exc: BaseException) -> str:
    return getattr(exc, "msg", None) or f"{type(exc).__name__}: {exc}"


class Undo:
    """A stack of undo steps; ``callback`` has ExitStack's signature (IPAM.add_into uses it)."""

    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[..., Any], tuple]] = []

    def push(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        self._steps.append((what, fn, args))

    def callback(self, fn: Callable[..., Any], *args: Any) -> None:
        inner = args[0] if fn is quietly and args else fn
        self.push(getattr(inner, "__qualname__", repr(inner)), fn, *args)

    def dismiss(self) -> None:
        """The verb succeeded: nothing is to be undone."""
        self._steps.clear()

    def run(self) -> list[str]:
        """Run every step, newest first; returns "<step>: <error>" for each that failed."""
        failed = []
        while self._steps:
            what, fn, args = self._steps.pop()
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - every step runs; the failure is reported
                log.warning("rollback step %s failed: %s", what, _describe(exc))
                failed.append(f"{what}: {_describe(exc)}")
        return failed
