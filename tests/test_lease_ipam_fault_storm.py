"""lease-ipam's Kubernetes store under API-server faults, against the fake API server.

The plugin's and the store's real code over real HTTP (``skel.handle`` + ``LeaseIPAM``, as a
runtime calls it), in both modes: in-process (no watch cache) and the node
daemon's (the watch cache on, the ``kubernetes`` client; one informer per simulated node, each
node with its own kubeconfig).

- The storm: several simulated nodes, each with a few runtime threads doing ADD / repeat ADD /
  DEL as a runtime does (a failed ADD is followed by its DEL; a failed DEL is retried later),
  while a seeded fault driver throws at the server: 429 storms (Retry-After), 5xx storms,
  dropped connections, answers lost after the request was served (a create made, its 201 never
  seen), 409 storms on delete (a create's 409s come from the nodes' own contention), latency past
  the per-request timeout, outages longer than the verb's budget (every request dropped, watches
  cut), watch drops, API server restarts (streams cut, history gone: a watch behind the newest
  resourceVersion meets 410), lagging watches. Asserted: every failed ADD answers CNI code 11 within
  ``timeout_seconds`` plus the rollback grace and a margin; no address is ever handed to two
  live attachments (checked at every ADD) and a repeat ADD returns the same address; at the end
  every live attachment's Lease holds its address, and after the runtime's pending DELs and one
  CNI GC per node (in-process mode) or one reconciler run (daemon mode; the pods of the live
  attachments exist, the others are gone) nothing else is left: no leaked claim that GC or the
  reconciler cannot free.
  The seed is printed (``-s`` shows it; a failure names it); ``RDMANET_STORM_SEED=<n>`` replays
  one (the fault schedule and every thread's choices; the threads' interleaving is the OS's),
  ``RDMANET_STORM_LARGE=1`` runs a larger storm (more nodes, threads and operations).
- Scenarios at precise instants: the server going away between an ADD's List and its create;
  between the create's answer and the watch's echo of it (the rollback cannot run: the claim
  stays until the runtime's DEL, or CNI GC, frees it); another node claiming addresses while
  this node's watch is broken (dropped, or met 410) - the next allocation does not rely on the
  stale cache.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import POOL_EXHAUSTED, TRY_AGAIN_LATER
from rdmanet.ipam.config import parse_ipam_config
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store.base import Attachment
from rdmanet.ipam.store import kube as kube_store
from rdmanet.ipam.store import lease_cache
from rdmanet.ipam.store.kube import use_watch_cache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_servers import api_server  # noqa: E402
from kube_api_server import KubeAPIServer, write_kubeconfig  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

NS = "ipam"
TIMEOUT = 2.0  # timeout_seconds: the whole verb's budget
REQUEST_TIMEOUT = 0.5  # request_timeout_seconds
MARGIN = kube_store._ROLLBACK_GRACE + 1.5  # a failed ADD answers within TIMEOUT + this
LARGE = os.environ.get("RDMANET_STORM_LARGE", "") not in ("", "0")


@pytest.fixture
def server(request):
    with api_server(request, bookmark_interval=0.2) as srv:
        POD_UIDS.clear()
        POD_UIDS["server"] = srv if getattr(srv, "real", False) else None
        yield srv
        POD_UIDS.clear()
        POD_UIDS["server"] = None
        srv.clear_faults()
        srv.fail_rate(0)
        srv.resume_watches()


@pytest.fixture
def daemon_mode():
    """The node daemon's watch cache on in this process (short budgets), off after."""
    use_watch_cache(True, echo_budget=0.4, sync_budget=0.5, distrust_seconds=1.0, watch_timeout=30.0,
                    request_timeout=REQUEST_TIMEOUT)
    yield
    use_watch_cache(False)


