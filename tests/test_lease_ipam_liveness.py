"""lease-ipam never frees an address while its pod lives: the liveness rule every cleaner shares
(the node GC, CNI GC, the reconciler, the superseded-sandbox rule), tried the way operators run
them. Everything a test does to the cluster goes through its API (tests/kube_cluster.py), so the
``server`` fixture can be any API server; the fake one's clock is moved ahead instead of waited
for."""

from __future__ import annotations

import json
import os
import sys

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import POOL_EXHAUSTED
from rdmanet.ipam import reconcile
from rdmanet.ipam.kube_config import kube_settings
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store import domain_leases
from rdmanet.ipam.store.lease_names import L_BLOCK_OWNER, L_NODE

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_cluster import NAMESPACE  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

NS = NAMESPACE
PODS = "apps"


def netconf(cluster, rng="10.7.0.0/24", **ipam):
    return {"cniVersion": "1.1.0", "name": "net-a", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "range": rng, "gc_grace_seconds": 0,
                     "kubernetes": {"kubeconfig": cluster.kubeconfig, **ipam.pop("kube", {})}, **ipam}}


def cni(command, conf, cid, node, pod=None, **extra):
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
           "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node}
    if pod is not None:
        env["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod[0]};K8S_POD_NAME={pod[1]};K8S_POD_UID={pod[2]}"
    if extra:
        conf = dict(conf, **extra)
    return skel.handle(LeaseIPAM(), env, json.dumps(conf).encode())


def add(conf, cid, node, pod=None):
    code, out = cni("ADD", conf, cid, node, pod)
    if code:
        assert out["code"] == POOL_EXHAUSTED, out
        return None
    return out["ips"][0]["address"].split("/")[0]


def start_pod(cluster, name, node):
    return (PODS, name, cluster.pod(PODS, name, node))


def cni_gc(conf, node, valid):
    return cni("GC", conf, "gc", node, **{"cni.dev/valid-attachments": [{"containerID": c, "ifname": "net1"} for c in valid]})


def node_gc(cluster, node, **kw):
    """One run of ``node``'s daemon GC over its claims (what rdmanet.ipam.node_gc runs)."""
    target = reconcile.KubeTarget.for_settings(kube_settings(netconf(cluster)), node=node)
    return reconcile.reconcile_target(target, **{"grace_seconds": 0, "misses": 3, **kw})


def reconciler(cluster, **kw):
    """One run of the reconciler CronJob (``rdmanet ipam reconcile --all``)."""
    return reconcile.reconcile_all(netconf(cluster), **{"grace_seconds": 0, "misses": 3, **kw})


# -- 1: a borrowed claim is the borrower's ----------------------------------------------------------

def test_a_borrowed_block_record_is_never_freed_by_the_lenders_cleaners_while_its_pod_lives(cluster):
    """Node B borrows node A's free block record: the claim is B's (its node label), the block
    stays A's. A's node GC, A's CNI GC and the reconciler run many times while B's pod lives: the
    address stays B's, A's next ADD never gets it, and B's repeat ADD returns that one address."""
    conf = netconf(cluster, "10.7.1.0/29", kube={"block_size": 8})  # one block, six addresses
    cluster.node("node-a"), cluster.node("node-b")
    pods_a = [start_pod(cluster, f"a{i}", "node-a") for i in range(6)]
    got_a = [add(conf, f"a{i}", "node-a", pods_a[i]) for i in range(6)]
    assert got_a[0] == "10.7.1.1" and None not in got_a  # a0's address is node-a's block record
    assert cni("DEL", conf, "a0", "node-a", pods_a[0]) == (0, None)
    cluster.delete_pod(PODS, "a0")
    pod_b = start_pod(cluster, "b0", "node-b")
    assert add(conf, "b0", "node-b", pod_b) == "10.7.1.1"  # borrowed: the free record taken by an update
    [record] = [o for o in cluster.leases() if o["metadata"]["labels"].get(L_BLOCK_OWNER)]
    assert record["metadata"]["labels"][L_NODE] == "node-b" and record["metadata"]["labels"][L_BLOCK_OWNER] == "node-a"
    for _ in range(4):
        node_gc(cluster, "node-a")
        assert cni_gc(conf, "node-a", [f"a{i}" for i in range(1, 6)]) == (0, None)
        reconciler(cluster)
        cluster.wait(1)
    assert cluster.holders()["10.7.1.1"] == "b0/net1"
    assert add(conf, "a6", "node-a", start_pod(cluster, "a6", "node-a")) is None  # the pool is full: not b0's address
    assert add(conf, "b0", "node-b", pod_b) == "10.7.1.1"
    assert sorted(h for h in cluster.holders().values() if h.startswith("b0/")) == ["b0/net1"]


def test_a_claim_labelled_with_another_node_is_kept_while_its_pod_lives_elsewhere(cluster):
    """A claim whose node label is wrong (edited by hand, or by a tool that labelled a borrowed
    claim with the lender's node) is judged by its pod, looked up by name: node A's GC never frees it while the
    pod runs on node B, and frees it once the pod is gone."""
    conf = netconf(cluster, "10.7.2.0/24")
    cluster.node("node-a"), cluster.node("node-b")
    pod = start_pod(cluster, "web", "node-b")
    ip = add(conf, "web", "node-b", pod)
    [lease] = [o for o in cluster.leases() if o["spec"].get("holderIdentity") == "web/net1"]
    lease["metadata"]["labels"][L_NODE] = "node-a"
    cluster.api.request("PUT", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{lease['metadata']['name']}",
                        body=lease)
    for _ in range(4):
        outcome = node_gc(cluster, "node-a")
        assert [a.action for a in outcome.actions] == [reconcile.KEPT]
    assert cluster.holders()[ip] == "web/net1"
    cluster.delete_pod(PODS, "web")
    for _ in range(3):
        node_gc(cluster, "node-a")
    assert ip not in cluster.holders()


# -- 3: the superseded rule and the spacing of checks go by the server's clock ---------------------

def test_a_new_sandbox_whose_node_clock_lags_keeps_its_claim_and_the_replaced_one_goes_after_spaced_misses(
        cluster, monkeypatch):
    """A pod's sandbox is replaced after a reboot whose clock is not yet stepped (10 minutes
    behind): the new sandbox's claim carries the older acquireTime. The server made it later, so
    it is the live one: the reconciler keeps it, and frees the replaced sandbox's claim only
    after three misses, each counted at least the spacing apart."""
    conf = netconf(cluster, "10.7.3.0/24")
    cluster.node("node-a")
    pod = start_pod(cluster, "db", "node-a")
    old = add(conf, "old", "node-a", pod)
    cluster.wait(2)  # the server's creationTimestamp has whole seconds
    real = domain_leases._now_micro
    monkeypatch.setattr(domain_leases, "_now_micro", lambda: _shifted(real(), -600))
    new = add(conf, "new", "node-a", pod)
    monkeypatch.setattr(domain_leases, "_now_micro", real)
    assert old != new
    outcome = reconciler(cluster)
    assert cluster.holders() == {old: "old/net1", new: "new/net1"}  # one check frees nothing
    assert {a.claim.container_id: a.action for a in outcome.actions} == {"new": reconcile.KEPT, "old": reconcile.MISS}
    reconciler(cluster, spacing_seconds=3)
    node_gc(cluster, "node-a", spacing_seconds=3)  # a second cleaner right after: not another miss
    assert cluster.holders() == {old: "old/net1", new: "new/net1"}
    for _ in range(2):
        cluster.wait(4)
        reconciler(cluster, spacing_seconds=3)
    assert cluster.holders() == {new: "new/net1"}


def test_misses_of_back_to_back_cleaners_count_once_per_spacing(cluster):
    """The CronJob, the node GC and CNI GC run back to back over a gone pod's claim: one miss per
    spacing of server time, however many cleaners run within it."""
    conf = netconf(cluster, "10.7.4.0/24")
    cluster.node("node-a")
    pod = start_pod(cluster, "job", "node-a")
    ip = add(conf, "job", "node-a", pod)
    cluster.delete_pod(PODS, "job")
    for _ in range(3):
        reconciler(cluster, spacing_seconds=4)
        node_gc(cluster, "node-a", spacing_seconds=4)
    assert cluster.holders() == {ip: "job/net1"}
    [lease] = [o for o in cluster.leases() if o["spec"].get("holderIdentity") == "job/net1"]
    assert lease["metadata"]["annotations"][reconcile.MISSES_ANNOTATION] == "1"
    cluster.wait(5)
    node_gc(cluster, "node-a", spacing_seconds=4)
    cluster.wait(5)
    reconciler(cluster, spacing_seconds=4)
    assert cluster.holders() == {}


def test_cni_gc_frees_a_claim_without_a_pod_once_its_runtime_drops_it(cluster):
    """podman or cnitool: no pod, the runtime's list is the only word: a claim it no longer lists
    goes on the first GC past the grace (by the server's clock); a claim of a pod is judged by
    the pod."""
    conf = netconf(cluster, "10.7.5.0/24", gc_grace_seconds=6)
    cluster.node("node-a")
    pod = start_pod(cluster, "kept", "node-a")
    kept = add(conf, "kept", "node-a", pod)
    bare = add(conf, "bare", "node-a")
    assert cni_gc(conf, "node-a", []) == (0, None)
    assert cluster.holders() == {kept: "kept/net1", bare: "bare/net1"}  # younger than 6 s
    cluster.wait(7)
    for _ in range(4):
        assert cni_gc(conf, "node-a", []) == (0, None)
        cluster.wait(3)
    assert cluster.holders() == {kept: "kept/net1"}


def _shifted(stamp: str, seconds: float) -> str:
    from datetime import datetime, timedelta

    when = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ") + timedelta(seconds=seconds)
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- 4: the blocks of Nodes that no longer exist ---------------------------------------------------

def test_the_free_blocks_of_a_deleted_node_are_released_after_the_grace(cluster):
    """Node A is scaled away: its free block goes back after the grace (noted by the server's
    clock, then deleted with uid and resourceVersion preconditions); its block whose record a
    live pod's claim holds stays; a record changed between the note and the release is left;
    node B's blocks are never touched."""
    from rdmanet.ipam import gone_nodes

    conf = netconf(cluster, "10.7.6.0/24", kube={"block_size": 16})
    cluster.node("node-a"), cluster.node("node-b")
    a_first = add(conf, "a0", "node-a", start_pod(cluster, "a0", "node-a"))
    pods = {}
    for i in range(1, 16):  # the first block (15 addresses) fills up: a15 acquires a second block
        pods[i] = start_pod(cluster, f"a{i}", "node-a")
        add(conf, f"a{i}", "node-a", pods[i])
    b_first = add(conf, "b0", "node-b", start_pod(cluster, "b0", "node-b"))
    assert cni("DEL", conf, "a15", "node-a", pods[15]) == (0, None)  # node-a's second block: its record free
    records = {o["metadata"]["name"]: o for o in cluster.leases() if o["metadata"]["labels"].get(L_BLOCK_OWNER)}
    assert len(records) == 3
    cluster.delete_node("node-a")

    def run():
        outcome = reconciler(cluster, grace_seconds=6)
        return {b.owner + ":" + b.action for b in outcome.blocks}

    cluster.wait(7)  # the claims are older than the grace: judged (a0's pod lives)
    assert run() == {"node-a:" + gone_nodes.NOTED, "node-a:" + gone_nodes.HELD}
    cluster.wait(4)
    assert run() == {"node-a:" + gone_nodes.WAITING, "node-a:" + gone_nodes.HELD}
    cluster.wait(3)
    assert run() == {"node-a:" + gone_nodes.RELEASED, "node-a:" + gone_nodes.HELD}
    left = {o["metadata"]["name"] for o in cluster.leases() if o["metadata"]["labels"].get(L_BLOCK_OWNER)}
    assert len(left) == 2 and cluster.holders()[a_first] == "a0/net1" and cluster.holders()[b_first] == "b0/net1"
    # a0's pod goes: its claim is freed by the liveness rule (third miss), and that run notes its block
    cluster.delete_pod(PODS, "a0")
    for _ in range(3):
        reconciler(cluster, grace_seconds=6)
        cluster.wait(3)
    assert a_first not in cluster.holders()
    assert run() == {"node-a:" + gone_nodes.WAITING}
    cluster.node("node-a")  # the Node comes back (same name): the note goes, nothing is released
    assert run() == {"node-a:" + gone_nodes.CLEARED}
    cluster.wait(7)
    assert run() == set()
    cluster.delete_node("node-a")
    assert run() == {"node-a:" + gone_nodes.NOTED}
    cluster.wait(7)
    assert run() == {"node-a:" + gone_nodes.RELEASED}
    assert [o["metadata"]["labels"][L_BLOCK_OWNER] for o in cluster.leases()
            if o["metadata"]["labels"].get(L_BLOCK_OWNER)] == ["node-b"]


# -- 5: STATUS never lists the domain --------------------------------------------------------------

def test_status_without_a_running_informer_reads_only_the_nodes_own_objects(cluster, server):
    """No daemon, or a daemon whose informer is not running: STATUS reads this node's own
    claims and blocks, never the domain's (runtimes ask it every few seconds on every node)."""
    log = getattr(server, "request_log", None)
    if log is None:
        pytest.skip("this API server keeps no request log")
    conf = netconf(cluster, "10.7.7.0/29", kube={"block_size": 8})  # one block, six addresses
    cluster.node("node-a"), cluster.node("node-b")
    for i in range(6):
        assert add(conf, f"b{i}", "node-b", start_pod(cluster, f"b{i}", "node-b")) is not None
    server.reset_counts()
    answer = cni("STATUS", conf, "s", "node-a")
    lists = [e for e in log() if e["resource"] == "leases"]
    assert lists and all(e["verb"] == "list" and "rdmanet.io/node=node-a" in e["query"]["labelSelector"]
                         for e in lists), lists
    # node-a holds nothing: by its own objects it can still acquire or borrow (its ADD reads the
    # domain and says 102 if the pool is full)
    assert answer == (0, None)
    code, err = cni("STATUS", conf, "s", "node-b")  # node-b holds them all: its own objects say so
    assert code == 1 and err["code"] == 50 and "no free address" in err["msg"], err


# -- 7: a requested address that is a free block record's ---------------------------------------

def test_a_requested_address_that_is_a_free_block_records_is_granted_by_taking_the_record(cluster):
    """node-a's block record is free (its pod's DEL): a pod on node-b that asks for that address
    gets it (the record taken by an update, the block still node-a's); asked again by another
    pod, it is refused (103) while held."""
    conf = netconf(cluster, "10.7.11.0/24")
    cluster.node("node-a"), cluster.node("node-b")
    pod = start_pod(cluster, "a0", "node-a")
    first = add(conf, "a0", "node-a", pod)
    assert cni("DEL", conf, "a0", "node-a", pod) == (0, None)
    asked = dict(conf, runtimeConfig={"ips": [f"{first}/24"]})
    code, out = cni("ADD", asked, "b0", "node-b", start_pod(cluster, "b0", "node-b"))
    assert code == 0 and out["ips"][0]["address"] == f"{first}/24", out
    [record] = [o for o in cluster.leases() if o["metadata"]["labels"].get(L_BLOCK_OWNER)]
    assert record["spec"]["holderIdentity"] == "b0/net1" and record["metadata"]["labels"][L_BLOCK_OWNER] == "node-a"
    assert record["metadata"]["labels"][L_NODE] == "node-b"
    code, out = cni("ADD", asked, "b1", "node-b", start_pod(cluster, "b1", "node-b"))
    assert code == 1 and out["code"] == 103 and "b0/net1" in out["msg"], out
