"""Per-attachment serialisation: two CNI calls never work on one attachment at once.

The runtime's deadline expires, the plugin (or the shim in front of the daemon) is killed, and the
runtime sends DEL; in the daemon the ADD may still be running (it only stops at its next step
boundary, rdmanet.cni.core.deadline). ADD, DEL and GC of one attachment ("<network>/<containerID>/<ifname>")
therefore hold its lock for their whole run: the DEL waits for the ADD to finish or give up and
undo, then undoes what is left. The locks are flocks (filelock), so they hold between the daemon
and in-process calls too, and vanish with the process that held them (a SIGKILLed holder blocks
nobody). 256 stripe files chosen by a hash of the attachment, so lock files do not pile up with
every pod. Every wait is bounded by the call's deadline: CNI error 11 when it passes, and an ADD
whose caller went away stops waiting at once.
"""

from __future__ import annotations

import functools
import os
import threading
import zlib
from contextlib import contextmanager
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from rdmanet.cni.core import deadline as call_deadline
from rdmanet.cni.core.errors import TRY_AGAIN_LATER, CNIError

from . import roots

STRIPES = 256
POLL = 0.05
# macvlan-rdma and ipoib-rdma keep no state dir of their own: their locks live here (root's,
# 0700, made the safe way; /run is cleared at boot, like the locks' holders).
RUN_LOCK_DIR = "/run/rdmanet/locks"


# Per lock file: the in-process lock its threads queue on, and the FileLock the holder takes
# (kept, not made per call: one per stripe file, and filelock's per-thread state keeps them apart).
_in_process: dict[str, tuple[threading.Lock, FileLock]] = {}
_in_process_guard = threading.Lock()


def _locks_of(path: str) -> tuple[threading.Lock, FileLock]:
    with _in_process_guard:
        found = _in_process.get(path)
        if found is None:
            found = _in_process[path] = (threading.Lock(), FileLock(path))
        return found


def _wait(acquire: Callable[[float], bool], what: str) -> None:
    """``acquire(timeout)`` until it succeeds, each try bounded by the call's deadline."""
    deadline = call_deadline.current()
    while not acquire(max(0.0, min(POLL * 4, deadline.remaining()))):
        if deadline.remaining() <= 0:
            raise CNIError(TRY_AGAIN_LATER, f"{what} is locked by another CNI operation that did not finish in time",
                           "the runtime retries; if it persists, look for a hung call in the rdmanet daemon log")
        if deadline.caller_gone():  # nobody waits for this call any more: do not queue behind others
            raise call_deadline.Abandoned(f"the caller went away while waiting for the lock of {what}")


def _file_acquire(lock: FileLock) -> Callable[[float], bool]:
    def acquire(timeout: float) -> bool:
        try:
            lock.acquire(timeout=timeout, poll_interval=POLL)
        except Timeout:
            return False
        return True

    return acquire


@contextmanager
def locked(path: str, what: str) -> Iterator[None]:
    """Hold the flock at ``path``; waits until the call's deadline (CNI error 11 past it).

    Threads of one process (the daemon's workers) first queue on an in-process lock per path:
    the one that gets it takes the flock at once unless another process holds it, so a stripe
    shared by two calls in the daemon costs the second one the first one's time, not a poll."""
    roots.ensure_dir(os.path.dirname(path), key="lock directory")
    local, lock = _locks_of(path)
    _wait(lambda timeout: local.acquire(timeout=timeout), what)
    try:
        _wait(_file_acquire(lock), what)
        try:
            yield
        finally:
            lock.release()
    finally:
        local.release()


@contextmanager
def held(lock_dir: str, attachment: str) -> Iterator[None]:
    """The lock of ``attachment`` ("<network>/<containerID>/<ifname>") among the stripes in ``lock_dir``."""
    stripe = zlib.crc32(attachment.encode()) % STRIPES
    with locked(os.path.join(lock_dir, f"attachment-{stripe:03d}.lock"), f"attachment {attachment}"):
        yield


def key(network: str, container_id: str, ifname: str) -> str:
    return f"{network}/{container_id}/{ifname}"


def serialised(verb: Callable) -> Callable:
    """A plugin verb ``verb(self, inv)`` run under its attachment's lock in :data:`RUN_LOCK_DIR`."""

    @functools.wraps(verb)
    def run(self, inv):
        with held(RUN_LOCK_DIR, key(inv.network_name, inv.container_id, inv.ifname)):
            return verb(self, inv)

    return run
