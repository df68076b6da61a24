"""Resource bounds and deadlines of a call: the daemon's worker pool, request deadlines and size
caps, RLIMIT_NOFILE, resource exhaustion answered 11, IPAM execs killed at the call's deadline,
and '%' in CNI_IFNAME. (The deadline of a host-device-rdma ADD, with killed shims and real
netns, is in netns_tests/test_host_device_stale_calls.py.)"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import resource
import socket
import threading
import time

import pytest

from rdmanet.cni.core import deadline as call_deadline
from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.core.invocation import parse_invocation
from rdmanet.cni.core.ipam_exec import exec_plugin
from rdmanet.node import daemon as daemon_mod
from rdmanet.node.launcher import call
from rdmanet.node.testing import Daemon, health, shim_env

BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture
def env_dir():
    with shim_env() as root:
        yield root


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


# --------------------------------------------------------------------------- exhaustion is "try again later"


class _Exhausted:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def add(self, inv):
        raise self.exc


ADD_ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "net1",
           "CNI_PATH": "/nonexistent"}
CONF = json.dumps({"cniVersion": "1.0.0", "name": "n1", "type": "x"}).encode()


@pytest.mark.parametrize("exc", [OSError(errno.EMFILE, "Too many open files"), OSError(errno.ENFILE, "File table overflow"),
                                 MemoryError(), OSError(errno.ENOMEM, "Cannot allocate memory")],
                         ids=["EMFILE", "ENFILE", "MemoryError", "ENOMEM"])
def test_resource_exhaustion_is_try_again_later(exc):
    """Out of fds or memory is the node's state, not a bug in rdmanet: 11, so the runtime retries."""
    code, doc = skel.handle(_Exhausted(exc), ADD_ENV, CONF)
    assert code == 1 and doc["code"] == 11, doc
    assert "bug" not in doc["details"] and "retries" in doc["details"], doc


def test_wrapped_exhaustion_is_found_through_the_cause():
    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as inner:
            raise RuntimeError("netlink socket") from inner
    except RuntimeError as outer:
        code, doc = skel.handle(_Exhausted(outer), ADD_ENV, CONF)
    assert doc["code"] == 11 and "EMFILE" in doc["msg"], doc


def test_a_real_bug_is_still_999():
    code, doc = skel.handle(_Exhausted(KeyError("x")), ADD_ENV, CONF)
    assert doc["code"] == 999


# --------------------------------------------------------------------------- '%' in CNI_IFNAME


@pytest.mark.parametrize("command", ["ADD", "CHECK"])
def test_percent_in_ifname_is_refused(command):
    with pytest.raises(CNIError) as info:
        parse_invocation({**ADD_ENV, "CNI_COMMAND": command, "CNI_IFNAME": "net%d"}, CONF.replace(b"1.0.0", b"1.1.0"))
    assert info.value.code == 4 and "'%'" in info.value.msg and "net1" in info.value.details


def test_percent_in_ifname_is_accepted_by_del():
    """A runtime DELs after a failed ADD: that DEL must be able to succeed."""
    assert parse_invocation({**ADD_ENV, "CNI_COMMAND": "DEL", "CNI_IFNAME": "net%d"}, CONF).ifname == "net%d"


# --------------------------------------------------------------------------- IPAM execs under the deadline


def _slow_ipam(tmp_path: pathlib.Path, seconds: int) -> pathlib.Path:
    script = tmp_path / "slow-ipam"
    script.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\nsleep {seconds} &\necho $! > {tmp_path}/child\nwait\n")
    script.chmod(0o755)
    return script


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _exec_in_thread(inv, command: str, deadline: call_deadline.Deadline) -> dict:
    outcome: dict = {}

    def run():
        try:
            with call_deadline.scoped(deadline):
                outcome["answer"] = exec_plugin("slow-ipam", inv, command)
        except CNIError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    outcome["finished"] = not thread.is_alive()
    return outcome


def _inv(tmp_path: pathlib.Path, command: str):
    return parse_invocation({**ADD_ENV, "CNI_COMMAND": command, "CNI_PATH": str(tmp_path), "PATH": BARE_PATH}, CONF)


def test_ipam_exec_is_killed_at_the_deadline(tmp_path):
    """A foreign IPAM that never answers is killed (with its children) when the call's deadline
    passes, and the call fails with 11 instead of hanging until the runtime gives up."""
    _slow_ipam(tmp_path, 600)
    outcome = _exec_in_thread(_inv(tmp_path, "ADD"), "ADD", call_deadline.Deadline.after(1.0))
    assert outcome["finished"], "the IPAM exec was not bounded by the call's deadline"
    err = outcome["error"]
    assert err.code == 11 and "did not answer ADD in time" in err.msg and "killed" in err.msg, err
    for name in ("pid", "child"):
        pid = int((tmp_path / name).read_text())
        assert not _alive(pid), f"the IPAM's {name} process {pid} is still running"


def test_ipam_exec_of_an_add_stops_when_the_caller_went_away(tmp_path):
    _slow_ipam(tmp_path, 600)
    gone = threading.Event()
    threading.Timer(0.5, gone.set).start()
    outcome = _exec_in_thread(_inv(tmp_path, "ADD"), "ADD", call_deadline.Deadline.after(60, gone.is_set))
    assert outcome["finished"]
    assert outcome["error"].code == 11 and "caller went away" in outcome["error"].msg


