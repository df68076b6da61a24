"""The NVIDIA Network Operator's IPoIB guide switched to lease-ipam by changing ``type``, on 3 nodes as
the DaemonSet runs them, on the real kube-apiserver with nv-ipam's CRDs.

Each node is a real ``rdmanet daemon`` behind install.sh's daemon-only lease-ipam shim with the
``rdmanet`` ServiceAccount's token and deploy/rbac.yaml (kube_real_nodes.Node). The pool is the
guide's ``ipoib-pool-a`` (192.168.5.0/24, perNodeBlockSize 50, gateway 192.168.5.1) in
``nvidia-network-operator``; the test plays nv-ipam's controller (each node's block in
``status.allocations``). 3 nodes x 40 ADDs race (4 runtime threads per node), in both modes: no
address twice, every one inside its node's nv-ipam block while nv-ipam's blocks apply, the gateway
in every result; the ServiceAccount only ever gets the pool, and is refused nothing.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_real_nodes import NS, Node, Objects  # noqa: E402
from kube_real_server import RealServer  # noqa: E402
from nv_ipam_objects import IPPOOL, OPERATOR_NS, ippool_blocks, put_pool  # noqa: E402

NODES = ["node-a", "node-b", "node-c"]
PER_NODE = 40
SEED_SPEC = {"subnet": "192.168.5.0/24", "perNodeBlockSize": 50, "gateway": "192.168.5.1"}
SA_USER = f"system:serviceaccount:{NS}:rdmanet"


@pytest.fixture
def admin(real_apiserver):
    srv = RealServer(real_apiserver)
    Objects(real_apiserver).clean()
    yield srv
    srv.close()


def seed_nad(kubeconfig):
    """ipoib-network-a as the guide renders it, ``type`` changed; the kubeconfig is the node's."""
    return {"cniVersion": "1.0.0", "name": "ipoib-network-a", "type": "ipoib", "master": "ibs1f0",
            "ipam": {"type": "lease-ipam", "poolName": "ipoib-pool-a", "kubernetes": {"kubeconfig": str(kubeconfig)}}}


def blocks():
    return {b["nodeName"]: (int(ipaddress.ip_address(b["startIP"])), int(ipaddress.ip_address(b["endIP"])))
            for b in ippool_blocks(SEED_SPEC["subnet"], SEED_SPEC["perNodeBlockSize"], NODES)}


def pool_requests(cluster, since):
    """(verb, resource, code) of the ServiceAccount's requests on anything but Leases, Nodes and pods."""
    out = collections.Counter()
    for e in cluster.audit_events(since, stage="ResponseComplete"):
        ref = e.get("objectRef") or {}
        if e["user"]["username"] == SA_USER and ref.get("resource") not in ("leases", "nodes", "pods"):
            out[(e["verb"], f"{ref.get('resource')}.{ref.get('apiGroup')}", e["responseStatus"]["code"])] += 1
    return out


@pytest.mark.parametrize("mode", ["nv-ipam", "lease-ipam"])
def test_three_node_daemons_race_forty_adds_each_on_the_guides_pool(real_apiserver, admin, tmp_path, mode):
    annotations = {"rdmanet.io/node-blocks": "lease-ipam"} if mode == "lease-ipam" else None
    put_pool(admin, IPPOOL, OPERATOR_NS, "ipoib-pool-a", SEED_SPEC,
             ippool_blocks(SEED_SPEC["subnet"], SEED_SPEC["perNodeBlockSize"], NODES), annotations)
    token = real_apiserver.token()
    nodes = [Node(real_apiserver, tmp_path / name, token, node=name) for name in NODES]
    try:
        for node in nodes:
            node.conf = seed_nad(node.kubeconfig)
            node.daemon()
        since = real_apiserver.audit_offset()
        pods = [(node, f"{node.name}-p{i:02d}") for node in nodes for i in range(PER_NODE)]
        with ThreadPoolExecutor(4 * len(nodes)) as pool:
            rows = list(pool.map(lambda p: (p[0].name, p[1], *p[0].cni("ADD", p[1], f"uid-{p[1]}")), pods))
        failed = [(cid, out) for _, cid, code, out in rows if code != 0]
        assert failed == [], failed[:3]
        results = [(name, json.loads(out)["ips"][0]) for name, _, _, out in rows]
        got = [ip["address"] for _, ip in results]
        assert len(set(got)) == len(pods) == 120, collections.Counter(got).most_common(3)
        assert all(a.endswith("/24") and ip["gateway"] == "192.168.5.1" for a, (_, ip) in zip(got, results))
        assert "192.168.5.1/24" not in got
        if mode == "nv-ipam":
            for name, ip in results:
                lo, hi = blocks()[name]
                assert lo <= int(ipaddress.ip_address(ip["address"].split("/")[0])) <= hi, (name, ip)
        held = Objects(real_apiserver).holders()
        assert sorted(held) == sorted(f"{cid}/net1" for _, cid in pods)
        requests = pool_requests(real_apiserver, since)
        # got, never refused: looked for in kube-system (nv-ipam's default, 404 here), then found in
        # the operator's namespace
        assert set(requests) == {("get", "ippools.nv-ipam.nvidia.com", 404), ("get", "ippools.nv-ipam.nvidia.com", 200)}
        # each daemon keeps what it read for a few seconds: far fewer reads than ADDs
        assert sum(requests.values()) < len(pods), requests
    finally:
        for node in nodes:
            node.stop()
