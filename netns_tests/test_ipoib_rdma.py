"""ipoib-rdma against the real kernel, driven by a real CNI runtime (cnitool on libcni).

This machine's kernel has no ib_ipoib and no InfiniBand HCA, and no kernel can emulate one (the
software RDMA drivers, rdma_rxe and siw, have an Ethernet link layer; qemu emulates no IB HCA).
What is tested here on the real kernel:

- every bad input the plugin answers before the kernel is asked (master missing, not an IPoIB
  netdev, a RoCE port, pkey out of range or not in the port's table, MTU above the mode's limit),
  each a CNI error naming the field and the fix, with nothing left behind;
- the kernel's own refusal: a veth that a fake sysfs tree (``RDMANET_SYSFS_ROOT``, modelled on a
  ConnectX-6 IB port, ``ib_trees.py``) calls an IPoIB port passes the plugin's checks, and the
  ``ipoib`` link request goes to the kernel, which answers EOPNOTSUPP (no ib_ipoib): error 100
  saying so, no temporary link in the host, nothing in the pod, no address reserved;
- DEL: idempotent, with or without the netns, and it finds the children the kernel returns to the
  host when a pod's netns dies (``netns_refund``) or that a killed ADD left under the temporary
  name: links carrying the attachment's marker (IFLA_IFALIAS) are removed wherever they are.
  A veth carrying the marker stands in for the IPoIB child (the kernel cannot make one here);
- CHECK, GC (refunded children of attachments no longer valid) and STATUS.

The successful ADD (the child with pkey/mode, its 20-byte address) is proven by the request's
bytes (tests/test_ipoib_netlink.py) and, for the refusals with ib_ipoib loaded, in the VM stage
(test_vm_ipoib.py).
"""

from __future__ import annotations

import hashlib
import json

import pytest

try:
    from netns_tests import cnitool_client as cc
    from netns_tests import ib_trees
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import cnitool_client as cc  # type: ignore[no-redef]
    import ib_trees  # type: ignore[no-redef]
    import nstools as nt  # type: ignore[no-redef]

PLUGIN = "ipoib-rdma"
VERSIONS = nt.CNITOOL_VERSIONS


def ipoib(master=None, ipam=None, **extra) -> dict:
    return nt.macvlan(master, ipam, type_=PLUGIN, **extra)  # the same plugin-config shape


def marker(cid: str, ifname: str = "net1", done: bool = True) -> str:
    """The attachment's IFLA_IFALIAS (rdmanet.cni.linux.attachment_link): ``rdmanet:`` + 32 hex digits of
    SHA-256 of ``<containerID>/<ifname>``, + `` done`` once ADD finished."""
    return "rdmanet:" + hashlib.sha256(f"{cid}/{ifname}".encode()).hexdigest()[:32] + (" done" if done else "")


def temporary_name(cid: str, ifname: str = "net1") -> str:
    """The documented derived name: ``ipr`` + 12 hex digits of SHA-256 of ``<containerID>/<ifname>``."""
    return "ipr" + hashlib.sha256(f"{cid}/{ifname}".encode()).hexdigest()[:12]


def ib_env(cni, netdev: str, **port) -> dict:
    root = cni.root / "sysfs"
    ib_trees.ipoib_port(root, netdev, **port)
    return {"RDMANET_SYSFS_ROOT": str(root)}


tool_err = nt.tool_err


def pod_links(ns) -> list[str]:
    return sorted(e["ifname"] for e in nt.links(ns.name) if e["ifname"] != "lo")


def host_links_with(prefix: str) -> list[str]:
    return sorted(e["ifname"] for e in nt.links(None) if e["ifname"].startswith(prefix))


def host_aliases() -> dict[str, str]:
    return {e["ifname"]: e.get("ifalias", "") for e in nt.links(None) if e.get("ifalias", "").startswith("rdmanet:")}


