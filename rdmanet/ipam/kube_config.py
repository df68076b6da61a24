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
import logging
import math
import os
import re
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, CNIError
from rdmanet.cni.linux import roots

from .location import KUBERNETES, bad, config_path, ipam_block, store_kind

DEFAULT_NAMESPACE = "kube-system"
DEFAULT_TIMEOUT = 20.0
DEFAULT_REQUEST_TIMEOUT = 5.0
DEFAULT_GC_GRACE = 60.0
DEFAULT_BLOCK_RELEASE = 300.0
MAX_BLOCK_SIZE = 1 << 16
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # the pod's service account: token, ca.crt, namespace
KUBECONFIG_KEY = "ipam.kubernetes.kubeconfig"
KUBECONFIG_MAX_BYTES = 1 << 20
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
log = logging.getLogger("rdmanet.ipam")


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
    api_client: Any  # kubernetes.client.ApiClient
    namespace: str
    host: Optional[str] = None  # k8s_api_root: used instead of the kubeconfig's server
    server: str = ""  # the API server the credentials name (kubeconfig or in-cluster): k8s_api_root must match
    settings: Optional[KubeSettings] = None  # what the credentials are loaded again from (:meth:`renew`)
    _transport: Any = None
    _renew_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def transport(self) -> Any:
        """The store's Transport over this connection (one per connection: its keep-alive pool)."""
        if self._transport is None:
            from .store.kube_transport import ApiClientTransport

            self._transport = ApiClientTransport(self.api_client, self.host, renew=self.renew)
        return self._transport

    def renew(self, rejected: Any) -> Optional[Any]:
        """After the API server refused the credentials of API client ``rejected`` (401): load
        them again through the official loaders (a token file read again, an exec plugin asked
        again, the service account's token read again) and answer the API client that carries
        them, or None when they are the same (asking again cannot help). Concurrent callers
        share one reload; the connection keeps the new client, so later verbs use it."""
        with self._renew_lock:
            if self.api_client is not rejected:
                return self.api_client  # another request renewed them meanwhile
            if self.settings is None:
                return None
            try:
                fresh = _connect(self.settings)
            except CNIError as err:
                log.info("the Kubernetes credentials could not be loaded again: %s", err.msg)
                return None
            if _credentials(fresh.api_client.configuration) == _credentials(rejected.configuration):
                return None
            self.api_client = fresh.api_client
            return self.api_client


def _credentials(cfg: Any) -> tuple:
    return (dict(cfg.api_key), cfg.cert_file, cfg.key_file)


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


def connect(settings: KubeSettings) -> Connection:
    """A connection for the settings through the official ``kubernetes`` client, cached per
    process (a daemon reuses its connection pool). Its credentials come from the client's own
    loaders (``kubernetes.config``): tokens, token files, exec credential plugins, client
    certificates, CAs, the in-cluster service account.

    The connection is made anew when the kubeconfig's content changes (a rotated token or CA:
    install.sh's DaemonSet mode rewrites it by rename), and the old one is dropped from the cache;
    credentials the kubeconfig only points to (a token file, an exec plugin) are loaded again
    when the API server refuses them (:meth:`Connection.renew`). urllib3's own retries are off:
    the store retries with its own budget and backoff.
    """
    policy = roots.current()
    key = (settings.kubeconfig, settings.api_root, settings.namespace)
    text = _read_kubeconfig(settings.kubeconfig)  # CNI error 7 when outside the kubeconfig roots or through a symlink
    digest = None if text is None else hashlib.sha256(text).hexdigest()
    with _cache_lock:
        cached = _cache.get(key)
        if cached is not None and cached[0] == digest:
            conn = cached[1]
        else:
            conn = _connect(settings)
            _cache[key] = (digest, conn)
    if settings.api_root:  # the node's credentials go to no server a NAD picks (docs/security.md)
        policy.check_api_root(settings.api_root, conn.server)
    if settings.namespace is not None:  # a NAD's choice; the credentials' own namespace is the node owner's
        policy.check_lease_namespace(settings.namespace)
    return conn


