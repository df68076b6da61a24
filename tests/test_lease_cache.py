"""lease-ipam's Lease watch cache (rdmanet/ipam/store/lease_cache.py), as the node daemon uses it.

Everything runs against the fake API server over real HTTP, with the cache enabled in this
test process (``use_watch_cache(True)``, as rdmanet/node/daemon.py does) and stopped after each test.
"Another process" is a KubeStore without a cache (what the in-process plugin uses), direct
POST/DELETE requests, or worker processes of test_lease_ipam_kube_race.py. Assertions are on
request counts and outcomes, never on timing; waits are bounded polls.
"""

from __future__ import annotations

import collections
import ipaddress
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import POOL_EXHAUSTED
from rdmanet.ipam.config import parse_ipam_config
from rdmanet.ipam.kube_config import connect, kube_settings
from rdmanet.ipam.location import CLUSTER_DOMAIN
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store import lease_cache
from rdmanet.ipam.store.base import Attachment
from rdmanet.ipam.store.kube import (
    L_ATTACHMENT,
    L_NODE,
    LEASES_PATH,
    ApiClientTransport,
    KubeStore,
    attachment_hash,
    domain_hash,
    lease_name,
    use_watch_cache,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_servers import api_server  # noqa: E402
from kube_api_server import KubeAPIServer, parse_label_selector, write_kubeconfig  # noqa: E402
from lease_objects import block_leases, block_owner, claim_leases  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NS = "ipam"
RACE_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_lease_ipam_kube_race.py")


@pytest.fixture
def server(request):
    with api_server(request, bookmark_interval=0.2) as srv:
        yield srv
        srv.resume_watches()


@pytest.fixture
def kubeconfig(server, tmp_path):
    return write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)


@pytest.fixture
def cache():
    """Turn the cache on in this process with the given settings; off (threads stopped) after.
    Budgets are generous unless a test wants them to run out: a loaded machine must not turn
    an exact request count into a fallback List."""
    def on(**settings):
        settings.setdefault("distrust_seconds", 0.0)
        settings.setdefault("echo_budget", 10.0)
        settings.setdefault("sync_budget", 10.0)
        use_watch_cache(True, **settings)
    on()
    yield on
    use_watch_cache(False)


def netconf(kubeconfig, name="net-a", **ipam):
    ipam.setdefault("range", "10.0.0.0/24")
    return {"cniVersion": "1.1.0", "name": name, "type": "macvlan",
            "ipam": {"type": "lease-ipam", "kubernetes": {"kubeconfig": str(kubeconfig)}, **ipam}}


def env(command, cid, ifname="net1", node="node-a"):
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": ifname,
            "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node,
            "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid};K8S_POD_UID=uid-{cid}"}


def call(command, conf, cid, **kw):
    return skel.handle(LeaseIPAM(), env(command, cid, **kw), json.dumps(conf).encode())


def add_ip(conf, cid, **kw):
    code, out = call("ADD", conf, cid, **kw)
    assert code == 0, out
    return out["ips"][0]["address"].split("/")[0]


def counts(server):
    return {f"{verb} {res}": n for (verb, res), n in server.counts().items()}


def held(server):
    return {o["metadata"]["annotations"]["rdmanet.io/ip"]: o["spec"]["holderIdentity"] for o in claim_leases(server, NS)}


def wait_for(predicate, what, timeout=10.0):
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def the_informer():
    [inf] = lease_cache.informers()
    return inf


def cache_threads():
    return [t for t in threading.enumerate() if t.name.startswith("lease-cache")]


def in_sync(server, inf):
    """The informer's entries are exactly the server's Leases its selector names (the node's
    claims and blocks), names and UIDs."""
    selected = parse_label_selector(inf.selector)
    want = {o["metadata"]["name"]: o["metadata"]["uid"] for o in server.objects("leases", NS)
            if selected(o["metadata"].get("labels") or {})}
    with inf._cond:
        have = {n: e.uid for n, e in inf._entries.items() if e.confirmed}
    return have == want


def other_store(kubeconfig, domain=CLUSTER_DOMAIN, node="node-b"):
    """Another process's view: a KubeStore without a cache (as the in-process plugin runs)."""
    conn = connect(kube_settings(netconf(kubeconfig)))
    return KubeStore(ApiClientTransport(conn.api_client, conn.host), NS, domain, node=node)


def range_sets(conf):
    return parse_ipam_config(conf).range_sets


