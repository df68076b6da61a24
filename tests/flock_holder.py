"""Another process holding a lock file's flock, as a second CNI call or lease-ipam exec would."""

from __future__ import annotations

import fcntl
import multiprocessing
from contextlib import contextmanager
from typing import Callable, Iterator


@contextmanager
def held_elsewhere(path: str) -> Iterator[Callable[[], None]]:
    """The flock of ``path`` held by a forked process until the block ends or the callable it
    yields is called (the holder lets go)."""
    ctx = multiprocessing.get_context("fork")
    holding, done = ctx.Event(), ctx.Event()

    def hold() -> None:
        with open(path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            holding.set()
            done.wait(60)

    proc = ctx.Process(target=hold)
    proc.start()
    try:
        assert holding.wait(10), "the holder did not take the lock"
        yield done.set
    finally:
        done.set()
        proc.join(10)
