"""Keeping the daemon's resident memory flat over millions of calls (glibc malloc).

Facts relied on (glibc ``mallopt(3)``, ``malloc_trim(3)``, the ``glibc.malloc.tcache_count`` tunable):

- Each thread that contends for malloc gets an arena of its own, up to 8 x cores, and memory
  freed into an arena stays there for that arena's later allocations: with a pool of worker
  threads the high-water mark of every arena adds up. ``M_ARENA_MAX`` bounds the count.
- Each thread also keeps a cache of its own (tcache: up to 7 freed chunks of each size class up
  to 1 KiB) that malloc_trim does not empty. The cached chunks stay allocated as far as the arena
  is concerned, scattered through the heap, so the free space around them cannot merge and be
  given back: the heap's pages crept up for thousands of calls (+0.3 to 0.7 MB per 1 000 sequential
  ADD/DEL cycles, measured, while tracemalloc showed Python's live allocations flat), and the creep
  stopped with the tunable ``glibc.malloc.tcache_count=0``. Tunables are read when the process
  starts, so ``rdmanet daemon`` restarts its interpreter once with it (:func:`restart_tuned`).
  Python's own small-object allocator serves most allocations, so the cache gains it little.
- The mmap threshold moves up each time a block above it is freed (dynamic threshold), so large
  buffers (a netlink dump, a JSON document) end up on the heap for good; fixing
  ``M_MMAP_THRESHOLD`` keeps them in mmap, given back on free.
- ``malloc_trim(0)`` returns the free pages of every arena to the kernel.

Not glibc (musl) or no libc through ctypes: nothing happens.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

ARENAS = 2  # the workers serialise on the GIL anyway
MMAP_THRESHOLD = 256 << 10
TRIM_THRESHOLD = 1 << 20
TRIM_EVERY = 1.0  # seconds: at most one malloc_trim per second, when the daemon is idle
TUNABLES = "glibc.malloc.tcache_count=0"  # no per-thread cache (see above)
_RESTARTED = "RDMANET_MALLOC_RESTARTED"  # set across the one restart

try:
    _libc = ctypes.CDLL(None)
    _mallopt = _libc.mallopt
    _malloc_trim = _libc.malloc_trim
except (OSError, AttributeError):
    _mallopt = _malloc_trim = None

_last_trim = 0.0
_trim_lock = threading.Lock()
tuned = False  # this process started with TUNABLES


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") is not None
    except (ValueError, OSError):
        return False


def restart_tuned() -> None:
    """First thing in ``rdmanet daemon`` (a process of its own, before any thread, socket or
    file): exec the same command line again with ``GLIBC_TUNABLES`` = :data:`TUNABLES`, once.
    The process id, the inherited descriptors (systemd's LISTEN_FDS) and the rest of the
    environment stay; the restarted process drops the variable again, so the processes it starts
    do not inherit it. Does nothing when not on glibc, when the caller set ``GLIBC_TUNABLES``
    itself (the node owner's choice stands), or when the exec fails."""
    global tuned
    if os.environ.pop(_RESTARTED, None) is not None:
        os.environ.pop("GLIBC_TUNABLES", None)
        tuned = True
        return
    if "GLIBC_TUNABLES" in os.environ:
        tuned = TUNABLES in os.environ["GLIBC_TUNABLES"].split(":")
        return
    if not _glibc() or not sys.executable or not getattr(sys, "orig_argv", None):
        return
    env = {**os.environ, _RESTARTED: "1", "GLIBC_TUNABLES": TUNABLES}
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
    except OSError:
        return


def limit_arenas() -> bool:
    """At start, before the worker threads: bounded arenas, fixed thresholds. False when not glibc."""
    if _mallopt is None:
        return False
    ok = _mallopt(M_ARENA_MAX, ARENAS) == 1
    ok = _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and ok
    return _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok


def trim_when_idle(busy: int) -> None:
    """Called as a worker finishes a call: give free memory back once nothing is in flight."""
    global _last_trim
    if _malloc_trim is None or busy:
        return
    now = time.monotonic()
    if now - _last_trim < TRIM_EVERY or not _trim_lock.acquire(blocking=False):
        return
    try:
        _last_trim = now
        _malloc_trim(0)
    finally:
        _trim_lock.release()
