"""host-device-rdma under stale calls, concurrency and pods that fight back (real kernel, root).

- An ADD whose shim the runtime killed (its deadline passed) while a slow foreign IPAM ran, then
  the runtime's DEL: through the node daemon, with a real kill. The DEL waits for that ADD
  (per-attachment lock), the ADD stops at its next step and undoes everything (device home,
  IPAM released), and nothing lands after the DEL.
- An ADD that runs out of its deadline (daemon ``--call-timeout``) answers 11, kills the IPAM
  exec and undoes everything.
- A stale DEL for a netns path that now holds another pod's netns (the reboot case: the device
  went to a new pod) leaves that pod's device alone; a stale allocation record (its netns gone, a
  plain file left at its path, or a newer netns at the same path) does not block a new ADD.
- A pod that renames the device and puts another link under CNI_IFNAME (or at the device's
  ifindex): DEL moves the real device home, never the impostor.
- ``%`` in CNI_IFNAME: 4, nothing changed.
- A rollback that cannot finish keeps the state file (marked ``repair``); DEL finishes it later.
- A netns path that is a plain file left behind: DEL treats the netns as gone.
- A call killed with the device in the pod between its move and the rest of the verb (an
  ``os._exit()`` at that step: tests/crash_steps.py): the device is alive under CNI_IFNAME, and
  DEL or a repeat ADD brings it home (and, for the ADD, into the pod) as it was.

The device is a veth end (the ``master`` fixture), as in test_host_device_rdma.py. The VF case
(a stale DEL must not restore an old VF snapshot) is in the VM stage: test_vm_host_device.py.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

try:
    from netns_tests import nstools as nt
    from netns_tests.test_host_device_rdma import (ORIGINAL_MAC, VF_PCI, allocations, assert_restored, exec_err,
                                                   exec_ok, fake_vf, hd, nothing_recorded, prepared, state_dir,
                                                   state_files)
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]
    from test_host_device_rdma import (ORIGINAL_MAC, VF_PCI, allocations, assert_restored,  # type: ignore[no-redef]
                                       exec_err, exec_ok, fake_vf, hd, nothing_recorded, prepared, state_dir,
                                       state_files)

from rdmanet.node.testing import Daemon, write_shims

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
import crash_steps  # noqa: E402

PLUGIN = "host-device-rdma"
SLOW_IPAM = """#!/bin/sh
# a foreign IPAM: host-local behind a delay on ADD; logs each call's start and end
echo "$CNI_COMMAND start" >> "$SLOW_IPAM_DIR/log"
if [ "$CNI_COMMAND" = ADD ]; then
    echo $$ > "$SLOW_IPAM_DIR/pid"
    sleep "$SLOW_IPAM_SECONDS"
fi
/usr/lib/cni/host-local
rc=$?
echo "$CNI_COMMAND end $rc" >> "$SLOW_IPAM_DIR/log"
exit $rc
"""
CLASH_IPAM = """#!/bin/sh
# a foreign IPAM whose ADD fails after a host link took the name of the device in the pod
if [ "$CNI_COMMAND" = ADD ]; then
    ip link add "$CLASH_NAME" type veth peer name "$CLASH_PEER"
    echo '{"cniVersion": "1.0.0", "code": 11, "msg": "no address now"}'
    exit 1
