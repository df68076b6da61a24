"""Smoke test of bench/plugin_bench.py: every phase runs end to end with tiny counts.

No timing is asserted (the machines are noisy and the targets are the benchmark's verdicts, not
test failures): only that the JSON report covers every implementation and verb, that no call
failed, and that the run leaves no namespace or link behind.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "plugin_bench.py"
GO_PLUGINS = ("macvlan", "host-local", "host-device")

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the plugin benchmark needs root (network namespaces, veth pairs)"),
    # The benchmark starts its own daemons; once per suite is enough (scripts/test.sh runs this
    # directory a second time with RDMANET_TEST_PLUGINS=daemon).
    pytest.mark.skipif(os.environ.get("RDMANET_TEST_PLUGINS") == "daemon",
                       reason="runs in the shims pass only (the benchmark starts its own daemons)"),
]


def leftovers(prefix: str) -> tuple[list[str], list[str]]:
    try:
        namespaces = [n for n in os.listdir("/run/netns") if n.startswith(prefix)]
    except FileNotFoundError:
        namespaces = []
    proc = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True)
    links = [e["ifname"] for e in json.loads(proc.stdout or "[]") if e["ifname"].startswith(prefix)]
    return namespaces, links


def test_quick_json_run_covers_every_implementation_and_verb():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", "--cycles", "1", "--warmup", "0", "--soak", "6",
         "--concurrency", "3"],
        capture_output=True, text=True, timeout=600, cwd=REPO, check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstderr: {proc.stderr[-4000:]}\nstdout: {proc.stdout[-4000:]}"
    doc = json.loads(proc.stdout)
    meta = doc["meta"]

    go = all(os.access(f"/usr/lib/cni/{p}", os.X_OK) for p in GO_PLUGINS)
    assert meta["go_reference"] is go
    expected = {(impl, verb) for impl in ("mv-inproc", "mv-daemon", "hd-inproc", "hd-daemon")
                for verb in ("ADD", "CHECK", "DEL")}
    if go:
        expected |= {(impl, verb) for impl in ("go-macvlan", "go-hostdev") for verb in ("ADD", "CHECK", "DEL")}
    expected |= {("py-floor", "exec"), ("shim-floor", "VERSION")}
    rows = {(r["impl"], r["verb"]): r for r in doc["results"]}
    assert set(rows) == expected
    for key, r in rows.items():
        assert r["n"] == 1 and r["failed"] == 0, (key, r)
        assert r["p50_ms"] is not None and r["max_ms"] is not None, (key, r)
        if go:
            assert r["ratio_p50"] is not None or key[0].startswith("go-"), (key, r)
    assert doc["failures"] == {}

    conc = doc["concurrency"]
    assert conc["n"] == 3 and conc["daemon_errors"] == 0 and conc["duplicates"] == 0 and conc["daemon_del_errors"] == 0
    if go:
        assert conc["go_errors"] == 0

    soak = doc["soak"]
    assert soak["cycles"] == 6 and soak["failed"] == 0 and soak["daemon_alive"]
    assert soak["samples"][0]["cycle"] == 0 and soak["samples"][-1]["cycle"] == 6
    for sample in soak["samples"]:
        assert sample["rss_kb"] > 0 and sample["fds"] > 0 and sample["threads"] > 0

    imports = doc["imports"]
    assert len(imports) == 3  # the shim, and macvlan-rdma / host-device-rdma in-process (lease-ipam inside)
    shim = imports["shim (daemon answers): macvlan-rdma"]
    assert shim["non_stdlib"] == [] and shim["heavy"] == []
    for label, summary in imports.items():
        assert summary["rc"] == 0, (label, summary)
        assert summary["modules"] > 0, (label, summary)

    assert doc["verdicts"] and {v["status"] for v in doc["verdicts"]} <= {"PASS", "MISS", "SKIP"}
    assert leftovers(meta["prefix"]) == ([], [])
