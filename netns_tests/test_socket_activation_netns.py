"""macvlan-rdma + lease-ipam through the CNI shims and a socket-activated ``rdmanet daemon`` (root).

systemd is not PID 1 here, so rdmanet.node.testing.SocketActivation plays its part of install.sh's
rdmanet.socket + rdmanet.service: it listens on the shims' socket (0600, root's) before any
daemon runs and starts ``rdmanet daemon`` with that socket passed (fd 3, LISTEN_FDS=1, LISTEN_PID)
when a call waits. The daemon accepts root only, as installed (no --allow-uid).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]

from rdmanet.node.testing import SocketActivation, health, write_shims

NOBODY = 65534


@pytest.fixture
def node():
    """Shims in a temporary bin dir whose socket systemd (SocketActivation) listens on."""
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"{nt.PREFIX}-sa-"))
    os.chmod(root, 0o755)  # an unprivileged peer may reach the socket's directory (one test opens that too)
    activation = None
    try:
        write_shims(root / "bin", str(root / "run" / "daemon.sock"))
        nt.node_policy_env(root)
        activation = SocketActivation(str(root / "run" / "daemon.sock"), log_path=str(root / "daemon.log"))
        yield root, activation
    finally:
        if activation is not None:
            activation.close()
        shutil.rmtree(root, ignore_errors=True)


def cni(root: pathlib.Path, command: str, stdin: dict, ns, cid: str) -> subprocess.CompletedProcess:
    return nt.raw_exec(root / "bin" / nt.PLUGIN, command, stdin, netns=ns.path, container_id=cid,
                       cni_path=[root / "bin"], extra_env={"RDMANET_NODE_POLICY": str(root / "node-policy.json")})


def calls(activation: SocketActivation) -> list[tuple[int, str]]:
    """(daemon pid, CNI command) of every call the daemons logged."""
    out, pid = [], None
    for line in activation.log().splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event["event"] == "started":
            pid = event["pid"]
        elif event["event"] == "call":
            out.append((pid, event["command"]))
    return out


def test_first_call_starts_the_daemon_which_serves_add_and_del(node, netns, master):
    root, activation = node
    m = master()
    prefix, _ = nt.random_subnet()
    stdin = nt.single("sanet", "1.0.0", nt.macvlan(m.name, nt.lease_ipam(root / "data", f"{prefix}.0/24",
                                                                          gateway=f"{prefix}.1")))
    sock = root / "run" / "daemon.sock"
    assert activation.started == [] and sock.stat().st_uid == 0 and sock.stat().st_mode & 0o777 == 0o600

    ns1 = netns()
    add = cni(root, "ADD", stdin, ns1, "sa-1")
    assert add.returncode == 0, add.stdout + add.stderr
    assert json.loads(add.stdout)["ips"][0]["address"] == f"{prefix}.2/24"
    assert nt.addresses(ns1.name, "net1") == [f"{prefix}.2/24"]
    (first,) = activation.started  # the ADD started it ...
    assert calls(activation) == [(first.pid, "ADD")]  # ... and it served the ADD (not the shim in-process)
    delete = cni(root, "DEL", stdin, ns1, "sa-1")
    assert (delete.returncode, delete.stdout) == (0, "")
    assert nt.link(ns1.name, "net1") is None and nt.address_files(root / "data" / "sanet") == {}
    assert health(str(sock))["requests"] == 2

    # `systemctl stop rdmanet.service`: the socket stays (systemd's), the next call starts a new daemon
    assert activation.stop_daemon() == 0
    assert sock.exists() and sock.stat().st_mode & 0o777 == 0o600
    ns2 = netns()
    add = cni(root, "ADD", stdin, ns2, "sa-2")
    assert add.returncode == 0, add.stdout + add.stderr
    assert nt.addresses(ns2.name, "net1") == [json.loads(add.stdout)["ips"][0]["address"]]
    second = activation.started[1]
    delete = cni(root, "DEL", stdin, ns2, "sa-2")
    assert delete.returncode == 0, delete.stdout + delete.stderr
    assert calls(activation) == [(first.pid, "ADD"), (first.pid, "DEL"), (second.pid, "ADD"), (second.pid, "DEL")]
    assert len(activation.started) == 2 and nt.link(ns2.name, "net1") is None


def test_an_unprivileged_user_can_neither_call_nor_start_the_daemon(node):
    root, activation = node
    sock = str(root / "run" / "daemon.sock")
    os.chmod(root / "run", 0o755)  # so that it is the socket's own mode (0600, root's) that refuses
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept PermissionError:\n    sys.exit(13)\n")
    proc = subprocess.run([sys.executable, "-I", "-c", probe, sock], user=NOBODY, group=NOBODY, capture_output=True,
                          timeout=60)
    assert proc.returncode == 13, proc.stderr
    assert activation.started == []  # refused at connect(): nothing queued, no daemon started
    assert health(sock)["pid"] == activation.started[0].pid  # root's call does start it
