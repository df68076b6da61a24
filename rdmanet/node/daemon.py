"""The node daemon: serves the shims' CNI calls from one warm process.

It keeps the plugin modules, pyroute2 and pydantic imported and answers each request (see
:mod:`rdmanet.node.launcher` for the protocol) by running :func:`rdmanet.cni.core.skel.handle` in a thread of its
own, printing exactly what the in-process run would print (``skel.render``) with the same exit code.

- Socket: 0600 (its directory, when the daemon creates it, 0700; a directory others may write
  is refused: :mod:`rdmanet.node.socket_dir`); peers other than root (SO_PEERCRED) are
  disconnected without an answer, and the shims send nothing to a server other than root. Under systemd (install.sh's ``rdmanet.socket``)
  the socket is passed in (LISTEN_FDS/LISTEN_PID, :mod:`rdmanet.node.socket_activation`): systemd binds it
  (SocketMode=0600, DirectoryMode=0700), the first call starts the daemon, and the peer check is
  the same.
- Per request: the call's environment is its own (:mod:`rdmanet.cni.core.env`), and what the plugins log
  or print on stderr goes into that request's answer, never into another's (a contextvar-routed
  ``sys.stderr``). Network namespaces are entered per thread and always left (rdmanet.cni.linux.netns).
- lease-ipam as ``ipam.type`` runs in-process (``ipam_exec.IN_PROCESS_PLUGINS``), not by exec.
- Two framings (:mod:`rdmanet.node.launcher`): CNI calls in the shims' binary one, and one JSON
  line for tools (health). A call of another protocol version is declined ("exec"): a shim with
  a fallback runs it itself, a daemon-only shim answers 11 until both sides match.
- The call's environment is the runtime's (forwarded by the shim); :data:`DAEMON_DEFAULTS` come
  from the daemon's own environment when the call lacks them (in a DaemonSet, the node name the
  downward API gives the pod).
- SIGTERM/SIGINT: remove the socket (new calls find no daemon: shims with a fallback run them
  in-process, daemon-only shims answer 11 and the runtime retries), stop accepting, serve the
  connections already queued, finish the requests in flight, exit 0. A socket the daemon did not
  bind (systemd's, or one bound at the path since) is never removed: under systemd new calls wait
  in the socket's queue until systemd starts the daemon again.
- The daemon's own logs: one JSON object per line on stderr; one ``call`` line per CNI call, with
  the CNI error's code and message when it failed (:mod:`rdmanet.node.call_record`).

Resource bounds (a burst of pod starts, or a misbehaving caller, must not take the node's CNI
down with it):

- A fixed pool of ``--workers`` threads (default :data:`WORKERS`) serves the calls; up to
  :data:`QUEUED` accepted connections wait for one, the rest wait in the listen backlog (the
  shims retry a full backlog for a while), so threads and fds are bounded whatever the burst.
- Memory stays flat: a call goes to the worker that went idle last (:mod:`rdmanet.node.workers`), so
  calls one at a time keep one thread warm instead of every worker's malloc cache and stack in
  turn; glibc arenas bounded, free memory given back when idle (:mod:`rdmanet.node.memory`).
- RLIMIT_NOFILE is raised to its hard limit at start (systemd and containerd give services a soft
  1024; a host-device ADD holds about 12 fds). A call that still runs out of fds or memory
  answers CNI error 11 (try again later), not 999.
- A request must arrive whole within :data:`READ_SECONDS` of its worker picking it up, and within
  :data:`MAX_ENV` / :data:`MAX_STDIN` bytes (a larger one is answered with a CNI error naming
  the limit), its first line within :data:`MAX_LINE`; otherwise the connection is closed.
- Every call has a deadline (``--call-timeout``, default ``rdmanet.cni.core.deadline.DEFAULT_SECONDS``,
  counted from the accept, well below a runtime's) and knows when its caller hung up (the shim
  was killed: the connection closed): lock waits and IPAM execs end there, and an ADD stops at
  its next step and undoes what it did (rdmanet.cni.core.deadline).
"""

from __future__ import annotations

import contextvars
import errno
import io
import json
import logging
import os
import resource
import select
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional

