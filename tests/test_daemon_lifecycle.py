"""The daemon's edges: protocol versions, its own environment, and stopping with callers queued."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.node import daemon as daemon_mod
from rdmanet.node.launcher import JSON_PROTOCOL, PROTOCOL, NoDaemon, call, exchange, read_line, unb64
from rdmanet.node.testing import Daemon, shim_env

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import KubeAPIServer, write_kubeconfig  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
VERSION_REQUEST = {"v": JSON_PROTOCOL, "plugin": "lease-ipam", "env": {"CNI_COMMAND": "VERSION"}, "stdin_b64": ""}


@pytest.fixture
def env_dir():
    with shim_env() as root:
        yield root


def test_other_protocol_versions_are_declined(env_dir):
    d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()])
    try:
        answer = exchange(d.socket, {**VERSION_REQUEST, "v": JSON_PROTOCOL + 1}, timeout=10)
        assert answer["exec"] is True and f"this daemon speaks {PROTOCOL}" in answer["why"]
        served = exchange(d.socket, VERSION_REQUEST, timeout=10)
        assert served["code"] == 0 and b"supportedVersions" in unb64(served["stdout_b64"])
        # the binary framing: the same answer, and the same refusal of another version
        code, out, err = call(d.socket, "lease-ipam", {b"CNI_COMMAND": b"VERSION"}, b"", timeout=10)
        assert (code, out, err) == (0, unb64(served["stdout_b64"]), b"")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(d.socket)
            sock.sendall(b"RDMANET 9 lease-ipam 19 0\nCNI_COMMAND=VERSION")
            assert read_line(sock).startswith(b"exec protocol version 9 is not served")
        assert '"protocol_mismatch"' in d.log()
    finally:
        d.cleanup()


def test_call_env_takes_the_node_name_from_the_daemon_only_when_missing():
    assert daemon_mod.call_env({"CNI_COMMAND": "ADD"}, {"RDMANET_NODE_NAME": "n1", "HOME": "/root"}) == {
        "CNI_COMMAND": "ADD", "RDMANET_NODE_NAME": "n1"}
    assert daemon_mod.call_env({"RDMANET_NODE_NAME": "from-call"}, {"RDMANET_NODE_NAME": "n1"}) == {
        "RDMANET_NODE_NAME": "from-call"}


def test_daemon_lease_store_node_name_and_watch_cache(env_dir, tmp_path):
    """In a DaemonSet the runtime's environment has no RDMANET_NODE_NAME; the pod's has. And the
    daemon's Lease watch cache spares the List of every later ADD."""
    with KubeAPIServer() as server:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace="ipam")
        d = Daemon(str(env_dir / "run" / "daemon.sock"), allow_uids=[os.getuid()],
                   env={"RDMANET_NODE_NAME": "gpu-node-7"})
        try:
            conf = {"cniVersion": "1.0.0", "name": "nodenet", "type": "lease-ipam",
                    "ipam": {"type": "lease-ipam", "range": "198.18.91.0/24", "kubernetes": {"kubeconfig": str(kubeconfig)}}}
            env = {"PATH": BARE_PATH, "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/proc/self/ns/net",
                   "CNI_IFNAME": "net1", "CNI_PATH": str(env_dir / "bin")}
            proc = subprocess.run([str(env_dir / "bin" / "lease-ipam")], input=json.dumps(conf).encode(), env=env,
                                  capture_output=True, timeout=60)
            assert proc.returncode == 0, proc.stdout
            (lease,) = claim_leases(server, "ipam")
            assert "gpu-node-7" in lease["metadata"]["labels"].values()
            # the daemon now watches the domain: the next ADD is one create, no List
            server.reset_counts()
            env["CNI_CONTAINERID"] = "c2"
            proc = subprocess.run([str(env_dir / "bin" / "lease-ipam")], input=json.dumps(conf).encode(), env=env,
                                  capture_output=True, timeout=60)
            assert proc.returncode == 0, proc.stdout
            assert server.count("create", "leases") == 1 and server.count("list", "leases") == 0, server.counts()
            assert len(claim_leases(server, "ipam")) == 2
        finally:
            d.cleanup()


def test_stop_serves_the_callers_already_queued(tmp_path):
    """Connections queued in the listen backlog when the daemon stops get answers, not resets;
    callers that come after the stop find no socket (and run in-process)."""
    path = str(tmp_path / "daemon.sock")
    # the plugin table without load_plugins(): that would turn the daemon's watch cache on in this process
    server = daemon_mod.DaemonServer(path, {"lease-ipam": LeaseIPAM}, allowed_uids=(os.getuid(),))
    queued = []
    for _ in range(3):  # nobody accepts yet: connect() returns once the connection is in the backlog
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(json.dumps(VERSION_REQUEST).encode() + b"\n")
        queued.append(sock)
    daemon_mod.stop_serving(server, path, accept_loop_running=False)
    try:
        for sock in queued:
            answer = json.loads(read_line(sock))
            assert answer["code"] == 0 and json.loads(unb64(answer["stdout_b64"]))["supportedVersions"]
    finally:
        for sock in queued:
            sock.close()
    assert not os.path.exists(path)
    with pytest.raises(NoDaemon):
        exchange(path, VERSION_REQUEST, timeout=5)


def test_a_socket_directory_others_may_write_is_refused(tmp_path):
    """Another user could bind the socket there while the daemon is down: the daemon does not start
    (whatever the sticky bit: /tmp), says why, and leaves the directory as it was."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    for mode in (0o1777, 0o777, 0o775):
        os.chmod(shared, mode)
        with pytest.raises(RuntimeError) as err:
            Daemon(str(shared / "rdmanet.sock"), allow_uids=[os.getuid()])
        assert "writable by" in str(err.value) and str(shared) in str(err.value) and "/run/rdmanet" in str(err.value)
        assert os.stat(shared).st_mode & 0o7777 == mode and os.listdir(shared) == []
    os.chmod(shared, 0o755)  # root's, closed to others: served
    d = Daemon(str(shared / "rdmanet.sock"), allow_uids=[os.getuid()])
    try:
        assert os.stat(d.socket).st_mode & 0o777 == 0o600
    finally:
        d.cleanup()
