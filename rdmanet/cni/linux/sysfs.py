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
import ipaddress
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


def _host_path(root: str, path: str) -> str:
    """Where ``path`` (absolute, under ``root``) is reached: :func:`_resolve`'s host path, or under
    the real root ``path`` itself, for the kernel to resolve: every symlink there stays under "/"
    anyway, and the walk costs a Python lstat per component (~100 us of each macvlan-rdma ADD)."""
    return path if root == "/" else _resolve(root, path)[0]


def _subdirs(root: str, path: str) -> list[str]:
    host = _host_path(root, path)
    try:
        entries = os.listdir(host)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(e for e in entries if os.path.isdir(_host_path(root, f"{path}/{e}")))


def _read_text(root: str, path: str) -> str | None:
    host = _host_path(root, path)
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
    class_dir = _host_path(root, "/sys/class/infiniband")
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


# ---------------------------------------------------------------------------------------------
# Device selection (host-device-rdma): netdevs, drivers and SR-IOV links of a device ID.
#
# Kernel facts relied on (and how host-device / sriov-cni use them):
#
# - ``/sys/bus/pci/devices/<pci>`` and ``/sys/bus/auxiliary/devices/<id>`` are symlinks to the
#   device directories; a netdev whose parent is the device appears as ``<dev>/net/<ifname>/``.
#   virtio-net is one level down: the PCI function's child ``virtioN`` owns the netdev
#   (``<pci>/virtio0/net/eth0``), which host-device's ``pciBusID`` lookup handles.
# - ``<dev>/driver`` is a symlink to ``/sys/bus/<bus>/drivers/<name>`` while a driver is bound,
#   absent otherwise. A PCI function bound to vfio-pci, uio_pci_generic or igb_uio has no netdev
#   (DPDK mode in sriov-cni and host-device).
# - A VF has ``physfn -> ../<pf>``; its PF has ``virtfnN -> ../<vf>`` for N < ``sriov_numvfs``
#   and ``sriov_numvfs`` itself. (Stale ``virtfnN`` above ``sriov_numvfs`` are ignored like
#   sriov-cni does.) The PF's netdevs are under ``<vf>/physfn/net/``.
# - An mlx5 sub-function is an auxiliary device ``mlx5_core.sf.N`` under its PF's PCI directory
#   with its own ``net/`` and ``infiniband/``.
# ---------------------------------------------------------------------------------------------

DPDK_DRIVERS = ("vfio-pci", "uio_pci_generic", "igb_uio")

DEVICE_KINDS = ("pci", "auxiliary")

_VIRTFN_RE = re.compile(r"^virtfn([0-9]+)$")


def _pci(value: str) -> str:
    """A validated PCI address in sysfs spelling (lower case); ValueError otherwise."""
    if not is_pci_address(value):
        raise ValueError(f"invalid PCI address {value!r} (want dddd:bb:dd.f)")
    return value.lower()


def _bus_path(kind: str, dev_id: str) -> str:
    if kind == "pci":
        return f"/sys/bus/pci/devices/{_pci(dev_id)}"
    if kind == "auxiliary":
        return f"/sys/bus/auxiliary/devices/{_check_name('auxiliary device ID', dev_id)}"
    raise ValueError(f"invalid device kind {kind!r} (want one of {DEVICE_KINDS})")


def _link_basename(root: str, path: str) -> str | None:
    """Basename of what symlink ``path`` resolves to inside root, None if it is dangling/absent."""
    host, parts = _resolve(root, path)
    return parts[-1] if parts and os.path.exists(host) else None


def device_exists(kind: str, dev_id: str, root: str = "/") -> bool:
    """True when ``/sys/bus/<kind>/devices/<id>`` resolves to a device directory.

    ``kind`` is "pci" (``dev_id`` must be a PCI address) or "auxiliary"; ValueError otherwise.
    """
    return os.path.isdir(_resolve(root, _bus_path(kind, dev_id))[0])


def netdevs_of_pci(pci: str, root: str = "/") -> list[str]:
    """Netdevs of PCI function ``pci``, sorted: ``<pci>/net/*``, else ``<pci>/virtio*/net/*``."""
    base = _bus_path("pci", pci)
    found = _subdirs(root, f"{base}/net")
    if found:
        return found
    virtio = [d for d in _subdirs(root, base) if d.startswith("virtio")]
    return sorted({n for d in virtio for n in _subdirs(root, f"{base}/{d}/net")})


def netdevs_of_auxiliary(dev_id: str, root: str = "/") -> list[str]:
    """Netdevs of auxiliary device ``dev_id`` (e.g. ``mlx5_core.sf.2``), sorted."""
    return _subdirs(root, f"{_bus_path('auxiliary', dev_id)}/net")


