"""A NAD cannot take what belongs to the host or to another pod: the node policy's device
allow-lists, the host's own use of a link, our plugins as IPAM, forged links on DEL, and who
serves the daemon's socket. On the real kernel, through the installed shims (in-process, and
through the session daemon with RDMANET_TEST_PLUGINS=daemon), as a runtime calls them.

The harness's node policy (nstools.node_policy_env) allows this session's links (``rdt-<pid>*``)
by name as masters and host devices, as a node owner would list theirs; the tests that need the
built-in defaults (nothing listed) or more write their own policy over it.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

try:
    from netns_tests import ib_trees
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import ib_trees  # type: ignore[no-redef]
    import nstools as nt  # type: ignore[no-redef]

HD = "host-device-rdma"
requires_lease_ipam = pytest.mark.skipif(nt.lease_ipam_missing() is not None, reason=str(nt.lease_ipam_missing()))


def policy(cni, **keys) -> None:
    """Rewrite the test's node policy (the file the runtime's environment names) with ``keys``."""
    cni.policy_env = nt.node_policy_env(cni.root, **keys)


def hd_stdin(ns, device: str, **extra) -> dict:
    return nt.single(f"{ns.name}-hd", "1.0.0", {"type": HD, "device": device, "rdma": "off", **extra})


def state_files(cni) -> list[str]:
    root = cni.root / "hd-state"
    return sorted(p.name for p in root.glob("*.json")) if root.exists() else []


def pod_links(ns) -> list[str]:
    return [e["ifname"] for e in nt.links(ns.name)]


# --------------------------------------------------------------------------- 1: the host's links


def test_host_device_never_takes_a_link_with_a_host_address_and_route(cni, netns, master):
    """The policy allows the link by name, but the host uses it: CNI error 7 names the key, the
    link, why, and the setting that would allow it; the host keeps link, address and route."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    target = f"198.19.{prefix.rsplit('.', 1)[1]}.0/24"
    nt.ip("addr", "add", f"{prefix}.2/24", "dev", m.name)
    nt.ip("route", "add", target, "via", f"{prefix}.1", "dev", m.name)
    before = nt.link(None, m.name)

    err = nt.cni_error(cni.exec("ADD", hd_stdin(ns, m.name), plugin=HD, ns=ns))
    assert err["code"] == 7, err
    assert err["msg"].startswith(f"invalid network config: device: host-device-rdma does not move {m.name}, the host "
                                 f"uses it: it carries the host address {prefix}.2/24"), err
    assert "2 host routes go through it" in err["msg"], err  # the subnet's and the one added
    assert f'"hostDevices": [{{"name": "{m.name}", "hostInUse": true}}]' in err["details"], err
    assert nt.link(None, m.name)["ifindex"] == before["ifindex"]
    assert nt.addresses(None, m.name) == [f"{prefix}.2/24"]
    assert nt.has_route(None, target, f"{prefix}.1", m.name)
    assert pod_links(ns) == ["lo"] and state_files(cni) == []

    # the node owner says so explicitly: then it moves (and comes back on DEL)
    policy(cni, hostDevices=[{"name": m.name, "hostInUse": True}])
    nt.ok(cni.exec("ADD", hd_stdin(ns, m.name), plugin=HD, ns=ns))
    assert nt.link(ns.name, "net1") is not None and nt.link(None, m.name) is None
    nt.ok(cni.exec("DEL", hd_stdin(ns, m.name), plugin=HD, ns=ns))
    assert nt.link(None, m.name)["ifindex"] == before["ifindex"]


def test_default_policy_moves_only_the_device_plugins_device(cni, netns, master):
    """Nothing listed (the built-in defaults): a link a NAD names is refused, naming hostDevices;
    the device a deviceID names (Multus, from the device plugin) moves."""
    ns, m, vf = netns(), master(), master()
    policy(cni, hostDevices=[], masters=[])
    err = nt.cni_error(cni.exec("ADD", hd_stdin(ns, m.name), plugin=HD, ns=ns))
    assert err["code"] == 7, err
    assert err["msg"] == (f"invalid network config: device: host-device-rdma may not move {m.name}: it is not the device "
                          "the device plugin allocated (deviceID) and no hostDevices rule of the node policy "
                          f"({cni.policy_env['RDMANET_NODE_POLICY']}) matches it"), err
    assert f'"hostDevices": [{{"name": "{m.name}"}}]' in err["details"] and "resourceName" in err["details"], err
    assert nt.link(None, m.name) is not None and pod_links(ns) == ["lo"] and state_files(cni) == []

    env = {"RDMANET_SYSFS_ROOT": str(nt.fake_pci_function(cni.root / "sysfs", "0000:3b:00.6", netdev=vf.name))}
    stdin = nt.single(f"{ns.name}-hd", "1.0.0", {"type": HD, "deviceID": "0000:3b:00.6", "rdma": "off"})
    nt.ok(cni.exec("ADD", stdin, plugin=HD, ns=ns, extra_env=env))
    assert nt.link(ns.name, "net1") is not None
    nt.ok(cni.exec("DEL", stdin, plugin=HD, ns=ns, extra_env=env))
    assert nt.link(None, vf.name) is not None


