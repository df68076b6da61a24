"""``rdmanet ipam plan``: blocks handed to nodes before the ADDs, so that a node finds
its space without spending requests (docs/lease-ipam.md "Planned blocks").

The pure plan (:mod:`rdmanet.ipam.block_plan`) on real range sets; the runner (:mod:`rdmanet.ipam.block_planner`)
and the CLI against the fake API server over HTTP, and the node daemons' ADDs through the real
store landing in their planned blocks.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import sys

import pytest

from rdmanet.cni.core.errors import INVALID_CONFIG, CNIError
from rdmanet.ipam import block_planner
from rdmanet.ipam.block_plan import PlanError, Record, block_sets, make_plan
from rdmanet.ipam.config import parse_ipam_config
from rdmanet.ipam.location import CLUSTER_DOMAIN
from rdmanet.ipam.reconcile import KubeTarget
from rdmanet.ipam.store.base import Attachment
from rdmanet.ipam.store.kube import L_DOMAIN, L_NODE, ApiClientTransport, domain_hash, lease_name, use_watch_cache
from rdmanet.ipam.store.block_records import free_record_body
from rdmanet.ipam.store.lease_names import L_PLANNED
from rdmanet.cli.main import main

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import RESOURCES, write_kubeconfig  # noqa: E402
from lease_objects import block_leases, block_owner, claim_leases  # noqa: E402
from lease_informers import informer_of, wait_until  # noqa: E402
from lease_nodes import NS, call, store  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

DHASH = domain_hash(CLUSTER_DOMAIN)
IP = ipaddress.ip_address


def range_sets(*ranges, **ipam):
    conf = {"cniVersion": "1.1.0", "name": "net-a", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "ipRanges": [{"range": r} for r in ranges], **ipam}}
    return parse_ipam_config(conf).range_sets


def record(first, owner, planned=True, free=True, size=16, name=None):
    return Record(name or f"rec-{first}", IP(first), size, owner, planned, free, f"uid-{first}", "7")


def given(plan):
    """node -> the first addresses of the blocks the plan creates for it, in order."""
    out = {}
    for c in plan.creates:
        out.setdefault(c.node, []).append(str(c.block.first))
    return out


# -- the pure plan ----------------------------------------------------------------------------------

def test_even_shares_give_each_node_a_contiguous_run_in_sorted_node_order():
    sets = block_sets(range_sets("10.0.0.0/24"), 16)  # 16 blocks: 3 nodes get 5 each, one left over
    plan = make_plan(sets, [], ["node-c", "node-a", "node-b"])
    assert plan.shares == {0: 5}
    assert given(plan) == {"node-a": [f"10.0.0.{16 * k}" for k in range(5)],
                           "node-b": [f"10.0.0.{16 * k}" for k in range(5, 10)],
                           "node-c": [f"10.0.0.{16 * k}" for k in range(10, 15)]}
    first = plan.creates[0].block
    assert str(first.record_ip) == "10.0.0.1" and first.id == "10.0.0.0-16" and first.subnet == "10.0.0.0/24"
    assert plan.deletes == []
    assert str(plan.spare(0).first) == "10.0.0.240" and plan.spare(0) is None


def test_every_record_a_node_holds_counts_and_held_blocks_are_never_given():
    sets = block_sets(range_sets("10.0.0.0/24"), 16)
    records = [record("10.0.0.0", "node-a"), record("10.0.0.32", "node-a", planned=False, free=False),
               *[record(f"10.0.0.{16 * k}", "node-b", planned=False) for k in range(8, 15)]]  # 7 > the share 5
    plan = make_plan(sets, records, ["node-a", "node-b", "node-c"])
    got = given(plan)
    assert got["node-a"] == ["10.0.0.16", "10.0.0.48", "10.0.0.64"]  # 2 held + 3 = 5, around its held blocks
    assert "node-b" not in got  # above its share: nothing given, nothing taken back
    assert got["node-c"] == ["10.0.0.80", "10.0.0.96", "10.0.0.112", "10.0.0.240"]  # all that is left
    assert plan.held == {"node-a": 2, "node-b": 7, "node-c": 0}
    assert plan.deletes == [] and plan.spare(0) is None


def test_only_gone_nodes_free_planned_records_are_taken_back_and_their_blocks_given_again():
    sets = block_sets(range_sets("10.0.0.0/28"), 4)  # 4 blocks of 4 (.1-.14 usable)
    gone_free = record("10.0.0.0", "node-x", size=4)
    gone_claimed = record("10.0.0.4", "node-x", free=False, size=4)
    gone_unplanned = record("10.0.0.8", "node-y", planned=False, size=4)
    live_free = record("10.0.0.12", "node-a", size=4)
    plan = make_plan(sets, [gone_free, gone_claimed, gone_unplanned, live_free], ["node-a", "node-b"])
    assert plan.deletes == [gone_free]
    assert plan.shares == {0: 2}
    assert given(plan) == {"node-a": ["10.0.0.0"]}  # node-a holds one: the freed block; node-b: none is left


def test_the_plan_is_deterministic_whatever_order_its_inputs_come_in():
    sets = block_sets(range_sets("10.0.0.0/22"), 16)
    nodes = [f"node-{i:02d}" for i in range(7)]
    records = [record(f"10.0.{k // 16}.{16 * (k % 16)}", nodes[k % 9] if k % 9 < 7 else "gone", planned=k % 2 == 0)
               for k in range(0, 64, 5)] + [record("10.0.3.32", "gone-1"), record("10.0.3.64", "gone-2")]
    want = make_plan(sets, records, nodes)
    for seed in range(5):
        rnd = random.Random(seed)
        shuffled_nodes, shuffled_records = nodes[:], records[:]
        rnd.shuffle(shuffled_nodes)
        rnd.shuffle(shuffled_records)
        again = make_plan(sets, shuffled_records, shuffled_nodes)
        assert again.creates == want.creates and again.deletes == want.deletes
    assert want.creates and want.deletes


def test_two_range_sets_each_give_every_node_its_share():
    sets = block_sets(range_sets("10.0.0.0/28", "fd00::/124"), 4)
    plan = make_plan(sets, [record("fd00::", "node-a", planned=False, size=4)], ["node-a", "node-b"])
    assert plan.shares == {0: 2, 1: 2}
    by_set = {(c.node, c.block.range_set): [] for c in plan.creates}
    for c in plan.creates:
        by_set[(c.node, c.block.range_set)].append(str(c.block.record_ip))
    assert by_set == {("node-a", 0): ["10.0.0.1", "10.0.0.4"], ("node-b", 0): ["10.0.0.8", "10.0.0.12"],
                      ("node-a", 1): ["fd00::4"],  # it holds fd00::/126 already: one more
                      ("node-b", 1): ["fd00::8", "fd00::c"]}


def test_a_share_larger_than_the_free_blocks_gives_what_there_is_in_node_order():
    sets = block_sets(range_sets("10.0.0.0/24"), 16)
    plan = make_plan(sets, [record("10.0.0.0", "node-b", planned=False)], ["node-a", "node-b", "node-c"],
                     blocks_per_node=10)
    got = given(plan)
    assert len(got["node-a"]) == 10 and len(got["node-b"]) == 5 and "node-c" not in got
    assert len({b for bs in got.values() for b in bs} | {"10.0.0.0"}) == 16  # every block once
    assert plan.spare(0) is None


def test_a_huge_range_needs_an_explicit_share_and_is_walked_lazily():
    sets = block_sets(range_sets("fd00::/64"), None)  # 2^58 blocks of 64
    with pytest.raises(PlanError, match="--blocks-per-node"):
        make_plan(sets, [], ["node-a"])
    plan = make_plan(sets, [], ["node-a", "node-b"], blocks_per_node=2)
    assert [str(c.block.record_ip) for c in plan.creates] == ["fd00::1", "fd00::40", "fd00::80", "fd00::c0"]


# -- the runner against the fake API server -------------------------------------------------------

@pytest.fixture
def kubeconfig(server, tmp_path):
    return write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)


def netconf(kubeconfig, rng="10.9.40.0/27", **kube):
    return {"cniVersion": "1.1.0", "name": "net-a", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "range": rng, "kubernetes": {"kubeconfig": str(kubeconfig), **kube}}}


def run_plan(conf, **kw):
    return block_planner.plan_network(conf, **kw)


def planned(server):
    """node -> sorted record addresses of its planned records."""
    out = {}
    for o in block_leases(server, NS):
        if o["metadata"]["labels"].get(L_PLANNED) == "true":
            out.setdefault(block_owner(o), []).append(o["metadata"]["annotations"]["rdmanet.io/ip"])
    return {k: sorted(v, key=IP) for k, v in out.items()}


def writes(server):
    return {k: v for k, v in server.counts().items() if k[0] in ("create", "update", "delete", "patch")}


def call_add(conf, cid, node):
    """The address a node's ADD returned (through the plugin, as its daemon serves it; any error
    fails the test)."""
    code, out = call("ADD", conf, cid, node)
    assert code == 0, out
    return out["ips"][0]["address"].split("/")[0]


@pytest.fixture
def daemon():
    use_watch_cache(True, distrust_seconds=0.5, echo_budget=0.3, sync_budget=10.0)
    yield
    use_watch_cache(False)


def test_planned_nodes_fill_their_blocks_at_one_request_per_add_with_no_list_and_no_409(server, kubeconfig, daemon):
    """Three nodes, a /27 in blocks of 4 (8 blocks, 2 per node). After the plan, each node's daemon
    hands out exactly its planned blocks' addresses: an ADD of a record's address is an update (the
    node's first ADD among them), every other one a create; no List beyond the informer's start,
    no 409."""
    for n in ("node-a", "node-b", "node-c"):
        server.add_node(n)
    conf = netconf(kubeconfig, block_size=4)
    done = run_plan(conf)
    assert done.shares == {0: 2} and done.planned == {"node-a": 2, "node-b": 2, "node-c": 2} and not done.skipped
    assert planned(server) == {"node-a": ["10.9.40.1", "10.9.40.4"], "node-b": ["10.9.40.8", "10.9.40.12"],
                               "node-c": ["10.9.40.16", "10.9.40.20"]}
    records = planned(server)
    spans = {"node-a": range(1, 8), "node-b": range(8, 16), "node-c": range(16, 24)}
    got = []
    for node, span in spans.items():
        server.reset_counts()
        first = call_add(conf, f"{node}-0", node)  # starts the node's informer (one List and a watch)
        assert first == f"10.9.40.{span[0]}"
        assert writes(server) == {("update", "leases"): 1}  # the planned record's address, taken by an update
        inf = informer_of(node)
        wait_until(lambda: len(inf.blocks()) == 2, f"{node}'s two planned blocks in its view")
        got.append(first)
        for i in range(1, len(span)):
            server.reset_counts()
            ip = call_add(conf, f"{node}-{i}", node)
            # one request, no List, no 409: the update of its other planned record's address, else a create
            want = ("update" if ip in records[node] else "create", "leases")
            assert server.counts() == {want: 1}, (node, i, ip, server.counts())
            assert IP(ip) in [IP(f"10.9.40.{k}") for k in span]
            got.append(ip)
    assert sorted(got, key=IP) == [f"10.9.40.{k}" for k in range(1, 24)]
    assert sorted(holders_of(server), key=IP) == sorted(got, key=IP)  # one claim per address handed out
    # the planned blocks stayed their nodes' (the planner's labels kept through update and creates)
    assert planned(server) == {"node-a": ["10.9.40.1", "10.9.40.4"], "node-b": ["10.9.40.8", "10.9.40.12"],
                               "node-c": ["10.9.40.16", "10.9.40.20"]}


def test_a_second_run_writes_nothing_and_a_removed_node_loses_only_its_free_planned_records(server, kubeconfig):
    for n in ("node-a", "node-b", "node-c"):
        server.add_node(n)
    conf = netconf(kubeconfig, block_size=4)
    run_plan(conf)
    server.reset_counts()
    again = run_plan(conf)
    assert again.created == [] and again.deleted == [] and again.planned == {}
    assert again.before == {"node-a": 2, "node-b": 2, "node-c": 2}
    assert writes(server) == {}
    assert server.counts() == {("list", "nodes"): 1, ("list", "leases"): 1}
    # node-c takes its first planned address (an ADD), then leaves the cluster
    [ip] = store(kubeconfig, "node-c", conf).allocate(Attachment("c0", "net1"), "net-a",
                                                           parse_ipam_config(conf).range_sets, {})
    assert str(ip) == "10.9.40.16"
    server.delete_node("node-c")
    server.reset_counts()
    after = run_plan(conf)
    assert after.deleted == [lease_name(DHASH, IP("10.9.40.20"))]  # free: taken back; 10.9.40.16 is claimed: kept
    assert writes(server) == {("delete", "leases"): 1, ("create", "leases"): 3}
    assert after.shares == {0: 4}  # 8 blocks, 2 nodes
    mine = planned(server)
    assert mine["node-c"] == ["10.9.40.16"]
    assert mine["node-a"] == ["10.9.40.1", "10.9.40.4", "10.9.40.20", "10.9.40.24"]  # node-c's free block given again
    assert mine["node-b"] == ["10.9.40.8", "10.9.40.12", "10.9.40.28"]  # what is left
    assert holders_of(server)["10.9.40.16"] == "c0/net1"


def holders_of(server):
    return {o["metadata"]["annotations"]["rdmanet.io/ip"]: o["spec"]["holderIdentity"] for o in claim_leases(server, NS)}


def test_a_block_whose_address_was_claimed_before_the_create_is_skipped_and_the_node_gets_the_next(server, kubeconfig):
    """A borrower claimed a block's first address, which no record List shows: the planner's
    create meets 409, skips that block and gives the next free one."""
    for n in ("node-a", "node-b"):
        server.add_node(n)
    body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": lease_name(DHASH, IP("10.9.40.1")), "namespace": NS,
                         "labels": {L_DOMAIN: DHASH, L_NODE: "node-z"}, "annotations": {"rdmanet.io/ip": "10.9.40.1"}},
            "spec": {"holderIdentity": "z-0/net1"}}
    assert server.api_create(RESOURCES["leases"], NS, body, False)[0] == 201
    done = run_plan(netconf(kubeconfig, block_size=4), blocks_per_node=2)
    assert done.skipped == [lease_name(DHASH, IP("10.9.40.1"))] and not done.errors
    assert planned(server) == {"node-a": ["10.9.40.4", "10.9.40.16"], "node-b": ["10.9.40.8", "10.9.40.12"]}
    assert holders_of(server)["10.9.40.1"] == "z-0/net1"  # the claim untouched


def test_the_node_selector_picks_the_nodes_and_a_plan_for_no_node_is_refused(server, kubeconfig):
    server.add_node("gpu-1", {"pool": "gpu"})
    server.add_node("gpu-2", {"pool": "gpu"})
    server.add_node("cpu-1", {"pool": "cpu"})
    conf = netconf(kubeconfig, block_size=4)
    done = run_plan(conf, node_selector="pool=gpu")
    assert sorted(done.before) == ["gpu-1", "gpu-2"] and done.shares == {0: 4}
    assert sorted(planned(server)) == ["gpu-1", "gpu-2"]
    with pytest.raises(CNIError) as err:
        run_plan(conf, node_selector="pool=none")
    assert err.value.code == INVALID_CONFIG and "no node matches" in err.value.msg
    assert sorted(planned(server)) == ["gpu-1", "gpu-2"]  # nothing taken back


def test_nodes_and_records_are_listed_page_by_page(server, kubeconfig, monkeypatch):
    from rdmanet.ipam import reconcile

    monkeypatch.setattr(reconcile, "LIST_PAGE", 2)
    for i in range(5):
        server.add_node(f"node-{i}")
    conf = netconf(kubeconfig, block_size=4)
    run_plan(conf, blocks_per_node=1)
    server.reset_counts()
    again = run_plan(conf, blocks_per_node=1)
    assert again.before == {f"node-{i}": 1 for i in range(5)} and again.created == []
    assert server.counts() == {("list", "nodes"): 3, ("list", "leases"): 3}  # 5 nodes and 5 records, 2 a page
    log = [e for e in server.request_log() if e["verb"] == "list"]
    assert all(e["query"].get("limit") == "2" for e in log)


@pytest.mark.fake_only("it drives the fake server's in-process client (InProcessApiClient), as the scale simulation does")
def test_the_runner_entry_point_takes_any_api_client(server, kubeconfig):
    """What the scale simulation calls: run_plan on a KubeTarget over any transport (here the fake
    server's in-process client, its requests counted under the client's name)."""
    from kube_api_server import InProcessApiClient

    from rdmanet.ipam.reconcile import KubeAPI

    server.add_node("node-a")
    conf = netconf(kubeconfig, block_size=4)
    target = KubeTarget(KubeAPI(ApiClientTransport(InProcessApiClient(server, "planner"))), NS, CLUSTER_DOMAIN)
    done = block_planner.run_plan(target, parse_ipam_config(conf).range_sets, 4, dry_run=True)
    assert done.planned == {"node-a": 8} and len(done.created) == 8 and block_leases(server, NS) == []
    done = block_planner.run_plan(target, parse_ipam_config(conf).range_sets, 4)
    assert len(planned(server)["node-a"]) == 8
    assert server.client_stats()["planner"]["req:create"] == 8
    assert free_record_body(NS, CLUSTER_DOMAIN, IP("10.9.40.1"), "10.9.40.0-4", "10.9.40.0/27", "node-a", True)[
        "metadata"]["name"] == done.created[0]


# -- the CLI ----------------------------------------------------------------------------------------

def cli(capsys, *argv):
    code = main(["ipam", "plan", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write_conf(tmp_path, conf):
    path = tmp_path / "net.json"
    path.write_text(json.dumps(conf))
    return str(path)


def test_cli_json_table_and_dry_run(server, kubeconfig, tmp_path, capsys):
    for n in ("node-a", "node-b", "node-c"):
        server.add_node(n)
    path = write_conf(tmp_path, netconf(kubeconfig, block_size=4))
    code, out, _ = cli(capsys, "--network-config", path, "--dry-run", "-o", "json")
    assert code == 0 and block_leases(server, NS) == []
    doc = json.loads(out)
    assert doc["dry_run"] is True and doc["blocks_per_node"] == {"0": 2}
    assert doc["nodes"] == [{"node": n, "before": 0, "planned": 2, "after": 2} for n in ("node-a", "node-b", "node-c")]
    assert doc["totals"]["planned"] == 6 and len(doc["created"]) == 6
    code, out, _ = cli(capsys, "--network-config", path)
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split() == ["NODE", "BEFORE", "PLANNED", "AFTER"]
    assert lines[2].split() == ["node-a", "0", "2", "2"] and lines[5].split() == ["TOTAL", "0", "6", "6"]
    assert sorted(o["metadata"]["name"] for o in block_leases(server, NS)) == sorted(doc["created"])
    code, out, _ = cli(capsys, "--network-config", path, "--blocks-per-node", "3", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and [n["after"] for n in doc["nodes"]] == [3, 3, 2]  # 8 blocks: 2 left for 3 nodes


def test_cli_bad_input_is_a_clear_error_with_nothing_written(server, kubeconfig, tmp_path, capsys):
    server.add_node("node-a")
    local = write_conf(tmp_path, {"cniVersion": "1.1.0", "name": "n", "type": "macvlan",
                                  "ipam": {"type": "lease-ipam", "range": "10.0.0.0/24", "datastore": "local"}})
    code, out, err = cli(capsys, "--network-config", local)
    assert code == 2 and out == "" and "kubernetes" in err and "fix:" in err and "Traceback" not in err
    path = write_conf(tmp_path, netconf(kubeconfig, block_size=4))
    code, out, err = cli(capsys, "--network-config", path, "--blocks-per-node", "-1")
    assert code == 2 and out == "" and "--blocks-per-node" in err
    code, out, err = cli(capsys, "--network-config", path, "--node-selector", "a in (")
    assert code == 2 and out == "" and "--node-selector" in err
    code, out, err = cli(capsys, "--network-config", str(tmp_path / "missing.json"))
    assert code == 2 and out == "" and "cannot read" in err
    assert block_leases(server, NS) == []


def test_credentials_that_may_not_list_nodes_get_a_clear_error_naming_the_cluster_role(server, kubeconfig):
    server.add_node("node-a")
    server.fail_next(1, 403, verb="list", resource="nodes")
    with pytest.raises(CNIError) as err:
        run_plan(netconf(kubeconfig, block_size=4))
    assert "cannot list nodes" in err.value.msg and "rdmanet-node-lister" in err.value.details
    assert block_leases(server, NS) == []
