"""What the plugins and ``rdmanet demo`` leave on a host, cleared by ``install.sh --uninstall``
(host mode), after the shims are gone (no new call can start) and before the venv goes.

Removed:

- the demo's local store, ``<data dir>/rdmanet-demo/`` (its lock, index and cursor files), when
  it holds no claim; then the data dir itself when that left it empty;
- the attachment lock files in ``<run dir>/locks`` (``/run/rdmanet/locks``: at most 256 stripes),
  each one only while this process holds its flock (a call still running keeps its file);
- an empty DEL journal directory, and the run dir (``/run/rdmanet``) once empty;
- the directories install.sh created (the CNI bin dir, the link dir), when empty.

Kept on purpose, and said so: a claim the demo still holds (``rdmanet demo --down`` releases it),
the stores of other networks (live claims: ``rdmanet ipam ls --data-dir`` lists them), DELs the
daemon has not replayed yet, host-device-rdma's state of attachments, a lock held right now, a
directory that holds what others put there. Nothing is followed through a symlink.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import stat
import sys
from typing import Optional, Sequence

from rdmanet.ipam.location import DEFAULT_DATA_DIR

from .demo import NETWORK as DEMO_NETWORK

RUN_DIR = "/run/rdmanet"
HOST_DEVICE_DIR = "/var/lib/cni/host-device-rdma"
JOURNAL = "del-journal"
LOCKS = "locks"


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _claims(store: str) -> list[str]:
    """The addresses a local store's files claim (its address files)."""
    from rdmanet.ipam.store.layout import address_name

    try:
        return sorted(name for name in os.listdir(store) if address_name(name) is not None)
    except OSError:
        return []


def _rmdir_if_empty(path: str, out: list[str], why_kept: str) -> None:
    if not _is_dir(path):
        return
    try:
        os.rmdir(path)
    except OSError:
        inside = any(line.startswith(f"kept {path}/") or line.startswith(f"kept {path}:")
                     or (line.startswith("kept ") and f" in {path}/" in line) for line in out)
        out.append(f"left {path}: {'it holds what is kept above' if inside else why_kept}")
    else:
        out.append(f"removed {path}")


def stores(data_dir: str, out: list[str]) -> None:
    """The demo's store (when it claims nothing), and what the other stores keep."""
    demo = os.path.join(data_dir, DEMO_NETWORK)
    if _is_dir(demo):
        held = _claims(demo)
        if held:
            out.append(f"kept {demo}: the demo's attachment still holds {', '.join(held)} "
                       "(rdmanet demo --down releases it)")
        else:
            shutil.rmtree(demo)
            out.append(f"removed {demo}")
    if not _is_dir(data_dir):
        return
    for name in sorted(os.listdir(data_dir)):
        path = os.path.join(data_dir, name)
        if name != DEMO_NETWORK and _is_dir(path):
            held = _claims(path)
            if held:
                out.append(f"kept {path}: {len(held)} live claim(s) of network {name} "
                           f"(rdmanet ipam ls --data-dir {data_dir} lists them)")
    _rmdir_if_empty(data_dir, out, "it holds the stores of other networks")


def locks(run_dir: str, out: list[str]) -> None:
    """Lock files nobody holds; the directory when that emptied it."""
    directory = os.path.join(run_dir, LOCKS)
    if not _is_dir(directory):
        return
    removed = held = 0
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held += 1
                continue
            os.unlink(path)  # while holding its lock: nobody is inside
            removed += 1
        finally:
            os.close(fd)
    if removed:
        out.append(f"removed {removed} lock file(s) in {directory}")
    if held:
        out.append(f"kept {held} lock file(s) in {directory}: a CNI call holds them now")
    else:
        _rmdir_if_empty(directory, out, "it holds files rdmanet did not make")


def journal(run_dir: str, out: list[str]) -> None:
    directory = os.path.join(run_dir, JOURNAL)
    if not _is_dir(directory):
        return
    pending = [n for n in os.listdir(directory) if n.endswith(".del") and not n.startswith(".")]
    if pending:
        out.append(f"kept {directory}: {len(pending)} DEL(s) the daemon has not replayed yet (their addresses "
                   "stay claimed until a daemon replays them, or the reconciler frees them)")
        return
    for name in os.listdir(directory):  # a shim's temporary file a kill left
        if name.startswith("."):
            os.unlink(os.path.join(directory, name))
    _rmdir_if_empty(directory, out, "it holds files rdmanet did not make")


def host_device(directory: str, out: list[str]) -> None:
    """host-device-rdma's state is a live attachment's way home: kept while there is any."""
    if not _is_dir(directory):
        return
    states = [n for n in os.listdir(directory) if n.endswith(".json")]
    if states:
        out.append(f"kept {directory}: the state of {len(states)} host-device-rdma attachment(s) "
                   "(their DEL moves the device home)")


def clean(data_dir: str = DEFAULT_DATA_DIR, run_dir: str = RUN_DIR, host_device_dir: str = HOST_DEVICE_DIR,
          created: Sequence[str] = ()) -> list[str]:
    """Clear what is listed in the module docstring; returns one line per thing removed or kept."""
    out: list[str] = []
    stores(data_dir, out)
    locks(run_dir, out)
    journal(run_dir, out)
    host_device(host_device_dir, out)
    _rmdir_if_empty(run_dir, out, "it holds files rdmanet did not make")
    for directory in created:
        _rmdir_if_empty(directory, out, "it holds files of others (install.sh created it)")
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rdmanet.cli.leftovers",
                                     description="clear what the plugins and the demo left (install.sh --uninstall)")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="lease-ipam's local stores (default: %(default)s)")
    parser.add_argument("--run-dir", default=RUN_DIR, help="the daemon socket's directory (default: %(default)s)")
    parser.add_argument("--host-device-dir", default=HOST_DEVICE_DIR, help="host-device-rdma's state (default: %(default)s)")
    parser.add_argument("--created-dir", action="append", default=[], metavar="DIR",
                        help="a directory install.sh created: removed when empty (repeatable)")
    args = parser.parse_args(argv)
    for line in clean(args.data_dir, args.run_dir, args.host_device_dir, args.created_dir):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