def test_default_policy_masters_are_links_with_an_rdma_device(cni, netns, master):
    """macvlan-rdma: a master without an RDMA device is refused unless listed, naming masters;
    one with an RDMA device (a fake sysfs tree gives the veth one) needs no listing."""
    ns, plain, port = netns(), master(), master()
    policy(cni, hostDevices=[], masters=[])
    _, subnet = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(plain.name, nt.host_local(cni.host_local_dir, subnet),
                                                            rdma="off"))
    err = nt.cni_error(cni.exec("ADD", stdin, ns=ns))
    assert err["code"] == 7, err
    assert err["msg"].startswith(f"invalid network config: master: {plain.name} is not a master this node allows: it has "
                                 "no RDMA device, and no masters rule of the node policy"), err
    assert f'"masters": [{{"name": "{plain.name}"}}]' in err["details"], err
    assert pod_links(ns) == ["lo"] and nt.owners(cni.host_local_dir) == {}

    env = {"RDMANET_SYSFS_ROOT": str(nt.fake_sysfs(cni.root / "sysfs", port.name))}
    ok = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(port.name, nt.host_local(cni.host_local_dir, subnet), rdma="off"))
    nt.ok(cni.exec("ADD", ok, ns=ns, extra_env=env))
    assert nt.link(ns.name, "net1")["linkinfo"]["info_kind"] == "macvlan"
    nt.ok(cni.exec("DEL", ok, ns=ns, extra_env=env))


def test_ipoib_master_must_be_allowed(cni, netns, master):
    """ipoib-rdma likewise: an IPoIB netdev whose RDMA device the tree leaves out is refused
    unless listed."""
    ns, m = netns(), master()
    root = ib_trees.ipoib_port(cni.root / "sysfs", m.name)
    for ibdir in [root / "sys" / "class" / "infiniband", *root.glob("sys/devices/*/*/infiniband")]:
        shutil.rmtree(ibdir)  # the netdev without its RDMA device
    policy(cni, hostDevices=[], masters=[])
    stdin = nt.single(f"{ns.name}-ib", "1.0.0", {"type": "ipoib-rdma", "master": m.name, "rdma": "off"})
    err = nt.cni_error(cni.exec("ADD", stdin, plugin="ipoib-rdma", ns=ns, extra_env={"RDMANET_SYSFS_ROOT": str(root)}))
    assert err["code"] == 7 and f"master: {m.name} is not a master this node allows" in err["msg"], err
    assert f'"masters": [{{"name": "{m.name}"}}]' in err["details"], err
    assert pod_links(ns) == ["lo"]


def default_route_link() -> str | None:
    routes = nt.ip_json("route", "show", "default")
    return routes[0].get("dev") if routes else None


def test_a_mistyped_master_never_lands_on_the_default_route_link(cni, netns, master):
    """``"mastr"``: no master, so Go macvlan takes the default-route link. Here that needs the
    node policy to list that link; the warning names the key meant. Nothing is created."""
    ns, m = netns(), master()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", {"type": nt.PLUGIN, "mastr": m.name, "rdma": "off"})
    proc = cni.exec("ADD", stdin, ns=ns)
    err = nt.cni_error(proc)
    assert err["code"] == 7, err
    default = default_route_link()
    if default is None:
        assert "no default route" in err["msg"], err
    else:
        assert err["msg"].startswith(f"invalid network config: master is not set, and the default-route link {default} "
                                     "is taken as master only when the node policy"), err
        assert f'"masters": [{{"name": "{default}"}}]' in err["details"], err
    assert "unknown key 'mastr' is ignored; did you mean 'master'?" in proc.stderr, proc.stderr
    assert pod_links(ns) == ["lo"]