fi
exec /usr/lib/cni/host-local
"""


# --------------------------------------------------------------------------- a private daemon


class Node:
    """Shims for this test in a bin dir of their own (with the Go plugins and the test IPAMs),
    answered by a daemon of their own."""

    def __init__(self, root: pathlib.Path, venv_python: str, policy_env: dict) -> None:
        self.root = root
        self.policy_env = policy_env  # the runtime's node policy: the test's (conftest.CniEnv)
        self.bin = root / "bin"
        self.socket = str(root / "run" / "daemon.sock")
        write_shims(self.bin, self.socket, python=venv_python)
        for entry in sorted(nt.GO_PLUGIN_DIR.iterdir()):
            if entry.is_file() and not (self.bin / entry.name).exists():
                (self.bin / entry.name).symlink_to(entry)
        for name, text in (("slow-ipam", SLOW_IPAM), ("clash-ipam", CLASH_IPAM)):
            (self.bin / name).write_text(text)
            (self.bin / name).chmod(0o755)
        self.ipam_dir = root / "ipam"
        self.ipam_dir.mkdir()
        self.daemon: Daemon | None = None

    def start(self, *args: str) -> Daemon:
        self.daemon = Daemon(self.socket, args=args)
        return self.daemon

    def env(self, command: str, ns: str, cid: str, **extra: str) -> dict:
        return nt.bare_env(CNI_COMMAND=command, CNI_CONTAINERID=cid, CNI_NETNS=ns, CNI_IFNAME="net1",
                           CNI_PATH=str(self.bin), SLOW_IPAM_DIR=str(self.ipam_dir), **{**self.policy_env, **extra})

    def spawn(self, command: str, stdin: dict, ns: str, cid: str, **extra: str) -> subprocess.Popen:
        proc = subprocess.Popen([str(self.bin / PLUGIN)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self.env(command, ns, cid, **extra))
        proc.stdin.write(json.dumps(stdin).encode())
        proc.stdin.close()
        proc.stdin = None
        return proc

    def run(self, command: str, stdin: dict, ns: str, cid: str, timeout: float = 60, **extra: str):
        return subprocess.run([str(self.bin / PLUGIN)], input=json.dumps(stdin).encode(), capture_output=True,
                              env=self.env(command, ns, cid, **extra), timeout=timeout, check=False)

    def ipam_log(self) -> list[str]:
        path = self.ipam_dir / "log"
        return path.read_text().splitlines() if path.exists() else []

    def cleanup(self) -> None:
        if self.daemon is not None:
            self.daemon.cleanup()


@pytest.fixture
def node(cni_bin, cni):
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"{nt.PREFIX}-node-"))
    n = Node(root, sys.executable, cni.policy_env)
    try:
        yield n
    finally:
        n.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def wait_for(path: pathlib.Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def slow_conf(cni, node: Node, device: str, prefix: str, ipam_type: str = "slow-ipam") -> dict:
    ipam = {"type": ipam_type, "dataDir": str(node.ipam_dir / "store"), "ranges": [[{"subnet": f"{prefix}.0/24"}]]}
    return nt.single(f"{nt.PREFIX}-slow", "1.0.0", hd(cni, device, ipam))


def store_owners(node: Node) -> dict:
    return nt.owners(node.ipam_dir / "store")


# --------------------------------------------------------------------------- 1: stale ADD vs DEL, deadlines


def test_del_after_a_killed_add_waits_for_it_and_nothing_lands_after_the_del(cni, node, netns, master):
    """The runtime's deadline expires during a slow foreign IPAM ADD: it kills the shim and sends
    DEL. That DEL waits for the ADD, which stops (the IPAM exec is killed) and undoes what it did;
    once DEL has answered, the device is home and the address free, and it stays so."""
    node.start()
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = slow_conf(cni, node, m.name, prefix)
    add = node.spawn("ADD", stdin, ns.path, "c1", SLOW_IPAM_SECONDS="4")
    wait_for(node.ipam_dir / "pid")  # the ADD is in its IPAM step: the device is in the pod
    assert nt.link(ns.name, "net1") is not None
    add.kill()
    add.communicate()

    delete = node.run("DEL", stdin, ns.path, "c1")
    assert delete.returncode == 0, delete.stdout + delete.stderr
    assert_restored(m.name, before)
    assert nt.link(ns.name, "net1") is None
    assert store_owners(node) == {}
    nothing_recorded(cni)
    assert not alive(int((node.ipam_dir / "pid").read_text())), "the abandoned IPAM ADD is still running"

    time.sleep(5)  # past the IPAM's delay: an ADD that went on would land now
    assert_restored(m.name, before)
    assert nt.link(ns.name, "net1") is None
    assert store_owners(node) == {}
    nothing_recorded(cni)
    log = node.ipam_log()
    assert "ADD end 0" not in log, log
    assert log[-1] == "DEL end 0", log


def test_add_past_its_deadline_answers_11_and_is_undone(cni, node, netns, master):
    """A foreign IPAM that never answers: at the daemon's --call-timeout the exec is killed, the
    ADD undone and answered 11 (try again later), long before a runtime would give up."""
    node.start("--call-timeout", "3")
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = slow_conf(cni, node, m.name, prefix)
    proc = node.run("ADD", stdin, ns.path, "c1", timeout=60, SLOW_IPAM_SECONDS="600")
    err = json.loads(proc.stdout)
    assert proc.returncode != 0 and err["code"] == 11, err
    assert "slow-ipam" in err["msg"] and "in time" in err["msg"], err
    assert_restored(m.name, before)
    assert nt.link_names(ns.name) == {(1, "lo")}
    assert store_owners(node) == {}
    nothing_recorded(cni)
    assert not alive(int((node.ipam_dir / "pid").read_text()))
    assert node.run("DEL", stdin, ns.path, "c1").returncode == 0


def test_parallel_adds_and_dels_of_one_device_through_the_daemon(cni, node, netns, master):
    """Two pods ADD the same device at once and each pod's DEL follows at once, with a slow IPAM
    in between: one pod gets it (the other 106), and in the end the device is home, no address,
    no state, whatever the interleaving."""
    node.start()
    pods = [netns(), netns()]
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = slow_conf(cni, node, m.name, prefix)
    adds = [node.spawn("ADD", stdin, p.path, f"c{i}", SLOW_IPAM_SECONDS="1") for i, p in enumerate(pods)]
    dels = [node.spawn("DEL", stdin, p.path, f"c{i}", SLOW_IPAM_SECONDS="1") for i, p in enumerate(pods)]
    outcomes = [p.communicate(timeout=60) + (p.returncode,) for p in adds + dels]
    codes = sorted(json.loads(o[0])["code"] for o in outcomes[:2] if o[2] != 0)
    assert codes in ([], [106]), outcomes
    assert all(o[2] == 0 for o in outcomes[2:]), outcomes
    for i, p in enumerate(pods):  # the DELs may have overtaken their ADDs: DEL again
        assert node.run("DEL", stdin, p.path, f"c{i}").returncode == 0
    assert_restored(m.name, before)
    assert store_owners(node) == {}
    nothing_recorded(cni)


# --------------------------------------------------------------------------- 2 and 6: stale records and DELs


def _as_after_a_reboot(ns, name: str) -> None:
    """The pod's netns went away and the physical device came back as it was before ADD (a
    reboot): move it home by hand under its original name, drop the alias, delete the netns."""
    ns.ip("link", "set", "net1", "netns", "1")
    nt.ip("link", "set", "net1", "down")
    nt.ip("link", "set", "net1", "name", name)
    nt.ip("link", "set", name, "alias", "")
    nt.ip("link", "set", name, "address", ORIGINAL_MAC)
    nt.ip("link", "set", name, "up")
    nt.ip("netns", "del", ns.name)


@pytest.mark.parametrize("leftover", ["gone", "plain-file", "new-netns"])
def test_a_stale_allocation_record_does_not_block_a_new_add(cni, netns, master, leftover):
    """Pod A held the device; its netns is gone (nothing at the path, a plain file left behind,
    or a newer netns mounted at the same path). Pod B's ADD of the device succeeds (not 106)."""
    ns_a, ns_b = netns(), netns()
    m, before = prepared(master)
    stdin = nt.single(f"{ns_a.name}-net", "1.0.0", hd(cni, m.name))
    exec_ok(cni, "ADD", stdin, ns=ns_a, container_id="ca")
    _as_after_a_reboot(ns_a, m.name)
    if leftover == "plain-file":
        pathlib.Path(ns_a.path).touch()
    elif leftover == "new-netns":
        nt.ip("netns", "add", ns_a.name)
    try:
        exec_ok(cni, "ADD", stdin, ns=ns_b, container_id="cb")
        assert nt.link(ns_b.name, "net1")["ifalias"] == m.name
        exec_ok(cni, "DEL", stdin, ns=ns_b, container_id="cb")
        exec_ok(cni, "DEL", stdin, ns=ns_a, container_id="ca")
        assert_restored(m.name, before)
        nothing_recorded(cni)
    finally:
        if leftover == "plain-file":
            pathlib.Path(ns_a.path).unlink()


