"""A real kube-apiserver + etcd on loopback for the tests, and the fake server's test controls on it.

:class:`KubeCluster` builds (once, cached: ``scripts/build-kube-apiserver.sh``) and runs Debian's
etcd and a kube-apiserver built from Debian's ``kubernetes`` source package: free loopback ports,
a temporary directory, its own CA, RBAC on, an audit log (a ``RequestReceived`` event per request,
so tests count requests per user, and a ``ResponseComplete`` one with its status), an admin client-certificate kubeconfig, and
ServiceAccount tokens minted through the TokenRequest API. There is no controller-manager, no
scheduler and no kubelet: pods are API objects only (created with ``spec.nodeName``, deleted
with grace period 0), the ``ServiceAccount`` admission plugin is off (no controller makes the
``default`` ServiceAccounts it waits for) and ``--endpoint-reconciler-type=none``.

:class:`RealServer` gives a test the same controls as ``kube_api_server.KubeAPIServer`` (``url``,
``counts``, ``request_log``, ``objects``, ``add_pod``, ``fail_next``, ``pause_watches`` …) on
the real server: the tests' plain-HTTP kubeconfigs point at a :class:`FaultProxy` that forwards
to the server over TLS as the admin user and injects the fake's faults on the way (its
``Authorization`` header is dropped: a test that needs a real identity talks to the server
directly with :meth:`KubeCluster.kubeconfig`). Counts come from the server's audit log, plus the
requests the proxy answered itself (an injected fault), as the fake counts them.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import http.client
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes
import yaml

from kube_api_server import _ROUTES, NAMESPACES, RESOURCES, ApiError, FaultControls, _fault_error, _Handler

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "scripts" / "build-kube-apiserver.sh"
PR_SET_PDEATHSIG = 1  # prctl(2)
CONTROL_AGENT = "rdmanet-test-control"  # the fixture's own requests: left out of counts()
ADMIN = "rdmanet-test-admin"


def free_port() -> int:
    """A free loopback port below the ephemeral range: no outgoing connection of this machine's
    takes it while kube-apiserver restarts on it."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def build() -> Path:
    """The directory holding ``kube-apiserver`` and ``kubectl`` (built once, then cached)."""
    out = subprocess.run([str(BUILD)], check=True, stdout=subprocess.PIPE, text=True, timeout=1800)
    return Path(out.stdout.strip().splitlines()[-1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(d: Path) -> None:
    """A CA, the server's certificate (127.0.0.1), the admin's client certificate
    (``system:masters``) and the ServiceAccount signing key, all P-256."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=rdmanet-test-ca", cwd=d)
    for name, subj, ext in (
            ("server", "/CN=kube-apiserver", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                             "extendedKeyUsage=serverAuth\n"),
            ("admin", f"/O=system:masters/CN={ADMIN}", "extendedKeyUsage=clientAuth\n")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subj, cwd=d)
        (d / f"{name}.ext").write_text(ext)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=d)
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "omitStages": ["ResponseStarted", "Panic"],
    "rules": [{"level": "Metadata"}],
}


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the thread that forked it dies (PR_SET_PDEATHSIG)."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        os._exit(127)


class KubeCluster:
    """etcd + kube-apiserver, started by :meth:`start`, always stopped (and its directory removed)
    by :meth:`stop`, also when starting failed."""

    def __init__(self, bindir: Path | None = None):
        self.bindir = bindir or build()
        self.dir = Path(tempfile.mkdtemp(prefix="rdmanet-kube-"))
        self.procs: list[subprocess.Popen] = []
        self.url = ""
        self.admin_kubeconfig = self.dir / "admin.kubeconfig"
        self.audit_log = self.dir / "audit.log"
        self._marks = 0
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kube-cluster-spawner")
        atexit.register(self.stop)  # also when the test process exits without the fixture's teardown

    # -- processes -----------------------------------------------------------------------------

    def start(self) -> KubeCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        """Start ``argv`` from the cluster's one spawning thread, with SIGKILL as its parent-death
        signal: a test process killed outright (SIGKILL, a CI timeout) leaves no etcd or
        kube-apiserver behind. The signal follows the thread that forked, so every start, also a
        restart a test thread asks for, comes from that thread, which lives until :meth:`stop`."""
        log = open(self.dir / f"{name}.log", "wb")
        try:
            p = self._spawner.submit(subprocess.Popen, argv, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent).result()
        finally:
            log.close()
        self.procs.append(p)
        return p

    def _start(self) -> None:
        d = self.dir
        _certificates(d)
        (d / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        client, peer, port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            shutil.which("etcd") or "/usr/bin/etcd", "--name", "rdmanet-test", "--data-dir", str(d / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"rdmanet-test=http://127.0.0.1:{peer}", "--unsafe-no-fsync"])
        self.url = f"https://127.0.0.1:{port}"
        self._apiserver_argv = [
            str(self.bindir / "kube-apiserver"), "--etcd-servers", etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(port),
            "--insecure-port", "0", "--tls-cert-file", str(d / "server.crt"),
            "--tls-private-key-file", str(d / "server.key"), "--client-ca-file", str(d / "ca.crt"),
            "--authorization-mode", "RBAC", "--disable-admission-plugins", "ServiceAccount",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-signing-key-file", str(d / "sa.key"),
            "--service-account-key-file", str(d / "sa.pub"),
            "--api-audiences", "https://kubernetes.default.svc",
            "--service-cluster-ip-range", "10.96.0.0/16", "--endpoint-reconciler-type", "none",
            "--audit-policy-file", str(d / "audit-policy.yaml"), "--audit-log-path", str(self.audit_log),
            "--allow-privileged=true", "--profiling=false", "--v", "0"]
        self._apiserver = self._spawn("kube-apiserver", self._apiserver_argv)
        self.write_kubeconfig(self.admin_kubeconfig, namespace="default")
        self._wait_ready()

    def _wait_ready(self, timeout: float = 120.0) -> None:
        ctx = self.ssl_context()
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited ({p.returncode}): {self.logs()}")
            try:
                conn = http.client.HTTPSConnection("127.0.0.1", int(self.url.rsplit(":", 1)[1]),
                                                   context=ctx, timeout=5)
                conn.request("GET", "/readyz")
                r = conn.getresponse()
                last = r.read().decode(errors="replace")
                conn.close()
                if r.status == 200:
                    # the system namespaces come from a controller after readiness
                    core = kubernetes.client.CoreV1Api(self.api_client())
                    names = {n.metadata.name for n in core.list_namespace().items}
                    if {"default", "kube-system"} <= names:
                        return
            except (OSError, kubernetes.client.ApiException) as e:
                last = repr(e)
            time.sleep(0.3)
        raise RuntimeError(f"kube-apiserver not ready in {timeout} s: {last}\n{self.logs()}")

    def restart_apiserver(self) -> None:
        """Kill kube-apiserver (a graceful stop waits for every open watch) and start it again on
        the same port, certificates and etcd: every connection and watch breaks, the watch cache
        starts anew from etcd."""
        self._apiserver.kill()
        self._apiserver.wait(30)
        self.procs.remove(self._apiserver)
        for attempt in range(3):
            self._apiserver = self._spawn("kube-apiserver", self._apiserver_argv)
            try:
                self._wait_ready()
                return
            except RuntimeError:
                if self._apiserver.poll() is None or attempt == 2:
                    raise
                self.procs.remove(self._apiserver)  # it exited (its port taken a moment): again
                time.sleep(1)

    def ensure_running(self) -> None:
        """Start kube-apiserver again if it is not running (a restart that failed in an earlier test)."""
        if self._apiserver.poll() is not None:
            self.procs.remove(self._apiserver)
            self._apiserver = self._spawn("kube-apiserver", self._apiserver_argv)
            self._wait_ready()

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}"
                         for f in sorted(self.dir.glob("*.log")) if f != self.audit_log)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()
        self._spawner.shutdown()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- clients ---------------------------------------------------------------------------------

    def ssl_context(self, admin: bool = True) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.dir / "ca.crt"))
        if admin:
            ctx.load_cert_chain(str(self.dir / "admin.crt"), str(self.dir / "admin.key"))
        return ctx

    def write_kubeconfig(self, path: Any, namespace: str | None = None, token: str | None = None) -> str:
        """A kubeconfig for the server itself (TLS): the admin's client certificate, or ``token``."""
        user = ({"token": token} if token else
                {"client-certificate": str(self.dir / "admin.crt"), "client-key": str(self.dir / "admin.key")})
        ctx: dict[str, Any] = {"cluster": "real", "user": "real"}
        if namespace:
            ctx["namespace"] = namespace
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "real",
               "clusters": [{"name": "real", "cluster": {"server": self.url,
                                                         "certificate-authority": str(self.dir / "ca.crt")}}],
               "users": [{"name": "real", "user": user}],
               "contexts": [{"name": "real", "context": ctx}]}
        Path(path).write_text(yaml.safe_dump(cfg, sort_keys=False))
        return str(path)

    def api_client(self, token: str | None = None) -> kubernetes.client.ApiClient:
        cfg = kubernetes.client.Configuration(host=self.url)
        cfg.ssl_ca_cert = str(self.dir / "ca.crt")
        if token:
            cfg.api_key = {"authorization": f"Bearer {token}"}
        else:
            cfg.cert_file, cfg.key_file = str(self.dir / "admin.crt"), str(self.dir / "admin.key")
        client = kubernetes.client.ApiClient(cfg)
        client.user_agent = CONTROL_AGENT
        return client

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Any = None) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bindir / "kubectl"), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig),
                               *args], input=input, capture_output=True, text=True, check=check, timeout=120)

    def token(self, name: str = "rdmanet", namespace: str = "rdmanet-system", seconds: int = 3600) -> str:
        """A bound token of a ServiceAccount, from the TokenRequest API."""
        core = kubernetes.client.CoreV1Api(self.api_client())
        req = kubernetes.client.AuthenticationV1TokenRequest(
            spec=kubernetes.client.V1TokenRequestSpec(audiences=["https://kubernetes.default.svc"],
                                                      expiration_seconds=seconds))
        return core.create_namespaced_service_account_token(name, namespace, req).status.token

    def apply_rbac(self) -> None:
        """The namespace, ServiceAccount and RBAC of ``deploy/`` as an operator applies them."""
        for f in ("namespace.yaml", "serviceaccount.yaml", "rbac.yaml"):
            self.kubectl("apply", "-f", str(REPO / "deploy" / f))

    def install_crds(self) -> None:
        """The CRDs the tests and the example manifests need, from their projects' documented
        schemas: whereabouts' IPPool and OverlappingRangeIPReservation (lease-ipam reads them
        while a cluster migrates), Multus' NetworkAttachmentDefinition and nv-ipam's IPPool and
        CIDRPool (lease-ipam reads a NAD's poolName from them)."""
        docs = [_crd("whereabouts.cni.cncf.io", "v1alpha1", "IPPool", "ippools", {
                    "range": {"type": "string"},
                    "allocations": {"type": "object", "additionalProperties": {
                        "type": "object", "required": ["id"],
                        "properties": {"id": {"type": "string"}, "podref": {"type": "string"},
                                       "ifname": {"type": "string"}}}}}, required=["range", "allocations"]),
                _crd("whereabouts.cni.cncf.io", "v1alpha1", "OverlappingRangeIPReservation",
                     "overlappingrangeipreservations", {
                         "containerid": {"type": "string"}, "podref": {"type": "string"},
                         "ifname": {"type": "string"}}, required=["podref"]),
                _crd("k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition", "network-attachment-definitions",
                     {"config": {"type": "string"}}, short=["net-attach-def"]),
                *nv_ipam_crds()]
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        for d in docs:
            self.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{d['metadata']['name']}")

    # -- audit log -------------------------------------------------------------------------------

    def audit_offset(self) -> int:
        """Where the audit log ends now (after every request made so far: see :meth:`audit_events`)."""
        self._flush_audit()
        return self.audit_log.stat().st_size if self.audit_log.exists() else 0

    def _flush_audit(self) -> None:
        """The log backend writes asynchronously but in order: a marker request's event in the log
        means every earlier request's is there too."""
        self._marks += 1
        mark = f"rdmanet-audit-mark-{os.getpid()}-{self._marks}-{uuid.uuid4().hex[:8]}"
        core = kubernetes.client.CoreV1Api(self.api_client())
        with contextlib.suppress(kubernetes.client.ApiException):
            core.read_namespace(mark)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.audit_log.exists() and mark.encode() in self.audit_log.read_bytes()[-65536:]:
                return
            time.sleep(0.02)
        raise RuntimeError("the audit log did not show the marker request")

    def audit_events(self, since: int = 0, stage: str = "RequestReceived") -> list[dict]:
        """Every request's ``RequestReceived`` event after offset ``since``, the fixture's own left
        out (the server's own, e.g. admission's Lists as ``system:apiserver``, stay: filter by user)."""
        self._flush_audit()
        with open(self.audit_log, "rb") as f:
            f.seek(since)
            data = f.read()
        return [e for e in map(json.loads, data.splitlines())
                if e.get("userAgent") != CONTROL_AGENT and e.get("stage") == stage]


