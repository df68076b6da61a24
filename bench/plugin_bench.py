"""Plugin benchmark: ADD/CHECK/DEL through the raw CNI exec protocol, ours against Debian's Go plugins.

    .venv/bin/python bench/plugin_bench.py [--cycles N] [--quick] [--json] [--soak N] [--concurrency N]

Root only (network namespaces, veth pairs). Implementations, interleaved cycle by cycle
(round-robin, the starting one rotating), each cycle in fresh network namespaces:

    go-macvlan    Debian's Go macvlan + host-local (the reference for the macvlan rows)
    mv-inproc     macvlan-rdma + lease-ipam, shims with no daemon: the plugin runs in-process
    mv-daemon     macvlan-rdma + lease-ipam, shims answered by `rdmanet daemon`
    go-hostdev    Go host-device + host-local (the reference for the host-device rows)
    hd-inproc     host-device-rdma + lease-ipam, in-process
    hd-daemon     host-device-rdma + lease-ipam, shim + daemon
    py-floor      `python -IS -c pass`: the interpreter start every shim pays (one exec per cycle,
                  shown as ADD)
    shim-floor    the daemon shim answering CNI VERSION: interpreter start + the shim's imports +
                  one daemon round trip, the fixed cost of every call through the daemon

Then: 100 concurrent ADDs through the daemon against 100 concurrent Go ADDs, the -X importtime
breakdown of the shim and of the in-process path, and a soak of a fresh daemon (ADD/DEL cycles
sent to its socket with rdmanet.node.launcher.exchange, the request a shim sends) recording RSS, fds,
threads and netns handles. Verdicts against the targets are printed, never asserted; the exit code
is 1 only when a call failed. See bench/README.md for the columns and the targets.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from rdmanet.node.launcher import DaemonLost, NoDaemon, call as daemon_call, write_shim  # noqa: E402  (stdlib only)
from rdmanet.node.testing import plain_site_dir  # noqa: E402

GO_DIR = "/usr/lib/cni"
BARE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IP = shutil.which("ip", path=BARE_PATH) or "/usr/sbin/ip"
PREFIX = f"rbm{os.getpid() % 0x10000:04x}"  # every netns and link of this run; 7 characters
CNI_VERSION = "1.0.0"
VERBS = ("ADD", "CHECK", "DEL")
# Packages whose import the in-process path is known to pay for (reported when present).
HEAVY = ("pyroute2", "pydantic", "pydantic_core", "netaddr", "kubernetes", "urllib3", "yaml", "requests",
         "google", "dateutil", "websocket", "certifi", "oauthlib")

TARGETS = {
    "daemon_p50": 1.0,      # shim + daemon: ADD and DEL p50 <= 1.0x the Go reference
    "daemon_p95": 1.5,      # ... p95 <= 1.5x
    "inproc_add_p50": 10.0,  # in-process fallback: ADD and DEL p50 <= 10x
    "rss_mb": 120.0,        # daemon RSS after the soak
    "rss_growth_kb": 1024,  # "no growth" between the checkpoint and the end: within 1 MiB
    "concurrent_wall": 1.0,  # N concurrent daemon ADDs finish before N concurrent Go ADDs
}


def say(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- host objects


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([IP, *args], capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


class Host:
    """Every namespace and link of this run (all named PREFIX...); :meth:`cleanup` removes them all."""

    def __init__(self) -> None:
        self.tmp = tempfile.mkdtemp(prefix=f"{PREFIX}-bench-")
        # The node policy (rdmanet.cni.linux.roots) the runtime's environment names: stores and
        # host-device-rdma's state under this run's directory; this run's veths (no RDMA device)
        # allowed as masters and as devices host-device-rdma moves.
        policy = os.path.join(self.tmp, "node-policy.json")
        with open(policy, "w") as f:
            json.dump({"dataRoots": [self.tmp], "logRoots": [self.tmp], "deviceInfoDir": self.tmp,
                       "hostDeviceStateDir": os.path.join(self.tmp, "hd-state"),
                       "masters": [{"name": f"{PREFIX}*"}], "hostDevices": [{"name": f"{PREFIX}*"}]}, f)
        os.chmod(policy, 0o600)
        RUNTIME_ENV["RDMANET_NODE_POLICY"] = policy
        self.daemons: list = []
        self._clean = False
        self._seq = 0
        self._lock = threading.Lock()

    def netns(self, tag: str) -> str:
        """A fresh namespace (loopback up); returns its name (path /run/netns/<name>)."""
        with self._lock:
            self._seq += 1
            name = f"{PREFIX}-{tag}-{self._seq}"
        ip("netns", "add", name)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    @staticmethod
    def del_netns(name: str) -> None:
        ip("netns", "del", name, check=False)

    def veth(self, a: str, b: str) -> None:
        ip("link", "add", a, "type", "veth", "peer", "name", b)
        for end in (a, b):
            ip("link", "set", end, "addrgenmode", "none", check=False)  # no IPv6 autoconf noise
            ip("link", "set", end, "up")

    def daemon(self, socket_path: str, log_path: str):
        from rdmanet.node.testing import Daemon

        d = Daemon(socket_path, log_path=log_path)
        self.daemons.append(d)
        return d

    def cleanup(self) -> None:
        if self._clean:
            return
        self._clean = True
        for d in self.daemons:
            try:
                d.stop(timeout=15)
            except Exception as exc:  # keep cleaning
                say(f"cleanup: stopping daemon {d.pid}: {exc}")
        try:
            names = [n for n in os.listdir("/run/netns") if n.startswith(PREFIX)]
        except OSError:
            names = []
        for n in names:
            self.del_netns(n)  # takes the links inside along (a veth end takes its peer)
        proc = ip("-j", "link", "show", check=False)
        try:
            links = [e["ifname"] for e in json.loads(proc.stdout or "[]")]
        except ValueError:
            links = []
        for n in links:
            if n.startswith(PREFIX):
                ip("link", "del", n, check=False)
        shutil.rmtree(self.tmp, ignore_errors=True)


# --------------------------------------------------------------------------- raw exec


RUNTIME_ENV: dict[str, str] = {}  # what the runtime adds for every plugin (the node policy: Host)


def cni_env(command: str, cid: str, netns: str, cni_path: str) -> dict:
    """The bare environment a runtime gives a plugin (Multus adds the K8S_POD_* args)."""
    return {**RUNTIME_ENV, "PATH": BARE_PATH, "CNI_COMMAND": command, "CNI_CONTAINERID": cid,
            "CNI_NETNS": f"/run/netns/{netns}" if netns else "", "CNI_IFNAME": "net1", "CNI_PATH": cni_path,
            "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME={cid};K8S_POD_UID=uid-{cid}"}


@dataclass
class Call:
    rc: int
    out: str
    err: str
    secs: float


def run_exec(argv: list[str], env: dict, stdin: bytes, timeout: float = 60) -> Call:
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, input=stdin, env=env, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Call(-1, "", f"timed out after {timeout} s", time.perf_counter() - t0)
    dt = time.perf_counter() - t0
    return Call(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"), dt)


def with_prev(conf: dict, result: Optional[dict]) -> bytes:
    """CHECK/DEL stdin as libcni sends it: the config plus the cached ADD result as prevResult."""
    return json.dumps(dict(conf, prevResult=result) if result is not None else conf).encode()


# --------------------------------------------------------------------------- implementations


@dataclass
class Impl:
    key: str
    label: str
    kind: str              # "macvlan", "host-device" or "floor"
    argv: list[str]
    cni_path: str
    conf: dict
    ref: Optional[str]     # key of the reference for the ratio columns
    daemon: bool = False
    shown_as: str = ""     # floor rows: the verb column ("exec", "VERSION"); compared with the reference's ADD
    times: dict = field(default_factory=lambda: {v: [] for v in VERBS})
    server_ms: dict = field(default_factory=lambda: {v: [] for v in VERBS})
    cids: dict = field(default_factory=dict)  # (cid, verb) -> index in times[verb], to join the daemon log
    failures: list = field(default_factory=list)

    def fail(self, verb: str, call: Call, what: str = "") -> None:
        self.failures.append({"verb": verb, "rc": call.rc, "why": what, "stdout": call.out[-600:],
                              "stderr": call.err[-600:]})

    def cycle(self, netns: str, cid: str, counted: bool) -> None:
        """ADD, CHECK, DEL of one attachment in ``netns``."""
        if self.kind == "floor":
            call = run_exec(self.argv, dict(self.conf, PATH=BARE_PATH), b"")  # conf: the extra environment
            if call.rc != 0:
                self.fail("ADD", call)
            elif counted:
                self.times["ADD"].append(call.secs)
            return
        conf = self.conf
        result = None
        for verb in VERBS:
            stdin = json.dumps(conf).encode() if verb == "ADD" else with_prev(conf, result)
            call = run_exec(self.argv, cni_env(verb, cid, netns, self.cni_path), stdin)
            if call.rc != 0:
                self.fail(verb, call)
                if verb == "ADD":  # nothing to CHECK; DEL anyway (uncounted) so the next cycle starts clean
                    run_exec(self.argv, cni_env("DEL", cid, netns, self.cni_path), stdin)
                    return
                continue
            if verb == "ADD":
                try:
                    result = json.loads(call.out)
                    result["ips"][0]["address"]
                except (ValueError, KeyError, IndexError, TypeError):
                    self.fail(verb, call, "ADD printed no result with an address")
                    result = None
            if counted:
                self.cids[(cid, verb)] = len(self.times[verb])
                self.times[verb].append(call.secs)

    def join_daemon_log(self, calls: dict) -> None:
        """Server-side ms of each counted call, from the daemon's ``call`` log events."""
        for (cid, verb), _ in sorted(self.cids.items(), key=lambda kv: kv[1]):
            ms = calls.get((self.argv[0].rsplit("/", 1)[-1], cid, verb))
            if ms is not None:
                self.server_ms[verb].append(ms / 1000.0)


