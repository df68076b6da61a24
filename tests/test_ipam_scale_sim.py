"""Smoke test of bench/ipam_scale_sim.py at tiny N: it runs lease-ipam's real store against the
in-process fake API server and its counts add up (no timings are asserted)."""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import ipam_scale_sim  # noqa: E402

SIZE = 256
SETTINGS = {"sync_budget": 10.0, "echo_budget": 10.0}


def run(*args: str) -> tuple[int, dict]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = ipam_scale_sim.main(["--size", str(SIZE), "--fills", "50,95", "--job", "24", "--batch", "8",
                                  "--threads", "4", "--fill-threads", "4", "--json", *args])
    return rc, json.loads(out.getvalue())


def check_consistent(result: dict) -> None:
    assert result["errors"] == {} and result["duplicates"] == 0
    assert result["size"] == SIZE
    verbs = [row for row in result["rows"] if not row["phase"].startswith("plan")]
    for row in verbs:
        assert row["ops"] == row["wanted"] > 0, row["phase"]
        assert row["requests_per_op"] == pytest.approx(row["verb_per_op"] + row["informer_per_op"], abs=1e-3)
        assert sum(row["verb_requests"].values()) == pytest.approx(row["verb_per_op"] * row["ops"], abs=0.5)
        assert row["verb_per_op"] >= 1.0  # every ADD/DEL asks the API server at least once
        # every request a verb made is counted under the store step that made it, once
        assert sum(row["reasons"].values()) == sum(row["verb_requests"].values()), row["phase"]
    phases = [row["phase"] for row in verbs]
    assert phases[0] == "fill 0-50 %" and "job: 24 ADDs at once" in phases and "fill 50-95 %" in phases
    restart = result["restart"]
    assert restart["fill"] == SIZE * 95 // 100  # the fill reached its target and the batches were put back
    assert restart["streams_broken"] >= 1 and restart["requests"] >= result["nodes"]  # every daemon Listed (or watched) again
    if result.get("server") == "real":  # the audit log counts requests, not bytes
        assert restart["total_bytes"] == restart["per_daemon_max"] == 0
        return
    assert restart["total_bytes"] == pytest.approx(restart["per_daemon_mean"] * result["nodes"], abs=result["nodes"])
    assert restart["per_daemon_max"] >= restart["per_daemon_mean"] > 0


def test_sim_runs_per_node_informers_and_its_counts_add_up():
    rc, doc = run("--nodes", "2,5", "--informers", "per-node")
    assert rc == 0
    assert [r["nodes"] for r in doc["results"]] == [2, 5]
    for r in doc["results"]:
        assert r["informers"] == "per-node"
        check_consistent(r)
    assert set(doc["targets"]) == {"1", "2", "3"}
    assert all(isinstance(t["pass"], bool) for t in doc["targets"].values())


def test_block_size_is_the_nads_and_stated_in_every_row():
    """--block-size reaches the stores as the NAD's kubernetes.block_size: with blocks of 4, a
    node's ADDs acquire a block (its record is the ADD's claim) every 4 ADDs while filling."""
    rc, doc = run("--nodes", "2", "--block-size", "4")
    assert rc == 0
    [r] = doc["results"]
    check_consistent(r)
    assert r["block_size"] == 4
    fill = r["rows"][0]
    acquired = sum(v for k, v in fill["reasons"].items() if k.startswith("POST _try_record") and k.endswith(" 201"))
    # 128 ADDs, 64 per node: one block per 4 (one more where a block holds the network address)
    assert fill["ops"] // 4 <= acquired <= fill["ops"] // 4 + 2, fill["reasons"]
    out = io.StringIO()
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"sim-{os.getpid()}.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    try:
        with redirect_stdout(out):
            assert ipam_scale_sim.main(["--report", path]) == 0
    finally:
        os.unlink(path)
    rows = [line for line in out.getvalue().splitlines() if line.startswith("| 4 | fill")]
    assert rows, out.getvalue()


def test_a_plan_is_one_row_before_the_adds_and_its_nodes_fill_their_blocks_at_one_request_each():
    """--plan runs the planner once after the daemons start: one record written per block (its
    creates and its paginated Lists counted), one watch event per record (delivered to its node
    only); then no ADD or DEL of any phase costs more than one request (no List, no 409), and the
    report adds the plan's requests to the fill's."""
    rc, doc = run("--nodes", "2", "--block-size", "4", "--plan")
    assert rc == 0
    [r] = doc["results"]
    check_consistent(r)
    assert r["plan"] is True
    plan, rows = r["rows"][0], r["rows"][1:]
    assert plan["phase"].startswith("plan")
    blocks = SIZE // 4 + 1  # 10.0.0.1-10.0.1.0: 64 blocks and the one that holds 10.0.1.0
    share = blocks // 2  # each node the same share; the block left over is any node's to acquire
    assert plan["ops"] == 2 * share and plan["blocks_per_node"] == [share, share]
    assert plan["verb_requests"]["create"] == 2 * share and plan["verb_requests"]["list"] >= 2  # nodes and records
    assert plan["watch_events_per_op"] == 1
    for row in rows:
        assert row["requests_per_op"] == 1.0 and row["conflicts_per_op"] == 0, row["phase"]
        assert not any(k.startswith("GET") for k in row["reasons"]), row["reasons"]
    checks = ipam_scale_sim.verdicts(doc["results"])
    assert checks["1"]["worst_requests_per_add"][2] == 1.0  # the plan's row is not an ADD
    once, amortised, adds = ipam_scale_sim.plan_amortised(r)
    fills = [row for row in rows if row["phase"].startswith("fill")]
    assert once == sum(plan["verb_requests"].values()) and adds == sum(row["ops"] for row in fills)
    assert amortised == pytest.approx((adds + once) / adds)


def test_shared_informer_counts_what_per_node_informers_receive():
    """When every node's informer watches the same selectors, the sim runs one and counts a held
    watch per node: the events it counts must be those real per-node informers were delivered."""
    shared, _ = ipam_scale_sim.probe_shared(SIZE, SETTINGS)
    if not shared:
        pytest.skip("the store's informers are node-scoped: the sim never shares them")
    _, per_node = run("--nodes", "4", "--informers", "per-node")
    _, one = run("--nodes", "4", "--informers", "shared")
    a, b = per_node["results"][0], one["results"][0]
    check_consistent(b)
    for ra, rb in zip(a["rows"], b["rows"]):
        assert ra["phase"] == rb["phase"]
        if ra["phase"].startswith("fill"):  # sequential enough to be exact: one event per claim per node
            assert rb["watch_events_per_op"] == ra["watch_events_per_op"]
            assert rb["watch_bytes_per_op"] == pytest.approx(ra["watch_bytes_per_op"], rel=0.05)
    assert b["restart"]["total_bytes"] == pytest.approx(a["restart"]["total_bytes"], rel=0.05)


def test_the_simulation_runs_against_a_real_api_server(real_apiserver):
    """``--server real``: the same phases over HTTPS to the real kube-apiserver (the session's),
    requests counted per simulated node from its audit log; the counts add up as on the fake."""
    ipam_scale_sim.RealServer.cluster = real_apiserver
    try:
        rc, doc = run("--server", "real", "--nodes", "3")
    finally:
        ipam_scale_sim.RealServer.cluster = None
    assert rc == 0
    [result] = doc["results"]
    assert result["nodes"] == 3 and result["informers"] == "per-node"
    check_consistent(result)
