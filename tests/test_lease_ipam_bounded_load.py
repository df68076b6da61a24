"""lease-ipam's Kubernetes store keeps its memory and its load on the API server bounded.

Against the fake API server over real HTTP, with the real plugin and store code. Every assertion
is on requests the server saw (their count, their query) and on outcomes, never on timing:
- no verb makes an unpaginated List of a whole domain (``limit`` on every List; pages parsed
  one at a time); a continue token that expires (410) starts the List over;
- the node daemon's watch cache: a lagging watch does not turn every ADD into a List of the
  domain; a rotated token is taken in place (the watch is not restarted, no re-List); a 410
  re-List backs off (a silently dead watch: netns_tests/test_lease_watch_blackhole.py);
- the reconciler Lists pods once per namespace per run instead of one GET per claim.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import sys
import time

import pytest

from rdmanet.cni.core import skel
from rdmanet.ipam.location import CLUSTER_DOMAIN
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store import lease_cache
from rdmanet.ipam.store.kube import (
    GROUP,
    L_ATTACHMENT,
    L_DOMAIN,
    L_NETWORK,
    L_NODE,
    L_POD_UID,
    LIST_PAGE,
    Transport,
    attachment_hash,
    domain_hash,
    lease_name,
    use_watch_cache,
)
from rdmanet.ipam.store.base import Attachment

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import RESOURCES, write_kubeconfig  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

NS = "ipam"


@pytest.fixture
def kubeconfig(server, tmp_path):
    return write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)


def netconf(kubeconfig, name="net-a", rng="10.0.0.0/20", **kube):
    return {"cniVersion": "1.1.0", "name": name, "type": "macvlan",
            "ipam": {"type": "lease-ipam", "range": rng, "kubernetes": {"kubeconfig": str(kubeconfig), **kube}}}


def env(command, cid, ifname="net1", node="node-a", pod_ns="default"):
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": ifname,
            "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node,
            "CNI_ARGS": f"K8S_POD_NAMESPACE={pod_ns};K8S_POD_NAME={cid};K8S_POD_UID=uid-{cid}"}


def call(command, conf, cid, **kw):
    return skel.handle(LeaseIPAM(), env(command, cid, **kw), json.dumps(conf).encode())


def seed_claims(server, count, subnet="10.0.0.0/20", network="net-a", node="node-z", pod_ns=("default",),
                age_seconds=0.0):
    """``count`` claims as ADD makes them, written straight into the fake server (fast). Pods are
    named after their container IDs, spread over the namespaces ``pod_ns``."""
    dhash = domain_hash(CLUSTER_DOMAIN)
    rt = RESOURCES["leases"]
    hosts = ipaddress.ip_network(subnet).hosts()
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - age_seconds))
    made = []
    for i in range(count):
        ip = next(hosts)
        cid = f"seed{i:06d}"
        ns = pod_ns[i % len(pod_ns)]
        att = Attachment(cid, "net1")
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": lease_name(dhash, ip), "namespace": NS,
                             "labels": {L_DOMAIN: dhash, L_NETWORK: network, L_NODE: node,
                                        L_ATTACHMENT: attachment_hash(att), L_POD_UID: f"uid-{cid}"},
                             "annotations": {f"{GROUP}/{k}": v for k, v in {
                                 "ipam-domain": CLUSTER_DOMAIN, "network": network, "range": subnet, "ip": str(ip),
                                 "container-id": cid, "ifname": "net1", "node": node, "pod-namespace": ns,
                                 "pod-name": cid, "pod-uid": f"uid-{cid}"}.items()}},
                "spec": {"holderIdentity": f"{cid}/net1", "acquireTime": when + ".000000Z"}}
        server.api_create(rt, NS, body, False)
        made.append((ns, cid, str(ip)))
    if age_seconds:
        with server._cond:  # creationTimestamp as if made age_seconds ago (the reconciler's grace)
            for (ns_, name), obj in server._store["leases"].items():
                obj["metadata"]["creationTimestamp"] = when + "Z"
    return made


def lists(server, selector_has=""):
    """The List requests of leases the server saw (their queries)."""
    return [e["query"] for e in server.request_log()
            if e["verb"] == "list" and e["resource"] == "leases" and selector_has in e["query"].get("labelSelector", "")]


def held_ips(server):
    return [o["metadata"]["annotations"][f"{GROUP}/ip"] for o in claim_leases(server, NS)]


# -- paginated Lists ---------------------------------------------------------------------------------

def test_no_verb_lists_a_whole_domain_in_one_answer(server, kubeconfig):
    """ADD, CHECK, DEL, STATUS and GC of the in-process plugin over a domain of 1,200 claims: every
    List carries ``limit`` and the node's objects come in ceil(n / page) pages, none larger than a
    page (the in-process ADD reads its node's claims and blocks, so they are seeded on it)."""
    seed_claims(server, 1200, node="node-a")
    conf = netconf(kubeconfig)
    server.reset_counts()
    code, out = call("ADD", conf, "new1")
    assert code == 0, out
    got = out["ips"][0]["address"].split("/")[0]
    assert held_ips(server).count(got) == 1
    domain_lists = lists(server)
    assert len(domain_lists) == math.ceil(1200 / LIST_PAGE), domain_lists
    for verb in ("CHECK", "DEL"):
        conf_v = dict(conf, prevResult=out) if verb == "CHECK" else conf
        code, res = call(verb, conf_v, "new1")
        assert code == 0, res
    code, res = call("STATUS", conf, "x")
    assert code == 0, res
    code, res = call("GC", dict(conf, **{"cni.dev/valid-attachments": []}), "x")
    assert code == 0, res
    every = lists(server)
    assert every and all(q.get("limit") == str(LIST_PAGE) for q in every), every


class CompactAfterFirstPage(Transport):
    """The store's own transport; after the first page of a List the server compacts (the List's
    snapshot is gone: the next page's continue token meets 410, as after an API server restart)."""

    def __init__(self, inner, server):
        self.inner, self.server, self.host, self.done = inner, server, inner.host, False

    def request(self, method, path, query, body, timeout):
        resp = self.inner.request(method, path, query, body, timeout)
        if not self.done and method == "GET" and dict(query).get("limit") and (resp.doc or {}).get("metadata", {}).get("continue"):
            self.done = True
            self.server.compact()
        return resp

    def watch(self, path, query, timeout):
        return self.inner.watch(path, query, timeout)


@pytest.mark.fake_only("the fake compacts its history on demand; a real server's continue token expires only when etcd is compacted (every 5 minutes)")
def test_an_expired_continue_token_starts_the_list_over(server, kubeconfig, monkeypatch):
    seed_claims(server, 1100, node="node-a")  # the in-process ADD reads its node's objects
    conf = netconf(kubeconfig)
    from rdmanet.ipam.store import kube as kube_mod

    made = []
    orig_for = kube_mod.KubeStore.for_invocation.__func__

    def for_invocation(cls, settings, domain, inv):
        store = orig_for(cls, settings, domain, inv)
        store.leases.transport = CompactAfterFirstPage(store.leases.transport, server)
        made.append(store)
        return store

    monkeypatch.setattr(kube_mod.KubeStore, "for_invocation", classmethod(for_invocation))
    server.reset_counts()
    code, out = call("ADD", conf, "new1")
    assert code == 0, out
    got = out["ips"][0]["address"].split("/")[0]
    assert held_ips(server).count(got) == 1 and len(held_ips(server)) == 1101
    statuses = [(bool(e["query"].get("continue")), e["status"]) for e in server.request_log() if e["verb"] == "list"]
    # page 1, then its continue meets 410, then the whole List again: 3 pages
    assert statuses == [(False, 200), (True, 410), (False, 200), (True, 200), (True, 200)], statuses
    assert made[0].leases.calls.get("relist") == 1


# -- the reconciler ----------------------------------------------------------------------------------

def _reconcile_conf(kubeconfig):
    return {"cniVersion": "1.0.0", "name": "net-a", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "range": "10.0.0.0/20", "kubernetes": {"kubeconfig": str(kubeconfig)}}}


