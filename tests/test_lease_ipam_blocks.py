"""lease-ipam's node blocks against the fake API server over real HTTP.

What a user would see: addresses are never handed out twice, whatever the nodes believe about
their blocks (two owners after a partition, racing nodes, an API server restart mid-launch);
small ranges are usable to the last address
(borrowing); empty blocks go back after their grace period; ``rdmanet ipam ls`` shows them.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import sys
import threading
import time

import pytest

from rdmanet.cni.core.errors import POOL_EXHAUSTED, CNIError
from rdmanet.ipam.config import parse_ipam_config
from rdmanet.ipam.kube_config import kube_settings
from rdmanet.ipam.location import CLUSTER_DOMAIN
from rdmanet.ipam.store import kube_blocks, lease_cache
from rdmanet.ipam.store.base import Attachment
from rdmanet.ipam.store.kube import (
    L_DOMAIN,
    L_NODE,
    domain_hash,
    lease_name,
    use_watch_cache,
)
from rdmanet.ipam.store.block_records import free_record_body
from rdmanet.ipam.store.lease_names import L_PLANNED, block_id
from rdmanet.cli import main as cli

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import RESOURCES, write_kubeconfig  # noqa: E402
from lease_objects import block_leases, block_owner, claim_leases  # noqa: E402
from lease_informers import informer_of, wait_until  # noqa: E402
from lease_nodes import NS, add, call, store  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

DHASH = domain_hash(CLUSTER_DOMAIN)


@pytest.fixture
def kubeconfig(server, tmp_path):
    return write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)


@pytest.fixture
def daemon():
    """This process acts as node daemons (one watch cache per node it serves)."""
    use_watch_cache(True, distrust_seconds=0.5, echo_budget=0.3, sync_budget=10.0)
    yield
    use_watch_cache(False)


def netconf(kubeconfig, rng="10.0.0.0/24", **kube):
    return {"cniVersion": "1.1.0", "name": "net-a", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "range": rng, "kubernetes": {"kubeconfig": str(kubeconfig), **kube}}}


def store_add(s, conf, cid):
    try:
        [ip] = s.allocate(Attachment(cid, "net1"), "net-a", parse_ipam_config(conf).range_sets, {})
    except CNIError as err:
        assert err.code == POOL_EXHAUSTED, err.msg
        return None
    return str(ip)


def holders(server):
    """address -> holderIdentity of every claim on the server (one claim per address by construction:
    the name is the address)."""
    return {o["metadata"]["annotations"]["rdmanet.io/ip"]: o["spec"]["holderIdentity"] for o in claim_leases(server, NS)}


def usable(rng):
    net = ipaddress.ip_network(rng)
    return {str(ip) for ip in net.hosts()}


def assert_each_address_once(got, server):
    """Every successful ADD has its own address, and the server's claims say the same."""
    ips = [ip for ip in got if ip is not None]
    dup = [ip for ip, n in collections.Counter(ips).items() if n > 1]
    assert not dup, dup
    held = holders(server)
    assert sorted(held) == sorted(ips)


# -- target 4: never one address twice ----------------------------------------------------------------

def test_a_nodes_first_add_acquires_its_block_by_its_own_claim_and_the_first_address_comes_back(server, kubeconfig,
                                                                                                daemon):
    """One create per ADD: acquiring a block costs no request of its own. The node's first ADD
    creates one Lease: its claim on the block's first usable address, which is the block's
    record. A DEL of that address updates the record (the block stays held); the node's next ADD
    that reaches it takes it back by one update."""
    conf = netconf(kubeconfig, "10.9.13.0/24")
    assert add(conf, "w", "node-a") == "10.9.13.1"  # starts the node's informer: its first ADD
    server.reset_counts()
    [blk] = block_leases(server, NS)
    assert blk["metadata"]["name"] == lease_name(DHASH, ipaddress.ip_address("10.9.13.1"))
    assert block_owner(blk) == "node-a" and blk["spec"]["holderIdentity"] == "w/net1"
    inf = informer_of("node-a")
    wait_until(lambda: [b.name for b in inf.blocks()] == [blk["metadata"]["name"]], "the block in node-a's view")
    got = [add(conf, f"p{i}", "node-a") for i in range(3)]
    assert server.counts() == {("create", "leases"): 3}  # one create per ADD
    server.reset_counts()
    assert call("DEL", conf, "w", "node-a") == (0, None)
    assert server.counts() == {("update", "leases"): 1}  # the record freed, not deleted
    [blk] = block_leases(server, NS)
    assert "holderIdentity" not in blk["spec"] and "10.9.13.1" not in holders(server)
    server.reset_counts()
    rest = [add(conf, f"q{i}", "node-a") for i in range(16)]  # round-robin over the block reaches 10.9.13.1
    assert "10.9.13.1" in rest
    # 15 creates and the update: no List, no block create
    assert server.counts() == {("create", "leases"): 15, ("update", "leases"): 1}
    [blk] = [b for b in block_leases(server, NS) if b["metadata"]["name"].endswith("-10.9.13.1")]
    assert block_owner(blk) == "node-a" and blk["spec"]["holderIdentity"].startswith("q")
    assert_each_address_once(got + rest, server)


def test_a_borrower_takes_a_free_record_by_update_and_frees_it_the_same_way(server, kubeconfig):
    """The pool is usable to its last address: when node-a's block record is free and no block is
    left, node-b borrows that address by updating the record (it stays node-a's block), and its
    DEL frees it by an update again; nothing is deleted, nothing handed out twice."""
    conf = netconf(kubeconfig, "10.9.16.0/28")  # one block of 16 (14 usable)
    a, b = store(kubeconfig, "node-a", conf), store(kubeconfig, "node-b", conf)
    assert store_add(a, conf, "a0") == "10.9.16.1"  # node-a's block record
    assert [store_add(a, conf, f"a{i}") for i in range(1, 4)] == ["10.9.16.2", "10.9.16.3", "10.9.16.4"]
    assert a.release(Attachment("a0", "net1")) == [ipaddress.ip_address("10.9.16.1")]
    got = [store_add(b, conf, f"b{i}") for i in range(11)]  # node-b borrows all that is left
    assert "10.9.16.1" in got and None not in got
    assert store_add(b, conf, "late") is None
    [blk] = block_leases(server, NS)
    taker = blk["spec"]["holderIdentity"].split("/")[0]
    assert block_owner(blk) == "node-a" and taker.startswith("b")
    assert_each_address_once(got + ["10.9.16.2", "10.9.16.3", "10.9.16.4"], server)
    server.reset_counts()
    assert b.release(Attachment(taker, "net1")) == [ipaddress.ip_address("10.9.16.1")]
    assert server.counts() == {("list", "leases"): 1, ("update", "leases"): 1}
    [blk] = block_leases(server, NS)
    assert block_owner(blk) == "node-a" and "holderIdentity" not in blk["spec"]
    assert "10.9.16.1" not in holders(server)


