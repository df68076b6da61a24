"""Daemon-only shims (install.sh's DaemonSet mode): no in-process fallback, CNI error 11 when the
daemon does not answer, VERSION answered by the shim itself, byte for byte as the plugins do."""

from __future__ import annotations

import ast
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import tokenize

import pytest

from rdmanet.cni.core import version
from rdmanet.node import launcher
from rdmanet.node.__main__ import main as shim_main
from rdmanet.node.testing import Daemon, ScriptedDaemon, health, read_request, write_shims

BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
VENV_BIN = pathlib.Path(sys.executable).parent
DAEMONSET_PHRASE = "is the rdmanet DaemonSet pod running on this node?"


@pytest.fixture
def root():
    """A short temporary directory (unix socket paths are limited to 107 bytes)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="rdn-shim-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def daemon_only_shims(root: pathlib.Path, name: str = "bin") -> pathlib.Path:
    bin_dir = root / name
    os.makedirs(bin_dir, exist_ok=True)
    for plugin in launcher.PLUGINS:
        launcher.write_shim(str(bin_dir / plugin), plugin, sys.executable, None, str(root / "run" / "daemon.sock"))
    return bin_dir


def call(path: pathlib.Path, command: str, stdin: bytes = b"", **extra: str) -> subprocess.CompletedProcess:
    env = {"PATH": BARE_PATH, "CNI_COMMAND": command, **extra}
    return subprocess.run([str(path)], input=stdin, env=env, capture_output=True, timeout=60)


def ipam_conf(data_dir: pathlib.Path, version_: str = "1.0.0") -> bytes:
    return json.dumps({"cniVersion": version_, "name": "donly", "type": "lease-ipam",
                       "ipam": {"type": "lease-ipam", "dataDir": str(data_dir), "ranges": [[{"subnet": "10.78.0.0/24"}]]}}).encode()


def ipam_env(bin_dir: pathlib.Path, cid: str = "c1") -> dict:
    return {"CNI_CONTAINERID": cid, "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "net1", "CNI_PATH": str(bin_dir)}


# --------------------------------------------------------------------------- the launcher's source


@pytest.mark.parametrize("module", ["launcher", "fast", "boot", "codecache"])
def test_shim_sources_parse_as_python_36(module):
    """They run on the node's python3 (DaemonSet mode): 3.6 syntax, no 3.7+ __future__, no f-strings."""
    path = pathlib.Path(launcher.__file__).with_name(module + ".py")
    source = path.read_text(encoding="utf-8")
    ast.parse(source, feature_version=(3, 6))
    assert "from __future__" not in source
    with open(path, "rb") as fh:
        strings = [t.string for t in tokenize.tokenize(fh.readline) if t.type == tokenize.STRING]
    assert not [s for s in strings if re.match(r"(?i)[rb]?f[rb]?['\"]", s)]


def test_rendered_daemon_only_shim():
    text = launcher.render_shim("macvlan-rdma", "/usr/bin/python3", None, "/run/x.sock")
    assert text.startswith("#!/usr/bin/python3 -IS\n# rdmanet CNI shim for macvlan-rdma (daemon only;")
    assert text.endswith("sys.exit(run('macvlan-rdma', None, '/run/x.sock', 0))\n")
    assert launcher.render_shim("macvlan-rdma", "/usr/bin/python3", "", "/run/x.sock") == text  # "" = None
    ast.parse(text, feature_version=(3, 6))
    with pytest.raises(ValueError):
        launcher.render_shim("macvlan-rdma", "/usr/bin/my python3", None)


def test_write_shim_is_write_and_rename_through_a_dot_file(tmp_path, monkeypatch):
    renames = []
    real_replace = os.replace

    def spy(src, dst):
        renames.append((os.path.basename(src), os.path.basename(dst), os.stat(src).st_mode & 0o777))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    launcher.write_shim(str(tmp_path / "lease-ipam"), "lease-ipam", "/usr/bin/python3", None)
    launcher.write_shim(str(tmp_path / "lease-ipam"), "lease-ipam", "/usr/bin/python3", None)
    assert [r[1] for r in renames] == ["lease-ipam", "lease-ipam"]
    assert all(re.fullmatch(r"\.lease-ipam\..+\.tmp", r[0]) and r[2] == 0o755 for r in renames), renames
    assert renames[0][0] != renames[1][0]  # unique: two installers at once never share a temporary
    assert os.listdir(tmp_path) == ["lease-ipam"]
    assert os.stat(tmp_path / "lease-ipam").st_mode & 0o777 == 0o755
    with pytest.raises(ValueError):
        launcher.write_shim(str(tmp_path / "nope"), "nope", "/usr/bin/python3", None)
    assert os.listdir(tmp_path) == ["lease-ipam"]


