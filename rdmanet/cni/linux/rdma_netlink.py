"""A small RDMA netlink (nldev) client: netns mode, device list, moving a device to a netns.

pyroute2 has no RDMA family, so this module adds one on pyroute2's netlink base classes
(``nlmsg`` for the message codec, ``Marshal`` for reply parsing). The transport is a plain
NETLINK_RDMA socket driven by :mod:`rdmanet.cni.linux.netlink_exchange`, the loop :class:`rdmanet.cni.linux.rtnl.Rtnl`
uses too: pyroute2's ``NetlinkSocket`` would start an asyncio loop per socket (~10-15 ms of a plugin
exec, and CPU on every daemon request, on a node with an RDMA device).

Kernel facts relied on (include/uapi/rdma/rdma_netlink.h, drivers/infiniband/core/netlink.c,
nldev.c, device.c):

- The RDMA core (ib_core) registers netlink protocol ``NETLINK_RDMA`` (20), with one kernel
  socket per network namespace. On a kernel without ib_core,
  ``socket(AF_NETLINK, SOCK_DGRAM, 20)`` fails with EPROTONOSUPPORT.
- ``nlmsg_type = (client << 10) | op``. The nldev client is ``RDMA_NL_NLDEV`` (5), so GET is
  0x1401, SET is 0x1402 and SYS_GET is 0x1406.
- Unlike generic netlink, there is **no family header**: attributes (4-byte aligned TLVs:
  u16 length including the 4-byte header, u16 type, value, zero padding) follow the 16-byte
  ``nlmsghdr`` directly.
- The kernel resolves a request in the network namespace of the **socket**, that is the netns
  the socket was created in, not the caller's current one. In exclusive mode a GET dump lists
  only the devices of that netns, and SET resolves ``DEV_INDEX`` there. So to act on a device
  that is inside a pod, create the socket while the calling thread is in the pod's netns.
- ``SYS_GET`` (kernel 5.2 and later) answers ``RDMA_NLDEV_SYS_ATTR_NETNS_MODE`` (u8):
  1 = shared, 0 = exclusive. Older kernels have no handler for the op and answer EINVAL.
- ``GET`` with ``NLM_F_DUMP`` answers one ``NLM_F_MULTI`` message per device (``DEV_INDEX``
  u32, ``DEV_NAME`` string and more), then ``NLMSG_DONE``.
- ``SET`` acts on ``DEV_NAME`` (rename) *before* ``NET_NS_FD`` and then stops, so a move
  request must carry ``DEV_INDEX`` + ``NET_NS_FD`` only. SET needs CAP_NET_ADMIN over the
  target netns (EPERM). Other errors: EBADF/EINVAL for a bad fd, ENODEV/EINVAL for an index not
  in the socket's netns, EOPNOTSUPP in shared mode or when the driver cannot disassociate user
  contexts (rxe and siw always; only mlx4, mlx5, irdma and hns can move in 6.1).

Threading: ``RdmaNetlink`` creates its socket in ``__init__``, in the netns the calling thread is
in then, and the socket stays there whichever netns the thread enters later (so a socket opened
inside a pod keeps answering for the pod). It makes one request at a time and refuses use from any
thread but the one that opened it: two threads reading one socket could take each other's
answers. There is no asyncio underneath: it can be used in a thread that runs an event loop.
"""

from __future__ import annotations

import errno
import os
import socket
import threading
from dataclasses import dataclass
from typing import Optional

from pyroute2.netlink import (
    NLM_F_ACK,
    NLM_F_DUMP,
    NLM_F_REQUEST,
    NLMSG_DONE,
    NLMSG_ERROR,
    nlmsg,
)
from pyroute2.netlink.exceptions import NetlinkDecodeError, NetlinkError
from pyroute2.netlink.marshal import Marshal

from .netlink_exchange import Channel, open_socket

NETLINK_RDMA = 20
RDMA_NL_NLDEV = 5

