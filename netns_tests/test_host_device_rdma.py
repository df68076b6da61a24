"""host-device-rdma against the real kernel, driven by a real CNI runtime (cnitool on libcni 1.1.2).

A veth end the test creates stands in for the host device (the ``master`` fixture: both ends
up, IPv6 address generation off). ADD must move it into the pod netns as CNI_IFNAME with
IFLA_IFALIAS = its original name; DEL must put it back exactly as it was: name, MAC, MTU,
up/down state and alias, compared on ``ip -d -j link show`` minus the fields a netns round trip
changes by itself (``nstools.VOLATILE_LINK_FIELDS``: the kernel resets a moved device's IPv6
addrgenmode to the namespace default, and a veth peer is named by index from another netns).

Multus-style device IDs are resolved in a fake sysfs tree (``RDMANET_SYSFS_ROOT``) whose PCI
function ``0000:3b:00.2`` (a VF of ``0000:3b:00.0``, driver mlx5_core) has the veth as its
netdev. This kernel has no RDMA core, so the RDMA netns mode reads as unknown.

Conflists at 0.3.1, 0.4.0 and 1.0.0 go through cnitool; 1.1.0, GC and STATUS through a raw exec
of the plugin with a bare CNI environment, as a runtime would do it. State files live in the
test's temporary directory (the node policy's ``hostDeviceStateDir``, which the runtime's
environment names: conftest.CniEnv).
"""

from __future__ import annotations

import json
import os
import pathlib
from concurrent.futures import ThreadPoolExecutor

import pytest

try:
    from netns_tests import cnitool_client as cc
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import cnitool_client as cc  # type: ignore[no-redef]
    import nstools as nt  # type: ignore[no-redef]

PLUGIN = "host-device-rdma"
VERSIONS = nt.CNITOOL_VERSIONS
_LEASE_MISSING = nt.lease_ipam_missing()
requires_lease_ipam = pytest.mark.skipif(_LEASE_MISSING is not None, reason=str(_LEASE_MISSING))
IPAMS = [pytest.param("host-local", id="host-local"),
         pytest.param("lease-ipam", id="lease-ipam", marks=requires_lease_ipam)]

ROUTE_DST = "198.19.252.0/24"
PF_PCI = "0000:3b:00.0"
VF_PCI = "0000:3b:00.2"
DPDK_PCI = "0000:3b:00.3"
ORIGINAL_MAC = "0a:58:c6:12:7f:01"  # set on the veth before ADD, so a MAC change is visible


# --------------------------------------------------------------------------- helpers


def state_dir(cni) -> pathlib.Path:
    return cni.root / "hd-state"


def hd(cni, device=None, ipam=None, **extra) -> dict:
    """A host-device-rdma plugin config (its state goes to the node policy's hostDeviceStateDir:
    the test's ``hd-state``, see conftest.CniEnv)."""
    conf: dict = {"type": PLUGIN}
    if device is not None:
        conf["device"] = device
    if ipam is not None:
        conf["ipam"] = ipam
    conf.update(extra)
    return conf


def ipam_block(cni, kind: str, prefix: str, *, routes: bool = True, **extra) -> dict:
    route_list = [{"dst": ROUTE_DST}] if routes else None
    if kind == "host-local":
        return nt.host_local(cni.host_local_dir, f"{prefix}.0/24", gateway=f"{prefix}.1", routes=route_list, **extra)
    return nt.lease_ipam(cni.data_dir, f"{prefix}.0/24", gateway=f"{prefix}.1", routes=route_list, **extra)


store_of, bare_ip, add_ok = nt.store_of, nt.bare_ip, nt.add_ok


def exec_ok(cni, command, stdin, **kw) -> dict | None:
    out = nt.ok(cni.exec(command, stdin, plugin=PLUGIN, **kw)).stdout.strip()
    return json.loads(out) if out else None


def exec_err(cni, command, stdin, **kw) -> dict:
    proc = cni.exec(command, stdin, plugin=PLUGIN, **kw)
    nt.no_traceback(proc)
    return nt.cni_error(proc)


def tool_err(proc) -> dict:
    err = cc.error_of(proc)
    assert err is not None, f"no CNI error JSON on stdout: {proc.stdout!r} / {proc.stderr!r}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return err


def state_files(cni) -> dict[str, dict]:
    """The per-attachment state files (``<net>-<cid>-<ifname>.json``) by name."""
    root = state_dir(cni)
    return {p.name: json.loads(p.read_text()) for p in root.glob("*.json")} if root.exists() else {}