@pytest.mark.skipif(nt.lease_ipam_missing() is not None, reason=str(nt.lease_ipam_missing()))
@pytest.mark.parametrize("torn", ["empty", "cut", "another-version"])
def test_a_state_file_torn_by_a_power_loss_blocks_nothing(cni, netns, master, torn):
    """State files are written without fsync (plugin.py says why): a power loss may leave one
    empty or cut short, and the reboot undid the attachment. The old sandbox's DEL answers 0,
    releases the address and removes the file; a new pod's ADD takes the device over (its record
    is stale) and its DEL leaves the device as it was. A file of another state version is read
    the same way: as no state."""
    ns_a, ns_b = netns(), netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns_a.name}-net", "1.0.0", hd(cni, m.name, nt.lease_ipam(cni.data_dir, f"{prefix}.0/24")))
    exec_ok(cni, "ADD", stdin, ns=ns_a, container_id="ca")
    [(name, state)] = state_files(cni).items()
    path = state_dir(cni) / name
    if torn == "another-version":
        path.write_text(json.dumps({**state, "version": state["version"] + 1}))
    else:
        path.write_bytes(b"" if torn == "empty" else path.read_bytes()[:40])
    _as_after_a_reboot(ns_a, m.name)
    exec_ok(cni, "ADD", stdin, ns=ns_b, container_id="cb")  # the stale record names the torn state's attachment
    assert nt.link(ns_b.name, "net1")["ifalias"] == m.name
    exec_ok(cni, "DEL", stdin, ns=ns_a, container_id="ca")
    assert not path.exists()
    assert list(nt.owners(cni.data_dir).values()) == ["cb"]
    exec_ok(cni, "DEL", stdin, ns=ns_b, container_id="cb")
    assert_restored(m.name, before)
    assert nt.owners(cni.data_dir) == {}
    nothing_recorded(cni)


