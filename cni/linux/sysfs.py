"""sysfs lookups: which RDMA devices belong to a netdev or a PCI/auxiliary device.

Every function takes ``root`` (default "/") so tests can point it at a fake tree. Paths are
resolved *inside* root, as if root were "/": relative symlinks are followed from the link's
directory, absolute ones restart at root, and ".." never climbs above root. A fake tree can
therefore use the kernel's own relative links (``device -> ../../../0000:3b:00.0``) and cannot
reach the host's /sys by mistake.

Kernel facts relied on:

- ``/sys/class/net/<if>`` is a symlink into ``/sys/devices/...``; its ``device`` link points
  at the parent device: a PCI function (``0000:3b:00.0``; a VF is a PCI function too), an
  auxiliary device (mlx5 sub-function ``mlx5_core.sf.N``, itself a child of the PF's PCI
  directory), or is absent for virtual netdevs (veth, macvlan, dummy).
- An RDMA device whose parent is device D appears as ``<D>/infiniband/<ibdev>``; so
  ``/sys/class/net/<if>/device/infiniband/`` lists the RDMA devices of a NIC's port, and
  ``/sys/bus/pci/devices/<pci>/infiniband/`` or ``/sys/bus/auxiliary/devices/<id>/infiniband/``
  those of a device ID handed over by a device plugin (rdma-cni looks there too).
- Soft-RoCE (rxe) devices live under ``/sys/devices/virtual/infiniband/`` with no ``device``
  link; their ``parent`` file holds the netdev name (``/sys/class/infiniband/<ibdev>/parent``).
- PCI device directories are named by their address ``dddd:bb:dd.f`` and nest under
  ``/sys/devices/pciDDDD:BB/`` (the host bridge directory, whose name does not match).
"""

from __future__ import annotations

import errno
import os
import re

PCI_ADDRESS_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")

_MAX_SYMLINKS = 40  # the kernel's own limit (MAXSYMLINKS)


def is_pci_address(value: str) -> bool:
    """True for a full PCI address ``dddd:bb:dd.f`` (the form sysfs and device plugins use)."""
    return isinstance(value, str) and PCI_ADDRESS_RE.fullmatch(value) is not None


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or "\0" in name or name in (".", ".."):
        raise ValueError(f"invalid {kind} {name!r}")
    return name


def _resolve(root: str, path: str) -> tuple[str, list[str]]:
    """Resolve ``path`` (absolute, read under ``root``) following symlinks confined to root.

    Returns the host path and its components below root. Missing components are kept as they
    are (the caller's existence check fails); a symlink loop raises OSError(ELOOP).
    """
    base = os.path.realpath(root)
    pending = [p for p in reversed(path.split("/"))]
    parts: list[str] = []
    followed = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        candidate = os.path.join(base, *parts, part)
        if os.path.islink(candidate):
            followed += 1
            if followed > _MAX_SYMLINKS:
                raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
            target = os.readlink(candidate)
            if target.startswith("/"):
                parts = []
            pending.extend(reversed(target.split("/")))
        else:
            parts.append(part)
    return os.path.join(base, *parts), parts


def _subdirs(root: str, path: str) -> list[str]:
    host, _ = _resolve(root, path)
    try:
        entries = os.listdir(host)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(e for e in entries if os.path.isdir(_resolve(root, f"{path}/{e}")[0]))


def _read_text(root: str, path: str) -> str | None:
    host, _ = _resolve(root, path)
    try:
        with open(host, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None


def rdma_devices_for_netdev(ifname: str, root: str = "/") -> list[str]:
    """RDMA devices on netdev ``ifname``, sorted and deduplicated; [] when it has none.

    Two sources: ``/sys/class/net/<if>/device/infiniband/*`` (a NIC's RDMA devices, PCI or
    auxiliary parent) and every ``/sys/class/infiniband/<dev>/parent`` that names ``ifname``
    (soft-RoCE rxe, which has no ``device`` link). Raises ValueError for an invalid name.
    """
    _check_name("interface name", ifname)
    found = set(_subdirs(root, f"/sys/class/net/{ifname}/device/infiniband"))
    class_dir = _resolve(root, "/sys/class/infiniband")[0]
    try:
        ibdevs = os.listdir(class_dir)
    except (FileNotFoundError, NotADirectoryError):
        ibdevs = []
    for ibdev in ibdevs:
        if _read_text(root, f"/sys/class/infiniband/{ibdev}/parent") == ifname:
            found.add(ibdev)
    return sorted(found)


def rdma_devices_for_device_id(dev_id: str, root: str = "/") -> list[str]:
    """RDMA devices of a device ID as Multus passes it (``deviceID``), sorted; [] when none.

    A PCI address (``dddd:bb:dd.f``, compared in lower case as sysfs spells it) is looked up in
    ``/sys/bus/pci/devices/<id>/infiniband/``; anything else is taken as an auxiliary device ID
    (e.g. ``mlx5_core.sf.4``) in ``/sys/bus/auxiliary/devices/<id>/infiniband/``.
    """
    _check_name("device ID", dev_id)
    if is_pci_address(dev_id):
        return _subdirs(root, f"/sys/bus/pci/devices/{dev_id.lower()}/infiniband")
    return _subdirs(root, f"/sys/bus/auxiliary/devices/{dev_id}/infiniband")


def pci_address_of_netdev(ifname: str, root: str = "/") -> str | None:
    """The PCI address behind netdev ``ifname``, or None.

    The resolved ``/sys/class/net/<if>/device`` itself when it is a PCI function (PF or VF);
    for an auxiliary device (``subsystem -> .../bus/auxiliary``, e.g. an mlx5 SF) the PCI
    device it hangs off; None for a netdev without a ``device`` link (veth, macvlan, the netdev
    of an rxe), and for other buses (a USB NIC is not its host controller).
    """
    _check_name("interface name", ifname)
    host, parts = _resolve(root, f"/sys/class/net/{ifname}/device")
    while os.path.isdir(host) and parts:
        if is_pci_address(parts[-1]):
            return parts[-1].lower()
        subsystem = _resolve(root, "/" + "/".join(parts + ["subsystem"]))[1]
        if subsystem[-2:] != ["bus", "auxiliary"]:
            return None
        parts = parts[:-1]
        host = _resolve(root, "/" + "/".join(parts))[0]
    return None