def allocations(cni) -> list[str]:
    """The per-device allocation records (and any temp file of one)."""
    root = state_dir(cni) / "devices"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def mounts_left(cni) -> list[str]:
    """Mounts of any kind (a pinned netns) under the state dir: the plugin makes none."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(state_dir(cni)) + "/")]


def nothing_recorded(cni) -> None:
    assert state_files(cni) == {}, "a state file is left"
    assert allocations(cni) == [], "an allocation record is left"
    assert list(state_dir(cni).glob(".*.tmp")) == [], "a temporary state file is left"
    assert mounts_left(cni) == [], "a netns is left mounted under the state dir"


def prepared(master, *, up: bool = True, mtu: int | None = None, alias: str | None = None):
    """A veth end in the host with a known MAC, up or down, and its settled snapshot."""
    m = master(mtu=mtu)
    nt.ip("link", "set", m.name, "address", ORIGINAL_MAC)
    if alias:
        nt.ip("link", "set", m.name, "alias", alias)
    if not up:
        nt.ip("link", "set", m.name, "down")
    return m, nt.settled_link(None, m.name)


def assert_restored(name: str, before: dict) -> None:
    """The device is back in the host exactly as before (name, MAC, MTU, up/down, alias, ...)."""
    after = nt.wait_link_equal(None, name, before)
    assert after == before, f"{name} not restored:\nbefore {before}\nafter  {after}"


def assert_in_pod(ns, ifname: str, original: str, mac: str) -> dict:
    """``ip -n <ns> -d -j link`` shows the moved device under ``ifname`` with the original name
    as alias; it is gone from the host."""
    link = nt.link(ns.name, ifname)
    assert link is not None, f"{ifname} is not in {ns.name}"
    assert link["ifalias"] == original
    assert link["address"] == mac
    assert link["linkinfo"]["info_kind"] == "veth"
    assert "UP" in link["flags"]
    assert nt.link(None, original) is None, f"{original} is still in the host netns"
    assert [e["ifname"] for e in nt.links(ns.name) if e["ifname"] != "lo"] == [ifname]
    return link


def fake_vf(cni, netdev: str, *, ibdev: str | None = None) -> dict:
    """A fake sysfs where VF_PCI (a VF of PF_PCI, mlx5_core) has ``netdev``; the env to pass."""
    root = nt.fake_pci_function(cni.root / "sysfs", VF_PCI, netdev=netdev, pf=PF_PCI, vf_index=0, ibdev=ibdev)
    return {"RDMANET_SYSFS_ROOT": str(root)}


# --------------------------------------------------------------------------- the plugin as installed


def test_copied_console_script_runs_with_bare_env(cni):
    proc = nt.ok(nt.raw_exec(cni.plugin(PLUGIN), "VERSION", b"", container_id=None, ifname=None))
    assert {"0.3.1", "0.4.0", "1.0.0", "1.1.0"} <= set(json.loads(proc.stdout)["supportedVersions"])


# --------------------------------------------------------------------------- ADD / CHECK / DEL


@pytest.mark.parametrize("ipam", IPAMS)
@pytest.mark.parametrize("version", VERSIONS)
def test_add_check_del(cni, netns, master, version, ipam):
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, version, hd(cni, m.name, ipam_block(cni, ipam, prefix))))
    cid = cc.container_id(ns.path)

    result = add_ok(cni, net, ns)
    assert result["cniVersion"] == version
    assert result["interfaces"] == [{"name": "net1", "mac": ORIGINAL_MAC, "sandbox": ns.path}]
    assert_in_pod(ns, "net1", m.name, ORIGINAL_MAC)
    [ipc] = result["ips"]
    assert ipc["interface"] == 0
    assert ("version" in ipc) == (version != "1.0.0")
    assert ipc["address"].startswith(prefix + ".") and ipc["address"].endswith("/24")
    assert ipc["gateway"] == f"{prefix}.1"
    assert nt.addresses(ns.name, "net1") == [ipc["address"]]
    assert nt.has_route(ns.name, ROUTE_DST, gateway=f"{prefix}.1", dev="net1")
    assert nt.owners(store_of(cni, ipam)) == {bare_ip(ipc["address"]): cid}
    assert list(state_files(cni)) == [f"{net}-{cid}-net1.json"]
    assert len(allocations(cni)) == 1

    if version != "0.3.1":  # CHECK needs 0.4.0 (libcni refuses it before calling the plugin)
        assert nt.ok(cni.tool("check", net, ns)).stdout == ""

    nt.ok(cni.tool("del", net, ns))
    assert nt.link(ns.name, "net1") is None
    assert_restored(m.name, before)
    assert nt.owners(store_of(cni, ipam)) == {}
    assert nt.files_mentioning([store_of(cni, ipam)], cid) == []
    nothing_recorded(cni)

    nt.ok(cni.tool("del", net, ns))  # DEL twice
    assert_restored(m.name, before)
    nothing_recorded(cni)


@pytest.mark.parametrize(
    "up, alias, mtu",
    [
        pytest.param(True, None, None, id="up"),
        pytest.param(False, None, None, id="down"),
        pytest.param(False, "rack-uplink-7", 9000, id="down-with-alias-and-mtu-9000"),
        pytest.param(True, "rack-uplink-7", 1280, id="up-with-alias-and-mtu-1280"),
    ],
)
def test_del_restores_the_device_exactly(cni, netns, master, up, alias, mtu):
    """MAC and MTU changed in the pod (config ``mac``/``mtu``); DEL brings back name, MAC, MTU,
    up/down state and the alias the device had (none, or its own)."""
    ns = netns()
    m, before = prepared(master, up=up, mtu=mtu, alias=alias)
    assert ("UP" in before["flags"]) == up and before.get("ifalias") == alias
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, mac="0a:58:c6:12:7f:99", mtu=1400)))
    result = add_ok(cni, net, ns)
    assert result["interfaces"] == [{"name": "net1", "mac": "0a:58:c6:12:7f:99", "sandbox": ns.path}]
    link = assert_in_pod(ns, "net1", m.name, "0a:58:c6:12:7f:99")
    assert link["mtu"] == 1400
    nt.ok(cni.tool("check", net, ns))
    nt.ok(cni.tool("del", net, ns))
    assert_restored(m.name, before)
    nothing_recorded(cni)


@pytest.mark.parametrize("ipam", IPAMS)
def test_del_after_netns_is_deleted(cni, netns, master, ipam):
    """A veth dies with its netns: DEL still succeeds, releases IPAM and drops the state file and
    the allocation record (twice)."""
    ns = netns()
    m, _ = prepared(master)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, ipam_block(cni, ipam, prefix))))
    result = add_ok(cni, net, ns)
    assert bare_ip(result["ips"][0]["address"]) in nt.owners(store_of(cni, ipam))

    nt.ip("netns", "del", ns.name)
    assert nt.wait_link_gone(None, m.peer), "the veth did not die with its netns"
    nt.ok(cni.tool("del", net, ns))
    assert nt.owners(store_of(cni, ipam)) == {}
    assert nt.files_mentioning([store_of(cni, ipam)], cc.container_id(ns.path)) == []
    nothing_recorded(cni)
    nt.ok(cni.tool("del", net, ns))
    assert nt.link(None, m.name) is None


def test_del_when_the_kernel_returned_the_device_under_its_pod_name(cni, netns, master):
    """A physical device outlives its netns: the kernel moves it back to the host under its pod
    name, still carrying the alias ADD set. (A veth would die, so the test moves it back by hand
    before deleting the netns.) DEL finds it by the alias and restores it exactly."""
    ns = netns()
    m, before = prepared(master, up=True)
    ifname = f"{nt.PREFIX}p"  # a host-side name of this session: the leak guard removes a leftover
    stdin = nt.single(f"{ns.name}-net", "1.0.0", hd(cni, m.name, mtu=1400, mac="0a:58:c6:12:7f:42"))
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1", ifname=ifname)
    ns.ip("link", "set", ifname, "netns", "1")
    nt.ip("netns", "del", ns.name)
    assert nt.link(None, ifname)["ifalias"] == m.name
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1", ifname=ifname)
    assert nt.link(None, ifname) is None
    assert_restored(m.name, before)
    nothing_recorded(cni)


def test_del_never_touches_another_link_that_took_the_original_name(cni, netns, master):
    """While the device is in the pod, a new host link gets its original name. DEL must not
    destroy the device, nor rename, re-address or resize the stranger: it fails (100) naming the
    clash, keeps the device in the pod and its state, and succeeds once the name is free."""
    ns = netns()
    m, before = prepared(master)
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, mtu=1400)))
    add_ok(cni, net, ns)
    in_pod = nt.link(ns.name, "net1")
    nt.ip("link", "add", m.name, "mtu", "1300", "type", "veth", "peer", "name", f"{m.name[:-1]}c")
    stranger = nt.settled_link(None, m.name)

    err = tool_err(cni.tool("del", net, ns))
    assert err["code"] == 100 and m.name in err["msg"], err
    assert nt.link_snapshot(None, m.name) == stranger
    assert nt.link(ns.name, "net1") == in_pod
    assert len(state_files(cni)) == 1

    nt.ip("link", "del", m.name)  # takes its peer along
    nt.ok(cni.tool("del", net, ns))
    assert_restored(m.name, before)
    nothing_recorded(cni)


def test_del_when_the_pod_has_a_link_named_like_the_original(cni, netns, master):
    """DEL gives the device its original name in the pod before moving it home; when a pod link
    already has that name, the move names the device instead. Either way it comes home as it
    was, and the pod's link is left as it was."""
    ns = netns()
    m, before = prepared(master, mtu=1400)
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, mtu=1300)))
    add_ok(cni, net, ns)
    ns.ip("link", "add", m.name, "type", "veth", "peer", "name", f"{m.name[:-1]}c")
    pods_own = nt.settled_link(ns.name, m.name)
    nt.ok(cni.tool("del", net, ns))
    assert_restored(m.name, before)
    assert nt.link_snapshot(ns.name, m.name) == pods_own
    assert nt.link(ns.name, "net1") is None
    nothing_recorded(cni)


