"""Fixtures for the root netns tests: a real CNI runtime (cnitool on libcni), the plugins as a
runtime sees them, and namespaces/links that are always removed.

Session fixtures
    ``cnitool``   path of the cnitool front end, built once per session into a temporary
                  directory (skipped when Go or libcni is not installed; a build *failure* with
                  both present is an error).
    ``cni_bin``   a temporary CNI bin directory: *copies* of the venv's console scripts
                  ``macvlan-rdma`` and ``lease-ipam`` (absolute shebang, so they run copied and
                  with a bare environment) plus a symlink to every file in /usr/lib/cni (the Go
                  reference plugins: macvlan, host-local, ...).

Function fixtures
    ``netns``     factory: ``netns()`` adds ``<PREFIX><n>`` (loopback up) and returns a
                  :class:`Netns` (``.name``, ``.path``); every one is deleted at teardown.
    ``master``    factory: ``master(mtu=None, ns=None, peer_ns=None)`` creates a veth pair with
                  unique names (``.name`` is the end to use as macvlan master, ``.peer`` the
                  other), both ends up (so macvlans get carrier), in the host netns unless
                  ``ns``/``peer_ns`` (a :class:`Netns`) is given. Never an existing interface.
    ``cni``       a :class:`CniEnv`: a private temporary NETCONFPATH, libcni cache dir,
                  host-local dataDir and lease-ipam dataDir, with helpers to write configs and
                  to run cnitool (``cni.tool``) or one plugin directly (``cni.exec``).

Every name this session creates starts with ``rdt-<4 hex digits of the pid>`` (``nstools.PREFIX``);
an autouse session finalizer asserts that no such namespace or host link is left (and removes any
it finds). Names of other sessions are never touched, so parallel runs on one machine are safe.
When not running as root, every test that needs these fixtures is skipped.
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

try:
    from netns_tests import cnitool_client as cc
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover - netns_tests not importable as a package
    import cnitool_client as cc  # type: ignore[no-redef]
    import nstools as nt  # type: ignore[no-redef]

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
PREFIX = nt.PREFIX  # "rdt-" + 4 hex digits of the pid
_counter = itertools.count(1)

# Fixtures that create kernel objects (or need a root-only build of the plugin dir).
ROOT_FIXTURES = {"netns", "master", "cni", "cni_bin", "cnitool"}


def unique() -> str:
    """``rdt-<4 hex of pid><3 hex>``: 11 characters, room for a one-letter suffix within IFNAMSIZ."""
    return f"{PREFIX}{next(_counter) % 0x1000:03x}"


def _root_skip_reason() -> Optional[str]:
    if os.geteuid() != 0:
        return ("netns tests need root: they create network namespaces, veth pairs and macvlans "
                "(run e.g. 'sudo .venv/bin/python -m pytest netns_tests')")
    if not os.access(nt.IP, os.X_OK):
        return f"iproute2 'ip' not found at {nt.IP}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _root_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if HERE in pathlib.Path(str(item.path)).resolve().parents and ROOT_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(skip)


# --------------------------------------------------------------------------- leak guard


def _leftovers() -> tuple[list[str], list[str]]:
    proc = nt.ip("-j", "netns", "list", check=False)
    namespaces = [e["name"] for e in json.loads(proc.stdout or "[]")] if proc.returncode == 0 else []
    proc = nt.ip("-j", "link", "show", check=False)
    host_links = [e["ifname"] for e in json.loads(proc.stdout or "[]")] if proc.returncode == 0 else []
    return [n for n in namespaces if n.startswith(PREFIX)], [n for n in host_links if n.startswith(PREFIX)]


@pytest.fixture(scope="session", autouse=True)
def _no_leftovers() -> Iterator[None]:
    """At the end of the session, no ``rdt-<session>`` netns or host link may be left."""
    yield
    if not os.access(nt.IP, os.X_OK):
        return
    namespaces, host_links = _leftovers()
    for name in namespaces:
        nt.ip("netns", "del", name, check=False)
    for name in host_links:
        nt.ip("link", "del", name, check=False)
    assert not namespaces and not host_links, (
        f"netns tests left behind namespaces {namespaces} and host links {host_links} (now removed)"
    )


# --------------------------------------------------------------------------- session fixtures


@pytest.fixture(scope="session")
def cnitool() -> Iterator[pathlib.Path]:
    reason = cc.missing_prerequisites()
    if reason is not None:
        pytest.skip(f"cnitool cannot be built: {reason}")
    build_dir = pathlib.Path(tempfile.mkdtemp(prefix=f"{PREFIX}-cnitool-"))
    try:
        # A build failure with Go and libcni present is a test error, not a skip.
        yield cc.build(build_dir)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)


def _venv_bin() -> pathlib.Path:
    for candidate in (pathlib.Path(sys.executable).parent, REPO / ".venv" / "bin"):
        if (candidate / nt.PLUGIN).is_file():
            return candidate
    raise RuntimeError(f"console script {nt.PLUGIN} not found next to {sys.executable} nor in {REPO / '.venv/bin'}; "
                       "install the project: .venv/bin/pip install -e .")


# How the plugins are installed in the tests' CNI bin dir (RDMANET_TEST_PLUGINS):
#   shims   (default) the stdlib-only shims install.sh writes, with no daemon: each call runs the
#           plugin in-process, as on a node where `rdmanet daemon` is not running
#   daemon  the same shims with a session `rdmanet daemon` answering them (scripts/test.sh runs
#           the netns suite a second time this way: both must give the same results)
#   scripts copies of the venv's console scripts
PLUGIN_MODES = ("shims", "daemon", "scripts")


@pytest.fixture(scope="session")
def cni_bin() -> Iterator[pathlib.Path]:
    for plugin in ("macvlan", "host-local"):
        if not os.access(nt.GO_PLUGIN_DIR / plugin, os.X_OK):
            pytest.skip(f"{nt.GO_PLUGIN_DIR / plugin} missing (install containernetworking-plugins)")
    mode = os.environ.get("RDMANET_TEST_PLUGINS", "shims")
    if mode not in PLUGIN_MODES:
        raise pytest.UsageError(f"RDMANET_TEST_PLUGINS={mode!r}: expected one of {PLUGIN_MODES}")
    venv_bin = _venv_bin()
    path = pathlib.Path(tempfile.mkdtemp(prefix=f"{PREFIX}-bin-"))
    daemon = None
    try:
        if mode == "scripts":
            for script in (nt.PLUGIN, "host-device-rdma", "ipoib-rdma", "lease-ipam"):
                shutil.copy2(venv_bin / script, path / script)
        else:
            from rdmanet.node.testing import Daemon, write_shims

            socket_path = str(path / "daemon.sock")
            write_shims(path, socket_path, python=str(venv_bin / "python"))
            if mode == "daemon":
                daemon = Daemon(socket_path)
        for entry in sorted(nt.GO_PLUGIN_DIR.iterdir()):
            if entry.is_file() and not (path / entry.name).exists():
                (path / entry.name).symlink_to(entry)
        yield path
        if daemon is not None:
            assert daemon.proc.poll() is None, f"the daemon died during the tests: {daemon.log()}"
    finally:
        if daemon is not None:
            daemon.cleanup()
        shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- namespaces and links


@dataclass(frozen=True)
class Netns:
    name: str

    @property
    def path(self) -> str:
        return f"/run/netns/{self.name}"

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return nt.ip("-n", self.name, *args, check=check)

    def run(self, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` inside the namespace (ip netns exec)."""
        return subprocess.run([nt.IP, "netns", "exec", self.name, *cmd], capture_output=True, text=True,
                              timeout=timeout, check=False, env={"PATH": nt.BARE_PATH})

    def sysctl(self, key: str, value: str) -> None:
        """Set a sysctl inside the namespace (e.g. net.ipv6.conf.default.accept_dad)."""
        proc = self.run("sysctl", "-qw", f"{key}={value}")
        assert proc.returncode == 0, f"sysctl {key}={value} in {self.name}: {proc.stderr}"

    def exists(self) -> bool:
        return os.path.exists(self.path)