def test_python_m_shim_daemon_only(tmp_path, capsys):
    assert shim_main([str(tmp_path / "bin"), "--daemon-only", "--socket", "/run/s.sock"]) == 0
    for plugin in launcher.PLUGINS:
        text = (tmp_path / "bin" / plugin).read_text()
        assert text.startswith("#!/usr/bin/python3 -IS\n")  # the node's default python3
        assert text.endswith(f"sys.exit(run({plugin!r}, None, '/run/s.sock', 0))\n")
    assert shim_main([str(tmp_path / "b2"), "lease-ipam", "--daemon-only", "--python", "/usr/local/bin/python3"]) == 0
    assert os.listdir(tmp_path / "b2") == ["lease-ipam"]
    assert (tmp_path / "b2" / "lease-ipam").read_text().startswith("#!/usr/local/bin/python3 -IS\n")
    for bad in (["--daemon-only", "--python", "python3"], ["--daemon-only", "--site-dir", "/x"], ["nope"]):
        with pytest.raises(SystemExit) as info:
            shim_main([str(tmp_path / "b3"), *bad])
        assert info.value.code == 2
    # without --daemon-only: this interpreter and this venv's site-packages, as before
    assert shim_main([str(tmp_path / "b4"), "lease-ipam"]) == 0
    assert "None" not in (tmp_path / "b4" / "lease-ipam").read_text().splitlines()[-1]
    assert repr(sysconfig.get_path("purelib")) in (tmp_path / "b4" / "lease-ipam").read_text().splitlines()[-1]


# --------------------------------------------------------------------------- no daemon


@pytest.mark.parametrize("plugin", sorted(launcher.PLUGINS))
def test_version_without_daemon_is_the_plugins_own(root, plugin):
    bin_dir = daemon_only_shims(root)
    shim = call(bin_dir / plugin, "VERSION")
    own = call(VENV_BIN / plugin, "VERSION")  # the console script: the plugin itself, in-process
    assert own.returncode == 0 and own.stdout == (json.dumps(version.version_info()) + "\n").encode()
    assert (shim.returncode, shim.stdout, shim.stderr) == (0, own.stdout, b"")
    assert launcher.version_answer().encode() == own.stdout


@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK", "GC"])
def test_no_daemon_is_try_again_later_naming_the_socket(root, command):
    bin_dir = daemon_only_shims(root)
    proc = call(bin_dir / "lease-ipam", command, ipam_conf(root / "data", "1.1.0"), **ipam_env(bin_dir))
    assert proc.returncode == 1
    err = json.loads(proc.stdout)
    assert err["code"] == 11 and err["cniVersion"] == "1.1.0"
    assert str(root / "run" / "daemon.sock") in err["msg"] and DAEMONSET_PHRASE in err["msg"]
    assert "no in-process fallback" in err["details"]
    assert not (root / "data").exists()  # nothing ran


def test_no_daemon_status_is_not_available(root):
    bin_dir = daemon_only_shims(root)
    proc = call(bin_dir / "macvlan-rdma", "STATUS", b'{"cniVersion": "1.1.0", "name": "n", "type": "macvlan-rdma"}')
    assert proc.returncode == 1
    err = json.loads(proc.stdout)
    assert err["code"] == 50 and DAEMONSET_PHRASE in err["msg"]


def test_no_daemon_error_version_of_unreadable_stdin(root):
    bin_dir = daemon_only_shims(root)
    proc = call(bin_dir / "macvlan-rdma", "ADD", b"not json", **ipam_env(bin_dir))
    assert proc.returncode == 1 and json.loads(proc.stdout)["cniVersion"] == launcher.LATEST


def test_socket_env_overrides_the_baked_socket(root):
    bin_dir = daemon_only_shims(root)
    proc = call(bin_dir / "lease-ipam", "ADD", ipam_conf(root / "data"), RDMANET_DAEMON_SOCKET="/nonexistent/x.sock",
                **ipam_env(bin_dir))
    assert "/nonexistent/x.sock" in json.loads(proc.stdout)["msg"]


def test_daemon_only_shim_never_imports_the_plugins(root):
    bin_dir = daemon_only_shims(root)
    for command in ("VERSION", "ADD"):
        proc = subprocess.run([sys.executable, "-IS", "-X", "importtime", str(bin_dir / "lease-ipam")],
                              env={"CNI_COMMAND": command, **ipam_env(bin_dir)}, input=b"{}", capture_output=True,
                              text=False, timeout=30)
        names = {m.group(1).strip().split(".")[0]
                 for m in re.finditer(r"^import time:[^|]*\|[^|]*\|(.*)$", proc.stderr.decode(), re.MULTILINE)}
        assert names <= set(sys.stdlib_module_names) | {"imported package"}, names
        assert not names & {"cni", "ipam", "site", "pydantic", "pyroute2"}


# --------------------------------------------------------------------------- with the daemon


