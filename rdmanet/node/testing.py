"""Test helpers: shims in a temporary bin dir and a daemon that is always stopped."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
import select
import signal
import socket
import subprocess
import threading
import sys
import sysconfig
import tempfile
import time
from typing import Iterator, Optional, Sequence

from .launcher import PLUGINS, NoDaemon, DaemonLost, exchange, write_shim


def write_shims(bin_dir: os.PathLike | str, socket_path: str, python: str = sys.executable,
                site_dir: Optional[str] = None) -> None:
    os.makedirs(bin_dir, exist_ok=True)
    for name in PLUGINS:  # the tests' daemon runs as the tests' user: the shims trust that uid besides root
        write_shim(os.path.join(bin_dir, name), name, python, site_dir or sysconfig.get_path("purelib"), socket_path,
                   server_uid=os.geteuid())


def plain_site_dir(directory: os.PathLike | str) -> str:
    """A site dir for in-process shims that imports as install.sh's venv does (rdmanet installed,
    not editable): a ``.pth`` naming this checkout and the venv's site-packages as plain path
    entries. The development venv's editable install runs a path finder from its own ``.pth``
    (importlib.util, pathlib, urllib.parse, fnmatch: ~8-10 ms of CPU per exec'd call) that a node
    does not pay; the benchmarks measure what a node pays."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(directory, "rdmanet.pth"), "w") as fh:
        fh.write(checkout + "\n" + sysconfig.get_path("purelib") + "\n")
    return directory


def health(socket_path: str) -> Optional[dict]:
    try:
        return exchange(socket_path, {"health": True}, timeout=5.0)
    except (NoDaemon, DaemonLost):
        return None


class Daemon:
    """``rdmanet daemon`` as a subprocess; :meth:`stop` always leaves no process and no socket."""

    def __init__(self, socket_path: str, allow_uids: Sequence[int] = (), log_path: Optional[str] = None,
                 env: Optional[dict[str, str]] = None, args: Sequence[str] = (), preexec_fn=None) -> None:
        self.socket = socket_path
        self._own_log = log_path is None
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="rdmanet-daemon-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        argv = daemon_argv(socket_path, allow_uids, args)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=self._log, preexec_fn=preexec_fn,
                                     env=None if env is None else {**os.environ, **env})
        deadline = time.monotonic() + 30
        while health(socket_path) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"daemon did not come up: {self.log()}")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        try:
            return pathlib.Path(self.log_path).read_text()
        except OSError:
            return ""

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30) -> Optional[int]:
        try:
            self.terminate()
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        finally:
            self._log.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.socket)

    def cleanup(self) -> None:
        """stop(), and remove the log file when it is ours."""
        self.stop()
        if self._own_log:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.log_path)


def activated_popen(passed: object, argv: Sequence[str], env: Optional[dict[str, str]] = None,
                    listen_pid: str = "$$", **popen_kw) -> subprocess.Popen:
    """Start ``argv`` the way systemd starts a socket-activated service (sd_listen_fds(3)): the
    ``passed`` socket (or fd; a list: several) from fd 3 on, LISTEN_FDS = how many, and
    LISTEN_PID = the pid of the process that execs ``argv``. That pid is known only after the
    fork, so a shell sets it (``$$``, or ``listen_pid`` to name another process) and execs,
    keeping its pid; it also moves the fds into place, closing the numbers they came in on."""
    items = passed if isinstance(passed, (list, tuple)) else [passed]
    # copies at 100 and up: moving them to 3, 4, ... cannot overwrite one not moved yet
    high = [fcntl.fcntl(item if isinstance(item, int) else item.fileno(), fcntl.F_DUPFD_CLOEXEC, 100)
            for item in items]
    try:
        moves = " ".join(f"{3 + i}<&{fd} {fd}<&-" for i, fd in enumerate(high))
        script = (f"exec {moves}; LISTEN_PID={listen_pid} LISTEN_FDS={len(high)} LISTEN_FDNAMES=rdmanet.socket "
                  'exec "$@"')
        return subprocess.Popen(["/bin/bash", "-c", script, "bash", *argv], pass_fds=high,
                                env={**os.environ, **(env or {})}, **popen_kw)
    finally:
        for fd in high:
            os.close(fd)