RDMA_NLDEV_CMD_GET = 1
RDMA_NLDEV_CMD_SET = 2
RDMA_NLDEV_CMD_SYS_GET = 6

RDMA_NLDEV_ATTR_DEV_INDEX = 1
RDMA_NLDEV_ATTR_DEV_NAME = 2
RDMA_NLDEV_ATTR_NDEV_INDEX = 50
RDMA_NLDEV_ATTR_NDEV_NAME = 51
RDMA_NLDEV_SYS_ATTR_NETNS_MODE = 66
RDMA_NLDEV_NET_NS_FD = 68

NETNS_MODE_EXCLUSIVE = 0
NETNS_MODE_SHARED = 1
_NETNS_MODE_NAMES = {NETNS_MODE_EXCLUSIVE: "exclusive", NETNS_MODE_SHARED: "shared"}

_U32_MAX = 0xFFFFFFFF


def nldev_type(op: int) -> int:
    """The nlmsg_type of nldev operation ``op``: ``(RDMA_NL_NLDEV << 10) | op``."""
    return (RDMA_NL_NLDEV << 10) | op


class nldev_msg(nlmsg):
    """An nldev message: ``nlmsghdr`` then attributes, no family header (``fields`` is empty).

    Only the attributes this module uses are named; any other attribute in a reply decodes as
    ``UNKNOWN`` and is ignored.
    """

    __slots__ = ()

    nla_map = (
        (RDMA_NLDEV_ATTR_DEV_INDEX, "RDMA_NLDEV_ATTR_DEV_INDEX", "uint32"),
        (RDMA_NLDEV_ATTR_DEV_NAME, "RDMA_NLDEV_ATTR_DEV_NAME", "asciiz"),
        (RDMA_NLDEV_ATTR_NDEV_INDEX, "RDMA_NLDEV_ATTR_NDEV_INDEX", "uint32"),
        (RDMA_NLDEV_ATTR_NDEV_NAME, "RDMA_NLDEV_ATTR_NDEV_NAME", "asciiz"),
        (RDMA_NLDEV_SYS_ATTR_NETNS_MODE, "RDMA_NLDEV_SYS_ATTR_NETNS_MODE", "uint8"),
        (RDMA_NLDEV_NET_NS_FD, "RDMA_NLDEV_NET_NS_FD", "uint32"),
    )


class MarshalRdma(Marshal):
    """Decodes nldev replies as ``nldev_msg`` (errors and NLMSG_DONE are handled by Marshal)."""

    msg_map = {
        nldev_type(RDMA_NLDEV_CMD_GET): nldev_msg,
        nldev_type(RDMA_NLDEV_CMD_SET): nldev_msg,
        nldev_type(RDMA_NLDEV_CMD_SYS_GET): nldev_msg,
    }


@dataclass(frozen=True)
class RdmaDevice:
    """An RDMA device as the kernel lists it: its index (stable until unregistered) and name."""

    index: int
    name: str


class RdmaNetlinkUnavailable(OSError):
    """This kernel has no RDMA netlink (ib_core absent): socket() failed with EPROTONOSUPPORT."""


# --------------------------------------------------------------------------- requests


def _request(op: int, flags: int, attrs: list[tuple[str, object]] | None = None) -> nldev_msg:
    msg = nldev_msg()
    msg["header"]["type"] = nldev_type(op)
    msg["header"]["flags"] = flags
    msg["attrs"] = list(attrs or [])
    return msg


def sys_get_request() -> nldev_msg:
    """SYS_GET (0x1406), REQUEST|ACK, no attributes: asks for the netns mode."""
    return _request(RDMA_NLDEV_CMD_SYS_GET, NLM_F_REQUEST | NLM_F_ACK)


def get_dump_request() -> nldev_msg:
    """GET (0x1401), REQUEST|ACK|DUMP, no attributes: lists the devices of the socket's netns."""
    return _request(RDMA_NLDEV_CMD_GET, NLM_F_REQUEST | NLM_F_ACK | NLM_F_DUMP)