def test_a_block_record_deleted_by_a_gc_costs_its_owner_only_the_block(server, kubeconfig, daemon):
    """The reconciler frees the claim of a gone pod: when that claim is a block's record the
    block goes with it. Its owner's daemon then treats the block as lost (no longer in its view),
    keeps its other claims there, and acquires another block when it needs one; another node can
    acquire the lost block, and the per-address creates keep every address once."""
    conf = netconf(kubeconfig, "10.9.14.0/24")
    assert add(conf, "gone", "node-a") == "10.9.14.1"  # the record
    mine = [add(conf, f"a{i}", "node-a") for i in range(3)]
    name = lease_name(DHASH, ipaddress.ip_address("10.9.14.1"))
    assert server.api_delete(RESOURCES["leases"], NS, name, None, False)[0] == 200  # as the reconciler does
    inf = informer_of("node-a")
    wait_until(lambda: inf.blocks() == [], "node-a's view to lose the block")
    b = store(kubeconfig, "node-b", conf)
    got_b = [store_add(b, conf, f"b{i}") for i in range(3)]
    more = [add(conf, f"a{i}", "node-a") for i in range(3, 20)]
    assert_each_address_once(mine + got_b + more, server)
    owners = collections.Counter(block_owner(o) for o in block_leases(server, NS))
    assert owners["node-a"] >= 1 and owners["node-b"] >= 1


def test_an_acquisition_that_meets_a_claim_on_a_first_address_takes_another_block(server, kubeconfig, daemon):
    """A 409 on a record's create means taken, whoever holds the name (another node's record or a
    borrower's claim of that address): the node tries the next block."""
    conf = netconf(kubeconfig, "10.9.15.0/24")
    firsts = {f"10.9.15.{16 * k + (1 if k == 0 else 0)}" for k in range(16)}
    for k, ip in enumerate(sorted(firsts, key=ipaddress.ip_address)):
        if k % 2 == 0 and k < 8:  # four blocks' first addresses claimed by a borrower on node-z
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": lease_name(DHASH, ipaddress.ip_address(ip)), "namespace": NS,
                                 "labels": {L_DOMAIN: DHASH, L_NODE: "node-z"},
                                 "annotations": {"rdmanet.io/ip": ip}},
                    "spec": {"holderIdentity": f"z-{k}/net1"}}
            assert server.api_create(RESOURCES["leases"], NS, body, False)[0] == 201
    got = [add(conf, f"n{n}-0", f"node-{n}") for n in range(6)]
    assert None not in got and set(got) <= firsts  # each node's first ADD is the record of a block of its own
    assert_each_address_once(got + [ip for ip, h in holders(server).items() if h.startswith("z-")], server)
    assert all(block_owner(o) for o in block_leases(server, NS))
    assert len(block_leases(server, NS)) == 6  # each node holds one block, none where the borrower claimed
    assert not {o["metadata"]["name"] for o in block_leases(server, NS)} & {
        lease_name(DHASH, ipaddress.ip_address(ip)) for ip, h in holders(server).items() if h.startswith("z-")}


