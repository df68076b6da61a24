"""The ``kubernetes`` key of the ipam block: whether the Lease store is used, and how to reach the API.

Read without pydantic and without importing the ``kubernetes`` client (about 300-400 ms), so a
local-store network never pays for it and DEL/GC stay cheap.

Keys (all optional; the ``kubernetes`` object, from the NAD or whereabouts' flat file, selects
the Lease store, as ``"datastore": "kubernetes"`` does)::

    "kubernetes": {
      "kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig",  # whereabouts' key, as is
      "k8s_api_root": "https://10.0.0.1:6443",  # whereabouts' key: overrides the kubeconfig's server
      "namespace": "kube-system",               # where the Leases live
      "timeout_seconds": 20,                    # whole-verb budget for API calls and retries
      "request_timeout_seconds": 5,             # one API request (connect and read)
      "block_size": 16,                         # addresses per node block (power of two; default
                                                # 16 for IPv4, 64 for IPv6: docs/lease-ipam.md)
      "block_release_seconds": 300              # a node's empty block is released after this long
    },
    "gc_grace_seconds": 60                      # ipam level: GC spares claims younger than this

Namespace, first that applies: ``kubernetes.namespace``; the namespace of the kubeconfig's current
context; in-cluster, the service account's namespace; else ``kube-system`` (whereabouts' default).
Without ``kubeconfig`` the in-cluster service-account config is used (KUBERNETES_SERVICE_HOST and
/var/run/secrets/kubernetes.io/serviceaccount), which only works when the plugin runs in a pod:
in a cluster that is the daemon's own service account.

A NAD may be a tenant's: ``kubeconfig`` must be one of the kubeconfig files the node policy lists
(default: ``/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig``, which install.sh's DaemonSet mode
writes, and whereabouts' ``/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig``), reached
without a symlink (rdmanet.cni.linux.roots), and a ``namespace`` it names must be one the node
policy allows (``leaseNamespaces``, default ``rdmanet-system``). Without ``namespace`` the
credentials' own namespace (their context's, the service account's) is used: the node owner's.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Optional

from rdmanet.cni.core.errors import INVALID_CONFIG, CNIError
from rdmanet.cni.linux import roots

from .location import KUBERNETES, bad, config_path, ipam_block, store_kind

DEFAULT_NAMESPACE = "kube-system"
DEFAULT_TIMEOUT = 20.0
DEFAULT_REQUEST_TIMEOUT = 5.0
DEFAULT_GC_GRACE = 60.0
DEFAULT_BLOCK_RELEASE = 300.0
MAX_BLOCK_SIZE = 1 << 16
SA_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
KUBECONFIG_KEY = "ipam.kubernetes.kubeconfig"
KUBECONFIG_MAX_BYTES = 1 << 20
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class KubeSettings:
    kubeconfig: Optional[str] = None  # None: in-cluster
    api_root: Optional[str] = None
    namespace: Optional[str] = None  # None: from the kubeconfig context / service account / default
    timeout: float = DEFAULT_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    gc_grace: float = DEFAULT_GC_GRACE
    block_size: Optional[int] = None  # None: 16 for IPv4, 64 for IPv6
    block_release: float = DEFAULT_BLOCK_RELEASE


def _seconds(raw: dict, key: str, where: str, default: float, allow_zero: bool = False) -> float:
    value = raw.get(key, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and (value > 0 or (allow_zero and value == 0))
    if not ok:
        raise bad(where, f"{value!r} is not a positive number of seconds", f'e.g. "{key}": {int(default)}')
    return float(value)


def kube_settings(config: dict) -> Optional[KubeSettings]:
    """The Lease store's settings, or None when the ipam block (whereabouts' flat file merged
    underneath) does not select it (see :mod:`rdmanet.ipam.location`)."""
    ipam = ipam_block(config)
    if store_kind(ipam) != KUBERNETES:
        return None
    raw = ipam.get("kubernetes")
    if raw is None:
        raw = {}  # "datastore": "kubernetes" alone: the in-cluster config
    if not isinstance(raw, dict):
        raise bad("ipam.kubernetes", "is not an object",
                  '"kubernetes": {"kubeconfig": "/etc/cni/net.d/lease-ipam.kubeconfig"}, or {} in a pod')
    kubeconfig = raw.get("kubeconfig")
    if kubeconfig not in (None, ""):  # "" is whereabouts' "unset" (its flat file fills it)
        kubeconfig = config_path(kubeconfig, "ipam.kubernetes.kubeconfig",
                                 "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig")
    api_root = raw.get("k8s_api_root")
    if api_root is not None and (not isinstance(api_root, str) or not re.match(r"^https?://", api_root)):
        raise bad("ipam.kubernetes.k8s_api_root", f"{api_root!r} is not an http(s) URL", 'e.g. "https://10.0.0.1:6443"')
    namespace = raw.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not _DNS_LABEL.match(namespace)):
        raise bad("ipam.kubernetes.namespace", f"{namespace!r} is not a namespace name",
                  "use a DNS-1123 label such as kube-system")
    return KubeSettings(
        kubeconfig=kubeconfig or None,
        api_root=api_root or None,
        namespace=namespace,
        timeout=_seconds(raw, "timeout_seconds", "ipam.kubernetes.timeout_seconds", DEFAULT_TIMEOUT),
        request_timeout=_seconds(raw, "request_timeout_seconds", "ipam.kubernetes.request_timeout_seconds",
                                 DEFAULT_REQUEST_TIMEOUT),
        gc_grace=_seconds(ipam, "gc_grace_seconds", "ipam.gc_grace_seconds", DEFAULT_GC_GRACE, allow_zero=True),
        block_size=_block_size(raw),
        block_release=_seconds(raw, "block_release_seconds", "ipam.kubernetes.block_release_seconds",
                               DEFAULT_BLOCK_RELEASE, allow_zero=True),
    )


def _block_size(raw: dict) -> Optional[int]:
    value = raw.get("block_size")
    if value is None:
        return None
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_BLOCK_SIZE and value & (value - 1) == 0
    if not ok:
        raise bad("ipam.kubernetes.block_size", f"{value!r} is not a power of two from 1 to {MAX_BLOCK_SIZE}",
                  'e.g. "block_size": 16 (addresses per node block; see docs/lease-ipam.md)')
    return value


# -- the client ----------------------------------------------------------------------------------

@dataclass
class Connection:
    api_client: Any  # kubernetes.client.ApiClient; None for a standard-library connection
    namespace: str
    host: Optional[str] = None  # k8s_api_root: used instead of the kubeconfig's server
    endpoint: Any = None  # rdmanet.ipam.kube_credentials.Endpoint of a standard-library connection
    server: str = ""  # the API server the credentials name (kubeconfig or in-cluster): k8s_api_root must match
    _transport: Any = None

    def transport(self) -> Any:
        """The store's Transport over this connection (one per connection: its keep-alive pool)."""
        if self._transport is None:
            if self.api_client is not None:
                from .store.kube import ApiClientTransport

                self._transport = ApiClientTransport(self.api_client, self.host)
            else:
                from .store.http_transport import HTTPTransport

                self._transport = HTTPTransport(self.endpoint)
        return self._transport


