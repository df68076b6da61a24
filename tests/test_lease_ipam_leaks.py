"""No leaked claims under Multus: a DEL that fails is journaled by the shim
and replayed by the daemon; the daemon's node GC frees this node's claims whose pod is gone or
whose sandbox a newer one replaced.

Multus' thick plugin logs a failed delegate DEL and reports success, so the runtime never
retries it: :func:`multus_thick` plays that caller, running the real daemon-only shim (as the
DaemonSet installs it) and ignoring its exit code. Two nodes share the fake API server: node-a
runs the daemon (a real ``rdmanet daemon`` process), node-b calls in-process.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from rdmanet.cni.core import skel
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.node import del_journal
from rdmanet.node.daemon import parse_binary
from rdmanet.node.launcher import forget_del, journal_del, journal_path, write_shim
from rdmanet.node.testing import Daemon, ScriptedDaemon

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import write_kubeconfig  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

NS = "rdmanet-system"
BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture
def node(tmp_path, server):
    """node-a: a daemon-only lease-ipam shim in bin/, its socket in run/; ``node.daemon(**env)``
    starts ``rdmanet daemon`` (stopped at the end)."""
    kubeconfig = write_kubeconfig(tmp_path / "rdmanet.kubeconfig", server.url, namespace=NS)

    class Node:
        sock = str(tmp_path / "run" / "daemon.sock")
        shim = str(tmp_path / "bin" / "lease-ipam")
        conf = {"cniVersion": "1.0.0", "name": "rdma-a", "type": "lease-ipam",
                "ipam": {"type": "lease-ipam", "range": "10.40.0.0/24",
                         "kubernetes": {"kubeconfig": str(kubeconfig), "timeout_seconds": 1}}}
        running = []

        def daemon(self, **env):
            d = Daemon(self.sock, allow_uids=[os.getuid()],
                       env={"RDMANET_NODE_NAME": "node-a", "RDMANET_NODE_GC_SECONDS": "0", **env})
            self.running.append(d)
            return d

    n = Node()
    os.makedirs(os.path.dirname(n.shim))
    write_shim(n.shim, "lease-ipam", sys.executable, None, n.sock)  # daemon only, as in a DaemonSet
    yield n
    for d in n.running:
        d.cleanup()


def pod_args(cid, uid=None, pod=None):
    return f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod or 'pod-' + cid};K8S_POD_UID={uid or 'uid-' + cid}"


def multus_thick(node, command, cid, uid=None, pod=None):
    """The runtime's call through Multus' thick plugin: the shim's exit code is logged, not acted on."""
    env = {"PATH": BARE_PATH, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": "net1", "CNI_PATH": os.path.dirname(node.shim), "CNI_ARGS": pod_args(cid, uid, pod)}
    proc = subprocess.run([node.shim], input=json.dumps(node.conf).encode(), env=env, capture_output=True, timeout=60)
    return proc.returncode, proc.stdout


def on_node_b(node, command, cid):
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/x", "CNI_IFNAME": "net1",
           "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": "node-b", "CNI_ARGS": pod_args(cid)}
    code, out = skel.handle(LeaseIPAM(), env, json.dumps(node.conf).encode())
    assert code == 0, out


def holders(server):
    return sorted(o["spec"]["holderIdentity"] for o in claim_leases(server, NS))


def entries(directory):
    """The journal's entries (not its lock stripes, ".lock-NN")."""
    return [n for n in os.listdir(directory) if not n.startswith(".")]


def wait_for(predicate, what, timeout=20.0):
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_del_swallowed_while_the_daemon_restarted_is_replayed_when_it_starts(server, node):
    d = node.daemon()
    assert multus_thick(node, "ADD", "c1")[0] == 0
    on_node_b(node, "ADD", "b1")
    d.stop()  # a DaemonSet rollout: the pod is deleted meanwhile
    code, out = multus_thick(node, "DEL", "c1")
    assert code == 1 and json.loads(out)["code"] == 11  # Multus logs it and reports success
    assert holders(server) == ["b1/net1", "c1/net1"]
    node.daemon()
    wait_for(lambda: holders(server) == ["b1/net1"], "the journaled DEL to free c1's address")
    wait_for(lambda: not entries(del_journal.directory_of(node.sock)), "the replayed entry to be removed")


