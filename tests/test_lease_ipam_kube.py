"""lease-ipam's Kubernetes Lease store against the fake API server over real HTTP (no client mocks).

The race across 8 node processes is in test_lease_ipam_kube_race.py.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.linux import roots
from rdmanet.cni.core.errors import (ADDRESS_UNAVAILABLE, CHECK_FAILED, INVALID_CONFIG, NOT_AVAILABLE, POOL_EXHAUSTED,
                             TRY_AGAIN_LATER)
from rdmanet.ipam.kube_config import DEFAULT_NAMESPACE, kube_settings
from rdmanet.ipam.location import CLUSTER_DOMAIN
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store.kube import ApiClientTransport, block_first, block_id, domain_hash, lease_name

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import KubeAPIServer, write_kubeconfig  # noqa: E402
from policy_file import with_keys  # noqa: E402
from lease_objects import block_leases, claim_leases  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = "ipam"


@pytest.fixture
def kubeconfig(server, tmp_path):
    return write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)


def netconf(kubeconfig, name="net-a", version="1.1.0", kube=None, **ipam):
    ipam.setdefault("range", "10.0.0.0/24")
    k = {"kubeconfig": str(kubeconfig)}
    k.update(kube or {})
    return {"cniVersion": version, "name": name, "type": "macvlan",
            "ipam": {"type": "lease-ipam", "kubernetes": k, **ipam}}


def env(command, cid="ctr1", ifname="net1", node="node-a", pod=("default", "p1", "uid-1")):
    out = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": ifname,
           "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node}
    if pod:
        out["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod[0]};K8S_POD_NAME={pod[1]};K8S_POD_UID={pod[2]}"
    return out


def call(command, conf, **kw):
    return skel.handle(LeaseIPAM(), env(command, **kw), json.dumps(conf).encode())


def leases(server):
    return claim_leases(server, NS)


def held(server):
    """{ip annotation: holderIdentity} of every Lease."""
    return {o["metadata"]["annotations"]["rdmanet.io/ip"]: o["spec"]["holderIdentity"] for o in leases(server)}


def ips(result):
    return [ip["address"] for ip in result["ips"]]


def counts(server):
    return {f"{verb} {res}": n for (verb, res), n in server.counts().items()}


# -- API calls per verb --------------------------------------------------------------------------

def test_add_is_one_list_one_create_and_repeat_add_creates_nothing(server, kubeconfig):
    """In-process (no daemon): the node's own objects are listed (never the domain's), then one
    create per claim; the node's first claim is also its block's record: no create of its own."""
    conf = netconf(kubeconfig)
    code, first = call("ADD", conf)
    assert code == 0, first
    assert counts(server) == {"list leases": 1, "create leases": 1}  # the claim, which records the node's block
    [lease] = leases(server)
    md = lease["metadata"]
    ip = ipaddress.ip_address(ips(first)[0].split("/")[0])
    assert md["name"] == f"lip-{domain_hash(CLUSTER_DOMAIN)}-{ip}"
    block = block_id(ipaddress.ip_address(block_first(ipaddress.ip_network("10.0.0.0/24"), int(ip), 16)), 16)
    assert md["labels"] == {"rdmanet.io/ipam-domain": domain_hash(CLUSTER_DOMAIN), "rdmanet.io/network": "net-a",
                            "rdmanet.io/node": "node-a", "rdmanet.io/attachment": md["labels"]["rdmanet.io/attachment"],
                            "rdmanet.io/pod-uid": "uid-1", "rdmanet.io/block": block,
                            "rdmanet.io/block-owner": "node-a", "rdmanet.io/block-group": "10.0.0.0-1024"}
    assert ip == ipaddress.ip_address("10.0.0.1") or int(ip) % 16 == 0  # the block's first usable address
    [blk] = block_leases(server, NS)
    assert blk["metadata"]["name"] == md["name"] and md["annotations"]["rdmanet.io/block-owner"] == "node-a"
    assert lease["spec"]["holderIdentity"] == "ctr1/net1" and "leaseDurationSeconds" not in lease["spec"]
    notes = md["annotations"]
    assert (notes["rdmanet.io/pod-namespace"], notes["rdmanet.io/pod-name"], notes["rdmanet.io/pod-uid"]) == ("default", "p1", "uid-1")
    assert notes["rdmanet.io/range"] == "10.0.0.0/24" and notes["rdmanet.io/network"] == "net-a"

    server.reset_counts()
    assert call("ADD", conf) == (0, first)
    assert counts(server) == {"list leases": 1}
    assert len(leases(server)) == 1

    server.reset_counts()
    code, second = call("ADD", conf, cid="ctr2")
    assert code == 0 and ips(second) != ips(first), second
    assert counts(server) == {"list leases": 1, "create leases": 1}  # the block has room: one create


def test_del_is_one_list_one_delete_and_idempotent(server, kubeconfig):
    conf = netconf(kubeconfig)
    call("ADD", conf)
    call("ADD", conf, cid="ctr2")
    server.reset_counts()
    assert call("DEL", conf, cid="ctr2") == (0, None)
    assert counts(server) == {"list leases": 1, "delete leases": 1}
    assert list(held(server).values()) == ["ctr1/net1"]
    server.reset_counts()
    # ctr1's claim is the record of the node's block: freed by one update, the block stays held
    assert call("DEL", conf) == (0, None)
    assert counts(server) == {"list leases": 1, "update leases": 1}
    assert held(server) == {}
    [blk] = block_leases(server, NS)
    assert "holderIdentity" not in blk["spec"] and "rdmanet.io/attachment" not in blk["metadata"]["labels"]
    server.reset_counts()
    assert call("DEL", conf) == (0, None)  # nothing left: success, no delete
    assert call("DEL", conf, cid="never") == (0, None)
    assert counts(server) == {"list leases": 2}


def test_dual_stack_ipv6_64_and_check(server, kubeconfig):
    conf = netconf(kubeconfig, ipRanges=[{"range": "fd00::/64"}])
    code, out = call("ADD", conf)
    assert code == 0, out
    v4, v6 = ips(out)
    assert v4.endswith("/24") and v6.startswith("fd00::") and v6.endswith("/64")
    names = sorted(o["metadata"]["name"] for o in leases(server))
    assert any(len(n.rsplit("-", 1)[1]) == 32 for n in names)  # IPv6 as 32 nibbles
    server.reset_counts()
    conf["prevResult"] = out
    assert call("CHECK", conf) == (0, None)
    assert counts(server) == {"list leases": 1}
    # a claim deleted behind our back: CHECK fails
    v6_lease = next(o for o in leases(server) if len(o["metadata"]["name"].rsplit("-", 1)[1]) == 32)
    ApiClientTransport_request(server, kubeconfig, "DELETE", v6_lease["metadata"]["name"])
    code, err = call("CHECK", conf)
    assert code == 1 and err["code"] == CHECK_FAILED, err
    # another attachment: no reservation
    code, err = call("CHECK", conf, cid="other")
    assert err["code"] == CHECK_FAILED


def ApiClientTransport_request(server, kubeconfig, method, name=None, body=None):
    """A raw request by a second client (as another node or an admin would make)."""
    from rdmanet.ipam.kube_config import connect

    conn = connect(kube_settings(netconf(kubeconfig)))
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases" + (f"/{name}" if name else "")
    return ApiClientTransport(conn.api_client).request(method, path, [], body, 5.0)


# -- all or nothing ------------------------------------------------------------------------------

def test_dual_stack_failure_half_way_leaves_no_claim(server, kubeconfig):
    conf = netconf(kubeconfig, ipRanges=[{"range": "fd00::/126"}])  # fd00::1, fd00::2 usable
    assert call("ADD", conf, cid="a")[0] == 0
    assert call("ADD", conf, cid="b")[0] == 0
    before = held(server)
    server.reset_counts()
    code, err = call("ADD", conf, cid="c")
    assert code == 1 and err["code"] == POOL_EXHAUSTED and "fd00::" in err["msg"], err
    assert held(server) == before  # the v4 claim made first was deleted
    c = counts(server)
    assert c["create leases"] == 1 and c["delete leases"] == 1


def test_requested_address_taken_half_way_rolls_back(server, kubeconfig):
    conf = netconf(kubeconfig, ipRanges=[{"range": "fd00::/64"}])
    conf["runtimeConfig"] = {"ips": ["10.0.0.50/24", "fd00::50/64"]}
    code, out = call("ADD", conf, cid="a")
    assert ips(out) == ["10.0.0.50/24", "fd00::50/64"]
    before = held(server)
    conf["runtimeConfig"] = {"ips": ["10.0.0.51/24", "fd00::50/64"]}
    code, err = call("ADD", conf, cid="b")
    assert code == 1 and err["code"] == ADDRESS_UNAVAILABLE and "a/net1" in err["msg"], err
    assert held(server) == before


def test_injected_forbidden_on_second_create_rolls_back(server, kubeconfig):
    """The second create of a dual-stack ADD is refused (403, not retried): the first is deleted."""
    conf = netconf(kubeconfig, ipRanges=[{"range": "fd00::/64"}])
    assert call("ADD", conf, cid="other")[0] == 0  # the node's blocks exist: the ADD below creates claims only
    before = held(server)
    server.reset_counts()
    armed = threading.Event()
    log_before = len(server.request_log())

    def arm():  # fail the next create as soon as the first create of this ADD is in the log
        while not armed.is_set():
            if any(e["verb"] == "create" and e["status"] == 201 for e in server.request_log()[log_before:]):
                server.fail_next(1, status=403, verb="create")
                armed.set()
            time.sleep(0.0005)

    server.inject_latency(0.3, verb="create")  # time for the watcher to arm before the second create
    t = threading.Thread(target=arm)
    t.start()
    code, err = call("ADD", conf)
    armed.set()
    t.join()
    assert code == 1 and err["code"] == 5 and "403" in err["msg"], err
    assert held(server) == before
    c = counts(server)
    assert c["create leases"] == 2 and c["delete leases"] == 1  # the first claim was made, then rolled back


# -- idempotency and attachments ------------------------------------------------------------------

def test_statefulset_reuse_old_del_leaves_new_claim(server, kubeconfig):
    conf = netconf(kubeconfig, range="10.0.0.5/32")  # one address
    code, old = call("ADD", conf, cid="old", pod=("default", "web-0", "uid-old"))
    assert code == 0
    # the old claim is freed (GC), the recreated pod (same name, new UID and container) takes the address
    ApiClientTransport_request(server, kubeconfig, "DELETE", _name(old))
    code, new = call("ADD", conf, cid="new", pod=("default", "web-0", "uid-new"))
    assert code == 0 and ips(new) == ips(old)
    lease = next(o for o in leases(server) if o["spec"]["holderIdentity"] == "new/net1")
    assert lease["metadata"]["labels"]["rdmanet.io/pod-uid"] == "uid-new"
    assert call("DEL", conf, cid="old", pod=("default", "web-0", "uid-old")) == (0, None)  # late DEL of the old
    assert held(server)[_ip(new)] == "new/net1"


def test_del_precondition_spares_a_claim_remade_between_lookup_and_delete(server, kubeconfig):
    conf = netconf(kubeconfig)
    assert call("ADD", conf, cid="first")[0] == 0  # its claim records the node's block: "a" gets a plain claim
    code, out = call("ADD", conf, cid="a")
    name = _name(out)
    original = ApiClientTransport.request  # the in-process store's transport (tests run without the daemon's cache)

    def racing_request(self, method, path, query, body, timeout):
        if method == "DELETE" and path.endswith(name) and not racing_request.done:
            racing_request.done = True
            # between our List and our DELETE, the claim is freed and re-made for another attachment
            lease = original(self, "GET", path, [], None, timeout).doc
            original(self, "DELETE", path, [], None, timeout)
            lease["metadata"] = {k: v for k, v in lease["metadata"].items() if k in ("name", "labels", "annotations")}
            lease["spec"]["holderIdentity"] = "b/net1"
            assert original(self, "POST", path.rsplit("/", 1)[0], [], lease, timeout).status == 201
        return original(self, method, path, query, body, timeout)

    racing_request.done = False
    ApiClientTransport.request = racing_request
    try:
        server.reset_counts()
        assert call("DEL", conf, cid="a") == (0, None)
    finally:
        ApiClientTransport.request = original
    assert held(server)[_ip(out)] == "b/net1"
    c = counts(server)
    assert c["delete leases"] == 2 and c["get leases"] == 2  # ours refused with 409, then the re-lookup


def test_requested_address_held_by_other_is_103_and_free_one_is_claimed(server, kubeconfig):
    conf = netconf(kubeconfig)
    conf["runtimeConfig"] = {"ips": ["10.0.0.77/24"]}
    assert ips(call("ADD", conf, cid="a")[1]) == ["10.0.0.77/24"]
    code, err = call("ADD", conf, cid="b")
    assert code == 1 and err["code"] == ADDRESS_UNAVAILABLE
    assert call("ADD", conf, cid="a")[0] == 0  # repeat ADD asking for what it holds


def test_two_networks_on_one_range_share_its_addresses(server, kubeconfig):
    """whereabouts keys its pool by the range and reserves each address across overlapping ranges
    (enable_overlapping_ranges, on by default): two NADs of other names on one range never hand
    out one address twice. A network_name is a domain of its own; overlapping ranges off keys by range."""
    a = netconf(kubeconfig, name="net-a", range="10.0.0.0/30")
    b = netconf(kubeconfig, name="net-b", range="10.0.0.0/29", range_end="10.0.0.2")  # overlaps a
    got = [_ip(call("ADD", a, cid="c0")[1]), _ip(call("ADD", b, cid="c1", node="node-b")[1])]
    assert sorted(got) == ["10.0.0.1", "10.0.0.2"]
    for conf in (a, b):
        code, err = call("ADD", conf, cid="c9")
        assert err["code"] == POOL_EXHAUSTED
    named = netconf(kubeconfig, name="net-c", range="10.0.0.0/30", network_name="team-c")
    assert _ip(call("ADD", named, cid="c7")[1]) == "10.0.0.1"  # a domain of its own
    # overlapping ranges off: the same range still shares, another (overlapping) range does not
    same = netconf(kubeconfig, name="net-d", range="10.0.0.0/30", enable_overlapping_ranges=False)
    other = netconf(kubeconfig, name="net-e", range="10.0.0.0/29", enable_overlapping_ranges=False)
    assert _ip(call("ADD", same, cid="d1")[1]) == "10.0.0.1"
    assert call("ADD", same, cid="d2")[1]["ips"][0]["address"] == "10.0.0.2/30"
    assert call("ADD", netconf(kubeconfig, name="net-f", range="10.0.0.0/30", enable_overlapping_ranges=False),
                cid="d3")[1]["code"] == POOL_EXHAUSTED
    assert _ip(call("ADD", other, cid="e1")[1]) == "10.0.0.1"
    assert call("DEL", b, cid="c1", node="node-b") == (0, None)
    assert _ip(call("ADD", a, cid="c5")[1]) == got[1]


# -- faults --------------------------------------------------------------------------------------

def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_server_is_11_quickly_and_status_50(tmp_path):
    kc = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{_closed_port()}", namespace=NS)
    conf = netconf(kc, kube={"timeout_seconds": 1.5})
    t0 = time.monotonic()
    code, err = call("ADD", conf)
    elapsed = time.monotonic() - t0
    assert code == 1 and err["code"] == TRY_AGAIN_LATER, err
    # bounded by the 1.5 s budget (a refused connect is instant); that it retries within the
    # budget is test_5xx_and_dropped_connections_are_retried's job: a lower time bound here was
    # flaky, as the last jittered backoff is skipped when it would pass the deadline
    assert elapsed < 3.0, elapsed
    assert call("DEL", conf)[1]["code"] == TRY_AGAIN_LATER
    code, err = call("STATUS", conf)
    assert err["code"] == NOT_AVAILABLE


def test_blackholed_server_times_out_per_request(tmp_path):
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # accepts connections (backlog), never answers
    try:
        kc = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{hole.getsockname()[1]}", namespace=NS)
        conf = netconf(kc, kube={"timeout_seconds": 1.5, "request_timeout_seconds": 0.4})
        t0 = time.monotonic()
        code, err = call("ADD", conf)
        assert err["code"] == TRY_AGAIN_LATER, err
        assert time.monotonic() - t0 < 3.0
    finally:
        hole.close()


def test_429_retry_after_is_honoured(server, kubeconfig):
    server.fail_next(1, status=429, retry_after=1, verb="create")
    t0 = time.monotonic()
    code, out = call("ADD", netconf(kubeconfig))
    elapsed = time.monotonic() - t0
    assert code == 0, out
    assert elapsed >= 1.0
    assert counts(server) == {"list leases": 1, "create leases": 2}  # the claim (and block record): 429, retried
    assert len(leases(server)) == 1


def test_retry_after_beyond_the_budget_fails_at_once(server, kubeconfig):
    server.fail_next(1, status=429, retry_after=30, verb="list")
    t0 = time.monotonic()
    code, err = call("ADD", netconf(kubeconfig, kube={"timeout_seconds": 5}))
    assert err["code"] == TRY_AGAIN_LATER and "Retry-After" in err["msg"], err
    assert time.monotonic() - t0 < 1.0


def test_5xx_and_dropped_connections_are_retried(server, kubeconfig):
    server.fail_next(2, status=503, verb="list")
    server.fail_next(1, status="drop", verb="create")
    code, out = call("ADD", netconf(kubeconfig))
    assert code == 0, out
    assert counts(server) == {"list leases": 3, "create leases": 2}  # the claim (and block record): dropped, retried
    assert len(leases(server)) == 1


def test_create_answered_too_late_is_recognised_as_ours(server, kubeconfig):
    """The first create commits after the client gave up; the retry meets 409 and reads it back."""
    server.inject_latency(1.0, verb="create")

    def clear_once_committed():  # from then on a create is answered at once: 409, it exists
        deadline = time.monotonic() + 10
        while not leases(server) and time.monotonic() < deadline:
            time.sleep(0.01)
        server.clear_faults()

    threading.Thread(target=clear_once_committed, daemon=True).start()
    code, out = call("ADD", netconf(kubeconfig, kube={"request_timeout_seconds": 0.3}))
    assert code == 0, out
    time.sleep(1.2)  # let the delayed creates finish
    assert held(server) == {_ip(out): "ctr1/net1"}
    assert counts(server).get("get leases") == 1


def test_forbidden_is_a_clear_error(server, kubeconfig):
    server.fail_next(1, status=403, verb="list")
    code, err = call("ADD", netconf(kubeconfig))
    assert err["code"] == 5 and "403" in err["msg"] and "leases.coordination.k8s.io" in err["details"], err


# -- GC and STATUS -------------------------------------------------------------------------------

def test_gc_frees_this_nodes_stale_claims_after_the_grace(server, kubeconfig):
    conf = netconf(kubeconfig, gc_grace_seconds=0)
    for cid in ("keep", "stale"):
        call("ADD", conf, cid=cid)
    call("ADD", conf, cid="elsewhere", node="node-b")
    call("ADD", netconf(kubeconfig, name="net-z"), cid="other-net")
    gc = dict(conf, **{"cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "net1"}]})

    young = dict(gc, ipam=dict(gc["ipam"], gc_grace_seconds=60))
    assert call("GC", young) == (0, None)
    assert len(leases(server)) == 4  # all younger than 60 s

    # The runtime no longer knows "stale": its pod, which the API does not show, is checked by the
    # liveness rule every cleaner shares (three misses, a miss counted on the Lease per GC).
    for _ in range(2):
        assert call("GC", gc) == (0, None)
    assert sorted(held(server).values()) == ["elsewhere/net1", "keep/net1", "other-net/net1", "stale/net1"]
    server.reset_counts()
    assert call("GC", gc) == (0, None)
    assert sorted(held(server).values()) == ["elsewhere/net1", "keep/net1", "other-net/net1"]
    assert counts(server) == {"list leases": 2, "list pods": 1, "get pods": 1, "delete leases": 1}
    no_key = {k: v for k, v in gc.items() if k != "cni.dev/valid-attachments"}
    assert call("GC", no_key) == (0, None)  # no keep-list: nothing freed
    assert len(leases(server)) == 3


def test_status_counts_free_and_reports_full(server, kubeconfig):
    conf = netconf(kubeconfig, range="10.0.0.0/30")
    assert call("STATUS", conf) == (0, None)
    call("ADD", conf, cid="a")
    call("ADD", conf, cid="b")
    code, err = call("STATUS", conf)
    assert err["code"] == NOT_AVAILABLE and "no free address" in err["msg"]


# -- config and imports ----------------------------------------------------------------------------

def test_namespace_resolution(server, tmp_path):
    from rdmanet.ipam.kube_config import connect

    explicit = write_kubeconfig(tmp_path / "a", server.url, namespace="ctx-ns")
    assert connect(kube_settings(netconf(explicit))).namespace == "ctx-ns"
    assert connect(kube_settings(netconf(explicit, kube={"namespace": "rdmanet-system"}))).namespace == "rdmanet-system"
    bare = write_kubeconfig(tmp_path / "b", server.url)
    assert connect(kube_settings(netconf(bare))).namespace == DEFAULT_NAMESPACE
    code, _ = call("ADD", netconf(bare))
    assert code == 0 and len(claim_leases(server, DEFAULT_NAMESPACE)) == 1


@pytest.mark.parametrize("kube,where", [
    ({"kubeconfig": "relative/path"}, "ipam.kubernetes.kubeconfig"),
    ({"kubeconfig": "/nonexistent/kubeconfig"}, "ipam.kubernetes.kubeconfig"),
    ({"namespace": "Bad_NS"}, "ipam.kubernetes.namespace"),
    ({"timeout_seconds": 0}, "ipam.kubernetes.timeout_seconds"),
    ({"k8s_api_root": "10.0.0.1:6443"}, "ipam.kubernetes.k8s_api_root"),
])
def test_bad_kubernetes_settings_are_code_7(kubeconfig, kube, where):
    conf = netconf(kubeconfig, kube=kube)
    code, err = call("ADD", conf)
    assert err["code"] == INVALID_CONFIG and where in err["msg"], err


def test_in_cluster_without_service_account_is_code_7(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "range": "10.0.0.0/24", "kubernetes": {}}}
    code, err = call("ADD", conf)
    assert err["code"] == INVALID_CONFIG and "in-cluster" in err["msg"], err


def test_k8s_api_root_overrides_the_kubeconfig_server(server, tmp_path, monkeypatch):
    """Only where the node owner allows it (apiRoots): the node's credentials go there."""
    kc = write_kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{_closed_port()}", namespace=NS)
    monkeypatch.setenv(roots.POLICY_ENV, str(with_keys(tmp_path / "policy.json", apiRoots=[server.url + "/"])))
    code, out = call("ADD", netconf(kc, kube={"k8s_api_root": server.url}))
    assert code == 0, out
    assert len(leases(server)) == 1