def test_a_stale_del_leaves_the_device_of_the_pod_that_holds_it_now_alone(cni, netns, master):
    """After a reboot the same netns path (here: the same name) is a new pod's, and that pod got
    the device. The old attachment's DEL, late, must not take the device out of the new pod: it
    cleans up only its own state and address."""
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", hd(cni, m.name, nt.host_local(cni.host_local_dir, f"{prefix}.0/24")))
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="old")
    _as_after_a_reboot(ns, m.name)
    nt.ip("netns", "add", ns.name)  # the new pod's netns, at the same path
    result = exec_ok(cni, "ADD", stdin, ns=ns, container_id="new")
    held = nt.link(ns.name, "net1")
    assert held["ifalias"] == m.name

    exec_ok(cni, "DEL", stdin, ns=ns, container_id="old")
    assert nt.link(ns.name, "net1") == held, "the stale DEL touched the device the new pod holds"
    assert nt.link(None, m.name) is None
    assert list(nt.owners(cni.host_local_dir).values()) == ["new"]
    assert [s["containerID"] for s in state_files(cni).values()] == ["new"]
    assert len(allocations(cni)) == 1
    exec_ok(cni, "CHECK", {**stdin, "prevResult": result}, ns=ns, container_id="new")

    exec_ok(cni, "DEL", stdin, ns=ns, container_id="new")
    assert_restored(m.name, before)
    assert nt.owners(cni.host_local_dir) == {}
    nothing_recorded(cni)


def test_a_stale_gc_leaves_the_device_of_the_pod_that_holds_it_now_alone(cni, netns, master):
    """The same for GC (1.1.0) listing only the new attachment: the old one's state goes, the
    device stays in the new pod."""
    ns = netns()
    m, before = prepared(master)
    stdin = nt.single(f"{ns.name}-net", "1.1.0", hd(cni, m.name))
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="old")
    _as_after_a_reboot(ns, m.name)
    nt.ip("netns", "add", ns.name)
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="new")
    held = nt.link(ns.name, "net1")

    gc = {**stdin, "cni.dev/valid-attachments": [{"containerID": "new", "ifname": "net1"}]}
    exec_ok(cni, "GC", gc, ns=None, ifname=None, container_id=None)
    assert nt.link(ns.name, "net1") == held, "the stale GC touched the device the new pod holds"
    assert [s["containerID"] for s in state_files(cni).values()] == ["new"]
    assert len(allocations(cni)) == 1
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="new")
    assert_restored(m.name, before)
    nothing_recorded(cni)


