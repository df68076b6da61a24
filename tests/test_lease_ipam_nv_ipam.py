"""A NAD written for NVIDIA's nv-ipam, switched to lease-ipam by changing ``type`` (docs/lease-ipam.md,
"Coming from nv-ipam"), against the fake and a real kube-apiserver with nv-ipam's CRDs.

The seed is the NVIDIA Network Operator's IPoIB guide: ``IPPool`` ``ipoib-pool-a`` in namespace
``nvidia-network-operator`` (192.168.5.0/24, ``perNodeBlockSize`` 50, gateway 192.168.5.1), and
``ipoib-network-a``'s ``"ipam": {"type": "nv-ipam", "poolName": "ipoib-pool-a"}``. The test
plays nv-ipam's controller: it writes each node's block into the pool's ``status.allocations``.

What a user sees, in both modes (the pool's ``rdmanet.io/node-blocks`` annotation):
- ``nv-ipam`` (the default, the controller runs): pods on 3 nodes get addresses inside their own
  node's block only, the gateway in the result and never handed out, exclusions honoured; a full
  block is 102 (no borrowing); a node the controller has not served yet is told to wait (11);
- ``lease-ipam`` (nv-ipam gone): the pool's range under lease-ipam's own blocks
  (``perNodeBlockSize`` 50 -> blocks of 32) and borrowing;
- a race of 3 nodes x 40 ADDs gives no address twice; through the daemon an ADD costs one request
  (the pool read is kept), and the requests per ADD are printed for each mode.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import sys
import threading

import pytest

from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, NOT_AVAILABLE, POOL_EXHAUSTED, TRY_AGAIN_LATER
from rdmanet.ipam import nv_ipam_node_store
from rdmanet.ipam.store import pool_reader
from rdmanet.ipam.store.kube import use_watch_cache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import write_kubeconfig  # noqa: E402
from lease_nodes import call  # noqa: E402
from lease_objects import block_leases, claim_leases  # noqa: E402
from nv_ipam_objects import CIDRPOOL, IPPOOL, OPERATOR_NS, annotate, ippool_blocks, put_pool, set_allocations  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

NS = "rdmanet-system"  # the Leases' (the kubeconfig context's)
NODES = ["node-a", "node-b", "node-c"]
SEED_SPEC = {"subnet": "192.168.5.0/24", "perNodeBlockSize": 50, "gateway": "192.168.5.1"}
SEED_IPAM = {"type": "nv-ipam", "poolName": "ipoib-pool-a"}  # the guide's IPoIBNetwork ipam, as written
LEASE_IPAM = {"rdmanet.io/node-blocks": "lease-ipam"}  # the pool's owner: nv-ipam is gone


@pytest.fixture
def kubeconfig(server, tmp_path):
    return write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)


@pytest.fixture(autouse=True)
def fresh_pools():
    """What a daemon kept of pools is this test's alone."""
    pool_reader.clear()
    yield
    pool_reader.clear()


@pytest.fixture(autouse=True)
def nv_ipam_store(tmp_path, monkeypatch):
    """nv-ipam's node store file (none until a test writes it)."""
    path = tmp_path / "nv-ipam-store"
    monkeypatch.setattr(nv_ipam_node_store, "STORE_FILE", str(path))
    return path


def write_nv_ipam_store(path, *ips, released=()):
    """nv-ipam's node store as its node agent writes it: one reservation per address."""
    def entry(cid, ip, gone):
        return {"container_id": cid, "interface_name": "net1", "ip_address": ip,
                "metadata": {"pod_name": cid, "pod_namespace": "default"},
                **({"released_at": "2026-01-01T00:00:00Z"} if gone else {})}

    entries = {f"{cid}_net1": entry(cid, ip, ip in released)
               for cid, ip in ((f"nv{i}", ip) for i, ip in enumerate(ips + tuple(released)))}
    path.write_text(json.dumps({"version": 1, "checksum": 0, "pools": {
        "ipoib-pool-a": {"name": "ipoib-pool-a", "entries": entries, "last_reserved_ip": ips[-1]}}}))


@pytest.fixture
def daemon():
    """This process acts as the node daemons (watch caches; the pools kept)."""
    use_watch_cache(True, distrust_seconds=0.5, echo_budget=0.3, sync_budget=10.0)
    yield
    use_watch_cache(False)