from rdmanet.cni.core import deadline as call_deadline
from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import INVALID_CONFIG, INVALID_ENVIRONMENT, CNIError
from rdmanet.cni.core import log_levels
from rdmanet.ipam import node_gc

from . import del_journal, memory, socket_activation
from .call_record import CallRecord
from .socket_dir import unsafe_socket_dir
from .workers import WorkerPool

from .launcher import DEFAULT_SOCKET, LATEST, PLUGINS, PROTOCOL, DaemonLost, NoDaemon, exchange

# Variables a call gets from the daemon's environment when its own lacks them.
DAEMON_DEFAULTS = ("RDMANET_NODE_NAME",)

WORKERS = 32  # calls served at once
# The daemon's nice value (raise_priority). A burst of pod starts is ~100 shim processes starting
# at once; at nice 0 the scheduler gives each of them the daemon's share, so the daemon got to
# the calls of the first ones only as the last ones were still starting (100 concurrent ADDs on
# 2 cores, measured: a call waited ~150-380 ms in the daemon at 0, ~35-90 at -10, ~20-30 at -20,
# for ~3 ms of work). Its work is GIL-bound (at most one core) and short, so a higher priority
# only brings it forward.
NICE = -10
QUEUED = 64  # accepted connections waiting for a worker (more wait in the listen backlog)
READ_SECONDS = 10.0  # a whole request, from the moment a worker reads it
MAX_ENV = 1 << 20  # a process environment is far smaller (ARG_MAX counts arguments and environment)
MAX_STDIN = 4 << 20  # network configurations are kilobytes; a prevResult adds little
MAX_LINE = 64 << 10  # a request's first line: the binary framing's head, or a tool's JSON request
NOFILE_CAP = 1 << 20

_LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"  # = skel.configure_logging
# Libraries whose DEBUG chatter a request's RDMANET_LOG_LEVEL=DEBUG does not get from the daemon
# (in-process it does): pyroute2 logs several DEBUG lines per netlink message, and the root
# logger has to stay at DEBUG here for the requests that ask for it, so each line would be built.
QUIET_LIBRARIES = ("pyroute2", "asyncio")

_real_stderr = sys.__stderr__


# --------------------------------------------------------------------------- logging


def log_event(event: str, level: str = "info", **fields: Any) -> None:
    """One structured line on the daemon's own stderr."""
    doc = {"ts": round(time.time(), 3), "level": level, "event": event, **fields}
    try:
        _real_stderr.write(json.dumps(doc, default=str) + "\n")
        _real_stderr.flush()
    except (OSError, ValueError):
        pass


class _Capture:
    """What one request writes to stderr, and the log level its RDMANET_LOG_LEVEL asks for."""

    def __init__(self, level: int) -> None:
        self.level = level
        self.buffer = io.StringIO()


_capture: contextvars.ContextVar[Optional[_Capture]] = contextvars.ContextVar("rdmanet_stderr_capture", default=None)


class _RoutedStderr(io.TextIOBase):
    """``sys.stderr`` of the daemon: inside a request, that request's buffer; else the real one."""

    def write(self, text: str) -> int:
        cap = _capture.get()
        if cap is not None:
            return cap.buffer.write(text)
        return _real_stderr.write(text)

    def flush(self) -> None:
        if _capture.get() is None:
            _real_stderr.flush()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"


class _RequestLevel(logging.Filter):
    """Outside a request: WARNING and up (to the daemon's stderr); inside: the request's level."""

    def filter(self, record: logging.LogRecord) -> bool:
        cap = _capture.get()
        return record.levelno >= (logging.WARNING if cap is None else cap.level)


class _NodeEvents(logging.Handler):
    """Records of ``rdmanet.node`` (what the node policy refused or ignored, rdmanet.cni.linux.roots)
    also go to the daemon's own log, whatever the request's level: the node owner sees them."""

    def emit(self, record: logging.LogRecord) -> None:
        log_event("node_policy", record.levelname.lower(), message=record.getMessage())




