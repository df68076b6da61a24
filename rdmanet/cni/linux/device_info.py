"""The device-info file (device-info-spec 1.1.0) that tells the pod which RDMA device it got.

Facts relied on (k8snetworkplumbingwg device-info-spec SPEC.md; Multus pkg/types/conf.go):

- Multus passes the path in the ``CNIDeviceInfoFile`` capability. When the attachment has a
  device ID, it first copies the device plugin's file there with mode 0444 (and refuses to
  overwrite an existing file), reads the file back after ADD into the network-status
  annotation, and deletes it on DEL. A plugin may read it, update it, or create it (with its
  directory) when absent.
- Schema: ``{"type": "pci", "version": "1.1.0", "pci": {"pci-address": "dddd:bb:dd.f",
  "rdma-device"?, "pf-pci-address"?, "vhost-net"?, "representor-device"?}}``.

We run as root, so the 0444 mode of Multus's copy does not stop an update: the new content is
written to a temporary file in the same directory and renamed over the old one, which replaces
it atomically (readers see the old or the new file, never a partial one).

The path comes from the config (a NAD's own ``runtimeConfig`` passes through libcni when Multus
injects nothing), so it must lie under the node's device-info directory (``deviceInfoDir`` of
the node policy, default ``/var/run/k8s.cni.cncf.io/devinfo/cni``: rdmanet.cni.linux.roots), reached
without a symlink; a symlink at the file itself is refused, and an existing file keeps its mode.
"""

from __future__ import annotations

import json
import os
from typing import Optional

from rdmanet.cni.core.errors import IO_FAILURE, CNIError
from rdmanet.cni.linux import roots
from rdmanet.cni.linux.sysfs import is_pci_address

KEY = "runtimeConfig.CNIDeviceInfoFile"
MAX_BYTES = 1 << 20

SPEC_VERSION = "1.1.0"
_BROKEN_FIX = ("the file must be a device-info-spec JSON object (Multus copies it from the device plugin's "
               "file under /var/run/k8s.cni.cncf.io/devinfo/dp/); remove or repair it and retry")


def _roots() -> tuple[str, ...]:
    return (roots.current().device_info_dir,)


def check_path(path: Optional[str]) -> None:
    """CNI error 7 unless ``path`` (when given) lies under the node's device-info directory:
    called at the start of ADD, before anything is changed."""
    if path:
        roots.place(KEY, path, _roots())


def read_device_info(path: str) -> dict | None:
    """The JSON object in ``path``, or None when the file does not exist.

    Raises CNIError(IO_FAILURE) when it cannot be read or is not a JSON object, and
    CNIError(INVALID_CONFIG) when the path is outside the device-info directory or a symlink.
    """
    try:
        fd = roots.open_file("device-info", KEY, path, os.O_RDONLY, roots=_roots())
    except FileNotFoundError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise ValueError(f"larger than {MAX_BYTES} bytes")
        data = json.loads(raw)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CNIError(IO_FAILURE, f"cannot read device-info file {path}: {e}", _BROKEN_FIX) from None
    if not isinstance(data, dict):
        raise CNIError(IO_FAILURE, f"device-info file {path} does not hold a JSON object", _BROKEN_FIX)
    return data


def write_rdma_device_info(
    path: str,
    *,
    pci_address: str | None,
    rdma_device: str | None,
    pf_pci_address: str | None = None,
) -> dict | None:
    """Record ``rdma_device`` in the device-info file at ``path``; returns what was written.

    An existing file keeps every field; ``pci.rdma-device`` is set, ``pci.pci-address`` and
    ``pci.pf-pci-address`` only when given. Without a file, the directory and
    ``{"type": "pci", "version": "1.1.0", "pci": {...}}`` are created, except when ``pci_address``
    is None (soft-RoCE, no PCI parent): the spec requires ``pci.pci-address`` in a "pci" file, so
    no file is created then and None is returned. An existing file keeps its mode (Multus's copy
    is 0444); a new one is 0644. Failures raise CNIError(IO_FAILURE) naming the path, a path
    outside the device-info directory or through a symlink CNIError(INVALID_CONFIG); malformed
    arguments raise ValueError.
    """
    if rdma_device is not None and (not isinstance(rdma_device, str) or not rdma_device):
        raise ValueError(f"rdma_device must be None or a non-empty string, got {rdma_device!r}")
    for name, value in (("pci_address", pci_address), ("pf_pci_address", pf_pci_address)):
        if value is not None and not is_pci_address(value):
            raise ValueError(f"{name} must be a PCI address dddd:bb:dd.f, got {value!r}")

    data = read_device_info(path)
    if data is None:
        if pci_address is None:
            return None
        data = {"type": "pci", "version": SPEC_VERSION, "pci": {}}
    else:
        data.setdefault("type", "pci")
        data.setdefault("version", SPEC_VERSION)
        data.setdefault("pci", {})
        if not isinstance(data["pci"], dict):
            raise CNIError(IO_FAILURE, f"device-info file {path}: \"pci\" is not a JSON object")

    pci = data["pci"]
    if pci_address is not None:
        pci["pci-address"] = pci_address.lower()
    if rdma_device is not None:
        pci["rdma-device"] = rdma_device
    if pf_pci_address is not None:
        pci["pf-pci-address"] = pf_pci_address.lower()

    roots.replace_file(KEY, path, (json.dumps(data) + "\n").encode(), roots=_roots(), new_mode=0o644, dir_mode=0o755)
    return data