def test_two_nodes_that_both_own_one_block_never_hand_out_an_address_twice(server, kubeconfig, daemon):
    """A partition: node-a's daemon holds the /28's one block and its watch stalls (it keeps
    believing the block is its own); meanwhile the block's record goes (deleted as a GC would,
    with the claim it carried) and node-b acquires the same block. Both fill it at once: the
    per-address create is the only arbiter."""
    conf = netconf(kubeconfig, "10.9.0.0/28")  # 14 addresses, one block of 16
    assert add(conf, "a-0", "node-a") == "10.9.0.1"  # the block's record is the claim of its first address
    [blk] = block_leases(server, NS)
    assert block_owner(blk) == "node-a" and blk["spec"]["holderIdentity"] == "a-0/net1"
    server.pause_watches()  # node-a's view stands still
    name = blk["metadata"]["name"]
    assert server.api_delete(RESOURCES["leases"], NS, name, None, False)[0] == 200  # as another party would
    b = store(kubeconfig, "node-b", conf)
    first_b = store_add(b, conf, "b-0")
    [blk_b] = block_leases(server, NS)
    assert blk_b["metadata"]["name"] == name and block_owner(blk_b) == "node-b"  # the same block
    assert first_b == "10.9.0.1"
    [inf] = [i for i in lease_cache.informers() if "node-a" in i.name]
    assert [x.name for x in inf.blocks()] == [name]  # node-a still believes it owns it

    got = {"a": [], "b": [first_b]}
    start = threading.Barrier(4)
    a_served = threading.Event()  # node-b waits for node-a's first address: both then fill the block at once

    def node_a(k):
        start.wait()
        for i in range(8):
            got["a"].append(add(conf, f"a-{k}-{i}", "node-a"))
            a_served.set()

    def node_b(k):
        mine = store(kubeconfig, "node-b", conf)
        start.wait()
        assert a_served.wait(60), "node-a's first ADD did not answer"
        for i in range(8):
            got["b"].append(store_add(mine, conf, f"b-{k}-{i}"))

    threads = [threading.Thread(target=f, args=(k,)) for f in (node_a, node_b) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.resume_watches()
    every = got["a"] + got["b"]
    assert_each_address_once(every, server)
    assert len([ip for ip in every if ip]) == 14  # the block is used to its last address, each once
    assert {h.split("-")[0] for h in holders(server).values()} == {"a", "b"}  # both served from it


def test_nodes_racing_for_a_small_range_get_distinct_addresses_to_the_last_one(server, kubeconfig):
    """6 nodes x 3 threads (in-process stores, no daemon) race for a /26 of 4 blocks: 62 ADDs
    succeed with 62 distinct addresses, every later one is told the pool is exhausted."""
    conf = netconf(kubeconfig, "10.9.1.0/26")
    got, start = [], threading.Barrier(18)
    lock = threading.Lock()

    def worker(node, k):
        s = store(kubeconfig, node, conf)
        start.wait()
        for i in range(5):
            ip = store_add(s, conf, f"{node}-{k}-{i}")
            with lock:
                got.append(ip)

    threads = [threading.Thread(target=worker, args=(f"node-{n}", k)) for n in range(6) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ok = [ip for ip in got if ip]
    assert len(ok) == 62 and set(ok) == usable("10.9.1.0/26")
    assert_each_address_once(got, server)
    assert len(block_leases(server, NS)) == 4  # each block held by one node, the other nodes borrowed


def test_an_api_server_restart_mid_launch_loses_nothing_and_duplicates_nothing(server, kubeconfig, daemon):
    """3 node daemons launch 20 pods each; halfway the API server restarts (every watch breaks;
    one behind the restarted server's newest resourceVersion meets 410 and re-Lists, one at it
    goes on) and answers a few requests 503. Every ADD succeeds once, with its own address; the
    informers re-List their node's objects only, and hold nothing of the other nodes."""
    conf = netconf(kubeconfig, "10.9.2.0/24")
    for n in range(3):
        assert add(conf, f"warm-{n}", f"node-{n}") is not None
    got, lock = {}, threading.Lock()
    halfway = threading.Barrier(4)

    def node(n):
        for i in range(20):
            if i == 10:
                halfway.wait()
            ip = add(conf, f"n{n}-{i}", f"node-{n}")
            with lock:
                got[f"n{n}-{i}"] = ip

    threads = [threading.Thread(target=node, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    halfway.wait()
    assert server.restart_watches() >= 3
    server.fail_next(4, status=503)
    for t in threads:
        t.join()
    assert None not in got.values() and len(set(got.values())) == 60
    assert_each_address_once(list(got.values()) + [ip for ip, h in holders(server).items() if h.startswith("warm-")],
                             server)
    infs = [i for i in lease_cache.informers() if "node-" in i.name]
    assert len(infs) == 3
    deadline = time.monotonic() + 10
    # each watch was broken and re-opened (a re-List where its history was gone: 410)
    while not all(i.stats["watches"] >= 2 and i.usable() for i in infs):
        assert time.monotonic() < deadline, [i.stats for i in infs]
        time.sleep(0.05)
    for i in infs:  # each informer holds its node's claims and blocks, nothing of the other nodes
        node_label = i.selector.split(f"{L_NODE}=")[1]
        with i._cond:
            names = set(i._entries)
        mine = {o["metadata"]["name"] for o in server.objects("leases", NS)
                if o["metadata"]["labels"].get(L_NODE) == node_label}
        assert names == mine
    for cid, ip in got.items():
        assert call("DEL", conf, cid, f"node-{cid[1]}") == (0, None)
    assert sorted(h for h in holders(server).values()) == ["warm-0/net1", "warm-1/net1", "warm-2/net1"]


def test_a_409_on_another_nodes_record_is_not_kept_past_the_watch_it_was_met_in(server, kubeconfig, daemon):
    """node-b's first ADD meets node-a's block record (409: taken, by whom node-b's node-scoped
    watch will never tell) and borrows. The API server restarts; node-b's watch, whose
    resourceVersion was the newest, may go on without a 410 (no re-List). Once it has re-opened,
    node-b's view holds node-b's objects only: the 409 is not kept as a Lease its watch
    cannot deliver, which would stay taken in node-b's view after node-a freed it."""
    conf = netconf(kubeconfig, "10.9.17.0/28")  # one block of 16: node-a's
    assert add(conf, "a0", "node-a") == "10.9.17.1"
    assert add(conf, "b0", "node-b") not in (None, "10.9.17.1")  # borrowed
    inf = informer_of("node-b")
    record = lease_name(DHASH, ipaddress.ip_address("10.9.17.1"))
    assert record in inf._entries  # (what the 409 told)
    watches = inf.stats["watches"]
    server.restart_watches()
    wait_until(lambda: inf.stats["watches"] > watches and inf.usable(), "node-b's watch to re-open",
               timeout=60)  # (its retries back off while a real server restarts)
    with inf._cond:
        names = set(inf._entries)
    assert names == {o["metadata"]["name"] for o in server.objects("leases", NS)
                     if o["metadata"]["labels"].get(L_NODE) == "node-b"}


# -- target 5: small networks -------------------------------------------------------------------------

@pytest.mark.fake_only("it makes thousands of Leases: about a minute a run on the real server, beyond the suite's "
                       "budget; test_kube_real_race.py makes 1,000 claims there")
def test_a_24_shared_by_64_nodes_is_usable_to_the_last_address(server, kubeconfig):
    """16 blocks for 64 nodes: 48 nodes never get a block and borrow; all 254 addresses are
    handed out once, then every node is told the pool is exhausted."""
    conf = netconf(kubeconfig, "10.9.4.0/24")
    stores = [store(kubeconfig, f"node-{n:02d}", conf) for n in range(64)]
    got = [store_add(s, conf, f"{s.node}-{i}") for i in range(4) for s in stores]
    ok = [ip for ip in got if ip]
    assert len(ok) == 254 and set(ok) == usable("10.9.4.0/24")
    assert got.count(None) == 2
    assert_each_address_once(got, server)
    owners = collections.Counter(block_owner(o) for o in block_leases(server, NS))
    assert sum(owners.values()) == 16
    borrowed = [o for o in claim_leases(server, NS) if o["metadata"]["labels"][L_NODE] not in owners]
    assert len(borrowed) >= 254 - 16 * 16 + 48  # every node without a block got its addresses by borrowing
    assert store_add(stores[5], conf, "late") is None


def test_a_28_is_usable_to_the_last_address_by_two_nodes(server, kubeconfig):
    conf = netconf(kubeconfig, "10.9.5.0/28")
    a, b = store(kubeconfig, "node-a", conf), store(kubeconfig, "node-b", conf)
    got = [store_add(s, conf, f"{s.node}-{i}") for i in range(8) for s in (a, b)]
    assert set(ip for ip in got if ip) == usable("10.9.5.0/28")
    assert got.count(None) == 2
    assert_each_address_once(got, server)
    [blk] = block_leases(server, NS)  # one block of 16 (the /28): one owner, the other node borrowed
    assert blk["metadata"]["labels"]["rdmanet.io/block-owner"] == "node-a" and "rdmanet.io/kind" not in blk["metadata"]["labels"]


def test_a_64_gives_each_node_its_own_block(server, kubeconfig):
    conf = netconf(kubeconfig, "fd09::/64")
    got = {}
    for node in ("node-a", "node-b", "node-c"):
        s = store(kubeconfig, node, conf)
        got[node] = [ipaddress.ip_address(store_add(s, conf, f"{node}-{i}")) for i in range(3)]
    blocks = {block_owner(o): o for o in block_leases(server, NS)}
    assert sorted(blocks) == ["node-a", "node-b", "node-c"]
    for node, ips in got.items():
        name = blocks[node]["metadata"]["labels"]["rdmanet.io/block"]
        first = int(name.split("-")[0], 16)
        assert all(first <= int(ip) < first + 64 for ip in ips), (node, ips, name)  # in its own block of 64
    assert_each_address_once([str(ip) for ips in got.values() for ip in ips], server)


# -- target 6: freed capacity returns -------------------------------------------------------------------

def test_an_empty_block_is_released_after_its_grace_by_the_daemon(server, kubeconfig, daemon):
    conf = netconf(kubeconfig, "10.9.6.0/24", block_release_seconds=0.5)
    assert add(conf, "a", "node-a") is not None
    assert len(block_leases(server, NS)) == 1
    assert call("DEL", conf, "a", "node-a") == (0, None)
    assert len(block_leases(server, NS)) == 1  # just emptied: kept for its grace (a new pod may come)
    time.sleep(0.6)
    assert call("DEL", conf, "a", "node-a") == (0, None)  # any later DEL releases it
    assert block_leases(server, NS) == [] and claim_leases(server, NS) == []


def test_cni_gc_frees_claims_of_gone_attachments_and_releases_empty_blocks(server, kubeconfig):
    conf = netconf(kubeconfig, "10.9.7.0/24", block_release_seconds=0)
    s = store(kubeconfig, "node-a", conf, gc_grace=0)
    kept = store_add(s, conf, "kept")
    store_add(s, conf, "gone")
    assert len(block_leases(server, NS)) == 1
    freed = s.gc("net-a", {Attachment("kept", "net1")})
    assert [r.attachment.container_id for r in freed] == ["gone"]
    assert list(holders(server)) == [kept] and len(block_leases(server, NS)) == 1  # still holds "kept"
    s.gc("net-a", set())
    assert holders(server) == {} and block_leases(server, NS) == []


def reconcile_actions(kubeconfig, conf, capsys) -> dict:
    """containerID -> what `rdmanet ipam reconcile` (no grace, one miss) did with its claim."""
    conf_file = os.path.join(os.path.dirname(kubeconfig), "net.json")
    with open(conf_file, "w") as f:
        json.dump(conf, f)
    assert cli.main(["ipam", "reconcile", "--network-config", conf_file, "--grace-seconds", "0", "--misses", "1",
                     "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return {c["containerID"]: c["action"] for c in doc["claims"]}


def test_the_reconciler_frees_claims_by_pod_uid_and_leaves_blocks_alone(server, kubeconfig, capsys):
    conf = netconf(kubeconfig, "10.9.8.0/24")
    uid = server.add_pod("default", "live", uid="uid-live")["metadata"]["uid"]  # a real server sets its own
    assert add(conf, "live", "node-a", uid) is not None
    assert add(conf, "gone", "node-a") is not None
    assert reconcile_actions(kubeconfig, conf, capsys) == {"live": "kept", "gone": "freed"}
    assert list(holders(server).values()) == ["live/net1"]
    assert len(block_leases(server, NS)) == 1


def test_the_reconciler_frees_a_block_records_address_and_the_node_keeps_its_block(server, kubeconfig, capsys):
    """The gone pod's claim is its node's block record: the reconciler frees the address by an
    update (as the node's DEL does), so the block stays held and the node's next ADD in it is one
    request; a live pod's claim in the block is untouched."""
    conf = netconf(kubeconfig, "10.9.17.0/24")
    uid = server.add_pod("default", "live", uid="uid-live")["metadata"]["uid"]
    assert add(conf, "gone", "node-a") == "10.9.17.1"  # the record
    live = add(conf, "live", "node-a", uid)
    assert reconcile_actions(kubeconfig, conf, capsys) == {"live": "kept", "gone": "freed"}
    assert holders(server) == {live: "live/net1"}
    [blk] = block_leases(server, NS)
    assert block_owner(blk) == "node-a" and "holderIdentity" not in blk["spec"]
    assert "rdmanet.io/pod-uid" not in blk["metadata"]["labels"]
    server.reset_counts()
    s = store(kubeconfig, "node-a", conf)
    got = [store_add(s, conf, f"n{i}") for i in range(15)]  # the block's 14 free addresses, then the next block
    assert "10.9.17.1" in got and got[-1] == "10.9.17.16"  # 10.9.17.16: the record of the block after it
    c = server.counts()
    assert c == {("list", "leases"): 15, ("create", "leases"): 14, ("update", "leases"): 1}, c
    assert sorted(block_owner(o) for o in block_leases(server, NS)) == ["node-a", "node-a"]
    assert_each_address_once(got + [live], server)


def test_ipam_ls_shows_blocks_their_nodes_and_their_fill(server, kubeconfig, capsys):
    conf = netconf(kubeconfig, "10.9.9.0/28")
    a, b = store(kubeconfig, "node-a", conf), store(kubeconfig, "node-b", conf)
    for i in range(3):
        store_add(a, conf, f"a{i}")
    store_add(b, conf, "b0")  # no free block: node-b borrows in node-a's
    conf_file = os.path.join(os.path.dirname(kubeconfig), "net.json")
    with open(conf_file, "w") as f:
        json.dump(conf, f)
    assert cli.main(["ipam", "ls", "--network-config", conf_file, "-o", "json"]) == 0
    [net] = json.loads(capsys.readouterr().out)["networks"]
    [blk] = net["blocks"]
    assert (blk["block"], blk["first"], blk["last"], blk["size"], blk["node"], blk["used"], blk["borrowed"]) == \
        ("10.9.9.0-16", "10.9.9.0", "10.9.9.15", 16, "node-a", 4, 1)
    assert len(net["claims"]) == 4
    assert cli.main(["ipam", "ls", "--network-config", conf_file]) == 0
    out = capsys.readouterr().out
    assert "BLOCK" in out and "10.9.9.0-10.9.9.15" in out and "4/16" in out


def test_status_in_the_daemon_never_lists_the_domain_until_an_add_found_it_full(server, kubeconfig, daemon):
    """Runtimes ask STATUS every few seconds on every node: a daemon answers from its view, also
    when its blocks are full (it can acquire or borrow); after one of its ADDs found the range
    exhausted (that ADD read the domain) STATUS says 50, still without a List."""
    conf = netconf(kubeconfig, "10.9.10.0/29")  # 6 addresses, one block of 8
    b = store(kubeconfig, "node-b", conf)
    assert add(conf, "a0", "node-a") is not None  # node-a holds the block
    got = [store_add(b, conf, f"b{i}") for i in range(5)]  # node-b borrows the rest
    assert None not in got
    server.reset_counts()
    assert call("STATUS", conf, "s", "node-a") == (0, None)  # node-a's view: not full
    assert server.count("list", "leases") == 0
    assert add(conf, "a1", "node-a") is None  # full: said after reading the domain
    server.reset_counts()
    code, err = call("STATUS", conf, "s", "node-a")
    assert code == 1 and err["code"] == 50, err
    assert server.count("list", "leases") == 0


def test_the_node_gc_releases_a_block_left_empty_by_the_nodes_last_del(server, kubeconfig, daemon):
    """The DEL that emptied a block was the node's last call: the daemon's node GC gives the
    block back once two of its runs, ``grace`` apart, found it empty; a block holding a claim
    stays, and another node's block is never touched."""
    from rdmanet.ipam import node_gc
    from rdmanet.ipam.reconcile import KubeTarget

    conf = netconf(kubeconfig, "10.9.11.0/24")
    assert add(conf, "a", "node-a") is not None
    assert call("DEL", conf, "a", "node-a") == (0, None)
    assert store_add(store(kubeconfig, "node-b", conf), conf, "b") is not None
    target = KubeTarget.for_settings(kube_settings(conf), node="node-a")
    assert node_gc.release_blocks(target, "node-a", grace=60, now=1000.0) == []  # first seen empty
    assert len(block_leases(server, NS)) == 2
    [gone] = node_gc.release_blocks(target, "node-a", grace=60, now=1061.0)
    assert gone.node == "node-a"
    assert [block_owner(o) for o in block_leases(server, NS)] == ["node-b"]
    target_b = KubeTarget.for_settings(kube_settings(conf), node="node-b")
    assert node_gc.release_blocks(target_b, "node-b", grace=0, now=2000.0) == []  # b's claim keeps it
    assert len(block_leases(server, NS)) == 1


# -- blocks a plan gave a node (`rdmanet ipam plan`): used at one request per ADD, kept while empty --

def plan_blocks(server, conf, node, firsts):
    """What a plan writes: a free record labelled planned for each block (first address) given."""
    [rs] = parse_ipam_config(conf).range_sets
    [r] = rs.ranges
    size = kube_settings(conf).block_size
    for first in firsts:
        ip = ipaddress.ip_address(first)
        body = free_record_body(NS, CLUSTER_DOMAIN, ip, block_id(ip, size), str(r.subnet), node, planned=True)
        # the record's address is the block's first usable one: here the block's first (not the network address)
        assert server.api_create(RESOURCES["leases"], NS, body, False)[0] == 201


def planned(server):
    return sorted(o["metadata"]["name"].rsplit("-", 1)[1] for o in block_leases(server, NS)
                  if (o["metadata"].get("labels") or {}).get(L_PLANNED) == "true")


def test_a_node_fills_the_blocks_a_plan_gave_it_at_one_request_per_add_and_keeps_them_empty(server, kubeconfig,
                                                                                             daemon):
    conf = netconf(kubeconfig, "10.9.40.0/24", block_size=4, block_release_seconds=0)
    plan_blocks(server, conf, "node-a", ["10.9.40.4", "10.9.40.8"])
    first = add(conf, "first", "node-a")  # starts node-a's informer
    inf = informer_of("node-a")
    wait_until(lambda: len(inf.blocks()) == 2, "both planned blocks in node-a's view")
    server.reset_counts()
    got = [add(conf, f"p{i}", "node-a") for i in range(7)]
    # the 8 addresses of its two planned blocks, one request each: a create, or the update of a
    # planned record whose address it takes; no List, no 409, no block acquired
    assert sorted([first, *got], key=ipaddress.ip_address) == [f"10.9.40.{i}" for i in range(4, 12)]
    counts = server.counts()
    assert set(counts) <= {("create", "leases"), ("update", "leases")} and sum(counts.values()) == 7, counts
    assert planned(server) == ["10.9.40.4", "10.9.40.8"]  # taking a planned record's address keeps it planned
    # every pod goes: the blocks stay node-a's (block_release_seconds is 0: an unplanned empty
    # block would go with the DEL that emptied it)
    for cid in ["first", *[f"p{i}" for i in range(7)]]:
        assert call("DEL", conf, cid, "node-a") == (0, None)
    assert call("DEL", conf, "first", "node-a") == (0, None)  # a later DEL releases empty blocks: not these
    assert planned(server) == ["10.9.40.4", "10.9.40.8"]
    assert all(block_owner(o) == "node-a" and "holderIdentity" not in o["spec"] for o in block_leases(server, NS))


def test_cni_gc_and_the_node_gc_release_an_empty_acquired_block_but_never_a_planned_one(server, kubeconfig):
    from rdmanet.ipam import node_gc
    from rdmanet.ipam.reconcile import KubeTarget

    conf = netconf(kubeconfig, "10.9.41.0/24", block_size=4, block_release_seconds=0)
    plan_blocks(server, conf, "node-a", ["10.9.41.4"])
    s = store(kubeconfig, "node-a", conf, gc_grace=0)
    # its own block first: the planned one; then one it acquires itself once that is full
    got = [str(ip) for ip in (s.allocate(Attachment(f"c{i}", "net1"), "net-a", parse_ipam_config(conf).range_sets, {})[0]
                              for i in range(5))]
    assert sorted(got[:4]) == [f"10.9.41.{i}" for i in range(4, 8)] and got[4] not in got[:4]
    assert len(block_leases(server, NS)) == 2
    s.gc("net-a", set())  # every attachment gone: claims freed, the acquired block released
    assert planned(server) == ["10.9.41.4"] and len(block_leases(server, NS)) == 1
    target = KubeTarget.for_settings(kube_settings(conf), node="node-a")
    assert node_gc.release_blocks(target, "node-a", grace=0, now=1000.0) == []
    assert node_gc.release_blocks(target, "node-a", grace=0, now=2000.0) == []
    assert planned(server) == ["10.9.41.4"]


def fill_blocks(server, filler, rs, wanted, size=4):
    """Claim, as node ``filler``'s (its block records included), address ``k`` of each block ``j``
    of the single-range set ``rs`` (first address ``first``) for which ``wanted(j, first, k)``."""
    [r] = rs.ranges
    for j in range(filler.blocks._block_count(rs)):
        first = filler.blocks._position(rs, j)[1]
        for k in range(size):
            value = first + k
            if not r.start <= value <= r.end or not wanted(j, first, k):
                continue
            ip = r.address(value)
            body = filler.leases.body(ip, Attachment(f"full-{value}", "net1"), "net-a", rs)
            if ip == filler.blocks._record_ip(r, first):
                body = filler.leases._record_body(body, filler.node, r, first)
            assert server.api_create(RESOURCES["leases"], NS, body, False)[0] == 201


@pytest.mark.fake_only("it makes thousands of Leases: about a minute a run on the real server, beyond the suite's "
                       "budget; test_kube_real_race.py makes 1,000 claims there")
@pytest.mark.parametrize("records_read", [True, False], ids=["records-read", "no-records-read"])
def test_a_node_whose_acquisition_gave_up_takes_a_block_the_domain_read_shows_free(server, kubeconfig, monkeypatch,
                                                                                    records_read):
    """An acquisition tries a few hashed blocks and at most a few groups of records, then reads
    every block record of the domain (a range set of at most ``RECORD_SCAN_BLOCKS`` blocks) and
    acquires a block that read shows free. Without that read (a larger range set: here the limit
    is set to 0), it borrows, and a borrower that finds the blocks it reads full reads the whole
    domain's claims; that read too shows every block, and the ADD acquires one that is still
    free (the node's own block from then on, its next ADDs cost one create each) instead of
    borrowing an address in it as a plain claim. Here 31 of a /19's 32 groups of blocks are held
    and full, and the node is one whose hashed acquisition and borrowing orders meet only those."""
    if not records_read:
        monkeypatch.setattr(kube_blocks, "RECORD_SCAN_BLOCKS", 0)
    borrowed_blocks = kube_blocks.BORROW_BLOCKS  # the blocks a borrower reads before the domain's claims
    wide = kube_blocks.WIDE_GROUPS  # groups one List of a crowded pool reads
    lists = -(-kube_blocks.GROUPS_READ // wide)  # Lists one acquisition makes before the read of every record
    conf = netconf(kubeconfig, "10.9.32.0/19", block_size=4)  # 2,048 blocks of 4: 32 groups of 64
    [rs] = parse_ipam_config(conf).range_sets
    filler = store(kubeconfig, "node-full", conf)
    total = filler.blocks._block_count(rs)
    group_of = {}
    for j in range(total):
        group_of[j] = filler.blocks._position(rs, j)[1] // (4 * 64)

    def order(s):  # the groups an acquisition of node s looks at: two hashed probes (two 409s: the
        # pool looks crowded), then Lists of `wide` adjacent groups each, GROUPS_READ groups or more in all
        seen = [group_of[s.blocks._probe(rs, i) % total] for i in range(2)]
        spans = []
        for i in range(2, 64):
            span = group_of[s.blocks._probe(rs, i) % total] // wide
            if span not in spans:
                spans.append(span)
        return seen + [g for span in spans[:lists] for g in range(wide * span, wide * span + wide)]

    free_group = None
    for n in range(200):
        s = store(kubeconfig, f"node-{n}", conf)
        groups = order(s)
        left = sorted(set(group_of.values()) - set(groups)
                      - {group_of[s.blocks._probe(rs, i, "borrow") % total] for i in range(borrowed_blocks)})
        if left:
            node, free_group, candidate = f"node-{n}", left[0], s
            break
    assert free_group is not None
    # Every block outside the free group: held by node-full's record and full of its claims.
    fill_blocks(server, filler, rs, lambda j, first, k: group_of[j] != free_group)
    got = store_add(candidate, conf, "c0")
    assert got is not None and int(ipaddress.ip_address(got)) // (4 * 64) == free_group
    lease = next(o for o in server.objects("leases", NS) if o["metadata"]["annotations"]["rdmanet.io/ip"] == got)
    assert block_owner(lease) == node, "the ADD borrowed instead of acquiring a block the domain read showed free"
    following = store_add(candidate, conf, "c1")  # its next ADD: in its own block
    assert following is not None and int(ipaddress.ip_address(following)) // 4 == int(ipaddress.ip_address(got)) // 4


def hold_every_block_but(server, kubeconfig, conf, free):
    """Every block of ``conf``'s range but those starting at the addresses ``free`` held by
    node-full (its record: the claim of the block's first usable address)."""
    [rs] = parse_ipam_config(conf).range_sets
    [r] = rs.ranges
    filler = store(kubeconfig, "node-full", conf)
    for j in range(filler.blocks._block_count(rs)):
        first = filler.blocks._position(rs, j)[1]
        if r.address(first) in free:
            continue
        ip = filler.blocks._record_ip(r, first)
        body = filler.leases._record_body(filler.leases.body(ip, Attachment(f"full-{first}", "net1"), "net-a", rs), "node-full", r, first)
        assert server.api_create(RESOURCES["leases"], NS, body, False)[0] == 201


def hashed_blocks(kubeconfig, conf, node, n):
    """The first addresses of the first ``n`` blocks of ``node``'s hashed acquisition order."""
    s = store(kubeconfig, node, conf)
    [rs] = parse_ipam_config(conf).range_sets
    total = s.blocks._block_count(rs)
    return [rs.ranges[0].address(s.blocks._position(rs, s.blocks._probe(rs, i) % total)[1]) for i in range(n)]


def test_a_daemon_finds_the_free_blocks_of_a_crowded_range_with_one_read_and_uses_them_one_by_one(
        server, kubeconfig, daemon):
    """One create per ADD near a full pool: when a daemon's probes and group Lists meet only held
    blocks, it reads where the free blocks are once (the domain's block records, not its claims)
    and remembers what it saw: its next acquisitions create their records at those blocks
    directly, so every later ADD costs one create (no probe meeting a 409, no List). Here 1,016
    of a /20's 1,024 blocks of 4 are held; the 8 free ones are every other block of one group,
    so the block after a node's newest one is never free."""
    conf = netconf(kubeconfig, "10.9.32.0/20", block_size=4)
    free = {ipaddress.ip_address("10.9.37.0") + 8 * k for k in range(8)}
    hold_every_block_but(server, kubeconfig, conf, free)
    group = ipaddress.ip_network("10.9.37.0/24")  # the free blocks' group
    node = next(n for n in (f"node-{k}" for k in range(100))  # one whose hashed probes and groups miss it
                if not any(ip in group for ip in hashed_blocks(kubeconfig, conf, n, 32)))
    assert call("DEL", conf, "nothing", node) == (0, None)  # the daemon starts its informer
    inf = informer_of(node)
    wait_until(inf.usable, f"{node}'s informer to sync")
    log_from = len(server.request_log())
    first = add(conf, "x0", node)
    assert first is not None and ipaddress.ip_address(first) in free
    selectors = [e["query"].get("labelSelector", "") for e in server.request_log()[log_from:]
                 if e["verb"] == "list"]
    claims_read = [s for s in selectors if "rdmanet.io/node=" not in s and "block" not in s]
    assert not claims_read, f"the ADD read the domain's claims to find a free block: {selectors}"
    wait_until(lambda: len(inf.blocks()) == 1, f"{node}'s block in its view")
    server.reset_counts()
    rest = [add(conf, f"x{i}", node) for i in range(1, 32)]
    assert server.counts() == {("create", "leases"): 31}, "an acquisition met a 409 or Listed"
    got = {ipaddress.ip_address(ip) for ip in [first, *rest]}
    assert got == {f + k for f in free for k in range(4)}  # the 8 free blocks, all of them the node's
    assert sorted(block_owner(o) for o in block_leases(server, NS) if block_owner(o) != "node-full") == [node] * 8
    borrowed = add(conf, "x32", node)  # no block left: it borrows an address of a held block
    assert borrowed is not None and ipaddress.ip_address(borrowed) not in got


def test_a_borrower_near_a_full_pool_reads_eight_blocks_per_list(server, kubeconfig):
    """Every block of a /22 (256 blocks of 4) is held and full but one, which has one free address
    and lies sixth in the borrower's hashed borrowing order: the ADD gets that address after one
    List of eight blocks' claims (``rdmanet.io/block in (...)``), not six Lists of one block each,
    and never reads the domain's claims."""
    conf = netconf(kubeconfig, "10.9.40.0/22", block_size=4)
    [rs] = parse_ipam_config(conf).range_sets
    [r] = rs.ranges
    filler = store(kubeconfig, "node-full", conf)
    borrower = store(kubeconfig, "node-b", conf)
    total = filler.blocks._block_count(rs)
    order = []
    for i in range(64):
        first = borrower.blocks._position(rs, borrower.blocks._probe(rs, i, "borrow") % total)[1]
        if first not in order:
            order.append(first)
    spare = order[5]  # the only block with a free address: its last one
    fill_blocks(server, filler, rs, lambda j, first, k: not (first == spare and k == 3))
    server.reset_counts()
    got = store_add(borrower, conf, "b0")
    assert got == str(r.address(spare + 3))
    selectors = [e["query"].get("labelSelector", "") for e in server.request_log()
                 if e["verb"] == "list" and e["resource"] == "leases"]
    borrowing = [s for s in selectors if "rdmanet.io/block=" in s or "rdmanet.io/block in" in s]
    assert len(borrowing) == 1, borrowing
    domain_claims = [s for s in selectors if s == f"rdmanet.io/ipam-domain={DHASH}"]
    assert not domain_claims, selectors
    assert store_add(borrower, conf, "b1") is None  # the pool is now full to its last address


def first_ip(conf, j):
    """The first address of block ``j`` (of 4) of ``conf``'s range (counted from its network address)."""
    [rs] = parse_ipam_config(conf).range_sets
    [r] = rs.ranges
    return r.address(int(r.subnet.network_address) + 4 * j)


def test_a_node_whose_run_meets_another_nodes_lists_the_free_blocks_instead_of_probing(server, kubeconfig, daemon):
    """One create per ADD in a crowded pool: a node's next block is the one after its newest, and
    a 409 there means its run met another node's, so the pool is crowded enough that a hashed
    probe would meet a 409 too (at a share f of blocks held, two probes cost f + 2f² requests
    against a List's 1): the ADD lists the records of the groups around its next position and
    creates its record at a block that List shows free. Here node-a's one block is full, the block after it and every other
    block are held, and the node's first hashed position is a held block: the ADD costs the 409,
    the List and its create, not a probe's 409 as well."""
    conf = netconf(kubeconfig, "10.9.32.0/20", block_size=4)  # 1,024 blocks of 4
    [rs] = parse_ipam_config(conf).range_sets
    node = next(n for n in (f"node-{k}" for k in range(100))
                if store(kubeconfig, n, conf).blocks._probe(rs, 0) % 1024 % 2 == 1)  # its first probe: a held block
    fill_blocks(server, store(kubeconfig, node, conf), rs, lambda j, first, k: j == 0)  # its block, full
    fill_blocks(server, store(kubeconfig, "node-full", conf), rs, lambda j, first, k: j % 2 == 1 and k == 0)
    assert call("DEL", conf, "nothing", node) == (0, None)  # the daemon starts its informer
    inf = informer_of(node)
    wait_until(lambda: inf.usable() and len(inf.blocks()) == 1, f"{node}'s informer to sync")
    server.reset_counts()
    got = add(conf, "a0", node)
    assert got is not None
    j = (int(ipaddress.ip_address(got)) - int(first_ip(conf, 0))) // 4
    assert j % 2 == 0 and j > 0 and got == str(first_ip(conf, j)), got  # a free block's record (its first address)
    steps = [(e["verb"], e["status"]) for e in server.request_log() if e["verb"] != "watch"]
    assert steps == [("create", 409), ("list", 200), ("create", 201)], steps
    lease = next(o for o in server.objects("leases", NS) if o["metadata"]["annotations"]["rdmanet.io/ip"] == got)
    assert block_owner(lease) == node


def test_a_daemon_in_a_crowded_pool_reads_eight_adjacent_groups_with_one_list(server, kubeconfig, daemon):
    """One create per ADD near a full pool: one group of 64 blocks often shows none free, and every
    further List is one more request per acquisition. Once a daemon's creates have met 409s
    (two hashed probes here: half the blocks or more look held), one List reads the records
    of eight adjacent groups (one page: one record per block). Here 1,023 of a /20's 1,024
    blocks of 4 are held; the free one lies four groups away from the group of the node's List
    position, in the other half of the eight: the ADD costs its two 409s, one List and its
    create, where Lists of one group (or of four) would cost two Lists or more."""
    conf = netconf(kubeconfig, "10.9.32.0/20", block_size=4)
    [rs] = parse_ipam_config(conf).range_sets
    s = store(kubeconfig, "node-b", conf)
    pos = [s.blocks._probe(rs, i) % 1024 for i in range(3)]
    assert len(set(pos)) == 3
    group = pos[2] // 64  # the group of its first List's position: the free block is four groups away, among its eight
    span = group // 8
    free_group = 8 * span + (group % 8 + 4) % 8
    j = next(j for j in range(64 * free_group, 64 * free_group + 64) if j not in pos)
    hold_every_block_but(server, kubeconfig, conf, {first_ip(conf, j)})
    assert call("DEL", conf, "nothing", "node-b") == (0, None)
    inf = informer_of("node-b")
    wait_until(inf.usable, "node-b's informer to sync")
    server.reset_counts()
    got = add(conf, "b0", "node-b")
    assert got == str(first_ip(conf, j))
    steps = [(e["verb"], e["status"]) for e in server.request_log() if e["verb"] != "watch"]
    assert steps == [("create", 409), ("create", 409), ("list", 200), ("create", 201)], steps
    [selector] = [e["query"].get("labelSelector", "") for e in server.request_log() if e["verb"] == "list"]
    assert selector.count("-256") == 8 and " in (" in selector, selector  # eight groups of 64 blocks of 4


def test_a_list_leaves_the_block_after_another_nodes_run_to_that_node(server, kubeconfig):
    """One create per ADD near a full pool: a node grows its run into the block after its newest
    one at one create, so a node that Lists to find a free block must not take that block when
    the List shows others: of a run of free blocks it takes one with free blocks on both sides
    (the one after a run's end only when nothing else is free). Here every block of a /20
    (1,024 blocks of 4) is held but two adjacent ones right after node-a's full block, and
    node-b's hashed probes meet held blocks, so it Lists the groups holding them. Nodes order
    equal choices each their own way: node-b is one whose order puts the first of the two
    first. node-b takes the second; node-a's next ADD then grows into the first at one create,
    where it would meet a 409 and a List of its own."""
    conf = netconf(kubeconfig, "10.9.32.0/20", block_size=4)
    [rs] = parse_ipam_config(conf).range_sets
    [r] = rs.ranges
    b = store(kubeconfig, "node-b", conf)
    probes = [b.blocks._probe(rs, i) % 1024 for i in range(3)]
    window = probes[2] // 512  # node-b Lists the eight groups around its third hashed position
    first = lambda j: int(first_ip(conf, j))  # noqa: E731
    run_end = next(j for j in range(512 * window + 1, 512 * window + 509)
                   if not {j, j + 1, j + 2} & set(probes) and b.blocks._spread(first(j + 1)) < b.blocks._spread(first(j + 2)))
    fill_blocks(server, store(kubeconfig, "node-a", conf), rs, lambda j, at, k: j == run_end)  # node-a's, full
    hold_every_block_but(server, kubeconfig, conf, {first_ip(conf, j) for j in (run_end, run_end + 1, run_end + 2)})
    got = store_add(b, conf, "b0")
    assert got == str(first_ip(conf, run_end + 2)), "node-b took the block after node-a's run"
    server.reset_counts()
    a = store(kubeconfig, "node-a", conf)
    grown = store_add(a, conf, "a0")
    assert grown == str(first_ip(conf, run_end + 1))
    steps = [(e["verb"], e["status"]) for e in server.request_log() if e["verb"] != "watch"]
    assert steps == [("list", 200), ("create", 201)], steps  # its own objects, then the record: no 409, no List of groups


def test_a_daemon_that_knows_the_block_after_its_newest_held_lists_instead_of_probing(server, kubeconfig, daemon):
    """One create per ADD in a crowded pool: a daemon remembers the blocks its Lists and 409s
    showed held. When the block after its newest one is among them, its run has met another
    node's as surely as a 409 there would say, so the pool is taken as crowded (no hashed probe,
    which would meet a 409 with the probability of the share held): the ADD lists the groups
    around its next position and creates its record at a block the List shows free. Here every
    other block of a /20 is held, the node's block is full, the block after it is one it
    remembers held (as an earlier List showed it, while that List showed most blocks free), and
    its first hashed position is a held block: the ADD costs one List and its create."""
    conf = netconf(kubeconfig, "10.9.32.0/20", block_size=4)  # 1,024 blocks of 4
    [rs] = parse_ipam_config(conf).range_sets
    [r] = rs.ranges
    node = next(n for n in (f"node-{k}" for k in range(100))
                if store(kubeconfig, n, conf).blocks._probe(rs, 0) % 1024 % 2 == 1)  # its first probe: a held block
    s = store(kubeconfig, node, conf)
    fill_blocks(server, s, rs, lambda j, first, k: j == 0)  # its block, full
    fill_blocks(server, store(kubeconfig, "node-full", conf), rs, lambda j, first, k: j % 2 == 1 and k == 0)
    assert call("DEL", conf, "nothing", node) == (0, None)  # the daemon starts its informer
    inf = informer_of(node)
    wait_until(lambda: inf.usable() and len(inf.blocks()) == 1, f"{node}'s informer to sync")
    inf.notes[("held", rs.index)] = {lease_name(DHASH, s.blocks._record_ip(r, int(first_ip(conf, 1))))}
    inf.notes[("crowded", rs.index)] = 0.1  # what that List showed
    server.reset_counts()
    got = add(conf, "a0", node)
    assert got is not None
    j = (int(ipaddress.ip_address(got)) - int(first_ip(conf, 0))) // 4
    assert j % 2 == 0 and j > 0 and got == str(first_ip(conf, j)), got  # a free block's record
    steps = [(e["verb"], e["status"]) for e in server.request_log() if e["verb"] != "watch"]
    assert steps == [("list", 200), ("create", 201)], steps
