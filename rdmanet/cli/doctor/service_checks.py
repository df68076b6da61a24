"""The services the plugins talk to: the node daemon (its health request) and each lease-ipam store
(local: the data dir can be written; Kubernetes: the API answers a list of Leases).

Read-only: the health request changes nothing; the Lease check is one GET with ``limit=1``; the
local store is judged with access(2) and statvfs(2), never by writing. The ``kubernetes`` client is
imported (by ``rdmanet.ipam.kube_config.connect``) only when a Kubernetes-store config is found.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from rdmanet.node.launcher import DaemonLost, NoDaemon, exchange

from .cni_checks import NetworkUse
from .findings import Finding, error, info, ok, warn

# =========================================================================== daemon


@dataclass
class DaemonFacts:
    socket: str
    socket_exists: bool
    answer: Optional[dict] = None
    problem: str = ""  # "", "no-daemon", "lost", "denied"
    detail: str = ""
    systemd: bool = False  # systemd runs the host (/run/systemd/system)
    socket_unit: str = ""  # install.sh's rdmanet.socket, when there is one
    unit_listens_on: str = ""  # its ListenStream=


def _socket_unit(systemd_root: str) -> tuple[str, str]:
    """(path, ListenStream=) of rdmanet.socket in the node owner's units; ("", "") when absent."""
    from rdmanet.cli.systemd_units import SOCKET_UNIT, UNIT_DIR

    path = os.path.join(systemd_root, UNIT_DIR.lstrip("/"), SOCKET_UNIT)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(65536)
    except OSError:
        return "", ""
    listens = [line.split("=", 1)[1].strip() for line in text.splitlines() if line.startswith("ListenStream=")]
    return path, listens[-1] if listens else ""


def gather_daemon(socket_path: str, timeout: float, systemd_root: str = "/") -> DaemonFacts:
    facts = DaemonFacts(socket_path, os.path.exists(socket_path))
    facts.systemd = os.path.isdir(os.path.join(systemd_root, "run/systemd/system"))
    facts.socket_unit, facts.unit_listens_on = _socket_unit(systemd_root)
    if facts.socket_exists and not os.access(socket_path, os.W_OK):  # connect(2) needs write permission
        facts.problem, facts.detail = "denied", "permission denied"
        return facts
    try:
        answer = exchange(socket_path, {"health": True}, timeout=timeout)
    except NoDaemon as exc:
        facts.problem, facts.detail = "no-daemon", str(exc)
    except DaemonLost as exc:
        facts.problem, facts.detail = "lost", str(exc)
    else:
        facts.answer = answer if isinstance(answer, dict) else {"ok": False, "answer": answer}
    return facts


def _age(seconds: Any) -> str:
    """``3725`` -> ``1h2m``."""
    try:
        s = int(float(seconds))
    except (TypeError, ValueError):
        return "?"
    if s >= 86400:
        return f"{s // 86400}d{s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60}m"
    if s >= 60:
        return f"{s // 60}m{s % 60}s"
    return f"{s}s"


def check_daemon(facts: DaemonFacts, shim_kinds: set[str], euid: int) -> list[Finding]:
    path, unit = facts.socket, facts.socket_unit
    if unit and facts.unit_listens_on and os.path.normpath(facts.unit_listens_on) != os.path.normpath(path):
        return [warn("daemon", path, f"{unit} listens on {facts.unit_listens_on}, but doctor checked {path}",
                     f"run doctor with --socket {facts.unit_listens_on}, or re-run install.sh with the socket the "
                     "shims use")] + _check_daemon(facts, shim_kinds, euid)
    return _check_daemon(facts, shim_kinds, euid)


