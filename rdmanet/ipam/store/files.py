"""Durable small-file primitives for the local store.

Facts relied on (POSIX, Linux):
- ``open(O_CREAT|O_EXCL)`` fails with EEXIST when the name exists: an atomic claim.
- ``rename`` within one directory atomically replaces the target: readers see the old or the
  new content, never a mix.
- A new or renamed name is durable only after ``fsync`` of the directory; file content only
  after ``fsync`` of the file.
- A ``write`` of a few hundred bytes to a regular file is not interrupted by SIGKILL midway, so
  after kill -9 an exclusively created file is either empty or complete.
- Every process sees a create, write, rename or unlink at once, through the page cache, whether
  or not it was fsynced: a killed plugin or daemon loses nothing it did.

What is NOT sought is durability across a power loss or kernel crash, so nothing here calls
``fsync`` (``POWER_LOSS_DURABLE``). The store records the node's own attachments, and a node
that loses power loses every one of them: each pod gets a new sandbox and a new ADD afterwards.
So whatever a power loss does to the files, no live attachment depends on them: a record that
vanished belonged to a dead pod; one left over is freed by CNI GC or the daemon's node GC; one
left empty or torn reads as GARBAGE, which the store frees as a crashed ADD's (local.py, rule
(b)). Go's host-local makes the same choice (it never fsyncs). The fsyncs cost about two thirds
of a daemon ADD on this project's benchmark machine (bench/README.md), held under the network's
lock, so every concurrent ADD of the network queued behind them.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional

from rdmanet.cni.linux.files import fsync_dir

FILE_MODE = 0o600
DIR_MODE = 0o700
TMP_PREFIX = ".tmp."
POWER_LOSS_DURABLE = False  # see the module docstring: atomic against kills, not durable across power loss


def sync_file(fd: int) -> None:
    if POWER_LOSS_DURABLE:
        os.fsync(fd)


def sync_dir(path: str) -> None:
    if POWER_LOSS_DURABLE:
        fsync_dir(path)


class Garbage:
    """Marker for a file of ours that an interrupted write left: empty, zero-filled by a power
    loss, or a torn prefix of our own encoding (:func:`encode`)."""

    def __repr__(self) -> str:
        return "GARBAGE"


class Foreign:
    """Marker for a file lease-ipam did not write (not a JSON object, and not a torn one of
    ours): another program's (host-local keeps "<containerID>\\r\\n<ifname>" in files named by
    address), never removed, its address never handed out."""

    def __repr__(self) -> str:
        return "FOREIGN"


GARBAGE = Garbage()
FOREIGN = Foreign()
OWN_PREFIX = b'{"containerID": '  # how every claim and index document of ours begins (sorted keys)


def _torn_own(data: bytes) -> bool:
    """Whether ``data`` is what an interrupted write of one of our documents can leave."""
    data = data.rstrip(b"\0")
    return not data or OWN_PREFIX.startswith(data) or data.startswith(OWN_PREFIX)


def ensure_dir(path: str) -> None:
    """Create ``path`` (and parents) with mode 0700 if missing; the mode is applied to what we create."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path.rstrip("/"))
    if parent and parent != path:
        ensure_dir(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)  # umask may have removed bits; it cannot have added any
    if parent:
        sync_dir(parent)


def encode(document: dict) -> bytes:
    return (json.dumps(document, sort_keys=True) + "\n").encode()


def read_bytes(path: str, limit: Optional[int] = None) -> bytes:
    """The content of the file ``path`` (its first ``limit`` bytes when given): open, read, close.

    The store reads under the network's lock, and in the daemon every system call there lets
    another thread take the GIL, which the lock holder then waits to get back while the other
    ADDs of the network wait for the lock: ``open(path, "rb").read()`` makes seven (fstat,
    isatty, seek besides these), this three or four."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if limit is not None:
            return os.read(fd, limit)  # a regular file: all of it up to limit, short only at its end
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def read_json(path: str) -> Any:
    """The JSON object in ``path``; None when the file is missing; GARBAGE when it is an
    interrupted write of ours; FOREIGN for anything else that is not a JSON object."""
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return GARBAGE if _torn_own(data) else FOREIGN
    return doc if isinstance(doc, dict) else FOREIGN


def atomic_write(directory: str, name: str, data: bytes, durable: bool = True) -> None:
    """Replace ``directory/name`` with ``data`` via a temp file and rename (the caller holds the lock)."""
    tmp = os.path.join(directory, f"{TMP_PREFIX}{name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    try:
        os.write(fd, data)
        if durable:
            sync_file(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(directory, name))
    if durable:
        sync_dir(directory)


def overwrite_padded(path: str, text: str, width: int) -> None:
    """Write ``text`` over the start of ``path`` (created 0600 when missing), padded with spaces to
    ``width`` bytes: one pwrite, no truncate, no rename. On ext4 a rename over a file, or a
    truncate of one, whose data is not yet on disk (delayed allocation) starts its writeback
    (``auto_da_alloc``), about 1 ms on the benchmark machine. Only for content whose reader
    strips whitespace and tolerates a torn value (the round-robin cursor); ``width`` must cover
    the longest content the file ever held, so nothing of an older value is left behind."""
    data = text.encode().ljust(width)
    if len(data) > width:
        raise ValueError(f"{len(data)} bytes do not fit a field of {width}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        os.pwrite(fd, data, 0)
    finally:
        os.close(fd)


def create_exclusive(path: str, data: bytes, after_create: Optional[Callable[[], None]] = None) -> bool:
    """Create ``path`` with ``data`` unless it exists (False then); its content is written before True."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    except FileExistsError:
        return False
    try:
        if after_create is not None:
            after_create()
        os.write(fd, data)
        sync_file(fd)
    except BaseException:
        os.close(fd)
        remove(path)  # never leave an empty claim behind a failed write (ENOSPC, EIO)
        raise
    os.close(fd)
    return True


def remove(path: str) -> bool:
    """Unlink ``path``; False when it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
