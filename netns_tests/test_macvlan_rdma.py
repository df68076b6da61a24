"""macvlan-rdma against the real kernel, driven by a real CNI runtime (cnitool on libcni 1.1.2).

Every macvlan master is a veth pair the test creates (both ends up, so macvlans get carrier);
addresses are from 198.18.0.0/15, route targets from 198.19.0.0/16. Conflists at 0.3.1, 0.4.0 and
1.0.0 go through cnitool; 1.1.0, GC and STATUS (which libcni 1.1.2 cannot parse or lacks) go
through a raw exec of the plugin with a bare CNI environment, as a runtime would do it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib
import stat

import pytest

try:
    from netns_tests import cnitool_client as cc
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import cnitool_client as cc  # type: ignore[no-redef]
    import nstools as nt  # type: ignore[no-redef]

VERSIONS = nt.CNITOOL_VERSIONS
_LEASE_MISSING = nt.lease_ipam_missing()
requires_lease_ipam = pytest.mark.skipif(_LEASE_MISSING is not None, reason=str(_LEASE_MISSING))
IPAMS = [pytest.param("host-local", id="host-local"),
         pytest.param("lease-ipam", id="lease-ipam", marks=requires_lease_ipam)]

ROUTE_VIA_GATEWAY = "198.19.250.0/24"
ROUTE_VIA_OWN_GW = "198.19.251.0/24"


def ipam_block(cni, kind: str, prefix: str, *, routes: bool = True, **extra) -> dict:
    route_list = [{"dst": ROUTE_VIA_GATEWAY}, {"dst": ROUTE_VIA_OWN_GW, "gw": f"{prefix}.254"}] if routes else None
    if kind == "host-local":
        return nt.host_local(cni.host_local_dir, f"{prefix}.0/24", gateway=f"{prefix}.1", routes=route_list, **extra)
    return nt.lease_ipam(cni.data_dir, f"{prefix}.0/24", gateway=f"{prefix}.1", routes=route_list, **extra)


store_of, bare_ip, add_ok = nt.store_of, nt.bare_ip, nt.add_ok


# --------------------------------------------------------------------------- the plugin as installed


@pytest.mark.parametrize("script", [nt.PLUGIN, pytest.param("lease-ipam", marks=requires_lease_ipam)])
def test_copied_console_scripts_run_with_bare_env(cni, script):
    proc = nt.ok(nt.raw_exec(cni.plugin(script), "VERSION", b"", container_id=None, ifname=None))
    doc = json.loads(proc.stdout)
    assert {"0.3.1", "0.4.0", "1.0.0", "1.1.0"} <= set(doc["supportedVersions"])


# --------------------------------------------------------------------------- ADD / CHECK / DEL


@pytest.mark.parametrize("ipam", IPAMS)
@pytest.mark.parametrize("version", VERSIONS)
def test_add_check_del(cni, netns, master, version, ipam):
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, version, nt.macvlan(m.name, ipam_block(cni, ipam, prefix))))
    cid = cc.container_id(ns.path)

    result = add_ok(cni, net, ns)
    assert result["cniVersion"] == version
    idx = nt.iface_index(result, "net1")
    itf = result["interfaces"][idx]
    assert itf["sandbox"] == ns.path
    link = nt.link(ns.name, "net1")
    assert link is not None and link["linkinfo"]["info_kind"] == "macvlan"
    assert itf["mac"] == link["address"]
    assert "mtu" not in itf  # 1.1.0 only
    [ipc] = result["ips"]
    assert ipc["interface"] == idx
    assert ("version" in ipc) == (version != "1.0.0")
    assert ipc["address"].startswith(prefix + ".") and ipc["address"].endswith("/24")
    assert ipc["gateway"] == f"{prefix}.1"
    assert nt.addresses(ns.name, "net1") == [ipc["address"]]
    assert {r["dst"] for r in result["routes"]} == {ROUTE_VIA_GATEWAY, ROUTE_VIA_OWN_GW}
    assert nt.has_route(ns.name, ROUTE_VIA_GATEWAY, gateway=f"{prefix}.1", dev="net1")
    assert nt.has_route(ns.name, ROUTE_VIA_OWN_GW, gateway=f"{prefix}.254", dev="net1")
    assert nt.owners(store_of(cni, ipam)) == {bare_ip(ipc["address"]): cid}

    if version != "0.3.1":  # CHECK needs 0.4.0 (libcni refuses it before calling the plugin)
        assert nt.ok(cni.tool("check", net, ns)).stdout == ""

    nt.ok(cni.tool("del", net, ns))
    assert nt.link(ns.name, "net1") is None
    assert nt.owners(store_of(cni, ipam)) == {}
    assert nt.files_mentioning([store_of(cni, ipam)], cid) == []  # no attachment index either
    nt.ok(cni.tool("del", net, ns))  # DEL is idempotent


@pytest.mark.parametrize("ipam", IPAMS)
@pytest.mark.parametrize("version", VERSIONS)
def test_del_after_netns_is_gone_releases_ipam(cni, netns, master, version, ipam):
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, version, nt.macvlan(m.name, ipam_block(cni, ipam, prefix))))
    result = add_ok(cni, net, ns)
    assert bare_ip(result["ips"][0]["address"]) in nt.owners(store_of(cni, ipam))

    nt.ip("netns", "del", ns.name)
    nt.ok(cni.tool("del", net, ns))
    assert nt.owners(store_of(cni, ipam)) == {}
    assert nt.files_mentioning([store_of(cni, ipam)], cc.container_id(ns.path)) == []
    nt.ok(cni.tool("del", net, ns))


@pytest.mark.parametrize("ipam", IPAMS)
@pytest.mark.parametrize("version", VERSIONS)
def test_del_with_empty_netns_releases_ipam(cni, netns, master, version, ipam):
    """Raw exec: Multus and kubelet may DEL with an empty CNI_NETNS; IPAM is still released."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", version, nt.macvlan(m.name, ipam_block(cni, ipam, prefix)))
    cid = f"{ns.name}-cid"
    result = json.loads(nt.ok(cni.exec("ADD", stdin, ns=ns, container_id=cid)).stdout)
    assert result["cniVersion"] == version
    assert "mtu" not in result["interfaces"][0]
    assert nt.owners(store_of(cni, ipam)) == {bare_ip(result["ips"][0]["address"]): cid}

    proc = nt.ok(cni.exec("DEL", stdin, ns="", container_id=cid))
    assert proc.stdout.strip() == ""
    assert nt.owners(store_of(cni, ipam)) == {}
    nt.ok(cni.exec("DEL", stdin, ns="", container_id=cid))