def raw(kubeconfig, method, name=None, body=None, query=()):
    conn = connect(kube_settings(netconf(kubeconfig)))
    path = LEASES_PATH.format(namespace=NS) + (f"/{name}" if name else "")
    return ApiClientTransport(conn.api_client).request(method, path, list(query), body, 5.0)


def synced_domain(server, conf):
    """Start the domain's informer with a first ADD (and DEL), wait until it is in sync."""
    add_ip(conf, "warm-up")
    assert call("DEL", conf, "warm-up")[0] == 0
    inf = the_informer()
    wait_for(lambda: inf.usable() and in_sync(server, inf), "the informer to sync")
    server.reset_counts()
    return inf


# -- request counts -------------------------------------------------------------------------------

def test_add_after_sync_is_one_create_and_no_list(server, kubeconfig, cache):
    conf = netconf(kubeconfig)
    code, out = call("ADD", conf, "c0")
    assert code == 0, out
    c = counts(server)
    # the claim, which is also the record of the node's block (no create of its own); the
    # informer's List (of this node's objects only)
    assert c["create leases"] == 1 and c["watch leases"] == 1 and c["list leases"] == 1
    [listed] = [e for e in server.request_log() if e["verb"] == "list"]
    assert listed["query"]["labelSelector"].endswith(f"{L_NODE}=node-a")
    inf = the_informer()
    wait_for(inf.usable, "sync")
    assert inf.thread.daemon

    server.reset_counts()
    got = [add_ip(conf, f"c{i}") for i in range(1, 6)]
    assert counts(server) == {"create leases": 5}  # no List, no GET
    assert len(set(got)) == 5

    server.reset_counts()
    assert add_ip(conf, "c3") == got[2]  # repeat ADD: the claim the cache shows, confirmed by one GET
    assert counts(server) == {"get leases": 1}

    server.reset_counts()
    assert call("DEL", conf, "c3") == (0, None)
    assert counts(server) == {"delete leases": 1}
    assert got[2] not in held(server)
    server.reset_counts()
    assert call("DEL", conf, "c3") == (0, None)  # the cache shows nothing: the attachment's List decides
    assert counts(server) == {"list leases": 1}
    [entry] = server.request_log()
    assert f"{L_ATTACHMENT}={attachment_hash(Attachment('c3', 'net1'))}" in entry["query"]["labelSelector"]

    server.reset_counts()
    assert call("STATUS", conf, "x") == (0, None)  # a running informer answers STATUS
    assert counts(server) == {}


def test_in_process_plugin_starts_no_thread(server, kubeconfig):
    assert not lease_cache.enabled()
    add_ip(netconf(kubeconfig), "c0")
    assert call("DEL", netconf(kubeconfig), "c0") == (0, None)
    assert cache_threads() == [] and lease_cache.informers() == []
    # ADD: the node's objects (never the domain's) and the claim that records its block; DEL: the
    # attachment's List and the update freeing the record's address (the block stays held)
    assert counts(server) == {"list leases": 2, "create leases": 1, "update leases": 1}


# -- a lagging cache --------------------------------------------------------------------------------

def test_repeat_add_with_the_watch_lagging_returns_the_same_address(server, kubeconfig, cache):
    cache(echo_budget=0.3)
    conf = netconf(kubeconfig)
    synced_domain(server, conf)
    server.pause_watches()
    first = add_ip(conf, "x")  # the watch cannot deliver our claim: after the echo budget, a List of "x" checks
    c = counts(server)
    assert c == {"create leases": 1, "list leases": 1}, c
    server.reset_counts()
    assert add_ip(conf, "x") == first  # written through: seen before the watch delivers it
    c = counts(server)
    c.pop("watch leases", None)  # the informer re-opening the watch the missed echo aborted (not the verb's)
    assert c == {"get leases": 1}, c
    server.resume_watches()
    inf = the_informer()
    wait_for(lambda: in_sync(server, inf), "the watch to catch up")
    assert add_ip(conf, "x") == first
    assert held(server) == {first: "x/net1"}


