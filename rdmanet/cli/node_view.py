"""Is the file this container wrote the one the node runs? (install.sh --daemonset, step 2)

``python -m rdmanet.cli.node_view same-file PATH HOST_ROOT``: exit 0 when ``HOST_ROOT/PATH`` (the node's
``PATH``, which the kubelet execs) is the very file ``PATH`` in this container (same device and
inode), else print why on stdout, naming both paths, and exit 1.

Why: the DaemonSet mounts the node's CNI bin dir at the same path in the container. When a
manifest mounts it elsewhere (hostPath /home/kubernetes/bin at mountPath /opt/cni/bin), the shims
land in the node's /home/kubernetes/bin while the kubelet runs /opt/cni/bin, which may hold older
shims that still answer VERSION. Comparing inodes tells these apart where comparing answers cannot.
The node's path of the container's file is worked out from the mount tables (the container's
mountinfo and, when HOST_ROOT is ``/proc/<pid>/root``, that process's) so the message can name it.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple, Optional


class Mount(NamedTuple):
    device: str  # major:minor
    root: str  # the directory of the filesystem mounted here
    point: str  # where it is mounted


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    for escaped, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, char)
    return field


def mounts(mountinfo: str) -> list[Mount]:
    out = []
    with open(mountinfo) as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 5:
                out.append(Mount(fields[2], _unescape(fields[3]), _unescape(fields[4])))
    return out


def _under(path: str, top: str) -> Optional[str]:
    """``path`` relative to ``top`` ("" for top itself), None when not under it."""
    if top == "/":
        return path.lstrip("/")
    if path == top:
        return ""
    if path.startswith(top.rstrip("/") + "/"):
        return path[len(top.rstrip("/")) + 1:]
    return None


def _join(top: str, rel: str) -> str:
    return top if not rel else top.rstrip("/") + "/" + rel


def filesystem_path(path: str, table: list[Mount]) -> Optional[tuple[str, str]]:
    """(device, path inside that filesystem) of ``path`` by the last, longest mount holding it."""
    best: Optional[tuple[Mount, str]] = None
    for m in table:
        rel = _under(path, m.point)
        if rel is not None and (best is None or len(m.point) >= len(best[0].point)):
            best = (m, rel)
    if best is None:
        return None
    m, rel = best
    return m.device, _join(m.root, rel)


def node_path(path: str, host_root: str) -> Optional[str]:
    """Where the node sees this container's ``path`` (through HOST_ROOT), when that can be told."""
    parts = host_root.rstrip("/").split("/")
    if len(parts) != 4 or parts[1] != "proc" or parts[3] != "root" or not parts[2].isdigit():
        return None  # only /proc/<pid>/root has a mount table beside it
    real = os.path.realpath(path)
    mine = filesystem_path(real, mounts("/proc/self/mountinfo"))
    if mine is None:
        return None
    device, inside = mine
    try:
        expected = os.stat(real)
        table = mounts(f"/proc/{parts[2]}/mountinfo")
    except OSError:
        return None
    for m in reversed(table):
        rel = _under(inside, m.root)
        if m.device != device or rel is None:
            continue
        candidate = _join(m.point, rel)
        try:
            st = os.stat(host_root.rstrip("/") + candidate)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (expected.st_dev, expected.st_ino):
            return candidate
    return None


def same_file(path: str, host_root: str) -> Optional[str]:
    """None when the node's ``path`` is this container's ``path``; else why not."""
    seen = host_root.rstrip("/") + path if host_root.rstrip("/") else path
    mine = os.stat(path)
    try:
        theirs = os.stat(seen)
    except FileNotFoundError:
        state = "does not exist"
    else:
        if (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino):
            return None
        state = "is another file"
    where = node_path(os.path.dirname(path), host_root)
    went = f"the node's {where}" if where else "a directory the kubelet does not run from"
    return (f"wrote {path} in this container, but the node's {path} (seen here as {seen}), which the kubelet "
            f"runs, {state}: this container's {os.path.dirname(path)} is {went}. Mount the node's CNI bin dir "
            f"at the same path in the container (hostPath = mountPath) and give that path to --bin-dir.")


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "same-file":
        print("usage: python -m rdmanet.cli.node_view same-file PATH HOST_ROOT", file=sys.stderr)
        return 2
    why = same_file(argv[1], argv[2])
    if why is None:
        return 0
    print(why)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