def test_repeat_add_of_same_attachment_replaces_it(cni, netns, master):
    """A runtime that lost an ADD's answer (its plugin was killed after the last step) retries
    the same ADD: it succeeds and ends as one clean ADD (one net1, the same address, one
    reservation), and CHECK and DEL work on the result."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    stdin = nt.single(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, "lease-ipam", prefix)))
    first = json.loads(nt.ok(cni.exec("ADD", stdin, ns=ns, container_id="rdt-cid")).stdout)
    again = json.loads(nt.ok(cni.exec("ADD", stdin, ns=ns, container_id="rdt-cid")).stdout)
    assert again["ips"] == first["ips"]
    assert {name for _, name in nt.link_names(ns.name)} == {"lo", "net1"}
    assert nt.link(ns.name, "net1")["address"] == again["interfaces"][0]["mac"]
    assert nt.addresses(ns.name, "net1") == [again["ips"][0]["address"]]
    assert list(nt.owners(cni.data_dir).values()) == ["rdt-cid"]
    nt.ok(cni.exec("CHECK", {**stdin, "prevResult": again}, ns=ns, container_id="rdt-cid"))
    nt.ok(cni.exec("DEL", stdin, ns=ns, container_id="rdt-cid"))
    assert {name for _, name in nt.link_names(ns.name)} == {"lo"} and nt.owners(cni.data_dir) == {}


def test_second_add_refused_by_ipam_keeps_first(cni, netns, master):
    """When the IPAM refuses a second ADD of the same attachment (host-local: "duplicate
    allocation is not allowed"), the first attachment's link and reservation are untouched."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, "host-local", prefix))))
    add_ok(cni, net, ns)
    link, owners = nt.link(ns.name, "net1"), nt.owners(cni.host_local_dir)
    proc = cni.tool("add", net, ns)
    assert cc.error_of(proc) is not None, proc.stdout
    again = nt.link(ns.name, "net1")
    assert (again["ifindex"], again["address"]) == (link["ifindex"], link["address"])
    assert {name for _, name in nt.link_names(ns.name)} == {"lo", "net1"}
    assert nt.owners(cni.host_local_dir) == owners
    nt.ok(cni.tool("check", net, ns))
    nt.ok(cni.tool("del", net, ns))


def test_add_refuses_an_ifname_it_did_not_make(cni, netns, master):
    """CNI_IFNAME taken by a link this attachment did not make: CNI error 4, nothing created,
    nothing reserved, the link untouched."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(m.name, ipam_block(cni, "lease-ipam", prefix)))
    ns.ip("link", "add", "net1", "type", "veth", "peer", "name", "net1peer")
    err = nt.cni_error(cni.exec("ADD", stdin, ns=ns, container_id="rdt-cid"))
    assert err["code"] == 4 and "net1" in err["msg"]
    assert {name for _, name in nt.link_names(ns.name)} == {"lo", "net1", "net1peer"}
    assert nt.owners(cni.data_dir) == {}


def test_del_leaves_a_link_it_did_not_make(cni, netns, master):
    """DEL deletes only a macvlan: a foreign net1 (here a veth) stays, IPAM is released."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(m.name, ipam_block(cni, "host-local", prefix)))
    nt.ok(cni.exec("ADD", stdin, ns=ns, container_id="rdt-cid"))
    ns.ip("link", "del", "net1")
    ns.ip("link", "add", "net1", "type", "veth", "peer", "name", "net1peer")
    nt.ok(cni.exec("DEL", stdin, ns=ns, container_id="rdt-cid"))
    assert nt.link(ns.name, "net1")["linkinfo"]["info_kind"] == "veth"
    assert nt.owners(cni.host_local_dir) == {}


def _leftover(ns, m, name: str, alias: str = "") -> None:
    """A macvlan of ``m`` in ``ns`` under ``name``, as a killed ADD leaves it."""
    nt.ip("link", "add", name, "link", m.name, "type", "macvlan", "mode", "bridge")
    nt.ip("link", "set", name, "netns", ns.name)
    if alias:
        ns.ip("link", "set", name, "alias", alias)


