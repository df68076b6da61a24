"""lease-ipam benchmark: API calls per ADD/DEL and allocations per second, Kubernetes vs local store.

    .venv/bin/python bench/ipam_kube_bench.py [--range 10.77.0.0/22] [--quick] [--json] [--no-watch-cache]

Starts the fake kube-apiserver of ``tests/kube_api_server.py`` in this process (real HTTP on
127.0.0.1) and 8 worker processes, one per node (``RDMANET_NODE_NAME=bench-node-<i>``). Each
worker imports the plugin once and runs ``skel.handle(LeaseIPAM(), env, stdin)`` per call, the code
path of ``python -m rdmanet.ipam`` without the interpreter start. For each pool fill level (empty, 50 %,
95 %) the pool is pre-filled with claims made through the store itself, then for 1 node (worker 0
alone) and 8 nodes (all workers, released together at one wall-clock instant) a batch of ADDs that
fits in the free space is measured, then the same attachments are DELed. The same workloads run
against the local file store (``dataDir`` in a temporary directory) for comparison, and (rows
``kube+cache``) against the Lease store with the daemon's watch cache on in every worker
(``use_watch_cache(True)``, as ``rdmanet daemon`` does): each worker's informer is started and
synced by a warm-up ADD/DEL before the batch and stopped after the row.

Server counts are reset before each ADD phase and each DEL phase; 409s are the create requests the
server answered 409 (from its request log). Run as ``... --worker <node>`` the file is the worker.
See bench/README.md for the columns.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

NETWORK = "bench"
NAMESPACE = "bench"
NODES = 8
FILLS = (0.0, 0.5, 0.95)


def cni_env(command: str, cid: str, node: str) -> dict:
    return {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
            "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node,
            "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid};K8S_POD_UID=uid-{cid}"}


# -- worker (one node) ----------------------------------------------------------------------------

def worker(node: str, confs: dict[str, str]) -> None:
    from rdmanet.cni.core import skel
    from rdmanet.ipam.kube_config import connect, kube_settings
    from rdmanet.ipam.plugin import LeaseIPAM, parse_ipam_config

    stdin = {}
    for name, path in confs.items():
        with open(path, "rb") as f:
            stdin[name] = f.read()
    for raw in stdin.values():
        doc = json.loads(raw)
        parse_ipam_config(doc)  # imports pydantic and the config models
        settings = kube_settings(doc)
        if settings is not None:
            connect(settings)  # imports the kubernetes client, reads the kubeconfig
    plugin = LeaseIPAM()
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "cache":  # the daemon's Lease watch cache on or off in this worker
            from rdmanet.ipam.store import lease_cache
            from rdmanet.ipam.store.kube import use_watch_cache

            stats: dict[str, int] = {}
            for inf in lease_cache.informers():
                for k, v in inf.stats.items():
                    stats[k] = stats.get(k, 0) + v
            use_watch_cache(cmd["on"])
            print(json.dumps({"stats": stats}), flush=True)
            continue
        conf = stdin[cmd["store"]]
        delay = cmd["start_at"] - time.time()
        if delay > 0:
            time.sleep(delay)
        t_start = time.time()
        rows = []
        for cid in cmd["cids"]:
            t0 = time.perf_counter()
            code, out = skel.handle(plugin, cni_env(cmd["verb"], cid, node), conf)
            dt = time.perf_counter() - t0
            if code == 0:
                rows.append([cid, 0, out["ips"][0]["address"] if out else None, dt])
            else:
                rows.append([cid, out.get("code"), out.get("msg"), dt])
        print(json.dumps({"t_start": t_start, "t_end": time.time(), "rows": rows}), flush=True)


# -- driver ---------------------------------------------------------------------------------------

class Workers:
    def __init__(self, n: int, confs: dict[str, str]) -> None:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("RDMANET_LOG_LEVEL", None)
        self.nodes = [f"bench-node-{i}" for i in range(n)]
        self.procs = []
        for node in self.nodes:
            args = [sys.executable, os.path.abspath(__file__), "--worker", node]
            for name, path in confs.items():
                args += ["--conf", f"{name}={path}"]
            self.procs.append(subprocess.Popen(args, cwd=ROOT, env=dict(env, RDMANET_NODE_NAME=node),
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for p in self.procs:
            line = p.stdout.readline().strip()
            if line != "ready":
                raise SystemExit(f"worker failed to start (said {line!r})")

    def run(self, store: str, verb: str, cids_per_node: list[list[str]]) -> tuple[float, list[list]]:
        """Run the calls on the first len(cids_per_node) workers, started together; (wall seconds, rows)."""
        start_at = time.time() + 0.15
        used = self.procs[:len(cids_per_node)]
        for p, cids in zip(used, cids_per_node):
            p.stdin.write(json.dumps({"op": "call", "store": store, "verb": verb, "cids": cids,
                                      "start_at": start_at}) + "\n")
            p.stdin.flush()
        answers = [json.loads(p.stdout.readline()) for p in used]
        wall = max(a["t_end"] for a in answers) - start_at
        return wall, [row for a in answers for row in a["rows"]]

    def cache(self, on: bool) -> dict[str, int]:
        """Turn every worker's watch cache on or off; the informers' summed stats (when turning off)."""
        for p in self.procs:
            p.stdin.write(json.dumps({"op": "cache", "on": on}) + "\n")
            p.stdin.flush()
        total: dict[str, int] = {}
        for p in self.procs:
            for k, v in json.loads(p.stdout.readline())["stats"].items():
                total[k] = total.get(k, 0) + v
        return total

    def close(self) -> None:
        for p in self.procs:
            try:
                p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


class Prefill:
    """Claims made through the stores themselves: for the Lease store by one node of its own
    (``bench-prefill``, its claims in its own blocks as any node's are, its watch cache on so that
    an ADD costs one create), for the local store spread over the pool in a fixed random order."""

    def __init__(self, kube_conf: dict, local_conf: dict) -> None:
        from rdmanet.ipam.config import parse_ipam_config
        from rdmanet.ipam.kube_config import connect, kube_settings
        from rdmanet.ipam.location import store_location
        from rdmanet.ipam.store.kube import ApiClientTransport, KubeStore, cache_source, use_watch_cache
        from rdmanet.ipam.store.local import LocalStore

        config = parse_ipam_config(kube_conf)
        self.rs = config.range_sets[0]
        settings = kube_settings(kube_conf)
        conn = connect(settings)
        domain = store_location(kube_conf)[1]
        use_watch_cache(True)  # this process's own informer for the pre-fill node; the workers are processes of their own
        self.kube = KubeStore(ApiClientTransport(conn.api_client, conn.host), conn.namespace, domain,
                              node="bench-prefill", timeout=settings.timeout,
                              cache=cache_source(settings, conn, domain, "bench-prefill"))
        self.local = LocalStore(*store_location(local_conf))
        free = []
        for r in self.rs.ranges:
            blocked = r.blocked
            free += [v for v in range(r.start, r.end + 1) if not any(lo <= v <= hi for lo, hi in blocked)]
        random.Random(1).shuffle(free)
        self.order = [self.rs.ranges[0].address(v) for v in free]
        self.total = len(free)
        self.done = {"kube": 0, "local": 0}

    def to(self, store: str, count: int) -> float:
        """Grow ``store``'s pre-fill to ``count`` claims; returns the seconds it took."""
        from rdmanet.ipam.store.base import Attachment

        t0 = time.perf_counter()
        for i in range(self.done[store], count):
            att = Attachment(f"prefill-{i:05d}", "net1")
            if store == "kube":
                if not self.kube.allocate(att, NETWORK, [self.rs], {}):
                    raise SystemExit(f"pre-fill: no address for claim {i}")
            else:
                self.local.allocate(att, NETWORK, [self.rs], {self.rs.index: self.order[i]})
        self.done[store] = max(self.done[store], count)
        return time.perf_counter() - t0