def _sa_namespace() -> Optional[str]:
    try:
        with open(os.path.join(SA_DIR, "namespace")) as f:
            sa_ns = f.read().strip()
    except OSError:
        return None
    return sa_ns if _DNS_LABEL.match(sa_ns) else None


def _connect(settings: KubeSettings) -> Connection:
    from kubernetes import client  # ~200 ms of CPU: only ever imported for the Lease store

    cfg = client.Configuration()
    with _LoaderErrors() as errors:
        if settings.kubeconfig:
            namespace = _load_kubeconfig(settings, cfg)
        else:
            namespace = _load_in_cluster(settings, cfg)
    if errors.messages and not _credentials(cfg)[0] and not cfg.cert_file:
        # the loader logs what went wrong (an exec plugin that failed) and goes on without credentials
        raise CNIError(IO_FAILURE, f"no credentials for the Kubernetes API {cfg.host}: {errors.messages[-1]}",
                       "fix the kubeconfig's user (token, tokenFile, exec plugin) or what it relies on")
    _check_tls(settings, cfg)
    cfg.retries = False
    # k8s_api_root is applied per request (Connection.host): the kubeconfig loader's token-refresh
    # hook re-sets cfg.host from the kubeconfig before every request.
    return Connection(client.ApiClient(cfg), namespace or DEFAULT_NAMESPACE,
                      settings.api_root.rstrip("/") if settings.api_root else None, server=cfg.host, settings=settings)


def _load_kubeconfig(settings: KubeSettings, cfg: Any) -> Optional[str]:
    """Load the kubeconfig's current context into ``cfg``; its namespace (None: it names none)."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

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
    if settings.namespace is not None:
        return settings.namespace
    ctx_ns = (active.get("context") or {}).get("namespace") if isinstance(active, dict) else None
    return ctx_ns if isinstance(ctx_ns, str) and _DNS_LABEL.match(ctx_ns) else None


def _load_in_cluster(settings: KubeSettings, cfg: Any) -> Optional[str]:
    """Load the pod's service account into ``cfg`` (its token is read again every minute); its namespace."""
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    try:
        InClusterConfigLoader(token_filename=os.path.join(SA_DIR, "token"),
                              cert_filename=os.path.join(SA_DIR, "ca.crt")).load_and_set(cfg)
    except ConfigException as exc:
        raise CNIError(INVALID_CONFIG, f"invalid network config: ipam.kubernetes: no kubeconfig and no in-cluster config ({exc})",
                       'set "kubernetes": {"kubeconfig": "/path/to/kubeconfig"}, or run the plugin in a pod') from None
    return settings.namespace if settings.namespace is not None else _sa_namespace()


def _check_tls(settings: KubeSettings, cfg: Any) -> None:
    """A CA or client certificate that does not load is the kubeconfig's fault (error 7), not an
    unreachable server's: loaded once here, as urllib3 loads them for every connection (to the
    server requests go to: ``k8s_api_root`` when set)."""
    if not (settings.api_root or cfg.host).startswith("https://") or not (cfg.ssl_ca_cert or cfg.cert_file):
        return
    try:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        if cfg.cert_file:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    except (ssl.SSLError, OSError, ValueError) as exc:
        where = "ipam.kubernetes.kubeconfig" if settings.kubeconfig else "ipam.kubernetes"
        raise bad(where, f"{settings.kubeconfig or 'the in-cluster config'} is not a usable kubeconfig: "
                         f"the certificate authority or client certificate is not usable: {exc}",
                  "give a kubeconfig whose certificate-authority and client-certificate are PEM files or data") from None


class _LoaderErrors(logging.Handler):
    """The errors the ``kubernetes`` config loaders log (they log a failed exec credential plugin
    and go on without credentials) while this thread loads a configuration."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []
        self._thread = threading.get_ident()

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self._thread and f"{os.sep}kubernetes{os.sep}config{os.sep}" in record.pathname:
            self.messages.append(record.getMessage())

    def __enter__(self) -> "_LoaderErrors":
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        logging.getLogger().removeHandler(self)