def test_host_uses_seen_on_the_real_kernel(netns):
    """What device_policy.host_uses reads, in a netns standing in for the host: the default-route
    link, a bridge port, the lower link of a macvlan, and a free link."""
    from rdmanet.cni.linux import device_policy, links

    h = netns()
    for name in ("up0", "port0", "low0", "free0"):
        h.ip("link", "add", name, "type", "veth", "peer", "name", f"{name}p")
        h.ip("link", "set", name, "up")
    h.ip("addr", "add", "198.18.250.2/24", "dev", "up0")
    h.ip("route", "add", "default", "via", "198.18.250.1")
    h.ip("link", "add", "br0", "type", "bridge")
    h.ip("link", "set", "port0", "master", "br0")
    h.ip("link", "add", "link", "low0", "name", "low0m", "type", "macvlan")
    with links.rtnl_in(h.path) as ipr:
        def uses(name):
            link = links.find_link(ipr, name)
            return device_policy.host_uses(ipr, link.index, name, "/nonexistent")

        assert uses("up0")[:2] == ["it carries the host address 198.18.250.2/24", "it is the link of the host's default route"]
        assert uses("port0") == ["it is a port of br0"]
        assert uses("low0") == ["the host's macvlan low0m is stacked on it"]
        assert uses("free0") == []


# --------------------------------------------------------------------------- 2: our plugins as IPAM


@pytest.fixture
def wrapper_ipam(cni):
    """A CNI bin dir holding ``wrap-ipam``: an IPAM that execs macvlan-rdma (a nested call)."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix=f"{nt.PREFIX}-wrap-"))
    script = directory / "wrap-ipam"
    script.write_text(f"#!/bin/sh\nexec {cni.plugin(nt.PLUGIN)}\n")
    script.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_an_interface_plugin_as_ipam_type_is_refused_at_once(cni, netns, master):
    """``"ipam": {"type": "macvlan-rdma"}``: CNI error 7 (not 11 after the call's deadline, with the
    nested call waiting on the lock its caller holds); nothing created; DEL succeeds."""
    ns, m = netns(), master()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(m.name, {"type": nt.PLUGIN}, rdma="off"))
    env = {"RDMANET_CALL_TIMEOUT": "10"}
    err = nt.cni_error(cni.exec("ADD", stdin, ns=ns, extra_env=env))
    assert err["code"] == 7, err
    assert err["msg"] == "invalid network config: ipam.type: macvlan-rdma is an interface plugin, not an IPAM plugin", err
    assert pod_links(ns) == ["lo"]
    nt.ok(cni.exec("DEL", stdin, ns=ns, extra_env=env))


def test_a_nested_exec_of_an_interface_plugin_fails_fast(cni, netns, master, wrapper_ipam):
    ns, m = netns(), master()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(m.name, {"type": "wrap-ipam"}, rdma="off"))
    proc = cni.exec("ADD", stdin, ns=ns, cni_path=[cni.cni_bin, wrapper_ipam], extra_env={"RDMANET_CALL_TIMEOUT": "10"})
    err = nt.cni_error(proc)
    assert err["code"] == 7, err
    assert err["msg"] == (f"macvlan-rdma was run as the IPAM plugin of macvlan-rdma {ns.name}-net/rdt-container-1/net1: "
                          "an interface plugin is never an IPAM"), err
    assert pod_links(ns) == ["lo"]


# --------------------------------------------------------------------------- 3: links a pod forged


def hd_added(cni, ns, m) -> dict:
    nt.ok(cni.exec("ADD", hd_stdin(ns, m.name), plugin=HD, ns=ns))
    return nt.link(ns.name, "net1")


def test_del_leaves_a_veth_the_pod_made_at_the_devices_index(cni, netns, master):
    """The pod deletes the moved veth (its peer in the host goes with it) and makes a veth net1
    at the same ifindex, with the device's MAC: DEL (success) moves nothing to the host, says so."""
    ns, m = netns(), master()
    moved = hd_added(cni, ns, m)
    ns.ip("link", "del", "net1")
    ns.ip("link", "add", "net1", "index", str(moved["ifindex"]), "address", moved["address"], "type", "veth",
          "peer", "name", "x1")
    ns.ip("link", "set", "net1", "up")
    forged = nt.link(ns.name, "net1")
    host_before = nt.link_names()

    proc = cni.exec("DEL", hd_stdin(ns, m.name), plugin=HD, ns=ns)
    nt.ok(proc)
    assert "is not the device ADD moved there" in proc.stderr and "it is left in the pod" in proc.stderr, proc.stderr
    assert nt.link_names() == host_before and nt.link(None, m.name) is None
    assert nt.link(ns.name, "net1") == forged and nt.link(ns.name, "x1") is not None
    assert state_files(cni) == []