def _install_logging() -> None:
    sys.stderr = _RoutedStderr()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    handler.addFilter(_RequestLevel())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    log_levels.root.set_base(logging.WARNING)  # the daemon's own log; a request that asks for less holds it lower
    for library in QUIET_LIBRARIES:  # their DEBUG records would be made (and dropped) on every request
        logging.getLogger(library).setLevel(logging.INFO)
    node = logging.getLogger("rdmanet.node")
    node_events = _NodeEvents(logging.WARNING)
    node.handlers = [h for h in node.handlers if not isinstance(h, _NodeEvents)] + [node_events]


def _level_of(env: Mapping[str, str]) -> int:
    return getattr(logging, env.get("RDMANET_LOG_LEVEL", "WARNING").upper(), logging.WARNING)


# --------------------------------------------------------------------------- plugins


def load_plugins() -> dict[str, Any]:
    """Import every plugin (and with them pyroute2, pydantic)."""
    plugins = {}
    for name, (module, cls) in PLUGINS.items():
        plugins[name] = getattr(__import__(module, fromlist=[cls]), cls)
    import pydantic  # noqa: F401  (warm)
    import pyroute2  # noqa: F401

    import rdmanet.ipam.reconcile  # noqa: F401  (node_gc's first round would import it minutes in: memory settles at start)
    from rdmanet.ipam.store.kube import use_watch_cache

    use_watch_cache(True)  # Lease watch cache per domain, started on a domain's first ADD/DEL: daemon only
    from rdmanet.cni.linux.link_delete import finish_in_background

    finish_in_background(True)  # a DEL answers once its link is unlisted; the kernel frees it meanwhile
    warm_up()
    return plugins


def warm_up() -> None:
    """Import what the verbs import on first use (the config modules, the local store) and build
    every config model now: models build on their first validation (``defer_build``, which spares
    an in-process call the models it does not use), so the first calls after a start would pay
    the builds, ~20 ms between them, on top of their own work."""
    import rdmanet.plugins.host_device_rdma.config  # noqa: F401
    import rdmanet.plugins.ipoib_rdma.config  # noqa: F401
    import rdmanet.plugins.macvlan_rdma.config  # noqa: F401
    import rdmanet.ipam.config  # noqa: F401
    import rdmanet.ipam.store.local  # noqa: F401
    from rdmanet.cni.core.netconf import Model

    models, seen = [Model], set()
    while models:
        for model in models.pop().__subclasses__():
            if model not in seen:
                seen.add(model)
                model.model_rebuild()
                models.append(model)


def call_env(env: Mapping[str, str], daemon_env: Mapping[str, str]) -> dict[str, str]:
    """The call's environment, completed with :data:`DAEMON_DEFAULTS` from the daemon's own."""
    defaults = {key: daemon_env[key] for key in DAEMON_DEFAULTS if key in daemon_env}
    return {**defaults, **env}


def run_call(plugins: Mapping[str, Any], plugin: str, env: Mapping[str, str], stdin: bytes,
             deadline: Optional[call_deadline.Deadline] = None) -> tuple[int, Any, bytes]:
    """One CNI call: (exit code, the document it prints, stderr)."""
    cap = _Capture(_level_of(env))
    token = _capture.set(cap)
    try:
        with log_levels.root.hold(cap.level):
            code, document = skel.handle(plugins[plugin](), env, stdin, deadline)
    finally:
        _capture.reset(token)
    return code, document, cap.buffer.getvalue().encode("utf-8", "surrogateescape")


def serve_call(plugins: Mapping[str, Any], plugin: str, env: Mapping[str, str], stdin: bytes,
               deadline: Optional[call_deadline.Deadline] = None) -> tuple[int, bytes, bytes]:
    """One CNI call: (exit code, stdout, stderr), what the in-process run would give."""
    code, document, err = run_call(plugins, plugin, env, stdin, deadline)
    return code, skel.render(document).encode(), err


# --------------------------------------------------------------------------- server


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class BadRequest(ValueError):
    """Unreadable request: the connection is closed without an answer (the shim runs the call
    itself, or answers 11 on ADD)."""


class TooLarge(ValueError):
    """A request over a size cap: answered with a CNI error, its body read and dropped."""

    def __init__(self, error: CNIError, pending: int) -> None:
        super().__init__(error.msg)
        self.error, self.pending = error, pending