def netconf(kubeconfig, rng="10.0.0.0/26", **ipam):
    return {"cniVersion": "1.1.0", "name": "net-a", "type": "macvlan",
            "ipam": {"type": "lease-ipam", "range": rng, "gc_grace_seconds": 0, **ipam,
                     "kubernetes": {"kubeconfig": str(kubeconfig), "timeout_seconds": TIMEOUT,
                                    "request_timeout_seconds": REQUEST_TIMEOUT}}}


# The pod UID a sandbox's ADD carries: ``uid-<cid>`` on the fake (its add_pod takes it); a real
# server sets UIDs itself, so there each pod is made (by the admin, past the proxy's faults) before
# its first ADD, and its UID is the one the runtime passes (``POD_UIDS``, filled by the fixture).
POD_UIDS: dict = {"server": None}


def pod_uid(cid):
    server = POD_UIDS["server"]
    if server is None:
        return f"uid-{cid}"
    if cid not in POD_UIDS:
        POD_UIDS[cid] = server.add_pod("default", cid)["metadata"]["uid"]
    return POD_UIDS[cid]


def env(command, cid, node):
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
            "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node,
            "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid};K8S_POD_UID={pod_uid(cid)}"}


HISTORY: dict = {}


def call(command, conf, cid, node):
    t0 = time.monotonic()
    code, out = skel.handle(LeaseIPAM(), env(command, cid, node), json.dumps(conf).encode())
    HISTORY.setdefault(cid, []).append((round(t0 % 1000, 3), command, code, out.get("code") if code else
                                        [ip["address"] for ip in out.get("ips", [])] if isinstance(out, dict) else None))
    return code, out, time.monotonic() - t0


def ip_of(out):
    return out["ips"][0]["address"].split("/")[0]


def leases(server):
    """{ip: holder} of every claim Lease on the server."""
    return {o["metadata"]["annotations"]["rdmanet.io/ip"]: o["spec"]["holderIdentity"]
            for o in claim_leases(server, NS)}


def gc(conf, node, valid):
    doc = dict(conf, **{"cni.dev/valid-attachments": [{"containerID": cid, "ifname": "net1"} for cid in valid]})
    return call("GC", doc, "gc", node)


# -- the storm --------------------------------------------------------------------------------------