@pytest.fixture
def netns() -> Iterator[Callable[[], Netns]]:
    created: list[Netns] = []

    def make() -> Netns:
        ns = Netns(unique())
        nt.ip("netns", "add", ns.name)
        created.append(ns)
        ns.ip("link", "set", "lo", "up")
        return ns

    try:
        yield make
    finally:
        # Deleting a namespace also destroys every link in it (a veth end takes its peer along).
        for ns in reversed(created):
            nt.ip("netns", "del", ns.name, check=False)


@dataclass(frozen=True)
class Master:
    name: str
    peer: str
    mtu: int
    ns: Optional[Netns] = None
    peer_ns: Optional[Netns] = None


@pytest.fixture
def master() -> Iterator[Callable[..., Master]]:
    created: list[Master] = []

    def make(*, mtu: Optional[int] = None, ns: Optional[Netns] = None, peer_ns: Optional[Netns] = None) -> Master:
        base = unique()
        end, peer = f"{base}a", f"{base}b"
        mtu_args = ["mtu", str(mtu)] if mtu else []
        nt.ip("link", "add", end, *mtu_args, "type", "veth", "peer", "name", peer, *mtu_args)
        m = Master(end, peer, mtu or 1500, ns, peer_ns)
        created.append(m)
        for name, where in ((end, ns), (peer, peer_ns)):
            # Keep the host's auto-configuration off the test links.
            nt.ip("link", "set", name, "addrgenmode", "none", check=False)
            if where is not None:
                nt.ip("link", "set", name, "netns", where.name)
            nt.ip(*(["-n", where.name] if where else []), "link", "set", name, "up")
        return m

    try:
        yield make
    finally:
        for m in reversed(created):
            for name, where in ((m.name, m.ns), (m.peer, m.peer_ns)):
                if where is None or where.exists():
                    nt.ip(*(["-n", where.name] if where else []), "link", "del", name, check=False)


