"""Send a hand-built rtnetlink message on a pyroute2 socket and wait for the kernel's answer.

For requests pyroute2's own ``link()`` arguments cannot express exactly (a struct of the
kernel's size, an attribute order): the caller builds the message, this sends it as is, so a
test can compare ``msg.encode()`` with the kernel ABI byte for byte and know those are the bytes
that went out.
"""

from __future__ import annotations

from typing import Any

from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST


def send(ipr: Any, msg: Any, msg_type: int, flags: int = 0) -> None:
    """Send ``msg`` (``msg_type``, NLM_F_REQUEST | NLM_F_ACK | ``flags``) and wait for the ACK;
    NetlinkError when the kernel refuses. put + get: IPRoute.nlm_request of pyroute2 0.9.7 fails
    with KeyError 'nlm_generator' for a message built by hand."""
    request = ipr.put(msg, msg_type, NLM_F_REQUEST | NLM_F_ACK | flags)
    try:
        ipr.get(msg_seq=request.msg_seq)
    finally:
        cleanup = getattr(request, "cleanup", None)
        if cleanup is not None:
            cleanup()
