"""Node-owned roots: the only places a network config may steer a path to, and how to open them.

A NetworkAttachmentDefinition may be written by a tenant, and in a cluster every call runs as
root inside ``rdmanet daemon``. So every path a config names (``ipam.log_file``,
``ipam.dataDir``, ``ipam.kubernetes.kubeconfig``, whereabouts' ``configuration_path``,
``runtimeConfig.CNIDeviceInfoFile``) must lie under a root the node owner chose, and is opened
component by component below that root with ``O_NOFOLLOW`` (``openat`` on the parent's fd), so a
symlink planted anywhere below the root is refused rather than followed, and what is checked is
the directory or file actually opened, not the string. Each directory below a root must be owned
by us (root) and not writable by group or others: then nobody else can swap a component after the
check. host-device-rdma's state dir is not a config key at all: it is the node's.

The node policy (docs/security.md) comes, first that applies, from:
1. the file named by ``RDMANET_NODE_POLICY`` in the call's environment, which the runtime
   (kubelet, CRI, Multus) sets and a network config cannot;
2. the daemon's flags (``rdmanet daemon --node-policy FILE --allow-root KIND=DIR ...``);
3. the file named by ``RDMANET_NODE_POLICY`` in the process's own environment (the daemon's
   unit or container);
4. ``/etc/rdmanet/node-policy.json`` when it exists;
5. the built-in defaults below (what the embedded single-node setup uses).
A policy file must be a regular file owned by root and writable by nobody else. Its keys
replace the defaults they name::

    {"logRoots": ["/var/log/rdmanet"], "dataRoots": ["/var/lib/cni"],
     "kubeconfigs": ["/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig"], "configRoots": ["/etc/cni/net.d"],
     "deviceInfoDir": "/var/run/k8s.cni.cncf.io/devinfo/cni",
     "hostDeviceStateDir": "/var/lib/cni/host-device-rdma",
     "leaseNamespaces": ["rdmanet-system"], "poolNamespaces": ["kube-system", "nvidia-network-operator"],
     "hostDevices": [{"name": "ens2f1"}], "masters": [{"name": "ens1f*"}]}

Kubeconfigs are listed by file, not by root: a directory of CNI configs also holds credentials a
NAD must not borrow (Multus' own kubeconfig). The device allow-lists (``hostDevices``,
``hostDevicesFromDeviceID``, ``masters``, ``rdmaMasters``) are read by
:mod:`rdmanet.cni.linux.device_policy`.

Errors: a path outside the roots, with ``..``, through a symlink, or through a directory others
may write is CNI error 7 naming the key, the path and the allowed roots; an I/O failure is 5.
"""

from __future__ import annotations

import errno
import fnmatch
import json
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass, field, replace
from typing import Iterable, Optional, Sequence

from rdmanet.cni.core import env as request_env
from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, CNIError

from . import device_policy
from .device_policy import Rule  # rules only: device_policy imports pyroute2 when it checks a link

POLICY_ENV = "RDMANET_NODE_POLICY"
DEFAULT_POLICY_FILE = "/etc/rdmanet/node-policy.json"
POLICY_MAX_BYTES = 64 << 10
KINDS = ("log", "data", "config")  # directories; kubeconfigs are listed by file
KUBECONFIG_KIND = "kubeconfig"
RDMANET_KUBECONFIG = "/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig"  # install.sh --daemonset writes it
WHEREABOUTS_KUBECONFIG = "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"  # whereabouts' NADs name it
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
HOW_TO_WIDEN = "the node owner can widen the roots in the node policy (docs/security.md), a network config cannot"


