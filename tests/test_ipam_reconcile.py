"""The Lease-store reconciler and ``rdmanet ipam ls`` on the Lease store, against the fake API server.

Claims are made by the real plugin (skel.handle + LeaseIPAM, Kubernetes store) over real HTTP with
the real ``kubernetes`` client; pods are added and removed through the fake server's controls.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from rdmanet.cni.core import skel
from rdmanet.ipam import reconcile
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store.kube import domain_hash
from rdmanet.cli.main import main

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import write_kubeconfig  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

NS = "rdmanet-ipam"
MISSES = reconcile.MISSES_ANNOTATION


@pytest.fixture
def conf(tmp_path, server):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)
    doc = {"cniVersion": "1.0.0", "name": "rdma-net", "type": "macvlan-rdma",
           "ipam": {"type": "lease-ipam", "range": "10.0.0.0/24", "kubernetes": {"kubeconfig": kubeconfig}}}
    path = tmp_path / "net.json"
    path.write_text(json.dumps(doc))
    return {"doc": doc, "path": str(path)}


def cni(command, conf, cid, pod=None, ifname="net1", node="node-a"):
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": ifname,
           "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node}
    if pod is not None:
        ns, name, uid = pod
        env["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID={uid}"
    code, out = skel.handle(LeaseIPAM(), env, json.dumps(conf["doc"]).encode())
    assert code == 0, out
    return out


def leases(server):
    return {o["metadata"]["name"]: o for o in claim_leases(server, NS)}


def lease_of(server, cid, ifname="net1"):
    """The Lease held by the attachment (addresses are picked from a hashed start, so tests key by holder)."""
    return next((o for o in claim_leases(server, NS) if o["spec"].get("holderIdentity") == f"{cid}/{ifname}"), None)


def run_once(conf, capsys, *extra, grace="0", misses="3"):
    code = main(["ipam", "reconcile", "--network-config", conf["path"], "--grace-seconds", grace, "--misses", misses,
                 "-o", "json", *extra])
    out = capsys.readouterr().out
    return code, json.loads(out)


def actions(doc):
    return {c["containerID"]: c["action"] for c in doc["claims"]}


def test_live_pod_kept(server, conf, capsys):
    uid = server.add_pod("default", "train-0", uid="uid-live")["metadata"]["uid"]  # a real server sets its own
    cni("ADD", conf, "ctr1", ("default", "train-0", uid))
    for _ in range(4):
        code, doc = run_once(conf, capsys)
        assert code == 0
        assert actions(doc) == {"ctr1": "kept"}
    lease = lease_of(server, "ctr1")
    assert lease is not None and MISSES not in lease["metadata"]["annotations"]


def test_deleted_pod_freed_after_n_misses_only(server, conf, capsys):
    uid = server.add_pod("default", "job-1", uid="uid-1")["metadata"]["uid"]
    cni("ADD", conf, "ctr1", ("default", "job-1", uid))
    server.delete_pod("default", "job-1")
    for n in (1, 2):
        code, doc = run_once(conf, capsys)
        assert code == 0 and actions(doc) == {"ctr1": "miss"}
        assert doc["claims"][0]["misses"] == n and "pod not found" in doc["claims"][0]["reason"]
        assert lease_of(server, "ctr1")["metadata"]["annotations"][MISSES] == str(n)
    code, doc = run_once(conf, capsys)
    assert actions(doc) == {"ctr1": "freed"} and doc["summary"] == {"freed": 1}
    assert leases(server) == {}
    # the freed address is allocatable again, and a DEL of the gone attachment is still fine
    cni("DEL", conf, "ctr1", ("default", "job-1", uid))


def test_a_static_pod_is_present_through_its_mirror_pod(server, conf, capsys):
    """The kubelet gives CNI a static pod's own UID; the API holds its mirror pod, whose UID
    differs and whose kubernetes.io/config.mirror annotation carries the kubelet's UID."""
    server.add_pod("kube-system", "ptp-agent-node-a", uid="mirror-uid", node="node-a",
                   annotations={"kubernetes.io/config.mirror": "static-uid", "kubernetes.io/config.source": "file"})
    cni("ADD", conf, "ctr-static", ("kube-system", "ptp-agent-node-a", "static-uid"))
    for _ in range(3):
        code, doc = run_once(conf, capsys, misses="1")
        assert code == 0 and actions(doc) == {"ctr-static": "kept"}, doc
    assert lease_of(server, "ctr-static") is not None
    # the static pod re-created from another manifest: a new kubelet UID, the old claim is a miss
    server.add_pod("kube-system", "ptp-agent-node-a", uid="mirror-uid-2", node="node-a",
                   annotations={"kubernetes.io/config.mirror": "static-uid-2"})
    code, doc = run_once(conf, capsys, misses="1")
    assert actions(doc) == {"ctr-static": "freed"}