@pytest.mark.fake_only("it seeds thousands of claims with backdated creation times and pod UIDs of its own; a real server sets both itself")
def test_the_reconciler_lists_pods_once_per_namespace_and_writes_only_what_changes(server, kubeconfig):
    """3,000 claims over 4 namespaces, 100 of whose pods are gone. The run's requests are
    computed, not timed: the claims' List in pages of 500, one paginated pod List per namespace,
    a GET + PUT per miss recorded, and nothing per claim whose pod is there. At 100,000 claims
    the same arithmetic gives 200 + pod pages + writes (docs/lease-ipam-design.md)."""
    from rdmanet.ipam import reconcile

    namespaces = ("ns-a", "ns-b", "ns-c", "ns-d")
    made = seed_claims(server, 3000, pod_ns=namespaces, age_seconds=3600)
    gone = {cid for _, cid, _ in made[::30]}  # 100 pods that are no longer there
    per_ns = {ns: 0 for ns in namespaces}
    for ns, cid, _ in made:
        if cid not in gone:
            server.add_pod(ns, cid, uid=f"uid-{cid}")
            per_ns[ns] += 1
    target = reconcile.KubeTarget.from_config(_reconcile_conf(kubeconfig))
    server.reset_counts()
    outcome = reconcile.reconcile_target(target, grace_seconds=60, misses=3)
    assert outcome.count(reconcile.KEPT) == 2900 and outcome.count(reconcile.MISS) == 100, outcome.to_json()["summary"]
    expected = {("list", "leases"): math.ceil(3000 / 500),
                ("list", "pods"): sum(math.ceil(n / 500) for n in per_ns.values()),
                ("get", "leases"): 100, ("update", "leases"): 100}
    assert server.counts() == expected, server.counts()
    assert ("get", "pods") not in server.counts()  # main GETs every claim's pod: 3,000 GETs

    # a second run: the same pod Lists again (read afresh per run), the misses go to 2 (counted
    # grace / misses = 20 s of server time apart)
    server.advance_clock(20)
    server.reset_counts()
    outcome = reconcile.reconcile_target(target, grace_seconds=60, misses=3)
    assert outcome.count(reconcile.MISS) == 100 and server.counts()[("list", "pods")] == expected[("list", "pods")]