class Ledger:
    """What the runtimes were told, checked as it happens: live attachment -> address."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[str, tuple[str, str]] = {}  # cid -> (node, ip)
        self.by_ip: dict[str, str] = {}
        self.pending_dels: list[tuple[str, str]] = []  # (node, cid) whose DEL failed: the runtime retries
        self.violations: list[str] = []
        self.stats = {"add_ok": 0, "add_11": 0, "readd_ok": 0, "del_ok": 0, "del_failed": 0}

    def granted(self, cid: str, node: str, ip: str) -> None:
        with self.lock:
            other = self.by_ip.get(ip)
            if other is not None and other != cid:
                self.violations.append(f"{ip} handed to {cid} on {node} while {other} holds it")
            self.live[cid] = (node, ip)
            self.by_ip[ip] = cid

    def dying(self, cid: str) -> None:
        """The runtime starts its DEL: the address is no longer in use by the pod."""
        with self.lock:
            node_ip = self.live.pop(cid, None)
            if node_ip is not None and self.by_ip.get(node_ip[1]) == cid:
                del self.by_ip[node_ip[1]]

    def note(self, what: str) -> None:
        with self.lock:
            self.violations.append(what)

    def count(self, key: str) -> None:
        with self.lock:
            self.stats[key] += 1


def runtime(conf, node, name, rng, stop, ledger, cap):
    """One runtime thread of a node: ADD new attachments, repeat ADDs, DELs, until ``stop``."""
    mine: list[str] = []
    i = 0
    while not stop.is_set():
        i += 1
        retry = None
        with ledger.lock:  # the runtime retries a failed DEL (as the kubelet does on its next sync)
            for k, (node_, cid_) in enumerate(ledger.pending_dels):
                if node_ == node and cid_.startswith(name + "-"):
                    retry = ledger.pending_dels.pop(k)[1]
                    break
        if retry is not None and rng.random() < 0.5:
            _delete(conf, node, retry, ledger)
            continue
        if retry is not None:
            with ledger.lock:
                ledger.pending_dels.append((node, retry))
        roll = rng.random()
        if mine and (roll < 0.35 or len(mine) >= cap):
            cid = mine.pop(rng.randrange(len(mine)))
            _delete(conf, node, cid, ledger)
            continue
        if mine and roll < 0.5:
            cid = rng.choice(mine)
            code, out, took = call("ADD", conf, cid, node)
            want = ledger.live[cid][1]
            if code == 0:
                ledger.count("readd_ok")
                if ip_of(out) != want:
                    ledger.note(f"repeat ADD of {cid} returned {ip_of(out)}, not {want}")
            else:
                _failed_add(cid, node, out, took, ledger)
                mine.remove(cid)
                _delete(conf, node, cid, ledger)  # the runtime DELs after a failed ADD
            continue
        cid = f"{name}-{i:03d}"
        code, out, took = call("ADD", conf, cid, node)
        if code == 0:
            ledger.count("add_ok")
            ledger.granted(cid, node, ip_of(out))
            mine.append(cid)
        else:
            _failed_add(cid, node, out, took, ledger)
            _delete(conf, node, cid, ledger)
    return mine


def _failed_add(cid, node, out, took, ledger):
    ledger.count("add_11")
    if out.get("code") != TRY_AGAIN_LATER:
        ledger.note(f"ADD of {cid} on {node} failed with code {out.get('code')}: {out.get('msg')}")
    if took > TIMEOUT + MARGIN:
        ledger.note(f"ADD of {cid} on {node} answered code {out.get('code')} after {took:.2f} s "
                    f"(budget {TIMEOUT} s + {MARGIN} s)")


def _delete(conf, node, cid, ledger):
    ledger.dying(cid)
    code, out, _ = call("DEL", conf, cid, node)
    if code == 0:
        ledger.count("del_ok")
    else:
        ledger.count("del_failed")
        if out.get("code") != TRY_AGAIN_LATER:
            ledger.note(f"DEL of {cid} on {node} failed with code {out.get('code')}: {out.get('msg')}")
        with ledger.lock:
            ledger.pending_dels.append((node, cid))


FAULTS = ("calm", "429", "5xx", "drop", "lost", "409", "slow", "outage", "watch-drop", "410", "lag")


def fault_driver(server, rng, phases, stop, log):
    """Throws ``phases`` faults (or calm spells) at the server, a few hundred milliseconds each:
    every kind once in a seeded order, then seeded random ones; then sets ``stop``."""
    kinds = list(FAULTS)
    rng.shuffle(kinds)
    kinds += [rng.choice(FAULTS) for _ in range(max(0, phases - len(kinds)))]
    for kind in kinds:
        span = rng.uniform(0.2, 0.6)
        server.clear_faults()
        server.fail_rate(0)
        server.resume_watches()
        if kind == "429":
            server.fail_rate(rng.uniform(0.2, 0.6), status=429, retry_after=rng.choice([0.05, 0.2, 1]),
                             seed=rng.randrange(1 << 30))
        elif kind == "5xx":
            server.fail_rate(rng.uniform(0.2, 0.6), status=rng.choice([500, 503, 504]), seed=rng.randrange(1 << 30))
        elif kind == "drop":
            server.fail_rate(rng.uniform(0.1, 0.4), status="drop", seed=rng.randrange(1 << 30))
        elif kind == "lost":
            server.fail_rate(rng.uniform(0.2, 0.5), status="lost", verb=rng.choice(["create", "delete"]),
                             seed=rng.randrange(1 << 30))
        elif kind == "409":
            # 409 on delete: preconditions that fail (the store re-reads and decides again). A create
            # meets 409 only when the name exists (the nodes' real contention here): an injected one
            # for a free name is not something an API server answers.
            server.fail_rate(rng.uniform(0.2, 0.5), status=409, verb="delete", seed=rng.randrange(1 << 30))
        elif kind == "slow":
            server.inject_latency(REQUEST_TIMEOUT * rng.uniform(1.1, 1.6))
        elif kind == "outage":
            span = TIMEOUT + rng.uniform(0.3, 1.0)  # longer than a verb's budget
            server.fail_rate(1.0, status="drop")
            server.drop_watches()
        elif kind == "watch-drop":
            server.drop_watches()
        elif kind == "410":
            server.restart_watches()
        elif kind == "lag":
            server.pause_watches()
        log.append((kind, round(span, 2)))
        time.sleep(span)
    server.clear_faults()
    server.fail_rate(0)
    server.resume_watches()
    stop.set()


def storm(server, tmp_path, seed, nodes, threads, phases):
    rng = random.Random(seed)
    node_names = [f"node-{n}" for n in range(nodes)]
    confs = {}
    for node in node_names:  # a kubeconfig per node: in the daemon mode, one informer per node
        kc = write_kubeconfig(tmp_path / f"kubeconfig-{node}", server.url, namespace=NS)
        confs[node] = netconf(kc, rng="10.0.0.0/24")
    ledger = Ledger()
    cap = max(2, 80 // (nodes * threads))  # live attachments per thread: the /24 never fills up
    stop, log = threading.Event(), []
    driver = threading.Thread(target=fault_driver, args=(server, random.Random(rng.random()), phases, stop, log))
    workers, results = [], {}
    for node in node_names:
        for t in range(threads):
            name = f"{node}-t{t}"
            r = random.Random(rng.random())

            def run(name=name, node=node, r=r):
                try:
                    results[name] = runtime(confs[node], node, name, r, stop, ledger, cap)
                except BaseException as exc:  # noqa: BLE001 - reported below
                    ledger.note(f"{name} raised {type(exc).__name__}: {exc}")
                    raise
            workers.append(threading.Thread(target=run, name=name))
    driver.start()
    for w in workers:
        w.start()
    driver.join(600)
    for w in workers:
        w.join(60)
    return ledger, confs, log


def settle_and_check(server, ledger, confs, seed, log, free_by):
    about = f"(seed {seed}; replay with RDMANET_STORM_SEED={seed}; faults {log[:40]})"
    assert not ledger.violations, f"{ledger.violations[:10]} {about}"
    # the runtime's DELs that failed during the storm are retried once the API server is back
    for node, cid in list(ledger.pending_dels):
        code, out, _ = call("DEL", confs[node], cid, node)
        assert code == 0, f"DEL of {cid} on {node} after the storm: {out} {about}"
    held = leases(server)
    live = {cid: ip for cid, (node, ip) in ledger.live.items()}
    for cid, ip in live.items():
        assert held.get(ip) == f"{cid}/net1", f"{cid} was given {ip}, which the server shows held by {held.get(ip)} {about}"
    leftover = {ip: h for ip, h in held.items() if h.split("/")[0] not in live}
    if POD_UIDS["server"] is not None:  # a real server's pods of the sandboxes that are gone (the fake has none)
        for cid in set(POD_UIDS) - {"server"} - set(live):
            server.delete_pod("default", cid)
    if free_by == "GC":  # whatever the DELs did not free, CNI GC of each node must (three misses each)
        for _ in range(3):
            for node, conf in confs.items():
                valid = [cid for cid, (n, _) in ledger.live.items() if n == node]
                code, out, _ = gc(conf, node, valid)
                assert code == 0, f"GC on {node}: {out} {about}"
    else:  # or the reconciler (the CronJob; the daemon's node GC runs the same), by pod UID
        from rdmanet.ipam import reconcile
        from rdmanet.ipam.kube_config import kube_settings

        for cid in live:
            if POD_UIDS["server"] is None:
                server.add_pod("default", cid, uid=f"uid-{cid}")
        conf = json.loads(json.dumps(next(iter(confs.values()))))
        conf["ipam"]["kubernetes"]["request_timeout_seconds"] = 5  # the storm is over: no tight budget (a real server after restarts may be slow)
        target = reconcile.KubeTarget.for_settings(kube_settings(conf))
        outcome = reconcile.reconcile_target(target, grace_seconds=0, misses=1)
        assert not outcome.errors and outcome.count(reconcile.FREED) == len(leftover), (outcome.to_json()["summary"], about)
    held = {ip: h.split("/")[0] for ip, h in leases(server).items()}
    odd = {ip: (cid, HISTORY.get(cid)) for ip, cid in held.items() ^ {ip: cid for cid, ip in live.items()}.items()}
    assert held == {ip: cid for cid, ip in live.items()}, f"claims unlike the ledger's, with their calls: {odd} {about}"
    return leftover


@pytest.mark.parametrize("mode", ["in-process", "daemon"])
def test_fault_storm_over_several_nodes(server, tmp_path, request, mode):
    seed = int(os.environ.get("RDMANET_STORM_SEED") or random.randrange(1 << 32))
    nodes, threads, phases = (6, 3, 120) if LARGE else (3, 2, len(FAULTS) + 3)
    print(f"\nfault storm ({mode}): seed {seed}, {nodes} nodes x {threads} runtime threads, {phases} fault phases "
          f"(RDMANET_STORM_SEED={seed} replays it)")
    HISTORY.clear()
    if mode == "daemon":
        request.getfixturevalue("daemon_mode")
    ledger, confs, log = storm(server, tmp_path, seed, nodes, threads, phases)
    leftover = settle_and_check(server, ledger, confs, seed, log, "GC" if mode == "in-process" else "reconciler")
    print(f"fault storm ({mode}) seed {seed}: {ledger.stats}, faults {len(log)}, "
          f"claims left after DELs {len(leftover)} (freed by {'GC' if mode == 'in-process' else 'the reconciler'})")
    for ip, h in leftover.items():
        print("LEFT", ip, h, HISTORY.get(h.split("/")[0]))
    assert ledger.stats["add_ok"] > 0, f"no ADD succeeded: the storm proved nothing (seed {seed})"
    assert ledger.stats["add_11"] > 0, f"no ADD failed: the outages missed every ADD (seed {seed}) {ledger.stats}"


# -- at precise instants ----------------------------------------------------------------------------

@pytest.fixture
def kubeconfig(server, tmp_path):
    return write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)


class After:
    """Wraps the store's transport: once a request matching ``when(method, path, status)`` has
    been answered, ``then()`` runs (the API server goes away at that instant)."""

    def __init__(self, monkeypatch, when, then):
        self.fired = False
        real = kube_store.KubeStore.for_invocation.__func__
        outer = self

        class Wrapped(kube_store.Transport):
            def __init__(self, inner):
                self.inner, self.host = inner, inner.host

            def request(self, method, path, query, body, timeout):
                resp = self.inner.request(method, path, query, body, timeout)
                if not outer.fired and when(method, path, resp.status):
                    outer.fired = True
                    then()
                return resp

            def watch(self, path, query, timeout):
                return self.inner.watch(path, query, timeout)

        def for_invocation(cls, settings, domain, inv):
            store = real(cls, settings, domain, inv)
            store.leases.transport = Wrapped(store.leases.transport)
            return store

        monkeypatch.setattr(kube_store.KubeStore, "for_invocation", classmethod(for_invocation))


def outage(server):
    server.fail_rate(1.0, status="drop")
    server.drop_watches()


def back(server):
    server.fail_rate(0)
    server.clear_faults()
    server.resume_watches()


def test_the_server_going_away_between_the_list_and_the_create(server, kubeconfig, monkeypatch):
    conf = netconf(kubeconfig)
    After(monkeypatch, lambda m, p, s: m == "GET" and s == 200, lambda: outage(server))
    code, out, took = call("ADD", conf, "c1", "node-a")
    assert code == 1 and out["code"] == TRY_AGAIN_LATER and took <= TIMEOUT + MARGIN, (out, took)
    assert "did not serve" in out["msg"] and leases(server) == {}
    back(server)
    assert call("DEL", conf, "c1", "node-a")[0] == 0
    code, out, _ = call("ADD", conf, "c1", "node-a")
    assert code == 0 and leases(server) == {ip_of(out): "c1/net1"}


@pytest.mark.parametrize("then_free_by", ["DEL", "GC"])
def test_the_server_going_away_between_the_create_and_its_watch_echo(server, kubeconfig, monkeypatch, daemon_mode,
                                                                     then_free_by):
    """Daemon mode: the create is answered 201, then the server goes away before the watch
    delivers the claim. The ADD cannot confirm the attachment's claims (echo, then its List),
    answers 11 within the budget, and its rollback cannot reach the server: the claim stays,
    held by the attachment, until the runtime's DEL (or CNI GC) frees it once the server is back."""
    conf = netconf(kubeconfig)
    code, out, _ = call("ADD", conf, "warm", "node-a")  # the informer starts and syncs
    assert code == 0, out
    inf = lease_cache.informers()[0]
    end = time.monotonic() + 10
    while not inf.usable() and time.monotonic() < end:
        time.sleep(0.01)
    assert inf.usable()
    server.pause_watches()  # the echo will not come before the outage
    After(monkeypatch, lambda m, p, s: m == "POST" and s == 201, lambda: outage(server))
    code, out, took = call("ADD", conf, "c1", "node-a")
    assert code == 1 and out["code"] == TRY_AGAIN_LATER and took <= TIMEOUT + MARGIN, (out, took)
    held = leases(server)
    [(stray, holder)] = [(ip, h) for ip, h in held.items() if h == "c1/net1"]  # the rollback could not run
    back(server)
    if then_free_by == "DEL":
        assert call("DEL", conf, "c1", "node-a")[0] == 0
    else:  # c1's pod is not in the API: freed on the third GC (the liveness rule's three misses)
        server.delete_pod("default", "c1")  # (on a real server POD_UIDS made it before the ADD)
        for _ in range(3):
            assert gc(conf, "node-a", ["warm"])[0] == 0
    assert set(leases(server).values()) == {"warm/net1"}
    code, out, _ = call("ADD", conf, "c2", "node-a")
    assert code == 0 and len(set(leases(server))) == 2