def _check_daemon(facts: DaemonFacts, shim_kinds: set[str], euid: int) -> list[Finding]:
    path, unit = facts.socket, facts.socket_unit
    if facts.answer is not None:
        a = facts.answer
        if a.get("ok"):
            started = ", socket-activated (rdmanet.socket)" if a.get("socket_activated") else ""
            return [ok("daemon", path, f"healthy: pid {a.get('pid', '?')}, up {_age(a.get('uptime'))}, "
                                       f"{a.get('requests', '?')} calls served, {a.get('in_flight', 0)} in flight{started}")]
        return [error("daemon", path, f"answers but reports not ok: {a}", "see the daemon's log; restart it")]
    daemon_only = "daemon-only" in shim_kinds
    if unit and (facts.problem == "no-daemon" or (facts.problem == "lost" and euid == 0)):
        if facts.problem == "lost":
            what = (f"took the health request but no daemon answered ({facts.detail}); {unit} starts rdmanet.service "
                    "on the first call: it may still be starting, or it fails to")
            fix = "run doctor again; see 'systemctl status rdmanet.service' and 'journalctl -u rdmanet.service'"
        else:
            what = f"{unit} is installed but nothing listens on the socket ({facts.detail})"
            fix = "systemctl enable --now rdmanet.socket (see 'systemctl status rdmanet.socket')"
        if daemon_only:
            return [error("daemon", path, f"{what}; the shims here are daemon-only, so every ADD answers 'try again "
                                          "later' and pods do not start", fix)]
        return [warn("daemon", path, f"{what}; the shims run the plugins in-process meanwhile (slower pod starts)", fix)]
    if facts.problem == "denied":
        return [warn("daemon", path, "this user may not connect to the daemon's socket (it is root's, mode 0600)",
                     "run doctor as root")]
    if facts.problem == "lost":
        if euid != 0:
            return [warn("daemon", path, "the daemon closed the connection without answering: it answers only root",
                         "run doctor as root")]
        return [error("daemon", path, f"the daemon took the health request but did not answer ({facts.detail})",
                      "the daemon is stuck: see its log and restart it (the rdmanet DaemonSet pod, or 'rdmanet daemon')")]
    if facts.socket_exists:
        what = f"nothing answers on the socket ({facts.detail}): a stale socket of a daemon that is gone"
    else:
        what = "not running (no socket)"
    if not shim_kinds:
        return [info("daemon", path, f"{what}, and no rdmanet shim is installed (see cni-bin)",
                     "install.sh installs the shims; then start 'rdmanet daemon' as root")]
    if daemon_only:
        return [error("daemon", path, f"{what}; the shims here are daemon-only, so every ADD answers "
                                      "'try again later' and pods do not start",
                      "start the daemon: is the rdmanet DaemonSet pod running on this node? (or 'rdmanet daemon')")]
    if facts.systemd:
        fix = ("re-run install.sh: under systemd it installs rdmanet.socket, which starts the daemon on the first "
               "call (or start 'rdmanet daemon' as root)")
    else:
        fix = "start it: 'rdmanet daemon' as root, from the host's init system, or the rdmanet DaemonSet"
    return [warn("daemon", path, f"{what}; the shims run the plugins in-process, which makes every call "
                                 "pay the imports (slower pod starts)", fix)]


# =========================================================================== lease-ipam stores


@dataclass
class LocalStoreFacts:
    networks: list[str]
    store_dir: str
    exists: bool
    existing: str  # the store dir, or its nearest existing ancestor
    writable: bool
    read_only_fs: bool


@dataclass
class KubeStoreFacts:
    networks: list[str]
    kubeconfig: Optional[str]
    namespace: str = ""
    host: str = ""
    problem: str = ""  # "", "config", "in-cluster", "unreachable", "http"
    status: Optional[int] = None
    detail: str = ""
    fix: str = ""


@dataclass
class StoreFacts:
    local: list[LocalStoreFacts] = field(default_factory=list)
    kube: list[KubeStoreFacts] = field(default_factory=list)
    invalid: list[tuple[str, str, str]] = field(default_factory=list)  # (network, message, fix)


def _nearest_existing(path: str) -> str:
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def gather_local(networks: list[str], store_dir: str) -> LocalStoreFacts:
    existing = _nearest_existing(store_dir)
    writable = os.access(existing, os.W_OK | os.X_OK)
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return LocalStoreFacts(networks, store_dir, existing == store_dir and os.path.isdir(store_dir), existing,
                           writable, read_only)


def probe_kube(networks: list[str], settings: Any, timeout: float) -> KubeStoreFacts:
    """One GET of Leases (limit=1) in the store's namespace, as the store itself would ask."""
    from rdmanet.cni.core.errors import CNIError
    from rdmanet.ipam.kube_config import connect

    facts = KubeStoreFacts(networks, settings.kubeconfig)
    if settings.kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        facts.problem = "in-cluster"
        return facts
    try:
        conn = connect(settings)
    except CNIError as err:
        facts.problem, facts.detail, facts.fix = "config", err.msg, err.details
        return facts
    except Exception as exc:  # the kubernetes client's own errors
        facts.problem, facts.detail = "config", f"{type(exc).__name__}: {exc}"
        facts.fix = "give a valid kubeconfig (ipam.kubernetes.kubeconfig)"
        return facts
    from rdmanet.ipam.store.kube import LEASES_PATH, ApiClientTransport, Unreachable

    facts.namespace = conn.namespace
    try:
        transport = ApiClientTransport(conn.api_client, conn.host)
        facts.host = transport.host
        resp = transport.request("GET", LEASES_PATH.format(namespace=conn.namespace), [("limit", "1")], None,
                                 min(timeout, settings.request_timeout))
    except Unreachable as exc:
        facts.problem, facts.detail = "unreachable", str(exc)
        return facts
    except Exception as exc:
        facts.problem, facts.detail = "unreachable", f"{type(exc).__name__}: {exc}"
        return facts
    facts.status = resp.status
    if resp.status != 200:
        facts.problem = "http"
        msg = resp.doc.get("message") if isinstance(resp.doc, dict) else ""
        facts.detail = f"HTTP {resp.status} {msg or ''}".rstrip()
    return facts