def daemon_calls(log_path: str) -> dict:
    """{(plugin, containerID, command): ms} from a daemon log (one JSON object per line)."""
    calls = {}
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and doc.get("event") == "call":
                    calls[(doc.get("plugin"), doc.get("container"), doc.get("command"))] = doc.get("ms")
    except OSError:
        pass
    return calls


class Setup:
    """Bin dirs, daemon, masters, devices and the conflists of every implementation."""

    def __init__(self, host: Host, go: bool) -> None:
        self.host = host
        tmp = host.tmp
        self.bin_exec = os.path.join(tmp, "bin-inproc")
        self.bin_daemon = os.path.join(tmp, "bin-daemon")
        self.socket = os.path.join(tmp, "run", "daemon.sock")
        nowhere = os.path.join(tmp, "nowhere", "daemon.sock")  # nothing listens: in-process
        site_dir = plain_site_dir(os.path.join(tmp, "site"))  # as install.sh's venv: no editable finder
        for d, sock in ((self.bin_exec, nowhere), (self.bin_daemon, self.socket)):
            os.makedirs(d)
            for plugin in ("macvlan-rdma", "host-device-rdma", "lease-ipam"):
                write_shim(os.path.join(d, plugin), plugin, sys.executable, site_dir, sock)
        self.daemon_log = os.path.join(tmp, "daemon.log")
        self.daemon = host.daemon(self.socket, self.daemon_log)

        self.master = f"{PREFIX}m"
        host.veth(self.master, f"{PREFIX}n")
        base = int.from_bytes(os.urandom(1), "big") % 200  # 198.18.<base + i>.0/24: one /24 per implementation
        self.subnets = iter(f"198.18.{base + i}" for i in range(50))
        self.go = go
        impls = []
        if go:
            impls.append(Impl("go-macvlan", "Go macvlan + host-local", "macvlan", [f"{GO_DIR}/macvlan"], GO_DIR,
                              self.macvlan_conf("macvlan", self.host_local("go-macvlan")), None))
        impls.append(Impl("mv-inproc", "macvlan-rdma + lease-ipam, in-process", "macvlan",
                          [os.path.join(self.bin_exec, "macvlan-rdma")], self.bin_exec,
                          self.macvlan_conf("macvlan-rdma", self.lease("mv-inproc")), "go-macvlan"))
        impls.append(Impl("mv-daemon", "macvlan-rdma + lease-ipam, shim + daemon", "macvlan",
                          [os.path.join(self.bin_daemon, "macvlan-rdma")], self.bin_daemon,
                          self.macvlan_conf("macvlan-rdma", self.lease("mv-daemon")), "go-macvlan", daemon=True))
        if go:
            impls.append(Impl("go-hostdev", "Go host-device + host-local", "host-device", [f"{GO_DIR}/host-device"],
                              GO_DIR, self.hostdev_conf("host-device", 0, self.host_local("go-hostdev")), None))
        impls.append(Impl("hd-inproc", "host-device-rdma + lease-ipam, in-process", "host-device",
                          [os.path.join(self.bin_exec, "host-device-rdma")], self.bin_exec,
                          self.hostdev_conf("host-device-rdma", 1, self.lease("hd-inproc")), "go-hostdev"))
        impls.append(Impl("hd-daemon", "host-device-rdma + lease-ipam, shim + daemon", "host-device",
                          [os.path.join(self.bin_daemon, "host-device-rdma")], self.bin_daemon,
                          self.hostdev_conf("host-device-rdma", 2, self.lease("hd-daemon")), "go-hostdev", daemon=True))
        impls.append(Impl("py-floor", "python -IS -c pass (interpreter start)", "floor",
                          [sys.executable, "-IS", "-c", "pass"], "", {}, "go-macvlan", shown_as="exec"))
        impls.append(Impl("shim-floor", "the daemon shim answering CNI VERSION (interpreter start, shim imports, "
                          "one daemon round trip)", "floor", [os.path.join(self.bin_daemon, "macvlan-rdma")], "",
                          {"CNI_COMMAND": "VERSION"}, "go-macvlan", shown_as="VERSION"))
        if not go:
            for impl in impls:
                impl.ref = None
        self.impls = impls

    def host_local(self, tag: str) -> dict:
        prefix = next(self.subnets)
        return {"type": "host-local", "dataDir": os.path.join(self.host.tmp, "data", tag),
                "ranges": [[{"subnet": f"{prefix}.0/24", "gateway": f"{prefix}.1"}]]}

    def lease(self, tag: str) -> dict:
        prefix = next(self.subnets)
        # one node, and the calls carry Multus' K8S_POD_UID: the local store is chosen explicitly
        return {"type": "lease-ipam", "range": f"{prefix}.0/24", "gateway": f"{prefix}.1", "datastore": "local",
                "dataDir": os.path.join(self.host.tmp, "data", tag)}

    def macvlan_conf(self, type_: str, ipam: dict) -> dict:
        return {"cniVersion": CNI_VERSION, "name": f"{PREFIX}-{ipam['dataDir'].rsplit('/', 1)[-1]}", "type": type_,
                "master": self.master, "mode": "bridge", "ipam": ipam}

    def hostdev_conf(self, type_: str, index: int, ipam: dict) -> dict:
        device = f"{PREFIX}d{index}"
        self.host.veth(device, f"{PREFIX}e{index}")
        conf = {"cniVersion": CNI_VERSION, "name": f"{PREFIX}-{ipam['dataDir'].rsplit('/', 1)[-1]}", "type": type_,
                "device": device, "ipam": ipam}
        return conf

    def by_key(self, key: str) -> Optional[Impl]:
        return next((i for i in self.impls if i.key == key), None)