_cache: dict[tuple, tuple[Optional[str], Connection]] = {}  # settings -> (kubeconfig digest, connection)
_cache_lock = threading.Lock()


def _read_kubeconfig(path: Optional[str]) -> Optional[bytes]:
    """The kubeconfig's content (None: no kubeconfig, or unreadable), read within the node's
    kubeconfig roots (CNI error 7 when outside them or through a symlink)."""
    if not path:
        return None
    try:
        return roots.read_file("kubeconfig", KUBECONFIG_KEY, path, limit=KUBECONFIG_MAX_BYTES)
    except OSError:
        return None


def connect(settings: KubeSettings, *, stdlib: bool = False) -> Connection:
    """A connection for the settings, cached per process (a daemon reuses its connection pool).

    ``stdlib``: without the ``kubernetes`` client (whose import costs ~0.5 s of CPU), through
    ``http.client`` with the kubeconfig read by :mod:`rdmanet.ipam.kube_credentials` (same credentials:
    client certificates, tokens, token files, exec plugins, in-cluster service account); a
    kubeconfig using what only the official client implements (auth-provider, proxy-url) gets
    the official client anyway. The in-process plugin asks for it; the daemon and the CLI do not.

    The connection is made anew when the kubeconfig's content changes (a rotated token or CA:
    install.sh's DaemonSet mode rewrites it by rename), and the old one is dropped from the cache.
    urllib3's own retries are off: the store retries with its own budget and backoff.
    """
    policy = roots.current()
    key = (settings.kubeconfig, settings.api_root, settings.namespace, stdlib)
    text = _read_kubeconfig(settings.kubeconfig)  # CNI error 7 when outside the kubeconfig roots or through a symlink
    digest = None if text is None else hashlib.sha256(text).hexdigest()
    with _cache_lock:
        cached = _cache.get(key)
        if cached is not None and cached[0] == digest:
            conn = cached[1]
        else:
            conn = (_connect_stdlib(settings, text) if stdlib else None) or _connect(settings)
            _cache[key] = (digest, conn)
    if settings.api_root:  # the node's credentials go to no server a NAD picks (docs/security.md)
        policy.check_api_root(settings.api_root, conn.server)
    if settings.namespace is not None:  # a NAD's choice; the credentials' own namespace is the node owner's
        policy.check_lease_namespace(settings.namespace)
    return conn