def test_grace_period_skips_young_claims(server, conf, capsys):
    cni("ADD", conf, "ctr1", ("default", "gone", "uid-gone"))  # the pod never existed
    for _ in range(5):
        code, doc = run_once(conf, capsys, grace="3600", misses="1")
        assert actions(doc) == {"ctr1": "skipped-young"}
    assert MISSES not in lease_of(server, "ctr1")["metadata"]["annotations"]
    # the same claim, judged as if an hour had passed
    target = reconcile.KubeTarget.from_config(conf["doc"])
    [claim] = target.list_claims()
    later = claim.created.replace(year=claim.created.year + 1)
    outcome = reconcile.reconcile_target(target, grace_seconds=3600, misses=1, now=later)
    assert [a.action for a in outcome.actions] == ["freed"]
    assert leases(server) == {}


@pytest.mark.fake_only("a pod that appears late with the UID the runtime gave the plugin: a real server sets UIDs itself")
def test_present_pod_resets_miss_count(server, conf, capsys):
    cni("ADD", conf, "ctr1", ("default", "slow-0", "uid-slow"))
    code, doc = run_once(conf, capsys)  # pod not (yet) visible: one miss
    assert actions(doc) == {"ctr1": "miss"}
    server.add_pod("default", "slow-0", uid="uid-slow")
    code, doc = run_once(conf, capsys)
    assert actions(doc) == {"ctr1": "reset"}
    assert MISSES not in lease_of(server, "ctr1")["metadata"]["annotations"]
    code, doc = run_once(conf, capsys)
    assert actions(doc) == {"ctr1": "kept"}
    # misses must be consecutive: two more misses do not free it with --misses 3
    server.delete_pod("default", "slow-0")
    for _ in range(2):
        run_once(conf, capsys)
    assert lease_of(server, "ctr1") is not None


def test_statefulset_name_reuse_frees_old_claim_keeps_new(server, conf, capsys):
    cni("ADD", conf, "old-ctr", ("db", "db-0", "uid-old"))
    new = server.add_pod("db", "db-0", uid="uid-new")["metadata"]["uid"]  # same name, new UID: the old pod is gone
    cni("ADD", conf, "new-ctr", ("db", "db-0", new))
    for _ in range(2):
        code, doc = run_once(conf, capsys)
        assert actions(doc) == {"old-ctr": "miss", "new-ctr": "kept"}
    old = next(c for c in doc["claims"] if c["podUID"] == "uid-old")
    assert f"now has UID {new}" in old["reason"]
    code, doc = run_once(conf, capsys)
    by_uid = {c["podUID"]: c["action"] for c in doc["claims"]}
    assert by_uid == {"uid-old": "freed", new: "kept"}
    left = list(leases(server).values())
    assert [lease["spec"]["holderIdentity"] for lease in left] == ["new-ctr/net1"]


def test_claim_recreated_between_list_and_delete_is_not_removed(server, tmp_path, capsys):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)
    doc = {"cniVersion": "1.0.0", "name": "tiny", "type": "macvlan-rdma",
           "ipam": {"type": "lease-ipam", "range": "10.0.0.5-10.0.0.5/24", "kubernetes": {"kubeconfig": kubeconfig}}}
    conf = {"doc": doc}
    cni("ADD", conf, "ctr-old", ("default", "a", "uid-a"))
    target = reconcile.KubeTarget.from_config(doc)
    for _ in range(2):
        reconcile.reconcile_target(target, grace_seconds=0, misses=3)
    assert lease_of(server, "ctr-old")["metadata"]["annotations"][MISSES] == "2"

    real_get_pod = target.get_pod

    def racing_get_pod(namespace, name):
        # after the List, before the delete: the old attachment goes (DEL), a new pod takes the address
        cni("DEL", conf, "ctr-old", ("default", "a", "uid-a"))
        cni("ADD", conf, "ctr-new", ("default", "b", "uid-b"))
        return real_get_pod(namespace, name)

    target.get_pod = racing_get_pod
    outcome = reconcile.reconcile_target(target, grace_seconds=0, misses=3)
    assert [a.action for a in outcome.actions] == ["conflict"]
    [lease] = claim_leases(server, NS)
    assert lease["spec"]["holderIdentity"] == "ctr-new/net1"
    assert lease["metadata"]["annotations"]["rdmanet.io/ip"] == "10.0.0.5"
    assert lease["metadata"]["annotations"]["rdmanet.io/pod-uid"] == "uid-b"