@pytest.mark.parametrize("state", ["temporary-name", "renamed-unfinished"])
@pytest.mark.parametrize("then", ["DEL", "ADD"])
def test_what_a_killed_add_left_is_removed_by_del_or_repeat_add(cni, netns, master, state, then):
    """The two link states a kill between the macvlan's creation and the end of ADD can leave:
    the link under the temporary name derived from the attachment, and the link already renamed
    to CNI_IFNAME with the attachment's in-progress marker. DEL removes it (nothing but lo is
    left, the reservation is free); a repeat ADD replaces it and ends as one clean ADD."""
    from rdmanet.cni.linux import attachment_link as al

    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    cid = "rdt-killed-add"
    stdin = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(m.name, ipam_block(cni, "lease-ipam", prefix)))
    if state == "temporary-name":
        _leftover(ns, m, al.temporary_name("mvr", cid, "net1"))
    else:
        _leftover(ns, m, "net1", al.marker(cid, "net1"))
    if then == "DEL":
        nt.ok(cni.exec("DEL", stdin, ns=ns, container_id=cid))
        assert {name for _, name in nt.link_names(ns.name)} == {"lo"}
    else:
        result = json.loads(nt.ok(cni.exec("ADD", stdin, ns=ns, container_id=cid)).stdout)
        assert {name for _, name in nt.link_names(ns.name)} == {"lo", "net1"}
        assert nt.addresses(ns.name, "net1") == [result["ips"][0]["address"]]
        assert list(nt.owners(cni.data_dir).values()) == [cid]
        nt.ok(cni.exec("DEL", stdin, ns=ns, container_id=cid))
    assert nt.owners(cni.data_dir) == {}


def test_del_leaves_a_macvlan_another_attachment_marked(cni, netns, master):
    """A macvlan under CNI_IFNAME that carries another attachment's marker is not this DEL's."""
    from rdmanet.cni.linux import attachment_link as al

    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(m.name, ipam_block(cni, "lease-ipam", prefix)))
    _leftover(ns, m, "net1", al.marker("some-other-container", "net1", done=True))
    nt.ok(cni.exec("DEL", stdin, ns=ns, container_id="rdt-cid"))
    assert nt.link(ns.name, "net1")["linkinfo"]["info_kind"] == "macvlan"


@pytest.mark.parametrize("ipam", IPAMS)
@pytest.mark.parametrize("how", ["cni-args", "runtime-config"])
def test_requested_ip_reaches_ipam(cni, netns, master, ipam, how):
    """The plugin hands IPAM the same env and stdin: CNI_ARGS ``IP`` (Multus style, with other
    keys) and ``runtimeConfig.ips`` (capability ``ips``) pick the address."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    extra = {"capabilities": {"ips": True}} if how == "runtime-config" else {}
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, ipam, prefix, routes=False), **extra)))
    wanted = f"{prefix}.77"
    kw = ({"cni_args": f"IgnoreUnknown=true;K8S_POD_NAME=x;IP={wanted}"} if how == "cni-args"
          else {"cap_args": {"ips": [f"{wanted}/24"]}})
    result = add_ok(cni, net, ns, **kw)
    assert [ip["address"] for ip in result["ips"]] == [f"{wanted}/24"]
    assert nt.addresses(ns.name, "net1") == [f"{wanted}/24"]
    nt.ok(cni.tool("check", net, ns, **kw))
    nt.ok(cni.tool("del", net, ns, **kw))
    assert nt.owners(store_of(cni, ipam)) == {}


def test_two_pods_on_one_master_ping_each_other(cni, netns, master):
    m = master()
    ns1, ns2 = netns(), netns()
    prefix, _ = nt.random_subnet()
    net = f"{ns1.name}-net"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, "host-local", prefix, routes=False), mode="bridge")))
    a1 = bare_ip(add_ok(cni, net, ns1)["ips"][0]["address"])
    a2 = bare_ip(add_ok(cni, net, ns2)["ips"][0]["address"])
    assert a1 != a2

    for src, dst in ((ns1, a2), (ns2, a1)):
        proc = src.run("ping", "-c1", "-W2", dst)
        assert proc.returncode == 0, f"ping {dst} from {src.name}: {proc.stdout}{proc.stderr}"

    nt.ok(cni.tool("del", net, ns1))
    nt.ok(cni.tool("del", net, ns2))
    assert nt.owners(cni.host_local_dir) == {}


TAMPERING = ["mac", "address", "route", pytest.param("reservation", id="reservation-host-local"),
             pytest.param("lease-reservation", id="reservation-lease-ipam", marks=requires_lease_ipam)]


@pytest.mark.parametrize("tamper", TAMPERING)
def test_check_fails_after_tampering(cni, netns, master, tamper):
    """CHECK really checks: the link's MAC, its address, the routes, and (through IPAM CHECK)
    the reservation."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    ipam = "lease-ipam" if tamper == "lease-reservation" else "host-local"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, ipam, prefix))))
    result = add_ok(cni, net, ns)
    nt.ok(cni.tool("check", net, ns))

    address = result["ips"][0]["address"]
    if tamper == "mac":
        ns.ip("link", "set", "net1", "address", "0a:58:c6:12:fe:01")
        expect = "MAC"
    elif tamper == "address":
        ns.ip("addr", "del", address, "dev", "net1")
        expect = address
    elif tamper == "route":
        ns.ip("route", "del", ROUTE_VIA_OWN_GW)
        expect = ROUTE_VIA_OWN_GW
    else:
        store = store_of(cni, ipam)
        [reservation] = [p for p in store.rglob(bare_ip(address)) if p.is_file()]
        reservation.unlink()
        expect = None
    proc = cni.tool("check", net, ns)
    assert proc.returncode != 0
    err = cc.error_of(proc)
    assert err is not None, f"no CNI error JSON on stdout: {proc.stdout!r} / {proc.stderr!r}"
    assert err["code"] != 0
    if expect is not None:  # our own finding (the IPAM's wording is its own)
        assert err["code"] == 105 and expect in err["msg"], err
    assert "Traceback" not in proc.stderr

    nt.ok(cni.tool("del", net, ns))
    assert nt.owners(store_of(cni, ipam)) == {}