def nothing_left(cni, ns, net: str) -> None:
    cid = cc.container_id(ns.path)
    assert pod_links(ns) == [], "a link was left in the pod"
    assert nt.link(None, temporary_name(cid)) is None, "the temporary child was left in the host"
    assert not {marker(cid), marker(cid, done=False)} & set(host_aliases().values()), "a marked link was left in the host"
    assert nt.owners(cni.host_local_dir) == {}, "an address reservation was left"


def marked_veth(name: str, alias: str, ns=None) -> None:
    """A veth end carrying ``alias``: the stand-in for an IPoIB child (this kernel cannot make one)."""
    nt.ip("link", "add", name, "type", "veth", "peer", "name", name[:-1] + "z")
    nt.ip("link", "set", name, "alias", alias)
    if ns is not None:
        nt.ip("link", "set", name, "netns", ns.name)


# --------------------------------------------------------------------------- the plugin as installed


def test_version_lists_every_cni_version(cni):
    proc = nt.ok(nt.raw_exec(cni.plugin(PLUGIN), "VERSION", b"", container_id=None, ifname=None))
    assert json.loads(proc.stdout)["supportedVersions"] == ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]


# --------------------------------------------------------------------------- bad input, before the kernel


@pytest.mark.parametrize("version", VERSIONS)
def test_master_missing_from_config(cni, netns, version):
    ns = netns()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, version, ipoib(ipam=nt.host_local(cni.host_local_dir, "198.19.60.0/24"))))
    err = tool_err(cni.tool("add", net, ns))
    assert err["code"] == 7
    assert err["msg"] == "invalid network config: master: required field is missing"
    assert '"master"' in err["details"] and "ib0" in err["details"]
    nothing_left(cni, ns, net)


def test_master_does_not_exist(cni, netns):
    ns = netns()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", ipoib("rdt-noib0", nt.host_local(cni.host_local_dir, "198.19.61.0/24"))))
    err = tool_err(cni.tool("add", net, ns))
    assert err["code"] == 7
    assert err["msg"] == "master 'rdt-noib0' does not exist in the host network namespace"
    nothing_left(cni, ns, net)


def test_ethernet_master_points_to_macvlan_rdma(cni, netns, master):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.62.0/24"))))
    err = tool_err(cni.tool("add", net, ns))
    assert err["code"] == 7
    assert err["msg"] == (f"master {m.name} is an Ethernet netdev, not the IPoIB netdev of an InfiniBand port "
                          "(and ib_ipoib is not loaded)")
    assert "macvlan-rdma" in err["details"]
    nothing_left(cni, ns, net)


def test_roce_master_is_named_as_one(cni, netns, master):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    root = ib_trees.roce_port(cni.root / "sysfs", m.name)
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.63.0/24"))))
    err = tool_err(cni.tool("add", net, ns, extra_env={"RDMANET_SYSFS_ROOT": str(root)}))
    assert err["code"] == 7
    assert err["msg"].startswith(f"master {m.name} is a RoCE port (RDMA device mlx5_2, link layer Ethernet), not the IPoIB")
    assert '"type": "macvlan-rdma"' in err["details"]
    nothing_left(cni, ns, net)


@pytest.mark.parametrize("pkey, why", [
    ("0x10000", "is not a hex partition key"),
    (70000, "is out of range"),
    ("0x8000", "is not a valid partition key"),
    (0, "is not a valid partition key"),
    ("8001", "is not a hex partition key"),
])
def test_bad_pkey(cni, netns, master, pkey, why):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.64.0/24"), pkey=pkey)))
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_env(cni, m.name)))
    assert err["code"] == 7
    assert err["msg"].startswith("invalid network config: pkey: ") and why in err["msg"], err
    assert "0x8001" in err["details"]
    nothing_left(cni, ns, net)


def test_pkey_not_in_the_ports_table(cni, netns, master):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.65.0/24"), pkey="0x0005")))
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_env(cni, m.name, pkeys=(0xFFFF, 0x8001, 0x0002))))
    assert err["code"] == 7
    assert err["msg"] == (f"pkey 0x8005 is not in the pkey table of mlx5_0 port 1 behind master {m.name} "
                          "(it has 0xffff, 0x8001, 0x8002)")
    assert "subnet manager" in err["details"]
    nothing_left(cni, ns, net)