@pytest.mark.parametrize("break_by", ["drop", "410"])
def test_another_node_claims_while_this_nodes_watch_is_broken(server, kubeconfig, daemon_mode, break_by):
    """Node A's watch is broken (dropped and held, or its history gone: 410) while node B
    (in-process, no watch) claims all but three addresses of a /27. A's next ADDs get the three
    free addresses and then 102: never one of B's, though A's cache had them all free."""
    conf = netconf(kubeconfig, rng="10.0.0.0/27")  # 30 addresses
    code, out, _ = call("ADD", conf, "a0", "node-a")
    assert code == 0, out
    inf = lease_cache.informers()[0]
    end = time.monotonic() + 10
    while not inf.usable() and time.monotonic() < end:
        time.sleep(0.01)
    first = ip_of(out)
    server.pause_watches()
    if break_by == "drop":
        server.drop_watches()
    else:
        server.restart_watches()
    b = node_b_store(conf)
    rs = parse_ipam_config(conf).range_sets
    theirs = [str(b.allocate(Attachment(f"b{i}", "net1"), "net-a", rs, {})[0]) for i in range(26)]
    if break_by == "drop":
        assert inf.size() <= 2  # A's cache has not seen B's claims
    mine = []
    for i in range(1, 5):
        code, out, _ = call("ADD", conf, f"a{i}", "node-a")
        if i < 4:
            assert code == 0, out
            mine.append(ip_of(out))
        else:
            assert code == 1 and out["code"] == POOL_EXHAUSTED, out
    assert not set(mine) & set(theirs) and first not in mine
    held = leases(server)
    assert len(held) == 30 and sorted(held) == sorted({first, *mine, *theirs})
    assert all(held[ip] == f"b{i}/net1" for i, ip in enumerate(theirs))
    server.resume_watches()