def seed_nad(kubeconfig, **ipam):
    """ipoib-network-a with ``type`` changed to lease-ipam; ``kubernetes.kubeconfig`` says where this
    test's API server is (the DaemonSet's daemon uses its service account: the RBAC test)."""
    block = {**SEED_IPAM, "type": "lease-ipam", "kubernetes": {"kubeconfig": str(kubeconfig)}, **ipam}
    return {"cniVersion": "1.0.0", "name": "ipoib-network-a", "type": "ipoib", "master": "ibs1f0", "ipam": block}


def seed_pool(server, spec=None, annotations=None, nodes=NODES, name="ipoib-pool-a"):
    spec = {**SEED_SPEC, **(spec or {})}
    return put_pool(server, IPPOOL, OPERATOR_NS, name, spec, ippool_blocks(spec["subnet"], spec["perNodeBlockSize"], nodes),
                    annotations)


def add(conf, cid, node):
    code, out = call("ADD", conf, cid, node)
    assert code == 0, out
    return out


def address(out, i=0):
    return out["ips"][i]["address"]


def block_of(node):
    [b] = [b for b in ippool_blocks(SEED_SPEC["subnet"], 50, NODES) if b["nodeName"] == node]
    return int(ipaddress.ip_address(b["startIP"])), int(ipaddress.ip_address(b["endIP"]))


def inside(ip, node):
    lo, hi = block_of(node)
    return lo <= int(ipaddress.ip_address(ip.split("/")[0])) <= hi


def holders(server):
    return {o["metadata"]["annotations"]["rdmanet.io/ip"]: o["spec"]["holderIdentity"] for o in claim_leases(server, NS)}