class Reader:
    """Reads one request from a connection; the whole request must come within ``seconds``."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self.sock, self.until, self.buffer = sock, time.monotonic() + seconds, b""

    def _recv(self, size: int) -> bytes:
        left = self.until - time.monotonic()
        if left <= 0:
            raise BadRequest(f"the request did not arrive within {READ_SECONDS:g} s")
        self.sock.settimeout(left)
        try:
            return self.sock.recv(size)
        except socket.timeout:
            raise BadRequest(f"the request did not arrive within {READ_SECONDS:g} s") from None

    def readline(self, limit: int) -> bytes:
        """One line with its newline; b"" (or a line without newline) at EOF; BadRequest past ``limit``."""
        while b"\n" not in self.buffer:
            if len(self.buffer) > limit:
                raise BadRequest(f"a request line longer than {limit} bytes")
            chunk = self._recv(65536)
            if not chunk:
                line, self.buffer = self.buffer, b""
                return line
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        if len(line) > limit:
            raise BadRequest(f"a request line longer than {limit} bytes")
        return line + b"\n"

    def read(self, size: int) -> bytes:
        chunks, have = [self.buffer[:size]], min(len(self.buffer), size)
        self.buffer = self.buffer[size:]
        while have < size:
            chunk = self._recv(min(size - have, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            have += len(chunk)
        return b"".join(chunks)

    def discard(self, size: int) -> None:
        """Read and drop ``size`` bytes (the body of a refused request), as far as they come in time."""
        size -= len(self.buffer[:size])
        self.buffer = b""
        try:
            while size > 0:
                chunk = self._recv(min(size, 1 << 16))
                if not chunk:
                    return
                size -= len(chunk)
        except BadRequest:
            return


def parse_binary(line: bytes, rfile: Any) -> tuple[int, str, dict[str, str], bytes]:
    """The binary framing's request after its first line: (protocol, plugin, env, stdin)."""
    try:
        _, version, plugin, n_env, n_stdin = line.decode("ascii").split()
        n_env, n_stdin = int(n_env), int(n_stdin)
    except ValueError:
        raise BadRequest(f"unreadable request line {line[:80]!r}") from None
    if n_env < 0 or n_stdin < 0:
        raise BadRequest(f"unreadable request line {line[:80]!r}")
    if n_env > MAX_ENV:
        raise TooLarge(CNIError(INVALID_ENVIRONMENT, f"the call's environment is {n_env} bytes, more than the {MAX_ENV} "
                                "the rdmanet daemon accepts", "call the plugin with a smaller environment"), n_env + n_stdin)
    if n_stdin > MAX_STDIN:
        raise TooLarge(CNIError(INVALID_CONFIG, f"the network configuration on stdin is {n_stdin} bytes, more than the "
                                f"{MAX_STDIN} the rdmanet daemon accepts", "shorten the network configuration"),
                       n_env + n_stdin)
    body = rfile.read(n_env + n_stdin)
    if len(body) != n_env + n_stdin:
        raise BadRequest("request cut short")
    env = {}
    for entry in filter(None, body[:n_env].split(b"\0")):
        key, _, value = entry.partition(b"=")
        env[os.fsdecode(key)] = os.fsdecode(value)  # as os.environ decodes them
    return int(version) if version.isdigit() else -1, plugin, env, body[n_env:]


def caller_gone(sock: socket.socket) -> bool:
    """Whether the caller closed its end (the shim was killed): it sends nothing after its request."""
    try:
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN | select.POLLRDHUP)
        events = poller.poll(0)
    except (OSError, ValueError):
        return True
    for _, event in events:
        if event & (select.POLLHUP | select.POLLRDHUP | select.POLLERR | select.POLLNVAL):
            return True
        if event & select.POLLIN:
            try:
                return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                return False
            except OSError:
                return True
    return False


