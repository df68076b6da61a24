"""Acceptance checks of lease-ipam: concurrent execs, huge IPv6 ranges, crash safety (kill -9)."""

from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import POOL_EXHAUSTED
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store.base import Attachment
from rdmanet.ipam.store.files import GARBAGE, read_json
from rdmanet.ipam.store.local import CRASH_ENV, CRASH_EXIT_CODE, INDEX_DIR, LocalStore

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def netconf(data_dir, version="1.0.0", **ipam):
    return {"cniVersion": version, "name": "net-c", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "dataDir": str(data_dir), **ipam}}


def cni_env(command, cid, ifname="net1"):
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": ifname,
            "CNI_PATH": "/opt/cni/bin"}


def spawn(tmp_path, command, conf, cid, extra_env=None):
    conf_file = tmp_path / f"conf-{command}-{cid}.json"
    conf_file.write_text(json.dumps(conf))
    env = dict(os.environ, PYTHONPATH=ROOT, **cni_env(command, cid), **(extra_env or {}))
    with open(conf_file, "rb") as stdin:
        return subprocess.Popen([sys.executable, "-m", "rdmanet.ipam"], stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, cwd=ROOT)


def finish(procs, timeout=120):
    out = {}
    for cid, p in procs.items():
        stdout, stderr = p.communicate(timeout=timeout)
        out[cid] = (p.returncode, json.loads(stdout) if stdout.strip() else None, stderr.decode())
    return out


def addresses(result):
    return [ip["address"].split("/")[0] for ip in result["ips"]]


def store_contents(root):
    """(address files -> parsed content, index names) of one domain."""
    files = {n: read_json(os.path.join(root, n)) for n in os.listdir(root)
             if n not in ("lock", INDEX_DIR) and not n.startswith((".", "last_reserved."))}
    return files, sorted(os.listdir(os.path.join(root, INDEX_DIR)))


def test_200_concurrent_adds_then_exhaustion_then_del(tmp_path):
    conf = netconf(tmp_path, range="10.20.0.0/24")  # 254 usable addresses
    t0 = time.perf_counter()
    first = finish({f"c{i:03d}": spawn(tmp_path, "ADD", conf, f"c{i:03d}") for i in range(200)})
    t_first = time.perf_counter() - t0
    assert all(code == 0 for code, _, _ in first.values()), [v for v in first.values() if v[0]][:3]
    got = [a for _, res, _ in first.values() for a in addresses(res)]
    assert len(got) == 200 and len(set(got)) == 200

    t0 = time.perf_counter()
    more = finish({f"d{i:02d}": spawn(tmp_path, "ADD", conf, f"d{i:02d}") for i in range(60)})
    t_more = time.perf_counter() - t0
    ok = [res for code, res, _ in more.values() if code == 0]
    failed = [res for code, res, _ in more.values() if code != 0]
    assert len(ok) == 54 and len(failed) == 6
    for res in failed:
        assert res["code"] == POOL_EXHAUSTED and res["msg"] == "no free address in range 10.20.0.0/24 (10.20.0.1-10.20.0.254)"
        assert "widen" in res["details"]
    every = got + [a for res in ok for a in addresses(res)]
    assert len(set(every)) == 254

    root = tmp_path / "net-c"
    files, index = store_contents(root)
    assert len(files) == 254 and len(index) == 254
    for cid, (code, res, _) in list(first.items()) + list(more.items()):
        if code == 0:  # every handed-out address is on disk, claimed by the attachment that got it
            assert files[addresses(res)[0]]["containerID"] == cid

    # DEL concurrently from 8 threads in-process (each call takes the flock on its own descriptor,
    # so threads exclude each other like processes do); an exec per DEL would add ~15 s here.
    t0 = time.perf_counter()
    stdin = json.dumps(conf).encode()
    with ThreadPoolExecutor(8) as pool:
        gone = list(pool.map(lambda cid: skel.handle(LeaseIPAM(), cni_env("DEL", cid), stdin), list(first) + list(more)))
    t_del = time.perf_counter() - t0
    assert gone == [(0, None)] * 260
    assert store_contents(root) == ({}, [])
    print(f"\n200 concurrent ADD execs: {t_first:.1f}s; 60 more: {t_more:.1f}s; 260 DELs (8 threads): {t_del:.1f}s")


@pytest.mark.parametrize("cidr", ["fd00:64::/64", "fd00:48::/48"])
def test_ipv6_huge_range_1000_adds(tmp_path, cidr):
    conf = json.dumps(netconf(tmp_path, range=cidr, exclude=[cidr.replace("::/", "::/").split("/")[0] + "/100"])).encode()
    plugin = LeaseIPAM()
    t0 = time.perf_counter()
    seen = set()
    for i in range(1000):
        code, out = skel.handle(plugin, cni_env("ADD", f"v6-{i}"), conf)
        assert code == 0, out
        seen.add(out["ips"][0]["address"])
    elapsed = time.perf_counter() - t0
    assert len(seen) == 1000
    first = ipaddress.ip_network(cidr)[2**28]  # the /100 exclude pushes allocation past 2^28 addresses
    assert f"{first}/{cidr.split('/')[1]}" in seen
    print(f"\n1000 in-process ADDs in {cidr}: {elapsed:.2f}s")
    assert elapsed < 30


ADD_STEPS = ["after-intent", "after-create", "after-address", "before-cursor", "after-cursor"]


