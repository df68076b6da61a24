"""install.sh: usage, and DaemonSet mode end to end (shims, kubeconfig and its refresh, the daemon).

DaemonSet mode runs here with ``--host-root /``, this venv as ``--prefix`` (the image's venv in a
real pod) and everything else under a temporary directory: the machine's /opt/cni/bin, /etc/cni
and /run/rdmanet are never touched. Every process a test starts is killed in a finalizer, also
when the test fails. Host mode (a pip install into a new venv, about 30 s) runs only with
RDMANET_TEST_HOST_INSTALL=1.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

import pytest

from rdmanet.cni.linux import roots
from rdmanet.node import launcher
from rdmanet.node.testing import health

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import KubeAPIServer  # noqa: E402
from policy_file import with_keys  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
INSTALL = ROOT / "install.sh"
PREFIX = pathlib.Path(sys.prefix)  # this venv: rdmanet is installed in it, as in the image's /opt/rdmanet
HOST_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
PLUGINS = sorted(launcher.PLUGINS)
# beside each shim, its hot path compiled by its first exec (install.sh's VERSION check): rdmanet/node/boot.py
CODE_FILES = sorted(os.path.basename(launcher.code_path(p)) for p in PLUGINS)
BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
NAMESPACE = "rdmanet-system"
DAEMONSET_PHRASE = "is the rdmanet DaemonSet pod running on this node?"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="install.sh runs as root")


def token() -> str:
    """A JWT-shaped token; every one has the same length (rotation must not rely on a size change)."""
    return "eyJhbGciOiJSUzI1NiJ9." + secrets.token_hex(40) + "." + secrets.token_hex(20)


def pids_with_parent(ppid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == ppid:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for(predicate, timeout: float, what: str, log=lambda: ""):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{log()}")
        time.sleep(0.05)


class Node:
    """A fake node for one test: a bin dir, a conf dir, a service account, a socket, the installer."""

    def __init__(self, base: pathlib.Path, short: pathlib.Path) -> None:
        self.base = base
        self.bin = base / "bin"
        self.conf = base / "conf"
        self.sa = base / "serviceaccount"
        self.socket = short / "run" / "daemon.sock"  # short: a unix socket path has at most 107 bytes
        self.kdir = self.conf / "rdmanet.d"
        self.kubeconfig = self.kdir / "rdmanet.kubeconfig"
        self.sa.mkdir()
        self.token = token()
        (self.sa / "token").write_text(self.token)
        (self.sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nZmFrZSBDQQ==\n-----END CERTIFICATE-----\n")
        (self.sa / "namespace").write_text(NAMESPACE)
        self.env = {"PATH": os.environ.get("PATH", BARE_PATH), "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                    "KUBERNETES_SERVICE_PORT": "443", "RDMANET_KUBECONFIG_REFRESH_SECONDS": "1",
                    "RDMANET_NODE_POLICY": os.environ["RDMANET_NODE_POLICY"]}  # roots in the temp dir: conftest.py
        self.procs: list[subprocess.Popen] = []
        self.loop_pids: set[int] = set()
        self.logs: list[pathlib.Path] = []

    def args(self, *extra: str, host_root: str = "/") -> list[str]:
        return [str(INSTALL), "--daemonset", "--prefix", str(PREFIX), "--bin-dir", str(self.bin),
                "--conf-dir", str(self.conf), "--socket", str(self.socket), "--host-root", host_root,
                "--host-python", HOST_PYTHON, "--serviceaccount-dir", str(self.sa), *extra]

    def run(self, *extra: str, env: Optional[dict] = None, **kw) -> subprocess.CompletedProcess:
        """install.sh to completion (usage errors, --uninstall, failures before the daemon)."""
        return subprocess.run(self.args(*extra, **kw), env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=120)

    def start(self, *extra: str, env: Optional[dict] = None, wait: bool = True, **kw) -> subprocess.Popen:
        """install.sh in the background until its daemon answers; killed in the finalizer."""
        log = self.base / f"install-{len(self.logs)}.log"
        self.logs.append(log)
        with open(log, "wb") as fh:
            proc = subprocess.Popen(self.args(*extra, **kw), env={**self.env, **(env or {})}, stdout=fh,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        if wait:
            wait_for(lambda: health(str(self.socket)) or proc.poll() is not None, 60, "the daemon", self.log)
            assert proc.poll() is None, self.log()
            assert health(str(self.socket))["pid"] == proc.pid  # install.sh exec'd the daemon
            self.loop_pids.update(pids_with_parent(proc.pid))
        return proc

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def stop(self, proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        proc.send_signal(sig)
        return proc.wait(timeout)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its group (a refresh loop)
        for pid in self.loop_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def node(tmp_path):
    short = pathlib.Path(tempfile.mkdtemp(prefix="rdn-inst-"))
    n = Node(tmp_path, short)
    try:
        yield n
    finally:
        n.cleanup()
        shutil.rmtree(short, ignore_errors=True)


def shim_call(node: Node, plugin: str, command: str, stdin: bytes = b"", **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(node.bin / plugin)], input=stdin, env={"PATH": BARE_PATH, "CNI_COMMAND": command, **extra},
                          capture_output=True, timeout=60)


def ipam_env(node: Node, cid: str) -> dict:
    return {"CNI_CONTAINERID": cid, "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "net1", "CNI_PATH": str(node.bin)}


def local_conf(data_dir: pathlib.Path) -> bytes:
    return json.dumps({"cniVersion": "1.0.0", "name": "dsnet", "type": "lease-ipam",
                       "ipam": {"type": "lease-ipam", "dataDir": str(data_dir), "ranges": [[{"subnet": "10.79.0.0/24"}]]}}).encode()


def json_lines(text: str) -> list[dict]:
    """Every line of ``text`` as one JSON object (what DaemonSet mode prints, the pod's log)."""
    docs = []
    for line in text.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\n{text}") from None
        assert isinstance(doc, dict) and {"ts", "level", "event"} <= doc.keys(), line
        docs.append(doc)
    return docs


def snapshot(*dirs: pathlib.Path) -> dict:
    """Every file and directory under ``dirs``: mode, inode and content."""
    out = {}
    for d in dirs:
        for path in sorted([d, *d.rglob("*")]) if d.exists() else []:
            st = path.lstat()
            out[str(path)] = (st.st_mode, st.st_ino, None if path.is_dir() else path.read_bytes())
    return out


# --------------------------------------------------------------------------- usage


def test_help_documents_both_modes_every_flag_and_env():
    proc = subprocess.run([str(INSTALL), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stderr == ""
    text = proc.stdout
    for word in ("Host mode", "DaemonSet mode", "--daemonset", "--uninstall", "--prefix", "--bin-dir", "--socket",
                 "--link-dir", "--conf-dir", "--host-python", "--host-root", "--serviceaccount-dir",
                 "RDMANET_INSTALL_MODE", "RDMANET_CNI_BIN_DIR", "RDMANET_CNI_CONF_DIR", "RDMANET_HOST_PYTHON",
                 "RDMANET_HOST_ROOT", "RDMANET_DAEMON_SOCKET", "RDMANET_SERVICEACCOUNT_DIR",
                 "RDMANET_KUBECONFIG_REFRESH_SECONDS", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
                 "/opt/rdmanet", "/opt/cni/rdmanet", "/proc/1/root", "rdmanet.kubeconfig", "0600",
                 "no in-process fallback", "error 11", DAEMONSET_PHRASE, "write + rename",
                 "--no-systemd", "RDMANET_SYSTEMD=no", "--systemd-root", "RDMANET_SYSTEMD_ROOT", "rdmanet.socket",
                 "rdmanet.service", "/run/systemd/system", "/etc/default/rdmanet", "--node-name", "--kubeconfig",
                 "RDMANET_NODE_NAME", "never for the hostname"):
        assert word in text, word


@pytest.mark.parametrize("argv,env", [
    (["--bogus"], {}),
    (["--bin-dir"], {}),
    (["--bin-dir", "relative/bin"], {}),
    (["--bin-dir=relative"], {}),
    (["--uninstall=yes"], {}),
    (["--conf-dir", "/tmp/x"], {}),  # a DaemonSet-mode flag in host mode
    (["--host-python", "/usr/bin/python3"], {}),
    (["--daemonset", "--link-dir", "/tmp/x"], {}),  # a host-mode flag in DaemonSet mode
    (["--daemonset", "--host-root"], {}),
    ([], {"RDMANET_INSTALL_MODE": "pod"}),
    ([], {"RDMANET_INSTALL_MODE": "daemonset", "RDMANET_HOST_PYTHON": "python3"}),
    (["--daemonset"], {"RDMANET_KUBECONFIG_REFRESH_SECONDS": "0"}),
    (["--daemonset"], {"RDMANET_KUBECONFIG_REFRESH_SECONDS": "soon"}),
    (["--node-policy", "/etc/rdmanet/node-policy.json"], {}),  # DaemonSet mode only
    (["--daemonset", "--node-policy", "node-policy.json"], {}),
    (["--daemonset", "--no-systemd"], {}),  # host mode only
    (["--daemonset", "--systemd-root", "/tmp/x"], {}),
    (["--systemd-root", "relative"], {}),
    (["--no-systemd=yes"], {}),
    ([], {"RDMANET_SYSTEMD": "yes"}),
    ([], {"RDMANET_SYSTEMD_ROOT": "relative"}),
    (["--node-name", "GPU-Node01"], {}),  # not a Node name: node names are lower case
    (["--node-name"], {}),
    (["--daemonset", "--node-name", "gpu-node01"], {}),  # host mode only: the DaemonSet has the downward API
    (["--kubeconfig", "kubeconfig"], {}),
])
def test_bad_usage_exits_2(tmp_path, argv, env):
    proc = subprocess.run([str(INSTALL), *argv], env={"PATH": BARE_PATH, **env}, capture_output=True, text=True,
                          timeout=30, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--help" in proc.stderr and proc.stdout == ""
    if "--daemonset" in argv or env.get("RDMANET_INSTALL_MODE") == "daemonset":  # the pod's log: JSON lines
        [doc] = json_lines(proc.stderr)
        assert (doc["level"], doc["event"], doc["component"]) == ("error", "usage_error", "install.sh"), doc
    else:
        assert proc.stderr.startswith("install.sh: ")
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- DaemonSet mode


@needs_root
def test_daemonset_node_policy_reaches_the_daemon(node):
    """--node-policy FILE: the daemon's calls use that policy (docs/security.md), whatever the
    daemon's own environment says."""
    allowed = node.base / "allowed"
    policy = node.base / "node-policy.json"
    policy.write_text(json.dumps({"dataRoots": [str(allowed)]}))
    policy.chmod(0o600)
    node.start("--node-policy", str(policy))
    assert f"with node policy {policy}" in node.log()
    add = shim_call(node, "lease-ipam", "ADD", local_conf(node.base / "ipam-data"), **ipam_env(node, "c1"))
    err = json.loads(add.stdout)
    assert add.returncode == 1 and err["code"] == 7 and "ipam.dataDir" in err["msg"] and str(allowed) in err["msg"]
    add = shim_call(node, "lease-ipam", "ADD", local_conf(allowed / "ipam"), **ipam_env(node, "c1"))
    assert add.returncode == 0, add.stdout


@needs_root
def test_daemonset_mode_end_to_end(node):
    proc = node.start()
    log = node.log()

    # the shims: 0755, the node's python, daemon only, no temporary left; each one's code file
    assert sorted(os.listdir(node.bin)) == sorted(PLUGINS + CODE_FILES)
    for plugin in PLUGINS:
        path = node.bin / plugin
        assert path.stat().st_mode & 0o7777 == 0o755
        lines = path.read_text().splitlines()
        assert lines[0] == f"#!{HOST_PYTHON} -IS"
        assert lines[1].startswith(f"# rdmanet CNI shim for {plugin} (daemon only;")
        assert lines[-1] == f"    sys.exit(run({plugin!r}, None, {str(node.socket)!r}, 0))"

    # the kubeconfig: 0600 in a 0700 dir, the CA copied beside it, loadable, with the token
    assert node.kdir.stat().st_mode & 0o777 == 0o700
    assert sorted(os.listdir(node.kdir)) == ["ca.crt", "rdmanet.kubeconfig"]
    for f in ("ca.crt", "rdmanet.kubeconfig"):
        assert (node.kdir / f).stat().st_mode & 0o777 == 0o600
    assert (node.kdir / "ca.crt").read_bytes() == (node.sa / "ca.crt").read_bytes()
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(node.kubeconfig), client_configuration=cfg, persist_config=False)
    assert cfg.host == "https://10.96.0.1:443"
    assert cfg.api_key["BearerToken"] == f"Bearer {node.token}"
    assert cfg.ssl_ca_cert == str(node.kdir / "ca.crt")
    _, active = config.list_kube_config_contexts(config_file=str(node.kubeconfig))
    assert active["context"]["namespace"] == NAMESPACE
    assert node.token not in log  # never in a log

    # the daemon answers: --check, VERSION and a real call through the shims
    check = subprocess.run([str(PREFIX / "bin" / "rdmanet"), "daemon", "--check", "--socket", str(node.socket)],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and json.loads(check.stdout)["pid"] == proc.pid
    before = health(str(node.socket))["requests"]
    for plugin in PLUGINS:
        own = subprocess.run([str(PREFIX / "bin" / plugin)], env={"CNI_COMMAND": "VERSION"}, capture_output=True)
        got = shim_call(node, plugin, "VERSION")
        assert (got.returncode, got.stdout) == (0, own.stdout)
    conf = local_conf(node.base / "ipam-data")
    add = shim_call(node, "lease-ipam", "ADD", conf, **ipam_env(node, "c1"))
    assert add.returncode == 0, add.stdout + add.stderr
    assert json.loads(add.stdout)["ips"][0]["address"] == "10.79.0.2/24"
    assert (node.base / "ipam-data" / "dsnet").is_dir()
    assert health(str(node.socket))["requests"] == before + len(PLUGINS) + 1  # one VERSION each, one ADD

    # a rotated token (same length) is in the kubeconfig within seconds; the CA file is untouched
    loops = [p for p in node.loop_pids if alive(p)]
    assert len(loops) == 1, node.loop_pids
    ca_inode = (node.kdir / "ca.crt").stat().st_ino
    rotated = token()
    assert len(rotated) == len(node.token)
    (node.sa / "token").write_text(rotated)
    wait_for(lambda: rotated in node.kubeconfig.read_text(), 10, "the rotated token in the kubeconfig", node.log)
    assert node.kubeconfig.stat().st_mode & 0o777 == 0o600
    assert (node.kdir / "ca.crt").stat().st_ino == ca_inode
    assert sorted(os.listdir(node.kdir)) == ["ca.crt", "rdmanet.kubeconfig"]
    assert rotated not in node.log()

    # SIGTERM: the daemon stops (exit 0, socket removed), and the refresh loop with it
    assert node.stop(proc) == 0, node.log()
    wait_for(lambda: not alive(loops[0]), 10, "the refresh loop to exit")
    assert not node.socket.exists()

    # the pod's whole log, install.sh's lines as much as the kubeconfig writer's and the daemon's:
    # one JSON object per line
    events = [(d.get("component"), d["event"]) for d in json_lines(node.log())]
    for expected in [("install.sh", "host_python"), *[("install.sh", "installed")] * len(PLUGINS),
                     ("install.sh", "kubeconfig_written"), ("install.sh", "daemon_starting")]:
        assert expected in events, (expected, events)
    assert events.index(("install.sh", "daemon_starting")) < len(events) - 1  # the daemon's own lines follow

    # the shims stay; without the daemon they say so, and VERSION still answers
    add = shim_call(node, "lease-ipam", "ADD", conf, **ipam_env(node, "c2"))
    assert add.returncode == 1
    err = json.loads(add.stdout)
    assert err["code"] == 11 and str(node.socket) in err["msg"] and DAEMONSET_PHRASE in err["msg"]
    version = shim_call(node, "macvlan-rdma", "VERSION")
    assert version.returncode == 0 and b"supportedVersions" in version.stdout


@needs_root
def test_uninstall_in_the_running_pod_stays_uninstalled(node):
    """README's uninstall runs install.sh --uninstall in the running pod: the refresh loop must not
    write the kubeconfig back (it used to, a round later, with a token that dies with the
    ServiceAccount), even when the token rotates after the uninstall."""
    proc = node.start()
    [loop] = [p for p in node.loop_pids if alive(p)]
    out = node.run("--uninstall")
    assert out.returncode == 0, out.stdout + out.stderr
    assert [d["event"] for d in json_lines(out.stdout)][-1] == "uninstalled" and out.stderr == ""
    assert not node.kdir.exists() and os.listdir(node.bin) == []
    (node.sa / "token").write_text(token())  # something a refresh would write
    wait_for(lambda: not alive(loop), 10, "the refresh loop to stop", node.log)
    time.sleep(3)  # three refresh intervals
    assert not node.kdir.exists(), node.log()
    stopped = [d for d in json_lines(node.log()) if d["event"] == "kubeconfig_refresh_stopped"]
    assert len(stopped) == 1 and "uninstall" in stopped[0]["reason"], node.log()
    assert health(str(node.socket))["pid"] == proc.pid  # the daemon itself runs on until the pod goes
    assert node.stop(proc) == 0


@needs_root
def test_uninstall_and_a_refresh_round_are_serialised_by_the_directory_lock(node):
    """A refresh round that begins while the uninstall removes the files waits for it (flock on
    the kubeconfig directory, as install.sh --uninstall takes it) and then writes nothing."""
    import fcntl

    proc = node.start()
    [loop] = [p for p in node.loop_pids if alive(p)]
    old = node.kubeconfig.read_text()
    fd = os.open(node.kdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what the uninstall holds while it removes
        (node.sa / "token").write_text(token())
        time.sleep(2.5)  # two rounds are due: both wait for the lock
        assert node.kubeconfig.read_text() == old, "a refresh round wrote while the directory was locked"
        for f in node.kdir.iterdir():
            f.unlink()
        node.kdir.rmdir()
    finally:
        os.close(fd)
    wait_for(lambda: not alive(loop), 10, "the refresh loop to stop", node.log)
    assert not node.kdir.exists(), node.log()
    assert node.stop(proc) == 0


@needs_root
def test_bin_dir_mounted_elsewhere_is_refused_naming_both_paths(node, tmp_path):
    """--bin-dir's hostPath mounted at another path in the container, while the node's own
    --bin-dir holds (older) shims that answer VERSION: the installer must not report success for
    shims the kubelet never runs. Here the "container" is install.sh in a private mount namespace
    where node.bin is a bind mount of another directory; the "node" is this process's root."""
    node.stop(node.start())  # the node's own bin dir: shims from an earlier install
    old = {p: (node.bin / p).read_bytes() for p in PLUGINS}
    elsewhere = tmp_path / "kubelet-bin"  # the hostPath, mounted at node.bin in the container
    elsewhere.mkdir()
    host_root = f"/proc/{os.getpid()}/root"
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh", str(elsewhere), str(node.bin),
                           *node.args(host_root=host_root)],
                          env=node.env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [doc] = json_lines(proc.stderr)
    assert doc["event"] == "shim_not_on_node", doc
    m = re.search(rf"wrote {re.escape(str(node.bin))}/([a-z-]+) in this container", doc["msg"])
    assert m and m.group(1) in PLUGINS, doc["msg"]
    first = f"{node.bin}/{m.group(1)}"
    assert f"seen here as {host_root}{first}" in doc["msg"] and "is another file" in doc["msg"]
    assert f"is the node's {elsewhere}." in doc["msg"], doc["msg"]  # where the shims really went
    assert "hostPath = mountPath" in doc["msg"]
    assert not node.socket.exists() and not any(d["event"] == "daemon_starting" for d in json_lines(proc.stdout))
    assert {p: (node.bin / p).read_bytes() for p in PLUGINS} == old


@needs_root
def test_refresh_loop_does_not_outlive_a_killed_daemon(node):
    proc = node.start()
    loops = [p for p in node.loop_pids if alive(p)]
    assert len(loops) == 1
    proc.kill()  # SIGKILL: no cleanup of its own
    proc.wait(10)
    wait_for(lambda: not alive(loops[0]), 10, "the refresh loop to exit")


@needs_root
def test_running_twice_is_idempotent(node):
    node.env["KUBERNETES_SERVICE_HOST"] = "fd00:10:96::1"  # IPv6: in brackets
    first = node.start()
    assert node.stop(first) == 0
    after_first = snapshot(node.bin, node.conf)
    second = node.start()
    assert node.stop(second) == 0
    after_second = snapshot(node.bin, node.conf)
    # the same files, modes and bytes; the unchanged kubeconfig and CA were not even rewritten
    assert after_second.keys() == after_first.keys()
    for path, (mode, inode, data) in after_first.items():
        assert (after_second[path][0], after_second[path][2]) == (mode, data), path
        if path.startswith(str(node.kdir)):
            assert after_second[path][1] == inode, path
    assert '"server": "https://[fd00:10:96::1]:443"' in node.log()
    assert "server: \"https://[fd00:10:96::1]:443\"" in node.kubeconfig.read_text()
    assert '"kubeconfig_unchanged"' in node.log()


@needs_root
def test_second_installer_while_one_runs_leaves_the_first_serving(node):
    first = node.start()
    second = node.start(wait=False)
    assert second.wait(60) == 1  # its daemon refuses the live socket
    assert "another daemon" in node.log()
    assert health(str(node.socket))["pid"] == first.pid
    assert sorted(os.listdir(node.bin)) == sorted(PLUGINS + CODE_FILES)
    assert node.stop(first) == 0


@needs_root
def test_uninstall_removes_only_what_it_wrote(node):
    node.bin.mkdir()
    (node.bin / "bridge").write_text("#!/bin/sh\n")  # another plugin
    node.conf.mkdir()
    (node.conf / "00-multus.conf").write_text("{}")
    foreign = node.base / "other-bin"
    foreign.mkdir()
    (foreign / "lease-ipam").write_text("#!/bin/sh\necho not ours\n")
    others = snapshot(node.bin, node.conf, foreign)
    node.stop(node.start())
    assert set(os.listdir(node.bin)) == {"bridge", *PLUGINS, *CODE_FILES}
    (node.bin / f".{PLUGINS[0]}.code.1234.abcd1234.tmp").write_bytes(b"")  # a shim killed while writing it
    (node.bin / f".{PLUGINS[0]}.texts").write_bytes(b"")  # an in-process call's (rdmanet/node/compiled_texts.py)
    proc = node.run("--uninstall")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert snapshot(node.bin, node.conf, foreign) == others
    assert node.run("--uninstall").returncode == 0  # again: nothing left to do
    # a bin dir whose lease-ipam is not ours: left alone
    proc = subprocess.run([str(INSTALL), "--daemonset", "--uninstall", "--bin-dir", str(foreign),
                           "--conf-dir", str(node.conf)], env=node.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "not an rdmanet shim" in proc.stdout
    assert (foreign / "lease-ipam").read_text() == "#!/bin/sh\necho not ours\n"
    # a kubeconfig dir holding someone else's file: ours removed, theirs and the dir left
    node.stop(node.start())
    (node.kdir / "notes.txt").write_text("mine")
    assert node.run("--uninstall").returncode == 0
    assert os.listdir(node.kdir) == ["notes.txt"]


@needs_root
def test_no_service_account_no_kubeconfig(node):
    for f in ("token", "ca.crt", "namespace"):
        (node.sa / f).unlink()
    proc = node.start()
    assert not node.kdir.exists()
    assert '"kubeconfig_skipped"' in node.log() and "no service account" in node.log()
    assert node.loop_pids == set() or not any(alive(p) for p in node.loop_pids)
    assert shim_call(node, "lease-ipam", "VERSION").returncode == 0
    assert node.stop(proc) == 0


@needs_root
def test_host_root_through_chroot(node):
    """--host-root other than /: the checks run through chroot (/proc/self/root is this root)."""
    proc = node.start(host_root="/proc/self/root")
    assert "the node's" in node.log() and sorted(os.listdir(node.bin)) == sorted(PLUGINS + CODE_FILES)
    assert node.stop(proc) == 0


@needs_root
@pytest.mark.parametrize("python,why", [("/nonexistent/python3", "does not run"), ("old", "Python 2.7")])
def test_bad_host_python_is_refused_naming_the_flag(node, python, why):
    if python == "old":
        fake = node.base / "python2"
        fake.write_text("#!/bin/sh\necho 2.7\n")
        fake.chmod(0o755)
        python = str(fake)
    args = node.args()
    args[args.index("--host-python") + 1] = python
    proc = subprocess.run(args, env=node.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "--host-python" in proc.stderr and why in proc.stderr and ">= 3.6" in proc.stderr, proc.stderr
    assert not node.bin.exists() and not node.conf.exists()  # refused before writing anything


@needs_root
def test_prefix_without_rdmanet_is_refused(node, tmp_path):
    args = node.args()
    args[args.index("--prefix") + 1] = str(tmp_path / "empty")
    proc = subprocess.run(args, env=node.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "--prefix" in proc.stderr
    assert not node.bin.exists()


@needs_root
def test_a_socket_directory_others_may_write_is_refused(node, tmp_path):
    """Anyone could bind the socket there while the daemon is down: install.sh says so and
    writes nothing (the shims would trust nobody there anyway, the daemon would not start)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    args = node.args()
    args[args.index("--socket") + 1] = str(shared / "daemon.sock")
    proc = subprocess.run(args, env=node.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [line] = json_lines(proc.stderr)
    assert line["event"] == "unsafe_socket_dir" and "writable by others" in line["msg"] and str(shared) in line["msg"]
    assert not node.bin.exists() and os.listdir(shared) == []


@needs_root
def test_kube_store_through_the_daemon_follows_token_rotation(node):
    """lease-ipam's Lease store in the daemon, through a shim, with the kubeconfig install.sh wrote:
    after the token rotates (same length), the API server takes only the new one, and ADD works."""
    server = KubeAPIServer(token=node.token)
    # the kubeconfig names the cluster's address (10.96.0.1); the node owner lets configs send it to the fake server
    node.env["RDMANET_NODE_POLICY"] = str(with_keys(node.base / "policy-api.json", apiRoots=[server.url]))
    try:
        proc = node.start()
        conf = json.dumps({"cniVersion": "1.0.0", "name": "kubenet", "type": "lease-ipam",
                           "ipam": {"type": "lease-ipam", "range": "10.80.0.0/24",
                                    "kubernetes": {"kubeconfig": str(node.kubeconfig), "k8s_api_root": server.url,
                                                   "timeout_seconds": 5}}}).encode()

        def add(cid: str) -> subprocess.CompletedProcess:
            return shim_call(node, "lease-ipam", "ADD", conf, RDMANET_NODE_NAME="node-a",
                             CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid};K8S_POD_UID=uid-{cid}",
                             **ipam_env(node, cid))

        first = add("c1")
        assert first.returncode == 0, first.stdout + first.stderr
        ip1 = json.loads(first.stdout)["ips"][0]["address"]
        assert ip1.startswith("10.80.0.") and ip1.endswith("/24")
        leases = claim_leases(server, NAMESPACE)  # the context's namespace: the service account's
        assert len(leases) == 1
        rotated = token()
        (node.sa / "token").write_text(rotated)
        server.token = rotated  # the old token is refused from now on
        wait_for(lambda: rotated in node.kubeconfig.read_text(), 10, "the rotated token", node.log)
        second = add("c2")
        assert second.returncode == 0, second.stdout + second.stderr
        ip2 = json.loads(second.stdout)["ips"][0]["address"]
        assert ip2.startswith("10.80.0.") and ip2 != ip1
        assert len(claim_leases(server, NAMESPACE)) == 2
        assert node.stop(proc) == 0
    finally:
        server.stop()


# --------------------------------------------------------------------------- host mode


@needs_root
@pytest.mark.skipif(os.environ.get("RDMANET_TEST_HOST_INSTALL") != "1",
                    reason="host mode pip-installs rdmanet and its dependencies into a new venv (about 30 s, "
                           "package index needed): set RDMANET_TEST_HOST_INSTALL=1")
def test_host_mode_twice_then_uninstall(tmp_path):
    """Host mode on a host that systemd runs (a root of its own, --systemd-root: this machine's
    systemd, if any, is never touched): the shims, the link, and rdmanet.socket + rdmanet.service
    written and the socket enabled (the symlink `systemctl enable` makes); again: the same files;
    without systemd or with --no-systemd: no units and the command that starts the daemon;
    --uninstall: all of it gone, the units disabled first."""
    prefix, bin_dir, bin2, link_dir = (tmp_path / d for d in ("venv", "bin", "bin2", "lbin"))
    bin_dir.mkdir()
    (bin_dir / "bridge").write_text("#!/bin/sh\n")
    sock = tmp_path / "run" / "none.sock"
    sysroot = tmp_path / "sysroot"
    (sysroot / "run" / "systemd" / "system").mkdir(parents=True)  # what sd_booted(3) looks for
    units = sysroot / "etc" / "systemd" / "system"
    start_daemon = f"{prefix}/bin/rdmanet daemon --socket {sock}"

    def install(*extra: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(INSTALL), "--prefix", str(prefix), "--link-dir", str(link_dir), "--socket", str(sock),
                               "--systemd-root", str(sysroot), *extra], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    first = install("--bin-dir", str(bin_dir), "--node-name", "gpu-node01")
    # the Node name in the daemon's environment (no API to confirm it with here: written as given)
    assert (sysroot / "etc" / "default" / "rdmanet").read_text().endswith("\nRDMANET_NODE_NAME=gpu-node01\n")
    assert "RDMANET_NODE_NAME=gpu-node01 written to" in first.stdout and "not confirmed" in first.stdout
    for plugin in PLUGINS:
        lines = (bin_dir / plugin).read_text().splitlines()
        assert lines[0] == f"#!{prefix}/bin/python -IS" and "falls back to" in lines[1]
    assert os.readlink(link_dir / "rdmanet") == f"{prefix}/bin/rdmanet"
    assert sorted(os.listdir(units)) == ["rdmanet.service", "rdmanet.socket", "sockets.target.wants"]
    assert os.listdir(units / "sockets.target.wants") == ["rdmanet.socket"]
    assert os.readlink(units / "sockets.target.wants" / "rdmanet.socket") == "/etc/systemd/system/rdmanet.socket"
    socket_unit, service_unit = (units / "rdmanet.socket").read_text(), (units / "rdmanet.service").read_text()
    assert f"\nListenStream={sock}\n" in socket_unit and "\nSocketMode=0600\n" in socket_unit
    assert f"\nExecStart={start_daemon}\n" in service_unit
    assert f"enabled rdmanet.socket and rdmanet.service under {sysroot}" in first.stdout
    if shutil.which("systemd-analyze"):  # the units as systemd reads them, ExecStart= the venv's rdmanet
        verify = subprocess.run(["systemd-analyze", "verify", str(units / "rdmanet.socket"),
                                 str(units / "rdmanet.service")], capture_output=True, text=True, timeout=60)
        assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")
    shims = {p: (bin_dir / p).read_bytes() for p in PLUGINS}
    manifest = (prefix / "installed-files").read_text()
    assert f"{units}/rdmanet.socket\n{units}/rdmanet.service\n" in manifest
    install("--bin-dir", str(bin_dir))  # again: the same files
    assert {p: (bin_dir / p).read_bytes() for p in PLUGINS} == shims
    assert (prefix / "installed-files").read_text() == manifest
    assert (units / "rdmanet.socket").read_text() == socket_unit and (units / "rdmanet.service").read_text() == service_unit
    # no systemd on that root, or the opt-out: no units written, and how to start the daemon instead
    bare = tmp_path / "bare-root"
    bare.mkdir()
    without = install("--bin-dir", str(bin_dir), "--systemd-root", str(bare))
    assert f"systemd does not run this host (no {bare}/run/systemd/system)" in without.stdout
    assert start_daemon in without.stdout and os.listdir(bare) == []
    opted_out = install("--bin-dir", str(bin_dir), "--no-systemd")
    assert "no systemd units (--no-systemd" in opted_out.stdout and start_daemon in opted_out.stdout
    assert "rdmanet.socket from an earlier install is still there" in opted_out.stdout
    assert (prefix / "installed-files").read_text() == manifest  # the earlier units are still listed
    assert sorted(os.listdir(bin_dir)) == sorted(["bridge", *PLUGINS, *CODE_FILES])
    # no daemon: the shim runs the plugin in-process (under the node policy a runtime hands it:
    # the session's, whose data roots include the temporary directory)
    add = subprocess.run([str(bin_dir / "lease-ipam")], input=local_conf(tmp_path / "data"), capture_output=True,
                         env={"PATH": BARE_PATH, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1",
                              "CNI_NETNS": "/proc/self/ns/net", "CNI_IFNAME": "net1", "CNI_PATH": str(bin_dir),
                              roots.POLICY_ENV: os.environ[roots.POLICY_ENV]})
    assert add.returncode == 0 and json.loads(add.stdout)["ips"][0]["address"] == "10.79.0.2/24"
    install("--bin-dir", str(bin2))  # another bin dir: both are remembered
    assert len((prefix / "installed-files").read_text().split()) == 2 * len(PLUGINS) + 1 + 2  # + the link, the units
    (bin2 / "lease-ipam").write_text("#!/bin/sh\n")  # replaced by someone else: not ours any more

    # The running systemd's path (--systemd-root /), then --uninstall, in a mount namespace of their
    # own: /etc/systemd/system, /run and /var/lib/cni are empty tmpfs there (/run/systemd/system made: systemd
    # "runs"), and systemctl is a stand-in that records its calls (--root ones go to the real one).
    calls, out = tmp_path / "systemctl-calls", tmp_path / "live"
    out.mkdir()
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "systemctl").write_text(f"""#!/bin/sh
case "$1" in --root=*) exec {shutil.which("systemctl")} "$@" ;; esac
echo "$*" >> {calls}
case "$*" in *is-active*) exit 3 ;; esac
""")
    (fake / "systemctl").chmod(0o755)
    script = f"""set -eu
mount -t tmpfs tmpfs /etc/systemd/system
mount -t tmpfs tmpfs /run
if [ -d /var/lib/cni ]; then mount -t tmpfs tmpfs /var/lib/cni; fi  # the uninstall clears the demo's store there
mkdir -p /run/systemd/system
export PATH={fake}:$PATH
{INSTALL} --prefix {prefix} --link-dir {link_dir} --socket {sock} --bin-dir {bin_dir} > {out}/install.out 2>&1
echo -- >> {calls}
ls -A /etc/systemd/system > {out}/units
cp /etc/systemd/system/rdmanet.service {out}/rdmanet.service
{INSTALL} --prefix {prefix} --link-dir {link_dir} --socket {sock}.moved --bin-dir {bin_dir} > {out}/moved.out 2>&1
echo -- >> {calls}
{INSTALL} --uninstall --prefix {prefix} > {out}/uninstall.out 2>&1
ls -A /etc/systemd/system > {out}/units-after
"""
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script], capture_output=True,
                          text=True, timeout=600)
    logs = {p.name: p.read_text() for p in out.iterdir()}
    assert proc.returncode == 0, (proc.stdout, proc.stderr, logs)
    assert calls.read_text().splitlines() == [
        "--quiet is-active rdmanet.socket",  # a daemon systemd did not start is looked for first
        "daemon-reload", "--quiet enable --now rdmanet.socket", "try-restart rdmanet.service", "--",
        # again with another --socket: the listening socket moves there (a restart), the daemon restarts
        "--quiet is-active rdmanet.socket", "daemon-reload", "--quiet enable --now rdmanet.socket",
        "restart rdmanet.socket", "try-restart rdmanet.service", "--",
        "--quiet disable --now rdmanet.socket", "--quiet disable --now rdmanet.service", "daemon-reload"]
    assert logs["units"].split() == ["rdmanet.service", "rdmanet.socket"] and logs["units-after"] == ""
    assert f"\nExecStart={start_daemon}\n" in logs["rdmanet.service"]
    assert f"enabled rdmanet.socket: systemd listens on {sock}" in logs["install.out"]
    assert f"rdmanet.socket moved from {sock} to {sock}.moved" in logs["moved.out"]
    uninstall = logs["uninstall.out"]
    for unit in (f"{units}/rdmanet.socket", f"{units}/rdmanet.service", "/etc/systemd/system/rdmanet.socket",
                 "/etc/systemd/system/rdmanet.service"):
        assert f"removed {unit}\n" in uninstall, uninstall
    assert os.listdir(bin_dir) == ["bridge"] and os.listdir(bin2) == ["lease-ipam"]
    assert not link_dir.exists() and f"removed {link_dir}\n" in uninstall  # install made it: it goes once empty
    assert f"left {bin2}: it holds files of others (install.sh created it)\n" in uninstall
    assert os.listdir(units) == []  # disabled (no symlink left) and removed
    assert not prefix.exists()


@needs_root
@pytest.mark.parametrize("demo_kept", [False, True], ids=["after-demo-down", "demo-kept"])
def test_host_uninstall_clears_what_install_and_the_demo_left(tmp_path, demo_kept):
    """Host mode's --uninstall on a host where the demo ran (its store made by the real plugin, at
    the real paths, in a mount namespace whose /run and /var/lib are empty tmpfs): the shims, the
    bin dir install created, the demo's store, the lock files and /run/rdmanet go, and each is
    said; a claim the demo still holds is kept, and said. The venv is a stand-in for the one
    install makes (a wrapper of this one: a real one takes ~30 s, test_host_mode_twice_then_uninstall)."""
    from rdmanet.cli.demo import CONTAINER_ID, demo_config
    from rdmanet.node.testing import write_shims

    prefix, bin_dir, out = tmp_path / "venv", tmp_path / "opt-cni-bin", tmp_path / "out"
    (prefix / "bin").mkdir(parents=True)
    out.mkdir()
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (prefix / "bin" / "python").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (prefix / "bin" / "python").chmod(0o755)
    write_shims(bin_dir, "/run/rdmanet/daemon.sock")
    (prefix / "installed-files").write_text("".join(f"{bin_dir}/{p}\n" for p in PLUGINS))
    (prefix / "created-dirs").write_text(f"{bin_dir}\n")
    conf = tmp_path / "demo.json"
    conf.write_text(json.dumps(demo_config("eth0")))
    lease_ipam = pathlib.Path(sys.executable).parent / "lease-ipam"
    cni = f"CNI_CONTAINERID={CONTAINER_ID} CNI_NETNS=/x CNI_IFNAME=net1 CNI_PATH=/x"
    script = f"""set -eu
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /var/lib
mkdir -p -m 0700 /run/rdmanet/locks
touch /run/rdmanet/locks/07.lock /run/rdmanet/locks/a1.lock
env {cni} CNI_COMMAND=ADD {lease_ipam} < {conf} > {out}/add.out
{"" if demo_kept else f"env {cni} CNI_COMMAND=DEL {lease_ipam} < {conf}"}
{INSTALL} --uninstall --prefix {prefix} > {out}/uninstall.out 2>&1
find /run /var/lib | sort > {out}/after
"""
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script], capture_output=True,
                          text=True, timeout=120)
    logs = {p.name: p.read_text() for p in out.iterdir()}
    assert proc.returncode == 0, (proc.stdout, proc.stderr, logs)
    said = logs["uninstall.out"].splitlines()
    demo_store = "/var/lib/cni/lease-ipam/rdmanet-demo"
    address = json.loads(logs["add.out"])["ips"][0]["address"].split("/")[0]
    for line in [*(f"install.sh: removed {bin_dir}/{p}" for p in PLUGINS),
                 "install.sh: removed 2 lock file(s) in /run/rdmanet/locks", "install.sh: removed /run/rdmanet/locks",
                 f"install.sh: removed {bin_dir}", f"install.sh: removed {prefix}", "rdmanet uninstalled"]:
        assert line in said, logs["uninstall.out"]
    if demo_kept:
        assert (f"install.sh: kept {demo_store}: the demo's attachment still holds {address} "
                "(rdmanet demo --down releases it)") in said
        assert f"{demo_store}/{address}" in logs["after"].split()
    else:
        assert f"install.sh: removed {demo_store}" in said and "install.sh: removed /var/lib/cni/lease-ipam" in said
        assert "install.sh: removed /run/rdmanet" in said
        assert [f for f in logs["after"].split() if "rdmanet" in f or "lease-ipam" in f] == [], logs["after"]
    assert not bin_dir.exists() and not prefix.exists()


# --------------------------------------------------------------------------- rdmanet.ipam.kube_config's cache


def test_connect_sees_a_same_size_rewrite_within_one_mtime_tick(tmp_path):
    """A token rotated to one of the same length, rewritten with the same mtime (and even in place,
    same inode): connect() must not hand out the client with the old token."""
    from rdmanet.ipam.kube_config import KubeSettings, connect

    path = tmp_path / "kubeconfig"

    def write(tok: str) -> None:
        path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:1"}}}}]
users: [{{name: u, user: {{token: "{tok}"}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: ns}}}}]
current-context: x
""")

    old, new = token(), token()
    write(old)
    st = path.stat()
    settings = KubeSettings(kubeconfig=str(path))
    a = connect(settings)
    assert connect(settings) is a  # cached
    assert a.api_client.configuration.api_key["BearerToken"] == f"Bearer {old}"
    write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns, path.stat().st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    b = connect(settings)
    assert b is not a and b.api_client.configuration.api_key["BearerToken"] == f"Bearer {new}"
    assert connect(settings) is b