def race(conf, per_node):
    """Each node ADDs ``per_node`` pods from 4 threads at once; {node: [result or error]}."""
    got = collections.defaultdict(list)
    lock = threading.Lock()

    def run(node, cids):
        for cid in cids:
            code, out = call("ADD", conf, cid, node)
            with lock:
                got[node].append(out if code == 0 else ("error", out))

    threads = [threading.Thread(target=run, args=(node, [f"{node}-p{i}" for i in range(t, per_node, 4)]))
               for node in NODES for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return got


# -- mode nv-ipam: nv-ipam's controller still runs ---------------------------------------------------

def test_the_seed_nad_attaches_pods_on_three_nodes_inside_each_nodes_nv_ipam_block(server, kubeconfig):
    seed_pool(server)
    conf = seed_nad(kubeconfig)
    got = {node: [add(conf, f"{node}-{i}", node) for i in range(3)] for node in NODES}
    for node, outs in got.items():
        for out in outs:
            [ip] = out["ips"]
            assert inside(ip["address"], node), (node, ip)
            assert ip["address"].endswith("/24") and ip["gateway"] == "192.168.5.1"
    # node-a's block holds the gateway: it is never handed out
    assert [address(o) for o in got["node-a"]] == ["192.168.5.2/24", "192.168.5.3/24", "192.168.5.4/24"]
    assert [address(o) for o in got["node-b"]] == ["192.168.5.51/24", "192.168.5.52/24", "192.168.5.53/24"]
    assert call("DEL", conf, "node-b-0", "node-b") == (0, None)
    assert "192.168.5.51" not in holders(server) and len(holders(server)) == 8
    code, out = call("CHECK", {**conf, "prevResult": got["node-c"][0]}, "node-c-0", "node-c")
    assert code == 0, out


def test_exclusions_and_per_node_exclusions_are_never_handed_out(server, kubeconfig):
    seed_pool(server, {"exclusions": [{"startIP": "192.168.5.52", "endIP": "192.168.5.60"}],
                       "perNodeExclusions": [{"startIndex": 0, "endIndex": 1}]})  # each block's first two
    conf = seed_nad(kubeconfig)
    a = [address(add(conf, f"a{i}", "node-a")) for i in range(2)]
    b = [address(add(conf, f"b{i}", "node-b")) for i in range(2)]
    assert a == ["192.168.5.3/24", "192.168.5.4/24"]  # .1 the gateway, .1-.2 the per-node exclusion
    assert b == ["192.168.5.61/24", "192.168.5.62/24"]  # .51-.52 per node, .52-.60 the pool's


@pytest.mark.parametrize("annotations", [None, LEASE_IPAM])
def test_addresses_nv_ipams_node_agent_gave_on_this_node_are_never_handed_out(server, kubeconfig, nv_ipam_store,
                                                                              annotations):
    """Pods nv-ipam served keep running after the NAD's switch: what its node store records on this
    node (a reservation in its release cooldown too) is taken, in both modes."""
    seed_pool(server, {"exclusions": [{"startIP": "192.168.5.40", "endIP": "192.168.5.200"}]}, annotations)
    write_nv_ipam_store(nv_ipam_store, "192.168.5.2", "192.168.5.3", released=("192.168.5.5",))
    conf = seed_nad(kubeconfig)
    got = [address(add(conf, f"a{i}", "node-a")) for i in range(3)]
    assert got == ["192.168.5.4/24", "192.168.5.6/24", "192.168.5.7/24"]


def test_an_unreadable_nv_ipam_node_store_hands_out_nothing(server, kubeconfig, nv_ipam_store):
    seed_pool(server)
    nv_ipam_store.write_text('{"version": 1, "pools": ')
    code, out = call("ADD", seed_nad(kubeconfig), "a0", "node-a")
    assert code == 1 and out["code"] == IO_FAILURE, out
    assert f"nv-ipam's node store {nv_ipam_store} is not JSON" in out["msg"]
    assert "remove the file once no pod on this node holds an address nv-ipam gave" in out["details"]
    assert holders(server) == {}


def test_a_full_block_is_102_and_never_borrows_from_another_nodes_block(server, kubeconfig):
    seed_pool(server, {"perNodeBlockSize": 4})  # node-a: .1-.4 (gateway .1), node-b: .5-.8
    conf = seed_nad(kubeconfig)
    assert [address(add(conf, f"a{i}", "node-a")) for i in range(3)] == [f"192.168.5.{i}/24" for i in (2, 3, 4)]
    code, out = call("ADD", conf, "a3", "node-a")
    assert code == 1 and out["code"] == POOL_EXHAUSTED, out
    assert "node-a's assigned block 192.168.5.0/24 (192.168.5.1-192.168.5.4)" in out["msg"], out
    assert "rdmanet.io/node-blocks=lease-ipam" in out["details"]
    assert sorted(holders(server)) == ["192.168.5.2", "192.168.5.3", "192.168.5.4"]  # node-b's block untouched


@pytest.mark.parametrize("through", ["in-process", "daemon"])
def test_a_node_without_a_block_waits_for_nv_ipams_controller(server, kubeconfig, request, through):
    if through == "daemon":
        request.getfixturevalue("daemon")
    seed_pool(server)
    conf = seed_nad(kubeconfig)
    add(conf, "warm", "node-a")  # a daemon keeps the pool now
    code, out = call("ADD", conf, "d0", "node-d")
    assert code == 1 and out["code"] == TRY_AGAIN_LATER, out
    assert "has no block for node node-d in status.allocations" in out["msg"]
    assert "annotate ippools.nv-ipam.nvidia.com ipoib-pool-a rdmanet.io/node-blocks=lease-ipam" in out["details"]
    assert call("STATUS", {**conf, "cniVersion": "1.1.0"}, "", "node-d")[1]["code"] == NOT_AVAILABLE
    set_allocations(server, IPPOOL, OPERATOR_NS, "ipoib-pool-a", ippool_blocks("192.168.5.0/24", 50, NODES + ["node-d"]))
    assert address(add(conf, "d0", "node-d")) == "192.168.5.151/24"  # read again at once, not after the daemon's 10 s


def test_a_node_the_pools_selector_excludes_gets_a_clear_error(server, kubeconfig):
    server.add_node("node-a", {"nvidia.com/ib": "true"})
    server.add_node("node-b", {})
    selector = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/ib", "operator": "In",
                                                             "values": ["true"]}]}]}
    for annotations in (None, LEASE_IPAM):  # in both modes
        name = "sel-" + ("lease" if annotations else "nv")
        seed_pool(server, {"nodeSelector": selector}, annotations, nodes=["node-a"], name=name)
        conf = seed_nad(kubeconfig, poolName=name)
        assert inside(address(add(conf, f"{name}-a", "node-a")), "node-a") or annotations
        code, out = call("ADD", conf, f"{name}-b", "node-b")
        assert code == 1 and out["code"] == INVALID_CONFIG, out
        assert f"node node-b is not selected by IPPool {OPERATOR_NS}/{name}'s spec.nodeSelector" in out["msg"]
        assert "matches the pool's" in out["details"]


# -- mode lease-ipam: nv-ipam is gone -----------------------------------------------------------------