# --------------------------------------------------------------------------- statistics


def pct(values: list[float], q: float) -> Optional[float]:
    """The q-quantile (nearest rank) in milliseconds; None for no values."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] * 1000


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(a / b, 2) if a is not None and b else None


def rows_of(setup: Setup) -> list[dict]:
    rows = []
    for impl in setup.impls:
        ref = setup.by_key(impl.ref) if impl.ref else None
        for verb in (("ADD",) if impl.kind == "floor" else VERBS):
            t = impl.times[verb]
            p50, p95 = pct(t, 0.5), pct(t, 0.95)
            rref = ref.times[verb] if ref else []
            failed = sum(1 for f in impl.failures if f["verb"] == verb)
            rows.append({
                "impl": impl.key, "label": impl.label, "verb": impl.shown_as or verb, "n": len(t), "failed": failed,
                "p50_ms": r2(p50), "p95_ms": r2(p95), "max_ms": r2(pct(t, 1.0)),
                "ratio_p50": ratio(p50, pct(rref, 0.5)), "ratio_p95": ratio(p95, pct(rref, 0.95)),
                "daemon_p50_ms": r2(pct(impl.server_ms[verb], 0.5)) if impl.daemon else None,
            })
    return rows


def r2(v: Optional[float]) -> Optional[float]:
    return None if v is None else round(v, 2)


# --------------------------------------------------------------------------- phases


def run_cycles(setup: Setup, cycles: int, warmup: int) -> None:
    impls = setup.impls
    t0 = time.monotonic()
    for i in range(warmup + cycles):
        counted = i >= warmup
        k = i % len(impls)
        order = impls[k:] + impls[:k]
        spaces = {impl.key: setup.host.netns(impl.key[:2]) for impl in order if impl.kind != "floor"}
        try:
            for impl in order:
                impl.cycle(spaces.get(impl.key, ""), f"{PREFIX}-{impl.key}-{i}", counted)
        finally:
            for name in spaces.values():
                Host.del_netns(name)
        if counted and (i - warmup + 1) % max(1, cycles // 10) == 0:
            say(f"  cycle {i - warmup + 1}/{cycles} ({time.monotonic() - t0:.0f} s)")
    calls = daemon_calls(setup.daemon_log)
    for impl in impls:
        if impl.daemon:
            impl.join_daemon_log(calls)


def median(values: list) -> Optional[float]:
    s = sorted(v for v in values if v is not None)
    return s[len(s) // 2] if s else None


def run_concurrency(setup: Setup, n: int, rounds: int) -> dict:
    """n concurrent ADDs through the daemon shim vs n concurrent Go ADDs, each in its own netns;
    ``rounds`` times (the two sides alternating which goes first), every ADD DELed after its batch."""
    mv, go = setup.by_key("mv-daemon"), setup.by_key("go-macvlan")
    data = os.path.join(setup.host.tmp, "data")
    conf = json.dumps(dict(mv.conf, name=f"{PREFIX}-conc", ipam=dict(mv.conf["ipam"], dataDir=os.path.join(data, "conc"))))
    gconf = go and json.dumps(dict(go.conf, name=f"{PREFIX}-conc-go",
                                   ipam=dict(go.conf["ipam"], dataDir=os.path.join(data, "conc-go"))))
    spaces = [setup.host.netns("c") for _ in range(n)]
    results: list[dict] = []
    errors: list[str] = []

    def ours(r: int) -> dict:
        barrier = threading.Barrier(n + 1)

        def one(j: int) -> Call:
            env = cni_env("ADD", f"{PREFIX}-conc{r}-{j}", spaces[j], mv.cni_path)
            barrier.wait()
            return run_exec(mv.argv, env, conf.encode(), timeout=120)

        with ThreadPoolExecutor(max_workers=n) as pool:
            futures = [pool.submit(one, j) for j in range(n)]
            cpu0, kids0 = cpu_seconds(setup.daemon.pid), children_cpu()
            barrier.wait()
            t0 = time.perf_counter()
            calls = [f.result() for f in futures]
            wall = time.perf_counter() - t0
            daemon_cpu, shims_cpu = cpu_seconds(setup.daemon.pid) - cpu0, children_cpu() - kids0
        addrs, failed = [], 0
        for j, c in enumerate(calls):
            try:
                if c.rc != 0:
                    raise ValueError
                addrs.append(json.loads(c.out)["ips"][0]["address"])
            except (ValueError, KeyError, IndexError, TypeError):
                failed += 1
                errors.append(f"ADD {j} (exit {c.rc}): {(c.out or c.err)[-300:]}")
        t0 = time.perf_counter()  # DEL all, concurrently as well (reported, not a target)
        with ThreadPoolExecutor(max_workers=n) as pool:
            dels = list(pool.map(lambda j: run_exec(mv.argv, cni_env("DEL", f"{PREFIX}-conc{r}-{j}", spaces[j], mv.cni_path),
                                                    conf.encode(), timeout=120), range(n)))
        return {"wall_s": round(wall, 3), "errors": failed, "duplicates": len(addrs) - len(set(addrs)),
                "p50_ms": r2(pct([c.secs for c in calls], 0.5)), "max_ms": r2(pct([c.secs for c in calls], 1.0)),
                "daemon_cpu_s": round(daemon_cpu, 3), "shims_cpu_s": round(shims_cpu, 3),
                "del_wall_s": round(time.perf_counter() - t0, 3), "del_errors": sum(1 for c in dels if c.rc != 0)}

    def reference(r: int) -> dict:
        barrier = threading.Barrier(n + 1)

        def one(j: int) -> Call:
            env = cni_env("ADD", f"{PREFIX}-cgo{r}-{j}", spaces[j], go.cni_path)
            barrier.wait()
            return run_exec(go.argv, env, gconf.encode(), timeout=120)

        with ThreadPoolExecutor(max_workers=n) as pool:  # released at once, as ours
            futures = [pool.submit(one, j) for j in range(n)]
            barrier.wait()
            t0 = time.perf_counter()
            calls = [f.result() for f in futures]
            wall = time.perf_counter() - t0
        with ThreadPoolExecutor(max_workers=n) as pool:
            list(pool.map(lambda j: run_exec(go.argv, cni_env("DEL", f"{PREFIX}-cgo{r}-{j}", spaces[j], go.cni_path),
                                             gconf.encode(), timeout=120), range(n)))
        return {"go_wall_s": round(wall, 3), "go_errors": sum(1 for c in calls if c.rc != 0)}

    try:
        for r in range(rounds):
            if go is not None and r % 2:
                ref = reference(r)
                row = ours(r)
            else:
                row = ours(r)
                ref = reference(r) if go is not None else {"go_wall_s": None, "go_errors": None}
            row.update(ref, ratio=ratio(row["wall_s"], ref["go_wall_s"]))
            results.append(row)
            say(f"  round {r + 1}/{rounds}: {n} concurrent daemon ADDs {row['wall_s']:.2f} s, "
                f"{n} concurrent Go ADDs {fmt(ref['go_wall_s'], '.2f')} s")
    finally:
        for name in spaces:
            Host.del_netns(name)
    return {
        "n": n, "rounds": results, "error_samples": errors[:3],
        "daemon_wall_s": median([x["wall_s"] for x in results]),
        "go_wall_s": median([x["go_wall_s"] for x in results]),
        "ratio": median([x["ratio"] for x in results]),
        "daemon_errors": sum(x["errors"] for x in results), "duplicates": sum(x["duplicates"] for x in results),
        "daemon_del_errors": sum(x["del_errors"] for x in results),
        "go_errors": None if go is None else sum(x["go_errors"] for x in results),
        "daemon_p50_ms": median([x["p50_ms"] for x in results]), "daemon_max_ms": max(x["max_ms"] for x in results),
        "daemon_cpu_s": median([x["daemon_cpu_s"] for x in results]),
        "shims_cpu_s": median([x["shims_cpu_s"] for x in results]),
        "daemon_del_wall_s": median([x["del_wall_s"] for x in results]),
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time ``pid`` has used so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU time of this process's waited-for children (the shim and plugin execs)."""
    t = os.times()
    return t.children_user + t.children_system