def test_repeat_add_after_a_claim_by_another_process_that_the_cache_has_not_seen(server, kubeconfig, cache):
    """The first ADD ran in another process (the in-process fallback during a daemon restart);
    the repeat ADD reaches the daemon before its watch delivered that claim."""
    cache(echo_budget=0.3)
    conf = netconf(kubeconfig)
    synced_domain(server, conf)
    server.pause_watches()
    theirs = other_store(kubeconfig, node="node-a").allocate(Attachment("y", "net1"), "net-a", range_sets(conf), {})
    server.reset_counts()
    assert add_ip(conf, "y") == str(theirs[0])  # ours was created, then given up for theirs
    assert held(server) == {str(theirs[0]): "y/net1"}
    c = counts(server)
    # ours was made after the cursor (the cache had not seen theirs); theirs read back, ours freed
    assert c == {"create leases": 1, "list leases": 1, "get leases": 1, "delete leases": 1}, c


def test_repeat_add_adopts_the_other_claim_once_the_watch_delivers(server, kubeconfig, cache):
    """As above, but the watch catches up while the ADD waits for its own claim's event: the
    cache then shows the other claim and no List is needed."""
    cache(echo_budget=10.0)
    conf = netconf(kubeconfig)
    synced_domain(server, conf)
    server.pause_watches()
    theirs = other_store(kubeconfig, node="node-a").allocate(Attachment("z", "net1"), "net-a", range_sets(conf), {})
    server.reset_counts()
    resumer = resume_after(server, "create", 201)
    try:
        assert add_ip(conf, "z") == str(theirs[0])
    finally:
        resumer.finish()
    # ours, then theirs confirmed by a GET before it is returned, then ours freed
    assert counts(server) == {"create leases": 1, "get leases": 1, "delete leases": 1}
    assert held(server) == {str(theirs[0]): "z/net1"}


def test_claims_of_other_nodes_are_never_delivered_and_never_double_allocated(server, kubeconfig, cache):
    """The daemon watches its own node's claims and blocks only. Another node's claims
    never reach its cache; it still never hands out one of them: it allocates in its own block,
    borrows in the other node's block when no block is free (reading that block's claims), and
    a claim it could not see (a bare POST into its own block) costs a 409, not a duplicate."""
    conf = netconf(kubeconfig, range="10.0.0.0/27")  # 30 addresses: two blocks of 16 (15 usable each)
    inf = synced_domain(server, conf)
    others = other_store(kubeconfig)
    rs = range_sets(conf)
    theirs = [str(others.allocate(Attachment(f"o{i}", "net1"), "net-a", rs, {})[0]) for i in range(10)]
    free_mine = sorted(set(f"10.0.0.{n}" for n in range(1, 31)) - set(theirs), key=ipaddress.ip_address)
    posted = free_mine[-1]  # a claim by a bare POST (as node-b would make), labelled for node-b
    body = others.leases.body(ipaddress.ip_address(posted), Attachment("posted", "net1"), "net-a", rs[0])
    assert raw(kubeconfig, "POST", body=body).status == 201
    time.sleep(0.2)
    with inf._cond:
        names = set(inf._entries)
    assert not any(name.endswith(tuple("-" + ip for ip in theirs + [posted])) for name in names)  # never delivered here
    got = []
    while True:
        code, out = call("ADD", conf, f"m{len(got)}")
        if code:
            assert out["code"] == POOL_EXHAUSTED, out
            break
        got.append(out["ips"][0]["address"].split("/")[0])
    everyone = theirs + [posted] + got
    assert len(everyone) == len(set(everyone)) == 30  # the pool is used to its last address, nothing twice
    wait_for(lambda: in_sync(server, inf), "the watch to catch up")
    assert sorted(held(server)) == sorted(everyone)
    # the other node kept its block: node-a borrowed what was left of it
    blocks = {o["metadata"]["labels"]["rdmanet.io/block"]: block_owner(o) for o in block_leases(server, NS)}
    assert sorted(blocks.values()) == ["node-a", "node-b"], blocks


def test_a_full_pool_is_only_reported_after_a_list(server, kubeconfig, cache):
    """The cache lags behind a release: by its used set the pool is full, but ADD and STATUS
    List before they say so."""
    conf = netconf(kubeconfig, range="10.0.0.0/30")  # 10.0.0.1 and 10.0.0.2
    inf = synced_domain(server, conf)
    add_ip(conf, "a")
    others = other_store(kubeconfig, node="node-a")  # another process on this node (the in-process plugin)
    [theirs] = others.allocate(Attachment("b", "net1"), "net-a", range_sets(conf), {})
    wait_for(lambda: in_sync(server, inf) and len(inf.used(4)) == 2, "the cache to see a full pool")
    server.pause_watches()
    assert others.release(Attachment("b", "net1")) == [theirs]
    server.reset_counts()
    assert call("STATUS", conf, "x") == (0, None)
    assert counts(server) == {"list leases": 1}
    assert str(theirs) == "10.0.0.1"  # the record of the node's block, free since the warm-up's DEL
    server.reset_counts()
    resumer = resume_after(server, "update", 200)
    try:
        assert add_ip(conf, "c") == str(theirs)
    finally:
        resumer.finish()
    # the node's one block looks full: the records of its group (all held), then the domain's
    # claims, which show the record free: taken back by one update
    assert counts(server) == {"list leases": 2, "update leases": 1}
    wait_for(lambda: in_sync(server, inf), "sync")
    server.reset_counts()
    code, err = call("ADD", conf, "d")
    assert code == 1 and err["code"] == POOL_EXHAUSTED, err
    assert counts(server) == {"list leases": 1}


