"""rdmanet.cni.linux.rtnl sends the bytes pyroute2's IPRoute would send for the same call: each request it
serves itself is built here both ways and compared (IPRoute's is caught before it is sent)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyroute2")

from pyroute2.iproute.linux import IPRoute  # noqa: E402
from pyroute2.netlink import NLMSG_DONE, nlsocket  # noqa: E402

from rdmanet.cni.linux import rtnl  # noqa: E402
from rdmanet.cni.linux.netlink_exchange import RECV  # noqa: E402

CALLS = [
    ("link", "get", {"index": 1}),
    ("link", "get", {"ifname": "net1"}),
    ("link", "add", {"ifname": "mvr0123456789ab", "kind": "macvlan", "link": 7, "macvlan_mode": "bridge", "net_ns_fd": 9}),
    ("link", "add", {"ifname": "mvr0", "kind": "macvlan", "link": 7, "macvlan_mode": "private", "address": "02:00:00:00:00:01",
                     "mtu": 1400}),
    ("link", "set", {"index": 5, "state": "up"}),
    ("link", "set", {"index": 5, "state": "down"}),
    ("link", "set", {"index": 5, "ifname": "net1", "ifalias": "rdmanet:abc"}),
    ("link", "set", {"index": 5, "net_ns_fd": 9}),
    ("link", "set", {"index": 5, "mtu": 9000}),
    ("link", "set", {"index": 5, "address": "02:00:00:00:00:02"}),
    ("link", "set", {"index": 5, "ifalias": "rdmanet:abc done", "state": "up"}),
    ("link", "set", {"index": 5, "mtu": 1500, "address": "02:00:00:00:00:03", "ifname": "net2", "state": "down"}),
    ("link", "get", {"index": 3, "ifname": "net1"}),
    ("link", "add", {"ifname": "mvr1", "kind": "macvlan", "link": 7, "macvlan_mode": "vepa", "net_ns_fd": 9,
                     "address": "02:00:00:00:00:04", "mtu": 9000}),
    ("link", "add", {"ifname": "mvr2", "kind": "macvlan", "link": 7, "macvlan_mode": "passthru"}),
    ("link", "del", {"index": 5}),
    ("link", "property_del", {"index": 5, "altname": "ens1f0"}),
    ("addr", "add", {"index": 5, "address": "10.1.2.3", "prefixlen": 24}),
    ("addr", "add", {"index": 5, "address": "fd00::3", "prefixlen": 64}),
    ("addr", "add", {"index": 70000, "address": "192.0.2.255", "prefixlen": 32}),
    ("addr", "add", {"index": 5, "address": "2001:db8::1:0:0:1", "prefixlen": 128}),
    ("route", "add", {"dst": "10.9.0.0/16", "oif": 5, "gateway": "10.1.2.1"}),
    ("route", "add", {"dst": "0.0.0.0/0", "oif": 5}),
    ("route", "add", {"dst": "fd01::/64", "oif": 5, "gateway": "fd00::1", "priority": 100, "table": 100, "scope": 0}),
    ("rule", "add", {"family": 2, "priority": 10003, "table": 10003, "oifname": "net3"}),
    ("rule", "add", {"family": 2, "priority": 10003, "table": 10003, "src": "10.1.2.3", "src_len": 32}),
    ("rule", "add", {"family": 10, "priority": 10001, "table": 20001, "src": "fd00::3", "src_len": 128}),
    ("rule", "del", {"family": 2, "priority": 10003, "table": 10003, "oifname": "net3"}),
    ("rule", "del", {"family": 10, "priority": 10001, "table": 10001, "src": "fd00::3", "src_len": 128}),
]


class Caught(Exception):
    pass


def pyroute2_bytes(monkeypatch, mode, command, kwarg) -> bytes:
    seen = []
    original = nlsocket.NetlinkRequest.prepare

    async def prepare(self):
        await original(self)
        seen.append(bytes(self.msg.data))
        raise Caught()

    monkeypatch.setattr(nlsocket.NetlinkRequest, "prepare", prepare)
    ipr = IPRoute()
    try:
        with pytest.raises(Caught):
            getattr(ipr, mode)(command, **dict(kwarg))
    finally:
        monkeypatch.setattr(nlsocket.NetlinkRequest, "prepare", original)
        ipr.close()
    return seen[0]


def without_seq_and_pid(data: bytes) -> bytes:
    return data[:8] + bytes(8) + data[16:]  # nlmsghdr: len, type, flags | seq, pid | payload


@pytest.mark.parametrize("mode,command,kwarg", CALLS, ids=[f"{m}-{c}-{i}" for i, (m, c, _) in enumerate(CALLS)])
def test_the_same_message_as_iproute(monkeypatch, mode, command, kwarg):
    sock = rtnl.Rtnl()
    try:
        msg = sock.build(mode, command, dict(kwarg))
        assert msg is not None  # served by Rtnl itself, not by its IPRoute
        ours = bytes(msg.data)
    finally:
        sock.close()
    assert without_seq_and_pid(ours) == without_seq_and_pid(pyroute2_bytes(monkeypatch, mode, command, kwarg))


@pytest.mark.parametrize("dump,mode,kwarg", [("get_links", "link", {}), ("get_rules", "rule", {}),
                                             ("get_rules", "rule", {"family": 10})], ids=["links", "rules", "ipv6-rules"])
def test_the_same_dump_request_as_iproute(monkeypatch, dump, mode, kwarg):
    """get_links() and get_rules() (dumps), requests Rtnl makes outside :data:`rtnl.FAST`."""
    sent = []
    sock = rtnl.Rtnl()
    try:
        monkeypatch.setattr(sock, "_exchange", lambda msg: sent.append(bytes(msg.data)) or [])
        assert getattr(sock, dump)(**kwarg) == []
    finally:
        sock.close()
    [ours] = sent
    assert without_seq_and_pid(ours) == without_seq_and_pid(pyroute2_bytes(monkeypatch, mode, "dump", kwarg))


def _kernel_dump(msg_class, msg_type: int) -> bytes:
    """The raw answer of this namespace's kernel to a dump request of ``msg_type``."""
    import socket

    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    try:
        sock.bind((0, 0))
        msg = msg_class()
        msg["header"]["type"] = msg_type
        msg["header"]["flags"] = rtnl.NLM_F_REQUEST | rtnl.NLM_F_DUMP
        msg["header"]["sequence_number"] = 1
        msg.encode()
        sock.send(msg.data)
        chunks = []
        while True:
            data = sock.recv(RECV)
            chunks.append(data)
            if NLMSG_DONE in {m["header"]["type"] for m in rtnl.MarshalLinks().parse(data)}:
                return b"".join(chunks)
    finally:
        sock.close()


@pytest.mark.parametrize("msg_class,msg_type", [(rtnl.ifinfmsg, rtnl.RTM_GETLINK), (rtnl.ifaddrmsg, rtnl.RTM_GETADDR),
                                                (rtnl.rtmsg, rtnl.RTM_GETROUTE), (rtnl.fibmsg, rtnl.RTM_GETRULE)],
                         ids=["links", "addresses", "routes", "rules"])
def test_answers_parse_as_iproute_parses_them(msg_class, msg_type):
    """Rtnl's parser (MarshalLinks) reads the kernel's link, address, route and rule messages exactly
    as pyroute2's MarshalRtnl (IPRoute's) does."""
    from pyroute2.netlink.rtnl.marshal import MarshalRtnl

    data = _kernel_dump(msg_class, msg_type)
    ours = [m.dump() for m in rtnl.MarshalLinks().parse(data)]
    theirs = [m.dump() for m in MarshalRtnl().parse(data)]
    assert len(ours) >= 2 and ours[-1]["header"]["type"] == NLMSG_DONE  # at least lo, and the end
    assert ours == theirs
    assert [m["event"] for m in rtnl.MarshalLinks().parse(data)] == [m["event"] for m in MarshalRtnl().parse(data)]