def proc_sample(pid: int) -> dict:
    """VmRSS, thread count, open fds and fds on network namespaces of ``pid``, once it is idle."""
    fds_min = threads_min = netns_min = None
    rss = 0
    for k in range(5):
        if k:
            time.sleep(0.05)
        with open(f"/proc/{pid}/status") as fh:
            status = fh.read()
        rss = int(re.search(r"^VmRSS:\s+(\d+)", status, re.MULTILINE).group(1))
        threads = int(re.search(r"^Threads:\s+(\d+)", status, re.MULTILINE).group(1))
        fds = netns = 0
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            fds += 1
            netns += target.startswith("net:[")
        fds_min = fds if fds_min is None else min(fds_min, fds)
        threads_min = threads if threads_min is None else min(threads_min, threads)
        netns_min = netns if netns_min is None else min(netns_min, netns)
    return {"rss_kb": rss, "threads": threads_min, "fds": fds_min, "netns_fds": netns_min}


def run_soak(setup: Setup, n: int, checkpoint: int) -> dict:
    """n ADD/DEL cycles of macvlan-rdma + lease-ipam sent straight to a fresh daemon's socket."""
    host = setup.host
    sock = os.path.join(host.tmp, "run-soak", "daemon.sock")
    d = host.daemon(sock, os.path.join(host.tmp, "daemon-soak.log"))
    mv = setup.by_key("mv-daemon")
    conf = dict(mv.conf, name=f"{PREFIX}-soak", ipam=dict(mv.conf["ipam"], dataDir=os.path.join(host.tmp, "data", "soak")))
    add_stdin = json.dumps(conf).encode()
    samples = [dict(cycle=0, **proc_sample(d.pid))]
    marks = {checkpoint, n} | {n * k // 10 for k in range(1, 10)}
    failures: list = []
    times = {"ADD": [], "DEL": []}
    t_start = time.monotonic()
    try:
        for i in range(1, n + 1):
            ns = host.netns("s")
            try:
                cid = f"{PREFIX}-soak-{i}"
                result = None
                for verb in ("ADD", "DEL"):
                    env = cni_env(verb, cid, ns, mv.cni_path)
                    stdin = add_stdin if verb == "ADD" else with_prev(conf, result)
                    environb = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
                    t0 = time.perf_counter()
                    try:  # what the shim sends, without the shim's exec
                        code, raw, _ = daemon_call(sock, "macvlan-rdma", environb, stdin, timeout=60)
                    except (NoDaemon, DaemonLost) as exc:
                        code, raw = -1, str(exc).encode()
                    times[verb].append(time.perf_counter() - t0)
                    out = raw.decode(errors="replace")
                    if code != 0:
                        failures.append({"cycle": i, "verb": verb, "stdout": out[-300:]})
                    elif verb == "ADD":
                        result = json.loads(out)
            finally:
                Host.del_netns(ns)
            if i in marks:
                samples.append(dict(cycle=i, **proc_sample(d.pid)))
                s = samples[-1]
                say(f"  soak {i}/{n}: RSS {s['rss_kb'] / 1024:.1f} MB, {s['fds']} fds, {s['threads']} threads, "
                    f"{s['netns_fds']} netns fds ({time.monotonic() - t_start:.0f} s)")
            if len(failures) > 50:
                say("  soak: more than 50 failed calls, stopping early")
                break
        alive = d.proc.poll() is None
    finally:
        d.stop(timeout=15)
    at = {s["cycle"]: s for s in samples}
    first, last = at.get(checkpoint), samples[-1]
    growth = {k: (last[k] - first[k]) if first else None for k in ("rss_kb", "fds", "threads", "netns_fds")}
    return {"cycles": samples[-1]["cycle"], "checkpoint": checkpoint, "samples": samples, "growth": growth,
            "failed": len(failures), "failure_samples": failures[:3], "daemon_alive": alive,
            "add_p50_ms": r2(pct(times["ADD"], 0.5)), "del_p50_ms": r2(pct(times["DEL"], 0.5)),
            "elapsed_s": round(time.monotonic() - t_start, 1)}


# --------------------------------------------------------------------------- import times


def parse_importtime(stderr: str) -> list[tuple[str, int, int]]:
    """[(module, self us, cumulative us)] from ``-X importtime`` lines."""
    rows = []
    for line in stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3 or not parts[0].strip().isdigit():
            continue  # the header line
        rows.append((parts[2].strip(), int(parts[0]), int(parts[1])))
    return rows


def import_summary(rows: list[tuple[str, int, int]], wall: float) -> dict:
    stdlib = sys.stdlib_module_names
    by_pkg: dict[str, int] = {}
    for mod, self_us, _ in rows:
        top = mod.split(".")[0]
        by_pkg[top] = by_pkg.get(top, 0) + self_us
    foreign = {p: us for p, us in by_pkg.items() if p not in stdlib}
    top = sorted(foreign.items(), key=lambda kv: -kv[1])
    return {
        "exec_ms": r2(wall * 1000), "modules": len(rows),
        "import_ms": r2(sum(r[1] for r in rows) / 1000),
        "stdlib_ms": r2(sum(us for p, us in by_pkg.items() if p in stdlib) / 1000),
        "non_stdlib": [{"package": p, "ms": r2(us / 1000)} for p, us in top],
        "heavy": [p for p in HEAVY if p in by_pkg],
    }


def shim_argv(path: str) -> list[str]:
    """The shim's interpreter and flags from its shebang, plus -X importtime, plus the file."""
    with open(path, encoding="utf-8") as fh:
        shebang = fh.readline()[2:].split()
    return [*shebang, "-X", "importtime", path]


def run_imports(setup: Setup) -> dict:
    """One real ADD (and an untimed DEL) of each exec path with ``-X importtime``."""
    out = {}
    mv_d, mv_x = setup.by_key("mv-daemon"), setup.by_key("mv-inproc")
    hd_x = setup.by_key("hd-inproc")
    cases = [
        ("shim (daemon answers): macvlan-rdma", mv_d, mv_d.argv[0], mv_d.conf, True),
        ("in-process: macvlan-rdma (+ lease-ipam, same process)", mv_x, mv_x.argv[0], mv_x.conf, True),
        ("in-process: host-device-rdma (+ lease-ipam, same process)", hd_x, hd_x.argv[0], hd_x.conf, True),
    ]
    for label, impl, binary, conf, needs_ns in cases:
        ns = setup.host.netns("i")
        cid = f"{PREFIX}-imp-{len(out)}"
        try:
            call = run_exec(shim_argv(binary), cni_env("ADD", cid, ns, impl.cni_path), json.dumps(conf).encode())
            summary = import_summary(parse_importtime(call.err), call.secs)
            summary["rc"] = call.rc
            if call.rc != 0:
                summary["error"] = call.out[-300:]
            result = None
            try:
                result = json.loads(call.out)
            except ValueError:
                pass
            run_exec([binary], cni_env("DEL", cid, ns, impl.cni_path), with_prev(conf, result))
        finally:
            Host.del_netns(ns)
        out[label] = summary
    return out


# --------------------------------------------------------------------------- verdicts and output


def verdicts(rows: list[dict], conc: Optional[dict], soak: Optional[dict], imports: Optional[dict]) -> list[dict]:
    out = []

    def add(target: str, value, limit, ok: Optional[bool], note: str = "") -> None:
        status = "SKIP" if ok is None else ("PASS" if ok else "MISS")
        out.append({"target": target, "value": value, "limit": limit, "status": status, "note": note})

    def row(impl: str, verb: str) -> Optional[dict]:
        return next((r for r in rows if r["impl"] == impl and r["verb"] == verb), None)

    for impl in ("mv-daemon", "hd-daemon"):
        for verb in ("ADD", "DEL"):
            r = row(impl, verb)
            if r is None:
                continue
            for q, limit in (("p50", TARGETS["daemon_p50"]), ("p95", TARGETS["daemon_p95"])):
                v = r[f"ratio_{q}"]
                add(f"{impl} {verb} {q} / Go reference", v, f"<= {limit}x", None if v is None else v <= limit)
    for impl in ("mv-inproc", "hd-inproc"):
        for verb in ("ADD", "DEL"):
            r = row(impl, verb)
            if r is None:
                continue
            v = r["ratio_p50"]
            add(f"{impl} {verb} p50 / Go reference", v, f"<= {TARGETS['inproc_add_p50']}x",
                None if v is None else v <= TARGETS["inproc_add_p50"])
    if soak:
        last = soak["samples"][-1]
        mb = round(last["rss_kb"] / 1024, 1)
        add(f"daemon RSS after {soak['cycles']} soak cycles (MB)", mb, f"< {TARGETS['rss_mb']}", mb < TARGETS["rss_mb"])
        g = soak["growth"]
        span = f"cycle {soak['checkpoint']} -> {soak['cycles']}"
        if g["rss_kb"] is not None:
            add(f"daemon RSS growth {span} (KB)", g["rss_kb"], f"<= {TARGETS['rss_growth_kb']}",
                g["rss_kb"] <= TARGETS["rss_growth_kb"])
            for k in ("fds", "threads", "netns_fds"):
                add(f"daemon {k} growth {span}", g[k], "0", g[k] <= 0, "" if g[k] <= 0 else "LEAK")
        add("soak calls failed", soak["failed"], "0", soak["failed"] == 0 and soak["daemon_alive"])
    if conc:
        n = conc["n"]
        add(f"{n} concurrent daemon ADDs: errors + duplicate addresses", conc["daemon_errors"] + conc["duplicates"], "0",
            conc["daemon_errors"] == 0 and conc["duplicates"] == 0)
        v = conc["ratio"]
        add(f"{n} concurrent daemon ADDs wall / {n} concurrent Go ADDs", v, f"<= {TARGETS['concurrent_wall']}x",
            None if v is None else v <= TARGETS["concurrent_wall"])
    if imports:
        shim = next((s for k, s in imports.items() if k.startswith("shim")), None)
        if shim is not None:
            names = [p["package"] for p in shim["non_stdlib"]]
            add("shim imports only the standard library", ", ".join(names) or "stdlib only", "stdlib only", not names)
        for label, s in imports.items():
            if label.startswith("in-process"):
                add(f"{label.split(':')[1].split('(')[0].strip()}: kubernetes not imported (local store)",
                    "imported" if "kubernetes" in s["heavy"] else "not imported", "not imported",
                    "kubernetes" not in s["heavy"])
    return out


def fmt(v, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in rows])