def test_k8s_api_root_the_kubeconfig_already_names_needs_no_policy(server, kubeconfig):
    code, out = call("ADD", netconf(kubeconfig, kube={"k8s_api_root": server.url.upper().replace("HTTP://", "http://") + "/"}))
    assert code == 0, out
    assert len(leases(server)) == 1


def test_k8s_api_root_elsewhere_never_receives_the_credentials(server, tmp_path):
    """A tenant's NAD naming a server of its own: error 7 naming the key, and not one request
    (so not one token) reaches that server."""
    elsewhere = KubeAPIServer().start()
    try:
        kc = write_kubeconfig(tmp_path / "kc", server.url, namespace=NS)
        for command in ("ADD", "CHECK", "DEL"):
            code, err = call(command, netconf(kc, kube={"k8s_api_root": elsewhere.url}))
            if command == "DEL" and code == 0:
                continue  # DEL only cleans up: nothing to free, nothing sent
            assert code != 0 and err["code"] == INVALID_CONFIG, (command, err)
            assert "ipam.kubernetes.k8s_api_root" in err["msg"] and "apiRoots" in err["details"], err
        assert elsewhere.count() == 0
        assert leases(server) == []
    finally:
        elsewhere.stop()


def test_local_store_never_imports_kubernetes(tmp_path):
    script = (
        "import json, sys\n"
        "from rdmanet.cni.core import skel\n"
        "from rdmanet.ipam.plugin import LeaseIPAM\n"
        f"conf = {{'cniVersion': '1.1.0', 'name': 'n', 'type': 'x', 'ipam': {{'type': 'lease-ipam', 'range': '10.0.0.0/24', 'dataDir': '{tmp_path}'}}}}\n"
        "for cmd in ('ADD', 'CHECK', 'STATUS', 'DEL'):\n"
        "    e = {'CNI_COMMAND': cmd, 'CNI_CONTAINERID': 'c', 'CNI_NETNS': '/x', 'CNI_IFNAME': 'eth1', 'CNI_PATH': '/o'}\n"
        "    code, out = skel.handle(LeaseIPAM(), e, json.dumps(conf).encode())\n"
        "    assert code == 0, out\n"
        "print(any(m == 'kubernetes' or m.startswith('kubernetes.') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_exec_through_python_m_ipam(server, kubeconfig, tmp_path):
    conf_file = tmp_path / "conf.json"
    conf_file.write_text(json.dumps(netconf(kubeconfig)))
    e = dict(os.environ, PYTHONPATH=ROOT, **env("ADD"))
    with open(conf_file, "rb") as stdin:
        out = subprocess.run([sys.executable, "-m", "rdmanet.ipam"], stdin=stdin, capture_output=True, env=e, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["ips"][0]["address"].startswith("10.0.0.")
    assert counts(server) == {"list leases": 1, "create leases": 1}  # the claim, which records the node's block


def _ip(result):
    return result["ips"][0]["address"].split("/")[0]


def _name(result, domain=CLUSTER_DOMAIN):
    return lease_name(domain_hash(domain), ipaddress.ip_address(_ip(result)))


def test_a_whereabouts_nad_works_with_only_the_type_changed(server, kubeconfig, tmp_path):
    """The acceptance case: a NAD's ipam block written for whereabouts (range in first-last/prefix
    form, exclude, kubernetes.kubeconfig, log_file/log_level, whereabouts-only keys it ignores)
    with ``"type": "lease-ipam"`` and nothing else edited. The kubeconfig's context namespace
    holds the Leases, as whereabouts' does."""
    whereabouts = {
        "type": "whereabouts",
        "range": "192.168.2.225-192.168.2.238/28",
        "exclude": ["192.168.2.229/30", "192.168.2.236/32"],
        "gateway": "192.168.2.225",
        "kubernetes": {"kubeconfig": str(kubeconfig)},
        "log_file": str(tmp_path / "whereabouts.log"),
        "log_level": "debug",
        "enable_overlapping_ranges": True,
        "leader_lease_duration": 1500,
    }
    conf = {"cniVersion": "0.3.1", "name": "whereabouts-net", "type": "macvlan",
            "ipam": {**whereabouts, "type": "lease-ipam"}}
    got = []
    for i in range(8):
        code, doc = call("ADD", conf, cid=f"ctr{i}", pod=("default", f"p{i}", f"uid-{i}"))
        if code:
            assert doc["code"] == POOL_EXHAUSTED, doc
            break
        [ipc] = doc["ips"]
        assert ipc["version"] == "4" and ipc["gateway"] == "192.168.2.225"
        got.append(ipaddress.ip_interface(ipc["address"]))
    usable = {ipaddress.ip_address(f"192.168.2.{n}") for n in range(226, 239)} - {
        ipaddress.ip_address(f"192.168.2.{n}") for n in (228, 229, 230, 231, 236)}
    assert {g.ip for g in got} == usable  # every usable address once, none excluded, not the gateway
    assert all(g.network.prefixlen == 28 for g in got)
    assert len(leases(server)) == len(usable)
    for i in range(len(got)):
        assert call("DEL", conf, cid=f"ctr{i}", pod=("default", f"p{i}", f"uid-{i}")) == (0, None)
    assert leases(server) == []
