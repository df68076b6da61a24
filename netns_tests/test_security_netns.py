"""A NAD is tenant input and the plugins run as root: attacks against real files and a real daemon.

Every test runs the installed plugins (shims; a session daemon with RDMANET_TEST_PLUGINS=daemon)
as a runtime would, under the node policy of conftest.CniEnv (every root is the test's directory,
host-device-rdma's state in ``hd-state`` there), and tries what a tenant can put in a NAD: a log
file, store, device-info file or state directory reached through a symlink planted in advance, or
outside the roots. A victim file outside the roots must keep its content and mode; a failed ADD
leaves nothing behind. The daemon's socket must serve root only: a shim run as uid 65534 is
refused.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import stat
import subprocess
import tempfile

import pytest

try:
    from netns_tests import cnitool_client as cc
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import cnitool_client as cc  # type: ignore[no-redef]
    import nstools as nt  # type: ignore[no-redef]

requires_lease_ipam = pytest.mark.skipif(nt.lease_ipam_missing() is not None, reason=str(nt.lease_ipam_missing()))


@pytest.fixture
def outside():
    """A directory outside every root, with a 0600 victim file."""
    d = pathlib.Path(tempfile.mkdtemp(prefix=f"{nt.PREFIX}-outside-"))
    (d / "victim").write_text("precious\n")
    (d / "victim").chmod(0o600)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def intact(outside: pathlib.Path) -> None:
    assert (outside / "victim").read_text() == "precious\n"
    assert stat.S_IMODE((outside / "victim").stat().st_mode) == 0o600
    assert sorted(p.name for p in outside.iterdir()) == ["victim"], "a file appeared outside the roots"


def mode_of(path: pathlib.Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@requires_lease_ipam
def test_log_file_symlink_planted_under_the_root_is_not_followed(cni, netns, master, outside):
    ns, m = netns(), master()
    prefix, subnet = nt.random_subnet()
    (cni.root / "log").mkdir(mode=0o700)
    (cni.root / "log" / "ipam.log").symlink_to(outside / "victim")
    net = f"{ns.name}-net"
    ipam = nt.lease_ipam(cni.data_dir, subnet, log_file=str(cni.root / "log" / "ipam.log"), log_level="debug")
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam)))
    nt.add_ok(cni, net, ns)  # the log file is refused, not the call
    intact(outside)
    assert os.path.islink(cni.root / "log" / "ipam.log")
    nt.ok(cni.tool("del", net, ns))
    intact(outside)


@requires_lease_ipam
def test_whereabouts_tmp_log_file_is_ignored_and_the_nad_works(cni, netns, master):
    ns, m = netns(), master()
    prefix, subnet = nt.random_subnet()
    log = pathlib.Path(f"/tmp/{nt.PREFIX}-whereabouts-{ns.name}.log")
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, nt.lease_ipam(cni.data_dir, subnet, log_file=str(log),
                                                                          log_level="debug"))))
    try:
        result = nt.add_ok(cni, net, ns)
        assert result["ips"][0]["address"].startswith(prefix)
        assert not log.exists()
        nt.ok(cni.tool("del", net, ns))
    finally:
        log.unlink(missing_ok=True)


@requires_lease_ipam
def test_data_dir_through_a_planted_symlink_fails_cleanly(cni, netns, master, outside):
    ns, m = netns(), master()
    prefix, subnet = nt.random_subnet()
    (cni.root / "tenant-store").symlink_to(outside)
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", nt.macvlan(m.name, nt.lease_ipam(cni.root / "tenant-store", subnet))))
    host_before, pod_before = nt.link_names(), nt.link_names(ns.name)
    proc = cni.tool("add", net, ns)
    err = cc.error_of(proc)
    assert err is not None and err["code"] == 7, proc.stdout + proc.stderr
    assert "ipam.dataDir" in err["msg"] and "symlink" in err["msg"]
    assert nt.link_names() == host_before and nt.link_names(ns.name) == pod_before
    intact(outside)


@requires_lease_ipam
def test_data_dir_outside_the_roots_names_the_key_and_the_root(cni, netns, master, outside):
    ns, m = netns(), master()
    _, subnet = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(m.name, nt.lease_ipam(outside / "store", subnet)))
    proc = cni.exec("ADD", stdin, ns=ns)
    nt.no_traceback(proc)
    err = nt.cni_error(proc)
    assert err["code"] == 7 and "ipam.dataDir" in err["msg"] and str(outside / "store") in err["msg"]
    assert str(cni.root) in err["msg"]
    assert nt.link(ns.name, "net1") is None
    intact(outside)


def test_device_info_symlink_is_refused_and_an_existing_files_mode_kept(cni, netns, master, outside):
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    net = f"{ns.name}-net"
    plugin = nt.macvlan(m.name, nt.host_local(cni.host_local_dir, f"{prefix}.0/24"), rdma="auto",
                        capabilities={"CNIDeviceInfoFile": True})
    cni.write(nt.conflist(net, "1.0.0", plugin))
    env = {"RDMANET_SYSFS_ROOT": str(nt.fake_sysfs(cni.root / "sysfs", m.name))}
    devinfo = cni.root / "devinfo" / f"{net}-{cc.container_id(ns.path)}_net1"
    devinfo.parent.mkdir()
    devinfo.symlink_to(outside / "victim")
    proc = cni.tool("add", net, ns, cap_args={"CNIDeviceInfoFile": str(devinfo)}, extra_env=env)
    err = cc.error_of(proc)
    assert err is not None and err["code"] == 7 and "CNIDeviceInfoFile" in err["msg"] and "symlink" in err["msg"], proc.stdout
    assert nt.link(ns.name, "net1") is None, "the failed ADD left net1 behind"
    assert nt.owners(cni.host_local_dir) == {}
    intact(outside)
    # a file already there (0600: not Multus' 0444) is updated, its mode untouched
    devinfo.unlink()
    devinfo.write_text(json.dumps({"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:3b:00.0"}}))
    devinfo.chmod(0o600)
    nt.add_ok(cni, net, ns, cap_args={"CNIDeviceInfoFile": str(devinfo)}, extra_env=env)
    assert json.loads(devinfo.read_text())["pci"]["rdma-device"] == "mlx5_0" and mode_of(devinfo) == 0o600
    nt.ok(cni.tool("del", net, ns, cap_args={"CNIDeviceInfoFile": str(devinfo)}, extra_env=env))
    # outside the device-info directory: refused before anything is created
    proc = cni.tool("add", net, ns, cap_args={"CNIDeviceInfoFile": str(outside / "devinfo")}, extra_env=env)
    assert cc.error_of(proc)["code"] == 7 and nt.link(ns.name, "net1") is None
    intact(outside)


def test_host_device_state_planted_by_a_tenant_is_never_read(cni, netns, master, outside):
    """The reproduction of the issue: a tenant's stateDir with a state file naming a host link;
    DEL must not rename it, set it down or change its MAC and MTU. ADD with that stateDir is
    refused before the device is touched."""
    ns, m = netns(), master()
    nt.ip("link", "set", m.name, "address", "0a:58:c6:12:7f:01")
    before = nt.settled_link(None, m.name)
    net = f"{ns.name}-net"
    planted = {"version": 1, "network": net, "containerID": "rdt-container-1", "ifname": "net1", "netns": ns.path,
               "device": {"selector": "device", "netdev": "net1", "kind": "netdev"}, "done": True,
               "original": {"name": "pwned0", "mac": "02:00:00:00:00:66", "mtu": 1280, "up": False, "alias": None}}
    nt.ip("link", "set", m.name, "netns", ns.name)
    nt.ip("-n", ns.name, "link", "set", m.name, "name", "net1")
    (outside / f"{net}-rdt-container-1-net1.json").write_text(json.dumps(planted))
    conf = nt.single(net, "1.0.0", {"type": "host-device-rdma", "device": m.name, "stateDir": str(outside)})
    proc = cni.exec("DEL", conf, ns=ns, plugin="host-device-rdma")
    nt.no_traceback(proc)
    assert proc.returncode == 0, proc.stdout  # nothing of ours: DEL succeeds, and ignored the tenant's stateDir
    assert nt.link(ns.name, "net1") is not None, "DEL acted on the planted state"
    assert nt.link(None, "pwned0") is None
    nt.ip("-n", ns.name, "link", "set", "net1", "name", m.name)
    nt.ip("-n", ns.name, "link", "set", m.name, "netns", "1")
    nt.ip("link", "set", m.name, "up")
    assert nt.wait_link_equal(None, m.name, before) == before
    proc = cni.exec("ADD", conf, ns=ns, plugin="host-device-rdma")
    err = nt.cni_error(proc)
    assert err["code"] == 7 and "stateDir" in err["msg"] and str(cni.root / "hd-state") in err["msg"]
    assert nt.wait_link_equal(None, m.name, before) == before
    (outside / f"{net}-rdt-container-1-net1.json").unlink()
    intact(outside)


@requires_lease_ipam
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a peer as another user")
def test_daemon_refuses_a_non_root_peer(cni, netns, master, tmp_path_factory):
    """A shim run by uid 65534, with the socket made reachable (0666, dirs 0711): the daemon
    closes the connection unanswered (SO_PEERCRED), serves nothing, and says so in its log; the
    shim's in-process fallback, as nobody, cannot touch root's store either."""
    from rdmanet.node.testing import Daemon, health, write_shims

    base = pathlib.Path(tempfile.mkdtemp(prefix=f"{nt.PREFIX}-peer-"))
    try:
        os.chmod(base, 0o711)
        write_shims(base / "bin", str(base / "run" / "daemon.sock"))
        d = Daemon(str(base / "run" / "daemon.sock"))
        try:
            assert stat.S_IMODE(os.stat(d.socket).st_mode) == 0o600
            os.chmod(base / "run", 0o711)
            os.chmod(d.socket, 0o666)
            ns, m = netns(), master()
            _, subnet = nt.random_subnet()
            stdin = json.dumps(nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(m.name, nt.lease_ipam(cni.data_dir, subnet))))
            env = {**nt.bare_env(CNI_COMMAND="ADD", CNI_CONTAINERID="peer-1", CNI_NETNS=ns.path, CNI_IFNAME="net1",
                                 CNI_PATH=str(base / "bin")), **cni.policy_env}
            proc = subprocess.run([str(base / "bin" / nt.PLUGIN)], input=stdin, env=env, capture_output=True, text=True,
                                  timeout=60, user=65534, group=65534)
            assert proc.returncode != 0 and "Traceback" not in proc.stdout
            assert health(d.socket)["requests"] == 0
            assert '"peer_refused"' in d.log() and '"uid": 65534' in d.log()
            assert nt.link(ns.name, "net1") is None
            assert nt.address_files(cni.data_dir) == {}
        finally:
            d.cleanup()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@requires_lease_ipam
def test_embedded_defaults_work_without_any_policy(cni, netns, master):
    """No node policy anywhere (the single-node setup, ``rdmanet demo``): lease-ipam's default
    dataDir /var/lib/cni/lease-ipam and host-device-rdma's /var/lib/cni/host-device-rdma work,
    with what the defaults allow: a master with an RDMA device, the device a deviceID names (both
    given their PCI and RDMA identity by a fake sysfs tree: this machine has no RDMA NIC)."""
    ns, m, dev = netns(), master(), master()
    _, subnet = nt.random_subnet()
    net = f"{ns.name}-net"
    store = pathlib.Path("/var/lib/cni/lease-ipam") / net
    sysroot = nt.fake_pci_function(nt.fake_sysfs(cni.root / "sysfs", m.name), "0000:3b:00.4", netdev=dev.name)
    env = {"RDMANET_SYSFS_ROOT": str(sysroot)}
    try:
        if os.path.exists("/etc/rdmanet/node-policy.json"):
            pytest.skip("this machine has a node policy file")
        stdin = nt.single(net, "1.0.0", {**nt.macvlan(m.name, {"type": "lease-ipam", "range": subnet}), "rdma": "off"})
        add = nt.ok(nt.raw_exec(cni.plugin(nt.PLUGIN), "ADD", stdin, netns=ns.path, cni_path=[cni.cni_bin], extra_env=env))
        address = json.loads(add.stdout)["ips"][0]["address"]
        assert address.split("/")[0] in nt.address_files(store.parent)
        assert mode_of(store) == 0o700
        nt.ok(nt.raw_exec(cni.plugin(nt.PLUGIN), "DEL", stdin, netns=ns.path, cni_path=[cni.cni_bin], extra_env=env))
        assert nt.owners(store.parent).get(address.split("/")[0]) is None
        hd_net = f"{ns.name}-hd"
        hd_stdin = nt.single(hd_net, "1.0.0", {"type": "host-device-rdma", "deviceID": "0000:3b:00.4", "rdma": "off"})
        nt.ok(nt.raw_exec(cni.plugin("host-device-rdma"), "ADD", hd_stdin, netns=ns.path, cni_path=[cni.cni_bin],
                          extra_env=env))
        state = pathlib.Path("/var/lib/cni/host-device-rdma") / f"{hd_net}-rdt-container-1-net1.json"
        assert state.exists() and mode_of(state) == 0o600 and mode_of(state.parent) == 0o700
        nt.ok(nt.raw_exec(cni.plugin("host-device-rdma"), "DEL", hd_stdin, netns=ns.path, cni_path=[cni.cni_bin],
                          extra_env=env))
        assert not state.exists() and nt.link(None, dev.name) is not None
    finally:
        shutil.rmtree(store, ignore_errors=True)