class _Handler(socketserver.BaseRequestHandler):
    server: "DaemonServer"

    def handle(self) -> None:
        srv = self.server
        started = srv.accepted_at()
        reader = Reader(self.request, READ_SECONDS)
        try:
            line = reader.readline(MAX_LINE)
            if not line.endswith(b"\n"):
                return  # EOF: nothing to answer
            self.deadline = call_deadline.Deadline(started + srv.call_timeout, lambda: caller_gone(self.request))
            if line.startswith(b"RDMANET "):
                answer = self._binary(*parse_binary(line, reader), started)
            else:
                answer = json.dumps(self._health(json.loads(line))).encode() + b"\n"
        except TooLarge as refused:
            log_event("request_too_large", "warning", error=refused.error.msg)
            out = (json.dumps(refused.error.to_dict(LATEST)) + "\n").encode()
            self._answer(b"1 %d 0\n" % len(out) + out)
            reader.discard(refused.pending)  # the shim sends its whole request before it reads the answer
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log_event("bad_request", "warning", error=f"{type(exc).__name__}: {exc}")
            return
        self._answer(answer)

    def _answer(self, answer: bytes) -> None:
        try:
            self.request.settimeout(READ_SECONDS)
            self.request.sendall(answer)
        except OSError as exc:
            log_event("answer_lost", "warning", error=str(exc))

    def _binary(self, version: int, plugin: str, env: dict[str, str], stdin: bytes, started: float) -> bytes:
        if version != PROTOCOL:
            return f"exec {self._mismatch(version)}\n".encode()
        code, out, err = self._call(plugin, env, stdin, started)
        return b"%d %d %d\n" % (code, len(out), len(err)) + out + err

    def _health(self, req: Any) -> dict:
        """The answer to a tool's ``{"health": true}``, the one JSON request."""
        if not isinstance(req, dict) or not req.get("health"):
            raise BadRequest('the one JSON request is {"health": true}; CNI calls use the binary framing')
        srv = self.server
        return {"ok": True, "pid": os.getpid(), "uptime": round(time.monotonic() - srv.started, 3),
                "requests": srv.requests, "in_flight": srv.in_flight, "workers": srv.workers,
                "socket_activated": srv.activated}

    def _mismatch(self, version: Any) -> str:
        log_event("protocol_mismatch", "warning", v=version, served=[PROTOCOL])
        return f"protocol version {version!r} is not served (this daemon speaks {PROTOCOL})"

    def _call(self, plugin: str, env: Any, stdin: bytes, started: float) -> tuple[int, bytes, bytes]:
        """Serve one CNI call."""
        srv = self.server
        if plugin not in srv.plugins or not isinstance(env, dict):
            raise BadRequest(f"unknown plugin {plugin!r}")
        env = call_env(env, os.environ)
        with srv.count():
            code, document, err = run_call(srv.plugins, plugin, env, stdin, self.deadline)
        srv.observe(CallRecord.of(plugin, env, stdin, code, document, time.monotonic() - started))
        return code, skel.render(document).encode(), err


