"""The one directory host-device-rdma keeps its state, locks and allocation records in: the node
policy's ``hostDeviceStateDir``. Read without the config models (pydantic), so DEL, which needs
nothing else of the config, pays no model building."""

from __future__ import annotations

import logging
import os

from rdmanet.cni.core.errors import INVALID_CONFIG, CNIError
from rdmanet.cni.linux import roots

log = logging.getLogger("rdmanet.host-device-rdma")


def checked(named: object, command: str) -> str:
    """The node's state directory. A config's ``stateDir`` may only repeat it: another one is CNI
    error 7, except on DEL, which must still undo what ADD did: there it is ignored with a warning."""
    node_dir = roots.current().host_device_state_dir
    if named is not None and (not isinstance(named, str) or os.path.normpath(named) != node_dir):
        if command != "DEL":
            raise CNIError(INVALID_CONFIG, f"invalid network config: stateDir: {named!r} is not this node's host-device-rdma "
                           f"state directory ({node_dir})",
                           "remove stateDir from the network config: state, locks and allocation records live in one "
                           "node-wide directory the node owner sets (node policy hostDeviceStateDir, docs/security.md)")
        log.warning("DEL: stateDir %r in the network config is ignored; the node's %s is used", named, node_dir)
    return node_dir


def for_delete(config: dict) -> str:
    """DEL's state directory, made 0700 or checked (rdmanet.cni.linux.roots), from the raw config."""
    return roots.ensure_dir(checked(config.get("stateDir"), "DEL"))
