"""Writing node policy files (rdmanet.cni.linux.roots) for the unit tests.

A module of its own rather than part of ``conftest.py``: the whole suite runs ``tests`` and
``netns_tests`` in one pytest session, where the name ``conftest`` means whichever conftest was
imported last.
"""

from __future__ import annotations

import json
import os
import pathlib


def write_policy(path: pathlib.Path, **keys) -> pathlib.Path:
    """A node policy file (0600) with the given keys (logRoots=[...], hostDeviceStateDir=...)."""
    path.write_text(json.dumps(keys))
    os.chmod(path, 0o600)
    return path


def with_keys(path: pathlib.Path, **keys) -> pathlib.Path:
    """The policy in force (``RDMANET_NODE_POLICY``, else none) with ``keys`` added, written to ``path``."""
    from rdmanet.cni.linux import roots

    current = os.environ.get(roots.POLICY_ENV)
    doc = json.loads(pathlib.Path(current).read_text()) if current else {}
    return write_policy(path, **{**doc, **keys})