def test_del_leaves_a_veth_whose_peer_index_the_pod_copied(cni, netns, master):
    """Subtler: the pod moves the device into a netns of its own, and makes a veth pair at the
    device's ifindex whose peer has the ifindex of the device's peer in the host. Only the peer's
    netns tells them apart: DEL moves nothing, and the hidden device stays hidden."""
    ns, hideout, m = netns(), netns(), master()
    moved = hd_added(cni, ns, m)
    peer_index = nt.link(None, m.peer)["ifindex"]
    ns.ip("link", "set", "net1", "netns", hideout.name)
    ns.ip("link", "add", "net1", "index", str(moved["ifindex"]), "type", "veth", "peer", "name", "x1",
          "index", str(peer_index))
    forged = nt.link(ns.name, "net1")
    host_before = nt.link_names()

    proc = cni.exec("DEL", hd_stdin(ns, m.name), plugin=HD, ns=ns)
    nt.ok(proc)
    assert "is not the device ADD moved there" in proc.stderr, proc.stderr
    assert nt.link_names() == host_before and nt.link(None, m.name) is None
    assert nt.link(ns.name, "net1") == forged and nt.link(hideout.name, "net1") is not None


def test_del_brings_the_real_veth_home(cni, netns, master):
    """The same checks pass for the device itself: DEL returns it, its peer in the host."""
    ns, m = netns(), master()
    before = nt.link(None, m.name)
    hd_added(cni, ns, m)
    nt.ok(cni.exec("DEL", hd_stdin(ns, m.name), plugin=HD, ns=ns))
    after = nt.link(None, m.name)
    assert after is not None and after["ifindex"] == before["ifindex"] and after["address"] == before["address"]
    assert pod_links(ns) == ["lo"]


# --------------------------------------------------------------------------- 4: who serves the socket

IMPOSTOR = textwrap.dedent("""
    import socket, sys
    path, record = sys.argv[1], sys.argv[2]
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)
    print("ready", flush=True)
    got = b""
    srv.settimeout(20)
    try:
        while True:
            conn, _ = srv.accept()
            conn.settimeout(2)
            try:
                while True:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    got += chunk
                    conn.sendall(b"0 24 0\\n" + b'{"forged": "result"}\\n   ')
            except OSError:
                pass
            conn.close()
            open(record, "wb").write(got)
    except OSError:
        pass
""")


@pytest.fixture
def impostor():
    """A socket directory everyone may write (as /tmp) where uid 65534 binds the daemon's path
    first and answers whatever it is sent with a forged result: (socket path, bytes it got)."""
    base = pathlib.Path(tempfile.mkdtemp(prefix=f"{nt.PREFIX}-imp-"))
    os.chmod(base, 0o1777)
    sock, record = base / "daemon.sock", base / "received"
    record.write_bytes(b"")
    os.chmod(record, 0o666)
    proc = subprocess.Popen(["/usr/bin/python3", "-I", "-c", IMPOSTOR, str(sock), str(record)], user=65534, group=65534,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert os.stat(sock).st_uid == 65534
        yield sock, record
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the impostor as another user")
@pytest.mark.parametrize("kind", ["fallback", "daemon-only"])
def test_shims_send_nothing_to_a_socket_someone_else_serves(impostor, tmp_path, kind):
    """A root shim whose socket uid 65534 serves: nothing is sent to it (neither environment nor
    config), its forged answer is never printed. With a fallback the call runs in-process; a
    daemon-only shim answers 11 naming the uid."""
    from rdmanet.node.launcher import write_shim

    sock, record = impostor
    shim = tmp_path / "bin" / nt.PLUGIN
    shim.parent.mkdir()
    site = None if kind == "daemon-only" else __import__("sysconfig").get_path("purelib")
    write_shim(str(shim), nt.PLUGIN, sys.executable, site, str(sock))
    env = {"PATH": nt.BARE_PATH, "CNI_COMMAND": "STATUS", "SECRET_OF_THE_RUNTIME": "s3cr3t"}
    proc = subprocess.run([str(shim)], input='{"cniVersion": "1.1.0", "name": "n", "type": "macvlan-rdma"}', env=env,
                          capture_output=True, text=True, timeout=60)
    assert "forged" not in proc.stdout
    assert record.read_bytes() == b"", "the shim sent the call to a server that is not root"
    if kind == "fallback":
        assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr  # STATUS, in-process
    else:
        err = json.loads(proc.stdout)
        assert proc.returncode == 1 and err["code"] == 50, err
        assert "served by uid 65534, not by root" in err["details"], err

