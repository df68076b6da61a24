"""The Lease store's :class:`~rdmanet.ipam.store.kube.Transport` over the standard library's ``http.client``.

The in-process path (a plugin exec'd per call, no daemon) uses it instead of the ``kubernetes``
client, whose import alone costs ~0.5 s of CPU per call; the endpoint and credentials come from
:mod:`rdmanet.ipam.kube_credentials`. One keep-alive connection is reused across a verb's requests (a
List and a create are one TLS handshake), an idle one that the server closed is never reused, and
every request carries the current credentials (a rotated token file is read again; an exec
plugin's expired answer is asked again). A 401 drops cached credentials and the request is sent
once more when fresh ones can differ (client-go does the same for exec plugins). No retries
otherwise: the store retries with its own budget and backoff.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
from typing import Any, Optional, Sequence
from urllib.parse import quote, urlencode, urlsplit

from rdmanet.cni.core.errors import IO_FAILURE, CNIError

from ..kube_credentials import CredentialError, Endpoint, KubeconfigError
from .kube_transport import Response, Transport, Unreachable, WatchStream

USER_AGENT = "rdmanet-lease-ipam"
WATCH_CONNECT_TIMEOUT = 10.0


class _HTTPSConnection(http.client.HTTPSConnection):
    """HTTPS with the SNI / certificate name the kubeconfig may set (``tls-server-name``)."""

    def __init__(self, host: str, port: Optional[int], *, context: Any, server_name: Optional[str],
                 timeout: float) -> None:
        super().__init__(host, port, context=context, timeout=timeout)
        self._context_ = context
        self._server_name = server_name or host

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context_.wrap_socket(self.sock, server_hostname=self._server_name)


class HTTPTransport(Transport):
    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.host = endpoint.server
        url = urlsplit(endpoint.server)
        self._scheme = url.scheme
        self._hostname = url.hostname or ""
        self._port = url.port
        self._prefix = url.path.rstrip("/")
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    # -- connections ------------------------------------------------------------------------------

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return _HTTPSConnection(self._hostname, self._port, context=self.endpoint.ssl_context(),
                                    server_name=self.endpoint.tls_server_name, timeout=timeout)
        return http.client.HTTPConnection(self._hostname, self._port, timeout=timeout)

    def _take(self, timeout: float) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._new(timeout)
            if _usable(conn):
                conn.sock.settimeout(timeout)  # type: ignore[union-attr]
                conn.timeout = timeout
                return conn
            conn.close()

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < 4:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    # -- requests ---------------------------------------------------------------------------------

    def _target(self, path: str, query: Sequence[tuple[str, str]]) -> str:
        return self._prefix + path + ("?" + urlencode(list(query), quote_via=quote) if query else "")

    def _headers(self, accept_body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if accept_body:
            headers["Content-Type"] = "application/json"
        try:
            auth = self.endpoint.authorization()
        except CredentialError as exc:
            raise CNIError(IO_FAILURE, f"no credentials for the Kubernetes API {self.host}: {exc}",
                           "fix the kubeconfig's user (token, tokenFile, exec plugin) or what it relies on") from None
        if auth:
            headers["Authorization"] = auth
        return headers

    def _send(self, method: str, target: str, body: Optional[bytes], timeout: float
              ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = None
        try:
            headers = self._headers(body is not None)
            conn = self._take(timeout)
            conn.request(method, target, body=body, headers=headers)
            return conn, conn.getresponse()
        except (CredentialError, KubeconfigError) as exc:  # a client certificate from an exec plugin
            if conn is not None:
                conn.close()
            raise CNIError(IO_FAILURE, f"no credentials for the Kubernetes API {self.host}: {exc}",
                           "fix the kubeconfig's user (token, tokenFile, exec plugin) or what it relies on") from None
        except (OSError, http.client.HTTPException) as exc:
            if conn is not None:
                conn.close()
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None

    def request(self, method: str, path: str, query: Sequence[tuple[str, str]], body: Any,
                timeout: float) -> Response:
        data = json.dumps(body).encode() if body is not None else None
        target = self._target(path, query)
        for attempt in (0, 1):
            conn, resp = self._send(method, target, data, timeout)
            try:
                raw = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                raise Unreachable(f"{type(exc).__name__}: {exc}") from None
            if resp.will_close:
                conn.close()
            else:
                self._give_back(conn)
            if resp.status == 401 and attempt == 0 and self.endpoint.rejected():
                continue  # a rotated token file or an exec plugin's revoked token: once more, fresh
            try:
                doc = json.loads(raw) if raw else None
            except ValueError:
                doc = None
            return Response(resp.status, doc, resp.headers)
        raise AssertionError("unreachable")  # pragma: no cover

    def watch(self, path: str, query: Sequence[tuple[str, str]], timeout: float) -> WatchStream:
        conn, resp = self._send("GET", self._target(path, query), None, min(timeout, WATCH_CONNECT_TIMEOUT))
        if resp.status != 200:
            try:
                raw = resp.read()
                doc = json.loads(raw) if raw else None
            except (ValueError, OSError, http.client.HTTPException):
                doc = None
            conn.close()
            return WatchStream(resp.status, doc)
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return _HTTPWatchStream(conn, resp)


def _usable(conn: http.client.HTTPConnection) -> bool:
    """An idle keep-alive connection the server has not closed (nothing readable: no EOF, no stray bytes)."""
    sock = conn.sock
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


class _HTTPWatchStream(WatchStream):
    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        super().__init__(200)
        self.conn = conn
        self.resp = resp

    def events(self):
        while True:
            line = self.resp.readline()
            if not line:
                return
            if line.strip():
                yield json.loads(line)

    def abort(self) -> None:
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked in another thread
            except OSError:
                pass

    def close(self) -> None:
        self.conn.close()  # a half-read stream is never reused
