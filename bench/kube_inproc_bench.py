"""CPU per call of lease-ipam's Kubernetes Lease store in-process (no daemon), as a runtime execs it.

    .venv/bin/python bench/kube_inproc_bench.py [--calls N] [--json]

The lease-ipam shim of install.sh (written by rdmanet.node.launcher.write_shim) is exec'd with its daemon
socket pointing nowhere, so every call runs the plugin in its own process: interpreter start,
imports, kubeconfig, one TLS connection, the API requests (ADD: List + create; DEL: List +
delete). The API server is tests/kube_api_server.py in this process, serving HTTPS with a
certificate openssl makes for the run (plain HTTP when openssl is missing) and requiring a bearer
token, the credentials a node's kubeconfig carries. CPU is the child's user + system time
(``getrusage(RUSAGE_CHILDREN)`` around each call; the server's threads are not children), so it is
the plugin's own cost whatever else the machine runs. Reference rows: the interpreter start
(``python -IS -c pass``), the same ADD/DEL with the local file store, and the import of the
``kubernetes`` client, which every in-process call of the Kubernetes store pays. The figures
are ratios in one run: the Kubernetes store's CPU per verb over the local store's (what talking
to the API server adds), printed, never asserted. No root needed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from kube_api_server import KubeAPIServer  # noqa: E402
from rdmanet.node.launcher import write_shim  # noqa: E402
from rdmanet.node.testing import plain_site_dir  # noqa: E402

NS = "bench"
TOKEN = "bench-token"


def timed(argv: list[str], env: dict, stdin: bytes) -> tuple[int, bytes, float, float]:
    """(exit code, stdout, CPU ms of the child, wall ms)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, input=stdin, env=env, capture_output=True, timeout=120, check=False)
    wall = (time.perf_counter() - t0) * 1000
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000
    return proc.returncode, proc.stdout, cpu, wall


def pct(values: list[float], q: float):
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))], 1)


