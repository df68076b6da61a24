"""An exclusive flock on a lock file whose waiters sleep in the kernel, with a timeout.

Facts relied on (Linux flock(2), Python signal docs, PEP 475):
- flock locks belong to the open file description and are dropped when it is closed, also when
  the process dies (kill -9): a crashed holder never leaves the lock held.
- A blocking ``flock(LOCK_EX)`` sleeps until the lock is free and costs no CPU while it waits.
  A polling waiter (filelock retries LOCK_NB every ``poll_interval``) does cost CPU: with 200
  waiters on two cores the pollers starved the holder and a waiter passed 30 s (measured).
- Python retries a syscall interrupted by a signal unless the handler raises; an ITIMER_REAL
  handler that raises therefore bounds a blocking flock. Signal handlers can only be installed
  from the main thread, so other threads (the node daemon) poll with LOCK_NB instead; they first
  queue on an in-process lock per path, so at most one thread of a process polls.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Iterator

POLL_INTERVAL = 0.005  # seconds, for waiters outside the main thread
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


class LockTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise LockTimeout()


def _wait_in_kernel(fd: int, timeout: float) -> None:
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def _poll(fd: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout() from None
            time.sleep(POLL_INTERVAL)


def _kernel_wait_allowed() -> bool:
    return (threading.current_thread() is threading.main_thread()
            and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None))


def _thread_lock(path: str) -> threading.Lock:
    with _thread_locks_guard:
        return _thread_locks.setdefault(os.path.abspath(path), threading.Lock())


@contextmanager
def exclusive(path: str, timeout: float, mode: int = 0o600) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if missing); raises LockTimeout after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    local = _thread_lock(path)
    if not local.acquire(timeout=timeout):
        raise LockTimeout()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
        try:  # closing the descriptor releases the flock on every path, including a late alarm
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                left = max(deadline - time.monotonic(), 0.001)
                if _kernel_wait_allowed():
                    _wait_in_kernel(fd, left)
                else:
                    _poll(fd, left)
            yield
        finally:
            os.close(fd)
    finally:
        local.release()