def report(doc: dict) -> str:
    out = []
    rows = []
    for r in doc["results"]:
        rows.append([r["impl"], r["verb"], str(r["n"]) + (f" ({r['failed']} failed)" if r["failed"] else ""),
                     fmt(r["p50_ms"]), fmt(r["p95_ms"]), fmt(r["max_ms"]), fmt(r["ratio_p50"], ".2f"),
                     fmt(r["ratio_p95"], ".2f"), fmt(r["daemon_p50_ms"])])
    out.append(table(["implementation", "verb", "n", "p50 ms", "p95 ms", "max ms", "p50 ×ref", "p95 ×ref",
                      "in daemon p50 ms"], rows))
    out.append("")
    out.append("implementations: " + "; ".join(f"{i['key']} = {i['label']}" for i in doc["meta"]["impls"]))
    c = doc.get("concurrency")
    if c:
        out.append("")
        k = len(c["rounds"])
        out.append(f"concurrency ({k} round{'s' if k > 1 else ''}, medians): {c['n']} concurrent ADDs through the "
                   f"daemon shim {fmt(c['daemon_wall_s'], '.2f')} s vs {c['n']} concurrent Go ADDs "
                   f"{fmt(c['go_wall_s'], '.2f')} s, ratio {fmt(c['ratio'], '.2f')} (rounds: "
                   + ", ".join(fmt(x["ratio"], ".2f") for x in c["rounds"]) + f"); {c['daemon_errors']} errors, "
                   f"{c['duplicates']} duplicate addresses; per-call p50 {fmt(c['daemon_p50_ms'])} ms, max "
                   f"{fmt(c['daemon_max_ms'])} ms; CPU used during a batch: daemon {c['daemon_cpu_s']:.2f} s, shim "
                   f"processes {c['shims_cpu_s']:.2f} s; concurrent DEL of all {c['daemon_del_wall_s']:.2f} s "
                   f"({c['daemon_del_errors']} errors)")
    md = doc["meta"].get("main_daemon_after_cycles")
    if md:
        out.append("")
        out.append(f"the daemon of the cycles, after them and the concurrency rounds: RSS {md['rss_kb'] / 1024:.1f} MB, "
                   f"{md['fds']} fds, {md['threads']} threads, {md['netns_fds']} netns fds")
    s = doc.get("soak")
    if s:
        out.append("")
        out.append(f"daemon soak: {s['cycles']} ADD/DEL cycles over the socket in {s['elapsed_s']} s "
                   f"(ADD p50 {fmt(s['add_p50_ms'])} ms, DEL p50 {fmt(s['del_p50_ms'])} ms, {s['failed']} failed)")
        out.append(table(["cycle", "RSS MB", "fds", "threads", "netns fds"],
                         [[str(x["cycle"]), f"{x['rss_kb'] / 1024:.1f}", str(x["fds"]), str(x["threads"]),
                           str(x["netns_fds"])] for x in s["samples"]]))
    imp = doc.get("imports")
    if imp:
        out.append("")
        out.append("import times (-X importtime, one real ADD through the shim file):")
        rows = []
        for label, x in imp.items():
            top = ", ".join(f"{p['package']} {p['ms']:.0f}" for p in x["non_stdlib"][:6]) or "none"
            rows.append([label, fmt(x["exec_ms"]), fmt(x["import_ms"]), fmt(x["stdlib_ms"]), str(x["modules"]), top])
        out.append(table(["exec", "exec ms", "imports ms", "of which stdlib ms", "modules",
                          "non-stdlib packages, ms (self time summed per package)"], rows))
    out.append("")
    out.append("verdicts:")
    for v in doc["verdicts"]:
        note = f"  [{v['note']}]" if v["note"] else ""
        out.append(f"  {v['status']:4}  {v['target']}: {v['value']} (target {v['limit']}){note}")
    m = doc["meta"]
    out.append("")
    out.append(f"{m['date']}, commit {m['commit']}; {m['cycles']} cycles (+{m['warmup']} warm-up); "
               f"{m['cpus']} CPUs; Python {m['python']}; kernel {m['kernel']}; total {m['elapsed_s']} s")
    return "\n".join(out)