def test_del_after_the_device_died_leaves_a_namesake_alone(cni, netns, master):
    """The pod netns (and with it the veth) is gone and a different link now has the original
    name: DEL succeeds without changing that link."""
    ns = netns()
    m, _ = prepared(master)
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, mtu=1400)))
    add_ok(cni, net, ns)
    nt.ip("netns", "del", ns.name)
    assert nt.wait_link_gone(None, m.peer)
    nt.ip("link", "add", m.name, "mtu", "1300", "type", "veth", "peer", "name", f"{m.name[:-1]}c")
    stranger = nt.settled_link(None, m.name)
    nt.ok(cni.tool("del", net, ns))
    assert nt.link_snapshot(None, m.name) == stranger
    nothing_recorded(cni)


def test_del_with_empty_netns(cni, netns, master):
    """Raw exec: Multus and kubelet may DEL with an empty CNI_NETNS. The plugin takes the pod
    netns from its state file: the device comes home, IPAM is released (Go host-device returns
    early there and does neither)."""
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", hd(cni, m.name, ipam_block(cni, "host-local", prefix)))
    cid = f"{ns.name}-cid"
    result = exec_ok(cni, "ADD", stdin, ns=ns, container_id=cid)
    assert nt.owners(cni.host_local_dir) == {bare_ip(result["ips"][0]["address"]): cid}

    assert exec_ok(cni, "DEL", stdin, ns="", container_id=cid) is None
    assert nt.link(ns.name, "net1") is None
    assert_restored(m.name, before)
    assert nt.owners(cni.host_local_dir) == {}
    nothing_recorded(cni)
    exec_ok(cni, "DEL", stdin, ns="", container_id=cid)
    assert_restored(m.name, before)


def test_device_held_by_another_pod_is_refused(cni, netns, master):
    """A second pod asking for the device gets 106 and nothing changes: the first pod keeps its
    link and reservation, the second gets no link, no reservation, no state. The second pod's
    DEL (runtimes DEL after a failed ADD) does not take the device from the first."""
    ns1, ns2 = netns(), netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    net = f"{ns1.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, ipam_block(cni, "host-local", prefix))))
    add_ok(cni, net, ns1)
    link1, owners, states = nt.link(ns1.name, "net1"), nt.owners(cni.host_local_dir), state_files(cni)
    pod2_before = nt.link_names(ns2.name)

    err = tool_err(cni.tool("add", net, ns2))
    assert err["code"] == 106, err
    assert ns1.path in err["msg"] and "DEL" in err["details"]
    assert nt.link_names(ns2.name) == pod2_before
    assert nt.link(ns1.name, "net1") == link1
    assert nt.owners(cni.host_local_dir) == owners and state_files(cni) == states

    nt.ok(cni.tool("del", net, ns2))
    assert nt.link(ns1.name, "net1") == link1
    assert nt.owners(cni.host_local_dir) == owners and state_files(cni) == states
    nt.ok(cni.tool("check", net, ns1))

    nt.ok(cni.tool("del", net, ns1))
    assert_restored(m.name, before)
    assert nt.owners(cni.host_local_dir) == {}
    nothing_recorded(cni)