class DaemonServer(socketserver.UnixStreamServer):
    """Accepts on the socket (one thread, ``serve_forever``) and hands each connection to a fixed
    pool of worker threads (:class:`rdmanet.node.workers.WorkerPool`: the most recently idle worker first)
    through a bounded queue: when it is full, the accept loop waits and new callers wait in the
    listen backlog."""

    request_queue_size = socket.SOMAXCONN  # a burst of pod starts must queue, not get EAGAIN (default 5)

    def __init__(self, path: str, plugins: Mapping[str, Any], allowed_uids: Iterable[int] = (0,),
                 workers: int = WORKERS, call_timeout: float = call_deadline.DEFAULT_SECONDS,
                 listening: Optional[socket.socket] = None) -> None:
        self.plugins = plugins
        self.allowed_uids = frozenset(allowed_uids)
        self.started = time.monotonic()
        self.requests = 0
        self.in_flight = 0
        self.workers = workers
        self.call_timeout = call_timeout
        self._lock = threading.Lock()
        self._local = threading.local()
        self._accept_error_logged = 0.0
        self.observers: list[Callable[[CallRecord], None]] = []
        super().__init__(path, _Handler, bind_and_activate=False)
        self.activated = listening is not None  # the socket is systemd's: the daemon never removes it
        self.bound_inode: Optional[int] = None  # the path's inode when the daemon bound it itself
        if listening is not None:  # socket activation: systemd bound it (0600, rdmanet.socket) and listens
            self.socket.close()
            self.socket = listening
            listening.setblocking(True)  # O_NONBLOCK is shared with systemd's fd: a previous daemon's drain set it
        else:
            old = os.umask(0o177)  # the socket is born 0600
            try:
                self.server_bind()
            finally:
                os.umask(old)
            os.chmod(path, 0o600)
            self.bound_inode = os.stat(path).st_ino
            self.server_activate()
        self._pool = WorkerPool(workers, self._serve, queued=QUEUED)

    def get_request(self):  # type: ignore[override]
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # the connection stays in the backlog: wait a little instead of spinning on it
                now = time.monotonic()
                if now - self._accept_error_logged > 10:
                    self._accept_error_logged = now
                    log_event("accept_failed", "error", error=os.strerror(exc.errno), hint="raise LimitNOFILE of the daemon")
                time.sleep(0.05)
            raise

    def verify_request(self, request, client_address) -> bool:  # type: ignore[override]
        try:
            uid = peer_uid(request)
        except OSError:
            return False
        if uid not in self.allowed_uids:
            log_event("peer_refused", "warning", uid=uid)
            return False
        return True

    def process_request(self, request, client_address) -> None:  # type: ignore[override]
        self._pool.submit((request, client_address, time.monotonic()))  # blocks while QUEUED are waiting

    def accepted_at(self) -> float:
        """When the connection the calling worker serves was accepted (its deadline counts from there)."""
        return self._local.accepted

    def _serve(self, job: tuple) -> None:
        """One accepted connection, in a worker of the pool."""
        request, address, self._local.accepted = job
        try:
            self.finish_request(request, address)
        except Exception:  # noqa: BLE001 - a bug in one request must not end the worker
            log_event("request_failed", "error", error=repr(sys.exc_info()[1]))
        finally:
            self._pool.finishing()  # answered: the caller's next call waits for this worker, no other wakes
            self.shutdown_request(request)
            memory.trim_when_idle(self.in_flight + self._pool.waiting())

    def server_close(self) -> None:
        """Finish the queued and in-flight requests, stop the workers, close the socket."""
        self._pool.close()
        super().server_close()

    def drain_backlog(self) -> int:
        """Serve the connections already queued on the (no longer polled) listening socket."""
        self.socket.setblocking(False)
        served = 0
        while True:
            try:
                request, address = self.get_request()
            except OSError:  # EAGAIN: the queue is empty
                return served
            request.setblocking(True)
            served += 1
            if self.verify_request(request, address):
                self.process_request(request, address)
            else:
                self.shutdown_request(request)

    def observe(self, record: CallRecord) -> None:
        """What the daemon does with each call's record: its log line (and, when set, ``observers``:
        the metrics, the pod events); an observer that fails never fails the call."""
        log_event("call", record.level, **record.log_fields())
        for observer in self.observers:
            try:
                observer(record)
            except Exception as exc:  # noqa: BLE001 - the call has its answer; a report must not take it away
                log_event("observer_failed", "error", error=f"{type(exc).__name__}: {exc}")

    def count(self):
        server = self

        class _Count:
            def __enter__(self):
                with server._lock:
                    server.requests += 1
                    server.in_flight += 1

            def __exit__(self, *exc):
                with server._lock:
                    server.in_flight -= 1

        return _Count()


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (at most NOFILE_CAP); returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE_CAP if hard == resource.RLIM_INFINITY else min(hard, NOFILE_CAP)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, want
    return soft, soft