def test_a_del_that_failed_while_the_api_server_was_out_is_retried(server, node):
    node.daemon(RDMANET_DEL_REPLAY_SECONDS="0.3")
    assert multus_thick(node, "ADD", "c1")[0] == 0
    server.fail_rate(1.0, 503)  # the API server is out
    assert multus_thick(node, "DEL", "c1")[0] == 1
    assert holders(server) == ["c1/net1"]
    server.clear_faults()
    wait_for(lambda: holders(server) == [], "the replayed DEL")


def test_node_gc_frees_this_nodes_claims_of_gone_pods_and_replaced_sandboxes(server, node):
    live = server.add_pod("default", "pod-live", uid="uid-live", node="node-a")["metadata"]["uid"]
    restarted = server.add_pod("default", "pod-old", uid="uid-restarted", node="node-a")["metadata"]["uid"]
    server.add_node("node-a")  # the daemon confirms its Node before it runs the node GC
    node.daemon(RDMANET_NODE_GC_SECONDS="0.3", RDMANET_NODE_GC_GRACE_SECONDS="0", RDMANET_NODE_GC_MISSES="2")
    assert multus_thick(node, "ADD", "live", uid=live)[0] == 0
    assert multus_thick(node, "ADD", "gone")[0] == 0  # its pod is never in the API: deleted, DEL never came
    assert multus_thick(node, "ADD", "old", uid=restarted, pod="pod-old")[0] == 0
    server.advance_clock(2)  # the server's clock orders the sandboxes' claims (creationTimestamp, in seconds)
    # a new sandbox of the same pod (the old one's DEL never came)
    assert multus_thick(node, "ADD", "new", uid=restarted, pod="pod-old")[0] == 0
    on_node_b(node, "ADD", "b-gone")  # another node's claim: not this node's GC's business
    wait_for(lambda: holders(server) == ["b-gone/net1", "live/net1", "new/net1"], "the node GC")
    time.sleep(1.0)  # several more rounds: nothing else goes
    assert holders(server) == ["b-gone/net1", "live/net1", "new/net1"]


# -- the journal's edges ------------------------------------------------------------------------------

def test_an_add_of_the_attachment_cancels_its_journaled_del(tmp_path):
    sock = str(tmp_path / "run" / "daemon.sock")
    shim = str(tmp_path / "bin" / "lease-ipam")
    os.makedirs(os.path.dirname(shim))
    os.makedirs(os.path.dirname(sock), mode=0o700)  # the daemon's socket directory
    write_shim(shim, "lease-ipam", sys.executable, None, sock)
    env = {b"CNI_COMMAND": b"DEL", b"CNI_CONTAINERID": b"ctr", b"CNI_IFNAME": b"net1"}
    journal_del(sock, "lease-ipam", env, b"{}")
    entry = journal_path(sock, "lease-ipam", env)
    assert os.path.exists(entry) and stat.S_IMODE(os.stat(os.path.dirname(entry)).st_mode) == 0o700
    daemon = ScriptedDaemon(sock, b"0 2 0\n{}")  # a daemon answering success
    try:
        proc = subprocess.run([shim], input=b"{}", capture_output=True, timeout=60,
                              env={"PATH": BARE_PATH, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "ctr", "CNI_IFNAME": "net1",
                                   "CNI_NETNS": "/x", "CNI_PATH": "/x"})
    finally:
        daemon.close()
    assert proc.returncode == 0 and not os.path.exists(entry)  # podman restart: same ID, DEL then ADD
    # without the socket's directory (no daemon ever ran here) nothing is created on the host
    nowhere = str(tmp_path / "nowhere" / "daemon.sock")
    journal_del(nowhere, "lease-ipam", env, b"{}")
    assert not os.path.exists(os.path.dirname(nowhere))