def gather_stores(uses: list[NetworkUse], timeout: float) -> StoreFacts:
    from rdmanet.cni.core.errors import CNIError
    from rdmanet.ipam.kube_config import kube_settings
    from rdmanet.ipam.location import store_location

    facts = StoreFacts()
    local: dict[str, list[str]] = {}
    kube: dict[tuple, tuple[list[str], Any]] = {}
    for use in uses:
        if use.ipam != "lease-ipam" and use.plugin != "lease-ipam":
            continue
        config = use.config
        if use.plugin == "lease-ipam" and not isinstance(config.get("ipam"), dict):
            config = dict(config, ipam={"type": "lease-ipam"})
        try:
            settings = kube_settings(config)
            if settings is None:
                data_dir, domain = store_location(config)
                local.setdefault(os.path.join(data_dir, domain), []).append(use.network)
            else:
                key = (settings.kubeconfig, settings.api_root, settings.namespace)
                kube.setdefault(key, ([], settings))[0].append(use.network)
        except CNIError as err:
            facts.invalid.append((use.network, f"{use.source}: {err.msg}", err.details))
    for store_dir, networks in local.items():
        facts.local.append(gather_local(networks, store_dir))
    for networks, settings in kube.values():
        facts.kube.append(probe_kube(networks, settings, timeout))
    return facts


def check_stores(facts: StoreFacts) -> list[Finding]:
    out: list[Finding] = []
    for network, msg, fix in facts.invalid:
        out.append(error("ipam", network, f"lease-ipam: {msg}", fix))
    for s in facts.local:
        nets = ", ".join(s.networks)
        subject = f"local {s.store_dir}"
        if s.read_only_fs:
            out.append(error("ipam", subject, f"networks {nets}: {s.existing} is on a read-only filesystem: ADD fails",
                             "put ipam.dataDir on a writable local filesystem"))
        elif not s.writable:
            out.append(error("ipam", subject, f"networks {nets}: {s.existing} is not writable by this user",
                             "run doctor as root (the plugins run as root); else fix the directory's owner/mode"))
        elif s.exists:
            out.append(ok("ipam", subject, f"networks {nets}: the store directory exists and is writable"))
        else:
            out.append(ok("ipam", subject, f"networks {nets}: not created yet; {s.existing} is writable, "
                                           "so the first ADD creates it"))
    for k in facts.kube:
        nets = ", ".join(k.networks)
        subject = f"kubernetes {k.kubeconfig or 'in-cluster'}"
        if k.problem == "in-cluster":
            out.append(warn("ipam", subject, f"networks {nets}: no kubeconfig, so the in-cluster config is used; "
                                             "that works only where lease-ipam runs in a pod, and is not checked from here",
                            "set ipam.kubernetes.kubeconfig for plugins run on the host, or run doctor in the rdmanet pod"))
        elif k.problem == "config":
            out.append(error("ipam", subject, f"networks {nets}: {k.detail}", k.fix))
        elif k.problem == "unreachable":
            out.append(error("ipam", subject, f"networks {nets}: the API server {k.host or ''} does not answer: {k.detail}",
                             "check the kubeconfig's server (or ipam.kubernetes.k8s_api_root), the network and the API server"))
        elif k.problem == "http":
            hint = {401: "the kubeconfig's credentials were rejected: renew the token or certificate",
                    403: f"grant get, list, create and delete on leases.coordination.k8s.io in namespace {k.namespace}",
                    404: f"create namespace {k.namespace} or set ipam.kubernetes.namespace"}
            out.append(error("ipam", subject, f"networks {nets}: listing leases in namespace {k.namespace} failed: {k.detail}",
                             hint.get(k.status or 0, "see the API server's message")))
        else:
            out.append(ok("ipam", subject, f"networks {nets}: API {k.host} answers, leases are listable in namespace "
                                           f"{k.namespace}"))
    if not facts.local and not facts.kube and not facts.invalid:
        out.append(info("ipam", "-", "no network config using lease-ipam found (NADs live in Kubernetes)",
                        "give one with --network-config FILE to check its store"))
    return out