def netdev_of_kernelpath(path: str, root: str = "/") -> list[str]:
    """Netdevs under host-device's ``kernelpath`` (``<path>/net/*``), sorted.

    ``path`` must be absolute, start with ``/sys/devices/`` and have no ``..`` component
    (ValueError otherwise); it is read inside root like every other lookup.
    """
    if not isinstance(path, str) or "\0" in path or not path.startswith("/sys/devices/"):
        raise ValueError(f"invalid kernelpath {path!r} (want an absolute /sys/devices/... path)")
    if ".." in path.split("/"):
        raise ValueError(f"invalid kernelpath {path!r} ('..' is not allowed)")
    return _subdirs(root, f"{path.rstrip('/')}/net")


def driver_of_device(kind: str, dev_id: str, root: str = "/") -> str | None:
    """Name of the driver bound to a PCI or auxiliary device (basename of ``driver``), or None."""
    return _link_basename(root, f"{_bus_path(kind, dev_id)}/driver")


def driver_of_pci(pci: str, root: str = "/") -> str | None:
    """Name of the driver bound to PCI function ``pci`` (e.g. ``mlx5_core``, ``vfio-pci``), or None."""
    return driver_of_device("pci", pci, root)


def pf_of_vf(pci: str, root: str = "/") -> str | None:
    """PCI address of the PF of VF ``pci`` (where ``physfn`` leads); None for a non-VF."""
    name = _link_basename(root, f"{_bus_path('pci', pci)}/physfn")
    return name.lower() if name is not None and is_pci_address(name) else None


def pf_netdev_of_vf(pci: str, root: str = "/") -> str | None:
    """The PF's netdev of VF ``pci``: first entry of ``<vf>/physfn/net/`` (sriov-cni), or None."""
    found = _subdirs(root, f"{_bus_path('pci', pci)}/physfn/net")
    return found[0] if found else None


def sriov_numvfs(pf_pci: str, root: str = "/") -> int | None:
    """The PF's ``sriov_numvfs`` (VFs currently enabled), None when absent or unreadable."""
    text = _read_text(root, f"{_bus_path('pci', pf_pci)}/sriov_numvfs")
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def vf_index(pf_pci: str, vf_pci: str, root: str = "/") -> int | None:
    """N such that the PF's ``virtfnN`` link names ``vf_pci``, else None.

    As sriov-cni does, only N < ``sriov_numvfs`` counts when that file exists; the link's
    target is compared by basename (``virtfn3 -> ../0000:3b:00.5``).
    """
    vf = _pci(vf_pci)
    return next((n for n, addr in vfs_of_pf(pf_pci, root) if addr == vf), None)


def vfs_of_pf(pf_pci: str, root: str = "/") -> list[tuple[int, str]]:
    """``(N, vf address)`` for each ``virtfnN`` link of the PF, in N order; [] for a non-PF.

    As sriov-cni does, only N < ``sriov_numvfs`` counts when that file exists; the address is
    the basename of the link's target, lower-cased (``virtfn3 -> ../0000:3b:00.5``).
    """
    host_pf = _resolve(root, _bus_path("pci", pf_pci))[0]
    limit = sriov_numvfs(pf_pci, root)
    try:
        entries = os.listdir(host_pf)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for entry in entries:
        m = _VIRTFN_RE.fullmatch(entry)
        if m is None or (limit is not None and int(m.group(1)) >= limit):
            continue
        link = os.path.join(host_pf, entry)
        if os.path.islink(link):
            found.append((int(m.group(1)), os.path.basename(os.readlink(link).rstrip("/")).lower()))
    return sorted(found)


def device_id_of_netdev(ifname: str, root: str = "/") -> tuple[str, str] | None:
    """The device ID behind netdev ``ifname`` as a device plugin names it, or None.

    From ``/sys/class/net/<if>/device`` and that device's ``subsystem`` link:
    ``("auxiliary", "mlx5_core.sf.2")`` on the auxiliary bus; ``("pci", "dddd:bb:dd.f")`` for a
    PCI function (PF or VF; a device without a ``subsystem`` link counts when it is named like a
    PCI address); for virtio-net (device ``virtioN`` on the virtio bus) the PCI function it sits
    on, the ID ``pciBusID`` would name. None for a virtual netdev, a missing one, or another bus
    (USB).
    """
    _check_name("interface name", ifname)
    host, parts = _resolve(root, f"/sys/class/net/{ifname}/device")
    if not parts or not os.path.isdir(host):
        return None
    bus = _bus_of(root, parts)
    if bus == "auxiliary":
        return ("auxiliary", parts[-1])
    if bus == "virtio" and len(parts) > 1:
        parts = parts[:-1]
        bus = _bus_of(root, parts)
    if is_pci_address(parts[-1]) and bus in ("pci", None):
        return ("pci", parts[-1].lower())
    return None