@pytest.mark.parametrize("gone", ["link", "master"])
def test_del_when_link_or_master_already_gone(cni, netns, master, gone):
    """DEL succeeds and releases IPAM when the pod's link, or the master (and with it every
    macvlan on it), was removed behind the plugin's back."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, "host-local", prefix))))
    add_ok(cni, net, ns)
    if gone == "link":
        ns.ip("link", "del", "net1")
    else:
        nt.ip("link", "del", m.name)
    assert nt.link(ns.name, "net1") is None
    nt.ok(cni.tool("del", net, ns))
    assert nt.owners(cni.host_local_dir) == {}


# --------------------------------------------------------------------------- link properties


@pytest.mark.parametrize("mode", ["bridge", "private", "vepa", "passthru"])
def test_mode_is_applied(cni, netns, master, mode):
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, "host-local", prefix, routes=False), mode=mode)))
    add_ok(cni, net, ns)
    assert nt.macvlan_mode(nt.link(ns.name, "net1")) == mode
    nt.ok(cni.tool("check", net, ns))
    nt.ok(cni.tool("del", net, ns))
    assert nt.link(ns.name, "net1") is None


def test_mtu_below_master_is_applied(cni, netns, master):
    ns, m = netns(), master(mtu=1500)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, "host-local", prefix, routes=False), mtu=1400)))
    add_ok(cni, net, ns)
    assert nt.link(ns.name, "net1")["mtu"] == 1400
    assert nt.link(None, m.name)["mtu"] == 1500
    nt.ok(cni.tool("check", net, ns))
    nt.ok(cni.tool("del", net, ns))


CONF_MAC = "0a:58:c6:12:00:01"
ARGS_MAC = "0A:58:C6:12:00:02"  # upper case on purpose: the result and the link use lower case
CAP_MAC = "0a:58:c6:12:00:03"


@pytest.mark.parametrize(
    "conf_mac, args_mac, cap_mac, capability, expected",
    [
        pytest.param(CONF_MAC, None, None, False, CONF_MAC, id="config"),
        pytest.param(CONF_MAC, ARGS_MAC, None, False, ARGS_MAC.lower(), id="cni-args-over-config"),
        pytest.param(CONF_MAC, ARGS_MAC, CAP_MAC, True, CAP_MAC, id="runtime-config-over-cni-args"),
        pytest.param(None, None, CAP_MAC, True, CAP_MAC, id="runtime-config-alone"),
        pytest.param(CONF_MAC, ARGS_MAC, CAP_MAC, False, ARGS_MAC.lower(), id="cap-args-need-capability"),
    ],
)
def test_mac_precedence(cni, netns, master, conf_mac, args_mac, cap_mac, capability, expected):
    """config ``mac`` < CNI_ARGS ``MAC`` (Multus style) < ``runtimeConfig.mac`` (capability)."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    extra = {}
    if conf_mac:
        extra["mac"] = conf_mac
    if capability:
        extra["capabilities"] = {"mac": True}
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, "host-local", prefix, routes=False), **extra)))
    kw = {}
    if args_mac:
        kw["cni_args"] = f"IgnoreUnknown=true;K8S_POD_NAME=x;K8S_POD_NAMESPACE=default;MAC={args_mac}"
    if cap_mac:
        kw["cap_args"] = {"mac": cap_mac}

    result = add_ok(cni, net, ns, **kw)
    assert result["interfaces"][nt.iface_index(result, "net1")]["mac"] == expected
    assert nt.link(ns.name, "net1")["address"] == expected
    nt.ok(cni.tool("check", net, ns, **kw))
    nt.ok(cni.tool("del", net, ns, **kw))


def test_default_master_is_default_route_interface_in_container(cni, netns, master):
    """No ``master``: the interface of the default route is used; with ``linkInContainer`` that
    is looked up in the pod netns, here a veth end whose peer sits in another test netns."""
    pod, far = netns(), netns()
    m = master(ns=pod, peer_ns=far)
    link_prefix, _ = nt.random_subnet()
    pod.ip("addr", "add", f"{link_prefix}.2/24", "dev", m.name)
    pod.ip("route", "add", "default", "via", f"{link_prefix}.1")
    prefix = link_prefix.rsplit(".", 1)[0] + f".{(int(link_prefix.rsplit('.', 1)[1]) + 1) % 256}"
    net = f"{pod.name}-net"
    plugin = nt.macvlan(None, ipam_block(cni, "host-local", prefix, routes=False), linkInContainer=True)
    cni.write(nt.conflist(net, "1.0.0", plugin))

    result = add_ok(cni, net, pod)
    link = nt.link(pod.name, "net1")
    assert link["linkinfo"]["info_kind"] == "macvlan"
    assert link["link"] == m.name  # the parent, in the same netns
    assert link["address"] == result["interfaces"][0]["mac"]
    nt.ok(cni.tool("check", net, pod))
    nt.ok(cni.tool("del", net, pod))
    assert nt.link(pod.name, "net1") is None
    assert nt.link(pod.name, m.name) is not None  # the master is untouched


# --------------------------------------------------------------------------- Go reference