def _connect_stdlib(settings: KubeSettings, text: Optional[bytes]) -> Optional[Connection]:
    """A standard-library connection, or None when only the official client covers the kubeconfig."""
    from . import kube_credentials as kc

    namespace = settings.namespace
    if settings.kubeconfig:
        where = "ipam.kubernetes.kubeconfig"
        if text is None or not os.path.isfile(settings.kubeconfig):
            raise bad(where, f"{settings.kubeconfig} does not exist",
                      "create the kubeconfig (e.g. from a ServiceAccount token) or fix the path")
        try:
            endpoint = kc.from_kubeconfig(text, settings.kubeconfig, settings.timeout)
            if endpoint.exec_plugin is None:
                endpoint.ssl_context()  # a CA or client certificate that does not load is the kubeconfig's fault
        except kc.NotCovered:
            return None
        except kc.KubeconfigError as exc:
            raise bad(where, f"{settings.kubeconfig} is not a usable kubeconfig: {exc}",
                      "give a kubeconfig with a current-context, cluster server and credentials") from None
        if namespace is None and endpoint.namespace and _DNS_LABEL.match(endpoint.namespace):
            namespace = endpoint.namespace
    else:
        try:
            endpoint = kc.in_cluster()
        except kc.KubeconfigError as exc:
            raise CNIError(INVALID_CONFIG, f"invalid network config: ipam.kubernetes: no kubeconfig and no in-cluster config ({exc})",
                           'set "kubernetes": {"kubeconfig": "/path/to/kubeconfig"}, or run the plugin in a pod') from None
        if namespace is None:
            namespace = _sa_namespace()
    server = endpoint.server
    if settings.api_root:
        endpoint.server = settings.api_root.rstrip("/")
    return Connection(None, namespace or DEFAULT_NAMESPACE, settings.api_root.rstrip("/") if settings.api_root else None,
                      endpoint=endpoint, server=server)


def _sa_namespace() -> Optional[str]:
    try:
        with open(SA_NAMESPACE_FILE) as f:
            sa_ns = f.read().strip()
    except OSError:
        return None
    return sa_ns if _DNS_LABEL.match(sa_ns) else None


def _connect(settings: KubeSettings) -> Connection:
    from kubernetes import client, config  # ~300-400 ms: only ever imported for the Lease store
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    namespace = settings.namespace
    if settings.kubeconfig:
        where = "ipam.kubernetes.kubeconfig"
        if not os.path.isfile(settings.kubeconfig):
            raise bad(where, f"{settings.kubeconfig} does not exist",
                      "create the kubeconfig (e.g. from a ServiceAccount token) or fix the path")
        try:
            _, active = config.list_kube_config_contexts(config_file=settings.kubeconfig)
            config.load_kube_config(config_file=settings.kubeconfig, client_configuration=cfg, persist_config=False)
        except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
            raise bad(where, f"{settings.kubeconfig} is not a usable kubeconfig: {exc}",
                      "give a kubeconfig with a current-context, cluster server and credentials") from None
        except Exception as exc:  # yaml errors and the like
            raise bad(where, f"{settings.kubeconfig} cannot be read: {type(exc).__name__}: {exc}",
                      "give a valid YAML kubeconfig") from None
        if namespace is None and isinstance(active, dict):
            ctx_ns = (active.get("context") or {}).get("namespace")
            if isinstance(ctx_ns, str) and _DNS_LABEL.match(ctx_ns):
                namespace = ctx_ns
    else:
        try:
            config.load_incluster_config(client_configuration=cfg)
        except ConfigException as exc:
            raise CNIError(INVALID_CONFIG, f"invalid network config: ipam.kubernetes: no kubeconfig and no in-cluster config ({exc})",
                           'set "kubernetes": {"kubeconfig": "/path/to/kubeconfig"}, or run the plugin in a pod') from None
        if namespace is None:
            namespace = _sa_namespace()
    cfg.retries = False
    # k8s_api_root is applied per request (Connection.host): the kubeconfig loader's token-refresh
    # hook re-sets cfg.host from the kubeconfig before every request.
    return Connection(client.ApiClient(cfg), namespace or DEFAULT_NAMESPACE,
                      settings.api_root.rstrip("/") if settings.api_root else None, server=cfg.host)