# -- stream faults ----------------------------------------------------------------------------------

@pytest.mark.fake_only("the fake compacts its history on demand (compact()); a real server keeps at least 75 s of "
                       "watch history and compacts etcd every 5 minutes")
def test_410_gone_lists_again_and_the_state_is_right(server, kubeconfig, cache):
    conf = netconf(kubeconfig)
    inf = synced_domain(server, conf)
    a = add_ip(conf, "a")
    b = add_ip(conf, "b")
    wait_for(lambda: in_sync(server, inf), "sync")
    server.pause_watches()
    others = other_store(kubeconfig)
    rs = range_sets(conf)
    for i in range(3):
        others.allocate(Attachment(f"o{i}", "net1"), "net-a", rs, {})
    assert others.release(Attachment("a", "net1")) == [ipaddress.ip_address(a)]  # freed behind the cache's back
    server.compact()  # the history the watch needs is gone
    server.reset_counts()
    server.resume_watches()
    wait_for(lambda: inf.stats["relists"] >= 1 and inf.usable() and in_sync(server, inf), "the re-List")
    assert counts(server).get("list leases") == 1  # one page
    assert inf.claims_of(Attachment("a", "net1")) == []
    server.reset_counts()
    new = add_ip(conf, "c")
    assert new not in held(server) or held(server)[new] == "c/net1"
    assert counts(server) == {"create leases": 1}
    assert add_ip(conf, "b") == b


@pytest.mark.fake_only("the fake compacts its history on demand (compact()); a real server keeps at least 75 s of "
                       "watch history and compacts etcd every 5 minutes")
def test_watch_started_from_a_compacted_version_gets_410_and_relists(server, kubeconfig, cache):
    conf = netconf(kubeconfig)
    inf = synced_domain(server, conf)
    server.pause_watches()
    other_store(kubeconfig).allocate(Attachment("o", "net1"), "net-a", range_sets(conf), {})
    server.compact()
    server.reset_counts()
    assert server.drop_watches() == 1  # the re-watch from the old resourceVersion meets 410 at once
    server.resume_watches()
    wait_for(lambda: inf.stats["relists"] >= 1 and inf.usable() and in_sync(server, inf), "the re-List")
    c = counts(server)
    assert c["list leases"] == 1 and c["watch leases"] >= 2, c


def test_dropped_stream_recovers_without_a_list(server, kubeconfig, cache):
    conf = netconf(kubeconfig)
    inf = synced_domain(server, conf)
    lists = inf.stats["lists"]
    assert server.drop_watches() == 1
    # another process on this node (the in-process plugin): its claims carry this node's label
    theirs = other_store(kubeconfig, node="node-a").allocate(Attachment("o", "net1"), "net-a", range_sets(conf), {})
    body = other_store(kubeconfig, node="node-a").leases.body(ipaddress.ip_address("10.0.0.250"), Attachment("p", "net1"), "net-a",
                                         range_sets(conf)[0])
    assert raw(kubeconfig, "POST", body=body).status == 201
    wait_for(lambda: inf.claims_of(Attachment("p", "net1")) != [], "the re-opened watch to deliver the claims")
    assert [c.ip for c in inf.claims_of(Attachment("o", "net1"))] == theirs
    assert in_sync(server, inf)
    assert counts(server)["watch leases"] >= 1
    every_list = [e for e in server.request_log() if e["verb"] == "list"]
    assert len(every_list) == 1  # the other store's ADD; none by the informer
    assert inf.stats["lists"] == lists and inf.stats["relists"] == 0


# -- DEL preconditions with a stale cache -------------------------------------------------------------

