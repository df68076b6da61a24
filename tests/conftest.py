"""Session set-up shared by the unit tests.

The node policy (cni.linux.roots): the tests put stores, state, log and device-info files in
temporary directories, so the session runs under a policy whose roots are the temporary
directory besides the built-in ones (``RDMANET_NODE_POLICY``, as a runtime would set it for the
plugins it runs; child processes inherit it). Tests of the policy itself write their own (:func:`write_policy`).
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile

import pytest

from cni.linux import roots


def write_policy(path: pathlib.Path, **keys) -> pathlib.Path:
    """A node policy file (0600) with the given keys (logRoots=[...], hostDeviceStateDir=...)."""
    path.write_text(json.dumps(keys))
    os.chmod(path, 0o600)
    return path


@pytest.fixture(scope="session", autouse=True)
def _session_node_policy(tmp_path_factory) -> None:
    tmp = tempfile.gettempdir()
    base = tmp_path_factory.getbasetemp()
    default = roots.NodePolicy()  # the built-in roots stay (example NADs name them), the temp dir is added
    policy = write_policy(base / "node-policy.json", logRoots=[*default.log_roots, tmp],
                          dataRoots=[*default.data_roots, tmp], kubeconfigRoots=[*default.kubeconfig_roots, tmp],
                          configRoots=[*default.config_roots, tmp], deviceInfoDir=tmp,
                          hostDeviceStateDir=str(base / "hd-state"))
    old = os.environ.get(roots.POLICY_ENV)
    os.environ[roots.POLICY_ENV] = str(policy)
    yield
    if old is None:
        os.environ.pop(roots.POLICY_ENV, None)
    else:
        os.environ[roots.POLICY_ENV] = old