@pytest.mark.fake_only("it seeds thousands of claims with backdated creation times and pod UIDs of its own; a real server sets both itself")
def test_the_node_gc_lists_only_the_pods_bound_to_its_node(server, kubeconfig):
    from rdmanet.ipam import reconcile
    from rdmanet.ipam.kube_config import kube_settings

    made = seed_claims(server, 600, node="node-a", pod_ns=("ns-a", "ns-b", "ns-c"), age_seconds=3600)
    for ns, cid, _ in made[1:]:
        server.add_pod(ns, cid, uid=f"uid-{cid}", node="node-a")
    for i in range(50):
        server.add_pod("ns-a", f"elsewhere{i}", node="node-b")
    target = reconcile.KubeTarget.for_settings(kube_settings(_reconcile_conf(kubeconfig)), node="node-a")
    server.reset_counts()
    outcome = reconcile.reconcile_target(target, grace_seconds=60, misses=3)
    assert outcome.count(reconcile.KEPT) == 599 and outcome.count(reconcile.MISS) == 1
    pod_lists = [e for e in server.request_log() if e["resource"] == "pods"]
    # 599 pods: 2 pages, every namespace; the one pod that List does not show is looked up by name
    assert [e["verb"] for e in pod_lists] == ["list", "list", "get"], pod_lists
    assert all(e["query"].get("fieldSelector") == "spec.nodeName=node-a" and e["namespace"] is None for e in pod_lists[:2])
    assert pod_lists[2]["path"] == f"/api/v1/namespaces/{made[0][0]}/pods/{made[0][1]}"


@pytest.mark.fake_only("it seeds thousands of claims with backdated creation times and pod UIDs of its own; a real server sets both itself")
def test_the_reconciler_leaves_what_it_could_not_judge_by_its_deadline(server, kubeconfig):
    from rdmanet.ipam import reconcile

    seed_claims(server, 20, age_seconds=3600)
    target = reconcile.KubeTarget.from_config(_reconcile_conf(kubeconfig))
    outcome = reconcile.reconcile_target(target, grace_seconds=60, misses=1, deadline_seconds=0)
    assert outcome.count(reconcile.LATE) == 20 and len(server.objects("leases", NS)) == 20


# -- the daemon's watch cache ------------------------------------------------------------------------

@pytest.fixture
def daemon_cache():
    """The watch cache on in this process, as the node daemon runs it; off (threads stopped) after."""
    def on(**settings):
        settings.setdefault("sync_budget", 10.0)
        use_watch_cache(True, **settings)
    on()
    yield on
    use_watch_cache(False)


def wait_for(predicate, what, timeout=20.0):
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def the_informer():
    [inf] = lease_cache.informers()
    return inf