def _remake(kubeconfig, name, holder):
    """Another party deletes the Lease and re-creates it under the same name for ``holder``."""
    lease = raw(kubeconfig, "GET", name).doc
    assert raw(kubeconfig, "DELETE", name).status == 200
    lease["metadata"] = {k: v for k, v in lease["metadata"].items() if k in ("name", "labels", "annotations")}
    lease["spec"]["holderIdentity"] = holder
    assert raw(kubeconfig, "POST", body=lease).status == 201


def test_del_with_a_stale_cache_never_deletes_a_remade_lease(server, kubeconfig, cache):
    conf = netconf(kubeconfig)
    inf = synced_domain(server, conf)
    ip = add_ip(conf, "a")
    wait_for(lambda: in_sync(server, inf), "sync")
    server.pause_watches()  # the cache keeps a's claim, uid and resourceVersion
    name = lease_name(domain_hash(CLUSTER_DOMAIN), ipaddress.ip_address(ip))
    _remake(kubeconfig, name, "b/net1")
    server.reset_counts()
    assert call("DEL", conf, "a") == (0, None)
    assert held(server) == {ip: "b/net1"}
    # 409 on the precondition, re-read, left alone; the cache lagged, so the attachment's List decides what else it holds
    assert counts(server) == {"delete leases": 1, "get leases": 1, "list leases": 1}
    assert inf.claims_of(Attachment("a", "net1")) == []
    server.resume_watches()
    wait_for(lambda: in_sync(server, inf), "the watch to catch up")
    assert [c.ip for c in inf.claims_of(Attachment("b", "net1"))] == [ipaddress.ip_address(ip)]


def test_del_with_a_stale_resource_version_of_its_own_lease_deletes_it(server, kubeconfig, cache):
    cache(echo_budget=0.3)
    conf = netconf(kubeconfig)
    inf = synced_domain(server, conf)
    ip = add_ip(conf, "a")
    wait_for(lambda: in_sync(server, inf), "sync")
    server.pause_watches()
    name = lease_name(domain_hash(CLUSTER_DOMAIN), ipaddress.ip_address(ip))
    lease = raw(kubeconfig, "GET", name).doc  # someone (the reconciler) annotates it: a new resourceVersion
    lease["metadata"]["annotations"]["rdmanet.io/reconcile-misses"] = "1"
    assert raw(kubeconfig, "PUT", name, body=lease).status == 200
    server.reset_counts()
    assert call("DEL", conf, "a") == (0, None)
    assert held(server) == {}
    # 409 on the stale resourceVersion, re-read: still a's, deleted; the paused watch cannot
    # deliver the delete, so the attachment's List checks that nothing else of a's is left
    assert counts(server) == {"delete leases": 2, "get leases": 1, "list leases": 1}


def test_del_also_frees_a_claim_the_cache_had_not_seen(server, kubeconfig, cache):
    """The attachment got a second claim from another process (ADD racing a daemon restart):
    once the watch delivered our delete, the cache shows the other one, and DEL frees it too."""
    cache(echo_budget=10.0)
    conf = netconf(kubeconfig)
    inf = synced_domain(server, conf)
    mine = add_ip(conf, "d")
    wait_for(lambda: in_sync(server, inf), "sync")
    server.pause_watches()
    rs = range_sets(conf)
    # not 10.0.0.1: the record of the node's block (freed by the warm-up's DEL)
    other_ip = next(f"10.0.0.{n}" for n in range(2, 255) if f"10.0.0.{n}" != mine)
    body = other_store(kubeconfig, node="node-a").leases.body(ipaddress.ip_address(other_ip), Attachment("d", "net1"), "net-a", rs[0])
    assert raw(kubeconfig, "POST", body=body).status == 201
    server.reset_counts()
    resumer = resume_after(server, "delete", 200)
    try:
        assert call("DEL", conf, "d") == (0, None)  # the cache shows one claim of d when the DEL starts
    finally:
        resumer.finish()
    assert held(server) == {}
    assert counts(server) == {"delete leases": 2}
    assert [e["name"] for e in server.request_log()] == [
        lease_name(domain_hash(CLUSTER_DOMAIN), ipaddress.ip_address(ip)) for ip in (mine, other_ip)]


class resume_after:
    """Resume the paused watches as soon as the server has answered a ``verb`` request with ``status``."""

    def __init__(self, server, verb, status):
        self.done = threading.Event()

        def run():
            while not self.done.is_set():
                if any(e["verb"] == verb and e["status"] == status for e in server.request_log()):
                    server.resume_watches()
                    return
                time.sleep(0.001)

        self.thread = threading.Thread(target=run)
        self.thread.start()

    def finish(self):
        self.done.set()
        self.thread.join()