def node_b_store(conf):
    """Node B as the in-process plugin runs it: a store without a watch cache."""
    return node_store(conf, "node-b")


def node_store(conf, node):
    """``node``'s in-process plugin's store: no watch cache."""
    from rdmanet.ipam.kube_config import connect, kube_settings
    from rdmanet.ipam.location import CLUSTER_DOMAIN

    conn = connect(kube_settings(conf))
    return kube_store.KubeStore(conn.transport(), conn.namespace, CLUSTER_DOMAIN, node=node,
                                timeout=TIMEOUT, request_timeout=REQUEST_TIMEOUT)


@pytest.mark.parametrize("mode", ["in-process", "daemon"])
def test_a_server_slower_than_the_budget(server, kubeconfig, request, mode):
    """Every answer takes longer than the whole verb's budget: ADD answers 11 within the budget
    (+ the rollback's grace), though the server serves the requests later. Whatever they made
    after the ADD gave up is a claim of the attachment: the runtime's DEL, or GC, frees it."""
    if mode == "daemon":
        request.getfixturevalue("daemon_mode")
    conf = netconf(kubeconfig)
    if mode == "daemon":
        code, out, _ = call("ADD", conf, "warm", "node-a")
        assert code == 0, out
    server.inject_latency(TIMEOUT + 0.5)
    code, out, took = call("ADD", conf, "slow1", "node-a")
    assert code == 1 and out["code"] == TRY_AGAIN_LATER and took <= TIMEOUT + MARGIN, (out, took)
    server.inject_latency(0)
    time.sleep(TIMEOUT + 0.6)  # the requests the server still sleeps on are served (the last arrived before the lift)
    assert call("DEL", conf, "slow1", "node-a")[0] == 0
    assert gc(conf, "node-a", ["warm"] if mode == "daemon" else [])[0] == 0
    assert set(leases(server).values()) <= {"warm/net1"}