def test_concurrent_adds_of_one_device_give_it_to_one_pod(cni, netns, master):
    """Two pods ADD the same device at the same moment (raw exec, in parallel): the per-device
    lock serialises them, one gets the device, the other 106; both DELs leave it home."""
    pods = [netns(), netns()]
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{pods[0].name}-net", "1.0.0", hd(cni, m.name, ipam_block(cni, "host-local", prefix)))
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda i: cni.exec("ADD", stdin, plugin=PLUGIN, ns=pods[i], container_id=f"c{i}"), (0, 1)))
    winners = [i for i, p in enumerate(procs) if p.returncode == 0]
    assert len(winners) == 1, [(p.returncode, p.stdout) for p in procs]
    [loser] = {0, 1} - set(winners)
    assert nt.cni_error(procs[loser])["code"] == 106
    assert nt.link(pods[winners[0]].name, "net1") is not None and nt.link(pods[loser].name, "net1") is None
    assert list(nt.owners(cni.host_local_dir).values()) == [f"c{winners[0]}"]
    for i in (loser, winners[0]):
        exec_ok(cni, "DEL", stdin, ns=pods[i], container_id=f"c{i}")
    assert_restored(m.name, before)
    assert nt.owners(cni.host_local_dir) == {}
    nothing_recorded(cni)


def test_ifname_already_in_pod_is_refused(cni, netns, master):
    ns = netns()
    m, before = prepared(master)
    ns.ip("link", "add", "net1", "type", "veth", "peer", "name", "net1peer")
    pod_before = nt.link_names(ns.name)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, ipam_block(cni, "host-local", prefix))))

    err = tool_err(cni.tool("add", net, ns))
    assert err["code"] == 4 and "net1" in err["msg"], err
    assert nt.link_names(ns.name) == pod_before
    assert nt.link(ns.name, "net1")["link"] == "net1peer"
    assert_restored(m.name, before)
    assert nt.owners(cni.host_local_dir) == {}
    nothing_recorded(cni)


@pytest.mark.parametrize("ipam", IPAMS)
def test_repeat_add_of_a_finished_attachment_ends_as_one_clean_add(cni, netns, master, ipam):
    """A runtime retries an ADD whose answer it lost (the call was killed after the attachment was
    complete): the repeat ADD undoes the first (device home, reservation released) and ADDs again,
    so the end state is the one of a single ADD: the device in the pod once, one reservation, one
    state file and allocation record; CHECK and DEL work on it and restore the device."""
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, ipam_block(cni, ipam, prefix))))
    cid = cc.container_id(ns.path)
    add_ok(cni, net, ns)
    states = set(state_files(cni))
    result = add_ok(cni, net, ns)
    assert_in_pod(ns, "net1", m.name, ORIGINAL_MAC)
    [ipc] = result["ips"]
    assert nt.addresses(ns.name, "net1") == [ipc["address"]]
    assert nt.owners(store_of(cni, ipam)) == {bare_ip(ipc["address"]): cid}
    assert set(state_files(cni)) == states and len(allocations(cni)) == 1
    nt.ok(cni.tool("check", net, ns))
    nt.ok(cni.tool("del", net, ns))
    assert_restored(m.name, before)
    assert nt.owners(store_of(cni, ipam)) == {}
    nothing_recorded(cni)


@pytest.mark.parametrize("tamper", ["mac", "address", "link-down"])
def test_check_fails_after_tampering_and_del_still_restores(cni, netns, master, tamper):
    """CHECK finds a changed MAC or a missing address (105); whatever the pod changed (also the
    link's up state), DEL puts the device back as it was before ADD."""
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, ipam_block(cni, "host-local", prefix))))
    result = add_ok(cni, net, ns)
    nt.ok(cni.tool("check", net, ns))
    if tamper == "mac":
        ns.ip("link", "set", "net1", "address", "0a:58:c6:12:7f:77")
        expect = "MAC"
    elif tamper == "address":
        ns.ip("addr", "del", result["ips"][0]["address"], "dev", "net1")
        expect = result["ips"][0]["address"]
    else:
        ns.ip("link", "set", "net1", "down")
        expect = None  # a down link is the workload's business; CHECK may pass
    proc = cni.tool("check", net, ns)
    if expect is not None:
        err = tool_err(proc)
        assert err["code"] == 105 and expect in err["msg"], err
    nt.ok(cni.tool("del", net, ns))
    assert_restored(m.name, before)
    assert nt.owners(cni.host_local_dir) == {}
    nothing_recorded(cni)


def _fill_lease_range(cni, ns, stdin) -> str:
    """Reserve the only address of ``stdin``'s lease-ipam range for another attachment."""
    proc = nt.ok(cni.exec("ADD", stdin, ns=ns, plugin="lease-ipam", container_id="rdt-filler"))
    return bare_ip(json.loads(proc.stdout)["ips"][0]["address"])


ROLLBACKS = [
    pytest.param("mtu-below-kernel-minimum", id="mtu-67"),
    pytest.param("ipv6-address-on-small-mtu", id="ipv6-address-after-ipam"),
    pytest.param("missing-ipam-plugin", id="missing-ipam-plugin"),
    pytest.param("exhausted-lease-range", id="exhausted-lease-ipam", marks=requires_lease_ipam),
]