# -- concurrency ------------------------------------------------------------------------------------

def test_8_threads_with_the_cache_and_2_processes_without_never_duplicate(server, kubeconfig, cache, tmp_path):
    conf = netconf(kubeconfig, range="10.0.0.0/26")  # 62 addresses for 8 x 7 + 2 x 10 = 76 ADDs
    conf_path = tmp_path / "conf.json"
    conf_path.write_text(json.dumps(conf))
    synced_domain(server, conf)
    procs = [subprocess.Popen([sys.executable, RACE_WORKER, str(conf_path), f"proc-{n}", "10"], cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=ROOT), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for n in range(2)]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        results: dict[str, tuple] = {}
        start = threading.Barrier(9)

        def worker(n):
            start.wait()
            for i in range(7):
                cid = f"t{n}-{i}"
                results[cid] = call("ADD", conf, cid, node="node-a")

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        start.wait()
        for t in threads:
            t.join()
        remote = [row for p in procs for row in json.loads(p.stdout.readline())]
        outcomes = [(cid, code, out) for cid, (code, out) in results.items()] + [(cid, code, out) for cid, code, out, _ in remote]
        ok = {cid: out["ips"][0]["address"] for cid, code, out in outcomes if code == 0}
        failed = [out for _, code, out in outcomes if code != 0]
        assert len(ok) == 62 and len(set(ok.values())) == 62, collections.Counter(ok.values()).most_common(3)
        assert all(err["code"] == POOL_EXHAUSTED for err in failed), failed[:3]
        assert {h.split("/")[0] for h in held(server).values()} == set(ok)

        for cid, (code, _) in results.items():
            if code == 0:
                assert call("DEL", conf, cid) == (0, None)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        dels = [row for p in procs for row in json.loads(p.stdout.readline())]
        assert all(code == 0 for _, code, _, _ in dels)
        for p in procs:
            assert p.wait(timeout=30) == 0
        assert held(server) == {}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


# -- lifecycle --------------------------------------------------------------------------------------

def test_token_rotation_rebinds_the_informer_in_place(server, kubeconfig, cache):
    conf = netconf(kubeconfig)
    add_ip(conf, "a")
    old = the_informer()
    wait_for(old.usable, "sync")
    owner = old.owner
    time.sleep(0.01)  # a distinct mtime for the rewritten kubeconfig
    write_kubeconfig(kubeconfig, server.url, namespace=NS, token="a-rotated-and-longer-token")
    add_ip(conf, "b")
    assert the_informer() is old and old.owner is not owner and old.alive
    assert [t.name for t in cache_threads()] == [old.name]
    server.reset_counts()
    add_ip(conf, "c")
    assert counts(server) == {"create leases": 1}


def test_the_cap_stops_the_least_recently_used_informer(server, kubeconfig, cache):
    cache(max_informers=2)
    started = []
    for x in "abc":
        add_ip(netconf(kubeconfig, name=f"net-{x}", network_name=f"dom-{x}"), "c")
        started += [inf for inf in lease_cache.informers() if inf not in started]
    assert [inf.name for inf in lease_cache.informers()] == [inf.name for inf in started[1:]]
    assert started[0].join(5.0), "the evicted informer's thread is still running"
    wait_for(lambda: len(cache_threads()) == 2, "two informer threads")


def test_idle_informers_stop_and_leave_no_thread(server, kubeconfig, cache):
    cache(idle_seconds=0.5)
    confs = [netconf(kubeconfig, name=f"net-{x}") for x in "ab"]
    for conf in confs:
        add_ip(conf, "c")
    assert 1 <= len(cache_threads()) <= 2
    wait_for(lambda: cache_threads() == [], "idle informers to stop")
    assert lease_cache.informers() == []
    wait_for(lambda: server.active_watches == 0, "the server to see the watches end")
    server.reset_counts()
    add_ip(confs[0], "d")  # used again: a new informer starts (List + Watch)
    c = counts(server)
    assert c["list leases"] == 1 and c["watch leases"] == 1 and c["create leases"] == 1, c
    assert len(cache_threads()) == 1


