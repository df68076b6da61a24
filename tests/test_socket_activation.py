"""``rdmanet daemon`` started by systemd's socket activation (rdmanet.socket), with the handshake
done here as systemd does it (rdmanet.node.testing.activated_popen: the listening socket at fd 3,
LISTEN_FDS=1, LISTEN_PID set after the fork): what it serves, what it refuses, and that the
socket outlives the daemon. No root needed: the daemons accept this user (--allow-uid).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from rdmanet.node import socket_activation
from rdmanet.node.launcher import call, exchange
from rdmanet.node.testing import SocketActivation, activated_popen, daemon_argv, health


@pytest.fixture
def run_dir():
    """A short directory (a unix socket path has at most 107 bytes), removed afterwards."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="rdmanet-sa-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def log_events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


# --------------------------------------------------------------------------- sd_listen_fds


def test_listen_fds_takes_the_variables_out_of_the_environment_whoever_they_were_for():
    other = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "rdmanet.socket", "HOME": "/root"}
    assert socket_activation.listen_fds(other) == 0  # a parent's: not ours, and not passed on either
    assert other == {"HOME": "/root"}
    assert socket_activation.listen_fds({"HOME": "/root"}) == 0
    env = {"LISTEN_PID": "12", "LISTEN_FDS": "0"}
    assert socket_activation.listen_fds(env, pid=12) == 0 and env == {}


@pytest.mark.parametrize("env, says", [
    ({"LISTEN_PID": "x1", "LISTEN_FDS": "1"}, "LISTEN_PID='x1' is not a process id"),
    ({"LISTEN_PID": "12"}, "LISTEN_FDS=None is not a number"),
    ({"LISTEN_PID": "12", "LISTEN_FDS": "two"}, "LISTEN_FDS='two' is not a number"),
    ({"LISTEN_PID": "12", "LISTEN_FDS": "-1"}, "LISTEN_FDS=-1 is negative"),
])
def test_listen_fds_refuses_garbage_meant_for_this_process(env, says):
    with pytest.raises(socket_activation.ActivationError, match=says.replace("(", r"\(")):
        socket_activation.listen_fds(env, pid=12)
    assert env == {}


# --------------------------------------------------------------------------- the daemon, exec'd as systemd does


def start_activated(passed, socket_path: str, log: pathlib.Path, listen_pid: str = "$$") -> subprocess.Popen:
    with open(log, "ab") as fh:
        return activated_popen(passed, daemon_argv(socket_path, [os.getuid()]), listen_pid=listen_pid,
                               stdout=subprocess.DEVNULL, stderr=fh)


def refusal(proc: subprocess.Popen, log: pathlib.Path) -> str:
    """The daemon's exit code must be 1, with one start_failed line: its error."""
    assert proc.wait(60) == 1, log.read_text()
    (failed,) = [e for e in log_events(log.read_text()) if e["event"] == "start_failed"]
    assert failed["error"].startswith("socket activation refused: ")
    return failed["error"]


def unix_listener(path: pathlib.Path, kind: int = socket.SOCK_STREAM, listen: bool = True) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, kind)
    sock.bind(str(path))
    if listen:
        sock.listen(8)
    return sock


@pytest.mark.parametrize("case", ["datagram", "not-listening", "tcp", "other-path", "abstract"])
def test_daemon_refuses_a_socket_it_cannot_serve(run_dir, case):
    path, log = run_dir / "daemon.sock", run_dir / "daemon.log"
    if case == "datagram":
        passed, says = unix_listener(path, socket.SOCK_DGRAM, listen=False), "AF_UNIX SOCK_DGRAM socket"
    elif case == "not-listening":
        passed, says = unix_listener(path, listen=False), "does not listen"
    elif case == "tcp":
        passed = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        passed.bind(("127.0.0.1", 0))
        passed.listen(8)
        says = "AF_INET SOCK_STREAM socket; the rdmanet daemon needs a unix stream socket"
    elif case == "other-path":
        passed = unix_listener(run_dir / "elsewhere.sock")
        says = f"systemd's socket listens on {run_dir / 'elsewhere.sock'} but the daemon serves {path}"
    else:
        passed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        passed.bind(b"\0rdmanet-sa-test-%d" % os.getpid())
        passed.listen(8)
        says = "not on a path"
    with passed:
        proc = start_activated(passed, str(path), log)
        assert says in refusal(proc, log)
    if case in ("tcp", "other-path", "abstract"):
        assert not path.exists()  # refused: it did not bind a socket of its own instead