@pytest.mark.parametrize("case", ROLLBACKS)
@pytest.mark.parametrize("up", [True, False], ids=["up", "down"])
def test_failed_add_rolls_back(cni, netns, master, case, up):
    """A step after the move fails; the device is back on the host exactly as before (name, MAC,
    MTU, up state, no alias) and there is no state file, allocation record or reservation.

    - mtu 67: valid for the config model (0-65535), refused by the kernel when ADD sets it in
      the pod (a veth's min_mtu is 68).
    - mtu 1200 with an IPv6 range: the MTU is set, IPAM reserves an address, then adding the
      IPv6 address fails (IPv6 is off below 1280): the reservation must be released too.
    - ipam.type names a plugin that is not on CNI_PATH.
    - the lease-ipam range has one address and another attachment holds it.
    """
    ns = netns()
    m, before = prepared(master, up=up)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    store = cni.host_local_dir
    fillers: dict = {}
    if case == "mtu-below-kernel-minimum":
        conf, code, words = hd(cni, m.name, ipam_block(cni, "host-local", prefix), mtu=67), 100, ["MTU 67"]
    elif case == "ipv6-address-on-small-mtu":
        ipam = {"type": "host-local", "dataDir": str(store), "ranges": [[{"subnet": f"fd00:198:18:{prefix.rsplit('.', 1)[1]}::/64"}]]}
        conf, code, words = hd(cni, m.name, ipam, mtu=1200), 100, ["add address fd00:198:18:"]
    elif case == "missing-ipam-plugin":
        conf, code, words = hd(cni, m.name, {"type": "rdt-no-such-ipam"}), 7, ['"rdt-no-such-ipam"']
    else:
        store = cni.data_dir
        ipam = nt.lease_ipam(store, f"{prefix}.0/24", range_start=f"{prefix}.10", range_end=f"{prefix}.10")
        conf, code, words = hd(cni, m.name, ipam), 102, ["no free address", f"{prefix}.10"]
        fillers = {_fill_lease_range(cni, netns(), nt.single(net, "1.0.0", conf)): "rdt-filler"}
    cni.write(nt.conflist(net, "1.0.0", conf))
    pod_before = nt.link_names(ns.name)

    err = tool_err(cni.tool("add", net, ns))
    assert err["code"] == code, err
    assert all(w in err["msg"] for w in words), err
    assert nt.link_names(ns.name) == pod_before
    assert_restored(m.name, before)
    assert nt.owners(store) == fillers
    nothing_recorded(cni)


@pytest.mark.parametrize(
    "where",
    [pytest.param("config", id="config"), pytest.param("cni-args", id="cni-args"),
     pytest.param("runtime-config", id="runtime-config")],
)
def test_mac_is_applied_and_restored(cni, netns, master, where):
    """config ``mac`` < CNI_ARGS ``MAC`` (Multus style) < ``runtimeConfig.mac`` (capability);
    the original MAC is back after DEL."""
    ns = netns()
    m, before = prepared(master)
    net = f"{ns.name}-net"
    extra, kw = {"mac": "0a:58:c6:12:7f:10"}, {}
    expected = "0a:58:c6:12:7f:10"
    if where in ("cni-args", "runtime-config"):
        kw["cni_args"] = "IgnoreUnknown=true;K8S_POD_NAME=x;MAC=0A:58:C6:12:7F:20"
        expected = "0a:58:c6:12:7f:20"
    if where == "runtime-config":
        extra["capabilities"] = {"mac": True}
        kw["cap_args"] = {"mac": "0a:58:c6:12:7f:30"}
        expected = "0a:58:c6:12:7f:30"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, m.name, **extra)))
    result = add_ok(cni, net, ns, **kw)
    assert result["interfaces"] == [{"name": "net1", "mac": expected, "sandbox": ns.path}]
    assert_in_pod(ns, "net1", m.name, expected)
    nt.ok(cni.tool("check", net, ns, **kw))
    nt.ok(cni.tool("del", net, ns, **kw))
    assert_restored(m.name, before)
    assert before["address"] == ORIGINAL_MAC


@pytest.mark.parametrize("mtu", [None, 1400], ids=["device-mtu", "config-mtu"])
def test_110_result_reports_mtu_which_is_applied_and_restored(cni, netns, master, mtu):
    """1.1.0 by raw exec (libcni 1.1.2 cannot parse it): ``interfaces[0].mtu`` is the MTU in the
    pod; no ``pciID`` for a device selected by name (a veth has no PCI function). lease-ipam
    because Debian's host-local stops at 1.0.0."""
    ns = netns()
    m, before = prepared(master, mtu=9000)
    prefix, _ = nt.random_subnet()
    ipam = [ipam_block(cni, "lease-ipam", prefix)] if _LEASE_MISSING is None else []
    extra = {"mtu": mtu} if mtu else {}
    stdin = nt.single(f"{ns.name}-net", "1.1.0", hd(cni, m.name, *ipam, **extra))
    cid = f"{ns.name}-cid"
    result = exec_ok(cni, "ADD", stdin, ns=ns, container_id=cid)
    assert result["cniVersion"] == "1.1.0"
    assert result["interfaces"] == [{"name": "net1", "mac": ORIGINAL_MAC, "mtu": mtu or 9000, "sandbox": ns.path}]
    assert assert_in_pod(ns, "net1", m.name, ORIGINAL_MAC)["mtu"] == (mtu or 9000)
    if ipam:
        [ipc] = result["ips"]
        assert "version" not in ipc and ipc["interface"] == 0
        assert nt.addresses(ns.name, "net1") == [ipc["address"]]
    exec_ok(cni, "CHECK", {**stdin, "prevResult": result}, ns=ns, container_id=cid)
    exec_ok(cni, "DEL", {**stdin, "prevResult": result}, ns=ns, container_id=cid)
    assert_restored(m.name, before)
    assert nt.owners(cni.data_dir) == {}
    nothing_recorded(cni)