def test_a_takeover_gives_a_device_that_came_home_under_its_pod_name_its_own_name_back(cni, netns, master):
    """Pod A's netns died before its DEL came: the physical device is back in the host under A's
    CNI_IFNAME (with its name in the alias, and sysfs lists it under that name). Pod B gets the
    same VF: its ADD first gives the device its own name back, so B records the real original
    name, and B's DEL returns the device exactly as it was before A. A's late DEL changes nothing."""
    ns_a, ns_b = netns(), netns()
    m, before = prepared(master)
    env = fake_vf(cni, m.name)
    stdin = nt.single(f"{ns_a.name}-net", "1.0.0", hd(cni, None, deviceID=VF_PCI, pciBusID=VF_PCI))
    pod_name = f"{nt.PREFIX}p"  # a host-side name of this session: the leak guard removes a leftover
    exec_ok(cni, "ADD", stdin, ns=ns_a, container_id="ca", ifname=pod_name, extra_env=env)
    ns_a.ip("link", "set", pod_name, "netns", "1")  # what the kernel does for a physical device
    nt.ip("netns", "del", ns_a.name)
    vf_net = pathlib.Path(env["RDMANET_SYSFS_ROOT"]) / "sys" / "bus" / "pci" / "devices" / VF_PCI / "net"
    (vf_net / m.name).rename(vf_net / pod_name)  # sysfs names the netdev by its current name

    exec_ok(cni, "ADD", stdin, ns=ns_b, container_id="cb", extra_env=env)
    assert nt.link(ns_b.name, "net1")["ifalias"] == m.name
    assert nt.link(None, pod_name) is None
    exec_ok(cni, "DEL", stdin, ns=ns_b, container_id="cb", extra_env=env)
    assert_restored(m.name, before)
    exec_ok(cni, "DEL", stdin, ns=ns_a, container_id="ca", ifname=pod_name, extra_env=env)
    assert_restored(m.name, before)
    nothing_recorded(cni)


@pytest.mark.parametrize("device", ["dies", "came-home"])
def test_del_when_the_netns_path_is_a_leftover_plain_file(cni, netns, master, device):
    """The pod netns is gone and a plain file is left at its path (setns would say EINVAL): DEL
    treats the netns as gone, restores the device if it came home, releases the address."""
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", hd(cni, m.name, nt.host_local(cni.host_local_dir, f"{prefix}.0/24")))
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1")
    if device == "came-home":  # a physical device returns to the host under its pod name
        ns.ip("link", "set", "net1", "netns", "1")
    nt.ip("netns", "del", ns.name)
    pathlib.Path(ns.path).touch()
    try:
        exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1")
        if device == "came-home":
            assert_restored(m.name, before)
        else:
            assert nt.wait_link_gone(None, m.peer)
        assert nt.owners(cni.host_local_dir) == {}
        nothing_recorded(cni)
        exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1")
    finally:
        pathlib.Path(ns.path).unlink()


# --------------------------------------------------------------------------- 3: identity before any move


def test_del_moves_the_device_not_the_link_the_pod_named_like_it(cni, netns, master):
    """A pod with CAP_NET_ADMIN renames the device and creates a veth called net1. DEL brings the
    real device home (found by its ifindex) and leaves the pod's veth in the pod."""
    ns = netns()
    m, before = prepared(master)
    net = f"{ns.name}-net"
    stdin = nt.single(net, "1.0.0", hd(cni, m.name, mtu=1400))
    added = exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1")
    ns.ip("link", "set", "net1", "name", "evil0")
    ns.ip("link", "add", "net1", "type", "veth", "peer", "name", "net1p")
    impostor = nt.link(ns.name, "net1")

    err = exec_err(cni, "CHECK", {**stdin, "prevResult": added}, ns=ns, container_id="c1")
    assert err["code"] == 105 and "is not the device ADD moved there" in err["msg"], err
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1")
    assert_restored(m.name, before)
    assert nt.link(ns.name, "net1") == impostor
    assert nt.link(ns.name, "evil0") is None
    nothing_recorded(cni)


