"""A synchronous rtnetlink socket driven with pyroute2's own request processing and messages.

pyroute2 0.9's ``IPRoute`` is a synchronous face on its asyncio core: every ``IPRoute()`` makes an
event loop and every request runs that loop (tasks, futures, a selector) around one
``send``/``recv``. In the daemon that machinery was the larger part of an ADD's CPU. :class:`Rtnl`
keeps what makes pyroute2 worth using, its request filters (``link("set", state="up")``,
``kind="macvlan"``, ...), its message classes (ifinfmsg, ifaddrmsg, rtmsg) and its parser, and
replaces only the transport: a plain NETLINK_ROUTE socket, one request at a time, the answer read
until its ACK (or NLMSG_DONE for a dump). The messages that go out are pyroute2's message
classes encoding the same fields and attributes as ``IPRoute``'s (byte for byte,
tests/test_rtnl_messages.py); the plain ones are filled directly (:func:`_plain`), the others
through pyroute2's request filters.

Only the requests the plugins make on their hot path are served this way (see :data:`FAST`, and
the dumps :meth:`Rtnl.get_links`, :meth:`Rtnl.get_addr`, :meth:`Rtnl.get_routes` and :meth:`Rtnl.get_rules`,
and :meth:`Rtnl.get_netnsid`); anything else (``put``/``get`` of a
hand-built message, ...) goes to a real ``IPRoute`` opened on first use in the
same network namespace, so the two always agree.

A netlink socket stays bound to the namespace it was created in, whichever namespace the thread
is in later (rdmanet.cni.linux.netns).
"""

from __future__ import annotations

import os
import socket
from typing import Any, Optional

from pyroute2.netlink import NLM_F_ACK, NLM_F_ATOMIC, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NLM_F_ROOT
from pyroute2.netlink.marshal import Marshal
from pyroute2.netlink.rtnl import (
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_DELLINKPROP,
    RTM_DELROUTE,
    RTM_DELRULE,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETNSID,
    RTM_GETROUTE,
    RTM_GETRULE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWLINKPROP,
    RTM_NEWNSID,
    RTM_NEWROUTE,
    RTM_NEWRULE,
    RTM_SETLINK,
    RTM_VALUES,
)
from pyroute2.netlink.rtnl.fibmsg import fibmsg
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.nsidmsg import nsidmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from . import netns
from .netlink_exchange import Channel, open_socket

REQ = NLM_F_REQUEST | NLM_F_ACK
RULE_KEYS = {"family", "priority", "table", "src", "src_len", "oifname"}  # rdmanet.cni.linux.rail_routing's rules
# (mode, command) -> (message class, type, flags, the keyword arguments served here): as IPRoute's
# command maps (pyroute2.iproute.linux); other arguments or commands go to IPRoute itself.
FAST = {
    ("link", "get"): (ifinfmsg, RTM_GETLINK, REQ, {"index", "ifname"}),
    ("link", "add"): (ifinfmsg, RTM_NEWLINK, REQ | NLM_F_CREATE | NLM_F_EXCL,
                      {"ifname", "kind", "link", "macvlan_mode", "net_ns_fd", "address", "mtu"}),
    ("link", "set"): (ifinfmsg, RTM_NEWLINK, REQ, {"index", "ifname", "ifalias", "state", "net_ns_fd", "mtu", "address"}),
    ("link", "del"): (ifinfmsg, RTM_DELLINK, REQ, {"index"}),
    ("link", "property_del"): (ifinfmsg, RTM_DELLINKPROP, REQ, {"index", "altname"}),
    ("addr", "add"): (ifaddrmsg, RTM_NEWADDR, REQ | NLM_F_CREATE | NLM_F_EXCL, {"index", "address", "prefixlen"}),
    ("route", "add"): (rtmsg, RTM_NEWROUTE, REQ | NLM_F_CREATE | NLM_F_EXCL,
                       {"dst", "oif", "gateway", "priority", "table", "scope"}),
    ("rule", "add"): (fibmsg, RTM_NEWRULE, REQ | NLM_F_CREATE | NLM_F_EXCL, RULE_KEYS),
    ("rule", "del"): (fibmsg, RTM_DELRULE, REQ, RULE_KEYS),
}

# The requests whose IPRoute encoding is plain (fields plus one NLA per argument, in argument
# order) skip pyroute2's request filters, which cost more than the encoding itself (~40 us of
# the ~80 us of a link get); tests/test_rtnl_messages.py holds them to IPRoute's bytes.
LINK_NLAS = {"ifname": "IFLA_IFNAME", "ifalias": "IFLA_IFALIAS", "mtu": "IFLA_MTU", "address": "IFLA_ADDRESS",
             "net_ns_fd": "IFLA_NET_NS_FD", "link": "IFLA_LINK"}
