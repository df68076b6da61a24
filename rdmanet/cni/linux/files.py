"""Replace a small file atomically: temp file in the same directory, rename over the file. A
reader (any process, at once, through the page cache) sees the old content or the new, never a
mix, and a writer killed at any instant leaves the file as it was or as it was to be, plus maybe
its temp file (``.<name>.<random>.tmp``): :func:`remove_partial_writes` removes those.

``durable`` (the default) adds an fsync of the file before the rename and of the directory
after it, so that a power loss or kernel crash too leaves the old or the new content. Without
it, such a crash may leave the file empty or short: a writer may drop ``durable`` only when
nothing the file describes outlives a reboot and its reader takes a torn file for "nothing"."""

from __future__ import annotations

import glob
import os


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str, content: bytes, mode: int = 0o600, dir_mode: int = 0o700, durable: bool = True) -> None:
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
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        if durable:
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
