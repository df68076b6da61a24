"""The daemon's ``call`` log line: what ``kubectl logs`` of the DaemonSet shows for each CNI call
(real shims, a real daemon): who asked (plugin, command, network, container, ifname, the pod
from Multus' CNI_ARGS), the addresses an ADD gave or the CNI error's own code and message (not
the exit status, 1 for every error), and the duration."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from rdmanet.node.testing import Daemon, shim_env

BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
POD = "IgnoreUnknown=true;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=trainer-0;K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=0f1e2d3c"


@pytest.fixture
def node():
    with shim_env() as root:
        daemon = Daemon(str(root / "run" / "daemon.sock"), allow_uids=[os.getuid()])
        try:
            yield root, daemon
        finally:
            daemon.cleanup()


def conf(root, cni_version="1.0.0", **ipam) -> bytes:
    ipam = {"type": "lease-ipam", "dataDir": str(root / "data"), "range": "10.77.0.0/24", **ipam}
    return json.dumps({"cniVersion": cni_version, "name": "shimnet", "type": "macvlan-rdma", "ipam": ipam}).encode()


def call(root, stdin: bytes, command: str = "ADD", cid: str = "c1", cni_args: str | None = None, **extra):
    env = {"PATH": BARE_PATH, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/proc/self/ns/net",
           "CNI_IFNAME": "net1", "CNI_PATH": str(root / "bin"), "RDMANET_NODE_POLICY": os.environ["RDMANET_NODE_POLICY"],
           "CNI_ARGS": POD.format(cid=cid) if cni_args is None else cni_args, **extra}
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run([str(root / "bin" / "lease-ipam")], input=stdin, env=env, capture_output=True, timeout=60)


def call_lines(daemon) -> list[dict]:
    return [doc for doc in (json.loads(line) for line in daemon.log().splitlines() if line.startswith("{"))
            if doc.get("event") == "call"]


def test_an_add_logs_the_pod_the_network_and_the_addresses(node):
    root, daemon = node
    # podman's CNI_ARGS (no K8S_POD_UID: a Kubernetes pod on a network without a cluster store is refused)
    proc = call(root, conf(root), cni_args="IgnoreUnknown=true;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=trainer-0")
    assert proc.returncode == 0, proc.stdout
    [line] = call_lines(daemon)
    assert line["result"] == "ok"
    assert line["level"] == "info"
    assert {k: line[k] for k in ("plugin", "command", "network", "container", "ifname", "pod", "code", "ips")} == {
        "plugin": "lease-ipam", "command": "ADD", "network": "shimnet", "container": "c1", "ifname": "net1",
        "pod": "team-a/trainer-0", "code": 0, "ips": ["10.77.0.1/24"]}
    assert line["ms"] > 0 and "msg" not in line


@pytest.mark.parametrize("case, stdin, extra, code, says", [
    ("no cluster store", None, {}, 7, "selects no cluster store"),
    ("cni version", "9.9.9", {}, 1, "9.9.9"),
    ("stdin not json", b"{not json", {}, 6, ""),
    ("bad ifname", None, {"CNI_IFNAME": "a/b"}, 4, "CNI_IFNAME"),
])
def test_a_failed_call_logs_the_cni_code_and_message(node, case, stdin, extra, code, says):
    """The issue's four errors, each with its own code and message (each was "code": 1)."""
    root, daemon = node
    if stdin is None:
        stdin = conf(root)
    elif isinstance(stdin, str):
        stdin = conf(root, cni_version=stdin)
    proc = call(root, stdin, **extra)
    answer = json.loads(proc.stdout)
    assert proc.returncode == 1 and answer["code"] == code and says in answer["msg"], answer
    [line] = call_lines(daemon)
    assert line["level"] == "warning" and line["result"] == "error" and line["code"] == code, line
    assert line["msg"] == answer["msg"] and line.get("details", "") == answer.get("details", "")
    assert line["pod"] == "team-a/trainer-0" and line["pod_uid"] == "0f1e2d3c" and line["container"] == "c1"
    assert line["network"] == (None if case == "stdin not json" else "shimnet")
    assert "ips" not in line