def test_miss_write_loses_to_a_concurrent_change(server, conf, capsys):
    cni("ADD", conf, "ctr1", ("default", "gone", "uid-gone"))
    target = reconcile.KubeTarget.from_config(conf["doc"])
    real_get_pod = target.get_pod

    def touching_get_pod(namespace, name):
        cur = server.get_object("leases", NS, lease_of(server, "ctr1")["metadata"]["name"])
        cur["metadata"]["labels"]["touched"] = "yes"
        from kubernetes import client  # a concurrent writer: any update bumps the resourceVersion

        api = client.CoordinationV1Api(target.api.transport.api)
        api.replace_namespaced_lease(cur["metadata"]["name"], NS, client.V1Lease.from_dict(cur))
        return real_get_pod(namespace, name)

    target.get_pod = touching_get_pod
    outcome = reconcile.reconcile_target(target, grace_seconds=0, misses=3)
    assert [a.action for a in outcome.actions] == ["conflict"]
    lease = lease_of(server, "ctr1")
    assert lease["metadata"]["labels"]["touched"] == "yes" and MISSES not in lease["metadata"]["annotations"]


def test_dry_run_changes_nothing(server, conf, capsys):
    cni("ADD", conf, "ctr1", ("default", "gone", "uid-gone"))
    target = reconcile.KubeTarget.from_config(conf["doc"])
    reconcile.reconcile_target(target, grace_seconds=0, misses=3)  # ctr1's claim: one miss recorded
    cni("ADD", conf, "ctr2", ("default", "gone2", "uid-gone2"))
    before = leases(server)
    server.reset_counts()
    for _ in range(4):
        code, doc = run_once(conf, capsys, "--dry-run", misses="2")
        assert code == 0 and doc["dryRun"] is True
        assert actions(doc) == {"ctr1": "freed", "ctr2": "miss"}
    assert leases(server) == before
    writes = sum(n for (verb, _), n in server.counts().items() if verb not in ("get", "list", "watch"))
    assert writes == 0


def test_claims_without_pod_identity_left_alone(server, conf, capsys):
    cni("ADD", conf, "podman-ctr")  # no K8S_POD_* (cnitool, podman): no pod identity
    for _ in range(4):
        code, doc = run_once(conf, capsys, misses="1")
        assert code == 0 and actions(doc) == {"podman-ctr": "no-pod-identity"}
    assert lease_of(server, "podman-ctr") is not None


def test_only_the_domains_leases_are_listed(server, conf, capsys):
    from kubernetes import client

    uid = server.add_pod("default", "p", uid="uid-p")["metadata"]["uid"]
    cni("ADD", conf, "ctr1", ("default", "p", uid))
    api = client.CoordinationV1Api(reconcile.KubeTarget.from_config(conf["doc"]).api.transport.api)
    api.create_namespaced_lease("kube-node-lease", client.V1Lease(metadata=client.V1ObjectMeta(name="node-a")))
    other = {"rdmanet.io/ipam-domain": domain_hash("other-net"), "rdmanet.io/pod-uid": "uid-x"}
    api.create_namespaced_lease(NS, client.V1Lease(metadata=client.V1ObjectMeta(
        name=f"lip-{domain_hash('other-net')}-10.0.0.9", labels=other,
        annotations={"rdmanet.io/pod-namespace": "default", "rdmanet.io/pod-name": "x", "rdmanet.io/pod-uid": "uid-x"}),
        spec=client.V1LeaseSpec(holder_identity="c/net1")))
    server.reset_counts()
    code, doc = run_once(conf, capsys, misses="1")
    assert actions(doc) == {"ctr1": "kept"}
    assert len(claim_leases(server, NS)) == 2
    log = [e for e in server.request_log() if e["resource"] == "leases"]
    assert [e["verb"] for e in log] == ["list"]  # one List, nothing written for a kept claim
    assert log[0]["namespace"] == NS and "rdmanet.io/ipam-domain=" in str(log[0]["query"])


