"""Where the API server is and how to authenticate to it, read from a kubeconfig (or the pod's
service account) without the ``kubernetes`` client, for the in-process Lease store.

The ``kubernetes`` client costs ~0.5 s of CPU to import; a plugin exec'd per call pays that on
every ADD and DEL. The in-process path reads the kubeconfig itself and talks HTTP through the
standard library (:mod:`rdmanet.ipam.store.http_transport`); the node daemon and the ``rdmanet`` CLI keep
the official client (:func:`rdmanet.ipam.kube_config.connect`). What is read, as the official client
(``kubernetes.config.load_kube_config``) reads it:

- ``current-context`` names the context; its ``cluster``, ``user`` and ``namespace``;
- cluster: ``server``; for an https server ``certificate-authority`` (a file, relative to the
  kubeconfig's directory) or ``certificate-authority-data`` (base64 PEM; data wins over file),
  ``insecure-skip-tls-verify``, ``tls-server-name``;
- user, the first that applies: ``token`` or ``tokenFile`` (re-read when the file changes: a
  rotated token is used by the next request); ``exec`` (a credential plugin,
  ``client.authentication.k8s.io/v1`` or ``v1beta1`` ExecCredential: its token, or its client
  certificate and key, kept until ``expirationTimestamp`` and asked again after a 401);
  ``username``/``password`` (basic auth); the client certificate ``client-certificate[-data]`` /
  ``client-key[-data]`` is presented whatever else applies.
- no kubeconfig: the in-cluster service account (KUBERNETES_SERVICE_HOST/PORT, the token file
  re-read when it changes, the ca.crt beside it).

A kubeconfig this module does not cover (an ``auth-provider`` such as oidc or gcp, a
``proxy-url``) raises :class:`NotCovered`: the caller uses the official client for it, so the auth
behaviour is never weaker. The kubeconfig itself lies under the node's kubeconfig roots (checked
by the caller, which passes its bytes); the files and the exec command it names are trusted as the
node owner's, as the official client trusts them.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Optional

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
EXEC_OUTPUT_MAX = 1 << 20


class KubeconfigError(Exception):
    """The kubeconfig cannot be used; the message names what is wrong in it."""


class CredentialError(Exception):
    """Credentials could not be obtained now (an exec plugin failed, a token file is unreadable)."""


class NotCovered(Exception):
    """The kubeconfig uses something only the official client implements (the message says what)."""


def parse(text: bytes) -> dict:
    """A kubeconfig's content as a dict (JSON is YAML: a JSON kubeconfig never needs the YAML parser)."""
    stripped = text.lstrip()
    doc: Any
    if stripped.startswith(b"{"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise KubeconfigError(f"not valid JSON: {exc}") from None
    else:
        import yaml  # PyYAML (a dependency of the kubernetes client); C loader when built with libyaml

        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        try:
            doc = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
        except yaml.YAMLError as exc:
            raise KubeconfigError(f"not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeconfigError("is not a kubeconfig (no mapping at the top)")
    return doc


def _named(doc: dict, section: str, name: Any) -> dict:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            body = entry.get(section[:-1])
            if not isinstance(body, dict):
                raise KubeconfigError(f"{section[:-1]} {name!r} has no {section[:-1]} map")
            return body
    raise KubeconfigError(f"{section[:-1]} {name!r} (named by the current context) is not in {section}")


def _path(base: str, value: Any, key: str) -> str:
    if not isinstance(value, str) or not value:
        raise KubeconfigError(f"{key} is not a file name")
    return os.path.normpath(os.path.join(base, value))


def _b64(value: Any, key: str) -> bytes:
    try:
        return base64.b64decode(value if isinstance(value, (str, bytes)) else "", validate=False)
    except ValueError as exc:
        raise KubeconfigError(f"{key} is not base64: {exc}") from None


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise KubeconfigError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None


def _expired(when: Optional[datetime]) -> bool:
    return when is not None and when <= datetime.now(timezone.utc)


def _rfc3339(text: Any) -> Optional[datetime]:
    if not isinstance(text, str) or not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


# -- credential sources -----------------------------------------------------------------------------

class TokenFile:
    """A bearer token in a file, read again whenever the file changed (rotation by rename or rewrite)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: Optional[tuple] = None
        self._token = ""
        self._lock = threading.Lock()

    def token(self) -> str:
        with self._lock:
            try:
                st = os.stat(self.path)
            except OSError as exc:
                raise CredentialError(f"token file {self.path} cannot be read: {exc.strerror or exc}") from None
            key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if key != self._seen:
                try:
                    with open(self.path, encoding="utf-8") as fh:
                        token = fh.read().strip()
                except (OSError, UnicodeDecodeError) as exc:
                    raise CredentialError(f"token file {self.path} cannot be read: {exc}") from None
                if not token:
                    raise CredentialError(f"token file {self.path} is empty")
                self._token, self._seen = token, key
            return self._token

    def forget(self) -> bool:
        with self._lock:
            self._seen = None  # a 401: read it again, it may have been rotated within one stat tick
        return True


@dataclass
class ExecResult:
    token: Optional[str] = None
    cert_pem: Optional[bytes] = None
    key_pem: Optional[bytes] = None
    expiry: Optional[datetime] = None


class ExecPlugin:
    """A kubeconfig ``exec`` credential plugin (ExecCredential v1 / v1beta1).

    Run on first use, its answer kept until its ``expirationTimestamp`` (none: for the process's
    life) and dropped after a 401, as client-go does; non-interactive (stdin closed, stderr kept
    for the error message); the kubeconfig's directory as working directory, the caller's
    environment plus the ``env`` entries, ``KUBERNETES_EXEC_INFO`` carrying the request (with the
    cluster when ``provideClusterInfo``)."""

    def __init__(self, spec: Any, base: str, cluster: Optional[dict], timeout: float) -> None:
        if not isinstance(spec, dict):
            raise KubeconfigError("users[].user.exec is not a map")
        command, api_version = spec.get("command"), spec.get("apiVersion")
        if not isinstance(command, str) or not command:
            raise KubeconfigError("users[].user.exec.command is missing")
        if api_version not in EXEC_API_VERSIONS:
            raise KubeconfigError(f"users[].user.exec.apiVersion {api_version!r} is not one of "
                                  f"{', '.join(EXEC_API_VERSIONS)}")
        args = spec.get("args") or []
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise KubeconfigError("users[].user.exec.args is not a list of strings")
        env = {}
        for item in spec.get("env") or []:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("value"), str):
                raise KubeconfigError("users[].user.exec.env entries need a name and a value (strings)")
            env[item["name"]] = item["value"]
        if spec.get("interactiveMode") == "Always":
            raise KubeconfigError("users[].user.exec.interactiveMode is Always: a CNI plugin has no terminal")
        self.argv = [command, *args]
        self.api_version = api_version
        self.extra_env = env
        self.cwd = base or None
        self.cluster = cluster if spec.get("provideClusterInfo") else None
        self.timeout = timeout
        self._result: Optional[ExecResult] = None
        self._lock = threading.Lock()

    def result(self) -> ExecResult:
        with self._lock:
            if self._result is None or _expired(self._result.expiry):
                self._result = self._run()
            return self._result

    def forget(self) -> bool:
        with self._lock:
            self._result = None
        return True

    def _run(self) -> ExecResult:
        import subprocess

        info: dict[str, Any] = {"apiVersion": self.api_version, "kind": "ExecCredential",
                                "spec": {"interactive": False}}
        if self.cluster is not None:
            info["spec"]["cluster"] = self.cluster
        env = {**os.environ, **self.extra_env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        name = self.argv[0]
        try:
            proc = subprocess.run(self.argv, stdin=subprocess.DEVNULL, capture_output=True, cwd=self.cwd, env=env,
                                  timeout=self.timeout, check=False)
        except subprocess.TimeoutExpired:
            raise CredentialError(f"exec credential plugin {name} did not answer within {self.timeout:g} s") from None
        except OSError as exc:
            raise CredentialError(f"exec credential plugin {name} cannot run: {exc.strerror or exc}") from None
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip()[-500:]
            raise CredentialError(f"exec credential plugin {name} exited with {proc.returncode}"
                                  + (f": {err}" if err else ""))
        try:
            doc = json.loads(proc.stdout[:EXEC_OUTPUT_MAX])
        except ValueError as exc:
            raise CredentialError(f"exec credential plugin {name} printed no ExecCredential JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential" or not isinstance(doc.get("status"), dict):
            raise CredentialError(f"exec credential plugin {name} printed no ExecCredential with a status")
        if doc.get("apiVersion") != self.api_version:
            raise CredentialError(f"exec credential plugin {name} answered apiVersion {doc.get('apiVersion')!r}, "
                                  f"the kubeconfig asks for {self.api_version}")
        status = doc["status"]
        out = ExecResult(expiry=_rfc3339(status.get("expirationTimestamp")))
        if isinstance(status.get("token"), str) and status["token"]:
            out.token = status["token"]
        elif isinstance(status.get("clientCertificateData"), str) and isinstance(status.get("clientKeyData"), str):
            out.cert_pem = status["clientCertificateData"].encode()
            out.key_pem = status["clientKeyData"].encode()
        else:
            raise CredentialError(f"exec credential plugin {name} gave neither a token nor clientCertificateData "
                                  "and clientKeyData")
        return out


# -- the endpoint -----------------------------------------------------------------------------------

@dataclass
class Endpoint:
    """The API server and the credentials for it. ``authorization()`` and ``ssl_context()`` may run
    a credential plugin or read a token file (:class:`CredentialError`); ``rejected()`` after a 401
    drops cached credentials and says whether asking again can help."""

    server: str  # scheme://host[:port][/prefix], no trailing slash
    namespace: Optional[str] = None  # the current context's namespace
    verify: bool = True
    ca_pem: Optional[bytes] = None
    ca_file: Optional[str] = None
    tls_server_name: Optional[str] = None
    cert: Optional[tuple[bytes, bytes]] = None  # (cert PEM, key PEM) from the kubeconfig
    cert_files: Optional[tuple[str, Optional[str]]] = None  # (certfile, keyfile) named by the kubeconfig
    token: Optional[str] = None
    token_file: Optional[TokenFile] = None
    basic: Optional[str] = None  # "Basic <base64>"
    exec_plugin: Optional[ExecPlugin] = None
    _ctx: Optional[ssl.SSLContext] = field(default=None, repr=False)
    _ctx_cert: Any = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def https(self) -> bool:
        return self.server.startswith("https://")

    def authorization(self) -> Optional[str]:
        if self.token:
            return f"Bearer {self.token}"
        if self.token_file is not None:
            return f"Bearer {self.token_file.token()}"
        if self.exec_plugin is not None:
            result = self.exec_plugin.result()
            if result.token:
                return f"Bearer {result.token}"
            return None
        return self.basic

    def rejected(self) -> bool:
        """A 401: forget what may be stale; True when the next request may carry other credentials."""
        if self.token_file is not None and not self.token:
            return self.token_file.forget()
        if self.exec_plugin is not None and not self.token and self.token_file is None:
            return self.exec_plugin.forget()
        return False

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        """The TLS context for an https server (None for http), rebuilt when an exec plugin's client
        certificate changed."""
        if not self.https:
            return None
        cert: Any = self.cert or self.cert_files
        if self.exec_plugin is not None and not self.token and self.token_file is None:
            result = self.exec_plugin.result()
            if result.cert_pem is not None:
                cert = (result.cert_pem, result.key_pem)
        with self._lock:
            if self._ctx is None or self._ctx_cert is not cert:
                self._ctx = self._build_context(cert)
                self._ctx_cert = cert
            return self._ctx

    def _build_context(self, cert: Any) -> ssl.SSLContext:
        try:
            return self._context_for(cert)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise KubeconfigError(f"the certificate authority or client certificate is not usable: {exc}") from None

    def _context_for(self, cert: Any) -> ssl.SSLContext:
        if self.ca_pem is not None or self.ca_file is not None:
            ctx = ssl.create_default_context(cafile=self.ca_file,
                                             cadata=self.ca_pem.decode("ascii", "replace") if self.ca_pem else None)
        else:
            ctx = ssl.create_default_context()
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if cert is not None:
            first, second = cert
            if isinstance(first, bytes):
                _load_pem_pair(ctx, first, second)
            else:
                ctx.load_cert_chain(first, second)
        return ctx


def _load_pem_pair(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: Optional[bytes]) -> None:
    """ssl loads a certificate and key from files only: a private directory, gone right after."""
    import tempfile  # here: only client certificates given as data need it (~1.5 ms of imports)

    with tempfile.TemporaryDirectory(prefix="rdmanet-kube-") as tmp:  # 0700
        cert_path = os.path.join(tmp, "cert.pem")
        key_path = os.path.join(tmp, "key.pem") if key_pem else None
        for path, data in ((cert_path, cert_pem), (key_path, key_pem)):
            if path is None:
                continue
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        try:
            ctx.load_cert_chain(cert_path, key_path)
        except ssl.SSLError as exc:
            raise KubeconfigError(f"the client certificate or key is not usable: {exc}") from None


def from_kubeconfig(text: bytes, path: str, timeout: float) -> Endpoint:
    """The endpoint the kubeconfig's current context names (``text``: the file's content, read
    by the caller; ``path``: where it lies, the base of relative file names)."""
    doc = parse(text)
    base = os.path.dirname(os.path.abspath(path))
    current = doc.get("current-context")
    if not isinstance(current, str) or not current:
        raise KubeconfigError("has no current-context")
    context = _named(doc, "contexts", current)
    cluster = _named(doc, "clusters", context.get("cluster"))
    user = _named(doc, "users", context.get("user")) if context.get("user") else {}
    if "proxy-url" in cluster:
        raise NotCovered("clusters[].cluster.proxy-url")
    if user.get("auth-provider"):
        raise NotCovered("users[].user.auth-provider")
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeconfigError(f"cluster {context.get('cluster')!r} has no http(s) server")
    namespace = context.get("namespace") if isinstance(context.get("namespace"), str) else None
    ep = Endpoint(server=server.rstrip("/"), namespace=namespace)
    if ep.https:
        if cluster.get("certificate-authority-data"):
            ep.ca_pem = _b64(cluster["certificate-authority-data"], "certificate-authority-data")
        elif cluster.get("certificate-authority"):
            ep.ca_file = _path(base, cluster["certificate-authority"], "certificate-authority")
            if not os.path.isfile(ep.ca_file):
                raise KubeconfigError(f"certificate-authority {ep.ca_file} does not exist")
        cert = key = None
        if user.get("client-certificate-data"):
            cert = _b64(user["client-certificate-data"], "client-certificate-data")
        elif user.get("client-certificate"):
            cert = _path(base, user["client-certificate"], "client-certificate")
        if user.get("client-key-data"):
            key = _b64(user["client-key-data"], "client-key-data")
        elif user.get("client-key"):
            key = _path(base, user["client-key"], "client-key")
        if cert is not None:
            if isinstance(cert, str) and isinstance(key, bytes):
                cert = _read(cert, "client-certificate")
            if isinstance(cert, bytes) and isinstance(key, str):
                key = _read(key, "client-key")
            if isinstance(cert, bytes):
                ep.cert = (cert, key)
            else:
                for f in (cert, key):
                    if f is not None and not os.path.isfile(f):
                        raise KubeconfigError(f"client certificate file {f} does not exist")
                ep.cert_files = (cert, key)
    if "insecure-skip-tls-verify" in cluster:
        ep.verify = not cluster["insecure-skip-tls-verify"]
    if isinstance(cluster.get("tls-server-name"), str) and cluster["tls-server-name"]:
        ep.tls_server_name = cluster["tls-server-name"]
    # the user's credentials, in the official client's order (auth-provider is NotCovered above)
    if user.get("token"):
        ep.token = str(user["token"]).strip()
    elif user.get("tokenFile"):
        ep.token_file = TokenFile(_path(base, user["tokenFile"], "tokenFile"))
    elif user.get("exec"):
        ep.exec_plugin = ExecPlugin(user["exec"], base, _exec_cluster(cluster, base), timeout)
    elif "username" in user and "password" in user:
        pair = f"{user['username']}:{user['password']}".encode()
        ep.basic = "Basic " + base64.b64encode(pair).decode("ascii")
    if ep.cert is not None and ep.cert[0] is not None:
        _check_pem(ep.cert[0], "client-certificate-data")
    return ep


def _check_pem(data: bytes, key: str) -> None:
    if b"-----BEGIN" not in data:
        raise KubeconfigError(f"{key} is not a base64-encoded PEM certificate")


def _exec_cluster(cluster: dict, base: str) -> dict:
    """The cluster as ExecCredential's ``spec.cluster`` carries it (the CA as data)."""
    out: dict[str, Any] = {"server": cluster.get("server")}
    for key in ("tls-server-name", "insecure-skip-tls-verify", "disable-compression"):
        if key in cluster:
            out[key] = cluster[key]
    if cluster.get("certificate-authority-data"):
        out["certificate-authority-data"] = cluster["certificate-authority-data"]
    elif cluster.get("certificate-authority"):
        try:
            pem = _read(_path(base, cluster["certificate-authority"], "certificate-authority"), "certificate-authority")
            out["certificate-authority-data"] = base64.b64encode(pem).decode("ascii")
        except KubeconfigError:
            pass
    for ext in cluster.get("extensions") or []:
        if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
            out["config"] = ext.get("extension")
    return out


def in_cluster(sa_dir: str = SA_DIR) -> Endpoint:
    """The pod's service account, as ``load_incluster_config`` reads it."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeconfigError("service host/port is not set (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT)")
    token, ca = os.path.join(sa_dir, "token"), os.path.join(sa_dir, "ca.crt")
    if not os.path.isfile(token):
        raise KubeconfigError(f"service token file {token} does not exist")
    if not os.path.isfile(ca):
        raise KubeconfigError(f"service certification file {ca} does not exist")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    tf = TokenFile(token)
    try:
        tf.token()
    except CredentialError as exc:
        raise KubeconfigError(str(exc)) from None
    return Endpoint(server=f"https://{host}:{port}", ca_file=ca, token_file=tf)
