"""The daemon's listening socket when systemd passes it (``rdmanet.socket``, socket activation).

systemd's protocol (sd_listen_fds(3)): the service is started with its sockets open from fd 3 on,
``LISTEN_FDS`` saying how many and ``LISTEN_PID`` the pid they are meant for (a child that
inherits the variables must not take the fds as its own). As sd_listen_fds(unset_environment=1)
does, :func:`listen_fds` removes ``LISTEN_PID``, ``LISTEN_FDS`` and ``LISTEN_FDNAMES`` from the
environment whether or not they were for us, so no process the daemon starts (an IPAM plugin it
execs) inherits them, and marks the passed fds close-on-exec.

:func:`inherited_socket` then insists on exactly what ``rdmanet.socket`` gives: one fd, a
listening AF_UNIX SOCK_STREAM socket, bound to the path the daemon was told (``--socket``: the
shims have it baked in and the DEL journal lives beside it). Anything else is refused with
:class:`ActivationError` naming what was passed and what to change; the daemon then does not
start (a socket it cannot vouch for would take the shims' calls).

Not socket-activated (no ``LISTEN_PID``, or one of another process): None, and the daemon binds
its socket itself, as it always did.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
from typing import MutableMapping, Optional

LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START
ENV = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


class ActivationError(Exception):
    """systemd passed something the daemon cannot serve on."""


def listen_fds(environ: MutableMapping[str, str] = os.environ, pid: Optional[int] = None) -> int:
    """How many sockets were passed to this process (fds 3, 4, ...), as sd_listen_fds(1) counts them."""
    values = {key: environ.pop(key, None) for key in ENV}  # never inherited by what the daemon execs
    if values["LISTEN_PID"] is None:
        return 0
    try:
        meant_for = int(values["LISTEN_PID"])
    except ValueError:
        raise ActivationError(f"LISTEN_PID={values['LISTEN_PID']!r} is not a process id") from None
    if meant_for != (os.getpid() if pid is None else pid):
        return 0  # passed to another process (a parent): not ours
    try:
        count = int(values["LISTEN_FDS"] or "")
    except ValueError:
        raise ActivationError(f"LISTEN_PID is this process but LISTEN_FDS={values['LISTEN_FDS']!r} is not a "
                              "number of file descriptors") from None
    if count < 0:
        raise ActivationError(f"LISTEN_FDS={count} is negative")
    for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + count):
        try:
            flags = fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError as exc:
            raise ActivationError(f"LISTEN_FDS={count} but fd {fd} is not open ({exc.strerror})") from None
        fcntl.fcntl(fd, fcntl.F_SETFD, flags | fcntl.FD_CLOEXEC)
    return count


def _describe(sock: socket.socket) -> str:
    kinds = {socket.SOCK_STREAM: "SOCK_STREAM", socket.SOCK_DGRAM: "SOCK_DGRAM", socket.SOCK_SEQPACKET: "SOCK_SEQPACKET"}
    family = getattr(sock.family, "name", str(sock.family))
    return f"{family} {kinds.get(sock.type, str(sock.type))}"


def inherited_socket(expected_path: str, environ: MutableMapping[str, str] = os.environ,
                     pid: Optional[int] = None) -> Optional[socket.socket]:
    """The listening socket systemd passed for ``expected_path``; None when not socket-activated."""
    count = listen_fds(environ, pid)
    if count == 0:
        return None
    if count != 1:
        raise ActivationError(f"systemd passed {count} sockets (LISTEN_FDS={count}); the rdmanet daemon serves "
                              "exactly one: give rdmanet.socket a single ListenStream= line, the daemon's --socket path")
    fd = LISTEN_FDS_START
    mode = os.fstat(fd).st_mode
    if not stat.S_ISSOCK(mode):
        raise ActivationError(f"fd {fd} (LISTEN_FDS=1) is not a socket: the unit that starts the daemon must be "
                              "rdmanet.socket with ListenStream= the daemon's --socket path")
    sock = socket.socket(fileno=fd)  # family and type read from the fd
    try:
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            raise ActivationError(f"fd {fd} is an {_describe(sock)} socket; the rdmanet daemon needs a unix stream "
                                  f"socket: ListenStream={expected_path} in rdmanet.socket (not ListenDatagram=, "
                                  "ListenSequentialPacket= or a port)")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ActivationError(f"fd {fd} is a unix stream socket that does not listen (Accept=yes passes a "
                                  "connection, not the listening socket): rdmanet.socket needs Accept=no")
        bound = sock.getsockname()
        if not isinstance(bound, str) or not bound or bound.startswith("\0"):
            raise ActivationError(f"fd {fd} listens on {bound!r}, not on a path: ListenStream={expected_path} in "
                                  "rdmanet.socket")
        if os.path.normpath(bound) != os.path.normpath(expected_path):
            raise ActivationError(f"systemd's socket listens on {bound} but the daemon serves {expected_path} (the "
                                  "path the shims call): make ListenStream= in rdmanet.socket and --socket in "
                                  "rdmanet.service the same path (re-run install.sh)")
    except BaseException:
        sock.detach()  # refused: fd 3 stays as it was
        raise
    return sock
