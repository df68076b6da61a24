"""A seeded soak of the liveness rule: 8 simulated nodes, random interleavings of what a cluster
does to lease-ipam's Lease store, and an oracle of which pods are alive.

Each step is one of: a pod started (ADD on its node; some ask for an address), a pod deleted with
its DEL or with the DEL lost, a sandbox replaced (the old one's DEL lost), a node's GC, a node's
CNI GC (its runtime's list of live attachments), the reconciler CronJob (claims, and the blocks
of Nodes that are gone), ``rdmanet ipam plan``, a Node deleted with its pods (and a new one
joining), a daemon restart (its in-memory GC state lost; in daemon mode its watch caches too),
an API server outage and restart (every request fails, watches break), and server time passing.
Each node's daemon also runs its node GC every 2 minutes and the CronJob every 10 (server time),
as deployed. The nodes act with clocks up to 10 minutes off (their claims' acquireTime); every
judgement is by the server's clock. A small pool kept near full, the scheduler favouring two nodes
and pods asking for other nodes' free block records keep nodes borrowing and releasing blocks.

The oracle, after every step:
- no live claim freed: every running pod's address is held by its current sandbox;
- no address held twice: the running pods' addresses are distinct;
- every dead pod's claim is freed within its bound (grace + four CronJob periods of server time,
  the CronJob running at least every period), and by the end every claim of a dead pod is gone.

``RDMANET_SOAK_SEED`` replays one seed; ``RDMANET_SOAK_STEPS`` sets the length (default 400).
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Optional

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import CNIError
from rdmanet.ipam import block_planner, node_gc, reconcile
from rdmanet.ipam.kube_config import kube_settings
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store import domain_leases
from rdmanet.ipam.store import kube as kube_store
from rdmanet.ipam.store import lease_cache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import write_kubeconfig  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

NS = "ipam-soak"
PODS_NS = "apps"
NODES = 8
GRACE = 300.0  # the reconciler's and the node GC's grace (server seconds)
MISSES = 3
CRON = 600.0  # the CronJob runs at least this often (server seconds; deploy/reconciler.yaml: every 10 minutes)
NODE_GC = 120.0  # each node's daemon runs its node GC this often (rdmanet.ipam.node_gc.INTERVAL)
BOUND = GRACE + 4 * CRON  # a dead pod's claim is gone this long after its pod
STEPS = int(os.environ.get("RDMANET_SOAK_STEPS") or 400)
DAEMON_CACHE = {"distrust_seconds": 0.5, "echo_budget": 0.3, "sync_budget": 5.0}  # the daemons' watch caches


@dataclass
class Pod:
    name: str
    uid: str
    node: str
    cid: Optional[str] = None  # the live sandbox (None: not networked yet)
    ip: Optional[str] = None
    died: Optional[datetime] = None  # server time of its deletion
    old: list = field(default_factory=list)  # sandboxes whose DEL never came (superseded)


class Soak:
    def __init__(self, server, kubeconfig: str, seed: int, daemon: bool) -> None:
        self.server, self.rng, self.daemon = server, random.Random(seed), daemon
        self.conf = {"cniVersion": "1.1.0", "name": "soak-net", "type": "macvlan",
                     "ipam": {"type": "lease-ipam", "range": "10.60.0.0/25", "gc_grace_seconds": GRACE,
                              "kubernetes": {"kubeconfig": kubeconfig, "block_size": 16, "block_release_seconds": 60,
                                             "timeout_seconds": 1.0, "request_timeout_seconds": 0.5}}}
        self.nodes: list[str] = []
        self.next_gc: dict[str, datetime] = {}  # node -> when its daemon's node GC runs next (server time)
        self.clock: dict[str, float] = {}  # node -> its clock's offset (seconds)
        self.pods: dict[str, Pod] = {}
        self.dead: list[Pod] = []
        self.pending_dels: list[tuple[str, str, Pod]] = []  # (node, cid, pod): the runtime retries these
        self.outage = 0  # steps the API server stays down
        self.last_cron = self.now()
        self.serial = 0
        self.log: list[str] = []
        self.real_now_micro = domain_leases._now_micro
        for _ in range(NODES):
            self.join()
        for _ in range(90):  # a busy cluster to start with
            self.start_pod()

    # -- the cluster ---------------------------------------------------------------------------

    def now(self) -> datetime:
        return datetime.now(timezone.utc) + timedelta(seconds=self.server_offset())

    def server_offset(self) -> float:
        from kube_api_server import _clock_offset

        return _clock_offset[0]

    def join(self) -> None:
        self.serial += 1
        name = f"node-{self.serial:02d}"
        self.server.add_node(name)
        self.nodes.append(name)
        self.clock[name] = self.rng.choice([0.0, 0.0, -600.0, 600.0, self.rng.uniform(-600, 600)])
        self.next_gc[name] = self.now() + timedelta(seconds=self.rng.uniform(0, NODE_GC))

    def as_node(self, node: str):
        """This process acts as ``node``: its clock (acquireTime) is off by its offset."""
        offset = self.clock[node]
        real = self.real_now_micro

        def skewed() -> str:
            when = datetime.strptime(real(), "%Y-%m-%dT%H:%M:%S.%fZ") + timedelta(seconds=offset)
            return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")

        domain_leases._now_micro = skewed

    def cni(self, command: str, node: str, cid: str, pod: Optional[Pod] = None, **extra):
        self.as_node(node)
        env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
               "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node}
        if pod is not None:
            env["CNI_ARGS"] = f"K8S_POD_NAMESPACE={PODS_NS};K8S_POD_NAME={pod.name};K8S_POD_UID={pod.uid}"
        try:
            return skel.handle(LeaseIPAM(), env, json.dumps(dict(self.conf, **extra)).encode())
        finally:
            domain_leases._now_micro = self.real_now_micro

    def held(self) -> dict[str, str]:
        return {o["metadata"]["annotations"]["rdmanet.io/ip"]: o["spec"]["holderIdentity"]
                for o in claim_leases(self.server, NS)}

    # -- steps ----------------------------------------------------------------------------------

    def pick_node(self) -> str:
        """Where the scheduler puts a pod: the first nodes get most (their blocks fill: they borrow)."""
        return self.rng.choices(self.nodes, [4 if i < 2 else 1 for i in range(len(self.nodes))])[0]

    def start_pod(self) -> None:
        node = self.pick_node()
        self.serial += 1
        name = f"p{self.serial}"
        uid = self.server.add_pod(PODS_NS, name, node=node)["metadata"]["uid"]
        self.pods[name] = Pod(name, uid, node)
        self.sandbox(self.pods[name])

    def sandbox(self, pod: Pod, ask: Optional[str] = None) -> None:
        """A new sandbox of ``pod`` on its node: ADD (a failed one is DELeted by the runtime)."""
        self.serial += 1
        cid = f"c{self.serial}"
        extra = {"runtimeConfig": {"ips": [f"{ask}/25"]}} if ask else {}
        code, out = self.cni("ADD", pod.node, cid, pod, **extra)
        if code:
            self.log.append(f"ADD {cid} of {pod.name} failed: {out.get('code')} {out.get('msg', '')[:80]}")
            self.pending_dels.append((pod.node, cid, pod))
            return
        ip = out["ips"][0]["address"].split("/")[0]
        others = {p.ip: p.name for p in self.pods.values() if p.ip and p is not pod}
        assert ip not in others, f"{ip} given to {pod.name} ({cid}) while {others[ip]} holds it {self.where()}"
        if pod.cid is not None:
            pod.old.append(pod.cid)
        pod.cid, pod.ip = cid, ip

    def replace_sandbox(self) -> None:
        live = [p for p in self.pods.values() if p.cid]
        if live:
            pod = self.rng.choice(live)
            self.server.advance_clock(1)  # a new sandbox is made after the old one
            self.sandbox(pod)

    def delete_pod(self, with_del: bool) -> None:
        if not self.pods:
            return
        pod = self.pods.pop(self.rng.choice(sorted(self.pods)))
        if with_del and pod.cid:
            self.pending_dels.append((pod.node, pod.cid, pod))
        self.server.delete_pod(PODS_NS, pod.name)
        pod.died = self.now()
        self.dead.append(pod)

    def retry_dels(self) -> None:
        left = []
        for node, cid, pod in self.pending_dels:
            if node not in self.nodes:
                continue  # its node is gone: the runtime with it
            code, out = self.cni("DEL", node, cid, pod)
            if code:
                left.append((node, cid, pod))
        self.pending_dels = left

    def node_gc(self, node: Optional[str] = None) -> None:
        node = node or self.rng.choice(self.nodes)
        self.as_node(node)
        try:
            node_gc.run_once(node, grace=GRACE, misses=MISSES, say=lambda *a, **k: None)
        finally:
            domain_leases._now_micro = self.real_now_micro

    def cni_gc(self) -> None:
        node = self.rng.choice(self.nodes)
        valid = [{"containerID": p.cid, "ifname": "net1"} for p in self.pods.values() if p.node == node and p.cid]
        valid += [{"containerID": cid, "ifname": "net1"} for n, cid, _ in self.pending_dels if n == node]
        self.cni("GC", node, "gc", **{"cni.dev/valid-attachments": valid})

    def cron(self) -> None:
        try:
            reconcile.reconcile_all(self.conf, grace_seconds=GRACE, misses=MISSES)
        except CNIError:
            return  # the API server is out: the next run
        self.last_cron = self.now()

    def plan(self) -> None:
        try:
            block_planner.plan_network(self.conf, blocks_per_node=1)
        except CNIError:
            pass

    def delete_node(self) -> None:
        node = self.rng.choice(self.nodes)
        self.nodes.remove(node)
        for name in [n for n, p in self.pods.items() if p.node == node]:
            pod = self.pods.pop(name)
            self.server.delete_pod(PODS_NS, name)
            pod.died = self.now()
            self.dead.append(pod)
        self.server.delete_node(node)
        self.join()

    def restart_daemon(self) -> None:
        node_gc._empty_since.clear()
        if self.daemon:
            lease_cache.enable(False)
            lease_cache.enable(True, **DAEMON_CACHE)

    def api_outage(self) -> None:
        self.server.fail_rate(1.0, 503)
        self.outage = self.rng.randint(1, 3)

    def ask_for_an_address(self) -> None:
        """A pod asks for an address: mostly a free block record's of another node (it borrows
        that record), else any (granted, or refused when held)."""
        node = self.pick_node()
        free = [o["metadata"]["annotations"]["rdmanet.io/ip"] for o in self.server.objects("leases", NS)
                if o["metadata"]["labels"].get("rdmanet.io/block-owner") not in (None, node)
                and not o["spec"].get("holderIdentity")]
        self.serial += 1
        name = f"p{self.serial}"
        uid = self.server.add_pod(PODS_NS, name, node=node)["metadata"]["uid"]
        pod = self.pods[name] = Pod(name, uid, node)
        self.sandbox(pod, ask=self.rng.choice(free) if free and self.rng.random() < 0.8
                     else f"10.60.0.{self.rng.randint(1, 126)}")

    # -- the oracle -----------------------------------------------------------------------------

    def where(self) -> str:
        return f"(seed {self.seed_note}; last steps {self.log[-12:]})"

    def check(self, final: bool = False) -> None:
        held = self.held()
        ips = [p.ip for p in self.pods.values() if p.cid]
        assert len(ips) == len(set(ips)), f"an address held twice {self.where()}"
        for p in self.pods.values():
            if p.cid:
                assert held.get(p.ip) == f"{p.cid}/net1", \
                    f"live claim of {p.name} ({p.cid}, {p.ip}) freed: the server shows {held.get(p.ip)} {self.where()}"
        now = self.now()
        for p in self.dead:
            mine = [ip for ip, h in held.items() if h.split("/")[0] in {p.cid, *p.old}]
            if mine and (final or (now - p.died).total_seconds() > BOUND):
                raise AssertionError(f"{p.name}, dead since {p.died:%H:%M:%S} ({int((now - p.died).total_seconds())} s), "
                                     f"still holds {mine} {self.where()}")

    def step(self) -> None:
        if self.outage:
            self.outage -= 1
            if not self.outage:
                self.server.clear_faults()
                self.server.restart_watches()
        full = sum(1 for p in self.pods.values() if p.cid) >= 110  # of 126 addresses: keep the pool near full
        actions = [(self.start_pod, 2 if full else 8), (lambda: self.delete_pod(True), 3 if full else 1),
                   (lambda: self.delete_pod(False), 1), (self.replace_sandbox, 1), (self.node_gc, 2),
                   (self.cni_gc, 4), (self.cron, 0.3), (self.plan, 0.3), (self.delete_node, 0.3),
                   (self.restart_daemon, 0.5), (self.api_outage, 0.3), (self.ask_for_an_address, 2),
                   (self.retry_dels, 2)]
        fn = self.rng.choices([a for a, _ in actions], [w for _, w in actions])[0]
        self.log.append(getattr(fn, "__name__", "delete_pod"))
        fn()
        self.server.advance_clock(self.rng.choice([0, 1, 5, 20, 60]))
        for node in list(self.nodes):  # each daemon's node GC, on its timer
            if self.next_gc[node] <= self.now():
                self.next_gc[node] += timedelta(seconds=NODE_GC)
                self.node_gc(node)
        if (self.now() - self.last_cron).total_seconds() >= CRON and not self.outage:
            self.cron()  # the CronJob's schedule
        self.check()

    def settle(self) -> None:
        """The end: the API server back, the runtimes' DELs retried, time passing with the CronJob
        running: every dead pod's claim goes, every live one stays."""
        self.server.clear_faults()
        self.outage = 0
        for _ in range(8):
            self.retry_dels()
            self.server.advance_clock(CRON)
            self.cron()
            self.check()
        for p in list(self.pods.values()):  # every pod ends: their claims go too
            self.pods.pop(p.name)
            self.server.delete_pod(PODS_NS, p.name)
            p.died = self.now()
            self.dead.append(p)
        for _ in range(8):
            self.server.advance_clock(CRON)
            self.cron()
        self.check(final=True)
        assert self.held() == {}, f"claims left: {self.held()} {self.where()}"


@pytest.fixture
def kubeconfig(server, tmp_path):
    return write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)


@pytest.mark.parametrize("mode", ["in-process", "daemon"])
def test_the_liveness_soak(server, kubeconfig, mode, monkeypatch):
    seed = int(os.environ.get("RDMANET_SOAK_SEED") or random.randrange(1 << 32))
    print(f"\nliveness soak ({mode}): seed {seed}, {STEPS} steps (replay: RDMANET_SOAK_SEED={seed})")
    monkeypatch.setattr(node_gc, "_seen", {})
    node_gc.remember(kube_settings({"ipam": {"type": "lease-ipam", "kubernetes": {"kubeconfig": kubeconfig}}}))
    if mode == "daemon":
        kube_store.use_watch_cache(True, **DAEMON_CACHE)
    try:
        soak = Soak(server, kubeconfig, seed, mode == "daemon")
        soak.seed_note = seed
        for _ in range(STEPS):
            soak.step()
        soak.settle()
    finally:
        if mode == "daemon":
            kube_store.use_watch_cache(False)
    print(f"  pods started {soak.serial}, dead {len(soak.dead)}, nodes joined {len(soak.clock)}")
