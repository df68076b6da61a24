"""Events on pods (rdmanet.node.pod_events) against the fake API server, which takes core/v1
events as the apiserver does (in the pod's namespace, ``involvedObject`` the pod): a Warning for
a failed ADD and a Normal for an address a cleaner freed, written with the daemon's credentials,
rate-limited, and never in a CNI call's way."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from rdmanet.cli import main as cli
from rdmanet.cni.core import skel
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.node import pod_events
from rdmanet.node.testing import Daemon, shim_env
from kube_api_server import KubeAPIServer, write_kubeconfig
from test_daemon_metrics import eventually

BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
NAMESPACE = "rdmanet-system"
NODE = "gpu-node-1"


def events_of(server, namespace: str, reason: str | None = None) -> list[dict]:
    return [e for e in server.objects("events", namespace) if reason is None or e["reason"] == reason]


@pytest.fixture
def node(tmp_path):
    with KubeAPIServer() as server, shim_env() as root:
        for ns in ("team-a", "team-b", "team-c", "team-d"):  # the pods' namespaces exist (events go into them)
            server.add_namespace(ns)
        server.add_node(NODE)  # the daemon's node GC runs for a Node the API confirms
        daemon_kc = write_kubeconfig(tmp_path / "daemon.kubeconfig", server.url, namespace=NAMESPACE, token="daemon")
        lease_kc = write_kubeconfig(tmp_path / "lease.kubeconfig", server.url, namespace=NAMESPACE, token="nad")
        daemon = Daemon(str(root / "run" / "daemon.sock"), allow_uids=[os.getuid()],
                        env={"RDMANET_KUBECONFIG": str(daemon_kc), "RDMANET_NODE_NAME": NODE,
                             "RDMANET_NODE_GC_SECONDS": "1", "RDMANET_NODE_GC_GRACE_SECONDS": "0",
                             "RDMANET_NODE_GC_MISSES": "1"})
        try:
            yield server, root, daemon, str(lease_kc)
        finally:
            daemon.cleanup()


def conf(kubeconfig: str | None = None, **ipam) -> bytes:
    ipam = {"type": "lease-ipam", "range": "10.55.0.0/24", **ipam}
    if kubeconfig:
        ipam["kubernetes"] = {"kubeconfig": kubeconfig}
    return json.dumps({"cniVersion": "1.0.0", "name": "rdma-a", "type": "macvlan-rdma", "ipam": ipam}).encode()


def call(root, stdin: bytes, cid: str, pod: str, namespace: str = "team-a", command: str = "ADD"):
    env = {"PATH": BARE_PATH, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": "net1", "CNI_PATH": str(root / "bin"), "RDMANET_NODE_POLICY": os.environ["RDMANET_NODE_POLICY"],
           "CNI_ARGS": f"IgnoreUnknown=true;K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"}
    start = time.monotonic()
    proc = subprocess.run([str(root / "bin" / "lease-ipam")], input=stdin, env=env, capture_output=True, timeout=60)
    proc.seconds = time.monotonic() - start  # type: ignore[attr-defined]
    return proc


def test_a_failed_add_is_a_warning_on_the_pod_written_with_the_daemons_credentials(node):
    server, root, daemon, _ = node
    proc = call(root, conf(), "c1", "trainer-0")  # a Kubernetes pod, no cluster store: CNI error 7
    answer = json.loads(proc.stdout)
    assert answer["code"] == 7
    [event] = eventually(lambda: events_of(server, "team-a"), "the event")
    assert event["type"] == "Warning" and event["reason"] == "AddFailed"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a", "name": "trainer-0",
                                       "uid": "uid-trainer-0"}
    assert "lease-ipam ADD of network rdma-a (net1" in event["message"] and "CNI error 7" in event["message"]
    assert answer["msg"] in event["message"] and answer["details"] in event["message"]
    assert event["source"] == {"component": "rdmanet", "host": NODE}
    [write] = [r for r in server.request_log() if r["resource"] == "events"]
    assert write["verb"] == "create" and write["namespace"] == "team-a"
    assert write["authorization"] == "Bearer daemon"  # the daemon's kubeconfig, not a NAD's


def test_repeats_are_rate_limited_per_pod_and_reason(node):
    server, root, daemon, _ = node
    for i in range(5):  # the kubelet retrying the pod's ADD
        assert call(root, conf(), f"c{i}", "trainer-0").returncode == 1
    assert call(root, conf(), "c9", "trainer-1").returncode == 1
    eventually(lambda: len(events_of(server, "team-a")) == 2, "one event per pod")
    time.sleep(0.5)
    assert sorted(e["involvedObject"]["name"] for e in events_of(server, "team-a")) == ["trainer-0", "trainer-1"]


def test_an_api_server_that_does_not_take_events_does_not_slow_or_fail_a_call(node):
    server, root, daemon, lease_kc = node
    server.inject_latency(20.0, verb="create", resource="events")
    failed = [call(root, conf(), f"c{i}", f"p{i}") for i in range(3)]
    assert all(p.returncode == 1 and p.seconds < 3.0 for p in failed), [p.seconds for p in failed]
    server.clear_faults()
    server.fail_rate(1.0, 503, resource="events")
    ok = call(root, conf(lease_kc), "c-ok", "fine")
    assert ok.returncode == 0 and ok.seconds < 3.0
    bad = call(root, conf(), "c-bad", "p-bad")
    assert bad.returncode == 1 and json.loads(bad.stdout)["code"] == 7 and bad.seconds < 3.0


def test_the_node_gc_freeing_an_address_is_a_normal_event_on_its_pod(node):
    server, root, daemon, lease_kc = node
    server.add_pod("team-b", "live", uid="uid-live", node=NODE)
    assert call(root, conf(lease_kc), "c-live", "live", "team-b").returncode == 0
    assert call(root, conf(lease_kc), "c-gone", "gone", "team-b").returncode == 0  # no such pod
    [event] = eventually(lambda: events_of(server, "team-b", "AddressFreed"), "the node GC's event")
    assert event["type"] == "Normal" and event["involvedObject"]["name"] == "gone"
    assert event["involvedObject"]["uid"] == "uid-gone"
    assert "the node GC of rdmanet daemon freed 10.55.0." in event["message"] and "network rdma-a" in event["message"]
    assert not events_of(server, "team-a")


def test_the_reconciler_cronjob_writes_an_event_for_each_address_it_frees(tmp_path, monkeypatch):
    """``rdmanet ipam reconcile --all``, as the CronJob runs it (its credentials: here a kubeconfig)."""
    with KubeAPIServer() as server:
        for ns in ("team-a", "team-b", "team-c", "team-d"):  # the pods' namespaces exist (events go into them)
            server.add_namespace(ns)
        kubeconfig = str(write_kubeconfig(tmp_path / "kc", server.url, namespace=NAMESPACE))
        config = json.loads(conf(kubeconfig))
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c-gone", "CNI_NETNS": "/x", "CNI_IFNAME": "net1",
               "CNI_PATH": "/x", "RDMANET_NODE_NAME": "n1",
               "CNI_ARGS": "K8S_POD_NAMESPACE=team-c;K8S_POD_NAME=gone;K8S_POD_UID=uid-gone"}
        assert skel.handle(LeaseIPAM(), env, json.dumps(config).encode())[0] == 0
        assert cli.main(["ipam", "reconcile", "--all", "--kubeconfig", kubeconfig, "--grace-seconds", "0",
                         "--misses", "1", "--dry-run"]) == 0
        assert events_of(server, "team-c") == []  # a dry run frees nothing and says nothing
        assert cli.main(["ipam", "reconcile", "--all", "--kubeconfig", kubeconfig, "--grace-seconds", "0",
                         "--misses", "1"]) == 0
        [event] = events_of(server, "team-c")  # written before the command returned
        assert event["reason"] == "AddressFreed" and event["involvedObject"]["uid"] == "uid-gone"
        assert "the rdmanet reconciler freed 10.55.0." in event["message"]


def test_the_node_wide_rate_limit(tmp_path):
    """BURST events at once, then RATE per second; the rest are counted as rate-limited."""
    with KubeAPIServer() as server:
        for ns in ("team-a", "team-b", "team-c", "team-d"):  # the pods' namespaces exist (events go into them)
            server.add_namespace(ns)
        kubeconfig = str(write_kubeconfig(tmp_path / "kc", server.url))
        now = [1000.0]
        results: list[tuple[str, str]] = []
        events = pod_events.PodEvents(pod_events.Credentials(kubeconfig), NODE,
                                      result=lambda reason, outcome: results.append((reason, outcome)),
                                      clock=lambda: now[0])

        def warn(i: int) -> pod_events.PodEvent:
            return pod_events.PodEvent("team-d", f"p{i}", f"u{i}", "Warning", pod_events.ADD_FAILED, "m")

        for i in range(pod_events.BURST + 5):
            events.emit(warn(i))
        assert events.flush(10.0)
        assert results.count((pod_events.ADD_FAILED, "written")) == pod_events.BURST
        assert results.count((pod_events.ADD_FAILED, "rate_limited")) == 5
        now[0] += 3.0 / pod_events.RATE  # three more tokens
        for i in range(100, 105):
            events.emit(warn(i))
        assert events.flush(10.0)
        assert results.count((pod_events.ADD_FAILED, "written")) == pod_events.BURST + 3
        assert len(events_of(server, "team-d")) == pod_events.BURST + 3
