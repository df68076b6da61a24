"""lease-ipam at cluster scale: N simulated node daemons (node blocks, the Lease watch cache) against
the fake API server.

Each simulated node is lease-ipam's real daemon-side store: every verb builds its store with
``KubeStore.for_invocation`` (the daemon's path) with the Lease watch cache enabled
(``use_watch_cache``, as ``rdmanet daemon`` does) and calls ``allocate`` / ``release``. Only the
connection is simulated: ``rdmanet.ipam.kube_config.connect`` answers an in-process client
(``tests/kube_api_server.InProcessApiClient``) under the real ``ApiClientTransport``, so requests
and answers are real JSON bytes but skip HTTP, and the fake server counts them per node.

Per N (nodes) on a network of ``--size`` addresses (default 100,000: 10.0.0.1-10.1.134.160 of a /15):
  1. every node's daemon starts (one DEL of nothing each: informers start on a domain's first verb);
     with ``--plan``, ``rdmanet ipam plan`` then gives each node its share of the blocks (planned
     records; one row, "plan: ...", a one-time set-up cost that target 1's verdict leaves out and
     the report amortises over the fill);
  2. the network is filled by ADDs, round-robin over the nodes, to each of ``--fills`` (50, 80, 95 %),
     and at each level a batch of random claims is DELed and ADDed again;
  3. at 50 %, a job of ``--job`` pods (2,000) is launched at once: its ADDs run concurrently
     (``--threads`` at a time), spread over the nodes; then the job ends (its DELs, concurrently);
  4. at the last fill, the API server "restarts": history gone, every watch broken, so every
     daemon re-Lists; the bytes each daemon reads until it is in sync again are counted.

Informers: when two nodes' informers watch the same selectors (the store's watch is not
node-scoped, e.g. today's domain-wide cache), the sim runs ONE shared informer and registers a
held watch per node at the server (counted for every event, as a real server delivers it); its
List/watch requests and bytes are counted for every node. Otherwise every node runs its own.
``--informers`` forces a mode; ``auto`` probes two nodes first.

Usage::

    .venv/bin/python bench/ipam_scale_sim.py            # N = 10, 100, 1000, 5000
    .venv/bin/python bench/ipam_scale_sim.py --quick    # smoke: N = 10, 100, network of 10,000
    .venv/bin/python bench/ipam_scale_sim.py --nodes 10,50 --size 4000 --json
    .venv/bin/python bench/ipam_scale_sim.py --plan --block-size 4   # planned blocks (large N)

    .venv/bin/python bench/ipam_scale_sim.py --server real --nodes 10,100 --size 4000 --job 500

``--server real`` runs the same phases against a real kube-apiserver + etcd (tests/kube_real_server.py,
built once and cached; as root): each node's store and informer talk HTTPS to it, with a User-Agent
naming the node (and ``<node>~informer`` for its informer), and the requests per node are counted from
the server's audit log (bytes are not: the audit log does not say them; shared informers are not
used). The "restart" is a real kube-apiserver restart.

See bench/README.md (section "Scale simulation") for what each figure means and what the
simulation does not capture about a real API server.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import json
import logging
import os
import random
import resource
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, os.path.join(HERE, ".."))

from kube_api_server import InProcessApiClient, KubeAPIServer  # noqa: E402

NAMESPACE = "sim"
NETWORK = "sim"
INFORMER = "~informer"  # suffix of the client name an informer thread's requests count under
PLANNER = "~planner"  # the client name the planner's requests (``--plan``) count under
BACKGROUND = ("list", "watch")

# Target checks (bench/README.md): slack for 409 retries under concurrency, and how far a
# per-ADD figure may move across N and still count as independent of N.
TARGET1_MAX = 1.0
TARGET1_SLACK = 0.05
INDEPENDENT_RATIO = 2.0
RESTART_NETWORK_READS = 2.0  # all daemons together may read the network's Leases this many times


# -- requests by reason ----------------------------------------------------------------------------

# The store's steps a request is counted under (``--json`` rows: ``reasons``): the innermost of
# ``_STEPS`` on the caller's stack names what the request was for, the innermost of ``_PATHS`` what
# the verb was doing (its own blocks, acquiring one, borrowing), e.g. ``POST _try_record in acquire 409``.
_STEPS = ("_try_record", "_acquire_in_group", "_acquire_in_records", "_acquire_seen", "_claim_at", "_borrow_round_robin", "scan_domain",
          "take_record", "free_record", "drop_block", "_settle", "_sweep_uncertain", "_rollback",
          "attachment_claims", "_claim_requested", "remove", "whereabouts_holder")
_VIA = ("_try_after_newest", "_try_free_seen", "_acquire_in_group", "_acquire_in_records", "_acquire_seen", "_claim_seen")  # shown as step<via
_PATHS = ("acquire", "borrow", "_pick", "_allocate_cached", "_allocate", "_release_cached",
          "release_idle", "allocate", "release", "gc", "status")


class Reasons:
    """Counts the requests of every ``KubeStore`` by the store step that made them (installed
    around ``DomainLeases.call``; the fake server's own counts are unchanged)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.lock = threading.Lock()
        self._real = None

    def install(self) -> None:
        from rdmanet.ipam.store.domain_leases import DomainLeases

        real = self._real = DomainLeases.call
        reasons = self

        def _call(store: Any, method: str, path: str, what: str, deadline: float, query: Any = (), body: Any = None):
            resp, retried = real(store, method, path, what, deadline, query, body)
            reasons.count(method, getattr(resp, "status", 0))
            return resp, retried

        DomainLeases.call = _call

    def uninstall(self) -> None:
        from rdmanet.ipam.store.domain_leases import DomainLeases

        if self._real is not None:
            DomainLeases.call = self._real
            self._real = None

    def count(self, method: str, status: int) -> None:
        step, outer = "", ""
        f = sys._getframe(2)
        while f is not None:
            name = f.f_code.co_name
            if not step and name in _STEPS:
                step = name
                via = f.f_back.f_code.co_name if f.f_back is not None else ""
                if via in _VIA:
                    step += f"<{via}"
            if name in _PATHS:
                outer = name  # the innermost: what the verb was doing
                break
            f = f.f_back
        key = f"{method} {step or '-'} in {outer or '-'} {status}"
        with self.lock:
            self.counts[key] += 1

    def take(self) -> dict[str, int]:
        with self.lock:
            out = dict(sorted(self.counts.items()))
            self.counts.clear()
        return out


# -- the simulated cluster -----------------------------------------------------------------------

_local = threading.local()


def _who() -> Optional[str]:
    return getattr(_local, "node", None)


def network_config(size: int, block_size: Optional[int] = None) -> dict:
    """A network of ``size`` allocatable addresses from 10.0.0.1 in a /8 (a /15 for 100,000);
    ``block_size``: the NAD's ``kubernetes.block_size`` (None: not set, the default)."""
    start = ipaddress.IPv4Address("10.0.0.1")
    end = start + size - 1
    prefix = 32 - (size + 2 - 1).bit_length()
    subnet = ipaddress.IPv4Network(f"10.0.0.0/{prefix}")
    kube: dict[str, Any] = {"kubeconfig": "/sim/kubeconfig", "namespace": NAMESPACE}
    if block_size is not None:
        kube["block_size"] = block_size
    return {"cniVersion": "1.0.0", "name": NETWORK, "type": "macvlan-rdma",
            "ipam": {"type": "lease-ipam", "range": str(subnet), "range_end": str(end), "whereabouts_check": False,
                     "kubernetes": kube}}


def effective_block_size(block_size: Optional[int]) -> int:
    """The IPv4 block size the stores use (the sim's network is IPv4)."""
    from rdmanet.ipam.store.block_records import DEFAULT_BLOCK_SIZE

    return block_size or DEFAULT_BLOCK_SIZE[4]


class RealServer:
    """What the simulation uses of the fake server, on a real kube-apiserver (``--server real``):
    per-client connections over HTTPS, per-client request counts from the audit log."""

    cluster: Any = None  # one KubeCluster for the whole run (started on first use, or handed in)
    owned = False

    def __init__(self) -> None:
        import kubernetes

        from kube_real_server import KubeCluster

        if RealServer.cluster is None:
            RealServer.cluster, RealServer.owned = KubeCluster().start(), True
        self.kube = RealServer.cluster
        core = kubernetes.client.CoreV1Api(self.kube.api_client())
        try:
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
        self._since = self.kube.audit_offset()

    @classmethod
    def shutdown(cls) -> None:
        if cls.cluster is not None and cls.owned:
            cls.cluster.stop()
            cls.cluster, cls.owned = None, False

    def client(self, name: str, who: Any = None) -> Any:
        """A ``kubernetes`` ApiClient to the server whose requests say ``who()`` (else ``name``)
        in their User-Agent, so the audit log tells the simulated clients apart."""
        import kubernetes

        cfg = self.kube.api_client().configuration
        cfg.retries = False  # as ipam.kube_config.connect: the store retries with its own budget
        cfg.connection_pool_maxsize = 16

        class Named(kubernetes.client.ApiClient):
            def param_serialize(self, *a: Any, **kw: Any) -> tuple:
                req = super().param_serialize(*a, **kw)
                req[2]["User-Agent"] = (who() if who is not None else None) or name
                return req

        return Named(cfg)

    def reset_client_stats(self) -> None:
        self._since = self.kube.audit_offset()

    def client_stats(self) -> dict[str, Counter]:
        out: dict[str, Counter] = {}
        for e in self.kube.audit_events(self._since):
            s = out.setdefault(e.get("userAgent") or "?", Counter())
            s["requests"] += 1
            s[f"req:{e['verb']}"] += 1
        for e in self.kube.audit_events(self._since, stage="ResponseComplete"):
            code = (e.get("responseStatus") or {}).get("code")
            if e["verb"] == "create" and code:
                out.setdefault(e.get("userAgent") or "?", Counter())[f"create:{code}"] += 1
        return out

    def restart_watches(self) -> int:
        """A real restart (the streams that broke are counted by the caller, from its informers)."""
        self.kube.restart_apiserver()
        return 0

    def handle(self, method: str, path: str, query: Any, body: Any, client: str) -> tuple:
        import http.client
        from urllib.parse import urlsplit

        u = urlsplit(self.kube.url)
        conn = http.client.HTTPSConnection(u.hostname, u.port, context=self.kube.ssl_context(), timeout=120)
        conn.request(method, path, headers={"Accept": "application/json", "User-Agent": client})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, dict(r.getheaders()), data

    def add_node(self, name: str) -> None:
        import kubernetes

        try:
            kubernetes.client.CoreV1Api(self.kube.api_client()).create_node({"metadata": {"name": name}})
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise

    def stop(self) -> None:
        """Leave the server as found: the run's Leases and nodes go."""
        import kubernetes

        api = self.kube.api_client()
        kubernetes.client.CoordinationV1Api(api).delete_collection_namespaced_lease(NAMESPACE)
        kubernetes.client.CoreV1Api(api).delete_collection_node()


class Cluster:
    """The fake API server (or a real one: ``real``), N node names and the daemon-side store of each."""

    real = False

    def __init__(self, nodes: int, size: int, shared: bool, cache_settings: dict, block_size: Optional[int] = None) -> None:
        from rdmanet.ipam import kube_config
        from rdmanet.ipam.config import parse_ipam_config
        from rdmanet.ipam.kube_config import Connection, KubeSettings
        from rdmanet.ipam.location import store_location
        from rdmanet.ipam.store import lease_cache

        self.server = RealServer() if self.real else KubeAPIServer(start=False, max_events=20_000)
        if not self.real:
            self.server.add_namespace(NAMESPACE)
        self.config = network_config(size, block_size)
        self.range_sets = list(parse_ipam_config(self.config).range_sets)
        self.allocatable = sum(rs.count_free([]) for rs in self.range_sets)
        self.domain = store_location(self.config)[1]
        self.nodes = [f"node-{i:05d}" for i in range(nodes)]
        self.shared = shared
        self._conns: dict[str, Any] = {}
        self._settings: dict[str, Any] = {}
        if shared:
            common = KubeSettings(kubeconfig="/sim/shared", namespace=NAMESPACE, timeout=60.0, request_timeout=30.0,
                                  block_size=block_size)
            conn = Connection(self.client(INFORMER, who=_who), NAMESPACE)
            for n in self.nodes:
                self._settings[n], self._conns[common.kubeconfig] = common, conn
        else:
            for n in self.nodes:
                s = KubeSettings(kubeconfig=f"/sim/{n}", namespace=NAMESPACE, timeout=60.0, request_timeout=30.0,
                                 block_size=block_size)  # what the daemon reads from the NAD (self.config)
                self._settings[n] = s
                self._conns[s.kubeconfig] = Connection(self.client(n + INFORMER, who=_who), NAMESPACE)
        self._real_connect = kube_config.connect
        kube_config.connect = lambda settings: self._conns[settings.kubeconfig]  # the one simulated seam
        lease_cache.enable(False)
        lease_cache.enable(True, max_informers=4 * nodes + 16, idle_seconds=24 * 3600.0, **cache_settings)
        self.held: dict[str, str] = {}  # attachment container id -> node (claims the sim made)
        self.addresses: dict[str, tuple] = {}  # attachment container id -> the addresses its ADD answered
        self.errors: Counter = Counter()
        self.lock = threading.Lock()
        self.reasons = Reasons()
        self.reasons.install()

    def client(self, name: str, who: Any = None) -> Any:
        if self.real:
            return self.server.client(name, who)
        return InProcessApiClient(self.server, name, who=who)

    def close(self) -> None:
        from rdmanet.ipam import kube_config
        from rdmanet.ipam.store import lease_cache

        lease_cache.enable(False)
        kube_config.connect = self._real_connect
        self.reasons.uninstall()
        self.server.stop()

    # -- verbs -----------------------------------------------------------------------------------

    def _store(self, node: str, cid: str) -> Any:
        from rdmanet.ipam.store.kube import KubeStore

        inv = SimpleNamespace(env={"RDMANET_NODE_NAME": node},
                              args={"K8S_POD_NAMESPACE": "sim", "K8S_POD_NAME": cid, "K8S_POD_UID": f"uid-{cid}"},
                              config=self.config, command="ADD")
        return KubeStore.for_invocation(self._settings[node], self.domain, inv)

    def add(self, node: str, cid: str) -> bool:
        from rdmanet.cni.core.errors import CNIError
        from rdmanet.ipam.store.base import Attachment

        _local.node = node
        try:
            got = self._store(node, cid).allocate(Attachment(cid, "net1"), NETWORK, self.range_sets, {})
        except CNIError as err:
            with self.lock:
                self.errors[f"ADD {err.code}"] += 1
            return False
        finally:
            _local.node = None
        with self.lock:
            self.held[cid] = node
            self.addresses[cid] = tuple(got)
        return True

    def delete(self, node: str, cid: str) -> bool:
        from rdmanet.cni.core.errors import CNIError
        from rdmanet.ipam.store.base import Attachment

        _local.node = node
        try:
            self._store(node, cid).release(Attachment(cid, "net1"))
        except CNIError as err:
            with self.lock:
                self.errors[f"DEL {err.code}"] += 1
            return False
        finally:
            _local.node = None
        with self.lock:
            self.held.pop(cid, None)
            self.addresses.pop(cid, None)
        return True

    def duplicates(self) -> int:
        """Addresses that two attachments the sim holds were both given (must be 0)."""
        with self.lock:
            ips = [ip for cid in self.held for ip in self.addresses.get(cid, ())]
        return len(ips) - len(set(ips))

    # -- informers ---------------------------------------------------------------------------

    def informers(self) -> list[Any]:
        from rdmanet.ipam.store import lease_cache

        return lease_cache.informers()

    def wait_synced(self, budget: float) -> bool:
        end = time.monotonic() + budget
        while time.monotonic() < end:
            if all(inf.usable() for inf in self.informers()):
                return True
            time.sleep(0.05)
        return False

    def hold_watches(self) -> None:
        """Shared mode: every node holds the watches the one shared informer has open."""
        for resource_, ns, lsel, fsel in self.server.watches_of(INFORMER):
            path = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/{resource_}"
            for n in self.nodes:
                self.server.hold_watch(n, path, {"labelSelector": lsel, "fieldSelector": fsel})

    # -- accounting ------------------------------------------------------------------------------

    def per_node(self) -> dict[str, dict[str, Counter]]:
        """Per node: ``verb`` (requests its verbs made) and ``informer`` (what its informers
        read and asked for; in shared mode the shared informer's, which each node's would be)."""
        stats = self.server.client_stats()
        shared_inf = stats.get(INFORMER, Counter())
        out = {}
        for n in self.nodes:
            verb = stats.get(n, Counter())
            inf = Counter(shared_inf) if self.shared else Counter(stats.get(n + INFORMER, Counter()))
            if self.shared:  # the held watch's events are this node's; the shared stream's are not counted twice
                inf["watch_events"], inf["watch_bytes"] = verb["watch_events"], verb["watch_bytes"]
                verb = Counter({k: v for k, v in verb.items() if not k.startswith("watch_")})
            out[n] = {"verb": verb, "informer": inf}
        return out


def totals(per_node: dict[str, dict[str, Counter]]) -> dict[str, Counter]:
    out = {"verb": Counter(), "informer": Counter()}
    for d in per_node.values():
        out["verb"].update(d["verb"])
        out["informer"].update(d["informer"])
    return out


def requests_by_verb(c: Counter) -> dict[str, int]:
    return {k[4:]: v for k, v in sorted(c.items()) if k.startswith("req:")}


def read_bytes(c: Counter) -> int:
    return c["bytes_out"] + c["watch_bytes"]


# -- phases ----------------------------------------------------------------------------------------

def measure(cl: Cluster, label: str, ops: int, run: Any, also: tuple[str, ...] = ()) -> dict:
    """Run ``run()`` with the server's counts reset; what it cost, per operation (the requests of
    the clients named in ``also``, e.g. the planner, count with the nodes' verbs)."""
    cl.server.reset_client_stats()
    cl.reasons.take()
    before = {inf: dict(inf.stats) for inf in cl.informers()}
    t0 = time.perf_counter()
    done = run()
    wall = time.perf_counter() - t0
    reasons = cl.reasons.take()
    tot = totals(cl.per_node())
    verb, inf = tot["verb"], tot["informer"]
    stats = cl.server.client_stats()
    for name in also:
        verb.update(stats.get(name, Counter()))
    n = max(1, done)
    bg = {k: v for k, v in requests_by_verb(inf).items()}
    echo = sum(inf_.stats["echo_misses"] - before.get(inf_, {}).get("echo_misses", 0) for inf_ in cl.informers())
    return {"phase": label, "ops": done, "wanted": ops, "seconds": round(wall, 2),
            "verb_requests": requests_by_verb(verb), "verb_per_op": round(verb["requests"] / n, 4),
            "verb_bytes_per_op": round(verb["bytes_out"] / n),
            "informer_requests": bg, "informer_per_op": round(inf["requests"] / n, 4),
            "requests_per_op": round((verb["requests"] + inf["requests"]) / n, 4),
            "conflicts_per_op": round(verb["create:409"] / n, 4),
            "watch_events_per_op": round(inf["watch_events"] / n, 2), "watch_bytes_per_op": round(inf["watch_bytes"] / n),
            "informer_bytes": read_bytes(inf), "echo_misses": echo, "reasons": reasons}


def fill_to(cl: Cluster, target: int, counter: list[int], threads: int, deadline: float = float("inf")) -> int:
    """ADDs, round-robin over the nodes, ``threads`` in flight at once, until ``target`` claims are
    held or ``deadline`` (monotonic) has passed (checked before each ADD: one that has not started
    by then is not made, so a phase of slow ADDs stops within one ADD's time)."""
    done = 0

    def add(node: str, cid: str) -> bool:
        return time.monotonic() < deadline and cl.add(node, cid)

    while len(cl.held) < target and time.monotonic() < deadline:
        need = min(target - len(cl.held), 1000)
        first = counter[0]
        counter[0] += need
        calls = [(add, cl.nodes[i % len(cl.nodes)], f"fill-{i:06d}") for i in range(first, first + need)]
        done += run_concurrently(cl, calls, threads)
        if cl.errors.total() > 50:
            raise SystemExit(f"too many failures while filling: {dict(cl.errors)}")
    return done


def run_concurrently(cl: Cluster, calls: list[tuple[Any, str, str]], threads: int) -> int:
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return sum(bool(ok) for ok in pool.map(lambda c: c[0](c[1], c[2]), calls))


def network_bytes(cl: Cluster) -> int:
    """Bytes of one unpaginated List of every Lease in the namespace (the network once)."""
    status, _, data = cl.server.handle("GET", f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases",
                                       [], None, "~measure")
    return len(data)


def plan_blocks(cl: Cluster, block_size: Optional[int], log: Any) -> dict:
    """``rdmanet ipam plan`` before the ADDs: the nodes are registered at the fake server, the
    planner (``rdmanet.ipam.block_planner.run_plan``, its requests counted under ``PLANNER``) gives each
    its share of the free blocks as planned records, and the sim waits until every node's
    informer has seen its own (a real plan runs well before a job). One row: its requests per
    record written, and the watch events its records caused."""
    from rdmanet.ipam.block_planner import run_plan
    from rdmanet.ipam.reconcile import KubeAPI, KubeTarget
    from rdmanet.ipam.store.kube import ApiClientTransport

    for n in cl.nodes:
        cl.server.add_node(n)
    target = KubeTarget(KubeAPI(ApiClientTransport(cl.client(PLANNER))), NAMESPACE, cl.domain)
    done: dict[str, Any] = {}

    def run() -> int:
        done["plan"] = run_plan(target, cl.range_sets, block_size)
        return len(done["plan"].created)

    r = measure(cl, "plan: planned records written (once)", 0, run, also=(PLANNER,))
    outcome = done["plan"]
    r["wanted"] = r["ops"]
    if outcome.errors or outcome.skipped:
        raise SystemExit(f"the plan did not write every record: {outcome.errors[:3]} {len(outcome.skipped)} skipped")
    end = time.monotonic() + 120.0
    while sum(len(inf.blocks()) for inf in cl.informers()) < len(outcome.created) and time.monotonic() < end:
        time.sleep(0.05)
    shares = sorted(outcome.after(n) for n in cl.nodes)
    r["blocks_per_node"] = [shares[0], shares[-1]]
    log(f"  N={len(cl.nodes)}: plan: {len(outcome.created)} planned records ({shares[0]}-{shares[-1]} per node) in "
        f"{r['seconds']} s, {r['requests_per_op']} req/record, {r['watch_events_per_op']} events/record")
    return r


def simulate(nodes: int, size: int, fills: list[int], batch: int, job: int, threads: int, shared: bool,
             cache_settings: dict, log: Any, fill_threads: int = 8, phase_seconds: float = float("inf"),
             block_size: Optional[int] = None, plan: bool = False) -> dict:
    t_start = time.perf_counter()
    cl = Cluster(nodes, size, shared, cache_settings, block_size)
    rows: list[dict] = []
    out: dict[str, Any] = {"nodes": nodes, "size": cl.allocatable, "informers": "shared" if shared else "per-node",
                           "server": "real" if cl.real else "fake",
                           "block_size": effective_block_size(block_size), "plan": plan}
    try:
        # 1. daemons start: each node's first verb (a DEL of nothing) starts its informers
        t0 = time.perf_counter()
        cl.server.reset_client_stats()
        run_concurrently(cl, [(cl.delete, n, f"start-{n}") for n in cl.nodes], threads)  # as many at once as the job
        if not cl.wait_synced(60.0):
            raise SystemExit("informers did not sync at start")
        if shared:
            cl.hold_watches()
        log(f"  N={nodes}: {len(cl.informers())} informer(s) started in {time.perf_counter() - t0:.1f} s")
        if plan:
            rows.append(plan_blocks(cl, block_size, log))

        rng = random.Random(nodes)
        counter = [0]
        fill_from = 0
        for pct in fills:
            target = cl.allocatable * pct // 100
            deadline = time.monotonic() + phase_seconds
            r = measure(cl, f"fill {fill_from}-{pct} %", target - len(cl.held),
                        lambda: fill_to(cl, target, counter, fill_threads, deadline))
            r["fill"] = pct
            rows.append(r)
            stopped = len(cl.held) < target
            if stopped:
                reached = 100 * len(cl.held) / cl.allocatable
                out["stopped"] = f"the fill to {pct} % stopped at {reached:.1f} % after {phase_seconds:g} s (--phase-seconds)"
                log(f"  N={nodes}: {out['stopped']}")
            log(f"  N={nodes}: filled to {pct} % ({len(cl.held)}) in {r['seconds']} s: {r['requests_per_op']} req/ADD, "
                f"{r['watch_events_per_op']} events/ADD; beyond 0.005/ADD: "
                + "; ".join(f"{v / max(1, r['ops']):.3f} {k}" for k, v in r["reasons"].items() if v >= 0.005 * max(1, r["ops"])))
            fill_from = pct
            # DEL a random batch at this fill, then ADD it back (the same nodes)
            if stopped:
                victims = []
            else:
                victims = rng.sample(sorted(cl.held), min(batch, len(cl.held)))
            owners = [(cid, cl.held[cid]) for cid in victims]
            if owners:
                r = measure(cl, f"DEL at {pct} %", len(owners), lambda: sum(cl.delete(n, c) for c, n in owners))
                r["fill"] = pct
                rows.append(r)
                r = measure(cl, f"ADD at {pct} %", len(owners), lambda: sum(cl.add(n, c + "-again") for c, n in owners))
                r["fill"] = pct
                rows.append(r)
            if pct == fills[0] and job:
                # 3. the job: `job` pods at once, spread over the nodes
                spread = [cl.nodes[(i * len(cl.nodes)) // job] for i in range(job)]
                pods = [(cl.add, spread[i], f"job-{i:05d}") for i in range(job)]
                r = measure(cl, f"job: {job} ADDs at once", job, lambda: run_concurrently(cl, pods, threads))
                r["fill"] = pct
                r["nodes_used"] = len(set(spread))
                rows.append(r)
                log(f"  N={nodes}: job of {job} ADDs in {r['seconds']} s: {r['requests_per_op']} req/ADD, "
                    f"{r['conflicts_per_op']} 409/ADD, {r['watch_events_per_op']} events/ADD")
                ends = [(cl.delete, spread[i], f"job-{i:05d}") for i in range(job)]
                r = measure(cl, f"job ends: {job} DELs at once", job, lambda: run_concurrently(cl, ends, threads))
                r["fill"] = pct
                rows.append(r)
            if stopped:
                break

        # 4. API server restart at the last fill
        net_bytes = network_bytes(cl)
        before = {id(inf): (inf.stats["lists"], inf.stats["watches"]) for inf in cl.informers()}
        cl.server.reset_client_stats()
        t0 = time.perf_counter()
        # (the fake: a cluster's other objects change meanwhile, so no informer's resourceVersion is current)
        broken = cl.server.restart_watches() if cl.real else cl.server.restart_watches(others_changed=True)
        deadline = time.monotonic() + 300.0
        while time.monotonic() < deadline:
            infs = cl.informers()
            # The fake's restart drops its history: every informer re-Lists (410). A real server's
            # restart keeps it (etcd): an informer that was in sync re-opens its watch only.
            if all(inf.stats["lists"] > before.get(id(inf), (0, 0))[0]
                   or (cl.real and inf.stats["watches"] > before.get(id(inf), (0, 0))[1]) for inf in infs) \
                    and all(inf.usable() for inf in infs):
                break
            time.sleep(0.1)
        else:
            raise SystemExit("informers did not re-List (or, on a real server, re-watch) after the restart")
        if cl.real:  # the streams that broke: every informer's that opened a new one
            broken = sum(inf.stats["watches"] > before.get(id(inf), (0, 0))[1] for inf in cl.informers())
        per = cl.per_node()
        node_bytes = sorted(read_bytes(d["informer"]) for d in per.values())
        own = Counter(cl.held.values())
        shares = sorted(own[n] for n in cl.nodes)
        out["restart"] = {"seconds": round(time.perf_counter() - t0, 2), "streams_broken": broken,
                          "total_bytes": sum(node_bytes), "per_daemon_mean": round(sum(node_bytes) / len(node_bytes)),
                          "per_daemon_max": node_bytes[-1], "requests": sum(sum(requests_by_verb(d["informer"]).values()) for d in per.values()),
                          "network_bytes": net_bytes, "own_claims_mean": round(sum(shares) / len(shares), 1),
                          "own_claims_max": shares[-1], "fill": len(cl.held)}
        log(f"  N={nodes}: restart: {out['restart']['total_bytes'] / 1e6:.1f} MB read by all daemons "
            f"(network {net_bytes / 1e6:.1f} MB), {out['restart']['per_daemon_mean'] / 1e3:.1f} kB per daemon")
        out["rows"] = rows
        out["errors"] = dict(cl.errors)
        out["duplicates"] = cl.duplicates()
        out["echo_misses"] = sum(inf.stats["echo_misses"] for inf in cl.informers())
        out["seconds"] = round(time.perf_counter() - t_start, 1)
        out["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        return out
    finally:
        cl.close()
        del cl
        gc.collect()


def probe_shared(size: int, cache_settings: dict, block_size: Optional[int] = None) -> tuple[bool, list]:
    """Whether two nodes' informers watch exactly the same selectors (then one can stand for all)."""
    cl = Cluster(2, min(size, 4096), False, cache_settings, block_size)
    try:
        for n in cl.nodes:
            cl.add(n, f"probe-{n}")
        cl.wait_synced(30.0)
        seen = [cl.server.watches_of(n + INFORMER) for n in cl.nodes]
        return bool(seen[0]) and seen[0] == seen[1], seen
    finally:
        cl.close()


# -- report --------------------------------------------------------------------------------------

def verdicts(results: list[dict]) -> dict[str, dict]:
    def per_op_rows(r: dict, kind: str) -> list[dict]:
        return [row for row in r["rows"] if (kind == "ADD" and (row["phase"].startswith(("fill", "ADD", "job:"))))
                or (kind == "DEL" and row["phase"].startswith(("DEL", "job ends")))]

    worst = {}
    for kind in ("ADD", "DEL"):
        worst[kind] = {r["nodes"]: max((row["requests_per_op"] for row in per_op_rows(r, kind)), default=0.0) for r in results}
    t1_values = [v for k in worst.values() for v in k.values()]
    t1 = all(v <= TARGET1_MAX + TARGET1_SLACK for v in t1_values)
    t1_spread = (max(t1_values) - min(t1_values)) if t1_values else 0.0
    t1 = t1 and t1_spread <= 0.25

    def fill_metric(r: dict, key: str) -> float:
        rows = [row for row in r["rows"] if row["phase"].startswith("fill")]
        return max(row[key] for row in rows) if rows else 0.0

    ev = {r["nodes"]: fill_metric(r, "watch_events_per_op") for r in results}
    by = {r["nodes"]: fill_metric(r, "watch_bytes_per_op") for r in results}

    def independent(d: dict) -> bool:
        vals = [v for v in d.values()]
        return bool(vals) and max(vals) <= INDEPENDENT_RATIO * max(min(vals), 1.0)

    t2 = independent(ev) and independent(by)
    rs = {r["nodes"]: r["restart"]["total_bytes"] / max(1, r["restart"]["network_bytes"]) for r in results}
    t3 = all(v <= RESTART_NETWORK_READS for v in rs.values())
    return {
        "1": {"pass": t1, "worst_requests_per_add": worst["ADD"], "worst_requests_per_del": worst["DEL"]},
        "2": {"pass": t2, "events_per_add": ev, "bytes_per_add": by},
        "3": {"pass": t3, "restart_bytes_over_network_bytes": {k: round(v, 2) for k, v in rs.items()}},
    }


def fmt_bytes(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def report_block_size(r: dict) -> int:
    """The block size a run's row used (reports saved before ``--block-size`` ran with the default)."""
    return r.get("block_size") or effective_block_size(None)


def plan_amortised(r: dict) -> Optional[tuple[int, float, int]]:
    """A planned run's (plan requests, requests per ADD of the fill rows with the plan's
    requests added, ADDs of the fill rows); None for a run without a plan."""
    plan = [row for row in r["rows"] if row["phase"].startswith("plan")]
    if not plan:
        return None
    once = sum(plan[0]["verb_requests"].values()) + sum(plan[0]["informer_requests"].values())
    fills = [row for row in r["rows"] if row["phase"].startswith("fill")]
    adds = sum(row["ops"] for row in fills)
    spent = sum(row["requests_per_op"] * row["ops"] for row in fills)
    return once, (spent + once) / max(1, adds), adds


def print_report(results: list[dict], checks: dict) -> None:
    for r in results:
        block_size = report_block_size(r)
        print(f"\nN = {r['nodes']} nodes, {r['size']} addresses, block size S = {block_size}, informers: {r['informers']} "
              f"({r['seconds']} s, max RSS {r['max_rss_mb']} MiB, echo misses {r['echo_misses']}, errors {r['errors'] or 'none'}, "
              f"addresses given twice {r['duplicates']})")
        print("| S | phase | ops | req/op | verb requests/op | verb bytes read/op | informer req/op | 409/op | watch events/op | watch bytes/op | s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for row in r["rows"]:
            n = max(1, row["ops"])
            verbs = " ".join(f"{v / n:.3g} {k}" for k, v in row["verb_requests"].items()) or "-"
            vb = fmt_bytes(row["verb_bytes_per_op"]) if "verb_bytes_per_op" in row else "-"
            print(f"| {block_size} | {row['phase']} | {row['ops']} | {row['requests_per_op']:.3f} | {verbs} | {vb} | {row['informer_per_op']:.4f} | "
                  f"{row['conflicts_per_op']:.3f} | {row['watch_events_per_op']:g} | {fmt_bytes(row['watch_bytes_per_op'])} | {row['seconds']} |")
        print("Verb requests per op by store step (`METHOD step in what-the-verb-was-doing status`), above 0.001:")
        for row in r["rows"]:
            n = max(1, row["ops"])
            top = sorted(((v / n, k) for k, v in (row.get("reasons") or {}).items()), reverse=True)
            shown = "; ".join(f"{v:.3f} {k}" for v, k in top if v >= 0.001)
            print(f"- S = {block_size}, {row['phase']}: {shown or '-'}")
        amortised = plan_amortised(r)
        if amortised is not None:
            print(f"plan: {amortised[0]} requests once; with them the fill from 0 to {amortised[2]} claims cost "
                  f"{amortised[1]:.3f} requests per ADD (the plan's records serve every later fill too)")
        if r.get("stopped"):
            print(f"stopped: {r['stopped']}")
        rs = r["restart"]
        print(f"restart at {rs['fill']} claims: all daemons read {fmt_bytes(rs['total_bytes'])} "
              f"({rs['total_bytes'] / max(1, rs['network_bytes']):.2f} x the network's Leases, {fmt_bytes(rs['network_bytes'])}) "
              f"in {rs['requests']} requests; per daemon {fmt_bytes(rs['per_daemon_mean'])} mean, {fmt_bytes(rs['per_daemon_max'])} max "
              f"(own claims: {rs['own_claims_mean']} mean, {rs['own_claims_max']} max); back in sync in {rs['seconds']} s")
    print("\nSummary per N")
    print("| N | S | req/ADD (worst) | req/DEL (worst) | watch events/ADD | watch bytes/ADD | daemon start bytes (mean) | restart bytes, all daemons |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        n = r["nodes"]
        print(f"| {n} | {report_block_size(r)} | {checks['1']['worst_requests_per_add'][n]:.3f} | {checks['1']['worst_requests_per_del'][n]:.3f} | "
              f"{checks['2']['events_per_add'][n]:g} | {fmt_bytes(checks['2']['bytes_per_add'][n])} | "
              f"{fmt_bytes(r['restart']['per_daemon_mean'])} | {fmt_bytes(r['restart']['total_bytes'])} |")
    names = {"1": "API requests per ADD/DEL <= 1 amortised, independent of N and fill",
             "2": "watch events/bytes per ADD independent of N",
             "3": "start/restart bytes grow with the node's share, not network x N"}
    print()
    for k in ("1", "2", "3"):
        print(f"target {k}: {'PASS' if checks[k]['pass'] else 'MISS'}  ({names[k]})")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default=None, help="comma-separated N values (default 10,100,1000,5000)")
    ap.add_argument("--size", type=int, default=None, help="allocatable addresses (default 100000)")
    ap.add_argument("--fills", default="50,80,95", help="fill levels in %% (default 50,80,95)")
    ap.add_argument("--batch", type=int, default=None, help="DEL/ADD batch at each fill (default 500)")
    ap.add_argument("--job", type=int, default=None, help="pods of the job launched at once (default 2000)")
    ap.add_argument("--threads", type=int, default=64, help="ADDs/DELs of the job in flight at once (default 64)")
    ap.add_argument("--fill-threads", type=int, default=8, help="ADDs in flight at once while filling (default 8)")
    ap.add_argument("--phase-seconds", type=float, default=300.0,
                    help="a fill phase longer than this stops there: the restart is measured at the fill reached (default 300)")
    ap.add_argument("--informers", choices=("auto", "shared", "per-node"), default="auto")
    ap.add_argument("--block-size", type=int, default=None,
                    help="the NAD's kubernetes.block_size (a power of two; default: not set, the store's default, 16)")
    ap.add_argument("--plan", action="store_true",
                    help="run `rdmanet ipam plan` (the planner) once after the daemons start, before the ADDs")
    ap.add_argument("--quick", action="store_true", help="smoke run: N = 10,100, 10,000 addresses, job of 200")
    ap.add_argument("--server", choices=("fake", "real"), default="fake",
                    help="the fake server in-process (default), or a real kube-apiserver + etcd over HTTPS (as root)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--report", metavar="FILE", help="print the tables of a saved --json run and exit")
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            results = json.load(f)["results"]
        print_report(results, verdicts(results))
        return 0
    nodes = [int(x) for x in (args.nodes or ("10,100" if args.quick else "10,100,1000,5000")).split(",")]
    size = args.size or (10_000 if args.quick else 100_000)
    job = args.job if args.job is not None else (200 if args.quick else 2000)
    batch = args.batch if args.batch is not None else (100 if args.quick else 500)
    fills = [int(x) for x in args.fills.split(",")]
    log = (lambda msg: print(msg, file=sys.stderr, flush=True))
    log(f"block size S = {effective_block_size(args.block_size)}" + (", planned blocks (--plan)" if args.plan else ""))
    cache_settings = {"sync_budget": 10.0, "echo_budget": 10.0}
    logger = logging.getLogger("rdmanet")
    level, stack = logger.level, threading.stack_size(512 * 1024)
    logger.setLevel(logging.WARNING)
    results = []
    t0 = time.perf_counter()
    Cluster.real = args.server == "real"
    if Cluster.real:
        args.informers = "per-node"  # no held watches on a real server: each node runs its own
    try:
        if args.informers == "auto":
            shared, seen = probe_shared(size, cache_settings, args.block_size)
            log(f"informers: {'one shared (every node watches ' + repr(seen[0]) + ')' if shared else 'one per node'}")
        else:
            shared = args.informers == "shared"
        for n in nodes:
            log(f"N = {n} ...")
            results.append(simulate(n, size, fills, batch, job, args.threads, shared, cache_settings, log, args.fill_threads,
                                    args.phase_seconds, args.block_size, args.plan))
    finally:
        logger.setLevel(level)
        threading.stack_size(stack)
        RealServer.shutdown()
    checks = verdicts(results)
    if args.json:
        print(json.dumps({"results": results, "targets": checks, "seconds": round(time.perf_counter() - t0, 1)}, indent=1))
    else:
        print_report(results, checks)
        print(f"\nTotal {time.perf_counter() - t0:.0f} s")
    return 1 if any(r["errors"] or r["duplicates"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