# --------------------------------------------------------------------------- Multus device IDs (fake sysfs)


@requires_lease_ipam
@pytest.mark.parametrize("how", ["top-level", "capability"])
def test_multus_device_id_through_cnitool(cni, netns, master, how):
    """What Multus hands a delegate for a NAD with a resourceName: top-level ``deviceID`` and
    ``pciBusID`` (the SR-IOV recipe in docs/host-device-rdma.md), or the ``deviceID`` capability via CAP_ARGS. The VF's
    netdev (the veth, per the fake sysfs) goes into the pod; no VF knobs (the fake PF is not real)."""
    ns = netns()
    m, before = prepared(master)
    env = fake_vf(cni, m.name)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    if how == "top-level":
        plugin, kw = hd(cni, None, ipam_block(cni, "lease-ipam", prefix), deviceID=VF_PCI, pciBusID=VF_PCI), {}
    else:
        plugin = hd(cni, None, ipam_block(cni, "lease-ipam", prefix), capabilities={"deviceID": True})
        kw = {"cap_args": {"deviceID": VF_PCI}}
    cni.write(nt.conflist(net, "1.0.0", plugin))
    cid = cc.container_id(ns.path)

    result = add_ok(cni, net, ns, extra_env=env, **kw)
    assert result["interfaces"] == [{"name": "net1", "mac": ORIGINAL_MAC, "sandbox": ns.path}]
    assert_in_pod(ns, "net1", m.name, ORIGINAL_MAC)
    [ipc] = result["ips"]
    assert nt.addresses(ns.name, "net1") == [ipc["address"]]
    assert nt.owners(cni.data_dir) == {bare_ip(ipc["address"]): cid}
    [state] = state_files(cni).values()
    assert state["device"]["device_id"] == VF_PCI and state["device"]["vf_index"] == 0
    assert state["device"]["pf_pci"] == PF_PCI
    nt.ok(cni.tool("check", net, ns, extra_env=env, **kw))

    nt.ok(cni.tool("del", net, ns, extra_env=env, **kw))
    assert_restored(m.name, before)
    assert nt.owners(cni.data_dir) == {}
    nothing_recorded(cni)
    nt.ok(cni.tool("del", net, ns, extra_env=env, **kw))


def test_device_info_file_for_a_vf(cni, netns, master):
    """With runtimeConfig.CNIDeviceInfoFile (the capability Multus passes), the device-info-spec
    1.1.0 "pci" file names the VF and its PF; a file Multus already copied keeps its fields."""
    ns = netns()
    m, before = prepared(master)
    env = fake_vf(cni, m.name)
    devinfo = cni.root / "devinfo" / "cni" / "sriov-net-c1_net1"
    conf = hd(cni, None, deviceID=VF_PCI, pciBusID=VF_PCI, capabilities={"CNIDeviceInfoFile": True})
    stdin = nt.single(f"{ns.name}-net", "1.0.0", {**conf, "runtimeConfig": {"CNIDeviceInfoFile": str(devinfo)}})
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1", extra_env=env)
    assert json.loads(devinfo.read_text()) == {
        "type": "pci", "version": "1.1.0", "pci": {"pci-address": VF_PCI, "pf-pci-address": PF_PCI}}
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1", extra_env=env)
    devinfo.write_text(json.dumps({"type": "pci", "version": "1.1.0", "pci": {"pci-address": VF_PCI}, "x": 1}))
    os.chmod(devinfo, 0o444)
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1", extra_env=env)
    data = json.loads(devinfo.read_text())
    assert data["x"] == 1 and data["pci"] == {"pci-address": VF_PCI, "pf-pci-address": PF_PCI}
    assert os.stat(devinfo).st_mode & 0o777 == 0o444
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1", extra_env=env)
    assert_restored(m.name, before)


def test_110_result_has_pci_id_for_a_device_id(cni, netns, master):
    ns = netns()
    m, before = prepared(master)
    env = fake_vf(cni, m.name)
    stdin = nt.single(f"{ns.name}-net", "1.1.0", hd(cni, None, deviceID=VF_PCI, pciBusID=VF_PCI))
    result = exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1", extra_env=env)
    assert result["interfaces"] == [
        {"name": "net1", "mac": ORIGINAL_MAC, "mtu": 1500, "sandbox": ns.path, "pciID": VF_PCI}
    ]
    exec_ok(cni, "CHECK", {**stdin, "prevResult": result}, ns=ns, container_id="c1", extra_env=env)
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1", extra_env=env)
    assert_restored(m.name, before)
    nothing_recorded(cni)


@pytest.mark.parametrize("key", ["deviceID", "pciBusID"])
def test_unknown_device_id_names_the_key_and_the_resource_name_fix(cni, netns, master, key):
    ns = netns()
    m, before = prepared(master)
    env = fake_vf(cni, m.name)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, None, ipam_block(cni, "host-local", prefix), **{key: "0000:3b:00.7"})))
    pod_before = nt.link_names(ns.name)
    err = tool_err(cni.tool("add", net, ns, extra_env=env))
    assert err["code"] == 7, err
    assert key in err["msg"] and "0000:3b:00.7" in err["msg"]
    assert "resourceName" in err["details"]
    assert nt.link_names(ns.name) == pod_before
    assert_restored(m.name, before)
    assert nt.owners(cni.host_local_dir) == {}
    nothing_recorded(cni)


