"""Replace a small file atomically and durably: temp file in the same directory, fsync, rename,
fsync of the directory. A reader sees the old content or the new, never a mix; after a crash the
file is one or the other, and the writer's temp file (``.<name>.<random>.tmp``) may be left:
:func:`remove_partial_writes` removes those."""

from __future__ import annotations

import glob
import os


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, content: bytes, mode: int = 0o600, dir_mode: int = 0o700) -> None:
    """Raises OSError; the caller turns it into the CNI error that names what the file is for."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=dir_mode, exist_ok=True)
    import tempfile  # here: its imports (shutil, random, bz2, lzma) cost the verbs that write nothing ~2 ms

    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_dir(directory)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def remove_partial_writes(path: str) -> None:
    """Remove the temp files that writers of ``path`` killed before their rename left. Only for a
    caller that holds whatever serialises the writers of ``path`` (a live writer's file would go)."""
    directory, name = os.path.split(os.path.abspath(path))
    for tmp in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}.*.tmp")):
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
