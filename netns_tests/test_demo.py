"""``rdmanet demo`` and ``rdmanet demo --down`` as a user runs them, on the real kernel, in a
network and mount namespace of their own (/run and /var/lib empty tmpfs there: the demo's real
paths, rdmademo0, /run/netns/rdmanet-demo and /var/lib/cni/lease-ipam/rdmanet-demo, are private
to the test). ``--down`` says what it removed, and says so when there was nothing to remove. No
node policy file: the demo's stand-in master, a veth without an RDMA device, is allowed for the
demo's own call only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="needs root and unshare (a network and mount namespace of its own)")


def run_demo_steps(*steps: str) -> list[tuple[int, str]]:
    """Each ``rdmanet demo`` argument string in one private namespace, in order: (exit, output)."""
    with tempfile.TemporaryDirectory(prefix="rdmanet-demo-test-") as tmp:
        empty_bin = os.path.join(tmp, "bin")  # no plugins there: the demo runs this checkout's scripts
        os.mkdir(empty_bin)
        lines = ["set -u", "mount -t tmpfs tmpfs /run", "mount -t tmpfs tmpfs /var/lib", "mkdir -p /var/lib/cni",
                 "ip link set lo up"]
        for i, step in enumerate(steps):
            lines.append(f"{sys.executable} -m rdmanet.cli demo --cni-path {empty_bin} {step} > {tmp}/{i}.out 2>&1; "
                         f"echo $? > {tmp}/{i}.rc")
        env = {k: v for k, v in os.environ.items() if k != "RDMANET_NODE_POLICY"}  # the built-in roots, as on a host
        proc = subprocess.run(["unshare", "--net", "--mount", "--propagation", "private", "bash", "-c", "\n".join(lines)],
                              capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return [(int(open(f"{tmp}/{i}.rc").read()), open(f"{tmp}/{i}.out").read()) for i in range(len(steps))]


def test_down_tells_what_it_removed_and_when_there_was_nothing():
    (rc0, nothing), (rc1, kept), (rc2, down), (rc3, again) = run_demo_steps("--down", "--keep", "--down", "--down")
    assert rc0 == 0 and nothing.splitlines()[-1] == (
        "nothing to remove: no namespace rdmanet-demo, no stand-in link rdmademo0, no address held by the demo"), nothing
    assert rc1 == 0 and "left attached; remove with: rdmanet demo --down" in kept, kept
    assert rc2 == 0 and down.splitlines()[-1].startswith("removed the address 198.18.100."), down
    assert down.splitlines()[-1].endswith("(CNI DEL); the namespace rdmanet-demo; the stand-in link rdmademo0"), down
    assert rc3 == 0 and again.splitlines()[-1].startswith("nothing to remove"), again


def test_a_run_without_keep_says_what_its_del_removed():
    [(rc, out)] = run_demo_steps("")
    assert rc == 0, out
    last = out.splitlines()[-1]
    assert last.startswith("# CNI DEL done; removed the address 198.18.100.") and "the stand-in link rdmademo0" in last
    # no node policy anywhere: the stand-in (no RDMA device) is a master for the demo's own call only
    assert "this call's node policy also lists it in masters" in out, out