def test_api_unreachable_is_a_clear_error(tmp_path, capsys):
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9", namespace=NS)
    doc = {"cniVersion": "1.0.0", "name": "rdma-net", "type": "macvlan-rdma",
           "ipam": {"type": "lease-ipam", "range": "10.0.0.0/24", "kubernetes": {"kubeconfig": kubeconfig}}}
    path = tmp_path / "net.json"
    path.write_text(json.dumps(doc))
    code = main(["ipam", "reconcile", "--network-config", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "unreachable" in err


def test_reconcile_needs_the_kubernetes_store(tmp_path, capsys):
    path = tmp_path / "net.json"
    path.write_text(json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "macvlan-rdma",
                                "ipam": {"type": "lease-ipam", "range": "10.0.0.0/24"}}))
    code = main(["ipam", "reconcile", "--network-config", str(path)])
    assert code == 2 and "kubernetes" in capsys.readouterr().err


def test_table_output(server, conf, capsys):
    cni("ADD", conf, "ctr1", ("default", "gone", "uid-gone"))
    code = main(["ipam", "reconcile", "--network-config", conf["path"], "--grace-seconds", "0", "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0 and "dry run" in out and "miss" in out and "default/gone" in out


# -- rdmanet ipam ls on the Lease store ----------------------------------------------------------

def test_ls_kube_store_shows_pod_node_and_counts(server, conf, capsys):
    cni("ADD", conf, "c" * 64, ("default", "train-0", "uid-0"), node="gpu-1")
    cni("ADD", conf, "ctr2", None, ifname="net2", node="gpu-2")
    code = main(["ipam", "ls", "--network-config", conf["path"], "-o", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    [net] = doc["networks"]
    assert net["domain"] == "@cluster" and net["store"] == "kubernetes"  # no network_name: the cluster-wide domain
    by_cid = {c["containerID"]: c for c in net["claims"]}
    assert by_cid["c" * 64] == {"address": by_cid["c" * 64]["address"], "network": "rdma-net", "containerID": "c" * 64,
                                "ifname": "net1", "pod": "default/train-0", "node": "gpu-1",
                                "age_seconds": by_cid["c" * 64]["age_seconds"]}
    assert by_cid["ctr2"]["pod"] is None and by_cid["ctr2"]["node"] == "gpu-2" and by_cid["ctr2"]["ifname"] == "net2"
    assert net["ranges"] == [{"range": "10.0.0.0/24 (10.0.0.1-10.0.0.254)", "size": 254, "used": 2, "free": 252}]
    code = main(["ipam", "ls", "--network-config", conf["path"]])
    out = capsys.readouterr().out
    assert "kubernetes store, namespace rdmanet-ipam" in out and "default/train-0" in out and "gpu-1" in out



def test_credentials_that_may_not_list_pods_are_refused_once_then_read_pods_by_name(server, conf):
    """The node daemon's token may get pods but not list them (deploy/rbac.yaml): its node GC's
    first run is refused the List and reads each claim's pod by name; later runs of the same
    credentials do not ask for the List again (one refused request per process, not per run)."""
    from rdmanet.ipam.kube_config import kube_settings

    for i in range(3):
        uid = server.add_pod("default", f"rail-{i}", uid=f"uid-rail-{i}", node="node-a")["metadata"]["uid"]
        cni("ADD", conf, f"ctr{i}", ("default", f"rail-{i}", uid))
    reads = []
    for run in range(3):
        target = reconcile.KubeTarget.for_settings(kube_settings(conf["doc"]), node="node-a")
        if run == 0:
            server.fail_next(1, status=403, verb="list", resource="pods")
        server.reset_counts()
        outcome = reconcile.reconcile_target(target, grace_seconds=0, misses=3)
        assert outcome.count(reconcile.KEPT) == 3, outcome.to_json()
        counts = server.counts()
        reads.append((counts.get(("list", "pods"), 0), counts.get(("get", "pods"), 0)))
    assert reads == [(1, 3), (0, 3), (0, 3)]