def pct_ms(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank) in milliseconds; None for no values."""
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))] * 1000, 2)


def per_call(counts: dict, n: int) -> dict[str, float]:
    if not n:
        return {}
    return {verb: round(c / n, 3) for (verb, resource), c in sorted(counts.items()) if resource == "leases"}


def scenario(server, workers: Workers, store: str, nodes: int, fill: float, prefilled: int, total: int,
             batch: int) -> dict:
    tag = f"{store.replace('+', '-')}-{nodes}n-{int(fill * 100)}"  # a valid container ID
    per = batch // nodes
    cids = [[f"{tag}-{n}-{i:03d}" for i in range(per)] for n in range(nodes)]

    server.reset_counts()
    add_wall, adds = workers.run(store, "ADD", cids)
    add_counts, add_log = server.counts(), server.request_log()
    ok = [r for r in adds if r[1] == 0]
    got = [r[2] for r in ok]
    if len(set(got)) != len(got):
        raise SystemExit(f"{tag}: an address was handed out twice")
    failed = [r for r in adds if r[1] != 0]
    mine = {r[0] for r in ok}
    del_cids = [[c for c in node_cids if c in mine] for node_cids in cids]

    server.reset_counts()
    del_wall, dels = workers.run(store, "DEL", del_cids)
    del_counts = server.counts()
    del_failed = [r for r in dels if r[1] != 0]

    lat = [r[3] for r in adds]
    kube = store.startswith("kube")
    conflicts = sum(1 for e in add_log if e.get("verb") == "create" and e.get("status") == 409)
    return {
        "store": store, "nodes": nodes, "fill": fill, "prefilled": prefilled, "pool": total,
        "adds": len(adds), "add_ok": len(ok), "add_failed": len(failed),
        "add_errors": sorted({f"{r[1]}: {r[2]}" for r in failed})[:3],
        "add_wall_s": round(add_wall, 4), "allocs_per_s": round(len(ok) / add_wall, 1) if add_wall > 0 else None,
        "add_p50_ms": pct_ms(lat, 0.50), "add_p95_ms": pct_ms(lat, 0.95), "add_max_ms": pct_ms(lat, 1.0),
        "api_per_add": per_call(add_counts, len(adds)) if kube else None,
        "conflicts_per_add": round(conflicts / len(adds), 3) if kube and adds else None,
        "dels": len(dels), "del_failed": len(del_failed), "del_wall_s": round(del_wall, 4),
        "dels_per_s": round(len(dels) / del_wall, 1) if del_wall > 0 else None,
        "del_p50_ms": pct_ms([r[3] for r in dels], 0.50),
        "api_per_del": per_call(del_counts, len(dels)) if kube else None,
    }


def calls_text(calls: dict | None) -> str:
    if calls is None:
        return "n/a"
    return " ".join(f"{v:g} {k}" for k, v in calls.items()) or "0"


def table(results: list[dict]) -> str:
    head = ["store", "nodes", "fill", "ADDs", "alloc/s", "p50 ms", "p95 ms", "max ms", "API per ADD",
            "409/ADD", "API per DEL", "DEL/s"]
    rows = []
    for r in results:
        adds = f"{r['add_ok']}" + (f" ({r['add_failed']} failed)" if r["add_failed"] else "")
        rows.append([r["store"], str(r["nodes"]), f"{r['fill'] * 100:.0f} % ({r['prefilled']}/{r['pool']})", adds,
                     f"{r['allocs_per_s']:.0f}", f"{r['add_p50_ms']:.1f}", f"{r['add_p95_ms']:.1f}",
                     f"{r['add_max_ms']:.1f}", calls_text(r["api_per_add"]),
                     "n/a" if r["conflicts_per_add"] is None else f"{r['conflicts_per_add']:.2f}",
                     calls_text(r["api_per_del"]), f"{r['dels_per_s']:.0f}"])
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(row) for row in rows]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--range", default="10.77.0.0/22", help="pool CIDR (default 10.77.0.0/22)")
    ap.add_argument("--quick", action="store_true", help="smaller batches (about 15 s)")
    ap.add_argument("--adds", type=int, default=None, help="ADDs per scenario (default 160, --quick 24); "
                    "capped at 90 %% of the free addresses, rounded down to a multiple of the node count")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    ap.add_argument("--no-watch-cache", action="store_true", help="leave out the kube+cache rows")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--conf", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        worker(args.worker, dict(c.split("=", 1) for c in args.conf))
        return 0

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from kube_api_server import KubeAPIServer, write_kubeconfig

    net = ipaddress.ip_network(args.range, strict=False)
    want = args.adds or (24 if args.quick else 160)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    t_begin = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix="ipam-bench-")
    policy = os.path.join(tmp, "node-policy.json")  # the node policy (rdmanet.cni.linux.roots): stores, kubeconfig in tmp
    with open(policy, "w") as f:
        json.dump({"dataRoots": [tmp], "kubeconfigs": [f"{tmp}/*"], "leaseNamespaces": [NAMESPACE]}, f)
    os.chmod(policy, 0o600)
    os.environ["RDMANET_NODE_POLICY"] = policy  # the workers inherit it, as plugins their runtime's
    server = KubeAPIServer()
    server.add_namespace(NAMESPACE)
    workers = None
    try:
        kc = write_kubeconfig(os.path.join(tmp, "kubeconfig"), server.url, namespace=NAMESPACE)
        ipam = {"type": "lease-ipam", "range": str(net)}
        kube_conf = {"cniVersion": "1.1.0", "name": NETWORK, "type": "macvlan",
                     "ipam": dict(ipam, kubernetes={"kubeconfig": str(kc), "namespace": NAMESPACE})}
        # the calls carry K8S_POD_UID (a Kubernetes pod): the local store must be chosen explicitly
        local_conf = {"cniVersion": "1.1.0", "name": NETWORK, "type": "macvlan",
                      "ipam": dict(ipam, datastore="local", dataDir=os.path.join(tmp, "local"))}
        confs = {}
        for name, conf in (("kube", kube_conf), ("local", local_conf)):
            confs[name] = os.path.join(tmp, f"{name}.json")
            with open(confs[name], "w") as f:
                json.dump(conf, f)
        confs["kube+cache"] = confs["kube"]  # the same network: only the worker's cache differs
        stores = ("kube", "local") if args.no_watch_cache else ("kube", "local", "kube+cache")

        prefill = Prefill(kube_conf, local_conf)
        say(f"pool {net}: {prefill.total} allocatable addresses; starting {NODES} worker processes ...")
        workers = Workers(NODES, confs)
        for store in ("kube", "local"):  # warm each worker's HTTP connection and store code paths
            workers.run(store, "ADD", [[f"warm-{n}"] for n in range(NODES)])
            workers.run(store, "DEL", [[f"warm-{n}"] for n in range(NODES)])

        results = []
        for fill in FILLS:
            target = int(prefill.total * fill)
            for store in ("kube", "local"):
                secs = prefill.to(store, target)
                if secs > 0.05:
                    say(f"pre-filled {store} store to {target}/{prefill.total} in {secs:.1f} s")
            free = prefill.total - target
            for nodes in (1, NODES):
                batch = min(want, int(free * 0.9)) // NODES * NODES
                if batch < NODES:
                    say(f"skipping fill {fill:.0%}: {free} free addresses are too few for {NODES} nodes")
                    continue
                for store in stores:
                    cached = store == "kube+cache"
                    if cached:  # start and sync every worker's informer outside the measurement
                        workers.cache(True)
                        workers.run(store, "ADD", [[f"warm-cache-{n}"] for n in range(NODES)])
                        workers.run(store, "DEL", [[f"warm-cache-{n}"] for n in range(NODES)])
                    r = scenario(server, workers, store, nodes, fill, target, prefill.total, batch)
                    if cached:
                        r["cache_stats"] = workers.cache(False)
                    results.append(r)
                    say(f"  {store:10} {nodes} node(s) fill {fill:4.0%}: {r['add_ok']} ADDs at "
                        f"{r['allocs_per_s']:.0f}/s, p50 {r['add_p50_ms']:.1f} ms")
        elapsed = time.perf_counter() - t_begin
        meta = {"range": str(net), "pool": prefill.total, "nodes": NODES, "batch_max": want, "quick": args.quick,
                "python": platform.python_version(), "cpus": os.cpu_count(), "elapsed_s": round(elapsed, 1)}
        if args.json:
            print(json.dumps({"meta": meta, "results": results}, indent=2))
        else:
            print()
            print(table(results))
            print(f"\n{prefill.total}-address pool {net}; {os.cpu_count()} CPUs; Python {meta['python']}; "
                  f"total {elapsed:.1f} s (pre-fill and process start included)")
        return 1 if any(r["add_failed"] or r["del_failed"] for r in results) else 0
    finally:
        if workers is not None:
            workers.close()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
