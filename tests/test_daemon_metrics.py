"""The daemon's Prometheus metrics, scraped over HTTP while real shims call a real daemon and
lease-ipam's Lease store runs against the fake API server: every figure moves with real calls
(calls by plugin, command and CNI code; latency; addresses in use and free; blocks owned; frees
by the CNI GC verb and the node GC; the DEL journal; API requests and errors; watch restarts)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from typing import Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rdmanet.node.testing import Daemon, shim_env
from kube_api_server import KubeAPIServer, write_kubeconfig

BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
NAMESPACE = "rdmanet-system"
NODE = "gpu-node-1"
RANGE = "10.66.0.0/24 (10.66.0.1-10.66.0.254)"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple, float]:
    """Every sample as {(name, (label, value), ...): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, *sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, *sorted(labels.items())), 0.0)


def eventually(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def node(tmp_path):
    with KubeAPIServer() as server, shim_env() as root:
        server.add_node(NODE)  # the daemon's node GC runs for a Node the API confirms
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NAMESPACE)
        port = free_port()
        daemon = Daemon(str(root / "run" / "daemon.sock"), allow_uids=[os.getuid()],
                        env={"RDMANET_METRICS_PORT": str(port), "RDMANET_NODE_NAME": NODE,
                             "RDMANET_NODE_GC_SECONDS": "1", "RDMANET_NODE_GC_GRACE_SECONDS": "0",
                             "RDMANET_NODE_GC_MISSES": "1", "RDMANET_DEL_REPLAY_SECONDS": "3600"})
        try:
            yield server, root, daemon, port, str(kubeconfig)
        finally:
            daemon.cleanup()


def conf(kubeconfig: str, version: str = "1.1.0", **ipam) -> bytes:
    ipam = {"type": "lease-ipam", "range": "10.66.0.0/24",
            "kubernetes": {"kubeconfig": kubeconfig, "timeout_seconds": 2}, **ipam}
    return json.dumps({"cniVersion": version, "name": "rdma-a", "type": "macvlan-rdma", "ipam": ipam}).encode()


