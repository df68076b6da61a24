"""Deleting a link and answering once the kernel has unlisted it, not once it has freed it.

The RTM_DELLINK request of a macvlan returns after ~15-30 ms on the benchmark machine, nearly all
of it the kernel waiting for RCU after the link is already gone (net/core/dev.c: under RTNL,
``unregister_netdevice_many`` closes the device, unlists it from its namespace, runs its
``ndo_uninit`` (a macvlan leaves its master's port) and sends the RTM_DELLINK notification;
after RTNL is released, ``netdev_run_todo`` waits for an RCU barrier and the last references,
then frees the device). Measured: the notification ~0.7 ms after the request, its answer ~19 ms.
Go's macvlan DEL waits for the answer too; a DEL that ends the attachment need not: once the
notification is out, the name, the addresses and the place on the master are free, nothing can
undo the deletion (the kernel finishes it whatever becomes of the process that asked) and RTNL
is not held for the rest.

:func:`delete_until_unlisted` does that in the node daemon (:func:`finish_in_background`): the
request goes out on a duplicate of the caller's socket from a thread of its own, which reads its
answer after the verb has returned, while the caller waits for the notification on a socket
subscribed to the namespace's link events before the request is sent, or for the answer,
whichever comes first; a refusal that comes first is raised as :func:`rdmanet.cni.linux.links.delete`
raises it. At most :data:`BACKGROUND` deletions finish so at once (threads stay bounded); past
that, and outside the daemon (a process that ends with its verb would wait for the kernel at its
exit anyway), it is :func:`rdmanet.cni.linux.links.delete`.
"""

from __future__ import annotations

import errno
import os
import select
import threading

from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_DELLINK, RTMGRP_LINK

from .links import delete, kernel_error
from .netlink_exchange import RECV
from .rtnl import MarshalLinks, Rtnl

BACKGROUND = 32  # deletions the kernel may still be finishing after their verbs returned

_background = False
_slots = threading.BoundedSemaphore(BACKGROUND)


def finish_in_background(on: bool) -> None:
    """The node daemon's choice (``rdmanet.node.daemon.load_plugins``): deletions end at the notification."""
    global _background
    _background = on


def delete_until_unlisted(ipr, index: int) -> None:
    """:func:`rdmanet.cni.linux.links.delete` of link ``index``, returning once the kernel has unlisted it
    (see the module docstring). ``ipr`` makes no request afterwards."""
    if not _background or not isinstance(ipr, Rtnl) or not _slots.acquire(blocking=False):
        delete(ipr, index)
        return
    try:
        msg = ipr.build("link", "del", {"index": index})
        monitor = ipr.subscribed(RTMGRP_LINK)  # before the request: its notification cannot be missed
    except BaseException:
        _slots.release()
        raise
    outcome: list = []
    pipe: tuple[int, ...] = ()
    try:
        pipe = done_r, done_w = os.pipe()
        channel = ipr.detached()
    except BaseException:
        for fd in pipe:  # made when the duplicate of the socket was refused (EMFILE)
            os.close(fd)
        monitor.close()
        _slots.release()
        raise

    def finish() -> None:
        try:
            channel.exchange(msg.data, msg["header"]["sequence_number"])
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the verb when it still waits
            outcome.append(exc)
        finally:
            channel.sock.close()
            try:
                os.write(done_w, b"!")
            except OSError:
                pass
            os.close(done_w)
            _slots.release()

    try:
        threading.Thread(target=finish, name=f"link-delete-{index}", daemon=True).start()
    except BaseException:
        channel.sock.close()
        for fd in (done_r, done_w):
            os.close(fd)
        monitor.close()
        _slots.release()
        raise
    try:
        unlisted = _wait(monitor, done_r, index)
    finally:
        monitor.close()
        os.close(done_r)
    if unlisted:
        return
    failure = outcome[0]
    if isinstance(failure, NetlinkError):
        if failure.code != errno.ENODEV:
            raise kernel_error(f"delete link #{index}", failure) from failure
    elif failure is not None:
        raise failure


def _wait(monitor, done_fd: int, index: int) -> bool:
    """True at link ``index``'s RTM_DELLINK notification, False when the request was answered first."""
    poller = select.poll()
    poller.register(monitor, select.POLLIN)
    poller.register(done_fd, select.POLLIN)
    marshal = MarshalLinks()
    while True:
        for fd, _ in poller.poll():
            if fd == done_fd:
                return False
            try:
                data = monitor.recv(RECV)
            except OSError:  # ENOBUFS: notifications were lost; the request's answer still comes
                poller.unregister(monitor)
                continue
            for event in marshal.parse(data):
                if event["header"]["type"] == RTM_DELLINK and event["index"] == index:
                    return True