@pytest.mark.parametrize("version", VERSIONS)
def test_same_result_as_go_macvlan(cni, netns, master, version):
    """The same conflist with ``type`` swapped to the Go ``macvlan`` (host-local in both, separate
    dataDirs) gives the same interface name and sandbox, addresses, gateway, routes in the netns,
    macvlan mode and MTU. Each side has its own master (alike veth pairs), so the equal
    addresses never share a link."""
    m_py, m_go = master(), master()
    ns_py, ns_go = netns(), netns()
    prefix, _ = nt.random_subnet()
    go = cni.fork("go")

    def conf(env, type_):
        m = m_py if type_ == nt.PLUGIN else m_go
        plugin = nt.macvlan(m.name, ipam_block(env, "host-local", prefix), type_=type_, mode="private", mtu=1400)
        return nt.conflist("cmpnet", version, plugin)

    cni.write(conf(cni, nt.PLUGIN))
    go.write(conf(go, "macvlan"))
    py_res = add_ok(cni, "cmpnet", ns_py)
    go_res = add_ok(go, "cmpnet", ns_go)

    assert py_res["cniVersion"] == go_res["cniVersion"] == version
    assert [i["name"] for i in py_res["interfaces"]] == [i["name"] for i in go_res["interfaces"]]
    assert [i["sandbox"] for i in py_res["interfaces"]] == [ns_py.path]
    assert [i["sandbox"] for i in go_res["interfaces"]] == [ns_go.path]
    assert py_res["ips"] == go_res["ips"]
    assert py_res.get("routes") == go_res.get("routes")
    assert py_res.get("dns") == go_res.get("dns")
    assert nt.addresses(ns_py.name, "net1") == nt.addresses(ns_go.name, "net1")
    assert nt.routes(ns_py.name) == nt.routes(ns_go.name)
    py_link, go_link = nt.link(ns_py.name, "net1"), nt.link(ns_go.name, "net1")
    assert nt.macvlan_mode(py_link) == nt.macvlan_mode(go_link) == "private"
    assert py_link["mtu"] == go_link["mtu"] == 1400
    assert py_link["operstate"] == go_link["operstate"]

    nt.ok(cni.tool("del", "cmpnet", ns_py))
    nt.ok(go.tool("del", "cmpnet", ns_go))
    assert nt.owners(cni.host_local_dir) == {} and nt.owners(go.host_local_dir) == {}


def test_same_dual_stack_result_as_go_macvlan(cni, netns, master):
    """IPv4 + IPv6 (ULA) ranges and routes: same result and netns state as the Go plugin. Both
    wait for IPv6 DAD before adding v6 routes; DAD is switched off in both pod netns to keep the
    test fast (test_bad_input covers a real DAD failure). Separate masters all the same."""
    m_py, m_go = master(), master()
    ns_py, ns_go = netns(), netns()
    for ns in (ns_py, ns_go):
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0")
    prefix, _ = nt.random_subnet()
    net6 = ipaddress.ip_network(f"fd00:198:18:{prefix.rsplit('.', 1)[1]}::/64")
    go = cni.fork("go")

    def conf(env, type_):
        ipam = {
            "type": "host-local",
            "dataDir": str(env.host_local_dir),
            "ranges": [[{"subnet": f"{prefix}.0/24"}], [{"subnet": str(net6)}]],
            "routes": [{"dst": ROUTE_VIA_GATEWAY}, {"dst": "fd00:198:19::/64"}],
        }
        m = m_py if type_ == nt.PLUGIN else m_go
        return nt.conflist("dsnet", "1.0.0", nt.macvlan(m.name, ipam, type_=type_))

    cni.write(conf(cni, nt.PLUGIN))
    go.write(conf(go, "macvlan"))
    py_res = add_ok(cni, "dsnet", ns_py)
    go_res = add_ok(go, "dsnet", ns_go)
    assert len(py_res["ips"]) == 2
    assert py_res["ips"] == go_res["ips"]
    assert py_res["routes"] == go_res["routes"]
    for family in ("inet", "inet6"):
        assert nt.addresses(ns_py.name, "net1", family) == nt.addresses(ns_go.name, "net1", family)
    assert nt.routes(ns_py.name) == nt.routes(ns_go.name)
    assert nt.has_route(ns_py.name, "fd00:198:19::/64", gateway=str(net6[1]), dev="net1")
    nt.ok(cni.tool("check", "dsnet", ns_py))
    nt.ok(cni.tool("del", "dsnet", ns_py))
    nt.ok(go.tool("del", "dsnet", ns_go))
    assert nt.owners(cni.host_local_dir) == {} and nt.owners(go.host_local_dir) == {}


SPEC_CODES = {1, 4, 6, 7}

# name -> (command, version, plugin-config overrides, exec overrides, raw stdin or None)
GO_ERROR_CASES = {
    "missing-master": ("ADD", "1.0.0", {"master": "@missing"}, {}, None),
    "unknown-mode": ("ADD", "1.0.0", {"mode": "weird"}, {}, None),
    "mtu-above-master": ("ADD", "1.0.0", {"mtu": 9000}, {}, None),
    "ifname-too-long": ("ADD", "1.0.0", {}, {"ifname": "net123456789012x"}, None),
    "bad-container-id": ("ADD", "1.0.0", {}, {"container_id": "bad/id$"}, None),
    "invalid-json": ("ADD", "1.0.0", {}, {}, '{"cniVersion": "1.0.0", "name": "x", "type": '),
    "unsupported-cniVersion": ("ADD", "9.9.9", {}, {}, None),
    "check-at-0.3.1": ("CHECK", "0.3.1", {}, {}, None),
}