MACVLAN_MODE_VALUES = {"private": 1, "vepa": 2, "bridge": 4, "passthru": 8}
LINK_STATES = {"up": 1, "down": 0}


def _plain(mode: str, command: str, kwarg: dict) -> Optional[tuple[dict, list]]:
    """(fields, NLAs) of a request IPRoute encodes plainly; None: build it through the filters."""
    if any(value is None for value in kwarg.values()):
        return None
    if mode == "link":
        fields = {"index": kwarg.get("index", 0)}
        if command == "add":
            kind = kwarg.get("kind")
            if kind != "macvlan" or kwarg.get("macvlan_mode") not in MACVLAN_MODE_VALUES or "ifname" not in kwarg:
                return None
            info = [["IFLA_INFO_KIND", kind],
                    ["IFLA_INFO_DATA", {"attrs": [["IFLA_MACVLAN_MODE", MACVLAN_MODE_VALUES[kwarg["macvlan_mode"]]]]}]]
            return fields, [[LINK_NLAS[k], v] for k, v in kwarg.items() if k in LINK_NLAS] + [["IFLA_LINKINFO", {"attrs": info}]]
        if command in ("get", "set", "del"):
            if "state" in kwarg:
                if kwarg["state"] not in LINK_STATES:
                    return None
                fields["flags"], fields["change"] = LINK_STATES[kwarg["state"]], 1
            return fields, [[LINK_NLAS[k], v] for k, v in kwarg.items() if k in LINK_NLAS]
        return None
    if mode == "addr" and command == "add":
        address = kwarg.get("address")
        if not isinstance(address, str) or "index" not in kwarg or "prefixlen" not in kwarg:
            return None
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        nlas = [["IFA_ADDRESS", address]]
        if family == socket.AF_INET:
            nlas.append(["IFA_LOCAL", address])
        return {"family": family, "prefixlen": kwarg["prefixlen"], "index": kwarg["index"]}, nlas
    return None


# Only the parts of pyroute2 that build and parse these messages are imported: its IPRoute module
# (pyroute2.iproute.linux) and MarshalRtnl pull in asyncio, ssl, multiprocessing, unittest.mock and
# every tc plugin, ~30 ms of a plugin exec that runs in-process. The two pieces taken from them
# below are checked against the originals by tests/test_rtnl_messages.py (same bytes out, same
# parse in).


def request_filters(mode: str, command: str) -> list:
    """pyroute2.iproute.linux.get_default_request_filters for the modes served here. Imported on
    first use: the plain requests (:func:`_plain`) do without them, and a DEL makes only those."""
    from pyroute2.requests.address import AddressFieldFilter, AddressIPRouteFilter
    from pyroute2.requests.link import LinkFieldFilter, LinkIPRouteFilter
    from pyroute2.requests.route import RouteFieldFilter, RouteIPRouteFilter
    from pyroute2.requests.rule import RuleFieldFilter, RuleIPRouteFilter

    if mode == "link":
        return [LinkFieldFilter(), LinkIPRouteFilter(command)]
    if mode == "addr":
        return [AddressFieldFilter(), AddressIPRouteFilter(command)]
    if mode == "route":
        return [RouteFieldFilter(add_defaults=command not in ("dump", "show")), RouteIPRouteFilter(command)]
    if mode == "rule":
        return [RuleFieldFilter(), RuleIPRouteFilter(command)]
    raise ValueError(f"no request filters here for {mode!r}")


def arguments_processor(mode: str, command: str, query: dict, parameters: Optional[dict] = None):
    """pyroute2.iproute.linux.get_arguments_processor (``query`` without ``request_filter``)."""
    from pyroute2.requests.main import RequestProcessor

    processor = RequestProcessor(context=query, prime=query)
    for name, value in (parameters or {}).items():
        processor.set_parameter(name, value)
    for request_filter in request_filters(mode, command):
        processor.add_filter(request_filter)
    processor.finalize()
    return processor


