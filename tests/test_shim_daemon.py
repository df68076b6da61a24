"""The CNI shims (rdmanet.node.launcher) and the node daemon (rdmanet.node.daemon): same bytes both ways."""

from __future__ import annotations

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time

import pytest

from rdmanet.cni.core import env as request_env
from rdmanet.cni.core import ipam_exec, version
from rdmanet.cni.core.invocation import parse_invocation
from rdmanet.cni.linux import sysfs
from rdmanet.node import launcher
from rdmanet.node.testing import Daemon, ScriptedDaemon, health, shim_env

BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture
def env_dir():
    with shim_env() as root:
        yield root


@pytest.fixture
def daemon(env_dir):
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()])
    try:
        yield d
    finally:
        d.cleanup()
        assert not os.path.exists(d.socket)


def call(bin_dir: pathlib.Path, plugin: str, command: str, stdin: bytes = b"", **extra: str):
    env = {"PATH": BARE_PATH, "CNI_COMMAND": command, **extra}
    start = time.perf_counter()
    proc = subprocess.run([str(bin_dir / plugin)], input=stdin, env=env, capture_output=True, timeout=60)
    proc.elapsed = time.perf_counter() - start  # type: ignore[attr-defined]
    return proc


def ipam_conf(data_dir: pathlib.Path, name: str = "shimnet", subnet: str = "10.77.0.0/24") -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": name, "type": "lease-ipam",
                       "ipam": {"type": "lease-ipam", "dataDir": str(data_dir), "ranges": [[{"subnet": subnet}]]}}).encode()


def ipam_env(bin_dir: pathlib.Path, cid: str) -> dict:
    # the runtime's environment also names the node policy (tests/conftest.py: roots in the temp dir)
    return {"CNI_CONTAINERID": cid, "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "net1", "CNI_PATH": str(bin_dir),
            "RDMANET_NODE_POLICY": os.environ["RDMANET_NODE_POLICY"]}


# --------------------------------------------------------------------------- launcher alone


def test_launcher_constants_match_core():
    assert launcher.SUPPORTED_VERSIONS == version.SUPPORTED_VERSIONS
    assert launcher.LATEST == version.LATEST


def test_launcher_module_imports_only_stdlib():
    code = ("import sys; before = set(sys.modules); import rdmanet.node.launcher; "
            "print('\\n'.join(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    new = {m.split(".")[0] for m in out} - {"rdmanet"}
    assert new <= set(sys.stdlib_module_names), new - set(sys.stdlib_module_names)


def test_render_shim_shebang_and_refusals(tmp_path):
    text = launcher.render_shim("lease-ipam", "/usr/bin/python3", "/site", "/s.sock")
    assert text.startswith("#!/usr/bin/python3 -IS\n")
    assert "sys.exit(run('lease-ipam', '/site', '/s.sock', 0))" in text
    with pytest.raises(ValueError):
        launcher.render_shim("nope", "/usr/bin/python3", "/site")
    with pytest.raises(ValueError):
        launcher.render_shim("lease-ipam", "python3", "/site")


# --------------------------------------------------------------------------- with and without the daemon


def test_shim_with_daemon_imports_only_stdlib(env_dir, daemon):
    shim_path = env_dir / "bin" / "macvlan-rdma"
    proc = subprocess.run([sys.executable, "-IS", "-X", "importtime", str(shim_path)], env={"CNI_COMMAND": "VERSION"},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    names = {m.group(1).strip().split(".")[0] for m in re.finditer(r"^import time:[^|]*\|[^|]*\|(.*)$", proc.stderr, re.M)}
    names.discard("imported package")
    assert names and names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)
    assert not names & {"cni", "ipam", "pydantic", "pyroute2", "kubernetes", "site"}


@pytest.mark.parametrize("plugin", sorted(launcher.PLUGINS))
def test_version_identical_with_and_without_daemon(env_dir, plugin):
    without = call(env_dir / "bin", plugin, "VERSION")
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()])
    try:
        with_d = call(env_dir / "bin", plugin, "VERSION")
        assert health(d.socket)["requests"] == 1  # it really went through the daemon
    finally:
        d.cleanup()
    assert (with_d.returncode, with_d.stdout) == (without.returncode, without.stdout) == (0, (json.dumps(version.version_info()) + "\n").encode())


