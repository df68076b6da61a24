"""A node knows its name for sure before its node GC frees anything: the DaemonSet's downward API,
or in host mode the name install.sh writes to /etc/default/rdmanet (given, or the Node that
matches this host, confirmed through the API). A name the API does not confirm (a hostname that
is not the Node's name) runs no node GC; ``rdmanet doctor`` says why."""

from __future__ import annotations

import io
import os
import socket
import sys

import pytest

from rdmanet.cli.doctor import node_checks
from rdmanet.cli import node_name
from rdmanet.ipam import node_gc, node_identity
from rdmanet.ipam.kube_config import kube_settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_lease_ipam_liveness import PODS, add, netconf, start_pod  # noqa: E402

@pytest.fixture
def no_node_name(monkeypatch, tmp_path):
    """This process has no RDMANET_NODE_NAME, and the environment file is a temporary one."""
    monkeypatch.delenv(node_identity.NODE_ENV, raising=False)
    env_file = tmp_path / "etc-default-rdmanet"
    monkeypatch.setattr(node_identity, "ENVIRONMENT_FILE", str(env_file))
    return env_file


@pytest.fixture
def known_store(cluster, monkeypatch):
    """The node GC knows the cluster store (as after serving a call for it)."""
    monkeypatch.setattr(node_gc, "_seen", {})
    node_gc.remember(kube_settings(netconf(cluster)))


def test_a_node_gc_under_a_hostname_that_is_not_the_nodes_name_frees_nothing(cluster, known_store):
    """Host mode without a name: the calls ran in-process under the hostname, GPU-Node01; the
    kubelet registered the Node as gpu-node01 and the pods are bound to it. A node GC under the
    hostname (what the daemon ran before) finds no Node of that name and frees nothing."""
    conf = netconf(cluster, "10.7.8.0/24")
    cluster.node("gpu-node01")
    got = {}
    for i in range(3):
        pod = start_pod(cluster, f"w{i}", "gpu-node01")
        got[add(conf, f"w{i}", "GPU-Node01", pod)] = f"w{i}/net1"
    said = []
    for _ in range(4):
        node_gc.run_once("GPU-Node01", grace=0, misses=3, say=lambda event, *a, **kw: said.append((event, kw)))
        cluster.wait(1)
    assert cluster.holders() == got
    skipped = [kw for event, kw in said if event == "node_gc_skipped"]
    assert skipped and "the cluster has no Node named GPU-Node01" not in skipped[0]["why"]  # not a Node name at all
    assert "not a valid Node name" in skipped[0]["why"] and "install.sh --node-name" not in skipped[0]["why"]


def test_a_node_gc_under_a_confirmed_name_frees_only_gone_pods_claims(cluster, known_store):
    conf = netconf(cluster, "10.7.9.0/24")
    cluster.node("gpu-node01")
    live = add(conf, "live", "gpu-node01", start_pod(cluster, "live", "gpu-node01"))
    gone = add(conf, "gone", "gpu-node01", start_pod(cluster, "gone", "gpu-node01"))
    cluster.delete_pod(PODS, "gone")
    for _ in range(3):
        node_gc.run_once("gpu-node01", grace=0, misses=3, say=lambda *a, **kw: None)
    assert cluster.holders() == {live: "live/net1"} and gone != live


def test_a_node_gc_for_a_node_the_cluster_does_not_have_is_skipped_and_says_why(cluster, known_store):
    conf = netconf(cluster, "10.7.10.0/24")
    ip = add(conf, "w", "node-x", ("apps", "w", "uid-w"))  # no such pod either
    said = []
    for _ in range(3):
        node_gc.run_once("node-x", grace=0, misses=1, say=lambda event, *a, **kw: said.append((event, kw)))
    assert cluster.holders() == {ip: "w/net1"}
    [(event, kw), *_] = said
    assert event == "node_gc_skipped" and "the cluster has no Node named node-x" in kw["why"]