def add_ip(conf, cid, **kw):
    code, out = call("ADD", conf, cid, **kw)
    assert code == 0, out
    return out["ips"][0]["address"].split("/")[0]


def domain_lists(server):
    """Lists of the whole domain (not of one attachment's claims)."""
    return [q for q in lists(server) if "rdmanet.io/attachment" not in q.get("labelSelector", "")]


def test_adds_while_the_watch_lags_never_list_the_domain_each(server, kubeconfig, daemon_cache):
    """The watch stops delivering (a slow API server): the first ADD misses its echo and the cache
    is distrusted; the 29 after it still take candidates from the cache (the create decides) and
    check their own claims with a List of that one attachment. Main made 29 Lists of the domain."""
    daemon_cache(echo_budget=0.5, distrust_seconds=600.0)
    seed_claims(server, 300, subnet="10.0.0.0/20")
    conf = netconf(kubeconfig)
    add_ip(conf, "warm-up")
    inf = the_informer()
    wait_for(inf.usable, "the informer to sync")
    server.pause_watches()
    server.reset_counts()
    got = [add_ip(conf, f"lag{i}") for i in range(30)]
    assert len(set(got)) == 30
    assert domain_lists(server) == [], domain_lists(server)
    c = server.counts()
    # one attachment List each, at most; one create each (plus a block create when the node's
    # block is full, and a 409 where a seeded claim of another node sits in this node's block)
    made = [e for e in server.request_log() if e["verb"] == "create" and e["status"] == 201]
    assert len(made) <= 30 + 2 and c[("list", "leases")] <= 30, c
    ips = held_ips(server)
    assert len(ips) == len(set(ips)) == 331
    server.resume_watches()


@pytest.mark.fake_only("the fake refuses the old token on demand; on the real server a revoked ServiceAccount token is rotated in test_kube_real_rbac.py")
def test_a_token_rotation_keeps_the_watch_and_takes_the_new_token(server, kubeconfig, daemon_cache):
    conf = netconf(kubeconfig)
    add_ip(conf, "a")
    inf = the_informer()
    wait_for(inf.usable, "the informer to sync")
    thread, old_owner = inf.thread, inf.owner
    server.reset_counts()
    time.sleep(0.01)
    write_kubeconfig(kubeconfig, server.url, namespace=NS, token="a-rotated-and-longer-token")
    server.token = "a-rotated-and-longer-token"  # the old token is refused from now on
    add_ip(conf, "b")
    assert the_informer() is inf and inf.thread is thread and inf.thread.is_alive()
    assert inf.owner is not old_owner and inf.stats.get("rebinds") == 1
    c = server.counts()
    assert ("list", "leases") not in c and ("watch", "leases") not in c, c  # nothing restarted
    # the next re-open of the watch carries the new token (the old one would be 401)
    server.drop_watches()
    wait_for(lambda: any(e["verb"] == "watch" for e in server.request_log()), "the watch to re-open")
    assert [e["status"] for e in server.request_log() if e["verb"] == "watch"] == [200]
    wait_for(inf.usable, "the informer to use the re-opened watch")
    server.reset_counts()
    add_ip(conf, "c")
    assert server.counts() == {("create", "leases"): 1}


def test_410_re_lists_back_off(server, kubeconfig, daemon_cache):
    """Every watch answers 410 for 3 s (an API server that lost its history): the informer re-Lists
    after a jittered, growing delay, a handful of times, not as fast as the server answers."""
    conf = netconf(kubeconfig)
    add_ip(conf, "a")
    inf = the_informer()
    wait_for(inf.usable, "the informer to sync")
    server.reset_counts()
    server.fail_rate(1.0, status=410, verb="watch")
    server.drop_watches()
    time.sleep(3.0)
    server.fail_rate(0)
    relists = server.counts().get(("list", "leases"), 0)
    assert 1 <= relists <= 4, relists  # delays 0.5-1, 1-2, 2-4 s: at most 3 fit in 3 s (main: hundreds)
    waits = [lease_cache.relist_delay(n) for n in range(1, 9)]
    assert len(set(waits)) == len(waits) and waits[-1] >= lease_cache.RELIST_CAP / 2
    wait_for(inf.usable, "the informer to recover", timeout=30.0)


# A silently dead watch noticed within seconds (TCP keepalive): netns_tests/test_lease_watch_blackhole.py
# (a real network path that goes dark; the kernel's keepalive cannot be shown without one).


