"""One netlink request and its answers over a plain socket: the exchange both our netlink clients
share (rtnetlink, :class:`rdmanet.cni.linux.rtnl.Rtnl`; RDMA netlink, :class:`rdmanet.cni.linux.rdma_netlink.RdmaNetlink`).

pyroute2 0.9 drives its sockets through an asyncio loop per socket (tasks, futures, a selector
around each ``send``/``recv``); these clients keep pyroute2's message classes and parser and use
this loop instead: send the request, read datagrams and parse them with the client's ``Marshal``
until the answer's ACK or NLMSG_DONE.

Kernel facts relied on (net/netlink/af_netlink.c): a request is answered on the socket that sent
it, in the sequence number it carried; a request with NLM_F_ACK ends with an NLMSG_ERROR whose
error is 0 (the ACK) or a negative errno (the refusal); a dump ends with NLMSG_DONE instead. A
socket also holds whatever an earlier, interrupted exchange left unread, so answers carrying
another sequence number are skipped, and an exchange cut short by anything but the kernel's
refusal leaves the socket unusable (its next answer could be the previous request's).
"""

from __future__ import annotations

import errno
import socket

from pyroute2.netlink import NLMSG_DONE, NLMSG_ERROR
from pyroute2.netlink.exceptions import NetlinkError

RECV = 1 << 16


def open_socket(protocol: int) -> socket.socket:
    """A netlink socket of ``protocol`` in the calling thread's network namespace, bound to a port
    the kernel picks (``getsockname()[0]`` is the port id). It stays in that namespace whichever
    namespace the thread enters later."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
    try:
        sock.bind((0, 0))
    except BaseException:
        sock.close()
        raise
    return sock


class Channel:
    """Requests over ``sock`` one at a time, answers parsed by ``marshal`` (a pyroute2 ``Marshal``);
    ``what`` names the socket in errors ("rtnetlink", "RDMA netlink")."""

    def __init__(self, sock: socket.socket, marshal, what: str) -> None:
        self.sock = sock
        self.marshal = marshal
        self.what = what
        self.broken = False

    def exchange(self, data: bytes, seq: int) -> list:
        """Send the encoded request ``data`` (sequence number ``seq``); the answers to it up to its
        ACK (or NLMSG_DONE), without either. The kernel's refusal raises pyroute2's
        ``NetlinkError`` (``.code`` the errno); anything else that cuts the exchange short (a
        signal, an undecodable answer, lost messages) marks the channel broken, after which every
        exchange raises ``NetlinkError(EIO)``."""
        if self.broken:
            raise NetlinkError(errno.EIO, f"{self.what} socket lost its place in an earlier request")
        self.sock.send(data)
        out = []
        try:
            while True:
                for answer in self.marshal.parse(self.sock.recv(RECV)):
                    header = answer["header"]
                    if header["sequence_number"] != seq:
                        continue  # a late answer to an earlier request
                    kind = header["type"]
                    if kind == NLMSG_ERROR:
                        if header["error"] is not None:
                            raise header["error"]
                        return out  # the ACK
                    if kind == NLMSG_DONE:
                        return out
                    if header.get("error") is not None:
                        raise header["error"]
                    out.append(answer)
        except NetlinkError:
            raise
        except BaseException:
            self.broken = True  # an answer may still be queued: never read it as the next one's
            raise