def test_the_daemon_without_a_node_name_runs_no_node_gc_and_says_why(no_node_name):
    said = []
    stop = __import__("threading").Event()
    assert node_gc.start(stop, say=lambda event, *a, **kw: said.append((event, kw))) is None
    [(event, kw)] = said
    assert event == "node_gc_off" and node_identity.NODE_ENV in kw["why"] and "install.sh" in kw["fix"]
    no_node_name.write_text("# written by install.sh\nRDMANET_NODE_NAME=gpu-node01\n")
    assert node_identity.configured() == node_identity.Configured("gpu-node01", str(no_node_name))
    thread = node_gc.start(stop, say=lambda *a, **kw: None)
    stop.set()
    assert thread is not None
    thread.join(5)


def test_the_node_matching_this_host_is_found_through_the_api(cluster):
    """Hostname GPU-Node01 (as `hostname` prints it), FQDN gpu-node01.lab.example: the kubelet
    registered gpu-node01, which is the one confirmed; a host whose names match no Node gets none."""
    cluster.node("gpu-node01")
    assert node_identity.candidates("GPU-Node01", "GPU-Node01.lab.example") == [
        "gpu-node01", "gpu-node01.lab.example"]
    found = node_identity.match(cluster.api, "GPU-Node01", "GPU-Node01.lab.example")
    assert found.name == "gpu-node01" and found.uid
    cluster.node("gpu-node02.lab.example")  # registered by FQDN
    assert node_identity.match(cluster.api, "gpu-node02", "gpu-node02.lab.example").name == "gpu-node02.lab.example"
    missing = node_identity.match(cluster.api, "other", "other.lab.example")
    assert missing.name is None and "no Node matches this host (other, other.lab.example)" in missing.reason


def test_install_sh_writes_the_confirmed_name_to_the_daemons_environment(cluster, tmp_path):
    """What install.sh runs (python -m rdmanet.cli.node_name): the Node matching this host,
    confirmed, written to the environment file with its other lines kept; a given name is written
    as given; no match: the file is left as it is (exit 3)."""
    env_file = tmp_path / "default" / "rdmanet"
    env_file.parent.mkdir()
    env_file.write_text("RDMANET_NODE_POLICY=/etc/rdmanet/node-policy.json\nRDMANET_NODE_NAME=old\n")
    out = io.StringIO()
    assert node_name.main(["--env-file", str(env_file), "--kubeconfig", cluster.kubeconfig], out) == 3
    assert "no Node confirmed for this host" in out.getvalue() and "install.sh --node-name" in out.getvalue()
    assert env_file.read_text().endswith("RDMANET_NODE_NAME=old\n")
    cluster.node(node_identity.candidates()[-1])  # this machine's short name, lower-cased
    out = io.StringIO()
    assert node_name.main(["--env-file", str(env_file), "--kubeconfig", cluster.kubeconfig], out) == 0
    assert "confirmed through the API" in out.getvalue()
    assert env_file.read_text() == ("RDMANET_NODE_POLICY=/etc/rdmanet/node-policy.json\n"
                                    f"RDMANET_NODE_NAME={node_identity.candidates()[-1]}\n")
    out = io.StringIO()
    assert node_name.main(["--env-file", str(env_file), "--kubeconfig", cluster.kubeconfig, "--name", "gpu-node09"],
                          out) == 0
    assert "not confirmed (the cluster has no Node named gpu-node09)" in out.getvalue()
    assert node_identity.configured({}, str(env_file)).name == "gpu-node09"


def test_doctor_says_why_the_node_gc_does_not_run(cluster, no_node_name, monkeypatch):
    [finding] = node_checks.check(node_checks.gather([], 5.0))
    assert finding.severity == "warn" and "runs no node GC" in finding.message and "--node-name" in finding.fix
    monkeypatch.setattr(node_checks, "_cluster_stores", lambda uses: [kube_settings(netconf(cluster))])
    no_node_name.write_text("RDMANET_NODE_NAME=gpu-node07\n")
    [finding] = node_checks.check(node_checks.gather([], 5.0))
    assert finding.severity == "warn" and "the cluster has no Node named gpu-node07" in finding.message
    cluster.node("gpu-node07")
    [finding] = node_checks.check(node_checks.gather([], 5.0))
    assert finding.severity == "ok" and "confirms Node gpu-node07" in finding.message


def test_this_hosts_name_is_a_candidate():
    assert socket.gethostname().lower().split(".")[0] in node_identity.candidates()