def _bus_of(root: str, parts: list[str]) -> str | None:
    """Bus name of the device at ``parts`` (``subsystem -> .../bus/<name>``), None if unknown."""
    host, sub = _resolve(root, "/" + "/".join(parts + ["subsystem"]))
    if os.path.isdir(host) and len(sub) >= 2 and sub[-2] == "bus":
        return sub[-1]
    return None


# ---------------------------------------------------------------------------------------------
# Inventory (``rdmanet doctor``): what a host has, read-only, inside root like everything above.
#
# Kernel facts relied on:
#
# - ``/sys/bus/pci/devices/<pci>/{vendor,device,class}`` read ``0x15b3``, ``0x101d``, ``0x020000``
#   (class 0x0200xx is Ethernet, 0x0207xx InfiniBand).
# - A PF capable of SR-IOV has ``sriov_totalvfs`` (the most VFs it can enable) beside
#   ``sriov_numvfs``.
# - ``/sys/class/infiniband/<ibdev>`` leads to ``<parent device>/infiniband/<ibdev>``: a PCI
#   function, an auxiliary device (mlx5 SF), or ``/sys/devices/virtual`` for rxe and siw.
# - Some attributes cannot be read in some states: ``carrier`` and ``speed`` of a link that is
#   down answer EINVAL; ``read_attribute`` gives None for those, like for a missing file.
# ---------------------------------------------------------------------------------------------