def test_ipam_exec_of_a_del_finishes_when_the_caller_went_away(tmp_path):
    """An undo is better finished than abandoned: DEL's IPAM exec is bounded by the deadline only."""
    _slow_ipam(tmp_path, 1)
    outcome = _exec_in_thread(_inv(tmp_path, "DEL"), "DEL", call_deadline.Deadline.after(60, lambda: True))
    assert outcome["finished"] and "error" not in outcome and outcome["answer"] is None, outcome


# --------------------------------------------------------------------------- the daemon's bounds


def test_nofile_is_raised_at_start(env_dir):
    """systemd and containerd start services with a soft limit of 1024 fds; the daemon raises it
    to the hard limit."""
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()],
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096)))
    try:
        limits = pathlib.Path(f"/proc/{d.pid}/limits").read_text()
        [line] = [l for l in limits.splitlines() if l.startswith("Max open files")]
        assert line.split()[3:5] == ["4096", "4096"], line
        deadline = time.monotonic() + 10  # the "started" line follows the first answer on a loaded machine
        while '"nofile": [256, 4096]' not in d.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert '"nofile": [256, 4096]' in d.log()
    finally:
        d.cleanup()


def nice_of_threads(pid: int) -> dict[int, int]:
    """Each thread's nice value, as ps -L shows it (proc(5): field 19 of /proc/<pid>/task/<tid>/stat)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = pathlib.Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        out[int(tid)] = int(stat.rpartition(")")[2].split()[16])
    return out


def test_the_daemon_serves_at_the_nice_value_asked(env_dir):
    """Every thread of the daemon (the workers, the accept loop) runs at --nice; where raising the
    priority is not permitted, the daemon says so and serves at the one it has."""
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()], args=["--nice", "-7"])
    try:
        assert health(d.socket)["ok"]
        threads = nice_of_threads(d.pid)
        assert len(threads) > 3, threads  # the workers exist
        if os.geteuid() == 0:
            assert set(threads.values()) == {-7}, threads
        else:
            assert set(threads.values()) == {os.getpriority(os.PRIO_PROCESS, 0)}, threads
            deadline = time.monotonic() + 10
            while '"event": "priority"' not in d.log() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert '"event": "priority"' in d.log()
    finally:
        d.cleanup()


@pytest.mark.skipif(os.geteuid() != 0, reason="a negative nice value needs root")
def test_a_daemon_started_at_a_lower_nice_value_keeps_it(env_dir):
    """A unit's Nice=-15 is not undone by the daemon's default (-10)."""
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()], preexec_fn=lambda: os.nice(-15))
    try:
        assert health(d.socket)["ok"]
        assert set(nice_of_threads(d.pid).values()) == {-15}
    finally:
        d.cleanup()


def test_worker_threads_are_bounded(env_dir):
    """Forty callers that connect and send half a request (or a burst of pod starts) get no more
    threads than --workers: the rest wait in the queue and the listen backlog."""
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()], args=["--workers", "3"])
    socks = []
    try:
        base = threads_of(d.pid)
        for _ in range(40):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(d.socket)
            s.sendall(b"RDMANET 2 lease-ipam 100 0\nCNI_COM")
            socks.append(s)
        time.sleep(1.0)  # time for the daemon to accept them all (it would, at once, with a thread each)
        assert threads_of(d.pid) <= base, f"{threads_of(d.pid)} threads for 40 half-sent requests (idle: {base})"
    finally:
        for s in socks:
            s.close()
    try:
        assert health(d.socket)["workers"] == 3  # served once the callers went away
    finally:
        d.cleanup()


def test_a_half_sent_request_is_dropped_after_the_read_deadline(env_dir):
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()])
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(d.socket)
            s.sendall(b"RDMANET 2 lease-ipam 100 0\nCNI_COM")
            s.settimeout(daemon_mod.READ_SECONDS + 20)
            assert s.recv(100) == b"", "the daemon answered a request it never got"
        assert "did not arrive within" in d.log()
        assert health(d.socket)["ok"]
    finally:
        d.cleanup()


def test_an_oversized_request_is_answered_with_a_cni_error(env_dir):
    """A network configuration over the cap is refused with a CNI error that names the limit
    (not read into memory, not a silent close the shim would retry in-process)."""
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()])
    try:
        env = {b"CNI_COMMAND": b"ADD", b"CNI_CONTAINERID": b"c1", b"CNI_IFNAME": b"net1", b"CNI_NETNS": b"/x", b"CNI_PATH": b"/x"}
        code, out, err = call(d.socket, "lease-ipam", env, b" " * (daemon_mod.MAX_STDIN + 1), timeout=30)
        doc = json.loads(out)
        assert code == 1 and doc["code"] == 7 and str(daemon_mod.MAX_STDIN) in doc["msg"], doc
        assert health(d.socket)["ok"]
        assert health(d.socket)["requests"] == 0
    finally:
        d.cleanup()