class MarshalLinks(Marshal):
    """pyroute2's MarshalRtnl for the messages of links, addresses, routes and rules (all that the
    requests served here are answered with); other types parse as plain ``nlmsg``."""

    msg_map = {
        **dict.fromkeys((RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_SETLINK, RTM_NEWLINKPROP, RTM_DELLINKPROP), ifinfmsg),
        **dict.fromkeys((RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR), ifaddrmsg),
        **dict.fromkeys((RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE), rtmsg),
        **dict.fromkeys((RTM_NEWRULE, RTM_DELRULE, RTM_GETRULE), fibmsg),
        RTM_NEWNSID: nsidmsg,
    }

    def fix_message(self, msg) -> None:  # as MarshalRtnl's
        try:
            msg["event"] = RTM_VALUES[msg["header"]["type"]]
        except Exception:
            pass


class Rtnl:
    """An rtnetlink socket in the namespace the calling thread is in (``IPRoute``'s interface for
    the requests in :data:`FAST`, ``IPRoute`` itself for the rest)."""

    def __init__(self) -> None:
        self._sock = open_socket(socket.NETLINK_ROUTE)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            self._ns = netns.current_netns_fd()  # for the IPRoute of the other requests
        except BaseException:
            self._sock.close()
            raise
        self._pid = self._sock.getsockname()[0]
        self._seq = 0
        self._marshal = MarshalLinks()
        self._ipr: Optional[Any] = None
        self._channel = Channel(self._sock, self._marshal, "rtnetlink")

    # ------------------------------------------------------------------ IPRoute's interface

    def link(self, command: str, **kwarg: Any):
        return self._request("link", command, kwarg)

    def addr(self, command: str, **kwarg: Any):
        return self._request("addr", command, kwarg)

    def route(self, command: str, **kwarg: Any):
        return self._request("route", command, kwarg)

    def rule(self, command: str, **kwarg: Any):
        return self._request("rule", command, kwarg)

    def get_links(self, *argv: Any, **kwarg: Any):
        if argv or kwarg:
            return self._fallback().get_links(*argv, **kwarg)
        return self._exchange(self._filled(ifinfmsg, RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, {}, []))

    def get_addr(self, *argv: Any, **kwarg: Any):
        """``IPRoute.get_addr`` by ``family`` and ``index``: one dump of the family's addresses
        (the kernel does not filter a dump unless strict checking is on), the link's kept here."""
        if argv or not kwarg.keys() <= {"family", "index"}:
            return self._fallback().get_addr(*argv, **kwarg)
        index = kwarg.get("index")
        return self._family_dump(ifaddrmsg, RTM_GETADDR, kwarg.get("family") or 0,
                                 lambda msg: index is None or msg["index"] == index)

    def get_routes(self, *argv: Any, **kwarg: Any):
        """``IPRoute.get_routes`` by ``family`` and ``table``: one dump of the family's routes of
        every table, the table's kept here."""
        if argv or not kwarg.keys() <= {"family", "table"}:
            return self._fallback().get_routes(*argv, **kwarg)
        table = kwarg.get("table")
        return self._family_dump(rtmsg, RTM_GETROUTE, kwarg.get("family") or 0,
                                 lambda msg: table is None or msg.get("RTA_TABLE") == table)

    def _family_dump(self, cls: type, msg_type: int, family: int, keep) -> list:
        """The answers of one dump of ``family`` (0: all) that ``keep`` keeps."""
        dump = self._filled(cls, msg_type, NLM_F_REQUEST | NLM_F_DUMP, {"family": family}, [])
        return [msg for msg in self._exchange(dump) if (not family or msg["family"] == family) and keep(msg)]

    def get_netnsid(self, *argv: Any, **kwarg: Any) -> dict:
        """``IPRoute.get_netnsid(fd=...)``: ``{"nsid": n}``, the id this namespace gives the one
        open as ``fd`` (-1: it gives it none)."""
        if argv or kwarg.keys() != {"fd"}:
            return self._fallback().get_netnsid(*argv, **kwarg)
        nsid = -1
        for answer in self._exchange(self._filled(nsidmsg, RTM_GETNSID, REQ, {}, [["NETNSA_FD", kwarg["fd"]]])):
            value = answer.get("NETNSA_NSID")
            if isinstance(value, int):
                nsid = value - (1 << 32) if value >= 1 << 31 else value  # the kernel's s32
        return {"nsid": nsid}

    def get_rules(self, *argv: Any, **kwarg: Any):
        """``IPRoute.get_rules`` by ``family`` (0: every family): one dump."""
        if argv or not kwarg.keys() <= {"family"}:
            return self._fallback().get_rules(*argv, **kwarg)
        family = kwarg.get("family") or 0
        # flags as IPRoute's rule dump ("root": NLM_F_ROOT | NLM_F_ATOMIC; the kernel dumps on either bit)
        dump = self._filled(fibmsg, RTM_GETRULE, NLM_F_REQUEST | NLM_F_ROOT | NLM_F_ATOMIC, {"family": family}, [])
        return [msg for msg in self._exchange(dump) if not family or msg["family"] == family]

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._fallback(), name)

    def fileno(self) -> int:
        """The socket's fd (as ``IPRoute.fileno``): an ioctl on it is answered for its namespace."""
        return self._sock.fileno()

    def subscribed(self, groups: int) -> socket.socket:
        """A new netlink socket in this one's namespace receiving the notifications of the
        multicast ``groups`` (RTMGRP_* bits); the caller closes it."""
        with netns.entered_fd(self._ns):
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        try:
            sock.bind((0, groups))
        except BaseException:
            sock.close()
            raise
        return sock

    def detached(self) -> Channel:
        """A channel over a duplicate of this socket, for a request whose answer may come after
        this Rtnl is closed (whoever holds the channel closes ``channel.sock``). This Rtnl makes
        no request after it (they would share the answers): its own requests raise EIO."""
        channel = Channel(self._sock.dup(), MarshalLinks(), "rtnetlink")
        self._channel.broken = True
        return channel

    def close(self) -> None:
        if self._ipr is not None:
            self._ipr.close()
            self._ipr = None
        if self._ns is not None:
            os.close(self._ns)
            self._ns = None
        self._sock.close()

    def __enter__(self) -> "Rtnl":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def _fallback(self):
        if self._ipr is None:
            from pyroute2.iproute.linux import IPRoute

            with netns.entered_fd(self._ns):
                self._ipr = IPRoute()
        return self._ipr

    def _request(self, mode: str, command: str, kwarg: dict):
        msg = self.build(mode, command, kwarg)
        if msg is None:
            return getattr(self._fallback(), mode)(command, **kwarg)
        return self._exchange(msg)

    def build(self, mode: str, command: str, kwarg: dict):
        """The encoded request ``IPRoute.<mode>(command, **kwarg)`` would send (None: not served here)."""
        spec = FAST.get((mode, command))
        if spec is None or not kwarg.keys() <= spec[3]:
            return None
        cls, msg_type, flags, _ = spec
        plain = _plain(mode, command, kwarg)
        if plain is not None:
            return self._filled(cls, msg_type, flags, *plain)
        kwarg = dict(kwarg)
        if mode == "route":  # as IPRoute.route does for add
            kwarg["proto"] = kwarg.get("proto", "static") or "static"
            kwarg["type"] = kwarg.get("type", "unicast") or "unicast"
        return self._message(cls, msg_type, flags, mode, command, kwarg)

    def _filled(self, cls: type, msg_type: int, flags: int, fields: dict, attrs: list):
        """The request with ``fields`` (the others 0) and ``attrs`` set directly, encoded."""
        msg = cls()
        self._seq = self._seq % 0x7FFFFFFF + 1
        header = msg["header"]
        header["type"] = msg_type
        header["flags"] = flags
        header["sequence_number"] = self._seq
        header["pid"] = self._pid
        for name, value in fields.items():
            msg[name] = value
        msg["attrs"] = attrs
        msg.encode()
        return msg

    def _message(self, cls: type, msg_type: int, flags: int, mode: str, command: str, kwarg: dict):
        """The request as NetlinkRequest fills it (fields, then the NLAs the filters made)."""
        parameters = {"strict_check": False} if mode == "route" else None  # as IPRoute.route (no strict checking)
        request_filter = arguments_processor(mode, command, kwarg, parameters)
        msg = cls()
        self._seq = self._seq % 0x7FFFFFFF + 1
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = flags
        msg["header"]["sequence_number"] = self._seq
        msg["header"]["pid"] = self._pid
        msg.reset()
        for field in msg.fields:
            msg[field[0]] = request_filter.get_value(field[0], default=0, mode="field")
        for key, value in request_filter.items():
            nla = cls.name2nla(key)
            if msg.valid_nla(nla) and value is not None:
                msg["attrs"].append([nla, value])
        if "attrs" in request_filter:
            msg["attrs"].extend(request_filter["attrs"])
        msg.encode()
        return msg

    def _exchange(self, msg) -> list:
        """Send ``msg``; its answers up to the ACK (or NLMSG_DONE); NetlinkError when refused
        (rdmanet.cni.linux.netlink_exchange)."""
        return self._channel.exchange(msg.data, msg["header"]["sequence_number"])
