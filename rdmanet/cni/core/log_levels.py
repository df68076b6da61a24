"""A logger's level as the lowest level the calls in flight ask for.

A process that serves many calls at once (the node daemon) cannot give one call DEBUG by setting
a logger's level for good: every other call would then make (and drop) DEBUG records, each one a
LogRecord with the caller's frame looked up. :class:`LevelGate` lowers the logger's level only
while a call that asks for less is running, and puts it back when the last such call ends; the
call's own filter keeps the records to that call. Setting a level clears the loggers' level caches
(the standard library does it), so a record below every level in flight is never made.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import Iterator, Optional


class LevelGate:
    """``logger``'s level: ``base`` (NOTSET: its parent's), or lower while a :meth:`hold` of a
    lower level is in flight."""

    def __init__(self, logger: logging.Logger, base: int = logging.WARNING) -> None:
        self.logger = logger
        self.base = base
        self._held: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()

    def _apply(self) -> None:
        levels = [*self._held, *([self.base] if self.base != logging.NOTSET else [])]
        self.logger.setLevel(min(levels) if levels else logging.NOTSET)

    def set_base(self, level: int) -> None:
        """The level when no call asks for less (the process's own: the daemon's log, or an
        in-process call's RDMANET_LOG_LEVEL)."""
        with self._lock:
            self.base = level
            self._apply()

    @contextlib.contextmanager
    def hold(self, level: Optional[int]) -> Iterator[None]:
        """While the block runs, records of ``level`` and up are made (None: no change)."""
        if level is None or (self.base != logging.NOTSET and level >= self.base):
            yield
            return
        with self._lock:
            self._held[level] += 1
            self._apply()
        try:
            yield
        finally:
            with self._lock:
                self._held[level] -= 1
                if not self._held[level]:
                    del self._held[level]
                self._apply()


# Every logger of a call inherits the root's level; the node daemon holds it down to a request's
# RDMANET_LOG_LEVEL while that request runs.
root = LevelGate(logging.getLogger(), logging.WARNING)