# -- memory: one page at a time ----------------------------------------------------------------------

class PagedDomain(Transport):
    """A Lease List served page by page from generated JSON (no server: what is measured is the
    client's memory). Honours ``limit``/``continue`` as the API server does; without ``limit``
    the whole domain comes in one answer. A create answers 201 with the object."""

    host = "paged-domain"

    def __init__(self, count):
        self.count = count
        self.pages = 0

    def _item(self, i):
        ip = ipaddress.ip_address("10.0.0.0") + 1 + i
        dhash = domain_hash(CLUSTER_DOMAIN)
        cid = f"seed{i:06d}"
        return {"metadata": {"name": lease_name(dhash, ip), "namespace": NS, "uid": f"u{i}", "resourceVersion": str(i),
                             "labels": {L_DOMAIN: dhash, L_NETWORK: "net-a", L_NODE: "node-z",
                                        L_ATTACHMENT: attachment_hash(Attachment(cid, "net1")), L_POD_UID: f"uid-{cid}"},
                             "annotations": {f"{GROUP}/{k}": v for k, v in {
                                 "ipam-domain": CLUSTER_DOMAIN, "network": "net-a", "range": "10.0.0.0/8", "ip": str(ip),
                                 "container-id": cid, "ifname": "net1", "node": "node-z", "pod-namespace": "default",
                                 "pod-name": cid, "pod-uid": f"uid-{cid}"}.items()}},
                "spec": {"holderIdentity": f"{cid}/net1", "acquireTime": "2026-01-01T00:00:00.000000Z"}}

    def request(self, method, path, query, body, timeout):
        from rdmanet.ipam.store.kube import Response

        if method == "POST":
            doc = json.loads(json.dumps(body))
            doc["metadata"].update(uid="new", resourceVersion="1")
            return Response(201, doc, {})
        q = dict(query)
        start = int(q.get("continue") or 0)
        limit = int(q.get("limit") or 0) or self.count
        end = min(self.count, start + limit)
        self.pages += 1
        text = json.dumps({"kind": "LeaseList", "metadata": {"resourceVersion": "7", **(
            {"continue": str(end)} if end < self.count else {})}, "items": [self._item(i) for i in range(start, end)]})
        return Response(200, json.loads(text), {})


def _peak_mib(run):
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def test_an_add_over_a_domain_of_20k_claims_holds_one_page_at_a_time():
    """The in-process ADD's List of a 20,000-claim domain: the client's peak memory stays near one
    page's worth: ~5 MiB (one answer of the whole domain, as main parsed it: ~78 MiB here; ~97 MiB for 10k claims
    in the daemon as reported)."""
    from rdmanet.ipam.config import parse_ipam_config
    from rdmanet.ipam.store.kube import KubeStore

    count = 20_000
    transport = PagedDomain(count)
    store = KubeStore(transport, NS, CLUSTER_DOMAIN, node="node-a")
    conf = {"cniVersion": "1.1.0", "name": "net-a", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "range": "10.0.0.0/8"}}
    rs = parse_ipam_config(conf).range_sets
    got = []
    peak = _peak_mib(lambda: got.extend(store.allocate(Attachment("new", "net1"), "net-a", rs, {})))
    assert transport.pages == math.ceil(count / LIST_PAGE)
    assert int(got[0]) > int(ipaddress.ip_address("10.0.0.0")) + count  # past every claim of the List
    assert peak < 12, f"peak {peak:.1f} MiB for {count} claims"


@pytest.mark.fake_only("it seeds thousands of claims with backdated creation times and pod UIDs of its own; a real server sets both itself")
def test_the_reconcile_command_takes_a_deadline(server, kubeconfig, tmp_path, capsys):
    from rdmanet.cli.main import main

    seed_claims(server, 3, age_seconds=3600)
    path = tmp_path / "net.json"
    path.write_text(json.dumps(_reconcile_conf(kubeconfig)))
    assert main(["ipam", "reconcile", "--network-config", str(path), "--deadline-seconds", "0"]) == 2
    assert "--deadline-seconds must be positive" in capsys.readouterr().err
    assert main(["ipam", "reconcile", "--network-config", str(path), "--grace-seconds", "60", "--misses", "1",
                 "--deadline-seconds", "300", "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["summary"] == {"freed": 3} and server.objects("leases", NS) == []
