"""rdmanet.cni.linux.rtnl.Rtnl answers what pyroute2's IPRoute answers, in a real network namespace: the
dumps it serves itself (links, addresses by link and family) and the links it decodes (Link);
links.find_basics (netdevice ioctls) answers what a netlink lookup answers."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("pyroute2")

from pyroute2.iproute.linux import IPRoute  # noqa: E402

from rdmanet.cni.linux import links, netns as netns_mod  # noqa: E402
from rdmanet.cni.linux.rtnl import Rtnl  # noqa: E402

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]


def addr_view(msgs) -> list:
    return sorted((m["family"], m["index"], m["prefixlen"], m.get("IFA_ADDRESS"), m.get("IFA_FLAGS", m["flags"]))
                  for m in msgs)


@pytest.fixture
def pod(netns, master):
    ns = netns()
    a = master(ns=ns, peer_ns=ns)
    nt.ip("-n", ns.name, "addr", "add", "198.18.7.2/24", "dev", a.name)
    nt.ip("-n", ns.name, "addr", "add", "198.18.8.2/24", "dev", a.name)
    nt.ip("-n", ns.name, "addr", "add", "fd00:7::2/64", "dev", a.name, "nodad")
    nt.ip("-n", ns.name, "addr", "add", "198.18.9.2/24", "dev", a.peer)
    nt.ip("-n", ns.name, "link", "set", a.name, "alias", "rdt alias")
    return ns, a


def test_dumps_and_links_match_iproute(pod):
    ns, veth = pod
    with netns_mod.entered(ns.path):
        ipr = IPRoute()
    try:
        with links.rtnl_in(ns.path) as ours:
            index = links.find_link(ours, veth.name).index
            for kwarg in ({}, {"index": index}, {"index": index, "family": 2}, {"index": index, "family": 10}, {"family": 2}):
                got = addr_view(ours.get_addr(**kwarg))
                assert got == addr_view(ipr.get_addr(**kwarg)), kwarg
                assert got, kwarg  # every filter matches an address here: a comparison of nothing proves nothing
            assert [m.get("IFLA_IFNAME") for m in ours.get_links()] == [m.get("IFLA_IFNAME") for m in ipr.get_links()]
            for name in ("lo", veth.name, veth.peer):
                assert links.find_link(ours, name) == links.Link.from_msg(ipr.link("get", ifname=name)[0])
            link = links.find_link(ours, veth.name)
            assert (link.name, link.kind, link.alias, link.up) == (veth.name, "veth", "rdt alias", True)
            assert links.find_link(ours, "rdt-none") is None
    finally:
        ipr.close()


def test_find_basics_answers_what_netlink_answers(pod):
    ns, veth = pod
    ns.ip("link", "property", "add", "dev", veth.name, "altname", f"{veth.name}x")
    ns.ip("link", "set", veth.peer, "mtu", "1400", "address", "02:00:5e:00:53:07")
    with links.rtnl_in(ns.path) as ours:
        seen = {}
        for name in (veth.name, f"{veth.name}x", veth.peer, "lo"):
            link = links.find_link(ours, name)
            seen[name] = links.find_basics(ours, name)
            assert seen[name] == links.LinkBasics(link.index, link.name, link.mac, link.mtu), name
        assert seen[f"{veth.name}x"].name == veth.name  # an altname finds the link under its name
        assert (seen[veth.peer].mtu, seen[veth.peer].mac) == (1400, "02:00:5e:00:53:07")
        assert links.find_basics(ours, "rdt-none") is None
        with links.rtnl_in() as host:  # the socket's namespace answers, not the caller's
            assert links.find_basics(host, veth.peer) is None


def route_view(msgs) -> list:
    return sorted((m["family"], m["dst_len"], m.get("RTA_DST"), m.get("RTA_OIF"), m.get("RTA_TABLE")) for m in msgs)


def test_route_dumps_and_nsids_match_iproute(pod, netns):
    """The route dumps the host-use check reads, and the nsid a pod gives the host, as IPRoute
    answers them."""
    ns, veth = pod
    nt.ip("-n", ns.name, "route", "add", "default", "via", "198.18.7.1")
    nt.ip("-n", ns.name, "route", "add", "198.19.7.0/24", "via", "198.18.8.1", "table", "100")
    other = netns()
    with netns_mod.entered(ns.path):
        ipr, rtnl = IPRoute(), Rtnl()
    other_fd = netns_mod.open_netns(other.path)
    try:
        for kw in ({"family": 2}, {"family": 10}, {"family": 2, "table": 254}, {"family": 2, "table": 100}, {}):
            assert route_view(rtnl.get_routes(**kw)) == route_view(ipr.get_routes(**kw)), kw
        assert rtnl.get_netnsid(fd=other_fd) == {"nsid": -1}  # none given yet
        ipr.link("set", index=links.find_link(rtnl, veth.peer).index, net_ns_fd=other_fd)  # now it names one
        assert rtnl.get_netnsid(fd=other_fd)["nsid"] == ipr.get_netnsid(fd=other_fd)["nsid"] >= 0
    finally:
        os.close(other_fd)
        ipr.close()
        rtnl.close()