def test_once_nv_ipam_is_gone_the_pool_is_the_range_of_lease_ipams_blocks(server, kubeconfig):
    seed_pool(server, {"exclusions": [{"startIP": "192.168.5.2", "endIP": "192.168.5.9"}]}, LEASE_IPAM)
    conf = seed_nad(kubeconfig)
    got = {node: [add(conf, f"{node}-{i}", node) for i in range(3)] for node in NODES}
    ips = [ipaddress.ip_address(address(o).split("/")[0]) for outs in got.values() for o in outs]
    assert len(set(ips)) == 9
    for outs in got.values():
        assert all(o["ips"][0]["gateway"] == "192.168.5.1" and address(o).endswith("/24") for o in outs)
    assert not {ipaddress.ip_address(f"192.168.5.{i}") for i in range(1, 10)} & set(ips)  # gateway, exclusions
    blocks = {o["metadata"]["labels"]["rdmanet.io/block"] for o in block_leases(server, NS)}
    assert blocks and all(b.endswith("-32") for b in blocks), blocks  # perNodeBlockSize 50 -> blocks of 32
    assert len(blocks) == 3  # one per node: nv-ipam's blocks no longer apply


def test_without_nv_ipam_a_node_borrows_when_its_blocks_are_full(server, kubeconfig):
    """The same pool that gives node-a 102 in nv-ipam's mode: lease-ipam's blocks, then borrowing."""
    seed_pool(server, {"subnet": "192.168.6.0/28", "perNodeBlockSize": 4, "gateway": "192.168.6.1"}, LEASE_IPAM)
    conf = seed_nad(kubeconfig)
    got = [address(add(conf, f"a{i}", "node-a")) for i in range(13)]  # every usable address but the gateway
    assert len(set(got)) == 13
    assert call("ADD", conf, "a13", "node-a")[1]["code"] == POOL_EXHAUSTED


def test_per_node_exclusions_are_refused_once_nv_ipams_blocks_no_longer_apply(server, kubeconfig):
    seed_pool(server, {"perNodeExclusions": [{"startIndex": 0, "endIndex": 0}]}, LEASE_IPAM)
    code, out = call("ADD", seed_nad(kubeconfig), "x", "node-a")
    assert code == 1 and out["code"] == INVALID_CONFIG, out
    assert f"IPPool {OPERATOR_NS}/ipoib-pool-a spec.perNodeExclusions" in out["msg"]
    assert "spec.exclusions" in out["details"]


def test_switching_a_pool_to_lease_ipam_keeps_every_address_once(server, kubeconfig):
    seed_pool(server)
    conf = seed_nad(kubeconfig)
    before = [address(add(conf, f"{node}-old", node)).split("/")[0] for node in NODES]
    annotate(server, IPPOOL, OPERATOR_NS, "ipoib-pool-a", LEASE_IPAM)
    after = [address(add(conf, f"{node}-new{i}", node)).split("/")[0] for node in NODES for i in range(3)]
    assert len(set(before + after)) == 12 and sorted(holders(server)) == sorted(before + after)


# -- the race and the requests per ADD ------------------------------------------------------------

@pytest.mark.parametrize("mode", ["nv-ipam", "lease-ipam"])
def test_a_race_of_three_nodes_times_forty_adds_hands_out_no_address_twice(server, kubeconfig, daemon, mode):
    seed_pool(server, annotations=LEASE_IPAM if mode == "lease-ipam" else None)
    conf = seed_nad(kubeconfig)
    got = race(conf, 40)
    errors = [o for outs in got.values() for o in outs if isinstance(o, tuple)]
    assert not errors, errors[:3]
    ips = [address(o).split("/")[0] for outs in got.values() for o in outs]
    assert len(ips) == 120 and len(set(ips)) == 120, collections.Counter(ips).most_common(3)
    assert sorted(holders(server)) == sorted(ips)
    assert "192.168.5.1" not in ips
    if mode == "nv-ipam":
        for node, outs in got.items():
            assert all(inside(address(o), node) for o in outs), node


@pytest.mark.parametrize("mode", ["nv-ipam", "lease-ipam"])
def test_an_add_through_the_daemon_costs_one_request_the_pool_read_is_kept(server, kubeconfig, daemon, mode, capsys):
    seed_pool(server, annotations=LEASE_IPAM if mode == "lease-ipam" else None)
    conf = seed_nad(kubeconfig)
    for node in NODES:
        add(conf, f"{node}-warm", node)  # the node's watch and the pool's read
    server.reset_counts()
    n = 30
    for i in range(n):
        add(conf, f"p{i}", NODES[i % 3])
    counts = server.counts()
    per_add = sum(counts.values()) / n
    with capsys.disabled():
        print(f"\n[{mode}] through the daemon: {per_add:.2f} requests per ADD: {dict(counts)}")
    assert counts.get(("get", "ippools"), 0) <= 3  # at most one per node per KEEP_SECONDS
    assert counts.get(("create", "leases"), 0) == n
    assert per_add <= 1.1, counts
    server.reset_counts()
    add(conf, "in-process", "node-a")  # for comparison: the daemon is this process, so count one verb's
    use_watch_cache(False)
    server.reset_counts()
    add(conf, "no-daemon", "node-b")
    counts = server.counts()
    with capsys.disabled():
        print(f"[{mode}] in-process: {sum(counts.values())} requests per ADD: {dict(counts)}")
    # a List of the node's Leases, the pool looked for in kube-system (404), then in the operator's
    # namespace, the create
    assert counts == {("list", "leases"): 1, ("get", "ippools"): 2, ("create", "leases"): 1}, counts