BAD = [
    (b"not json", {}),
    (b'{"cniVersion": "0.4.0", "name": "n", "type": "macvlan-rdma"}', {"CNI_NETNS": "/nonexistent"}),
    (b'{"cniVersion": "1.0.0", "name": "n", "type": "macvlan-rdma", "master": 7}', {}),
    (b'{"cniVersion": "9.9.9", "name": "n", "type": "lease-ipam"}', {}),
]


@pytest.mark.parametrize("stdin,extra", BAD)
@pytest.mark.parametrize("plugin", sorted(launcher.PLUGINS))
def test_error_json_identical_with_and_without_daemon(env_dir, plugin, stdin, extra):
    env = {"CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "net1", "CNI_PATH": str(env_dir / "bin")}
    env.update(extra)
    without = call(env_dir / "bin", plugin, "ADD", stdin, **env)
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()])
    try:
        with_d = call(env_dir / "bin", plugin, "ADD", stdin, **env)
    finally:
        d.cleanup()
    assert without.returncode != 0 and json.loads(without.stdout)["code"]
    assert (with_d.returncode, with_d.stdout) == (without.returncode, without.stdout)


def test_lease_ipam_add_del_identical(env_dir, tmp_path):
    bin_dir = env_dir / "bin"
    answers = []
    for label in ("exec", "daemon"):
        conf = ipam_conf(tmp_path / label)
        d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()]) if label == "daemon" else None
        try:
            got = [call(bin_dir, "lease-ipam", verb, conf, **ipam_env(bin_dir, "c1")) for verb in ("ADD", "CHECK", "DEL", "DEL")]
        finally:
            if d:
                d.cleanup()
        answers.append([(p.returncode, p.stdout) for p in got])
    assert answers[0] == answers[1]
    assert answers[0][0][0] == 0 and json.loads(answers[0][0][1])["ips"][0]["address"] == "10.77.0.2/24"


def test_daemon_check(env_dir):
    sock = str(env_dir / "run" / "daemon.sock")
    cli = [sys.executable, "-m", "rdmanet.cli", "daemon", "--check", "--socket", sock]
    assert subprocess.run(cli, capture_output=True).returncode == 1
    d = Daemon(sock, allow_uids=[os.getuid()])
    try:
        proc = subprocess.run(cli, capture_output=True, text=True)
        assert proc.returncode == 0
        doc = json.loads(proc.stdout)
        assert doc["ok"] is True and doc["pid"] == d.pid and doc["uptime"] >= 0 and "requests" in doc
    finally:
        d.cleanup()
    assert subprocess.run(cli, capture_output=True).returncode == 1


def test_socket_modes(env_dir, daemon):
    assert os.stat(daemon.socket).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(daemon.socket)).st_mode & 0o777 == 0o700