@pytest.mark.parametrize("case", list(GO_ERROR_CASES))
def test_error_codes_equivalent_to_go_macvlan(cni, netns, master, case):
    """Equivalence of error codes for the same bad input, by raw exec of both plugins.

    Where the Go plugin answers a spec-assigned code (1 incompatible version, 4 bad environment,
    6 decoding failure, 7 invalid config) macvlan-rdma gives the same code; where Go answers 999
    (its catch-all for plugin errors) macvlan-rdma gives a specific code (7, or 100 and up), never
    999. Both leave nothing behind.
    """
    command, version, overrides, exec_kw, raw = GO_ERROR_CASES[case]
    m = master()
    ns_py, ns_go = netns(), netns()
    prefix, _ = nt.random_subnet()
    go = cni.fork("go")
    host_before = nt.link_names()
    codes = {}
    for env, type_, ns in ((cni, nt.PLUGIN, ns_py), (go, "macvlan", ns_go)):
        plugin = nt.macvlan(m.name, ipam_block(env, "host-local", prefix, routes=False), type_=type_)
        plugin.update({k: (f"{m.name[:-1]}z" if v == "@missing" else v) for k, v in overrides.items()})
        stdin = raw if raw is not None else nt.single("errnet", version, plugin)
        kw = {"container_id": f"{ns.name}-cid", **exec_kw}
        proc = nt.raw_exec(env.plugin(type_), command, stdin, netns=ns.path, cni_path=[env.cni_bin], **kw)
        err = nt.cni_error(proc) if type_ == nt.PLUGIN else json.loads(proc.stdout)
        assert proc.returncode != 0, (type_, proc.stdout)
        codes[type_] = err["code"]
        assert nt.link(ns.name, "net1") is None, f"{type_} left net1 behind"
        assert nt.owners(env.host_local_dir) == {}, f"{type_} leaked a reservation"
    assert nt.link_names() == host_before

    go_code, py_code = codes["macvlan"], codes[nt.PLUGIN]
    if go_code in SPEC_CODES:
        assert py_code == go_code, codes
    elif go_code == 999:
        assert py_code == 7 or py_code >= 100, codes
        assert py_code != 999, codes
    else:
        assert py_code == go_code, codes


# --------------------------------------------------------------------------- 1.1.0, GC, STATUS (raw exec)