def test_a_failing_watch_falls_back_to_list(server, kubeconfig, cache):
    """Watch forbidden (a Role without the verb): ADD does what it does without a cache."""
    conf = netconf(kubeconfig)
    server.fail_rate(1.0, status=403, verb="watch")
    code, out = call("ADD", conf, "a")
    assert code == 0, out
    inf = the_informer()
    wait_for(lambda: inf.stats["errors"] >= 1, "the watch to fail")
    server.reset_counts()
    add_ip(conf, "b")
    c = counts(server)
    assert c["list leases"] == 1 and c["create leases"] == 1, c  # no wait for a sync that cannot come
    server.fail_rate(0)
    wait_for(inf.usable, "the watch to open once allowed", timeout=30)
    server.reset_counts()
    add_ip(conf, "c")
    assert counts(server) == {"create leases": 1}


# -- the fake server's watch ------------------------------------------------------------------------

@pytest.mark.fake_only("the fake compacts its history on demand (compact()); a real server keeps at least 75 s of "
                       "watch history and compacts etcd every 5 minutes")
def test_fake_server_watch_semantics(server, kubeconfig):
    """What the informer relies on, checked on the wire: events after N in order, bookmarks,
    410 as an ERROR event with a Status, paused and dropped streams."""
    conn = connect(kube_settings(netconf(kubeconfig)))
    transport = ApiClientTransport(conn.api_client)
    path = LEASES_PATH.format(namespace=NS)
    lst = transport.request("GET", path, [("labelSelector", "pool=w")], None, 5.0).doc
    rv = lst["metadata"]["resourceVersion"]
    for name, labels in (("w1", {"pool": "w"}), ("skip", {"pool": "x"}), ("w2", {"pool": "w"})):
        body = {"metadata": {"name": name, "labels": labels}, "spec": {"holderIdentity": "h"}}
        assert transport.request("POST", path, [], body, 5.0).status == 201
    stream = transport.watch(path, [("labelSelector", "pool=w"), ("watch", "true"), ("resourceVersion", rv),
                                    ("allowWatchBookmarks", "true"), ("timeoutSeconds", "3")], 10.0)
    assert stream.status == 200
    seen = []
    for ev in stream.events():
        seen.append((ev["type"], ev["object"]["metadata"].get("name")))
        if ev["type"] == "BOOKMARK":
            break
    stream.close()
    assert seen == [("ADDED", "w1"), ("ADDED", "w2"), ("BOOKMARK", None)]

    server.compact()
    stream = transport.watch(path, [("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", "3")], 10.0)
    assert stream.status == 200
    [ev] = list(stream.events())
    stream.close()
    assert ev["type"] == "ERROR" and ev["object"]["kind"] == "Status"
    assert ev["object"]["code"] == 410 and ev["object"]["reason"] == "Expired"

    server.pause_watches()
    now = str(server.resource_version)
    stream = transport.watch(path, [("watch", "true"), ("resourceVersion", now), ("allowWatchBookmarks", "true"),
                                    ("timeoutSeconds", "30")], 40.0)
    body = {"metadata": {"name": "late"}, "spec": {"holderIdentity": "h"}}
    assert transport.request("POST", path, [], body, 5.0).status == 201
    got = []

    def read():
        for item in _events_until_error(stream):
            got.append(item)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.5)
    assert got == []  # held back while paused (no bookmark either)
    server.resume_watches()
    wait_for(lambda: got, "the held event")
    assert got[0] == ("ADDED", "late")
    assert server.drop_watches() == 1
    reader.join(5)
    assert not reader.is_alive() and got[-1] == ("broken", None)
    stream.close()
    assert counts(server)["watch leases"] == 3

    # the same controls over HTTP, for other processes
    import urllib.request

    def control(op, body):
        req = urllib.request.Request(f"{server.url}/_control/{op}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.loads(resp.read())

    control("watches", {"paused": True})
    assert server._watch_paused
    control("watches", {"paused": False})
    assert not server._watch_paused
    assert control("drop_watches", {}) == {"dropped": 0}


def _events_until_error(stream):
    try:
        for ev in stream.events():
            yield ev["type"], ev["object"]["metadata"].get("name")
    except Exception:  # noqa: BLE001 - the dropped connection
        yield "broken", None


# -- a claim is read back before it is returned; a 404 forgets only its UID --------------------

def _patched_requests(hook):
    """ApiClientTransport.request with ``hook(original, self, method, path, query, body, timeout)``."""
    original = ApiClientTransport.request

    def request(self, method, path, query, body, timeout):
        return hook(original, self, method, path, query, body, timeout)

    ApiClientTransport.request = request
    return original


def test_add_never_returns_a_claim_the_cache_shows_but_that_is_gone(server, kubeconfig, cache):
    """Another process made a claim of attachment "x" (the in-process fallback during a daemon
    restart) that the cache has not seen when the daemon's repeat ADD starts; once our own claim
    is confirmed the cache shows theirs, which was deleted meanwhile (a DEL of "x" elsewhere,
    whose event is still on its way). The ADD must return an address "x" really holds."""
    conf = netconf(kubeconfig)
    inf = synced_domain(server, conf)
    server.pause_watches()
    theirs = other_store(kubeconfig, node="node-a").allocate(Attachment("x", "net1"), "net-a", range_sets(conf), {})
    their_name = lease_name(domain_hash(CLUSTER_DOMAIN), theirs[0])

    def hook(original, self, method, path, query, body, timeout):
        resp = original(self, method, path, query, body, timeout)
        if method == "POST" and resp.status == 201 and not hook.done:
            hook.done = True  # our claim is made: let the watch deliver theirs and ours, then lag again
            server.resume_watches()
            wait_for(lambda: in_sync(server, inf), "the watch to deliver both claims")
            server.pause_watches()
            gone = original(self, "DELETE", f"{LEASES_PATH.format(namespace=NS)}/{their_name}", [], None, timeout)
            assert gone.status == 200
        return resp

    hook.done = False
    original = _patched_requests(hook)
    try:
        got = add_ip(conf, "x")
    finally:
        ApiClientTransport.request = original
        server.resume_watches()
    assert held(server).get(got) == "x/net1", (got, held(server))


def test_a_404_about_an_old_claim_never_hides_the_new_claim_of_its_name(server, kubeconfig, cache):
    """A repeat ADD of "a" reads back the claim the cache shows (uid 1); the answer is 404, but
    while it was on its way the address was claimed again, by "b" (uid 2), and the watch
    delivered that. The 404 is about uid 1 only: "b"'s claim stays visible, so "b"'s repeat ADD
    returns it and its DEL frees it (nothing is leaked)."""
    conf = netconf(kubeconfig, range="10.0.0.0/29")
    inf = synced_domain(server, conf)
    first = add_ip(conf, "a")
    wait_for(lambda: in_sync(server, inf), "sync")
    name = lease_name(domain_hash(CLUSTER_DOMAIN), ipaddress.ip_address(first))
    rs = range_sets(conf)

    def hook(original, self, method, path, query, body, timeout):
        if method == "GET" and path.endswith("/" + name) and not hook.done:
            hook.done = True
            original(self, "DELETE", path, [], None, timeout)
            resp = original(self, method, path, query, body, timeout)  # 404: uid 1 is gone
            remade = other_store(kubeconfig, node="node-a").leases.body(ipaddress.ip_address(first), Attachment("b", "net1"), "net-a", rs[0])
            assert original(self, "POST", LEASES_PATH.format(namespace=NS), [], remade, timeout).status == 201
            wait_for(lambda: in_sync(server, inf), "the watch to deliver b's claim")
            return resp
        return original(self, method, path, query, body, timeout)

    hook.done = False
    original = _patched_requests(hook)
    try:
        again = add_ip(conf, "a")  # "a" lost its claim: it gets another address
    finally:
        ApiClientTransport.request = original
    assert again != first
    assert add_ip(conf, "b") == first  # b's claim is seen: the same address, no second one
    assert sorted(h for h in held(server).values() if h == "b/net1") == ["b/net1"]
    assert call("DEL", conf, "b") == (0, None)
    assert "b/net1" not in held(server).values()


def test_concurrent_adds_in_the_daemon_take_distinct_candidates_without_409s(server, kubeconfig, cache):
    """Round-robin gives every ADD the same cursor; in one process (the daemon) the ADDs running
    at once skip each other's candidates, so a burst costs one create per ADD."""
    conf = netconf(kubeconfig, range="10.0.0.0/24")
    synced_domain(server, conf)
    start = threading.Barrier(16)
    got = {}

    def worker(n):
        start.wait()
        got[n] = add_ip(conf, f"burst-{n}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got.values())) == 16
    creates = [e for e in server.request_log() if e["verb"] == "create"]
    assert all(e["status"] == 201 for e in creates), creates  # no 409: distinct candidates
    assert len(creates) <= 16 + 1, server.counts()  # one create per ADD, and at most one block when the first is full