def make_pki(d: str) -> tuple[str, str, str] | None:
    """(ca.crt, server.crt, server.key) for 127.0.0.1, or None without openssl."""
    if shutil.which("openssl") is None:
        return None
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=bench-ca")
    with open(os.path.join(d, "server.ext"), "w") as fh:
        fh.write("subjectAltName=IP:127.0.0.1\n")
    run("req", "-new", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=kube-apiserver")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
        "server.crt", "-days", "2", "-extfile", "server.ext")
    return tuple(os.path.join(d, n) for n in ("ca.crt", "server.crt", "server.key"))  # type: ignore[return-value]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=40, help="ADD+DEL pairs per store (default 40)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="rdmanet-kube-inproc-")
    try:
        return run(tmp, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(tmp: str, args) -> int:
    policy = os.path.join(tmp, "node-policy.json")
    with open(policy, "w") as fh:
        json.dump({"dataRoots": [tmp], "logRoots": [tmp], "kubeconfigs": [f"{tmp}/*"]}, fh)
    os.chmod(policy, 0o600)
    pki = make_pki(tmp)
    server = KubeAPIServer(token=TOKEN, tls=pki[1:] if pki else None)
    server.add_namespace(NS)
    try:
        cluster = {"server": server.url}
        if pki:
            cluster["certificate-authority"] = pki[0]
        kubeconfig = os.path.join(tmp, "lease-ipam.kubeconfig")
        with open(kubeconfig, "w") as fh:  # JSON, as install.sh's DaemonSet mode writes it
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                       "clusters": [{"name": "c", "cluster": cluster}], "users": [{"name": "u", "user": {"token": TOKEN}}],
                       "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": NS}}]}, fh)
        os.chmod(kubeconfig, 0o600)
        shim = os.path.join(tmp, "lease-ipam")
        write_shim(shim, "lease-ipam", sys.executable, plain_site_dir(os.path.join(tmp, "site")),  # as install.sh's venv
                   os.path.join(tmp, "nowhere.sock"))
        confs = {
            "kube": {"cniVersion": "1.0.0", "name": "bench-kube", "type": "macvlan",
                     "ipam": {"type": "lease-ipam", "range": "10.99.0.0/22", "kubernetes": {"kubeconfig": kubeconfig}}},
            "local": {"cniVersion": "1.0.0", "name": "bench-local", "type": "macvlan",
                      "ipam": {"type": "lease-ipam", "range": "10.98.0.0/22", "datastore": "local",
                               "dataDir": os.path.join(tmp, "data")}},
        }
        base_env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "RDMANET_NODE_POLICY": policy, "CNI_NETNS": "/run/netns/x",
                    "CNI_IFNAME": "net1", "CNI_PATH": tmp, "RDMANET_NODE_NAME": "bench-node"}
        rows: list[dict] = []
        failures: list[str] = []
        floor = [timed([sys.executable, "-IS", "-c", "pass"], base_env, b"")[2] for _ in range(args.calls)]
        rows.append({"row": "python -IS -c pass", "verb": "exec", "n": len(floor), "cpu_p50_ms": pct(floor, .5),
                     "cpu_p95_ms": pct(floor, .95), "wall_p50_ms": None})
        for store, conf in confs.items():
            stdin = json.dumps(conf).encode()
            cpu: dict[str, list[float]] = {"ADD": [], "DEL": []}
            wall: dict[str, list[float]] = {"ADD": [], "DEL": []}
            for i in range(args.calls + 1):  # the first pair warms the page cache, not counted
                for verb in ("ADD", "DEL"):
                    env = dict(base_env, CNI_COMMAND=verb, CNI_CONTAINERID=f"c{i}",
                               CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={NS};K8S_POD_NAME=p{i};K8S_POD_UID=u{i}")
                    code, out, c, w = timed([shim], env, stdin)
                    if code != 0:
                        failures.append(f"{store} {verb} exit {code}: {out[-300:].decode(errors='replace')}")
                    elif i > 0:
                        cpu[verb].append(c)
                        wall[verb].append(w)
            for verb in ("ADD", "DEL"):
                rows.append({"row": f"lease-ipam shim in-process, {store} store", "verb": verb, "n": len(cpu[verb]),
                             "cpu_p50_ms": pct(cpu[verb], .5), "cpu_p95_ms": pct(cpu[verb], .95),
                             "wall_p50_ms": pct(wall[verb], .5)})
        site = sysconfig.get_path("purelib")
        kimp = [timed([sys.executable, "-IS", "-c", f"import site; site.addsitedir({site!r}); "
                       "import kubernetes.client, kubernetes.config"], base_env, b"")[2] for _ in range(5)]
        rows.append({"row": "import kubernetes.client + config (part of every in-process kube store call)", "verb": "exec",
                     "n": len(kimp), "cpu_p50_ms": pct(kimp, .5), "cpu_p95_ms": pct(kimp, .95), "wall_p50_ms": None})
        counts = {f"{v} {r}": n for (v, r), n in server.counts().items()}
    finally:
        server.stop()
    ratios = []
    for verb in ("ADD", "DEL"):
        kube, local = (next(x["cpu_p50_ms"] for x in rows if x["row"].endswith(f"{store} store") and x["verb"] == verb)
                       for store in ("kube", "local"))
        ratios.append({"ratio": f"in-process {verb} CPU p50, Kubernetes store / local store",
                       "value": round(kube / local, 2) if kube and local else None})
    doc = {"rows": rows, "ratios": ratios, "api_requests": counts, "tls": pki is not None, "failures": failures,
           "python": sys.version.split()[0], "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        head = ["what", "verb", "n", "CPU p50 ms", "CPU p95 ms", "wall p50 ms"]
        cells = [[r["row"], r["verb"], str(r["n"]), *("-" if r[k] is None else f"{r[k]:.1f}"
                                                       for k in ("cpu_p50_ms", "cpu_p95_ms", "wall_p50_ms"))] for r in rows]
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(head)]
        print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |")
        print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
        for c in cells:
            print("| " + " | ".join(x.ljust(w) for x, w in zip(c, widths)) + " |")
        print(f"\nAPI server: {'HTTPS (CA file), ' if pki else 'plain HTTP (no openssl), '}bearer token; requests: "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print("\nratios:")
        for r in ratios:
            print(f"  {r['ratio']}: {r['value']}")
        for f in failures[:5]:
            print("FAILED", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