def test_through_the_daemon_same_bytes_as_a_shim_with_fallback(root):
    only = daemon_only_shims(root)
    fallback = root / "fallback"
    write_shims(fallback, str(root / "run" / "daemon.sock"))
    d = Daemon(str(root / "run" / "daemon.sock"), allow_uids=[os.getuid()])
    try:
        got = {}
        for label, bin_dir in (("only", only), ("fallback", fallback)):
            conf = ipam_conf(root / f"data-{label}")
            got[label] = [(p.returncode, p.stdout) for p in
                          (call(bin_dir / "lease-ipam", verb, conf, **ipam_env(bin_dir)) for verb in ("ADD", "CHECK", "DEL"))]
            version_ = call(bin_dir / "lease-ipam", "VERSION")
            got[label].append((version_.returncode, version_.stdout))
        assert health(d.socket)["requests"] == 8
    finally:
        d.cleanup()
    assert got["only"] == got["fallback"]
    assert json.loads(got["only"][0][1])["ips"][0]["address"] == "10.78.0.2/24"


@pytest.mark.parametrize("answer", [None, b"exec\n", b"exec protocol version 9 is not served\n"],
                         ids=["went-away", "declined", "declined-why"])
def test_daemon_gone_or_declining_is_try_again_later(root, answer):
    bin_dir = daemon_only_shims(root)
    fake = ScriptedDaemon(str(root / "run" / "daemon.sock"), answer)
    try:
        for command in ("ADD", "DEL"):
            proc = call(bin_dir / "lease-ipam", command, ipam_conf(root / "data"), **ipam_env(bin_dir))
            assert proc.returncode == 1
            err = json.loads(proc.stdout)
            assert err["code"] == 11 and err["cniVersion"] == "1.0.0"
            if answer and answer[5:].strip():
                assert answer[5:].strip().decode() in err["details"]
        assert not (root / "data").exists()
        proc = call(bin_dir / "lease-ipam", "VERSION")
        assert (proc.returncode, proc.stdout) == (0, launcher.version_answer().encode())
        assert fake.seen == 3
    finally:
        fake.close()


def test_a_full_accept_queue_is_waited_for_not_taken_for_absence(root):
    """EAGAIN on connect (the daemon's listen backlog is full during a burst of pod starts) must
    not turn into error 11 (daemon only) or an in-process run (with a fallback): the shim waits."""
    bin_dir = daemon_only_shims(root)
    path = str(root / "run" / "daemon.sock")
    os.makedirs(os.path.dirname(path))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    held = []
    try:
        while True:  # fill the backlog until a connect says EAGAIN
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(path)
            except BlockingIOError:
                c.close()
                break
            held.append(c)
        answer = b'0 17 0\n{"served": true}\n'
        env = {"PATH": BARE_PATH, "CNI_COMMAND": "ADD", **ipam_env(bin_dir)}
        shim = subprocess.Popen([str(bin_dir / "lease-ipam")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        shim.stdin.write(ipam_conf(root / "data"))
        shim.stdin.close()
        threading.Event().wait(0.7)
        assert shim.poll() is None  # still waiting for the queue
        for c in held:
            c.close()
        server.settimeout(10)
        while True:  # the held connections first (EOF at once), then the shim's
            conn, _ = server.accept()
            with conn:
                if read_request(conn):
                    conn.sendall(answer)
                    break
        assert shim.stdout.read() == b'{"served": true}\n'
        assert shim.wait(10) == 0
    finally:
        for c in held:
            c.close()
        server.close()


@pytest.mark.parametrize("socket_path", ["/run/rdmanet/daemon.sock", "/daemon.sock", "daemon.sock", "run//x/d.sock",
                                         "//d.sock", "/run/rdmanet/"])
@pytest.mark.parametrize("cid", [b"c1", b"x" * 150, b""])
def test_hot_path_journal_path_is_the_launchers(socket_path, cid):
    """The shim's hot path (rdmanet.node.fast) removes the journaled DEL an ADD supersedes by its own copy
    of journal_path (it does not import os): the same file the launcher writes."""
    from rdmanet.node import fast

    environb = {b"CNI_CONTAINERID": cid, b"CNI_IFNAME": b"net1"}
    assert fast.journal_path(socket_path, "macvlan-rdma", environb) == launcher.journal_path(socket_path, "macvlan-rdma", environb)


def test_hot_path_peer_check_is_the_launchers():
    """The hot path's copy of peer_refused (rdmanet.node.fast imports nothing of ours) is the
    launcher's: the same code, the same answers (a socketpair's peer is this process)."""
    from rdmanet.node import fast

    def body(fn):
        tree = ast.parse(__import__("textwrap").dedent(__import__("inspect").getsource(fn))).body[0]
        return ast.dump(ast.Module(tree.body[1:], []))  # without the docstring

    assert body(fast.peer_refused) == body(launcher.peer_refused)
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        for uid in (0, os.geteuid(), 12345):
            assert fast.peer_refused(a, uid) == launcher.peer_refused(a, uid)
        assert launcher.peer_refused(a, os.geteuid()) is None