def raise_priority(nice: int) -> tuple[int, int]:
    """Lower the calling thread's nice value to ``nice`` (never raise it: a unit's ``Nice=`` may
    ask for more); returns (before, after). Linux keeps a nice value per thread and a new thread
    starts with its creator's, so this runs first in :func:`run`, before any thread exists. Not
    permitted (no CAP_SYS_NICE, RLIMIT_NICE): unchanged, and the caller logs it."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if nice >= before:
        return before, before
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        return before, before
    return before, os.getpriority(os.PRIO_PROCESS, 0)


def _prepare_socket(path: str) -> None:
    directory = os.path.dirname(path) or "."
    try:
        os.makedirs(directory, mode=0o700)  # a directory of its own: 0700
    except FileExistsError:
        pass  # an existing one keeps its mode: the socket itself is 0600
    why = unsafe_socket_dir(path)
    if why is not None:  # another user could bind the path while the daemon is down (rdmanet.node.socket_dir)
        raise RuntimeError(f"{why}; use a --socket in a directory only root may write, such as /run/rdmanet")
    if os.path.exists(path):
        try:
            exchange(path, {"health": True})
        except (NoDaemon, DaemonLost):
            os.unlink(path)  # stale: nobody answers
        else:
            raise RuntimeError(f"another daemon answers on {path}")


def run(socket_path: str = DEFAULT_SOCKET, allowed_uids: Iterable[int] = (0,), workers: int = WORKERS,
        call_timeout: float = call_deadline.DEFAULT_SECONDS, policy: Optional[Any] = None, nice: int = NICE,
        metrics_endpoint: Optional[tuple[str, int]] = None, kubeconfig: Optional[str] = None) -> int:
    """Serve until SIGTERM/SIGINT. ``policy``: the node policy (rdmanet.cni.linux.roots.NodePolicy) from
    the daemon's flags, for calls whose environment names no policy file. ``nice``: see :data:`NICE`.
    ``metrics_endpoint``: (address, port) of the Prometheus metrics (:mod:`rdmanet.node.metrics`;
    port 0 or None: none). ``kubeconfig``: the daemon's own credentials, for the events it writes
    on pods (:mod:`rdmanet.node.pod_events`; None: install.sh's, else the pod's service account).

    Socket-activated (systemd's ``rdmanet.socket``: LISTEN_FDS/LISTEN_PID, :mod:`rdmanet.node.socket_activation`),
    it serves the socket systemd passed and never removes it; otherwise it binds ``socket_path``."""
    try:  # first: the LISTEN_* variables leave the environment before anything could inherit them
        listening = socket_activation.inherited_socket(socket_path)
    except (socket_activation.ActivationError, OSError) as exc:
        log_event("start_failed", "error", socket=socket_path, error=f"socket activation refused: {exc}")
        return 1
    priority = raise_priority(nice)  # first: every thread made later inherits it
    _install_logging()
    if priority[1] > nice:
        log_event("priority", "warning", nice=priority[1], wanted=nice,
                  hint="the daemon may not raise its priority (CAP_SYS_NICE, RLIMIT_NICE); it serves at this one")
    if policy is not None:
        from rdmanet.cni.linux import roots

        roots.set_process_policy(policy)
    t0 = time.monotonic()
    nofile = raise_nofile()
    arenas = memory.limit_arenas()  # before any worker thread exists
    plugins = load_plugins()
    try:
        server = _bind(socket_path, listening, plugins, allowed_uids, workers, call_timeout)
    except (OSError, RuntimeError) as exc:
        log_event("start_failed", "error", socket=socket_path, error=str(exc))
        return 1
    if listening is not None:
        _check_activated_mode(socket_path)
    metrics = _start_metrics(server, socket_path, metrics_endpoint)  # before the first call is served
    _start_pod_events(server, kubeconfig, metrics)
    stop = _stop_on_signals()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="accept", daemon=True).start()
    log_event("started", socket=socket_path, socket_activated=listening is not None, pid=os.getpid(),
              import_ms=round((time.monotonic() - t0) * 1000, 1), allowed_uids=sorted(server.allowed_uids),
              workers=workers, call_timeout=call_timeout, nofile=nofile, nice=priority[1],
              malloc_arenas=memory.ARENAS if arenas else None,
              malloc_tcache="off" if memory.tuned else "on", node_policy=getattr(policy, "source", None))
    del_journal.start(socket_path, plugins, stop)  # DELs the shims could not get done (Multus swallows them)
    node_gc.start(stop, log_event)  # this node's claims whose pod is gone
    try:
        while not stop.wait(1.0):
            pass
    finally:
        stop_serving(server, socket_path)
        if metrics is not None:
            metrics.close()
    return 0


def _bind(socket_path: str, listening: Optional[socket.socket], plugins: dict, allowed_uids: Iterable[int],
          workers: int, call_timeout: float) -> "DaemonServer":
    """The server on the socket systemd passed (``listening``), else bound at ``socket_path``;
    OSError or RuntimeError when the socket's directory is unsafe or another daemon answers."""
    if listening is None:
        _prepare_socket(socket_path)
    elif (why := unsafe_socket_dir(socket_path)) is not None:  # systemd's: its directory is checked all the same
        raise RuntimeError(f"{why}; set ListenStream= of rdmanet.socket to a path in a directory only root may write")
    return DaemonServer(socket_path, plugins, allowed_uids, workers=workers, call_timeout=call_timeout,
                        listening=listening)


def _stop_on_signals() -> threading.Event:
    """An event SIGTERM and SIGINT set."""
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def _start_pod_events(server: "DaemonServer", kubeconfig: Optional[str], metrics: Any) -> None:
    """Events on pods for failed ADDs and freed addresses, written in the background."""
    from rdmanet.ipam import telemetry

    from .pod_events import Credentials, PodEvents

    events = PodEvents(Credentials(kubeconfig), node_gc.node_name(), result=metrics.event if metrics else None)
    server.observers.append(events.observe)
    telemetry.on_freed(events.freed)
    where = events.credentials.source()
    log_event("pod_events", kubeconfig=where or ("in-cluster" if where == "" else None),
              enabled=where is not None)


def _start_metrics(server: "DaemonServer", socket_path: str, endpoint: Optional[tuple[str, int]]) -> Any:
    """The metrics endpoint, when one is asked for; one that cannot bind is logged and the daemon
    serves its CNI calls without it (a metrics port must never take the node's CNI down)."""
    if not endpoint or not endpoint[1]:
        return None
    from .metrics import DaemonMetrics

    address, port = endpoint
    metrics = DaemonMetrics(del_journal.directory_of(socket_path))
    try:
        metrics.serve(address, port)
    except OSError as exc:
        log_event("metrics_failed", "error", address=address, port=port, error=str(exc),
                  hint="free the port or give another (--metrics-port); CNI calls are served without metrics")
        return None
    server.observers.append(metrics.observe)
    log_event("metrics", address=address, port=port, path="/metrics")
    return metrics


def stop_serving(server: DaemonServer, socket_path: str, accept_loop_running: bool = True) -> None:
    """Graceful stop: no caller is left without an answer."""
    log_event("stopping", in_flight=server.in_flight)
    if not server.activated:
        _remove_own_socket(server, socket_path)
    # socket-activated: systemd keeps listening; new callers wait in its queue until it starts the
    # daemon again (or, once rdmanet.socket is stopped too, find no socket)
    if accept_loop_running:
        server.shutdown()  # the accept loop ends
    queued = server.drain_backlog()  # callers that connected before the unlink are served
    server.server_close()  # joins the requests in flight
    log_event("stopped", requests=server.requests, served_from_backlog=queued)


def _remove_own_socket(server: DaemonServer, socket_path: str) -> None:
    """Unlink the socket the daemon bound, not one bound since at that path (systemd's rdmanet.socket,
    another daemon): new callers find no daemon (fallback in-process, or 11 and a retry)."""
    try:
        if os.stat(socket_path).st_ino == server.bound_inode:
            os.unlink(socket_path)
        else:
            log_event("socket_left", "warning", socket=socket_path, why="another socket is bound at this path now")
    except FileNotFoundError:
        pass


def _check_activated_mode(socket_path: str) -> None:
    """Peers other than root are refused whatever the mode (SO_PEERCRED); a socket that more than
    root may connect to is still worth the node owner's eye (rdmanet.socket sets SocketMode=0600)."""
    try:
        st = os.stat(socket_path)
    except OSError as exc:
        log_event("socket_mode", "warning", socket=socket_path, error=str(exc))
        return
    if st.st_mode & 0o077 or st.st_uid != 0:
        log_event("socket_mode", "warning", socket=socket_path, mode=oct(st.st_mode & 0o777), uid=st.st_uid,
                  hint="set SocketMode=0600 and SocketUser=root in rdmanet.socket; only root peers are served anyway")


def check(socket_path: str = DEFAULT_SOCKET) -> int:
    """``rdmanet daemon --check``: 0 when the daemon answers healthy, else 1."""
    try:
        answer = exchange(socket_path, {"health": True}, timeout=5.0)
    except (NoDaemon, DaemonLost) as exc:
        print(json.dumps({"ok": False, "socket": socket_path, "error": str(exc)}))
        return 1
    print(json.dumps(answer))
    return 0 if answer.get("ok") else 1
