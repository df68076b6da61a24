"""macvlan-rdma + lease-ipam through the CNI shims, with the node daemon up and down (root).

The shims are written into a temporary bin dir with a private daemon socket; every daemon a test
starts is stopped (and its socket removed) in a finally.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]

from rdmanet.node.testing import Daemon, health, write_shims

PREFIX = nt.PREFIX


@pytest.fixture
def shim_dir():
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"{PREFIX}-shim-"))
    try:
        write_shims(root / "bin", str(root / "run" / "daemon.sock"))
        nt.node_policy_env(root)  # the node policy the calls name: roots in this directory
        yield root
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def start_daemon(shim_dir: pathlib.Path) -> Daemon:
    return Daemon(str(shim_dir / "run" / "daemon.sock"))


def conf(master: str, data_dir: pathlib.Path, prefix: str, version: str = "1.0.0") -> dict:
    return nt.single("shimnet", version, nt.macvlan(master, nt.lease_ipam(data_dir, f"{prefix}.0/24", gateway=f"{prefix}.1")))


def run(shim_dir, command, stdin, ns, cid):
    return nt.raw_exec(shim_dir / "bin" / nt.PLUGIN, command, stdin, netns=ns.path, container_id=cid,
                       cni_path=[shim_dir / "bin"], extra_env={"RDMANET_NODE_POLICY": str(shim_dir / "node-policy.json")})


def shape(result: dict) -> dict:
    return {
        "cniVersion": result["cniVersion"],
        "interfaces": [(i["name"], "sandbox" in i) for i in result["interfaces"]],
        "ips": [(ip["address"], ip.get("gateway"), ip.get("interface")) for ip in result["ips"]],
        "keys": sorted(result),
    }


def test_add_check_del_same_with_daemon_up_and_down(shim_dir, netns, master):
    m = master()
    prefix, _ = nt.random_subnet()
    outcomes = []
    for label in ("daemon", "exec"):
        ns = netns()
        stdin = conf(m.name, shim_dir / f"data-{label}", prefix)
        d = start_daemon(shim_dir) if label == "daemon" else None
        try:
            add = run(shim_dir, "ADD", stdin, ns, "cid-1")
            assert add.returncode == 0, add.stdout + add.stderr
            result = json.loads(add.stdout)
            addrs = nt.addresses(ns.name, "net1")
            check = run(shim_dir, "CHECK", {**stdin, "prevResult": result}, ns, "cid-1")
            delete = run(shim_dir, "DEL", stdin, ns, "cid-1")
            gone = nt.link(ns.name, "net1") is None
            if d:
                assert health(d.socket)["requests"] == 3
        finally:
            if d:
                d.cleanup()
        outcomes.append((shape(result), addrs, check.returncode, check.stdout, delete.returncode, delete.stdout, gone))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1] == [f"{prefix}.2/24"] and outcomes[0][2:] == (0, "", 0, "", True)


def _thread_netns(pid: int) -> tuple[str, dict[str, str]]:
    own = os.readlink(f"/proc/{pid}/ns/net")
    tasks = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            tasks[tid] = os.readlink(f"/proc/{pid}/task/{tid}/ns/net")
        except FileNotFoundError:
            pass
    return own, tasks


def test_concurrent_adds_through_daemon(shim_dir, netns, master):
    m = master()
    prefix, _ = nt.random_subnet()
    namespaces = [netns() for _ in range(20)]
    stdin = conf(m.name, shim_dir / "data", prefix)
    d = start_daemon(shim_dir)
    try:
        with ThreadPoolExecutor(20) as pool:
            adds = list(pool.map(lambda i: run(shim_dir, "ADD", stdin, namespaces[i], f"cid-{i}"), range(20)))
            own, tasks = _thread_netns(d.pid)  # right after the burst
            assert set(tasks.values()) == {own}, tasks
            for proc in adds:
                assert proc.returncode == 0, proc.stdout + proc.stderr
            addresses = [json.loads(p.stdout)["ips"][0]["address"] for p in adds]
            assert len(set(addresses)) == 20
            assert len(nt.address_files(shim_dir / "data")) == 20
            for ns, address in zip(namespaces, addresses):
                assert nt.addresses(ns.name, "net1") == [address]
            dels = list(pool.map(lambda i: run(shim_dir, "DEL", stdin, namespaces[i], f"cid-{i}"), range(20)))
        assert all(p.returncode == 0 for p in dels)
        time.sleep(0.2)
        own, tasks = _thread_netns(d.pid)
        assert set(tasks.values()) == {own}, tasks
        assert health(d.socket)["requests"] == 40
        assert nt.address_files(shim_dir / "data" / "shimnet") == {}
    finally:
        d.cleanup()
    assert not os.path.exists(d.socket)