# -- CIDRPool, dual-stack, where pools are read from -------------------------------------------------

def test_a_cidrpool_gives_each_node_its_prefix_and_the_gateway_at_gateway_index(server, kubeconfig):
    spec = {"cidr": "10.50.0.0/16", "perNodeNetworkPrefix": 24, "gatewayIndex": 1,
            "exclusions": [{"startIP": "10.50.1.2", "endIP": "10.50.1.5"}],
            "perNodeExclusions": [{"startIndex": 2, "endIndex": 3}],
            "staticAllocations": [{"nodeName": "node-c", "prefix": "10.50.7.0/24", "gateway": "10.50.7.254"}],
            "routes": [{"dst": "10.60.0.0/16"}]}
    put_pool(server, CIDRPOOL, OPERATOR_NS, "cidr-a", spec,
             [{"nodeName": "node-a", "prefix": "10.50.0.0/24", "gateway": "10.50.0.1"},
              {"nodeName": "node-b", "prefix": "10.50.1.0/24", "gateway": "10.50.1.1"}])
    conf = seed_nad(kubeconfig, poolName="cidr-a", poolType="CIDRPool")  # case-insensitive, as nv-ipam
    a, b, c = (add(conf, f"{n}-0", n) for n in NODES)
    assert a["ips"] == [{"address": "10.50.0.4/24", "gateway": "10.50.0.1"}]  # .2-.3 excluded per node
    assert b["ips"] == [{"address": "10.50.1.6/24", "gateway": "10.50.1.1"}]  # .2-.5 excluded by the pool
    assert c["ips"] == [{"address": "10.50.7.1/24", "gateway": "10.50.7.254"}]  # a static allocation's gateway
    assert a["routes"] == [{"dst": "10.60.0.0/16", "gw": "10.50.0.1"}]


def test_dual_stack_pools_give_one_address_of_each(server, kubeconfig):
    seed_pool(server, name="pool-v4")
    v6 = {"subnet": "fd52:2eb5:44::/64", "perNodeBlockSize": 500, "gateway": "fd52:2eb5:44::1", "defaultGateway": True}
    put_pool(server, IPPOOL, OPERATOR_NS, "pool-v6", v6, ippool_blocks(v6["subnet"], 500, NODES))
    out = add(seed_nad(kubeconfig, poolName="pool-v4,pool-v6"), "ds", "node-b")
    assert out["ips"] == [{"address": "192.168.5.51/24", "gateway": "192.168.5.1"},
                          {"address": "fd52:2eb5:44::1f5/64", "gateway": "fd52:2eb5:44::1"}]
    assert out["routes"] == [{"dst": "::/0", "gw": "fd52:2eb5:44::1"}]


def test_pools_are_read_only_from_the_namespaces_the_node_policy_allows(server, kubeconfig):
    put_pool(server, IPPOOL, "kube-system", "sys-pool", SEED_SPEC, ippool_blocks("192.168.5.0/24", 50, NODES))
    assert inside(address(add(seed_nad(kubeconfig, poolName="sys-pool"), "k", "node-a")), "node-a")
    server.add_namespace("team-a")
    put_pool(server, IPPOOL, "team-a", "team-pool", SEED_SPEC, ippool_blocks("192.168.5.0/24", 50, NODES))
    code, out = call("ADD", seed_nad(kubeconfig, poolName="team-pool", poolNamespace="team-a"), "t", "node-a")
    assert code == 1 and out["code"] == INVALID_CONFIG, out
    assert "ipam.poolNamespace: nv-ipam pools in namespace 'team-a' are not read on this node" in out["msg"]
    assert "(poolNamespaces)" in out["details"]
    code, out = call("ADD", seed_nad(kubeconfig, poolName="team-pool"), "t", "node-a")
    assert code == 1 and out["code"] == INVALID_CONFIG, out
    assert "ipam.poolName: IPPool 'team-pool' is not in namespace kube-system, nvidia-network-operator" in out["msg"]
