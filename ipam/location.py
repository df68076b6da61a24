"""Where a domain's store lives, read without pydantic so DEL and GC stay cheap and work even
when the ranges of a config no longer validate (DEL must release what ADD reserved).

Facts relied on: the store directory is ``<dataDir>/<domain>``; ``dataDir`` defaults to
``/var/lib/cni/lease-ipam``; the domain is ``ipam.network_name``, else the network's ``name``,
and must be a safe directory name (the CNI network-name pattern).
The store is the Kubernetes Lease store when the ipam block has a ``kubernetes`` key (whereabouts
NADs always do), else the local file store; see ``kube_config.py`` for that key.
"""

from __future__ import annotations

import os

from cni.core.errors import INVALID_CONFIG, CNIError
from cni.core.invocation import NAME_RE

DEFAULT_DATA_DIR = "/var/lib/cni/lease-ipam"


def bad(where: str, problem: str, fix: str) -> CNIError:
    """A code-7 error naming the field and the fix."""
    return CNIError(INVALID_CONFIG, f"invalid network config: {where}: {problem}", fix)


def ipam_block(config: dict) -> dict:
    raw = config.get("ipam")
    if not isinstance(raw, dict):
        raise bad("ipam", "missing or not an object", 'add "ipam": {"type": "lease-ipam", "range": "10.1.1.0/24"}')
    return raw


def uses_kubernetes(config: dict) -> bool:
    """True when the ipam block selects the Kubernetes Lease store (a ``kubernetes`` key)."""
    return ipam_block(config).get("kubernetes") is not None


def store_location(config: dict) -> tuple[str, str]:
    """(dataDir, domain) of the network config."""
    raw = ipam_block(config)
    domain = raw.get("network_name")
    if domain is None:
        domain = config.get("name", "")
    if not isinstance(domain, str) or not NAME_RE.match(domain):
        raise bad("ipam.network_name", f"{domain!r} is not a valid name", "use letters, digits, '_', '.', '-' (it names a directory)")
    data_dir = raw.get("dataDir")
    if data_dir is None:
        data_dir = DEFAULT_DATA_DIR
    if not isinstance(data_dir, str) or not os.path.isabs(data_dir):
        raise bad("ipam.dataDir", f"{data_dir!r} is not an absolute path", 'use an absolute path such as "/var/lib/cni/lease-ipam"')
    return data_dir, domain
