"""How the Lease store talks to the API server: the :class:`Transport` interface (a request, a
watch stream), and its implementation over the official ``kubernetes`` client's ApiClient.
"""

from __future__ import annotations

import json
import logging
import socket
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence

from .. import telemetry

log = logging.getLogger("rdmanet.ipam")


class Response(NamedTuple):
    status: int
    doc: Any
    headers: Mapping[str, str]


class Unreachable(Exception):
    """No HTTP answer: connection refused/reset, timeout, TLS failure."""


class WatchStream:
    """An open watch request. ``status`` (and ``doc``, the error body, when it is not 200);
    ``events()`` yields the decoded JSON lines of a 200 answer and raises when the stream
    breaks; ``abort()``, from any thread, ends a blocked read; ``close()`` releases it."""

    def __init__(self, status: int, doc: Any = None) -> None:
        self.status = status
        self.doc = doc

    def events(self) -> Iterator[Any]:
        return iter(())

    def socket(self) -> Optional[socket.socket]:
        """The connection's socket, when the transport has one (see :func:`keep_alive`)."""
        return None

    def abort(self) -> None:
        pass

    def close(self) -> None:
        pass


KEEPALIVE_IDLE = 5  # seconds of silence on a watch connection before the kernel probes the peer
KEEPALIVE_INTERVAL = 2
KEEPALIVE_PROBES = 3  # unanswered probes before the connection is dead: 5 + 2 x 3 = 11 s
USER_TIMEOUT_MS = 15000  # data sent but not acknowledged this long: dead too


def keep_alive(sock: Optional[socket.socket]) -> None:
    """TCP keepalive on a watch connection, short: a watch is quiet for minutes when nothing
    changes, so without it a peer gone silently (a partition, a dead host or load balancer that
    sends no FIN/RST) would only be noticed at the watch's read timeout (minutes). Every
    :class:`Transport` that opens watches sets this on the watch's socket."""
    if sock is None:
        return
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES), ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, opt, value in options:
        try:
            sock.setsockopt(level, opt, value)
        except OSError as exc:  # e.g. a TLS-wrapped or non-TCP socket without the option
            log.debug("cannot set socket option %s on a watch connection: %s", opt, exc)


class Transport:
    """One HTTP request to the API server; the store does the retrying."""

    host = ""

    def request(self, method: str, path: str, query: Sequence[tuple[str, str]], body: Any,
                timeout: float) -> Response:
        raise NotImplementedError

    def watch(self, path: str, query: Sequence[tuple[str, str]], timeout: float) -> WatchStream:
        """Open a watch (``query`` carries ``watch=true``); ``timeout`` bounds each read."""
        raise NotImplementedError


class ApiClientTransport(Transport):
    """Requests through the ``kubernetes`` client's ApiClient (auth, TLS, token refresh, pool).

    The generated typed methods are bypassed: they validate and deserialise every Lease into
    model objects, which costs more than the JSON itself, and they hide the status code.
    """

    def __init__(self, api_client: Any, host: Optional[str] = None,
                 renew: Optional[Callable[[Any], Optional[Any]]] = None) -> None:
        import urllib3

        from kubernetes.client.exceptions import ApiException

        self.api = api_client
        self.override = host
        self.host = host or api_client.configuration.host
        self.renew = renew  # after a 401: the API client with credentials loaded again (None: unchanged)
        self._errors = (urllib3.exceptions.HTTPError, OSError, ApiException)

    def _send(self, method: str, path: str, query: Sequence[tuple[str, str]], headers: dict, body: Any,
              timeout: tuple[float, float], what: str) -> Any:
        """The ApiClient's answer, its body not read yet; a 401 is asked once more with credentials
        loaded again when they changed (a rotated token file, an exec plugin's new token): no
        restart needed."""
        for attempt in (0, 1):
            api = self.api
            try:
                req = api.param_serialize(method, path, query_params=list(query), header_params=headers,
                                          body=body, auth_settings=["BearerToken"], _host=self.override)
                resp = api.call_api(*_trimmed(req), _request_timeout=timeout)
            except self._errors as exc:
                telemetry.api_request(what, None)
                raise Unreachable(f"{type(exc).__name__}: {exc}") from None
            if resp.status != 401 or attempt or self.renew is None:
                return resp
            fresh = self.renew(api)
            if fresh is None:
                return resp
            telemetry.api_request(what, resp.status)
            try:
                resp.read()  # the refusal's body: the connection goes back to the pool
            except self._errors:
                pass
            self.api = fresh
        raise AssertionError("unreachable")  # pragma: no cover

    def request(self, method: str, path: str, query: Sequence[tuple[str, str]], body: Any,
                timeout: float) -> Response:
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        resp = self._send(method, path, query, headers, body, (timeout, timeout), method)
        try:
            data = resp.read()
        except self._errors as exc:
            telemetry.api_request(method, None)
            raise Unreachable(f"{type(exc).__name__}: {exc}") from None
        telemetry.api_request(method, resp.status)
        try:
            doc = json.loads(data) if data else None
        except ValueError:
            doc = None
        return Response(resp.status, doc, resp.headers or {})

    def watch(self, path: str, query: Sequence[tuple[str, str]], timeout: float) -> WatchStream:
        headers = {"Accept": "application/json"}
        resp = self._send("GET", path, query, headers, None, (min(timeout, 10.0), timeout), "WATCH")
        telemetry.api_request("WATCH", resp.status)
        raw = resp.response  # urllib3's response, not read yet (the client never preloads)
        if resp.status == 200:
            stream = _Urllib3WatchStream(raw)
            keep_alive(stream.socket())
            return stream
        try:
            data = raw.read()
            doc = json.loads(data) if data else None
        except (ValueError, *self._errors):
            doc = None
        raw.release_conn()
        return WatchStream(resp.status, doc)


def _trimmed(req: tuple) -> tuple:
    """``param_serialize``'s request with its Authorization value trimmed: the client sends a
    token file's trailing newline as it read it, which is no valid header (client-go trims it)."""
    headers = req[2] if len(req) > 2 else None
    if isinstance(headers, dict) and isinstance(headers.get("authorization"), str):
        headers["authorization"] = headers["authorization"].strip()
    return req


class _Urllib3WatchStream(WatchStream):
    def __init__(self, raw: Any) -> None:
        super().__init__(200)
        self.raw = raw
        self._closed = False

    def events(self) -> Iterator[Any]:
        raw = self.raw
        chunks = raw.stream(amt=None) if raw.chunked else iter(lambda: raw.read1(65536), b"")
        buf = b""
        for chunk in chunks:
            buf += chunk
            while True:
                end = buf.find(b"\n")
                if end < 0:
                    break
                line, buf = buf[:end], buf[end + 1:]
                if line.strip():
                    yield json.loads(line)
        if buf.strip():
            yield json.loads(buf)

    def socket(self) -> Optional[socket.socket]:
        return getattr(getattr(self.raw, "_connection", None), "sock", None)

    def abort(self) -> None:
        try:
            self.raw.shutdown()  # wakes a read blocked in another thread
            return
        except Exception:  # noqa: BLE001 - already closed or released, or an older urllib3
            pass
        sock = getattr(getattr(self.raw, "_connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for step in (self.raw.close, self.raw.release_conn):  # a half-read stream is never reused
            try:
                step()
            except Exception:  # noqa: BLE001
                pass
