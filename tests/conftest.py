"""Session set-up shared by the unit tests.

The Kubernetes API server (``server``): the fake one (tests/kube_api_server.py) for one test; in a
module marked ``both_servers`` the test runs twice, ``[fake]`` and ``[real]``, the second time on a
real kube-apiserver + etcd (tests/kube_real_server.py, one per session, built once and cached)
behind a fault-injecting proxy that gives it the fake's test controls. A test marked
``fake_only(reason)`` runs on the fake alone (a control the real server cannot have).

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
from kube_api_server import write_kubeconfig
from kube_real_nodes import Objects
from kube_real_server import KubeCluster
from kube_servers import api_server
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


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "both_servers: the module's tests run on the fake and on a real kube-apiserver")
    config.addinivalue_line("markers", "fake_only(reason): runs on the fake API server only (says why)")


def pytest_generate_tests(metafunc) -> None:
    if "server" not in metafunc.fixturenames or metafunc.definition.get_closest_marker("both_servers") is None:
        return
    fake_only = metafunc.definition.get_closest_marker("fake_only")
    if fake_only is not None and not (fake_only.args or fake_only.kwargs.get("reason")):
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: fake_only needs the reason")
    metafunc.parametrize("server", ["fake"] if fake_only else ["fake", "real"], indirect=True)


@pytest.fixture(scope="session")
def real_apiserver():
    """A real kube-apiserver + etcd for the session, with deploy/'s namespace, ServiceAccount and RBAC."""
    if os.geteuid() != 0 and not os.environ.get("RDMANET_KUBE_CACHE"):
        pytest.skip("the real kube-apiserver is built and cached as root (scripts/test.sh)")
    with KubeCluster() as cluster:
        cluster.apply_rbac()
        cluster.install_crds()
        yield cluster


@pytest.fixture
def real_objects(real_apiserver):
    """The real server's pods, Nodes and claims as the admin sees them, none before the test or after it."""
    o = Objects(real_apiserver)
    o.clean()
    yield o
    o.clean()


@pytest.fixture
def server(request):
    """A Kubernetes API server for one test (see :func:`api_server`)."""
    with api_server(request) as srv:
        yield srv


@pytest.fixture
def cluster(server, tmp_path):
    """``server`` as a test drives it through its API only (tests/kube_cluster.py): Nodes, pods,
    Leases in ``kube_cluster.NAMESPACE``; whatever server ``server`` is."""
    from kube_cluster import NAMESPACE, Cluster

    return Cluster(server, write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NAMESPACE), NAMESPACE)