@pytest.mark.parametrize("mode, mtu, limit", [("datagram", 4000, 2044), ("connected", 65521, 65520), ("datagram", 60, 2044)])
def test_mtu_beyond_the_mode(cni, netns, master, mode, mtu, limit):
    ns, m = netns(), master(mtu=2044)  # a 2K fabric: the parent's datagram MTU is 2048 - 4
    net = f"{ns.name}-net"
    conf = ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.66.0/24"), mtu=mtu, mode=mode)
    cni.write(nt.conflist(net, "1.0.0", conf))
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_env(cni, m.name, mtu=2044)))
    assert err["code"] == 7
    assert err["msg"] == f"invalid network config: mtu {mtu} is outside what {mode} mode allows on master {m.name} (68-{limit})"
    nothing_left(cni, ns, net)


# --------------------------------------------------------------------------- the kernel's refusal


@pytest.mark.parametrize("version", VERSIONS)
def test_kernel_without_ib_ipoib_refuses_the_child(cni, netns, master, version):
    """The fake tree says the veth is ib0 of a ConnectX-6: every check passes and the ipoib link
    request reaches this kernel, which has no ib_ipoib (EOPNOTSUPP)."""
    ns, m = netns(), master(mtu=4092)
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, version, ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.67.0/24"),
                                              pkey="0x8001", mode="datagram", mtu=2044)))
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_env(cni, m.name)))
    assert err["code"] == 100
    assert err["msg"] == (f"create IPoIB child of master {m.name} (pkey 0x8001, mode datagram): "
                          "the kernel has no ipoib link kind: ib_ipoib is not loaded")
    assert "modprobe ib_ipoib" in err["details"] and "(errno 95)" in err["details"]
    nothing_left(cni, ns, net)


# --------------------------------------------------------------------------- DEL


@pytest.mark.parametrize("version", VERSIONS)
def test_del_of_nothing_succeeds_twice(cni, netns, master, version):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, version, ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.68.0/24"))))
    for _ in range(2):
        assert nt.ok(cni.tool("del", net, ns)).stdout == ""
    nothing_left(cni, ns, net)


def test_del_finds_the_child_refunded_to_the_host(cni, netns, master):
    """The pod's netns died first: the kernel returned the IPoIB child to the host under its pod
    name (or dev<ifindex>). DEL removes exactly the link carrying this attachment's marker."""
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    cid = cc.container_id(ns.path)
    base = nt.PREFIX + "r"
    marked_veth(base + "1a", marker(cid))  # this attachment's child, refunded
    marked_veth(base + "2a", marker("someone-else"))  # another pod's
    marked_veth(base + "3a", marker(cid, "net2"))  # another attachment of the same pod
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.69.0/24"))))
    nt.ip("netns", "del", ns.name)
    try:
        assert nt.ok(cni.tool("del", net, ns)).stdout == ""
        assert host_links_with(base) == sorted([base + "2a", base + "2z", base + "3a", base + "3z"])
        assert nt.ok(cni.tool("del", net, ns)).stdout == ""  # and again
    finally:
        for name in host_links_with(base):
            nt.ip("link", "del", name, check=False)


def test_del_with_empty_netns_still_looks_in_the_host(cni, netns, master):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    cid = cc.container_id(ns.path)
    name = nt.PREFIX + "e1a"
    marked_veth(name, marker(cid))
    stdin = nt.single(net, "1.1.0", ipoib(m.name))
    nt.ok(cni.exec("DEL", stdin, ns="", plugin=PLUGIN, container_id=cid))
    assert nt.link(None, name) is None


def test_del_removes_what_a_killed_add_left(cni, netns, master):
    """A SIGKILL right after the kernel created the child leaves it in the host under the
    temporary name (not yet marked); after the move, in the pod under that name (marked)."""
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    cid = cc.container_id(ns.path)
    tmp = temporary_name(cid)
    nt.ip("link", "add", tmp, "type", "veth", "peer", "name", nt.PREFIX + "k1z")
    marked_veth(nt.PREFIX + "k2a", marker(cid, done=False), ns=ns)
    ns.ip("link", "set", nt.PREFIX + "k2a", "name", tmp)
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.70.0/24"))))
    assert nt.ok(cni.tool("del", net, ns)).stdout == ""
    assert nt.link(None, tmp) is None and nt.link(None, nt.PREFIX + "k1z") is None
    assert pod_links(ns) == []


