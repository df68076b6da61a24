"""8 OS processes acting as 8 nodes race for one /24 through the Kubernetes Lease store.

Each process imports the plugin once and runs its ADDs through ``skel.handle`` (the code path of
``python -m rdmanet.ipam`` without 400 interpreter starts). Run as a script, this file is that worker:
``python tests/test_lease_ipam_kube_race.py <conf.json> <node> <count>``; it prints ``ready``,
waits for a line on stdin, runs the ADDs, prints their outcomes as one JSON line, waits for a
second line, DELs its successes and prints those outcomes.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
from lease_objects import block_leases, claim_leases

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODES = 8
PER_NODE = 50


def _env(command, cid, node):
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
            "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node,
            "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid};K8S_POD_UID=uid-{cid}"}


def worker(conf_path: str, node: str, count: int) -> None:
    from rdmanet.cni.core import skel
    from rdmanet.ipam.kube_config import connect, kube_settings
    from rdmanet.ipam.plugin import LeaseIPAM

    stdin = json.load(open(conf_path))
    conf = json.dumps(stdin).encode()
    connect(kube_settings(stdin))  # import the client and read the kubeconfig before the start line
    plugin = LeaseIPAM()
    print("ready", flush=True)
    sys.stdin.readline()
    adds = []
    for i in range(count):
        cid = f"{node}-c{i:03d}"
        t0 = time.perf_counter()
        code, out = skel.handle(plugin, _env("ADD", cid, node), conf)
        adds.append([cid, code, out, time.perf_counter() - t0])
    print(json.dumps(adds), flush=True)
    sys.stdin.readline()
    dels = []
    for cid, code, _, _ in adds:
        if code == 0:
            t0 = time.perf_counter()
            code, out = skel.handle(plugin, _env("DEL", cid, node), conf)
            dels.append([cid, code, out, time.perf_counter() - t0])
    print(json.dumps(dels), flush=True)


def test_8_nodes_race_for_a_24(tmp_path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from kube_api_server import KubeAPIServer, write_kubeconfig

    from rdmanet.cni.core.errors import POOL_EXHAUSTED

    server = KubeAPIServer()
    try:
        kc = write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace="ipam")
        conf = {"cniVersion": "1.1.0", "name": "race", "type": "macvlan",
                "ipam": {"type": "lease-ipam", "range": "10.30.0.0/24", "kubernetes": {"kubeconfig": kc}}}
        conf_path = tmp_path / "conf.json"
        conf_path.write_text(json.dumps(conf))
        env = dict(os.environ, PYTHONPATH=ROOT)
        procs = [subprocess.Popen([sys.executable, __file__, str(conf_path), f"node-{n}", str(PER_NODE)], cwd=ROOT,
                                  env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for n in range(NODES)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        server.reset_counts()
        t0 = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        adds = [row for p in procs for row in json.loads(p.stdout.readline())]
        t_add = time.perf_counter() - t0
        add_counts = server.counts()

        ok = [(cid, out) for cid, code, out, _ in adds if code == 0]
        failed = [out for _, code, out, _ in adds if code != 0]
        got = [out["ips"][0]["address"] for _, out in ok]
        assert len(got) == 254 and len(set(got)) == 254, collections.Counter(got).most_common(3)
        assert len(failed) == NODES * PER_NODE - 254
        assert all(err["code"] == POOL_EXHAUSTED for err in failed), [e for e in failed if e["code"] != POOL_EXHAUSTED][:3]
        stored = claim_leases(server, "ipam")
        assert len(stored) == 254
        assert {o["spec"]["holderIdentity"].split("/")[0] for o in stored} == {cid for cid, _ in ok}
        per_node = collections.Counter(cid.rsplit("-", 1)[0] for cid, _ in ok)
        assert len(per_node) == NODES  # every node got addresses

        server.reset_counts()
        t0 = time.perf_counter()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        dels = [row for p in procs for row in json.loads(p.stdout.readline())]
        t_del = time.perf_counter() - t0
        for p in procs:
            assert p.wait(timeout=30) == 0
        assert len(dels) == 254 and all(code == 0 for _, code, _, _ in dels)
        assert claim_leases(server, "ipam") == []
        del_counts = server.counts()
        # a claim that records its node's block is freed by an update (the block stays held until released)
        records = len(block_leases(server, "ipam"))
        assert records >= NODES
        assert del_counts == {("list", "leases"): 254, ("delete", "leases"): 254 - records, ("update", "leases"): records}

        lat = sorted(t for *_, t in adds)
        creates = add_counts.get(("create", "leases"), 0)
        print(f"\n8x{PER_NODE} ADDs: {t_add:.2f} s, p50 {lat[len(lat) // 2] * 1000:.1f} ms, "
              f"p99 {lat[int(len(lat) * 0.99)] * 1000:.1f} ms, max {lat[-1] * 1000:.1f} ms; "
              f"API {dict(add_counts)}; 409s {creates - 254}; 254 DELs: {t_del:.2f} s")
        # Without a daemon each ADD Lists its node's objects; once every block is held (16 blocks
        # of 16 for 8 nodes), an ADD also reads the domain's blocks and its claims before
        # borrowing or saying "exhausted": at most 3 Lists per ADD, never the domain per ADD before that.
        assert NODES * PER_NODE <= add_counts[("list", "leases")] <= 3 * NODES * PER_NODE
    finally:
        for p in locals().get("procs", []):
            if p.poll() is None:
                p.kill()
        server.stop()


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
