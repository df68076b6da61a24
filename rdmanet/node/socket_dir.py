"""Whether the daemon's socket lives where only root can put a socket.

A socket in a directory others may write (``/tmp``; a directory of another user) can be bound
by anyone while the daemon is down, or swapped for their own; every shim would then hand that
user the CNI calls (their environment and config) and take its answers. The shims check who
serves before they send anything (SO_PEERCRED, :mod:`rdmanet.node.launcher`), and the daemon and
install.sh refuse such a directory up front: it must be owned by root (the daemon's uid) and
writable by nobody else, and no directory above it may let others rename it away (writable by
group or others without the sticky bit).

``python -m rdmanet.node.socket_dir SOCKET``: exit 0 when the socket's directory is safe (or
does not exist yet: the daemon, or systemd's rdmanet.socket, makes it 0700), else 1 with why on
stderr (install.sh runs it).
"""

from __future__ import annotations

import os
import stat
import sys
from typing import Optional


def unsafe_socket_dir(socket_path: str, uid: Optional[int] = None) -> Optional[str]:
    """Why another user could bind or replace a socket at ``socket_path``; None when nobody but
    root (or ``uid``, default ours) can. A directory that does not exist yet is fine."""
    uid = os.geteuid() if uid is None else uid
    directory = os.path.dirname(os.path.abspath(socket_path))
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory"
    if st.st_uid not in (0, uid):
        return f"the socket's directory {directory} is owned by uid {st.st_uid}"
    if st.st_mode & 0o022:
        return (f"the socket's directory {directory} is writable by {'others' if st.st_mode & 0o002 else 'its group'} "
                f"(mode {stat.S_IMODE(st.st_mode):o}): anyone there could bind the socket while the daemon is down")
    parent = os.path.dirname(directory)
    while parent != directory:
        pst = os.stat(parent)
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            return (f"{parent}, above the socket's directory, is writable by others without the sticky bit "
                    f"(mode {stat.S_IMODE(pst.st_mode):o}): the directory could be renamed away and replaced")
        directory, parent = parent, os.path.dirname(parent)
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m rdmanet.node.socket_dir SOCKET\n")
        return 2
    why = unsafe_socket_dir(argv[0])
    if why is None:
        return 0
    sys.stderr.write(f"{why}; put the socket in a directory of its own that only root may write, "
                     f"such as /run/rdmanet\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