def test_second_daemon_refuses_a_live_socket(env_dir, daemon):
    proc = subprocess.run([sys.executable, "-m", "rdmanet.cli", "daemon", "--socket", daemon.socket,
                           "--allow-uid", str(os.getuid())], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "another daemon" in proc.stderr
    assert health(daemon.socket)["ok"]


def test_stderr_is_per_request(env_dir, daemon, tmp_path):
    bin_dir = env_dir / "bin"
    conf = ipam_conf(tmp_path / "data")
    results = {}

    def one(i):
        results[i] = call(bin_dir, "lease-ipam", "ADD", conf, RDMANET_LOG_LEVEL="DEBUG", **ipam_env(bin_dir, f"cid-{i:03d}"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    addresses = set()
    for i, proc in results.items():
        assert proc.returncode == 0, proc.stdout
        addresses.add(json.loads(proc.stdout)["ips"][0]["address"])
        err = proc.stderr.decode()
        assert f"container=cid-{i:03d}" in err
        assert set(re.findall(r"cid-\d{3}", err)) == {f"cid-{i:03d}"}
    assert len(addresses) == 10


def test_log_level_is_per_request(env_dir, daemon):
    quiet = call(env_dir / "bin", "lease-ipam", "ADD", b"not json", **ipam_env(env_dir / "bin", "c1"))
    loud = call(env_dir / "bin", "lease-ipam", "ADD", b"not json", RDMANET_LOG_LEVEL="INFO", **ipam_env(env_dir / "bin", "c1"))
    assert quiet.stderr == b""
    assert b"CNI error" in loud.stderr


def test_ipam_log_file_gets_its_info_lines_while_the_request_logs_warnings_only(env_dir, daemon, tmp_path):
    # The daemon makes a log record below WARNING only when a handler may take it: the request's
    # level (WARNING here) drops lease-ipam's "ADD ..." line, its ipam.log_file (debug) must not.
    log_file = tmp_path / "logs" / "lease-ipam.log"
    conf = json.loads(ipam_conf(tmp_path / "data"))
    conf["ipam"].update(log_file=str(log_file), log_level="debug")
    bin_dir = env_dir / "bin"
    for cid in ("logged-1", "logged-2"):
        add = call(bin_dir, "lease-ipam", "ADD", json.dumps(conf).encode(), **ipam_env(bin_dir, cid))
        assert add.returncode == 0, add.stdout
        assert add.stderr == b""
    quiet = call(bin_dir, "lease-ipam", "DEL", ipam_conf(tmp_path / "data"), **ipam_env(bin_dir, "logged-1"))
    assert (quiet.returncode, quiet.stderr) == (0, b"")
    lines = log_file.read_text().splitlines()
    assert [line.split(" INFO ")[1].split(":")[0] for line in lines if " INFO " in line] == \
        ["ADD logged-1/net1 in shimnet", "ADD logged-2/net1 in shimnet"]


# --------------------------------------------------------------------------- a daemon that goes away


def test_daemon_lost_add_is_try_again_and_del_runs_in_process(env_dir, tmp_path):
    bin_dir = env_dir / "bin"
    conf = ipam_conf(tmp_path / "data")
    server = ScriptedDaemon(str(env_dir / "run" / "daemon.sock"))
    try:
        add = call(bin_dir, "lease-ipam", "ADD", conf, **ipam_env(bin_dir, "c1"))
        assert add.returncode == 1
        err = json.loads(add.stdout)
        assert err["code"] == 11 and err["cniVersion"] == "1.0.0"
        assert not (tmp_path / "data").exists()  # ADD did not run anyway
        delete = call(bin_dir, "lease-ipam", "DEL", conf, **ipam_env(bin_dir, "c1"))
        assert (delete.returncode, delete.stdout) == (0, b"")
        version_ = call(bin_dir, "lease-ipam", "VERSION")
        assert version_.returncode == 0 and b"supportedVersions" in version_.stdout
    finally:
        server.close()


def test_stale_socket_falls_back_and_is_replaced(env_dir):
    sock = env_dir / "run" / "daemon.sock"
    sock.parent.mkdir()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sock))
    s.close()  # a socket file nobody listens on: ECONNREFUSED
    assert call(env_dir / "bin", "lease-ipam", "VERSION").returncode == 0
    d = Daemon(str(sock), allow_uids=[os.getuid()])
    try:
        assert health(str(sock))["ok"]
    finally:
        d.cleanup()


def test_crash_hook_requests_run_in_their_own_process(env_dir, daemon, tmp_path):
    bin_dir = env_dir / "bin"
    conf = ipam_conf(tmp_path / "data")
    proc = call(bin_dir, "lease-ipam", "ADD", conf, LEASE_IPAM_TEST_CRASH_AT="no-such-step", **ipam_env(bin_dir, "c1"))
    assert proc.returncode == 0, proc.stdout
    assert health(daemon.socket)["requests"] == 0  # declined, ran in the shim's process


def test_sigterm_finishes_the_request_in_flight(env_dir, tmp_path):
    import fcntl

    bin_dir = env_dir / "bin"
    conf = ipam_conf(tmp_path / "data")
    store = tmp_path / "data" / "shimnet"
    store.mkdir(parents=True)
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()])
    try:
        with open(store / "lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the ADD waits for this
            env = {"PATH": BARE_PATH, "CNI_COMMAND": "ADD", **ipam_env(bin_dir, "c1")}
            add = subprocess.Popen([str(bin_dir / "lease-ipam")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
            add.stdin.write(conf)
            add.stdin.close()
            deadline = time.monotonic() + 20
            while (health(d.socket) or {}).get("in_flight") != 1:
                assert time.monotonic() < deadline, d.log()
                time.sleep(0.05)
            d.terminate()
            time.sleep(0.5)
            assert d.proc.poll() is None  # waiting for the request
            fcntl.flock(lock, fcntl.LOCK_UN)
        out = add.stdout.read()
        assert add.wait(30) == 0, out
        assert json.loads(out)["ips"][0]["address"] == "10.77.0.2/24"
        assert d.proc.wait(30) == 0
        assert not os.path.exists(d.socket)
    finally:
        d.cleanup()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to setuid a child")
def test_non_root_peer_is_refused(env_dir):
    d = Daemon(str(env_dir / "run" / "daemon.sock"))  # root only
    try:
        def child_result(open_modes: bool) -> str:
            if open_modes:
                os.chmod(env_dir, 0o711)
                os.chmod(os.path.dirname(d.socket), 0o711)
                os.chmod(d.socket, 0o666)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # child: become nobody and try
                try:
                    os.close(r)
                    os.setgid(65534)
                    os.setuid(65534)
                    try:
                        launcher.exchange(d.socket, {"health": True}, timeout=5)
                        verdict = "answered"
                    except launcher.NoDaemon:
                        verdict = "noconnect"
                    except launcher.DaemonLost:
                        verdict = "closed"
                    os.write(w, verdict.encode())
                finally:
                    os._exit(0)
            os.close(w)
            os.waitpid(pid, 0)
            with os.fdopen(r, "rb") as fh:
                return fh.read().decode()

        assert child_result(False) == "noconnect"  # 0700 dir / 0600 socket
        assert child_result(True) == "closed"  # SO_PEERCRED: uid 65534 refused
        assert health(d.socket)["ok"]
        assert '"peer_refused"' in d.log()
    finally:
        d.cleanup()


# --------------------------------------------------------------------------- request-scoped env, IPAM hook


def test_request_env_is_scoped(monkeypatch):
    monkeypatch.setenv("RDMANET_SYSFS_ROOT", "/from-os")
    assert sysfs.default_root() == "/from-os"
    with request_env.scoped({"RDMANET_SYSFS_ROOT": "/from-request"}):
        assert sysfs.default_root() == "/from-request"
        with request_env.scoped({}):
            assert sysfs.default_root() == "/"
        seen = []
        t = threading.Thread(target=lambda: seen.append(sysfs.default_root()))
        t.start()
        t.join()
        assert seen == ["/from-os"]  # another thread does not see this request's env
    assert sysfs.default_root() == "/from-os"


def test_ipam_in_process_hook(tmp_path, monkeypatch):
    (tmp_path / "lease-ipam").write_text("")
    stdin = b'{"cniVersion": "1.0.0", "name": "n", "type": "x", "ipam": {"type": "lease-ipam"}}'
    inv = parse_invocation({"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c", "CNI_NETNS": "/x", "CNI_IFNAME": "e",
                            "CNI_PATH": str(tmp_path), "FOO": "bar"}, stdin)
    seen = []

    def handler(env, data):
        seen.append((env["CNI_COMMAND"], env["FOO"], data))
        return (0, {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}) if env["CNI_COMMAND"] == "ADD" else (0, None)

    monkeypatch.setitem(ipam_exec.IN_PROCESS, "lease-ipam", handler)
    assert ipam_exec.exec_plugin("lease-ipam", inv, "ADD")["ips"][0]["address"] == "10.0.0.2/24"
    assert ipam_exec.exec_plugin("lease-ipam", inv, "DEL") is None
    assert seen == [("ADD", "bar", stdin), ("DEL", "bar", stdin)]
    monkeypatch.setitem(ipam_exec.IN_PROCESS, "lease-ipam", lambda env, data: (1, {"code": 7, "msg": "bad"}))
    with pytest.raises(Exception) as info:
        ipam_exec.exec_plugin("lease-ipam", inv, "ADD")
    assert getattr(info.value, "code", None) == 7
    monkeypatch.setitem(ipam_exec.IN_PROCESS, "missing", handler)
    with pytest.raises(Exception, match="failed to find plugin"):
        ipam_exec.exec_plugin("missing", inv, "ADD")  # still looked up on CNI_PATH