# --------------------------------------------------------------------------- CNI environment


@dataclass
class CniEnv:
    """One test's CNI runtime state: config dir, libcni cache, IPAM data dirs."""

    root: pathlib.Path
    cni_bin: pathlib.Path
    request: pytest.FixtureRequest = field(repr=False)

    def __post_init__(self) -> None:
        for d in (self.netconfpath, self.cache_dir, self.host_local_dir, self.data_dir):
            d.mkdir(parents=True, exist_ok=True)
        # The node policy (rdmanet.cni.linux.roots) the runtime hands the plugins: every root is this
        # test's directory, and host-device-rdma's state lives in hd-state under it.
        self.policy_env = nt.node_policy_env(self.root)

    def _with_policy(self, kw: dict) -> dict:
        kw["extra_env"] = {**self.policy_env, **(kw.get("extra_env") or {})}
        return kw

    @property
    def netconfpath(self) -> pathlib.Path:
        return self.root / "net.d"

    @property
    def cache_dir(self) -> pathlib.Path:
        return self.root / "cache"

    @property
    def host_local_dir(self) -> pathlib.Path:
        return self.root / "host-local"

    @property
    def data_dir(self) -> pathlib.Path:
        """lease-ipam's dataDir."""
        return self.root / "lease-ipam"

    @property
    def state_roots(self) -> list[pathlib.Path]:
        """Where a leaked per-attachment state file could appear."""
        return [self.root, pathlib.Path("/var/lib/cni"), pathlib.Path("/run/rdmanet"), pathlib.Path("/var/run/rdmanet")]

    def fork(self, label: str) -> "CniEnv":
        """A second, independent environment under this one (e.g. for the Go reference)."""
        return CniEnv(self.root / label, self.cni_bin, self.request)

    def plugin(self, name: str = nt.PLUGIN) -> pathlib.Path:
        return self.cni_bin / name

    def write(self, conf: Mapping[str, Any]) -> pathlib.Path:
        """Write a conflist (``plugins`` key) or a single conf under NETCONFPATH, named after it."""
        suffix = ".conflist" if "plugins" in conf else ".conf"
        path = self.netconfpath / f"{conf['name']}{suffix}"
        path.write_text(json.dumps(conf, indent=2))
        return path

    def tool(self, verb: str, net: str, ns: Netns | str, *, ifname: str = "net1",
             **kw: Any) -> subprocess.CompletedProcess[str]:
        """``cnitool <verb> <net> <netns>`` with this environment's NETCONFPATH, cache, CNI_PATH."""
        binary = self.request.getfixturevalue("cnitool")
        kw.setdefault("netconfpath", self.netconfpath)
        kw.setdefault("cni_path", [self.cni_bin])
        kw.setdefault("cache_dir", self.cache_dir)
        path = ns.path if isinstance(ns, Netns) else ns
        return cc.run(binary, verb, net, path, ifname=ifname, **self._with_policy(kw))

    def exec(self, command: str, stdin: Mapping[str, Any] | str | bytes, *, ns: Netns | str | None = None,
             plugin: str = nt.PLUGIN, cni_path: Optional[list] = None, **kw: Any) -> subprocess.CompletedProcess[str]:
        """Run one plugin from ``cni_bin`` directly (raw exec, bare env)."""
        path = ns.path if isinstance(ns, Netns) else ns
        return nt.raw_exec(self.plugin(plugin), command, stdin, netns=path,
                           cni_path=cni_path if cni_path is not None else [self.cni_bin], **self._with_policy(kw))


@pytest.fixture
def cni(cni_bin: pathlib.Path, request: pytest.FixtureRequest) -> Iterator[CniEnv]:
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"{PREFIX}-cni-"))
    try:
        yield CniEnv(root, cni_bin, request)
    finally:
        shutil.rmtree(root, ignore_errors=True)