@pytest.mark.parametrize("ipam", [pytest.param(None, id="no-ipam"), IPAMS[1]])
def test_110_add_reports_interface_mtu(cni, netns, master, ipam):
    """Debian's host-local stops at 1.0.0, so 1.1.0 runs without IPAM or with lease-ipam."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    block = ipam_block(cni, ipam, prefix) if ipam else None
    stdin = nt.single(f"{ns.name}-net", "1.1.0", nt.macvlan(m.name, block, mtu=1400))
    cid = f"{ns.name}-cid"
    result = json.loads(nt.ok(cni.exec("ADD", stdin, ns=ns, container_id=cid)).stdout)
    assert result["cniVersion"] == "1.1.0"
    [itf] = result["interfaces"]
    link = nt.link(ns.name, "net1")
    assert itf == {"name": "net1", "mac": link["address"], "mtu": 1400, "sandbox": ns.path}
    assert link["mtu"] == 1400
    if ipam:
        [ipc] = result["ips"]
        assert "version" not in ipc and ipc["interface"] == 0
        assert nt.addresses(ns.name, "net1") == [ipc["address"]]
        assert nt.owners(cni.data_dir) == {bare_ip(ipc["address"]): cid}
    else:
        assert not result.get("ips")

    nt.ok(cni.exec("CHECK", {**stdin, "prevResult": result}, ns=ns, container_id=cid))
    nt.ok(cni.exec("DEL", {**stdin, "prevResult": result}, ns=ns, container_id=cid))
    assert nt.link(ns.name, "net1") is None
    assert nt.owners(cni.data_dir) == {}


_RECORDER = """#!/bin/sh
# Fake IPAM: records its stdin and env per command; answers like an IPAM.
dir=$(dirname "$0")
cat > "$dir/$CNI_COMMAND.stdin"
env > "$dir/$CNI_COMMAND.env"
if [ -e "$dir/$CNI_COMMAND.fail" ]; then cat "$dir/$CNI_COMMAND.fail"; exit 1; fi
exit 0
"""


@pytest.fixture
def recorder(cni) -> pathlib.Path:
    """A directory holding the fake IPAM ``rdtrec-ipam``, to put first on CNI_PATH."""
    d = cni.root / "fakebin"
    d.mkdir()
    (d / "rdtrec-ipam").write_text(_RECORDER)
    (d / "rdtrec-ipam").chmod(0o755)
    return d


def _env_file(path: pathlib.Path) -> dict:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_110_gc_forwards_valid_attachments_to_ipam(cni, master, recorder):
    m = master()
    valid = [{"containerID": "c-keep", "ifname": "net1"}, {"containerID": "c-other", "ifname": "net2"}]
    stdin = nt.single("gcnet", "1.1.0", nt.macvlan(m.name, {"type": "rdtrec-ipam"}))
    stdin["cni.dev/valid-attachments"] = valid
    proc = nt.ok(cni.exec("GC", stdin, ns=None, ifname=None, container_id=None, cni_path=[recorder, cni.cni_bin]))
    assert proc.stdout.strip() == ""
    forwarded = json.loads((recorder / "GC.stdin").read_text())
    assert forwarded == stdin  # the complete stdin, valid-attachments included
    assert _env_file(recorder / "GC.env")["CNI_COMMAND"] == "GC"


def test_110_status_forwards_to_ipam(cni, master, recorder):
    m = master()
    stdin = nt.single("stnet", "1.1.0", nt.macvlan(m.name, {"type": "rdtrec-ipam"}))
    path = [recorder, cni.cni_bin]
    nt.ok(cni.exec("STATUS", stdin, ns=None, ifname=None, container_id=None, cni_path=path))
    assert json.loads((recorder / "STATUS.stdin").read_text()) == stdin

    (recorder / "STATUS.fail").write_text(json.dumps({"cniVersion": "1.1.0", "code": 50, "msg": "pool exhausted"}))
    err = nt.cni_error(cni.exec("STATUS", stdin, ns=None, ifname=None, container_id=None, cni_path=path))
    assert err["code"] == 50 and "pool exhausted" in err["msg"]


@pytest.mark.parametrize("ipam", [pytest.param(None, id="no-ipam"), IPAMS[1]])
def test_110_status(cni, master, ipam):
    m = master()
    block = ipam_block(cni, ipam, nt.random_subnet()[0]) if ipam else None
    stdin = nt.single("stnet", "1.1.0", nt.macvlan(m.name, block))
    proc = nt.ok(cni.exec("STATUS", stdin, ns=None, ifname=None, container_id=None))
    assert proc.stdout.strip() == ""

    gone = f"{m.name[:-1]}z"
    err = nt.cni_error(cni.exec("STATUS", {**stdin, "master": gone}, ns=None, ifname=None, container_id=None))
    assert err["code"] == 50
    assert gone in err["msg"]


def test_110_status_and_gc_through_cnitool(cni, netns, master):
    """cnitool's gc/status (raw exec inside the front end, libcni 1.1.2 lacks them) on a 1.1.0
    conflist: STATUS 0, then 50 once the master is gone; GC passes."""
    m = master()
    ns = netns()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.1.0", nt.macvlan(m.name)))
    assert nt.ok(cni.tool("status", net, ns)).stdout == ""
    nt.ok(cni.tool("gc", net, ns, valid_attachments=[{"containerID": "c1", "ifname": "net1"}]))
    nt.ip("link", "del", m.name)
    err = cc.error_of(cni.tool("status", net, ns))
    assert err is not None and err["code"] == 50 and m.name in err["msg"]


@requires_lease_ipam
def test_110_status_reports_exhausted_lease_ipam_pool(cni, netns, master):
    m = master()
    prefix, _ = nt.random_subnet()
    stdin = nt.single("stnet", "1.1.0", nt.macvlan(m.name, nt.lease_ipam(cni.data_dir, f"{prefix}.4/30")))
    nt.ok(cni.exec("STATUS", stdin, ns=None, ifname=None, container_id=None))
    holders = [(netns(), f"c{i}") for i in range(2)]
    for ns, cid in holders:
        nt.ok(cni.exec("ADD", stdin, ns=ns, container_id=cid))
    err = nt.cni_error(cni.exec("STATUS", stdin, ns=None, ifname=None, container_id=None))
    assert err["code"] == 50, err
    for ns, cid in holders:
        nt.ok(cni.exec("DEL", stdin, ns=ns, container_id=cid))
    nt.ok(cni.exec("STATUS", stdin, ns=None, ifname=None, container_id=None))


@requires_lease_ipam
def test_110_gc_frees_stale_lease_ipam_reservations(cni, netns, master):
    m = master()
    ns_stale, ns_valid = netns(), netns()
    prefix, _ = nt.random_subnet()
    stdin = nt.single("gcnet", "1.1.0", nt.macvlan(m.name, ipam_block(cni, "lease-ipam", prefix, routes=False)))
    stale = json.loads(nt.ok(cni.exec("ADD", stdin, ns=ns_stale, container_id="c-stale")).stdout)
    valid = json.loads(nt.ok(cni.exec("ADD", stdin, ns=ns_valid, container_id="c-valid")).stdout)
    stale_ip, valid_ip = bare_ip(stale["ips"][0]["address"]), bare_ip(valid["ips"][0]["address"])
    assert nt.owners(cni.data_dir) == {stale_ip: "c-stale", valid_ip: "c-valid"}

    gc = {**stdin, "cni.dev/valid-attachments": [{"containerID": "c-valid", "ifname": "net1"}]}
    nt.ok(cni.exec("GC", gc, ns=None, ifname=None, container_id=None))
    assert nt.owners(cni.data_dir) == {valid_ip: "c-valid"}
    assert nt.files_mentioning([cni.data_dir], "c-stale") == []

    nt.ok(cni.exec("DEL", stdin, ns=ns_valid, container_id="c-valid"))
    nt.ok(cni.exec("DEL", stdin, ns=ns_stale, container_id="c-stale"))
    assert nt.owners(cni.data_dir) == {}


# --------------------------------------------------------------------------- RDMA awareness


def test_rdma_required_on_veth_fails_cleanly(cni, netns, master):
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, "host-local", prefix), rdma="required")))
    host_before, pod_before = nt.link_names(), nt.link_names(ns.name)

    proc = cni.tool("add", net, ns)
    assert proc.returncode != 0
    err = cc.error_of(proc)
    assert err is not None, proc.stdout
    assert err["code"] == 101
    text = f"{err['msg']} {err['details']}"
    assert m.name in text and "rdma" in text and '"auto"' in text  # names the master and the fix
    assert nt.link_names() == host_before and nt.link_names(ns.name) == pod_before
    assert nt.owners(cni.host_local_dir) == {}
    assert "Traceback" not in proc.stderr


def _devinfo_setup(cni, netns, master):
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    plugin = nt.macvlan(m.name, ipam_block(cni, "host-local", prefix, routes=False), rdma="auto",
                        capabilities={"CNIDeviceInfoFile": True})
    cni.write(nt.conflist(net, "1.0.0", plugin))
    devinfo = cni.root / "devinfo" / "cni" / f"{net}-{cc.container_id(ns.path)}_net1"
    return ns, m, net, devinfo


def test_rdma_auto_without_rdma_device_writes_no_device_info(cni, netns, master):
    ns, m, net, devinfo = _devinfo_setup(cni, netns, master)
    cap = {"CNIDeviceInfoFile": str(devinfo)}
    add_ok(cni, net, ns, cap_args=cap)
    assert nt.link(ns.name, "net1") is not None
    assert not devinfo.exists() and not devinfo.parent.exists()
    nt.ok(cni.tool("check", net, ns, cap_args=cap))
    nt.ok(cni.tool("del", net, ns, cap_args=cap))


def test_rdma_device_info_file_written_from_sysfs(cni, netns, master):
    ns, m, net, devinfo = _devinfo_setup(cni, netns, master)
    sysroot = nt.fake_sysfs(cni.root / "sysfs", m.name)
    cap = {"CNIDeviceInfoFile": str(devinfo)}
    env = {"RDMANET_SYSFS_ROOT": str(sysroot)}
    add_ok(cni, net, ns, cap_args=cap, extra_env=env)
    assert json.loads(devinfo.read_text()) == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": "0000:3b:00.0", "rdma-device": "mlx5_0"},
    }
    nt.ok(cni.tool("check", net, ns, cap_args=cap, extra_env=env))
    nt.ok(cni.tool("del", net, ns, cap_args=cap, extra_env=env))
    assert nt.owners(cni.host_local_dir) == {}


def test_rdma_device_info_keeps_fields_of_readonly_file(cni, netns, master):
    """Multus copies the device plugin's file there first, mode 0444; its fields are kept."""
    ns, m, net, devinfo = _devinfo_setup(cni, netns, master)
    sysroot = nt.fake_sysfs(cni.root / "sysfs", m.name)
    existing = {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": "0000:3b:00.0", "vhost-net": "/dev/vhost-net", "representor-device": "pf0vf3"},
        "x-vendor": {"numa-node": 1},
    }
    devinfo.parent.mkdir(parents=True)
    devinfo.write_text(json.dumps(existing))
    devinfo.chmod(0o444)
    cap = {"CNIDeviceInfoFile": str(devinfo)}
    add_ok(cni, net, ns, cap_args=cap, extra_env={"RDMANET_SYSFS_ROOT": str(sysroot)})
    expected = json.loads(json.dumps(existing))
    expected["pci"]["rdma-device"] = "mlx5_0"
    assert json.loads(devinfo.read_text()) == expected
    assert stat.S_IMODE(os.stat(devinfo).st_mode) == 0o444
    nt.ok(cni.tool("del", net, ns, cap_args=cap, extra_env={"RDMANET_SYSFS_ROOT": str(sysroot)}))