@dataclass(frozen=True)
class NodePolicy:
    """What a config may name on this node: directories, Lease namespaces, API servers (the node
    owner's policy file, else these defaults)."""

    log_roots: tuple[str, ...] = ("/var/log/rdmanet",)
    data_roots: tuple[str, ...] = ("/var/lib/cni",)
    kubeconfigs: tuple[str, ...] = (RDMANET_KUBECONFIG, WHEREABOUTS_KUBECONFIG)  # files, not roots
    config_roots: tuple[str, ...] = ("/etc/cni/net.d",)
    device_info_dir: str = "/var/run/k8s.cni.cncf.io/devinfo/cni"
    host_device_state_dir: str = "/var/lib/cni/host-device-rdma"
    # the namespaces a config's ipam.kubernetes.namespace may name (None: any the credentials' RBAC grants)
    lease_namespaces: Optional[tuple[str, ...]] = ("rdmanet-system",)
    # the namespaces nv-ipam pools are read from (lease-ipam's poolName): a config's
    # ipam.poolNamespace must be one of them; without it they are looked in, in this order
    # (nv-ipam's default, then the NVIDIA Network Operator's)
    pool_namespaces: tuple[str, ...] = ("kube-system", "nvidia-network-operator")
    api_roots: tuple[str, ...] = ()  # API servers a config's k8s_api_root may name besides its kubeconfig's own
    host_devices: tuple[Rule, ...] = ()  # devices host-device-rdma may move besides the device plugin's
    host_devices_from_device_id: bool = True  # the device a deviceID / pciBusID / runtimeConfig.deviceID names
    masters: tuple[Rule, ...] = ()  # masters of macvlan-rdma and ipoib-rdma besides links with an RDMA device
    rdma_masters: bool = True  # every link with an RDMA device may be a master
    source: str = field(default="built-in defaults", compare=False)

    def roots(self, kind: str) -> tuple[str, ...]:
        if kind == KUBECONFIG_KIND:
            return self.kubeconfigs
        return getattr(self, f"{kind}_roots")

    def widened(self, kind: str, directory: str) -> "NodePolicy":
        """This policy with one more root of ``kind`` (the daemon's ``--allow-root``)."""
        if kind not in KINDS:
            raise ValueError(f"unknown root kind {kind!r}: one of {', '.join(KINDS)}")
        return replace(self, **{f"{kind}_roots": self.roots(kind) + (absolute_path(directory, f"{kind} root"),)})

    def to_json(self) -> dict:
        """The policy as a policy file would say it (what ``rdmanet doctor`` shows, what the demo extends)."""
        doc: dict = {}
        for key, attr in _FILE_KEYS.items():
            value = getattr(self, attr)
            if attr in _RULE_KEYS:
                value = [rule.to_json() for rule in value]
            elif isinstance(value, tuple):
                value = list(value)
            doc[key] = value
        return doc

    def check_lease_namespace(self, namespace: str) -> None:
        if self.lease_namespaces is not None and namespace not in self.lease_namespaces:
            raise CNIError(INVALID_CONFIG,
                           f"invalid network config: ipam.kubernetes.namespace: Leases in namespace {namespace!r} are not "
                           f"allowed on this node (allowed: {', '.join(self.lease_namespaces) or 'none'})",
                           f"set ipam.kubernetes.namespace to one of them; {HOW_TO_WIDEN} (leaseNamespaces)")

    def check_pool_namespace(self, namespace: str) -> None:
        if namespace not in self.pool_namespaces:
            raise CNIError(INVALID_CONFIG,
                           f"invalid network config: ipam.poolNamespace: nv-ipam pools in namespace {namespace!r} are not "
                           f"read on this node (allowed: {', '.join(self.pool_namespaces) or 'none'})",
                           f"remove poolNamespace (the allowed namespaces are looked in, in order) or set it to one of "
                           f"them; {HOW_TO_WIDEN} (poolNamespaces)")

    def check_api_root(self, api_root: str, server: str) -> None:
        """A config's ``k8s_api_root`` would receive the node's credentials: it must be the server
        the kubeconfig (or the in-cluster config) already names, or one the node owner listed."""
        if api_url(api_root) == api_url(server) or api_url(api_root) in self.api_roots:
            return
        raise CNIError(INVALID_CONFIG,
                       f"invalid network config: ipam.kubernetes.k8s_api_root: {api_root!r} is not the API server of "
                       f"the credentials ({server!r}) nor one this node allows (apiRoots: "
                       f"{', '.join(self.api_roots) or 'none'}); the node's credentials are never sent elsewhere",
                       f"remove k8s_api_root (the kubeconfig's server is used) or set it to {server!r}; "
                       f"{HOW_TO_WIDEN} (apiRoots)")