def set_netns_request(index: int, netns_fd: int) -> nldev_msg:
    """SET (0x1402), REQUEST|ACK, DEV_INDEX + NET_NS_FD: moves device ``index`` to that netns.

    Never carries DEV_NAME: the kernel would rename and skip the move.
    """
    for what, value in (("device index", index), ("netns fd", netns_fd)):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _U32_MAX:
            raise ValueError(f"{what} must be an int in [0, 2**32), got {value!r}")
    return _request(
        RDMA_NLDEV_CMD_SET,
        NLM_F_REQUEST | NLM_F_ACK,
        [("RDMA_NLDEV_ATTR_DEV_INDEX", index), ("RDMA_NLDEV_NET_NS_FD", netns_fd)],
    )


def request_bytes(msg: nldev_msg, *, seq: int, pid: int) -> bytes:
    """The exact bytes sent for ``msg`` with that sequence number and port id.

    Uses the same steps as pyroute2's ``NetlinkRequest`` (set seq/pid, reset, encode), so the
    socket sends these bytes with the seq/pid it allocates.
    """
    msg["header"]["sequence_number"] = seq
    msg["header"]["pid"] = pid
    msg.reset()
    msg.encode()
    return bytes(msg.data)


# --------------------------------------------------------------------------- replies


def parse_reply(data: bytes) -> list[nldev_msg]:
    """Decode a buffer of netlink messages into the nldev messages it holds.

    An NLMSG_ERROR with a non-zero code raises ``OSError(errno)``; acks (error 0) and
    NLMSG_DONE are dropped.
    """
    out = []
    try:
        msgs = list(MarshalRdma().parse(data))
    except NetlinkDecodeError as e:
        raise _os_error(e, "RDMA netlink reply") from None
    for msg in msgs:
        error = msg["header"].get("error")
        if error is not None:
            raise _os_error(error, "RDMA netlink request")
        if msg["header"]["type"] in (NLMSG_ERROR, NLMSG_DONE):
            continue
        out.append(msg)
    return out


def devices_from_messages(msgs: list[nlmsg]) -> list[RdmaDevice]:
    """RdmaDevice for each GET reply (DEV_INDEX + DEV_NAME), in the kernel's order."""
    devices = []
    for msg in msgs:
        if msg["header"]["type"] != nldev_type(RDMA_NLDEV_CMD_GET):
            continue
        index = msg.get_attr("RDMA_NLDEV_ATTR_DEV_INDEX")
        name = msg.get_attr("RDMA_NLDEV_ATTR_DEV_NAME")
        if index is None or not name:
            raise OSError(errno.EPROTO, "RDMA netlink GET reply lacks DEV_INDEX or DEV_NAME")
        devices.append(RdmaDevice(index=index, name=name))
    return devices


def netns_mode_from_messages(msgs: list[nlmsg]) -> str | None:
    """The mode ("shared" / "exclusive") in a SYS_GET reply; None without the attribute."""
    for msg in msgs:
        if msg["header"]["type"] != nldev_type(RDMA_NLDEV_CMD_SYS_GET):
            continue
        value = msg.get_attr("RDMA_NLDEV_SYS_ATTR_NETNS_MODE")
        if value is None:
            continue
        if value not in _NETNS_MODE_NAMES:
            raise OSError(errno.EPROTO, f"RDMA netlink: unknown netns mode {value}")
        return _NETNS_MODE_NAMES[value]
    return None


def _os_error(error: BaseException, what: str) -> OSError:
    if isinstance(error, NetlinkError):
        code = abs(error.code)
        return OSError(code, f"{what}: {os.strerror(code)}")
    if isinstance(error, OSError):
        return error
    return OSError(errno.EPROTO, f"{what}: undecodable reply ({error!r})")


# --------------------------------------------------------------------------- socket