def read_attribute(path: str, root: str = "/") -> str | None:
    """The stripped text of sysfs attribute ``path`` (absolute, read inside root), or None when
    it is absent or cannot be read (EINVAL for ``carrier`` of a link that is down, EACCES...)."""
    host, _ = _resolve(root, path)
    try:
        with open(host, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def write_attribute(path: str, value: str, root: str = "/") -> None:
    """Write ``value`` to sysfs attribute ``path`` (absolute, resolved inside root; in a fake tree
    the file is created). OSError as the kernel answers it (e.g. ENODEV from a driver's bind)."""
    host, _ = _resolve(root, path)
    with open(host, "w", encoding="utf-8") as f:
        f.write(value)


def list_names(path: str, root: str = "/") -> list[str]:
    """Sorted names in directory ``path`` (read inside root); [] when it is absent."""
    try:
        return sorted(os.listdir(_resolve(root, path)[0]))
    except OSError:
        return []


def pci_devices(root: str = "/") -> list[str]:
    """Every PCI function in ``/sys/bus/pci/devices``, by address (lower case), sorted."""
    return sorted(n.lower() for n in list_names("/sys/bus/pci/devices", root) if is_pci_address(n))


def sriov_totalvfs(pf_pci: str, root: str = "/") -> int | None:
    """The PF's ``sriov_totalvfs`` (VFs it can enable); None for a function without SR-IOV."""
    text = _read_text(root, f"{_bus_path('pci', pf_pci)}/sriov_totalvfs")
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def rdma_devices(root: str = "/") -> list[str]:
    """Every RDMA device in ``/sys/class/infiniband`` (as this netns sees them), sorted."""
    return list_names("/sys/class/infiniband", root)


def rdma_device_parent(ibdev: str, root: str = "/") -> tuple[str, str] | None:
    """The device RDMA device ``ibdev`` belongs to, as ``device_id_of_netdev`` names it:
    ``("pci", "0000:3b:00.0")`` or ``("auxiliary", "mlx5_core.sf.4")``; None for a device
    without a parent device (rxe, siw under ``/sys/devices/virtual``) or one that is missing."""
    _check_name("RDMA device", ibdev)
    host, parts = _resolve(root, f"/sys/class/infiniband/{ibdev}")
    if len(parts) < 4 or parts[-2] != "infiniband" or not os.path.isdir(host):
        return None
    parent = parts[:-2]
    if parent[:3] == ["sys", "devices", "virtual"]:
        return None
    bus = _bus_of(root, parent)
    if bus == "auxiliary":
        return ("auxiliary", parent[-1])
    if is_pci_address(parent[-1]) and bus in ("pci", None):
        return ("pci", parent[-1].lower())
    return None


def default_root() -> str:
    """Where the plugins read sysfs: "/" unless RDMANET_SYSFS_ROOT points at a fake tree (a test
    hook: netns tests give a veth the PCI and RDMA identity of a NIC this machine lacks)."""
    from rdmanet.cni.core import env

    return env.get("RDMANET_SYSFS_ROOT", "/")


# ---------------------------------------------------------------------------------------------
# RoCE GID table: which GID index carries a pod's address (NCCL_IB_GID_INDEX, ib_write_bw -x).
#
# Kernel facts relied on (drivers/infiniband/core/sysfs.c, cache.c, roce_gid_mgmt.c):
#
# - ``/sys/class/infiniband/<dev>/ports/<p>/gids/<i>`` holds GID ``i`` of port ``p`` as eight
#   zero-padded hex groups (``%pI6``); an empty slot reads as all zeros. RoCE GIDs are IP
#   addresses: IPv6 as themselves, IPv4 as IPv4-mapped (``...:0000:ffff:c612:0502`` for
#   198.18.5.2). rxe has 1024 slots per port, mlx5 a few hundred: a scan reads them all.
# - ``gid_attrs/ndevs/<i>`` names the netdev the GID belongs to, as seen in that netdev's own
#   netns (a macvlan moved into a pod and renamed ``net1`` reads ``net1`` from the host in shared
#   mode); ``gid_attrs/types/<i>`` is ``IB/RoCE v1`` or ``RoCE v2``. Both fail with EINVAL for an
#   empty slot.
# - The kernel fills the table asynchronously (a workqueue reacting to address and link events),
#   so an address just configured may not be there yet: callers poll briefly.
# ---------------------------------------------------------------------------------------------

GID_TYPE_PREFERENCE = ("RoCE v2", "IB/RoCE v1")  # RoCE v2 is routable (UDP/IP): prefer it


def _numbered(host_dir: str) -> list[str]:
    """Entries of ``host_dir`` named by a decimal number, in numeric order; [] when unreadable."""
    try:
        names = os.listdir(host_dir)
    except OSError:
        return []
    return sorted((n for n in names if n.isdigit()), key=int)


def _open_dir(root: str, path: str) -> int | None:
    try:
        return os.open(_resolve(root, path)[0], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def _read_at(dir_fd: int | None, name: str) -> str | None:
    """One sysfs attribute of the directory ``dir_fd``; None when it cannot be read (EINVAL for an
    empty GID slot). Plain os calls on a directory fd: a whole GID table is read in a few
    milliseconds, where open() per file costs ten times more."""
    if dir_fd is None:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return os.read(fd, 256).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def _gid_of_address(address) -> ipaddress.IPv6Address:
    """The RoCE GID of an IP address: IPv6 as is (scope dropped), IPv4 as IPv4-mapped IPv6."""
    text = str(address).split("/", 1)[0].split("%", 1)[0]
    ip = ipaddress.ip_address(text)
    return ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip


def _same_gid(text: str, want: ipaddress.IPv6Address) -> bool:
    if text == want.exploded:  # the kernel's own spelling: a string compare per slot
        return True
    if len(text) == 39 and text == text.lower():  # the kernel's spelling of another GID
        return False
    try:
        return ipaddress.IPv6Address(text) == want
    except ValueError:
        return False


def roce_gid_index(rdma_device: str, address, ifname: str, root: str = "/") -> tuple[int, int, str] | None:
    """``(port, index, gid_type)`` of the GID that carries ``address`` on netdev ``ifname``.

    ``address`` is an IP address or interface (``"198.18.5.2"``, ``"198.18.5.2/24"``,
    ``ipaddress`` objects; IPv4 matches its IPv4-mapped GID). Only entries whose
    ``gid_attrs/ndevs/<i>`` is ``ifname`` count. "RoCE v2" wins over "IB/RoCE v1", then the
    lowest port and index. Unreadable entries (empty slots answer EINVAL) are skipped; None when
    no entry matches, or the device has no such table. ValueError for an invalid device name,
    interface name or address.
    """
    _check_name("RDMA device", rdma_device)
    _check_name("interface name", ifname)
    want = _gid_of_address(address)
    ports = f"/sys/class/infiniband/{rdma_device}/ports"
    best: tuple[int, int, int, str] | None = None  # (rank, port, index, type)
    for port in _numbered(_resolve(root, ports)[0]):
        base = f"{ports}/{port}"
        fds = [_open_dir(root, f"{base}/{d}") for d in ("gids", "gid_attrs/ndevs", "gid_attrs/types")]
        gids_fd, ndevs_fd, types_fd = fds
        try:
            if gids_fd is None:
                continue
            for index in _numbered(_resolve(root, f"{base}/gids")[0]):
                text = _read_at(gids_fd, index)
                if text is None or not _same_gid(text, want):
                    continue
                if _read_at(ndevs_fd, index) != ifname:
                    continue
                gid_type = _read_at(types_fd, index)
                if gid_type is None:
                    continue
                rank = GID_TYPE_PREFERENCE.index(gid_type) if gid_type in GID_TYPE_PREFERENCE else len(GID_TYPE_PREFERENCE)
                candidate = (rank, int(port), int(index), gid_type)
                if best is None or candidate < best:
                    best = candidate
                if rank == 0:
                    return best[1], best[2], best[3]
        finally:
            for fd in fds:
                if fd is not None:
                    os.close(fd)
    return None if best is None else (best[1], best[2], best[3])