def test_repeat_add_clears_what_a_killed_add_left(cni, netns, master):
    ns, m = netns(), master(mtu=4092)
    net = f"{ns.name}-net"
    tmp = temporary_name(cc.container_id(ns.path))
    nt.ip("link", "add", tmp, "type", "veth", "peer", "name", nt.PREFIX + "k3z")
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.71.0/24"))))
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_env(cni, m.name)))
    assert err["code"] == 100  # this kernel cannot make the child; the leftover went first
    assert nt.link(None, tmp) is None
    nothing_left(cni, ns, net)


def test_del_removes_the_policy_routing_of_its_interface_only(cni, netns, master):
    """In a multi-rail pod ADD gives the child a routing table and rules (rdmanet.cni.linux.rail_routing:
    table and priority 10000 + the ifname's number). DEL removes exactly those of CNI_IFNAME, also
    when the child is already gone, and never another interface's."""
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    cid = cc.container_id(ns.path)
    marked_veth(nt.PREFIX + "p1a", marker(cid), ns=ns)
    ns.ip("link", "set", nt.PREFIX + "p1a", "name", "net1")
    ns.ip("addr", "add", "198.19.72.5/24", "dev", "net1")
    ns.ip("link", "set", "net1", "up")
    ns.ip("route", "add", "198.19.72.0/24", "dev", "net1", "table", "10001")
    for ifname, table, src in (("net1", "10001", "198.19.72.5"), ("net2", "10002", "198.19.73.5")):
        ns.ip("rule", "add", "oif", ifname, "table", table, "pref", table)
        ns.ip("rule", "add", "from", src, "table", table, "pref", table)
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name)))
    assert nt.ok(cni.tool("del", net, ns)).stdout == ""
    assert pod_links(ns) == []
    left = [(r.get("priority"), r.get("src"), r.get("oif"), r.get("table")) for r in nt.ip_json("-4", "rule", "show", ns=ns.name)]
    assert left == [(0, "all", None, "local"), (10002, "all", "net2", "10002"), (10002, "198.19.73.5", None, "10002"),
                    (32766, "all", None, "main"), (32767, "all", None, "default")], left
    assert nt.ok(cni.tool("del", net, ns)).stdout == ""


def test_del_leaves_an_unmarked_cni_ifname_alone(cni, netns, master):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    nt.ip("link", "add", nt.PREFIX + "u1a", "type", "veth", "peer", "name", nt.PREFIX + "u1z")
    nt.ip("link", "set", nt.PREFIX + "u1a", "netns", ns.name)
    ns.ip("link", "set", nt.PREFIX + "u1a", "name", "net1")
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name)))
    assert nt.ok(cni.tool("del", net, ns)).stdout == ""
    assert pod_links(ns) == ["net1"]


# --------------------------------------------------------------------------- CHECK, GC, STATUS


def test_check_reports_a_link_that_is_not_an_ipoib_child(cni, netns, master):
    ns, m = netns(), master(mtu=4092)
    net = f"{ns.name}-net"
    marked_veth(nt.PREFIX + "c1a", marker(cc.container_id(ns.path)), ns=ns)
    ns.ip("link", "set", nt.PREFIX + "c1a", "name", "net1")
    prev = {"cniVersion": "1.0.0", "interfaces": [{"name": "net1", "sandbox": ns.path}], "ips": []}
    stdin = nt.single(net, "1.0.0", ipoib(m.name, prevResult=prev))
    proc = cni.exec("CHECK", stdin, ns=ns, plugin=PLUGIN, container_id=cc.container_id(ns.path),
                    extra_env=ib_env(cni, m.name))
    nt.no_traceback(proc)
    err = nt.cni_error(proc)
    assert err["code"] == 105
    assert err["msg"] == "CHECK: net1 is a veth, not an IPoIB child"