def test_rdma_off_ignores_rdma_device(cni, netns, master):
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    plugin = nt.macvlan(m.name, ipam_block(cni, "host-local", prefix, routes=False), rdma="off",
                        capabilities={"CNIDeviceInfoFile": True})
    cni.write(nt.conflist(net, "1.0.0", plugin))
    devinfo = cni.root / "devinfo" / "cni" / "x"
    env = {"RDMANET_SYSFS_ROOT": str(nt.fake_sysfs(cni.root / "sysfs", m.name))}
    add_ok(cni, net, ns, cap_args={"CNIDeviceInfoFile": str(devinfo)}, extra_env=env)
    assert not devinfo.exists()
    nt.ok(cni.tool("del", net, ns, extra_env=env))


def test_rdma_required_with_device_but_no_rdma_netlink(cni, netns, master):
    """The master has an RDMA device (fake sysfs) but this kernel has no RDMA core, so the netns
    mode cannot be checked: "required" fails with 101 and says what to load."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam_block(cni, "host-local", prefix), rdma="required")))
    env = {"RDMANET_SYSFS_ROOT": str(nt.fake_sysfs(cni.root / "sysfs", m.name))}
    pod_before = nt.link_names(ns.name)
    proc = cni.tool("add", net, ns, extra_env=env)
    err = cc.error_of(proc)
    assert err is not None and err["code"] == 101, proc.stdout
    assert "modprobe" in err["details"] and '"auto"' in err["details"]
    assert nt.link_names(ns.name) == pod_before
    assert nt.owners(cni.host_local_dir) == {}


def test_rdma_device_info_for_soft_roce(cni, netns, master):
    """A soft-RoCE device (no PCI parent) on the master is found through
    /sys/class/infiniband/<dev>/parent. A "pci" device-info file must carry pci-address
    (device-info-spec 1.1.0), so none is created; a file Multus already put there is updated."""
    ns, m, net, devinfo = _devinfo_setup(cni, netns, master)
    env = {"RDMANET_SYSFS_ROOT": str(nt.fake_soft_roce(cni.root / "sysfs", m.name))}
    add_ok(cni, net, ns, cap_args={"CNIDeviceInfoFile": str(devinfo)}, extra_env=env)
    assert not devinfo.exists()
    nt.ok(cni.tool("del", net, ns, extra_env=env))
    devinfo.parent.mkdir(parents=True, exist_ok=True)
    devinfo.write_text(json.dumps({"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:00:05.0"}}))
    add_ok(cni, net, ns, cap_args={"CNIDeviceInfoFile": str(devinfo)}, extra_env=env)
    info = json.loads(devinfo.read_text())
    assert info["pci"] == {"pci-address": "0000:00:05.0", "rdma-device": "rxe0"}
    nt.ok(cni.tool("del", net, ns, extra_env=env))