def _crd(group: str, version: str, kind: str, plural: str, spec: dict, required: list[str] | None = None,
         short: list[str] | None = None, status: dict | None = None) -> dict:
    """A CRD; with ``status`` (its properties) the status is a subresource, as kubebuilder's
    ``+kubebuilder:subresource:status`` makes it."""
    schema: dict[str, Any] = {"type": "object", "properties": spec}
    if required:
        schema["required"] = required
    names: dict[str, Any] = {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()}
    if short:
        names["shortNames"] = short
    properties = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
                  "spec": schema}
    served: dict[str, Any] = {"name": version, "served": True, "storage": True}
    if status is not None:
        properties["status"] = {"type": "object", "properties": status}
        served["subresources"] = {"status": {}}
    served["schema"] = {"openAPIV3Schema": {"type": "object", "properties": properties}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {"group": group, "scope": "Namespaced", "names": names, "versions": [served]}}


def nv_ipam_crds() -> list[dict]:
    """nv-ipam's IPPool and CIDRPool (``nv-ipam.nvidia.com/v1alpha1``), written from the fields its
    README and API types document; the status (each node's block or prefix, written by nv-ipam's
    controller) is a subresource."""
    def objects(**props: str) -> dict:
        return {"type": "array", "items": {"type": "object", "properties": {k: {"type": t} for k, t in props.items()}}}

    requirement = {"type": "array", "items": {"type": "object", "required": ["key", "operator"], "properties": {
        "key": {"type": "string"}, "operator": {"type": "string"},
        "values": {"type": "array", "items": {"type": "string"}}}}}
    node_selector = {"type": "object", "required": ["nodeSelectorTerms"], "properties": {"nodeSelectorTerms": {
        "type": "array", "items": {"type": "object", "properties": {"matchExpressions": requirement,
                                                                     "matchFields": requirement}}}}}
    common = {"exclusions": objects(startIP="string", endIP="string"),
              "perNodeExclusions": objects(startIndex="integer", endIndex="integer"),
              "nodeSelector": node_selector, "defaultGateway": {"type": "boolean"}, "routes": objects(dst="string")}
    return [_crd("nv-ipam.nvidia.com", "v1alpha1", "IPPool", "ippools",
                 {"subnet": {"type": "string"}, "perNodeBlockSize": {"type": "integer"}, "gateway": {"type": "string"},
                  **common}, required=["subnet", "perNodeBlockSize"],
                 status={"allocations": objects(nodeName="string", startIP="string", endIP="string")}),
            _crd("nv-ipam.nvidia.com", "v1alpha1", "CIDRPool", "cidrpools",
                 {"cidr": {"type": "string"}, "gatewayIndex": {"type": "integer"},
                  "perNodeNetworkPrefix": {"type": "integer"},
                  "staticAllocations": objects(nodeName="string", gateway="string", prefix="string"), **common},
                 required=["cidr", "perNodeNetworkPrefix"],
                 status={"allocations": objects(nodeName="string", gateway="string", prefix="string")})]