def call(root, command: str, stdin: bytes, cid: str, pod: Optional[str] = "p"):
    """One call through the shim; ``pod`` None: a runtime that names no pod (podman, cnitool)."""
    env = {"PATH": BARE_PATH, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": "net1", "CNI_PATH": str(root / "bin"), "RDMANET_NODE_POLICY": os.environ["RDMANET_NODE_POLICY"]}
    if pod is not None:
        env["CNI_ARGS"] = f"IgnoreUnknown=true;K8S_POD_NAMESPACE=team;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"
    return subprocess.run([str(root / "bin" / "lease-ipam")], input=stdin, env=env, capture_output=True, timeout=60)


def test_metrics_move_with_real_calls(node):
    server, root, daemon, port, kubeconfig = node
    before = scrape(port)
    assert value(before, "rdmanet_cni_calls_total", plugin="lease-ipam", command="ADD", code="0") == 0
    assert not [k for k in before if k[0] == "rdmanet_ipam_addresses_in_use"]

    # two pods that exist: ADDs, one CNI code 7, the latency of each
    for pod in ("a", "b", "c"):
        server.add_pod("team", pod, uid=f"uid-{pod}", node=NODE)
        assert call(root, "ADD", conf(kubeconfig), f"c-{pod}", pod).returncode == 0
    bad = call(root, "ADD", conf(kubeconfig, range="10.66.0.0/33"), "c-bad", "a")
    assert bad.returncode == 1 and json.loads(bad.stdout)["code"] == 7
    m = scrape(port)
    assert value(m, "rdmanet_cni_calls_total", plugin="lease-ipam", command="ADD", code="0") == 3
    assert value(m, "rdmanet_cni_calls_total", plugin="lease-ipam", command="ADD", code="7") == 1
    assert value(m, "rdmanet_cni_call_duration_seconds_count", plugin="lease-ipam", command="ADD") == 4
    assert value(m, "rdmanet_cni_call_duration_seconds_sum", plugin="lease-ipam", command="ADD") > 0
    labels = {"network": "rdma-a", "range": RANGE, "store": "kubernetes"}
    assert value(m, "rdmanet_ipam_addresses_in_use", **labels) == 3
    assert value(m, "rdmanet_ipam_blocks_owned", network="rdma-a") == 1
    [block] = {o["metadata"]["labels"]["rdmanet.io/block"] for o in server.objects("leases", NAMESPACE)}
    first = int(block.split("-")[0].rsplit(".", 1)[1])  # "10.66.0.<first>-16": .0 and .255 are not usable
    usable = 16 - (first == 0) - (first == 240)
    assert value(m, "rdmanet_ipam_addresses_free", **labels) == usable - 3
    assert value(m, "rdmanet_kube_api_requests_total", method="POST", code="201") >= 3

    # the CNI GC verb frees a claim its runtime no longer lists that names no pod (the runtime's word
    # is all there is); a pod's claim is judged by its pod (docs/lease-ipam-design.md, the liveness rule)
    assert call(root, "ADD", conf(kubeconfig), "c-bare", None).returncode == 0
    eventually(lambda: value(scrape(port), "rdmanet_ipam_addresses_in_use", **labels) == 4, "the ADD in the usage")
    gc = json.loads(conf(kubeconfig, gc_grace_seconds=0))
    gc["cni.dev/valid-attachments"] = [{"containerID": f"c-{p}", "ifname": "net1"} for p in ("a", "b", "c")]
    assert call(root, "GC", json.dumps(gc).encode(), "", "a").returncode == 0
    eventually(lambda: value(scrape(port), "rdmanet_ipam_addresses_in_use", **labels) == 3, "the GC's free in the usage")
    m = scrape(port)
    assert value(m, "rdmanet_ipam_addresses_freed_total", by="cni-gc") == 1
    assert value(m, "rdmanet_ipam_addresses_freed_total", by="node-gc") == 0

    # a pod that is gone: the node GC frees its claim
    assert call(root, "ADD", conf(kubeconfig), "c-gone", "gone").returncode == 0
    eventually(lambda: value(scrape(port), "rdmanet_ipam_addresses_freed_total", by="node-gc") == 1, "the node GC")

    # a DEL the API server fails: an error on the API, and journaled by the shim for the daemon
    server.fail_rate(1.0, 503, verb="delete")
    assert call(root, "DEL", conf(kubeconfig), "c-c", "c").returncode == 1  # a claim (c-a's is the block record)
    server.fail_rate(0)
    m = scrape(port)
    assert value(m, "rdmanet_del_journal_entries") == 1
    assert value(m, "rdmanet_kube_api_errors_total", method="DELETE", code="503") >= 1
    assert value(m, "rdmanet_cni_calls_total", plugin="lease-ipam", command="DEL", code="11") == 1

    # a watch that breaks is restarted
    restarts = value(m, "rdmanet_lease_watch_restarts_total", reason="broken")
    assert server.drop_watches() >= 1
    eventually(lambda: value(scrape(port), "rdmanet_lease_watch_restarts_total", reason="broken") > restarts,
               "a watch restart")


def test_metrics_are_off_by_default_and_bind_loopback_unless_told(tmp_path):
    """No port: nothing listens. A port without an address: 127.0.0.1 only (a host exposes
    nothing unless asked); RDMANET_METRICS_ADDRESS (the DaemonSet's pod IP) binds that address."""

    def answers(address: str, port: int) -> bool:
        try:
            return b"rdmanet_del_journal_entries" in urllib.request.urlopen(f"http://{address}:{port}/metrics",
                                                                            timeout=5).read()
        except OSError:
            return False

    with shim_env() as root:
        port = free_port()
        for env, where, nowhere in (({}, None, "127.0.0.1"),
                                    ({"RDMANET_METRICS_PORT": str(port)}, "127.0.0.1", "127.0.0.2"),
                                    ({"RDMANET_METRICS_PORT": str(port), "RDMANET_METRICS_ADDRESS": "127.0.0.2"},
                                     "127.0.0.2", "127.0.0.1")):
            daemon = Daemon(str(root / "run" / "daemon.sock"), allow_uids=[os.getuid()], env=env)
            try:
                started = [json.loads(line) for line in daemon.log().splitlines() if '"event": "metrics"' in line]
                assert [(s["address"], s["port"]) for s in started] == ([(where, port)] if where else [])
                assert not answers(nowhere, port)
                assert where is None or answers(where, port)
            finally:
                daemon.cleanup()
