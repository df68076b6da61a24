"""IPoIB child interfaces over rtnetlink: the request that creates one, and the kernel's refusals.

The request (``ip link add <name> link <parent> type ipoib pkey <p> mode <m> umcast 1``) is
RTM_NEWLINK with NLM_F_CREATE | NLM_F_EXCL carrying ``IFLA_IFNAME``, ``IFLA_LINK`` (the parent's
ifindex) and ``IFLA_LINKINFO`` → ``IFLA_INFO_KIND`` "ipoib" + ``IFLA_INFO_DATA`` →
``IFLA_IPOIB_PKEY`` / ``_MODE`` / ``_UMCAST`` (1 / 2 / 3, u16 each, host order). It is built with
pyroute2's ``ifinfmsg`` (its ``ipoib`` plugin encodes those three as u16, checked byte for byte
in tests/test_ipoib_netlink.py) and sent as built (:mod:`rdmanet.cni.linux.netlink_request`).

Kernel answers (drivers/infiniband/ulp/ipoib/ipoib_netlink.c ``ipoib_new_child_link``, ipoib_vlan.c;
the first three seen on Debian's 6.1 kernel in the test VM and on this machine's kernel):

=========== ==================================================================================
EOPNOTSUPP  no ``ipoib`` link kind: ib_ipoib is not loaded ("Unknown device type")
ENODEV      the parent does not exist or is not ARPHRD_INFINIBAND (an Ethernet/RoCE port, lo)
EINVAL      no parent, a parent that is itself a child, pkey 0 / 0x8000, a mode other than 0/1,
            or connected mode on a port without the RC capability (enhanced IPoIB)
EEXIST      the name is taken
=========== ==================================================================================
"""

from __future__ import annotations

import errno
import os
from typing import Any

from pyroute2.netlink import NLM_F_CREATE, NLM_F_EXCL
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from rdmanet.cni.core.errors import LINK_FAILURE, CNIError
from rdmanet.cni.core.infiniband import IPOIB_MODE, PKEY_FULL_MEMBER, PKEY_MASK, pkey_text

from .netlink_request import send

KIND = "ipoib"
MACVLAN_FIX = ("an Ethernet or RoCE port takes macvlan-rdma (\"type\": \"macvlan-rdma\"); ipoib-rdma needs the IPoIB "
               "netdev of an InfiniBand port, e.g. ib0 (see 'rdmanet doctor' or /sys/class/net/<if>/type = 32)")
MODULE_FIX = ("load the IPoIB driver: modprobe ib_ipoib (the HCA driver, e.g. mlx5_ib, loads it with an IB port); "
              "on a RoCE/Ethernet port use macvlan-rdma instead")


def child_request(name: str, parent_index: int, pkey: int, mode: str, umcast: bool = True) -> ifinfmsg:
    """The RTM_NEWLINK message creating IPoIB child ``name`` of ``parent_index``. ``pkey`` is the
    15-bit key (sent with the full-member bit, which the kernel sets anyway); ``mode`` is
    "datagram" or "connected"."""
    if mode not in IPOIB_MODE:
        raise ValueError(f"mode {mode!r} is not one of {sorted(IPOIB_MODE)}")
    msg = ifinfmsg()
    msg["family"] = 0
    msg["attrs"] = [
        ("IFLA_IFNAME", name),
        ("IFLA_LINK", parent_index),
        ("IFLA_LINKINFO", {"attrs": [
            ("IFLA_INFO_KIND", KIND),
            ("IFLA_INFO_DATA", {"attrs": [
                ("IFLA_IPOIB_PKEY", (pkey & PKEY_MASK) | PKEY_FULL_MEMBER),
                ("IFLA_IPOIB_MODE", mode),
                ("IFLA_IPOIB_UMCAST", int(bool(umcast))),
            ]}),
        ]}),
    ]
    return msg


REQUEST_FLAGS = NLM_F_CREATE | NLM_F_EXCL


def create_child(ipr: Any, name: str, parent_index: int, parent_name: str, pkey: int, mode: str) -> None:
    """Create the child in ``ipr``'s namespace; CNIError 100 naming the cause and the fix."""
    try:
        send(ipr, child_request(name, parent_index, pkey, mode), RTM_NEWLINK, REQUEST_FLAGS)
    except NetlinkError as exc:
        raise refusal(exc.code, parent_name, pkey, mode) from None


def refusal(code: int, master: str, pkey: int, mode: str) -> CNIError:
    """The CNI error for the kernel's answer ``code`` to :func:`child_request`."""
    what = f"create IPoIB child of master {master} (pkey {pkey_text(pkey)}, mode {mode})"
    if code == errno.EOPNOTSUPP:
        return CNIError(LINK_FAILURE, f"{what}: the kernel has no ipoib link kind: ib_ipoib is not loaded",
                        f"{MODULE_FIX} (errno {code})")
    if code == errno.ENODEV:
        return CNIError(LINK_FAILURE, f"{what}: master {master} is not an IPoIB netdev", f"{MACVLAN_FIX} (errno {code})")
    if code == errno.EINVAL:
        hint = ("connected mode needs a port whose IPoIB address has the RC flag (ConnectX-4 and later run enhanced "
                "IPoIB, datagram only): set \"mode\": \"datagram\"; otherwise master must be a parent port, not a child"
                if mode == "connected" else
                "master must be an IPoIB parent port (ib0), not a child, and pkey a valid partition key")
        return CNIError(LINK_FAILURE, f"{what}: {os.strerror(code)}", f"{hint} (errno {code})")
    if code == errno.EEXIST:
        return CNIError(LINK_FAILURE, f"{what}: the name is taken", f"an earlier attachment left the link behind; DEL it first (errno {code})")
    return CNIError(LINK_FAILURE, f"{what}: {os.strerror(code)}", f"check the node's kernel log (dmesg) (errno {code})")