def audit_counts(events: list[dict], user: str | None = None) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for e in events:
        if user is not None and (e.get("user") or {}).get("username") != user:
            continue
        ref = e.get("objectRef") or {}
        key = (e.get("verb", ""), ref.get("resource", "unknown"))
        out[key] = out.get(key, 0) + 1
    return out


# ------------------------------------------------------------------------------------------------
# The fault-injecting proxy
# ------------------------------------------------------------------------------------------------

_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection",
        "authorization", "host", "content-length"}


class FaultProxy(FaultControls):
    """Plain HTTP on loopback → the real server over TLS as the admin, with the fake server's
    faults (``fail_next``/``fail_rate``: a status, ``"drop"`` or ``"lost"``; latency) and watch
    controls (pause, drop), matched by the same (verb, resource) as the fake's."""

    def __init__(self, cluster: KubeCluster):
        self.cluster = cluster
        self._upstream = urlsplit(cluster.url)
        self._ctx = cluster.ssl_context()
        self._lock = self._stats_lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._init_faults()
        self._paused = False
        self._watch_socks: set[socket.socket] = set()
        self.injected: dict[tuple[str, str], int] = {}
        self.log: list[dict] = []
        proxy = self

        class Handler(_ProxyHandler):
            server_obj = proxy

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.resume_watches()
        self.drop_watches()
        self.httpd.shutdown()
        self.httpd.server_close()

    def upstream(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self._upstream.hostname, self._upstream.port, context=self._ctx,
                                           timeout=3600)

    def pause_watches(self) -> None:
        with self._cond:
            self._paused = True

    def resume_watches(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def wait_unpaused(self) -> None:
        with self._cond:
            while self._paused:
                self._cond.wait(0.5)

    def drop_watches(self) -> int:
        with self._lock:
            socks = list(self._watch_socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        return len(socks)

    @property
    def active_watches(self) -> int:
        with self._lock:
            return len(self._watch_socks)


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_obj: FaultProxy

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET

    def _serve(self) -> None:
        proxy = self.server_obj
        split = urlsplit(self.path)
        q = {k: v[-1] for k, v in parse_qs(split.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        verb, resource, rt, ns, name = None, "unknown", None, None, None
        for rx, res, namespaced in _ROUTES:
            m = rx.match(split.path)
            if m:
                rt = RESOURCES[res.partition("/")[0]]
                resource = rt.plural  # counted by plural, as the audit log's objectRef names it
                if namespaced is None:  # cluster-scoped, by name too (nodes, namespaces)
                    ns, name = "", m.group(1)
                else:
                    ns, name = (m.group(1), m.group(2)) if namespaced else (None, None)
                verb = _Handler._verb(self.command, name, q.get("watch", "").lower() in ("true", "1"), ns)
                break
        verb = verb or self.command.lower()
        entry = {"method": self.command, "path": split.path, "query": q, "verb": verb, "resource": resource,
                 "namespace": ns, "name": name, "status": None, "injected": False}
        t0 = time.monotonic()
        with proxy._lock:
            proxy.log.append(entry)  # now: a watch's entry is there while it streams
        try:
            delay = proxy._latency_for(verb, resource)
            if delay > 0:
                time.sleep(delay)
            fault = proxy._pick_fault(verb, resource) if rt is not None else None
            lost = False
            if fault is not None:
                entry["injected"] = True
                if fault.status == "lost" and verb != "watch":
                    lost = True
                else:
                    with proxy._lock:
                        proxy.injected[(verb, resource)] = proxy.injected.get((verb, resource), 0) + 1
                    if fault.status == "drop":
                        self._cut()
                        return
                    err = _fault_error(fault, rt, name)
                    entry["status"] = err.code
                    self._send(err.code, json.dumps(err.status()).encode(),
                               {"Content-Type": "application/json", **err.headers})
                    return
            conn = proxy.upstream()
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            entry["status"] = resp.status
            if lost:
                resp.read()
                conn.close()
                self._cut()
                return
            if verb == "watch" and resp.status == 200:
                self._stream(resp)
            else:
                data = resp.read()
                self._send(resp.status, data, {k: v for k, v in resp.getheaders() if k.lower() not in _HOP})
            conn.close()
        except (OSError, http.client.HTTPException):
            self.close_connection = True
        finally:
            entry["seconds"] = time.monotonic() - t0

    def _start(self, code: int, headers: dict) -> None:
        """The status line and the headers: the server's own ``Date`` when it answered, else now
        (one ``Date``: ``send_response`` would add a second one, and a client reads the two joined)."""
        self.log_request(code)
        self.send_response_only(code)
        if not any(k.lower() == "date" for k in headers):
            self.send_header("Date", self.date_time_string())

    def _send(self, code: int, data: bytes, headers: dict) -> None:
        self._start(code, headers)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _cut(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _stream(self, resp: http.client.HTTPResponse) -> None:
        proxy = self.server_obj
        self._start(200, {"Date": resp.getheader("Date")} if resp.getheader("Date") else {})
        if resp.getheader("Date"):
            self.send_header("Date", resp.getheader("Date"))
        self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        with proxy._lock:
            proxy._watch_socks.add(self.connection)
        try:
            while True:
                line = resp.readline()
                if not line:
                    break
                proxy.wait_unpaused()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            with proxy._lock:
                proxy._watch_socks.discard(self.connection)
            self.close_connection = True


# ------------------------------------------------------------------------------------------------
# The fake server's controls on the real one
# ------------------------------------------------------------------------------------------------

_CLEANED = ("ippools", "overlappingrangeipreservations", "ippools.nv-ipam.nvidia.com", "cidrpools.nv-ipam.nvidia.com")


class RealServer:
    """What a Lease-store test uses of ``KubeAPIServer``, on the real server behind a FaultProxy.
    One per test (:meth:`close` deletes what the test made, in every namespace)."""

    real = True

    def __init__(self, cluster: KubeCluster):
        self.cluster = cluster
        cluster.ensure_running()
        self.proxy = FaultProxy(cluster)
        self.url = self.proxy.url
        self.api = cluster.api_client()
        self.core = kubernetes.client.CoreV1Api(self.api)
        self._namespaces: set[str] = set()
        self._since = cluster.audit_offset()
        for ns in NAMESPACES:
            self.ensure_namespace(ns)

    def close(self) -> None:
        self.proxy.stop()
        self.cleanup()

    stop = close

    def cleanup(self) -> None:
        """Delete every Lease, pod, node and whereabouts object the test left (as a new fake would start empty)."""
        for ns in [n.metadata.name for n in self.core.list_namespace().items]:
            for res in ("leases", "pods"):
                q = "?gracePeriodSeconds=0" if res == "pods" else ""
                self._raw("DELETE", self._path(res, ns) + q, ok=(200, 404))
        self._raw("DELETE", "/api/v1/nodes", ok=(200,))
        if self._crds():
            for ns in [n.metadata.name for n in self.core.list_namespace().items]:
                for res in _CLEANED:
                    self._raw("DELETE", self._path(res, ns), ok=(200, 404))

    def _crds(self) -> bool:
        code, _ = self._raw("GET", "/apis/whereabouts.cni.cncf.io/v1alpha1", ok=(200, 404))
        return code == 200

    # -- raw requests (the admin, outside the counts) ---------------------------------------------

    def _raw(self, method: str, path: str, body: Any = None, ok: tuple[int, ...] = (200, 201)) -> tuple[int, Any]:
        headers = {"User-Agent": CONTROL_AGENT, "Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        deadline = time.monotonic() + 60  # the server may be restarting (restart_watches)
        while True:
            conn = self.proxy.upstream()
            try:
                conn.request(method, path, body=data, headers=headers)
                r = conn.getresponse()
                out = r.read()
                break
            except (OSError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            finally:
                conn.close()
        try:
            doc = json.loads(out) if out else None
        except ValueError:  # a plain-text 404 of an API group the server does not serve
            doc = out.decode(errors="replace")
        if r.status not in ok:
            raise ApiError(r.status, f"{method} {path}: {doc}")
        return r.status, doc

    @staticmethod
    def _path(resource: Any, namespace: str | None = None, name: str | None = None) -> str:
        """The path of a resource (a key of RESOURCES, or a ResourceType: its subresource too)."""
        rt = RESOURCES[resource] if isinstance(resource, str) else resource
        p = f"/apis/{rt.group}/{rt.version}" if rt.group else f"/api/{rt.version}"
        if namespace:
            p += f"/namespaces/{namespace}"
        p += f"/{rt.plural}"
        p += f"/{name}" if name else ""
        return p + (f"/{rt.subresource}" if rt.subresource and name else "")

    @staticmethod
    def advance_clock(seconds: float) -> None:
        """The fake moves its clock; a real server's time is waited for."""
        time.sleep(seconds)

    def add_namespace(self, ns: str) -> None:
        self.ensure_namespace(ns)

    def ensure_namespace(self, ns: str) -> None:
        if ns in self._namespaces:
            return
        self._raw("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                  ok=(201, 409))
        self._namespaces.add(ns)

    # -- counts --------------------------------------------------------------------------------

    def counts(self) -> dict[tuple[str, str], int]:
        out = audit_counts(self.cluster.audit_events(self._since), user=ADMIN)
        with self.proxy._lock:
            for k, n in self.proxy.injected.items():
                out[k] = out.get(k, 0) + n
        return out

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        return sum(n for (v, r), n in self.counts().items()
                   if (verb is None or v == verb) and (resource is None or r == resource))

    def reset_counts(self) -> None:
        self._since = self.cluster.audit_offset()
        with self.proxy._lock:
            self.proxy.injected.clear()
            self.proxy.log.clear()

    def request_log(self) -> list[dict]:
        with self.proxy._lock:
            return [dict(e) for e in self.proxy.log]

    # -- faults and watches (the proxy's) ------------------------------------------------------

    def restart_watches(self) -> int:
        """The fake's "restart" (history and every stream gone): here kube-apiserver itself restarts.
        Returns how many watches the proxy was relaying."""
        n = self.proxy.active_watches
        self.cluster.restart_apiserver()
        self.proxy.drop_watches()
        return n

    def __getattr__(self, name: str) -> Any:
        if name in ("fail_next", "fail_rate", "clear_faults", "inject_latency", "pause_watches",
                    "resume_watches", "drop_watches", "active_watches"):
            return getattr(self.proxy, name)
        raise AttributeError(f"{name}: a control of the fake server only (tests/kube_api_server.py)")

    # -- objects -------------------------------------------------------------------------------

    def _api(self, method: str, path: str, body: Any = None) -> tuple[int, dict]:
        """Any answer, as the fake's ``api_*`` give it: (status code, object or Status)."""
        return self._raw(method, path, body, ok=tuple(range(200, 600)))

    def api_create(self, rt, ns: str, body: dict, dry_run: bool) -> tuple[int, dict]:
        body = {"apiVersion": rt.api_version, "kind": rt.kind, **body}
        return self._api("POST", self._path(rt, ns) + ("?dryRun=All" if dry_run else ""), body)

    def api_update(self, rt, ns: str, name: str, body: dict, dry_run: bool) -> tuple[int, dict]:
        body = {"apiVersion": rt.api_version, "kind": rt.kind, **body}
        return self._api("PUT", self._path(rt, ns, name) + ("?dryRun=All" if dry_run else ""), body)

    def api_delete(self, rt, ns: str, name: str, body: Any, dry_run: bool) -> tuple[int, dict]:
        return self._api("DELETE", self._path(rt, ns, name) + ("?dryRun=All" if dry_run else ""), body)

    def objects(self, resource: str, namespace: str | None = None) -> list[dict]:
        _, doc = self._raw("GET", self._path(resource, namespace))
        kind = RESOURCES[resource].kind
        items = []
        for o in doc["items"]:
            o.setdefault("kind", kind)
            o.setdefault("apiVersion", RESOURCES[resource].api_version)
            items.append(o)
        return sorted(items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def get_object(self, resource: str, namespace: str, name: str) -> dict | None:
        code, doc = self._raw("GET", self._path(resource, namespace, name), ok=(200, 404))
        return doc if code == 200 else None

    def add_pod(self, namespace: str, name: str, uid: str | None = None, node: str | None = None,
                labels: dict | None = None, phase: str = "Running", pod_ip: str | None = None,
                annotations: dict | None = None) -> dict:
        """Create (or replace: delete, then create) a pod. The server sets the UID (``uid`` is
        ignored: use the returned pod's); ``phase``/``pod_ip`` are written to its status."""
        self.ensure_namespace(namespace)
        self.delete_pod(namespace, name)
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        spec: dict[str, Any] = {"containers": [{"name": "main", "image": "pause"}]}
        if node:
            spec["nodeName"] = node
        code, pod = self._raw("POST", self._path("pods", namespace),
                              {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}, ok=(201, 409))
        if code == 409:  # our own create, retried after its answer was lost (a kube-apiserver restart)
            _, pod = self._raw("GET", self._path("pods", namespace, name))
        status = {"phase": phase, **({"podIP": pod_ip} if pod_ip else {})}
        for _ in range(3):
            pod["status"] = status
            code, pod = self._raw("PUT", self._path("pods", namespace, name) + "/status", pod, ok=(200, 409))
            if code == 200:
                return pod
            # our own update, retried after its answer was lost (a kube-apiserver restart): read it again
            _, pod = self._raw("GET", self._path("pods", namespace, name))
        raise ApiError(409, f"the status of pod {namespace}/{name} kept changing")

    def delete_pod(self, namespace: str, name: str | None = None, uid: str | None = None) -> bool:
        if name is None:
            pods = [o for o in self.objects("pods", namespace) if o["metadata"]["uid"] == uid]
            if not pods:
                return False
            name = pods[0]["metadata"]["name"]
        code, _ = self._raw("DELETE", self._path("pods", namespace, name),
                            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}, ok=(200, 404))
        return code == 200

    def add_node(self, name: str, labels: dict | None = None) -> dict:
        self.delete_node(name)
        meta: dict[str, Any] = {"name": name, **({"labels": dict(labels)} if labels else {})}
        _, node = self._raw("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": meta})
        return node

    def delete_node(self, name: str) -> bool:
        code, _ = self._raw("DELETE", f"/api/v1/nodes/{name}", ok=(200, 404))
        return code == 200