def git_commit() -> str:
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty else "")


# --------------------------------------------------------------------------- main


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=None, help="counted ADD/CHECK/DEL cycles per implementation "
                    "(default 200, --quick 3)")
    ap.add_argument("--warmup", type=int, default=None, help="uncounted cycles first (default 3, --quick 1)")
    ap.add_argument("--soak", type=int, default=None, help="daemon soak ADD/DEL cycles (default 10000, --quick 40; 0 skips)")
    ap.add_argument("--concurrency", type=int, default=None, help="concurrent daemon ADDs (default 100, --quick 8; 0 skips)")
    ap.add_argument("--rounds", type=int, default=None, help="concurrency rounds (default 3, --quick 1); the median is reported")
    ap.add_argument("--quick", action="store_true", help="tiny counts: a smoke run of every phase in seconds")
    ap.add_argument("--no-imports", action="store_true", help="skip the -X importtime breakdown")
    ap.add_argument("--json", action="store_true", help="print the results as JSON (progress on stderr)")
    ap.add_argument("--save", metavar="FILE", help="also write the JSON results to FILE")
    args = ap.parse_args(argv)
    cycles = args.cycles if args.cycles is not None else (3 if args.quick else 200)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    soak_n = args.soak if args.soak is not None else (40 if args.quick else 10000)
    conc_n = args.concurrency if args.concurrency is not None else (8 if args.quick else 100)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)

    if os.geteuid() != 0:
        say("plugin_bench needs root (network namespaces, veth pairs)")
        return 2
    go = all(os.access(f"{GO_DIR}/{p}", os.X_OK) for p in ("macvlan", "host-local", "host-device"))
    if not go:
        say(f"Go reference plugins not found in {GO_DIR} (apt install containernetworking-plugins): "
            "the reference rows, ratios and ratio targets are skipped")

    host = Host()
    atexit.register(host.cleanup)

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGHUP, on_term)
    t_begin = time.monotonic()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = git_commit()  # at the start: the tree may change while a long run goes on
    try:
        say(f"setting up ({PREFIX}*: veth pairs, shims, daemon) ...")
        setup = Setup(host, go)
        imports = None
        if not args.no_imports:
            say("import-time breakdown ...")
            imports = run_imports(setup)
        say(f"{cycles} cycles (+{warmup} warm-up) of ADD/CHECK/DEL over {len(setup.impls)} implementations ...")
        run_cycles(setup, cycles, warmup)
        conc = None
        if conc_n > 0:
            say(f"{conc_n} concurrent ADDs through the daemon vs {conc_n} concurrent Go ADDs, {rounds} rounds ...")
            conc = run_concurrency(setup, conc_n, rounds)
        main_daemon = proc_sample(setup.daemon.pid)
        setup.daemon.stop(timeout=15)
        soak = None
        if soak_n > 0:
            checkpoint = 1000 if soak_n >= 2000 else max(1, soak_n // 2)
            say(f"daemon soak: {soak_n} ADD/DEL cycles (checkpoint at {checkpoint}) ...")
            soak = run_soak(setup, soak_n, checkpoint)
        rows = rows_of(setup)
        failures = {i.key: i.failures[:3] for i in setup.impls if i.failures}
        doc = {
            "meta": {"date": started, "commit": commit, "prefix": PREFIX, "cycles": cycles, "warmup": warmup, "cni_version": CNI_VERSION,
                     "go_reference": go, "cpus": os.cpu_count(), "python": platform.python_version(),
                     "kernel": platform.release(), "elapsed_s": round(time.monotonic() - t_begin, 1),
                     "impls": [{"key": i.key, "label": i.label, "ref": i.ref} for i in setup.impls],
                     "main_daemon_after_cycles": main_daemon},
            "results": rows, "concurrency": conc, "soak": soak, "imports": imports,
            "verdicts": verdicts(rows, conc, soak, imports),
            "failures": failures,
        }
        if args.save:
            with open(args.save, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=2)
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            print(report(doc))
            for key, fs in failures.items():
                for f in fs:
                    print(f"FAILED {key} {f['verb']} (exit {f['rc']}): {f['why'] or f['stdout'] or f['stderr']}")
        failed = (sum(len(i.failures) for i in setup.impls) + (soak["failed"] if soak else 0)
                  + ((conc["daemon_errors"] + conc["daemon_del_errors"] + (conc["go_errors"] or 0)) if conc else 0)
                  + sum(1 for x in (imports or {}).values() if x["rc"] != 0))
        return 1 if failed else 0
    except KeyboardInterrupt:
        say("interrupted: removing this run's namespaces, links, daemons and temporary files")
        return 130
    finally:
        host.cleanup()


if __name__ == "__main__":
    sys.exit(main())