def test_an_add_of_the_same_container_id_waits_for_a_replayed_del_or_cancels_it(tmp_path):
    """podman and cnitool reuse container IDs: a DEL that failed is journaled, then the same ID is
    added again. The ADD's removal of the entry (launcher.forget_del, which the shim runs before
    the ADD) and the replay's re-check + DEL hold the entry's journal lock: an ADD that arrives
    while the replayed DEL runs goes on only after it (so the DEL cannot undo the ADD), and one
    that came first leaves nothing to replay."""
    sock = str(tmp_path / "daemon.sock")
    env = {b"CNI_COMMAND": b"DEL", b"CNI_CONTAINERID": b"ctr", b"CNI_IFNAME": b"net1"}
    directory = del_journal.directory_of(sock)
    order, started = [], threading.Event()

    def serve(plugin, env, stdin):
        started.set()
        time.sleep(0.3)  # the DEL is under way when the ADD arrives
        order.append("DEL done")
        return 0, b"", b""

    def add_again():
        started.wait(10)
        forget_del(sock, "lease-ipam", env)
        order.append("ADD starts")

    journal_del(sock, "lease-ipam", env, b"{}")
    adder = threading.Thread(target=add_again)
    adder.start()
    counts = del_journal.replay_once(directory, {"lease-ipam": object()}, serve, parse_binary, lambda *a, **k: None)
    adder.join(10)
    assert order == ["DEL done", "ADD starts"] and counts["freed"] == 1 and entries(directory) == []

    # the ADD came after the entry was read but before the replay took the lock: no DEL at all
    journal_del(sock, "lease-ipam", env, b"{}")
    served = []

    def parse_then_add(line, rest):
        parsed = parse_binary(line, rest)
        forget_del(sock, "lease-ipam", env)
        return parsed

    counts = del_journal.replay_once(directory, {"lease-ipam": object()}, lambda *a: served.append(a) or (0, b"", b""),
                                     parse_then_add, lambda *a, **k: None)
    assert served == [] and counts == {"freed": 0, "failed": 0, "dropped": 0} and entries(directory) == []


def test_replay_serves_only_dels_of_known_plugins_from_a_private_directory(tmp_path):
    sock = str(tmp_path / "daemon.sock")
    served, events = [], []

    def serve(plugin, env, stdin):
        served.append((plugin, env["CNI_COMMAND"], env["CNI_CONTAINERID"]))
        cid = env["CNI_CONTAINERID"]
        return (0, b"", b"") if cid == "ok" else (1, b'{"code": %d}' % (7 if cid == "bad-config" else 11), b"")

    def log(event, level="info", **fields):
        events.append(event)

    def entry(command, cid, plugin="lease-ipam"):
        journal_del(sock, plugin, {b"CNI_COMMAND": command.encode(), b"CNI_CONTAINERID": cid.encode(),
                                   b"CNI_IFNAME": b"net1"}, b"{}")

    entry("DEL", "ok")
    entry("DEL", "fails")  # 11: the API server is still out
    entry("DEL", "bad-config")  # 7: no retry mends it
    entry("ADD", "sneaky")  # never replayed: only DELs
    entry("DEL", "x", plugin="macvlan-rdma")  # a plugin this (test) daemon does not serve
    directory = del_journal.directory_of(sock)
    plugins = {"lease-ipam": object()}
    counts = del_journal.replay_once(directory, plugins, serve, parse_binary, log)
    assert sorted(served) == [("lease-ipam", "DEL", "bad-config"), ("lease-ipam", "DEL", "fails"), ("lease-ipam", "DEL", "ok")]
    assert counts == {"freed": 1, "failed": 1, "dropped": 1}
    assert len(entries(directory)) == 1  # the failed one stays for the next round
    # too old: dropped (the node GC and the reconciler free what is left)
    counts = del_journal.replay_once(directory, plugins, serve, parse_binary, log, now=time.time() + 2 * del_journal.MAX_AGE)
    assert counts["dropped"] == 1 and entries(directory) == []
    # a directory others may write to is not trusted
    entry("DEL", "ok")
    os.chmod(directory, 0o777)
    served.clear()
    assert del_journal.replay_once(directory, plugins, serve, parse_binary, log) == {"freed": 0, "failed": 0, "dropped": 0}
    assert served == [] and "del_journal_refused" in events
