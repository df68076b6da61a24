"""``rdmanet demo`` on the real kernel, with no node policy file: its stand-in master (a veth
without an RDMA device) is allowed for the demo's own call only."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

try:
    from netns_tests import nstools as nt
    from netns_tests.conftest import unique
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]
    from conftest import unique  # type: ignore[no-redef]


def test_demo_works_without_a_policy_file_and_widens_nothing(cni_bin):
    if os.path.exists("/etc/rdmanet/node-policy.json"):
        pytest.skip("this machine has a node policy file")
    if nt.link(None, "rdmademo0") is not None:
        pytest.skip("a demo is attached on this machine (rdmanet demo --down removes it)")
    name = unique()
    env = {k: v for k, v in os.environ.items() if k != "RDMANET_NODE_POLICY"}
    proc = subprocess.run([sys.executable, "-m", "rdmanet.cli.main", "demo", "--netns", name, "--cni-path", str(cni_bin)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "inet 198.18.100." in proc.stdout and "this call's node policy also lists it in masters" in proc.stdout
    assert nt.link(None, "rdmademo0") is None and not os.path.exists(f"/run/netns/{name}")
    # the allowance was the demo's call's only: no policy file was left anywhere
    assert not os.path.exists("/etc/rdmanet/node-policy.json")
    assert not [p for p in os.listdir("/tmp") if p.startswith("rdmanet-demo-")]