@requires_lease_ipam
def test_dpdk_function_is_not_moved(cni, netns, master):
    """A PCI function bound to vfio-pci has no netdev (DPDK): ADD returns an interface with only
    name and sandbox (pciID at 1.1.0) and the addresses for the workload, moves nothing; DEL
    releases the addresses."""
    ns = netns()
    m = master()
    root = nt.fake_pci_function(cni.root / "sysfs", DPDK_PCI, driver="vfio-pci", pf=PF_PCI, vf_index=1)
    nt.fake_pci_function(root, VF_PCI, netdev=m.name, pf=PF_PCI, vf_index=0)
    env = {"RDMANET_SYSFS_ROOT": str(root)}
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, None, ipam_block(cni, "lease-ipam", prefix), deviceID=DPDK_PCI,
                                           pciBusID=DPDK_PCI)))
    # the host's own links only: other processes on the node add and remove theirs meanwhile
    host_before, pod_before = _own(nt.link_names(), m), nt.link_names(ns.name)
    cid = cc.container_id(ns.path)

    result = add_ok(cni, net, ns, extra_env=env)
    assert result["interfaces"] == [{"name": "net1", "sandbox": ns.path}]
    [ipc] = result["ips"]
    assert ipc["address"].startswith(prefix + ".") and ipc["interface"] == 0
    assert nt.owners(cni.data_dir) == {bare_ip(ipc["address"]): cid}
    assert _own(nt.link_names(), m) == host_before and nt.link_names(ns.name) == pod_before
    nt.ok(cni.tool("check", net, ns, extra_env=env))
    nt.ok(cni.tool("del", net, ns, extra_env=env))
    assert nt.owners(cni.data_dir) == {}
    assert _own(nt.link_names(), m) == host_before and nt.link_names(ns.name) == pod_before
    nothing_recorded(cni)

    stdin = nt.single(net, "1.1.0", hd(cni, None, deviceID=DPDK_PCI))
    res110 = exec_ok(cni, "ADD", stdin, ns=ns, container_id="c110", extra_env=env)
    assert res110["interfaces"] == [{"name": "net1", "sandbox": ns.path, "pciID": DPDK_PCI}]
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c110", extra_env=env)
    nothing_recorded(cni)


def _own(names: set, m) -> set:
    """(index, name) of the test's veth pair among ``names`` (``nt.link_names``)."""
    return {(index, name) for index, name in names if name in (m.name, m.peer)}


# --------------------------------------------------------------------------- RDMA (no RDMA core on this kernel)


@pytest.mark.parametrize("rdma_dir", [False, True], ids=["no-rdma-device", "rdma-device-mode-unknown"])
def test_rdma_required_fails_cleanly(cni, netns, master, rdma_dir):
    """``"rdma": "required"`` gives 101 and changes nothing: without an RDMA device the fix
    names the RDMA driver; with one (fake ``infiniband/mlx5_3``) the netns mode cannot be read
    as exclusive here, and the fix names ``rdma system set netns exclusive``."""
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    ipam = ipam_block(cni, "host-local", prefix)
    if rdma_dir:
        env = fake_vf(cni, m.name, ibdev="mlx5_3")
        plugin = hd(cni, None, ipam, deviceID=VF_PCI, pciBusID=VF_PCI, rdma="required")
    else:
        env = {}
        plugin = hd(cni, m.name, ipam, rdma="required")
    cni.write(nt.conflist(net, "1.0.0", plugin))
    pod_before = nt.link_names(ns.name)
    err = tool_err(cni.tool("add", net, ns, extra_env=env))
    assert err["code"] == 101, err
    if rdma_dir:
        assert "mlx5_3" in err["msg"] and "rdma system set netns exclusive" in err["details"], err
    else:
        assert m.name in err["msg"] and '"auto"' in err["details"], err
    assert nt.link_names(ns.name) == pod_before
    assert_restored(m.name, before)
    assert nt.owners(cni.host_local_dir) == {}
    nothing_recorded(cni)


def test_rdma_auto_with_rdma_device_moves_only_the_netdev(cni, netns, master):
    """The VF has RDMA device mlx5_3 but the netns mode is unknown (no RDMA netlink): ``auto``
    moves the netdev only and records no RDMA move; DEL restores the netdev."""
    ns = netns()
    m, before = prepared(master)
    env = fake_vf(cni, m.name, ibdev="mlx5_3")
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, None, deviceID=VF_PCI, pciBusID=VF_PCI, rdma="auto")))
    add_ok(cni, net, ns, extra_env=env)
    assert_in_pod(ns, "net1", m.name, ORIGINAL_MAC)
    [state] = state_files(cni).values()
    assert "rdma" not in state
    nt.ok(cni.tool("check", net, ns, extra_env=env))
    nt.ok(cni.tool("del", net, ns, extra_env=env))
    assert_restored(m.name, before)
    nothing_recorded(cni)


# --------------------------------------------------------------------------- GC and STATUS (1.1.0, raw exec)


@requires_lease_ipam
def test_110_gc_returns_devices_of_stale_attachments(cni, netns, master):
    ns_stale, ns_valid = netns(), netns()
    (m_stale, before_stale), (m_valid, _) = prepared(master), prepared(master)
    prefix, _ = nt.random_subnet()
    ipam = ipam_block(cni, "lease-ipam", prefix, routes=False)
    net = f"{ns_stale.name}-net"
    stale = nt.single(net, "1.1.0", hd(cni, m_stale.name, ipam))
    valid = nt.single(net, "1.1.0", hd(cni, m_valid.name, ipam))
    stale_ip = bare_ip(exec_ok(cni, "ADD", stale, ns=ns_stale, container_id="c-stale")["ips"][0]["address"])
    valid_res = exec_ok(cni, "ADD", valid, ns=ns_valid, container_id="c-valid")
    valid_ip = bare_ip(valid_res["ips"][0]["address"])
    assert nt.owners(cni.data_dir) == {stale_ip: "c-stale", valid_ip: "c-valid"}
    assert len(state_files(cni)) == 2

    gc = {**valid, "cni.dev/valid-attachments": [{"containerID": "c-valid", "ifname": "net1"}]}
    assert exec_ok(cni, "GC", gc, ns=None, ifname=None, container_id=None) is None

    assert nt.link(ns_stale.name, "net1") is None
    assert_restored(m_stale.name, before_stale)
    assert list(state_files(cni)) == [f"{net}-c-valid-net1.json"]
    assert len(allocations(cni)) == 1
    assert nt.owners(cni.data_dir) == {valid_ip: "c-valid"}
    assert_in_pod(ns_valid, "net1", m_valid.name, ORIGINAL_MAC)
    exec_ok(cni, "CHECK", {**valid, "prevResult": valid_res}, ns=ns_valid, container_id="c-valid")

    exec_ok(cni, "DEL", valid, ns=ns_valid, container_id="c-valid")
    exec_ok(cni, "DEL", stale, ns=ns_stale, container_id="c-stale")  # after GC: nothing left to do
    assert nt.owners(cni.data_dir) == {}
    nothing_recorded(cni)