def test_del_moves_nothing_when_another_link_sits_at_the_device_s_ifindex(cni, netns, master):
    """The pod moves the device away (to a netns of its own) and puts a link of another kind at
    its ifindex, named net1. Nothing at that index is the device: DEL moves nothing, says so in
    its log, and still releases the attachment."""
    ns, hideout = netns(), netns()
    m, _ = prepared(master)
    stdin = nt.single(f"{ns.name}-net", "1.0.0", hd(cni, m.name))
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1", extra_env={"RDMANET_LOG_LEVEL": "INFO"})
    index = nt.link(ns.name, "net1")["ifindex"]
    ns.ip("link", "set", "net1", "netns", hideout.name)
    ns.ip("link", "add", "x1", "type", "veth", "peer", "name", "x2")
    ns.ip("link", "add", "net1", "index", str(index), "link", "x1", "type", "macvlan")
    impostor = nt.link(ns.name, "net1")
    host_before = nt.link_names()

    proc = cni.exec("DEL", stdin, plugin=PLUGIN, ns=ns, container_id="c1", extra_env={"RDMANET_LOG_LEVEL": "INFO"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is not the device ADD moved there" in proc.stderr, proc.stderr
    assert nt.link(ns.name, "net1") == impostor
    assert nt.link_names() == host_before
    nothing_recorded(cni)


# --------------------------------------------------------------------------- 4 and 5


def test_percent_in_ifname_is_refused_and_nothing_moves(cni, netns, master):
    ns = netns()
    m, before = prepared(master)
    stdin = nt.single(f"{ns.name}-net", "1.0.0", hd(cni, m.name))
    pod_before = nt.link_names(ns.name)
    err = exec_err(cni, "ADD", stdin, ns=ns, container_id="c1", ifname="net%d")
    assert err["code"] == 4 and "'%'" in err["msg"], err
    assert nt.link_names(ns.name) == pod_before
    assert_restored(m.name, before)
    nothing_recorded(cni)
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1", ifname="net%d")


def test_an_incomplete_rollback_keeps_the_state_for_del(cni, node, netns, master):
    """IPAM fails after a host link took the device's original name: the rollback cannot bring
    the device home. The ADD's error says so, the state file stays (marked repair) with the claim
    on the device, and once the name is free a DEL brings the device home."""
    ns = netns()
    m, before = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = slow_conf(cni, node, m.name, prefix, ipam_type="clash-ipam")
    clash = {"CLASH_NAME": m.name, "CLASH_PEER": f"{m.name[:-1]}c"}
    proc = nt.raw_exec(cni.plugin(PLUGIN), "ADD", stdin, netns=ns.path, container_id="c1",
                       cni_path=[cni.cni_bin, node.bin], extra_env={**cni.policy_env, **clash})
    err = nt.cni_error(proc)
    assert err["code"] == 11 and "rollback could not undo everything" in err["details"], err
    [state] = state_files(cni).values()
    assert state["repair"] and not state.get("done"), state
    assert len(allocations(cni)) == 1
    assert nt.link(ns.name, "net1")["ifalias"] == m.name  # still in the pod, and known

    nt.ip("link", "del", m.name)  # the stranger goes (with its peer)
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1", cni_path=[cni.cni_bin, node.bin])
    assert_restored(m.name, before)
    nothing_recorded(cni)


@pytest.mark.skipif(nt.lease_ipam_missing() is not None, reason=str(nt.lease_ipam_missing()))
@pytest.mark.parametrize("step,then", [("add:moved", "DEL"), ("add:moved", "ADD"), ("del:restored", "DEL"),
                                       ("del:restored", "ADD"), ("del:renamed", "DEL"), ("del:renamed", "ADD")])
def test_a_call_killed_between_the_move_and_the_rest(cni, netns, master, tmp_path, step, then):
    """Killed with the device in the pod: after the ADD's move (named net1, alias its own name,
    not configured yet), or in the DEL after it went down and got its MAC and MTU back, and then
    its own name, before it went home. The device (a veth whose peer is in a netns of the test's,
    so a lost one shows) is in the pod, never in the host under the pod's name; DEL, or a repeat
    ADD then DEL, brings it home as it was."""
    ns, fixture = netns(), netns()
    m = master(peer_ns=fixture)
    nt.ip("link", "set", m.name, "address", ORIGINAL_MAC)
    nt.ip("link", "set", m.name, "mtu", "1400")
    before = nt.settled_link(None, m.name)
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", hd(cni, m.name, nt.lease_ipam(cni.data_dir, f"{prefix}.0/24"),
                                                   mtu=1300, mac="0a:58:c6:12:7f:99"))
    verb = "ADD" if step.startswith("add") else "DEL"
    if verb == "DEL":
        exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1")
    dies = crash_steps.runner(str(tmp_path), PLUGIN, step)  # the plugin, in one process, dying at the step
    proc = nt.raw_exec(dies, verb, stdin, netns=ns.path, container_id="c1", cni_path=[cni.cni_bin],
                       extra_env=cni.policy_env)
    assert proc.returncode == crash_steps.DEVICE_EXIT, f"the {verb} was to die at {step}: {proc.returncode} {proc.stdout} {proc.stderr}"
    assert nt.link(None, m.name) is None and nt.link(None, "net1") is None, "the device is in the host"
    named, other = (m.name, "net1") if step == "del:renamed" else ("net1", m.name)
    left = nt.link(ns.name, named)
    assert left is not None and left["ifalias"] == m.name, nt.links(ns.name)
    assert nt.link(ns.name, other) is None
    if step.startswith("del:"):  # down, with its own MAC and MTU again
        assert "UP" not in left["flags"] and left["address"] == ORIGINAL_MAC and left["mtu"] == 1400, left
    if then == "ADD":
        result = exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1")
        link = nt.link(ns.name, "net1")
        assert link["ifalias"] == m.name and link["address"] == "0a:58:c6:12:7f:99" and link["mtu"] == 1300, link
        assert nt.addresses(ns.name, "net1") == [result["ips"][0]["address"]]
        assert list(nt.owners(cni.data_dir).values()) == ["c1"]
    for _ in (1, 2):
        exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1")
    assert [name for _, name in nt.link_names(ns.name)] == ["lo"]
    assert_restored(m.name, before)
    assert nt.owners(cni.data_dir) == {}
    nothing_recorded(cni)


