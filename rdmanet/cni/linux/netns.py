"""Network namespaces, entered per thread.

``setns(2)`` changes only the calling thread, so the daemon can serve several pods at once as
long as every entry is undone: :func:`entered` always switches back, also on error. A netlink
socket keeps the namespace it was created in, so the usual pattern is "enter, open a socket,
leave" (:func:`netlink_in`), after which the socket works from the host namespace.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
from contextlib import contextmanager
from typing import Iterator, Optional

CLONE_NEWNET = 0x40000000
NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3), <linux/nsfs.h>
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsGone(Exception):
    """The namespace path does not exist (any more)."""


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def open_netns(path: str) -> int:
    """An fd for the namespace at ``path``; NetnsGone if it vanished or the path is no (longer a)
    network namespace (a plain file left behind when its bind mount went, e.g. after a reboot:
    setns would say EINVAL), OSError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise NetnsGone(path) from exc
    if not _is_netns(fd):
        os.close(fd)
        raise NetnsGone(f"{path} is not a network namespace (a file left behind by one that is gone?)")
    return fd


def _is_netns(fd: int) -> bool:
    try:
        return fcntl.ioctl(fd, NS_GET_NSTYPE) == CLONE_NEWNET
    except OSError:  # ENOTTY: not an nsfs file
        return False


def identity(path: str) -> Optional[dict]:
    """``{"dev", "ino"}`` of the network namespace at ``path``; None when there is none there.
    Recorded at ADD, it tells the namespace from a new one mounted later at the same path."""
    try:
        fd = open_netns(path)
    except (NetnsGone, OSError):
        return None
    try:
        st = os.fstat(fd)
        return {"dev": st.st_dev, "ino": st.st_ino}
    finally:
        os.close(fd)


def is_alive(path: str, recorded: Optional[dict]) -> bool:
    """Whether ``path`` still is the namespace recorded at ADD (any netns when nothing was recorded)."""
    if not path:
        return False
    found = identity(path)
    return found is not None and (not recorded or found == recorded)


THREAD_NETNS = "/proc/thread-self/ns/net"  # the calling thread's network namespace


@contextmanager
def opened(path: str) -> Iterator[int]:
    """An fd of the namespace at ``path`` for the body (NetnsGone: :func:`open_netns`)."""
    fd = open_netns(path)
    try:
        yield fd
    finally:
        os.close(fd)


def current_netns_fd() -> int:
    return os.open(THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)


@contextmanager
def entered(path: str) -> Iterator[int]:
    """Run the body with this thread inside the namespace at ``path``; yields its fd."""
    target = open_netns(path)
    own = current_netns_fd()
    try:
        try:
            _setns(target)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise NetnsGone(f"{path} is not a network namespace") from exc
            raise
        try:
            yield target
        finally:
            _setns(own)
    finally:
        os.close(own)
        os.close(target)


def refuse_own(path: str, env) -> None:
    """SPEC/skel: a plugin must not work on its own netns unless CNI_NETNS_OVERRIDE says so."""
    if path and same_netns(path) and env.get("CNI_NETNS_OVERRIDE", "").lower() not in ("1", "true"):
        from rdmanet.cni.core.errors import INVALID_NETNS, CNIError

        raise CNIError(INVALID_NETNS, f"CNI_NETNS {path} is the plugin's own network namespace", "pass the pod's network namespace")


def same_netns(path: str) -> bool:
    """True when ``path`` is the namespace this thread is in (SPEC: refuse to work on it)."""
    try:
        a = os.stat(path)
    except OSError:
        return False
    b = os.stat("/proc/thread-self/ns/net")
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


@contextmanager
def entered_fd(fd: int) -> Iterator[None]:
    """Like :func:`entered` for a namespace already open as ``fd``."""
    own = current_netns_fd()
    try:
        _setns(fd)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)