@requires_lease_ipam
def test_110_status_forwards_to_ipam(cni, netns, master):
    """STATUS is 0 while the lease-ipam range has room, 50 once its one address is taken."""
    m, _ = prepared(master)
    prefix, _ = nt.random_subnet()
    ipam = nt.lease_ipam(cni.data_dir, f"{prefix}.0/24", range_start=f"{prefix}.10", range_end=f"{prefix}.10")
    stdin = nt.single("stnet", "1.1.0", hd(cni, m.name, ipam))
    exec_ok(cni, "STATUS", stdin, ns=None, ifname=None, container_id=None)
    ns = netns()
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1")
    err = exec_err(cni, "STATUS", stdin, ns=None, ifname=None, container_id=None)
    assert err["code"] == 50 and f"{prefix}." in err["msg"], err
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1")
    exec_ok(cni, "STATUS", stdin, ns=None, ifname=None, container_id=None)
    stdin_no_ipam = nt.single("stnet", "1.1.0", hd(cni, m.name))
    exec_ok(cni, "STATUS", stdin_no_ipam, ns=None, ifname=None, container_id=None)


# --------------------------------------------------------------------------- Go host-device reference


def test_same_result_as_go_host_device(cni, netns, master):
    """The same conflist with ``type`` swapped to the Go ``host-device`` (containernetworking-
    plugins 1.1.1; host-local in both, separate dataDirs, alike veths) gives the same interface
    name in the pod, the same result shape ({name, mac, sandbox}), the same addresses and routes,
    and both keep the original name as IFLA_IFALIAS. After DEL both devices are back in the host
    under their original names.

    Differences where host-device-rdma deliberately does better, hence not compared:
    - Go leaves the device down after DEL (and does not restore a MAC/MTU it never changes);
      host-device-rdma restores name, MAC, MTU, up/down state and alias exactly.
    - Go returns early on DEL with an empty CNI_NETNS (no IPAM DEL, the device stays in the pod
      until the netns dies) and fails DEL when the netns or link is gone; host-device-rdma takes
      the netns from its state file, always releases IPAM, and is idempotent
      (test_del_with_empty_netns, test_del_after_netns_is_deleted).
    """
    ns_py, ns_go = netns(), netns()
    (m_py, before_py), (m_go, _) = prepared(master), prepared(master)
    prefix, _ = nt.random_subnet()
    go = cni.fork("go")
    cni.write(nt.conflist("cmpnet", "1.0.0", hd(cni, m_py.name, ipam_block(cni, "host-local", prefix))))
    go.write(nt.conflist("cmpnet", "1.0.0", {"type": "host-device", "device": m_go.name,
                                             "ipam": ipam_block(go, "host-local", prefix)}))
    py_res = add_ok(cni, "cmpnet", ns_py)
    go_res = add_ok(go, "cmpnet", ns_go)

    assert py_res["cniVersion"] == go_res["cniVersion"] == "1.0.0"
    assert [sorted(i) for i in py_res["interfaces"]] == [sorted(i) for i in go_res["interfaces"]] == [["mac", "name", "sandbox"]]
    assert [i["name"] for i in py_res["interfaces"]] == [i["name"] for i in go_res["interfaces"]] == ["net1"]
    assert py_res["interfaces"][0]["sandbox"] == ns_py.path and go_res["interfaces"][0]["sandbox"] == ns_go.path
    assert py_res["interfaces"][0]["mac"] == go_res["interfaces"][0]["mac"] == ORIGINAL_MAC
    assert py_res["ips"] == go_res["ips"]
    assert py_res.get("routes") == go_res.get("routes")
    assert nt.addresses(ns_py.name, "net1") == nt.addresses(ns_go.name, "net1") == [py_res["ips"][0]["address"]]
    assert nt.routes(ns_py.name) == nt.routes(ns_go.name)
    py_link, go_link = nt.link(ns_py.name, "net1"), nt.link(ns_go.name, "net1")
    assert (py_link["ifalias"], go_link["ifalias"]) == (m_py.name, m_go.name)
    assert ("UP" in py_link["flags"]) and ("UP" in go_link["flags"])
    assert nt.link(None, m_py.name) is None and nt.link(None, m_go.name) is None

    nt.ok(cni.tool("del", "cmpnet", ns_py))
    nt.ok(go.tool("del", "cmpnet", ns_go))
    assert nt.link(ns_py.name, "net1") is None and nt.link(ns_go.name, "net1") is None
    assert_restored(m_py.name, before_py)
    go_back = nt.link(None, m_go.name)
    assert go_back is not None and go_back["address"] == ORIGINAL_MAC
    assert "UP" not in go_back["flags"]  # Go leaves it down (a difference, see above)
    assert nt.owners(cni.host_local_dir) == {} and nt.owners(go.host_local_dir) == {}