_FILE_KEYS = {"logRoots": "log_roots", "dataRoots": "data_roots", "kubeconfigs": "kubeconfigs",
              "configRoots": "config_roots", "deviceInfoDir": "device_info_dir",
              "hostDeviceStateDir": "host_device_state_dir", "leaseNamespaces": "lease_namespaces",
              "poolNamespaces": "pool_namespaces",
              "apiRoots": "api_roots", "hostDevices": "host_devices",
              "hostDevicesFromDeviceID": "host_devices_from_device_id", "masters": "masters",
              "rdmaMasters": "rdma_masters"}
_RULE_KEYS = {"host_devices", "masters"}
_REPLACED_KEYS = {"kubeconfigRoots": "kubeconfigs (a list of kubeconfig files: a NAD may name only those)"}


class PolicyError(ValueError):
    """The node policy file is unusable (the node owner's mistake, not the config's)."""


def api_url(value: str) -> str:
    """An API server URL compared as the client uses it: scheme and host lower-cased, no trailing '/'."""
    scheme, sep, rest = value.partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme.lower()}{sep}{host.lower()}{slash}{path}".rstrip("/")


def absolute_path(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value or ".." in value.split("/"):
        raise PolicyError(f"{what} {value!r} is not an absolute path without '..'")
    return os.path.normpath(value)


def policy_from_dict(doc: object, source: str) -> NodePolicy:
    if not isinstance(doc, dict):
        raise PolicyError(f"{source}: not a JSON object")
    for key, instead in _REPLACED_KEYS.items():
        if key in doc:
            raise PolicyError(f"{source}: {key} is no longer read: use {instead}")
    unknown = sorted(set(doc) - set(_FILE_KEYS))
    if unknown:
        raise PolicyError(f"{source}: unknown keys {unknown} (known: {sorted(_FILE_KEYS)})")
    values: dict = {"source": source}
    for key, attr in _FILE_KEYS.items():
        if key not in doc:
            continue
        value = doc[key]
        if key == "apiRoots":
            if not isinstance(value, list) or not all(isinstance(v, str) and re.match(r"^https?://[^/\s]+", v)
                                                      for v in value):
                raise PolicyError(f"{source}: apiRoots must be a list of http(s) URLs of API servers")
            values[attr] = tuple(api_url(v) for v in value)
        elif key.endswith("Roots") or key == "kubeconfigs":
            what = "files" if key == "kubeconfigs" else "directories"
            if not isinstance(value, list):
                raise PolicyError(f"{source}: {key} must be a list of absolute {what}")
            values[attr] = tuple(absolute_path(v, f"{source}: {key} entry") for v in value)
        elif attr in _RULE_KEYS:
            try:
                values[attr] = device_policy.rules_from_json(value, key, host_in_use=key == "hostDevices")
            except ValueError as exc:
                raise PolicyError(f"{source}: {exc}") from None
        elif key in ("hostDevicesFromDeviceID", "rdmaMasters"):
            if not isinstance(value, bool):
                raise PolicyError(f"{source}: {key} must be true or false")
            values[attr] = value
        elif key == "leaseNamespaces":
            if value is None:
                values[attr] = None
            elif not isinstance(value, list) or not all(isinstance(v, str) and _DNS_LABEL.match(v) for v in value):
                raise PolicyError(f"{source}: leaseNamespaces must be null or a list of namespace names")
            else:
                values[attr] = tuple(value)
        elif key == "poolNamespaces":
            if not isinstance(value, list) or not all(isinstance(v, str) and _DNS_LABEL.match(v) for v in value):
                raise PolicyError(f"{source}: poolNamespaces must be a list of namespace names")
            values[attr] = tuple(dict.fromkeys(value))
        else:
            values[attr] = absolute_path(value, f"{source}: {key}")
    return NodePolicy(**values)


_cache: dict[str, tuple[tuple, NodePolicy]] = {}
_cache_lock = threading.Lock()
_process_policy: Optional[NodePolicy] = None


def load_policy_file(path: str) -> NodePolicy:
    """The policy in ``path``; it must be a regular file owned by root (us), writable by nobody else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise PolicyError(f"node policy {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PolicyError(f"node policy {path}: not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PolicyError(f"node policy {path}: must be owned by uid {os.geteuid()} and writable by nobody else "
                              f"(it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
        key = (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)
        with _cache_lock:
            cached = _cache.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        data = os.read(fd, POLICY_MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > POLICY_MAX_BYTES:
        raise PolicyError(f"node policy {path}: larger than {POLICY_MAX_BYTES} bytes")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise PolicyError(f"node policy {path}: not valid JSON: {exc}") from None
    policy = policy_from_dict(doc, path)
    with _cache_lock:
        _cache[path] = (key, policy)
    return policy


def process_policy() -> Optional[NodePolicy]:
    """The policy :func:`set_process_policy` set (None: none)."""
    return _process_policy


def set_process_policy(policy: Optional[NodePolicy]) -> None:
    """The daemon's policy (from its flags), for calls whose environment names none."""
    global _process_policy
    _process_policy = policy


def current() -> NodePolicy:
    """The node policy that applies to the call being served (see the module docstring)."""
    try:
        path = request_env.get(POLICY_ENV)
        if path:
            return load_policy_file(path)
        if _process_policy is not None:
            return _process_policy
        if os.environ.get(POLICY_ENV):
            return load_policy_file(os.environ[POLICY_ENV])
        if os.path.lexists(DEFAULT_POLICY_FILE):
            return load_policy_file(DEFAULT_POLICY_FILE)
    except PolicyError as exc:
        raise CNIError(INVALID_CONFIG, f"node policy: {exc}", "the node owner must fix the node policy file (docs/security.md)") from None
    return NodePolicy()


# --------------------------------------------------------------------------- placing a path


@dataclass(frozen=True)
class Placed:
    """A config path under one of the roots: the root as configured and the components below it."""

    root: str
    parts: tuple[str, ...]

    @property
    def path(self) -> str:
        return os.path.join(self.root, *self.parts)


def _outside(key: str, path: object, roots: Sequence[str], problem: str = "is outside the allowed roots") -> CNIError:
    allowed = ", ".join(roots) or "none"
    return CNIError(INVALID_CONFIG, f"invalid network config: {key}: {path!r} {problem} ({allowed})",
                    f"use a path under {allowed}; {HOW_TO_WIDEN}")


def place(key: str, path: object, roots: Sequence[str]) -> Placed:
    """``path`` as a root and components, or CNI error 7 naming ``key``, the path and the roots.

    The path must be absolute, without ``..``; it is compared with each root as written and as
    the kernel resolves it (``/var/run`` is a symlink to ``/run`` on most systems)."""
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise _outside(key, path, roots, "is not an absolute path")
    if ".." in path.split("/"):
        raise _outside(key, path, roots, "contains '..'")
    norm = os.path.normpath(path)
    if norm.startswith("//"):
        norm = "/" + norm.lstrip("/")
    for root in roots:
        for form in dict.fromkeys((os.path.normpath(root), os.path.realpath(root))):
            if norm == form or norm.startswith(form.rstrip("/") + "/"):
                rest = norm[len(form):].strip("/")
                return Placed(root, tuple(rest.split("/")) if rest else ())
    raise _outside(key, path, roots)


def place_kubeconfig(key: str, path: object, files: Sequence[str]) -> Placed:
    """A kubeconfig a config names, which must be one the node policy lists (``kubeconfigs``:
    files, or shell patterns such as ``/etc/cni/net.d/rdmanet.d/*.kubeconfig``): placed below the
    listed file's directory (a pattern's: the directory before its first wildcard, so every
    component the pattern leaves open is checked like one below a root); else CNI error 7 naming
    the key, the path and the files."""
    if isinstance(path, str) and path.startswith("/") and "\0" not in path and ".." not in path.split("/"):
        norm = os.path.normpath(path)
        for listed in files:
            literal = _literal_dir(listed)
            for form in dict.fromkeys((literal, os.path.realpath(literal))):
                pattern = os.path.join(form, os.path.relpath(listed, literal))
                if norm.startswith(form.rstrip("/") + "/") and fnmatch.fnmatchcase(norm, pattern):
                    return Placed(literal, tuple(norm[len(form):].strip("/").split("/")))
    allowed = ", ".join(files) or "none"
    raise CNIError(INVALID_CONFIG, f"invalid network config: {key}: {path!r} is not a kubeconfig this node lets a "
                   f"network config name (kubeconfigs: {allowed})",
                   f"name one of {allowed}, or remove the key (lease-ipam then uses the daemon's own service "
                   f"account); the node owner lists kubeconfigs by file in the node policy (docs/security.md)")


def _literal_dir(listed: str) -> str:
    """The directory of a listed kubeconfig: of the file, or before a pattern's first wildcard."""
    parts = listed.split("/")
    for i, part in enumerate(parts):
        if any(c in part for c in "*?["):
            return "/".join(parts[:i]) or "/"
    return os.path.dirname(listed) or "/"


def place_kind(kind: str, key: str, path: object, policy: Optional[NodePolicy] = None) -> Placed:
    """:func:`place` under the roots of ``kind`` (``kubeconfig``: :func:`place_kubeconfig`)."""
    policy = policy or current()
    if kind == KUBECONFIG_KIND:
        return place_kubeconfig(key, path, policy.kubeconfigs)
    return place(key, path, policy.roots(kind))


def _unsafe(key: str, placed: Placed, detail: str) -> CNIError:
    return CNIError(INVALID_CONFIG, f"invalid network config: {key}: {placed.path!r} is refused: {detail}",
                    "every component below the root must be a real directory owned by root and writable by nobody "
                    "else, with no symlink; 'rdmanet doctor' lists such files")


def _io(key: str, path: str, exc: OSError) -> CNIError:
    return CNIError(IO_FAILURE, f"{key}: {path}: {exc.strerror or exc}",
                    "check the file system: permissions, free space, read-only mounts")


def _private(st: os.stat_result) -> bool:
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _is_symlink(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _open_root(root: str, create: bool, mode: int) -> int:
    if create:
        os.makedirs(root, mode=mode, exist_ok=True)
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _walk(key: str, placed: Placed, parts: Sequence[str], create: bool, mode: int,
          file_is_missing: bool = False) -> Optional[int]:
    """An fd of the directory ``root/parts``, each component opened with O_NOFOLLOW and checked;
    missing ones are made with ``mode`` when ``create``, else None is returned (also for a
    regular file on the way when ``file_is_missing``)."""
    try:
        fd = _open_root(placed.root, create, mode)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _io(key, placed.root, exc) from None
    try:
        for i, part in enumerate(parts):
            where = os.path.join(placed.root, *parts[:i + 1])
            made = False
            try:
                nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
                except OSError as exc:
                    raise _io(key, where, exc) from None
                try:
                    nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise _unsafe(key, placed, f"{where} changed while it was created ({exc.strerror})") from None
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise _io(key, where, exc) from None
                if file_is_missing and not _is_symlink(part, fd):
                    return None  # a file where a directory should be: the caller's own error, not an attack
                raise _unsafe(key, placed, f"{where} is a symlink or not a directory") from None
            os.close(fd)
            fd = nfd
            if made:
                os.fchmod(fd, mode)  # the umask may have cleared bits; set exactly what we want
            st = os.fstat(fd)
            if not _private(st):
                raise _unsafe(key, placed, f"{where} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}")
        result, fd = fd, -1
        return result
    finally:
        if fd >= 0:
            os.close(fd)


def check_dir(kind: str, key: str, path: object, *, policy: Optional[NodePolicy] = None) -> str:
    """Check a directory a config names (``ipam.dataDir``) without creating it; returns its path.

    Every existing component below the root must be a private real directory; a missing tail is
    fine: whoever creates it does so inside a directory only root may write."""
    roots = (policy or current()).roots(kind)
    placed = place(key, path, roots)
    parts = placed.parts
    while True:
        fd = _walk(key, placed, parts, create=False, mode=0o700, file_is_missing=True)
        if fd is not None:
            os.close(fd)
            return placed.path
        if not parts:
            return placed.path
        parts = parts[:-1]


def ensure_dir(path: str, *, key: str = "state directory", mode: int = 0o700) -> str:
    """Create (0700) or check a node-owned directory (host-device-rdma's state dir) the safe way."""
    placed = Placed(os.path.dirname(os.path.normpath(path)) or "/", (os.path.basename(os.path.normpath(path)),))
    fd = _walk(key, placed, placed.parts, create=True, mode=mode)
    if fd is not None:
        os.close(fd)
    return placed.path


def open_file(kind: str, key: str, path: object, flags: int, *, mode: int = 0o600, create_dirs: bool = False,
              dir_mode: int = 0o700, policy: Optional[NodePolicy] = None, roots: Optional[Sequence[str]] = None) -> int:
    """Open a file a config names, under the roots of ``kind`` (or the given ``roots``); an fd.

    Each directory below the root is opened with O_NOFOLLOW and must be private; the file itself
    is opened with O_NOFOLLOW (a planted symlink is refused) and must be a regular file; a file
    opened for writing must be ours and writable by nobody else. Missing directories are created
    with ``dir_mode`` when ``create_dirs``. FileNotFoundError passes through (the caller decides)."""
    placed = place(key, path, roots) if roots is not None else place_kind(kind, key, path, policy)
    if not placed.parts:
        raise _unsafe(key, placed, "it is the root directory itself, not a file in it")
    dir_fd = _walk(key, placed, placed.parts[:-1], create=create_dirs, mode=dir_mode)
    if dir_fd is None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", placed.path)
    try:
        try:
            fd = os.open(placed.parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _unsafe(key, placed, "the file is a symlink") from None
            raise _io(key, placed.path, exc) from None
    finally:
        os.close(dir_fd)
    st = os.fstat(fd)
    writing = flags & (os.O_WRONLY | os.O_RDWR)
    problem = None
    if not stat.S_ISREG(st.st_mode):
        problem = "not a regular file"
    elif writing and not _private(st):
        problem = f"the file is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}"
    if problem:
        os.close(fd)
        raise _unsafe(key, placed, problem)
    return fd


def read_file(kind: str, key: str, path: object, *, limit: int = 1 << 20, policy: Optional[NodePolicy] = None) -> bytes:
    """The content of a file a config names (a kubeconfig), at most ``limit`` bytes, opened as
    :func:`open_file` does. FileNotFoundError passes through."""
    fd = open_file(kind, key, path, os.O_RDONLY, policy=policy)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise CNIError(INVALID_CONFIG, f"invalid network config: {key}: {path} is larger than {limit} bytes",
                       "name a smaller file")
    return b"".join(chunks)


def roots_of(policy: NodePolicy) -> Iterable[tuple[str, str]]:
    """(what, directory) of every root and node directory of a policy, for ``rdmanet doctor``."""
    for kind in KINDS:
        for root in policy.roots(kind):
            yield f"{kind} root", root
    for kubeconfig in policy.kubeconfigs:
        yield "kubeconfig directory", _literal_dir(kubeconfig)
    yield "device-info dir", policy.device_info_dir
    yield "host-device-rdma state dir", policy.host_device_state_dir


def replace_file(key: str, path: object, content: bytes, *, roots: Sequence[str], new_mode: int = 0o600,
                 dir_mode: int = 0o700) -> None:
    """Replace (or create) a file a config names, atomically, under ``roots``: a temp file made
    O_EXCL|O_NOFOLLOW in the same directory (opened as :func:`open_file` does), fsync, rename.

    An existing file keeps its mode (``new_mode`` is for a new one); an existing symlink or
    non-regular file at the path is refused, never followed or replaced."""
    placed = place(key, path, roots)
    if not placed.parts:
        raise _unsafe(key, placed, "it is the root directory itself, not a file in it")
    dir_fd = _walk(key, placed, placed.parts[:-1], create=True, mode=dir_mode)
    name = placed.parts[-1]
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            mode = new_mode
        else:
            if not stat.S_ISREG(st.st_mode):
                raise _unsafe(key, placed, "the existing file is a symlink or not a regular file")
            mode = stat.S_IMODE(st.st_mode)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise _io(key, placed.path, exc) from None
        try:
            try:
                os.write(fd, content)
                os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            tmp = None
            os.fsync(dir_fd)
        except OSError as exc:
            raise _io(key, placed.path, exc) from None
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp, dir_fd=dir_fd)
                except OSError:
                    pass
    finally:
        os.close(dir_fd)


# Warnings about what the node policy refused or ignored (an ipam.log_file outside the roots):
# the daemon also writes this logger's records to its own log, whatever the call's level.
node_log = logging.getLogger("rdmanet.node")