def daemon_argv(socket_path: str, allow_uids: Sequence[int] = (), args: Sequence[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "rdmanet.cli", "daemon", "--socket", socket_path, *args]
    for uid in allow_uids:
        argv += ["--allow-uid", str(uid)]
    return argv


class SocketActivation:
    """systemd's part of ``rdmanet.socket`` + ``rdmanet.service``, for tests where systemd is not
    PID 1: binds and listens on ``path`` (0600, a new directory 0700, as SocketMode=/DirectoryMode=),
    and whenever a connection waits while no daemon runs, starts ``rdmanet daemon`` with the
    socket passed (:func:`activated_popen`). ``started`` lists the daemons it started;
    :meth:`close` stops them and removes the socket (RemoveOnStop=yes)."""

    def __init__(self, path: str, allow_uids: Sequence[int] = (), args: Sequence[str] = (),
                 env: Optional[dict[str, str]] = None, log_path: Optional[str] = None) -> None:
        self.path = path
        self.argv = daemon_argv(path, allow_uids, args)
        self.env = env
        self._own_log = log_path is None
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="rdmanet-activated-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        self._log = open(log_path, "ab")
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.dirname(path), 0o700)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.listen(socket.SOMAXCONN)
        self.started: list[subprocess.Popen] = []
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._trigger, name="socket-activation", daemon=True)
        self._thread.start()

    @property
    def daemon(self) -> Optional[subprocess.Popen]:
        """The daemon running now, if any."""
        if self.started and self.started[-1].poll() is None:
            return self.started[-1]
        return None

    def _trigger(self) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        while not self._closing.is_set():
            if self.daemon is not None or not poller.poll(50):
                time.sleep(0.02)
                continue
            if not self._closing.is_set():
                self.started.append(activated_popen(self.sock, self.argv, self.env, stdout=subprocess.DEVNULL,
                                                    stderr=self._log))

    def log(self) -> str:
        try:
            return pathlib.Path(self.log_path).read_text()
        except OSError:
            return ""

    def stop_daemon(self, timeout: float = 30) -> Optional[int]:
        """``systemctl stop rdmanet.service``: SIGTERM to the daemon; the socket keeps listening."""
        proc = self.daemon
        if proc is None:
            return None
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None

    def close(self) -> None:
        self._closing.set()
        self._thread.join()
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.sock.close()
        self._log.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        if self._own_log:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.log_path)


class ScriptedDaemon:
    """A stand-in daemon on ``path`` for shims: reads each request whole (the binary framing),
    answers the bytes ``answer`` (None: closes without answering, a daemon that went away);
    ``seen`` counts the requests."""

    def __init__(self, path: str, answer: Optional[bytes] = None) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.path, self.answer, self.seen = path, answer, 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                read_request(conn)
                self.seen += 1
                if self.answer is not None:
                    conn.sendall(self.answer)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        os.unlink(self.path)


def read_request(conn: socket.socket) -> bytes:
    """A shim's whole request in the binary framing (header line and body), as a daemon reads it."""
    with conn.makefile("rb") as rfile:
        head = rfile.readline()
        fields = head.split()
        body = rfile.read(int(fields[3]) + int(fields[4])) if len(fields) == 5 else b""
    return head + body


@contextlib.contextmanager
def shim_env(prefix: str = "rdmanet-shim-") -> Iterator[pathlib.Path]:
    """A temporary directory with ``bin/`` (the shims, socket ``run/daemon.sock`` baked in)."""
    root = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    try:
        write_shims(root / "bin", str(root / "run" / "daemon.sock"))
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