@pytest.mark.skipif(nt.lease_ipam_missing() is not None, reason=str(nt.lease_ipam_missing()))
def test_an_add_whose_caller_went_away_leaves_the_finished_attachment_alone(cni, netns, master):
    """Through the daemon, an ADD whose shim the runtime killed may get the attachment's lock only
    after the runtime's retried ADD finished: it must stop (11) and undo nothing, not treat the
    retry's attachment as an earlier ADD to replace (found by the kill-at-random soak through the
    daemon: the pod was left without its device after a successful repeat ADD). Served here in
    this process with a caller that is gone, as the daemon serves it."""
    from rdmanet.cni.core import deadline as call_deadline
    from rdmanet.cni.core import skel
    from rdmanet.plugins.host_device_rdma.plugin import HostDeviceRdma

    ns = netns()
    m, _ = prepared(master)
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", hd(cni, m.name, nt.lease_ipam(cni.data_dir, f"{prefix}.0/24")))
    exec_ok(cni, "ADD", stdin, ns=ns, container_id="c1")
    link, owners, states = nt.link(ns.name, "net1"), nt.owners(cni.data_dir), state_files(cni)
    env = nt.bare_env(CNI_COMMAND="ADD", CNI_CONTAINERID="c1", CNI_NETNS=ns.path, CNI_IFNAME="net1",
                      CNI_PATH=str(cni.cni_bin), **cni.policy_env)
    gone = call_deadline.Deadline.after(30, caller_gone=lambda: True)
    code, doc = skel.handle(HostDeviceRdma(), env, json.dumps(stdin).encode(), deadline=gone)
    assert code != 0 and doc["code"] == 11, doc
    assert nt.link(ns.name, "net1") == link
    assert nt.owners(cni.data_dir) == owners and state_files(cni) == states
    exec_ok(cni, "DEL", stdin, ns=ns, container_id="c1")
    nothing_recorded(cni)