@pytest.mark.parametrize("cleanup", ["DEL", "GC", "ADD-again"])
@pytest.mark.parametrize("step", ADD_STEPS)
def test_crash_at_each_add_step(tmp_path, step, cleanup):
    """Kill an ADD (os._exit) at a named step of a dual-stack allocation, fill the range with other
    attachments, then clean up the crashed one: no duplicate, and nothing of it is left."""
    conf = netconf(tmp_path, version="1.1.0", range="10.30.0.0/29", ipRanges=[{"range": "fd30::/125"}])
    victim = spawn(tmp_path, "ADD", conf, "victim", {CRASH_ENV: step})
    code, out, err = finish({"victim": victim})["victim"]
    assert code == CRASH_EXIT_CODE and out is None, err
    root = str(tmp_path / "net-c")
    files, _ = store_contents(root)
    victim_claims = {n for n, doc in files.items() if doc is GARBAGE or (doc or {}).get("containerID") == "victim"}
    # the state each step leaves: (complete claims, empty claims, cursor written)
    expected = {"after-intent": (0, 0, False), "after-create": (0, 1, False), "after-address": (1, 0, False),
                "before-cursor": (2, 0, False), "after-cursor": (2, 0, True)}[step]
    complete = sum(1 for doc in files.values() if doc is not GARBAGE)
    empty = sum(1 for doc in files.values() if doc is GARBAGE)
    assert (complete, empty, os.path.exists(os.path.join(root, "last_reserved.0"))) == expected
    assert read_json(os.path.join(root, INDEX_DIR, "victim:net1"))["addresses"] == ["10.30.0.1", "fd30::1"]

    plugin, handed = LeaseIPAM(), []
    for i in range(8):  # 6 addresses per family: more ADDs than room
        code, res = skel.handle(plugin, cni_env("ADD", f"other{i}"), json.dumps(conf).encode())
        if code == 0:
            handed += addresses(res)
        else:
            assert res["code"] == POOL_EXHAUSTED
    assert len(handed) == len(set(handed)), "duplicate address"
    assert not victim_claims & set(handed), "an address claimed by the crashed ADD was handed out"
    assert len(handed) == 2 * (6 - max(len([c for c in victim_claims if ":" not in c]), len([c for c in victim_claims if ":" in c])))

    if cleanup == "DEL":
        code, res = skel.handle(plugin, cni_env("DEL", "victim"), json.dumps(conf).encode())
    elif cleanup == "GC":
        valid = [{"containerID": f"other{i}", "ifname": "net1"} for i in range(8)]
        gc = dict(conf, **{"cni.dev/valid-attachments": valid})
        code, res = skel.handle(plugin, {"CNI_COMMAND": "GC", "CNI_PATH": "/x"}, json.dumps(gc).encode())
    else:  # the runtime retries the ADD: it completes (adopting what the crash left), then DEL
        code, res = skel.handle(plugin, cni_env("ADD", "victim"), json.dumps(conf).encode())
        if code == 0:
            assert not set(addresses(res)) & set(handed)
        else:
            assert res["code"] == POOL_EXHAUSTED
        code, res = skel.handle(plugin, cni_env("DEL", "victim"), json.dumps(conf).encode())
    assert code == 0, res
    files, index = store_contents(root)
    assert all(doc is not GARBAGE and doc["containerID"].startswith("other") for doc in files.values())
    assert "victim:net1" not in index
    assert sorted(files) == sorted(handed)


def test_crash_during_del_is_finished_by_next_del(tmp_path):
    conf = netconf(tmp_path, range="10.40.0.0/24")
    assert finish({"a": spawn(tmp_path, "ADD", conf, "a")})["a"][0] == 0
    code, _, _ = finish({"a": spawn(tmp_path, "DEL", conf, "a", {CRASH_ENV: "after-release"})})["a"]
    assert code == CRASH_EXIT_CODE
    root = str(tmp_path / "net-c")
    assert store_contents(root) == ({}, ["a:net1"])
    assert finish({"a": spawn(tmp_path, "DEL", conf, "a")})["a"][:2] == (0, None)
    assert store_contents(root) == ({}, [])


def test_random_sigkill_during_concurrent_adds(tmp_path):
    """Real kill -9 at random moments of 40 concurrent ADDs into a range of 24 addresses: the
    successful ones got distinct addresses that are on disk in their name; DEL of the killed ones
    and GC of the rest leave nothing behind."""
    rng = random.Random(1234)
    conf = netconf(tmp_path, version="1.1.0", range="10.50.0.0/27", range_end="10.50.0.24")
    procs = {f"k{i:02d}": spawn(tmp_path, "ADD", conf, f"k{i:02d}") for i in range(40)}
    victims = rng.sample(sorted(procs), 15)
    start = time.perf_counter()
    for cid in victims:
        time.sleep(max(0.0, start + rng.uniform(0.1, 3.0) - time.perf_counter()))
        procs[cid].send_signal(signal.SIGKILL)
    results = finish(procs)
    killed = [cid for cid in victims if results[cid][0] == -signal.SIGKILL]
    winners = {cid: addresses(res)[0] for cid, (code, res, _) in results.items() if code == 0}
    losers = [res for code, res, _ in results.values() if code not in (0, -signal.SIGKILL)]
    assert all(res["code"] == POOL_EXHAUSTED for res in losers), losers
    assert len(set(winners.values())) == len(winners) <= 24
    root = str(tmp_path / "net-c")
    files, _ = store_contents(root)
    for cid, ip in winners.items():
        assert files[ip]["containerID"] == cid
    store = LocalStore(str(tmp_path), "net-c")
    for cid in killed:
        store.release(Attachment(cid, "net1"))
    files, _ = store_contents(root)
    assert all(doc is not GARBAGE and doc["containerID"] in winners for doc in files.values())
    store.gc("net-c", set())
    assert store_contents(root) == ({}, [])
    print(f"\nSIGKILL test: {len(killed)} killed, {len(winners)} allocated, {len(losers)} exhausted")
