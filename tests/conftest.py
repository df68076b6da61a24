"""Session set-up shared by the unit tests.

The node policy (rdmanet.cni.linux.roots): the tests put stores, state, log and device-info files in
temporary directories, so the session runs under a policy whose roots are the temporary
directory besides the built-in ones (``RDMANET_NODE_POLICY``, as a runtime would set it for the
plugins it runs; child processes inherit it). Tests of the policy itself write their own (``policy_file.write_policy``).
"""

from __future__ import annotations

import os
import tempfile

import pytest

from rdmanet.cni.linux import roots
from kube_api_server import KubeAPIServer, write_kubeconfig
from policy_file import write_policy


# Module scope: the whole suite runs tests/ and netns_tests/ in one session, and the netns tests
# must not inherit this policy (they hand the plugins their own, as a runtime does).
@pytest.fixture(scope="module", autouse=True)
def _session_node_policy(tmp_path_factory) -> None:
    tmp = tempfile.gettempdir()
    base = tmp_path_factory.getbasetemp()
    default = roots.NodePolicy()  # the built-in roots stay (example NADs name them), the temp dir is added
    policy = write_policy(base / "node-policy.json", logRoots=[*default.log_roots, tmp],
                          dataRoots=[*default.data_roots, tmp], kubeconfigs=[*default.kubeconfigs, f"{tmp}/*"],
                          configRoots=[*default.config_roots, tmp], deviceInfoDir=tmp,
                          hostDeviceStateDir=str(base / "hd-state"))
    old = os.environ.get(roots.POLICY_ENV)
    os.environ[roots.POLICY_ENV] = str(policy)
    yield
    if old is None:
        os.environ.pop(roots.POLICY_ENV, None)
    else:
        os.environ[roots.POLICY_ENV] = old


@pytest.fixture
def server():
    """A fake Kubernetes API server for one test (tests/kube_api_server.py)."""
    with KubeAPIServer() as srv:
        yield srv


@pytest.fixture
def cluster(server, tmp_path):
    """``server`` as a test drives it through its API only (tests/kube_cluster.py): Nodes, pods,
    Leases in ``kube_cluster.NAMESPACE``; whatever server ``server`` is."""
    from kube_cluster import NAMESPACE, Cluster

    return Cluster(server, write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NAMESPACE), NAMESPACE)