def test_a_del_whose_cached_claim_is_gone_frees_the_claim_its_watch_has_not_delivered(server, kubeconfig,
                                                                                      daemon_mode):
    """Daemon mode, its watch lagging: while it shows c1's first claim, that claim is freed
    and c1 is given another one by the node's in-process plugin (the daemon restarting; as
    well a failed ADD whose rollback delete was served but not answered, and whose create
    was served after it gave up). The DEL finds the claim it knew gone (404): its watch has
    proven nothing, so the server's word decides, and c1 holds nothing after it."""
    conf = netconf(kubeconfig)
    assert call("ADD", conf, "warm", "node-a")[0] == 0  # the block's record: c1's claims are plain ones
    code, out, _ = call("ADD", conf, "c1", "node-a")
    assert code == 0, out
    inf = lease_cache.informers()[0]
    end = time.monotonic() + 10
    while not (inf.usable() and [str(c.ip) for c in inf.claims_of(Attachment("c1", "net1"))] == [ip_of(out)]):
        assert time.monotonic() < end, "the watch did not deliver c1's claim"
        time.sleep(0.01)
    server.pause_watches()
    plugin = node_store(conf, "node-a")
    rs = parse_ipam_config(conf).range_sets
    plugin.allocate(Attachment("c0", "net1"), "net-a", rs, {})  # (the round-robin moves on)
    assert [str(ip) for ip in plugin.release(Attachment("c1", "net1"))] == [ip_of(out)]
    second = str(plugin.allocate(Attachment("c1", "net1"), "net-a", rs, {})[0])
    assert second != ip_of(out) and leases(server)[second] == "c1/net1"
    assert call("DEL", conf, "c1", "node-a")[0] == 0
    assert set(leases(server).values()) == {"warm/net1", "c0/net1"}
    server.resume_watches()
