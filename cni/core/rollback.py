"""Undo steps of a failed ADD: each runs, and a failing one is logged, never raised, so it cannot
hide the error that made the ADD fail."""

from __future__ import annotations

import logging

log = logging.getLogger("rdmanet")


def quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:  # rollback must not hide the original error
        log.warning("rollback step %s failed: %s", getattr(fn, "__name__", fn), exc)