def test_daemon_refuses_a_pipe_and_two_sockets(run_dir):
    path, log = str(run_dir / "daemon.sock"), run_dir / "daemon.log"
    read_end, write_end = os.pipe()
    try:
        proc = start_activated(read_end, path, log)
        assert "fd 3 (LISTEN_FDS=1) is not a socket" in refusal(proc, log)
    finally:
        os.close(read_end)
        os.close(write_end)
    log = run_dir / "daemon-2.log"
    with unix_listener(run_dir / "a.sock") as a, unix_listener(run_dir / "b.sock") as b:
        proc = start_activated([a, b], path, log)
        assert "systemd passed 2 sockets (LISTEN_FDS=2)" in refusal(proc, log)
    assert not os.path.exists(path)


def test_a_socket_passed_to_another_process_is_not_taken(run_dir):
    """LISTEN_PID names another process (the daemon inherited a parent's variables): the daemon
    leaves fd 3 alone and binds --socket itself, as without systemd."""
    path, log = run_dir / "daemon.sock", run_dir / "daemon.log"
    with unix_listener(run_dir / "parents.sock") as parents:
        proc = start_activated(parents, str(path), log, listen_pid="$PPID")
        try:
            answer = wait_for(lambda: proc.poll() is None and health(str(path)), 60, "the daemon")
            assert answer["pid"] == proc.pid
            started = [e for e in log_events(log.read_text()) if e["event"] == "started"]
            assert started[0]["socket_activated"] is False
        finally:
            proc.terminate()
            assert proc.wait(30) == 0
    assert not path.exists()  # it bound the socket itself, so it removed it


def test_socket_activated_daemon_serves_and_the_socket_outlives_it(run_dir):
    """What systemd does with rdmanet.socket: the socket exists before any daemon; the first call
    starts one, which serves it; a stopped daemon leaves the socket in place (0600), and the
    next call starts a new daemon."""
    path = run_dir / "run" / "daemon.sock"
    activation = SocketActivation(str(path), allow_uids=[os.getuid()], log_path=str(run_dir / "daemon.log"))
    try:
        assert activation.started == [] and (path.stat().st_mode & 0o777) == 0o600
        code, out, _ = call(str(path), "lease-ipam", {b"CNI_COMMAND": b"VERSION"}, b"", timeout=60)
        assert code == 0 and json.loads(out)["supportedVersions"]
        (first,) = activation.started
        answer = health(str(path))
        assert answer["pid"] == first.pid and answer["requests"] == 1
        started = [e for e in log_events(activation.log()) if e["event"] == "started"]
        assert [(e["socket_activated"], e["pid"]) for e in started] == [(True, first.pid)]
        mode_warnings = [e for e in log_events(activation.log()) if e["event"] == "socket_mode"]
        assert mode_warnings == [] if os.getuid() == 0 else [w["uid"] for w in mode_warnings] == [os.getuid()]

        assert activation.stop_daemon() == 0
        assert path.exists() and (path.stat().st_mode & 0o777) == 0o600  # systemd's, not removed
        assert "socket_left" not in activation.log()
        answer = health(str(path))  # queued until a new daemon takes it
        assert answer is not None and answer["requests"] == 0
        assert len(activation.started) == 2 and answer["pid"] == activation.started[1].pid != first.pid
    finally:
        activation.close()
    assert all(proc.returncode == 0 for proc in activation.started), activation.log()


def test_systemds_own_socket_activate_hands_the_daemon_its_socket(run_dir):
    """The same handshake by systemd's code (systemd-socket-activate, Debian's systemd package):
    it binds and listens, waits for the first connection, then execs the daemon in its own place
    with the socket at fd 3 and LISTEN_FDS, LISTEN_PID, LISTEN_FDNAMES set."""
    tool = shutil.which("systemd-socket-activate")
    if tool is None:
        pytest.skip("systemd-socket-activate is not installed (Debian package systemd; scripts/test.sh installs it)")
    path, log = run_dir / "daemon.sock", run_dir / "daemon.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen([tool, "--listen", str(path), "--fdname", "rdmanet.socket",
                                 *daemon_argv(str(path), [os.getuid()])], stdout=subprocess.DEVNULL, stderr=fh)
    try:
        wait_for(lambda: path.exists() or proc.poll() is not None, 30, "systemd-socket-activate's socket")
        answer = exchange(str(path), {"health": True}, timeout=60)
        assert answer["ok"] and answer["pid"] == proc.pid and answer["socket_activated"] is True
        started = [e for e in log_events(log.read_text()) if e["event"] == "started"]
        assert [(e["socket_activated"], e["pid"]) for e in started] == [(True, proc.pid)]
        proc.terminate()
        assert proc.wait(30) == 0
        assert path.exists()  # the daemon did not bind it: it does not remove it
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