class RdmaNetlink:
    """An NETLINK_RDMA socket in the calling thread's current netns; use it as a context manager.

    ``RdmaNetlink()`` raises ``RdmaNetlinkUnavailable`` (errno EPROTONOSUPPORT) on a kernel
    without RDMA netlink. Kernel errors of a request are raised as ``OSError`` with the errno.
    ``use_socket`` (tests only) substitutes another datagram socket for the netlink one (the
    object then owns and closes it; the requests carry port id 0).
    """

    def __init__(self, *, use_socket: Optional[socket.socket] = None) -> None:
        self._owner = threading.get_ident()
        if use_socket is None:
            try:
                use_socket = open_socket(NETLINK_RDMA)
            except OSError as e:
                if e.errno in (errno.EPROTONOSUPPORT, errno.EAFNOSUPPORT):
                    raise RdmaNetlinkUnavailable(
                        e.errno, "this kernel has no RDMA netlink (NETLINK_RDMA): RDMA core not loaded"
                    ) from None
                raise
        self._sock = use_socket
        self._pid = use_socket.getsockname()[0] if use_socket.family == socket.AF_NETLINK else 0
        self._seq = 0
        self._channel = Channel(use_socket, MarshalRdma(), "RDMA netlink")

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "RdmaNetlink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, msg: nldev_msg, what: str) -> list[nlmsg]:
        if threading.get_ident() != self._owner:
            raise RuntimeError("RdmaNetlink used from a thread other than the one that opened it")
        self._seq = self._seq % 0x7FFFFFFF + 1
        data = request_bytes(msg, seq=self._seq, pid=self._pid)
        try:
            return self._channel.exchange(data, self._seq)
        except (NetlinkError, NetlinkDecodeError) as e:
            raise _os_error(e, what) from None

    def netns_mode(self) -> str | None:
        """Mode: "shared" or "exclusive"; None if the kernel predates SYS_GET or omits the mode."""
        try:
            msgs = self._call(sys_get_request(), "RDMA netlink SYS_GET")
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):  # no SYS_GET handler (< 5.2)
                return None
            raise
        return netns_mode_from_messages(msgs)

    def list_devices(self) -> list[RdmaDevice]:
        """The RDMA devices visible from the socket's netns (GET dump)."""
        return devices_from_messages(self._call(get_dump_request(), "RDMA netlink GET"))

    def device_by_name(self, name: str) -> RdmaDevice | None:
        """The device called ``name`` in the socket's netns, or None."""
        return next((d for d in self.list_devices() if d.name == name), None)

    def move_device(self, index: int, netns_fd: int) -> None:
        """Move device ``index`` (as the socket's netns sees it) into ``netns_fd``'s netns."""
        self._call(set_netns_request(index, netns_fd), f"moving RDMA device index {index}")


# --------------------------------------------------------------------------- one-shot helpers


def netns_mode() -> str | None:
    """The RDMA netns mode: "shared", "exclusive", or None when this kernel has no RDMA netlink
    (or a SYS_GET without the mode). Opens and closes a socket in the calling thread's netns."""
    try:
        with RdmaNetlink() as nl:
            return nl.netns_mode()
    except RdmaNetlinkUnavailable:
        return None


def list_devices() -> list[RdmaDevice]:
    """RDMA devices visible from the calling thread's netns; [] on a kernel without RDMA netlink
    (no RDMA core, hence no RDMA device)."""
    try:
        with RdmaNetlink() as nl:
            return nl.list_devices()
    except RdmaNetlinkUnavailable:
        return []


def device_by_name(name: str) -> RdmaDevice | None:
    """The device called ``name`` in the calling thread's netns, or None (also without RDMA)."""
    return next((d for d in list_devices() if d.name == name), None)


def move_device(index: int, netns_fd: int) -> None:
    """Move device ``index`` (resolved in the calling thread's netns) into ``netns_fd``'s netns.

    Raises ``OSError`` with the kernel's errno; ``RdmaNetlinkUnavailable`` (EPROTONOSUPPORT)
    when the kernel has no RDMA netlink.
    """
    set_netns_request(index, netns_fd)  # validate before opening a socket
    with RdmaNetlink() as nl:
        nl.move_device(index, netns_fd)