def test_check_needs_prev_result(cni, netns, master):
    ns, m = netns(), master()
    proc = cni.exec("CHECK", nt.single("n", "1.0.0", ipoib(m.name)), ns=ns, plugin=PLUGIN)
    err = nt.cni_error(proc)
    assert err["code"] == 7 and "prevResult" in err["msg"]


def test_gc_removes_refunded_children_of_attachments_no_longer_valid(cni, netns, master):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    base = nt.PREFIX + "g"
    marked_veth(base + "1a", marker("cid-keep"))
    marked_veth(base + "2a", marker("cid-gone"))
    marked_veth(base + "3a", marker("cid-gone", done=False))  # a running ADD's, not GC's business
    cni.write(nt.conflist(net, "1.1.0", ipoib(m.name)))
    try:
        nt.ok(cni.tool("gc", net, ns, valid_attachments=[{"containerID": "cid-keep", "ifname": "net1"}]))
        assert host_links_with(base) == sorted([base + "1a", base + "1z", base + "3a", base + "3z"])
    finally:
        for name in host_links_with(base):
            nt.ip("link", "del", name, check=False)


def test_status(cni, netns, master):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    env = ib_env(cni, m.name)
    cni.write(nt.conflist(net, "1.1.0", ipoib(m.name)))
    nt.ok(cni.tool("status", net, ns, extra_env=env))
    err = tool_err(cni.tool("status", net, ns))  # without the tree the veth is what it is
    assert err["code"] == 50 and "not the IPoIB netdev" in err["msg"]
    cni.write(nt.conflist(net, "1.1.0", ipoib("rdt-noib0")))
    err = tool_err(cni.tool("status", net, ns, extra_env=env))
    assert err["code"] == 50 and "does not exist" in err["msg"]


def test_del_removes_the_finished_child_in_the_pod(cni, netns, master):
    ns, m = netns(), master()
    net = f"{ns.name}-net"
    marked_veth(nt.PREFIX + "f1a", marker(cc.container_id(ns.path)), ns=ns)
    ns.ip("link", "set", nt.PREFIX + "f1a", "name", "net1")
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name)))
    assert nt.ok(cni.tool("del", net, ns)).stdout == ""
    assert pod_links(ns) == [] and nt.link(None, nt.PREFIX + "f1z") is None


def test_add_over_a_foreign_cni_ifname_is_refused(cni, netns, master):
    ns, m = netns(), master(mtu=4092)
    net = f"{ns.name}-net"
    nt.ip("link", "add", nt.PREFIX + "o1a", "type", "veth", "peer", "name", nt.PREFIX + "o1z")
    nt.ip("link", "set", nt.PREFIX + "o1a", "netns", ns.name)
    ns.ip("link", "set", nt.PREFIX + "o1a", "name", "net1")
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.72.0/24"))))
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_env(cni, m.name)))
    assert err["code"] == 4 and err["msg"] == f"CNI_IFNAME net1 already exists in {ns.path} (a veth)"
    assert pod_links(ns) == ["net1"]
    assert nt.owners(cni.host_local_dir) == {}


def test_failed_repeat_add_keeps_the_finished_child(cni, netns, master):
    """A repeat ADD (the runtime lost the first answer) replaces the finished child only once the
    new one exists and IPAM answered; here the kernel refuses the new one, so the old one stays."""
    ns, m = netns(), master(mtu=4092)
    net = f"{ns.name}-net"
    marked_veth(nt.PREFIX + "p1a", marker(cc.container_id(ns.path)), ns=ns)
    ns.ip("link", "set", nt.PREFIX + "p1a", "name", "net1")
    cni.write(nt.conflist(net, "1.0.0", ipoib(m.name, nt.host_local(cni.host_local_dir, "198.19.73.0/24"))))
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_env(cni, m.name)))
    assert err["code"] == 100
    assert pod_links(ns) == ["net1"]
    assert nt.owners(cni.host_local_dir) == {}
