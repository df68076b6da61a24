"""A real container runtime: podman attaches a container through macvlan-rdma + lease-ipam.

Debian 12's podman 4.3 with its CNI backend (libcni 1.x) runs a busybox container on a network
whose conflist holds only our plugins: ``macvlan-rdma`` on a veth the test creates, with
``lease-ipam`` allocating from a random /24 of 198.18.0.0/16 into a private dataDir under the
default data root ``/var/lib/cni`` (no node policy: the DEL podman runs at exit gets none). The
container sees the address lease-ipam allocated, the link in its netns is a macvlan on our
master, and when the container exits podman runs DEL: the lease is released and the macvlan,
the netns and libcni's cached result are gone. The plugins run as the ``cni_bin`` fixture
installs them (shims without a daemon, or answered by ``rdmanet daemon`` with
``RDMANET_TEST_PLUGINS=daemon``).

Nothing is pulled: ``--rootfs`` points at a directory holding a static busybox and its applet
links. podman is isolated from the machine's own configuration and state: ``CONTAINERS_CONF``,
``CONTAINERS_STORAGE_CONF`` and ``CONTAINERS_REGISTRIES_CONF`` name files in a private
temporary directory that also holds the storage (vfs driver), podman's tmp dir (file locks,
exit files, events) and the CNI config dir; containers get a cgroup
parent of their own. Everything is removed at teardown, even after a failure.

What podman 4.3 needs on these machines:

* every ``run`` option goes *before* ``--rootfs``: after ``--rootfs`` the first argument is the
  rootfs path and everything after it is the container's command (``--network`` given before
  ``run`` is "unknown flag");
* runc with ``cgroup_manager = "cgroupfs"``: no systemd, and a hybrid cgroup v1/v2 layout;
* ``default_ulimits`` at or below this process's hard limits (nofile 20000 here): root cannot
  raise them, and without the setting runc fails with "error setting rlimit type 7: operation
  not permitted";
* ``static_dir`` must stay unset: conmon's exit command (``podman container cleanup``, which
  tears the network down when the container exits on its own) passes ``--root``, which puts
  the database under ``<graphroot>/libpod``; a static_dir elsewhere makes that cleanup look in
  another database and fail ("no such container"), so DEL never runs and ``podman run`` /
  ``podman wait`` sit out conmon's 20 s timeout;
* conmon daemonizes to PID 1, which here reaps only every second or so: this process is a child
  subreaper while a test's podman exists and reaps its conmons itself;
* podman leaves its cgroup parent (``libpod_parent`` and ``libpod_parent/conmon``) behind:
  containers get a parent named after this session, removed at teardown;
* busybox's ``--install -s`` links to the host path of the binary: the rootfs links each applet
  to ``busybox`` relatively instead.

Skipped, with the reason, when podman, runc or a static busybox is missing, or when podman
cannot run a trivial container here (probed once per session, podman's stderr in the reason).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]

INSTALL_HINT = "install them with apt-get install podman runc busybox-static, as scripts/test.sh does"
PODMAN = shutil.which("podman", path=nt.BARE_PATH)
RUNC = shutil.which("runc", path=nt.BARE_PATH)
BUSYBOX = shutil.which("busybox", path=nt.BARE_PATH)
CNI_CACHE = pathlib.Path("/var/lib/cni/results")  # libcni's default cache dir (podman sets no other)
CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
IFNAME = "eth0"  # podman's name for the first network interface
COMMAND_TIMEOUT = 60
RELEASE_TIMEOUT = 15  # conmon's exit command runs DEL about 1 s after the container exits
_worlds = itertools.count(1)


# --------------------------------------------------------------------------- prerequisites


def _is_static_elf(path: str) -> bool:
    """True when ``path`` is an ELF executable without a program interpreter (PT_INTERP)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF only (Debian amd64/arm64)
                return False
            endian = "<" if head[5] == 1 else ">"
            phoff, = struct.unpack_from(endian + "Q", head, 0x20)
            phentsize, phnum = struct.unpack_from(endian + "HH", head, 0x36)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return False
    return all(struct.unpack_from(endian + "I", table, i * phentsize)[0] != 3 for i in range(phnum))


def _missing() -> str | None:
    if PODMAN is None:
        return f"podman is not installed: {INSTALL_HINT}"
    if RUNC is None:
        return f"runc is not installed: {INSTALL_HINT}"
    if BUSYBOX is None:
        return f"busybox is not installed: {INSTALL_HINT}"
    if not _is_static_elf(os.path.realpath(BUSYBOX)):
        return f"{BUSYBOX} is not statically linked, so it cannot run alone in a rootfs: {INSTALL_HINT}"
    return None


def _ulimits() -> list[str]:
    """nofile 20000 and nproc 32768, lowered to this process's hard limits (root cannot raise them)."""
    out = []
    for name, limit, wanted in (("nofile", resource.RLIMIT_NOFILE, 20000), ("nproc", resource.RLIMIT_NPROC, 32768)):
        hard = resource.getrlimit(limit)[1]
        value = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        out.append(f"{name}={value}:{value}")
    return out


def _toml_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(str(i)) for i in items) + "]"


# --------------------------------------------------------------------------- conmon processes

# conmon daemonizes: it is re-parented to the nearest subreaper ancestor, else to PID 1, which on
# these machines reaps only every second or so (exited conmons linger as zombies). While a
# Podman exists, this process is a child subreaper, so it reaps every conmon of its tests.
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
REAP_TIMEOUT = 10.0


class _Subreaper:
    """Makes this process a child subreaper until :meth:`restore` (best effort: without prctl
    the conmons go to PID 1 as usual)."""

    def __init__(self) -> None:
        self._prctl = None
        self._previous = 0
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            flag = ctypes.c_int(0)
            if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and \
                    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
                self._prctl, self._previous = libc.prctl, flag.value
        except (OSError, AttributeError):
            pass

    def restore(self) -> None:
        if self._prctl is not None:
            self._prctl(PR_SET_CHILD_SUBREAPER, self._previous, 0, 0, 0)
            self._prctl = None


def _stat(pid: int) -> tuple[str, str, int] | None:
    """(comm, state, ppid) of ``pid``, None when it is gone."""
    try:
        text = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    state, ppid = text[text.rindex(")") + 2:].split()[:2]
    return comm, state, int(ppid)


def _is_conmon(pid: int, running: bool = False) -> bool:
    st = _stat(pid)
    return st is not None and st[0] == "conmon" and (not running or st[1] != "Z")


def _cmdline(pid: int) -> bytes:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _conmon_children() -> list[int]:
    """conmon processes (running or zombie) whose parent is this process."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[0] == "conmon" and st[2] == me:
                out.append(int(entry))
    return out


# --------------------------------------------------------------------------- an isolated podman


class Podman:
    """podman with private configuration and state, all under one temporary directory."""

    def __init__(self, cni_plugin_dirs: Sequence[pathlib.Path | str]) -> None:
        self.root = pathlib.Path(tempfile.mkdtemp(prefix=f"{nt.PREFIX}-podman-"))
        self.cgroup_parent = f"/{nt.PREFIX}-podman{next(_worlds)}"
        self.rootfs = self.root / "rootfs"
        self.net_dir = self.root / "net.d"
        # Under the default data root: podman's cleanup process (conmon's exit command) runs the
        # DEL without our environment, so the node policy is the built-in one (rdmanet.cni.linux.roots).
        self.data_dir = pathlib.Path("/var/lib/cni") / f"{self.root.name}-lease-ipam"
        self.networks: list[str] = []
        self.sandboxes: set[str] = set()
        self.conmon_pids: set[int] = set()
        try:
            self.env = self._configure(cni_plugin_dirs)
        except BaseException:
            shutil.rmtree(self.root, ignore_errors=True)
            shutil.rmtree(self.data_dir, ignore_errors=True)
            raise
        self.subreaper = _Subreaper()

    def _configure(self, cni_plugin_dirs: Sequence[pathlib.Path | str]) -> dict[str, str]:
        """Write the rootfs and podman's configuration; return podman's environment."""
        conf, storage, tmp = self.root / "conf", self.root / "storage", self.root / "tmp"
        for d in (conf, self.net_dir, self.data_dir, storage, tmp, self.root / "home"):
            d.mkdir()
        self._make_rootfs()
        (conf / "containers.conf").write_text(
            "[containers]\n"
            f"default_ulimits = {_toml_list(_ulimits())}\n"
            'log_driver = "k8s-file"\n'
            "[network]\n"
            'network_backend = "cni"\n'
            f"cni_plugin_dirs = {_toml_list(cni_plugin_dirs)}\n"
            f"network_config_dir = {json.dumps(str(self.net_dir))}\n"
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f"events_logfile_path = {json.dumps(str(tmp / 'events.log'))}\n"
            'lock_type = "file"\n'  # under tmp_dir, not the machine-wide /dev/shm/libpod_lock
            f"tmp_dir = {json.dumps(str(tmp))}\n"
            f"volume_path = {json.dumps(str(storage / 'volumes'))}\n"
            'pull_policy = "never"\n'
            # static_dir stays unset (<graphroot>/libpod): see the module docstring
        )
        (conf / "storage.conf").write_text(
            "[storage]\n"
            'driver = "vfs"\n'
            f"graphroot = {json.dumps(str(storage / 'graph'))}\n"
            f"runroot = {json.dumps(str(storage / 'run'))}\n"
        )
        (conf / "registries.conf").write_text("")
        # The node owner allows the test's veth masters (they have no RDMA device); every other
        # key is the built-in default, as for the DEL podman's cleanup runs without this env.
        policy = self.root / "node-policy.json"
        policy.write_text(json.dumps({"masters": nt.TEST_LINKS}))
        policy.chmod(0o600)
        # podman hands this environment on to conmon, to conmon's exit command and to the plugins.
        return {
            "RDMANET_NODE_POLICY": str(policy),
            "PATH": nt.BARE_PATH,
            "HOME": str(self.root / "home"),
            "TMPDIR": str(tmp),
            "CONTAINERS_CONF": str(conf / "containers.conf"),
            "CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"),
            "CONTAINERS_REGISTRIES_CONF": str(conf / "registries.conf"),
        }

    def _make_rootfs(self) -> None:
        """A busybox tree: bin/busybox (static) and a relative link per applet."""
        bin_dir = self.rootfs / "bin"
        bin_dir.mkdir(parents=True)
        for d in ("dev", "etc", "proc", "run", "sys", "tmp", "root"):
            (self.rootfs / d).mkdir()
        shutil.copy2(os.path.realpath(BUSYBOX), bin_dir / "busybox")
        applets = subprocess.run([str(bin_dir / "busybox"), "--list"], capture_output=True, text=True,
                                 check=True, timeout=30).stdout.split()
        for applet in applets:
            if applet != "busybox" and "/" not in applet:
                (bin_dir / applet).symlink_to("busybox")

    # ----------------------------------------------------------------------- commands

    def __call__(self, *args: str, timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([PODMAN, *args], capture_output=True, text=True, env=self.env,
                                  timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"podman {' '.join(args)} did not finish in {timeout} s: {exc.stderr!r}") from None

    def ok(self, *args: str, timeout: float = COMMAND_TIMEOUT) -> str:
        proc = self(*args, timeout=timeout)
        assert proc.returncode == 0, (f"podman {' '.join(args)} exited {proc.returncode}\n"
                                      f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
        return proc.stdout

    def run_args(self, *options: str, network: str) -> list[str]:
        """``run`` with every option *before* ``--rootfs <tree>`` (after it comes the command)."""
        return ["run", "--cgroup-parent", self.cgroup_parent, "--network", network, *options,
                "--rootfs", str(self.rootfs)]

    def inspect(self, name: str) -> dict:
        [doc] = json.loads(self.ok("container", "inspect", name))
        self.track(doc)
        return doc

    def track(self, doc: dict) -> None:
        """Remember what a container made on the host, so teardown can remove it whatever happens."""
        sandbox = (doc.get("NetworkSettings") or {}).get("SandboxKey") or ""
        if sandbox:
            self.sandboxes.add(sandbox)
        conmon = (doc.get("State") or {}).get("ConmonPid") or 0
        if conmon:
            self.conmon_pids.add(int(conmon))

    def write_network(self, conf: dict) -> None:
        self.networks.append(conf["name"])
        (self.net_dir / f"{conf['name']}.conflist").write_text(json.dumps(conf, indent=2))

    # ----------------------------------------------------------------------- teardown

    def cleanup(self) -> list[str]:
        """Remove every container, mount, netns, process, cgroup and file of this podman; return
        what had to be removed by force after ``podman rm`` (empty when podman cleaned up itself)."""
        forced: list[str] = []
        try:
            if (self.root / "storage" / "graph").exists():
                ids = self("ps", "-a", "-q", "--no-trunc").stdout.split()
                for cid in ids:
                    proc = self("container", "inspect", cid)
                    if proc.returncode == 0:
                        for doc in json.loads(proc.stdout or "[]"):
                            self.track(doc)
                if ids:
                    self("rm", "-a", "-f", "-t", "0")
        finally:
            try:
                forced += self._reap_conmons()
                forced += self._kill_cgroup_members()
                forced += self._unmount()
                forced += self._delete_sandboxes()
                forced += self._remove_cni_cache()
                self._remove_cgroups()
            finally:
                self.subreaper.restore()
                shutil.rmtree(self.root, ignore_errors=True)
                shutil.rmtree(self.data_dir, ignore_errors=True)
        return forced

    def _reap_conmons(self) -> list[str]:
        """Wait for (reap) the conmons podman left to us as their subreaper; kill one of ours that
        is still running after REAP_TIMEOUT (none should be once ``podman rm`` is done)."""
        forced = []
        deadline = time.monotonic() + REAP_TIMEOUT
        while True:
            pids = set(_conmon_children()) | {p for p in self.conmon_pids if _is_conmon(p)}
            for pid in list(pids):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        pids.discard(pid)
                except ChildProcessError:
                    pass  # not our child: left to its parent, below only killed if still running
            # A running conmon of this podman names our root in its arguments; any other is not ours.
            running = {p for p in pids if _is_conmon(p, running=True) and str(self.root).encode() in _cmdline(p)}
            if not running or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        for pid in sorted(running):
            os.kill(pid, signal.SIGKILL)
            forced.append(f"conmon pid {pid}")
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass
        return forced

    def _cgroup_dirs(self) -> list[pathlib.Path]:
        """Our cgroup parent in every hierarchy that has it (v1 controllers, named, unified)."""
        rel = self.cgroup_parent.lstrip("/")
        tops = [CGROUP_ROOT / rel, *(h / rel for h in CGROUP_ROOT.iterdir() if h.is_dir())]
        return [t for t in tops if t.is_dir()]

    def _kill_cgroup_members(self) -> list[str]:
        """SIGKILL every process left in our cgroup parent (a container's processes, a conmon
        that ``podman rm`` did not end) and reap those that were re-parented to us."""
        pids: set[int] = set()
        for top in self._cgroup_dirs():
            for dirpath, _dirs, _files in os.walk(top):
                try:
                    pids |= {int(p) for p in pathlib.Path(dirpath, "cgroup.procs").read_text().split()}
                except (OSError, ValueError):
                    pass
        forced = []
        for pid in sorted(pids):
            try:
                os.kill(pid, signal.SIGKILL)
                forced.append(f"pid {pid} ({(_stat(pid) or ('?',))[0]}) in cgroup {self.cgroup_parent}")
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + REAP_TIMEOUT
        while pids and time.monotonic() < deadline:
            for pid in list(pids):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        pids.discard(pid)
                except ChildProcessError:  # not our child (its parent reaps it) or already gone
                    if _stat(pid) is None or _stat(pid)[1] == "Z":
                        pids.discard(pid)
            time.sleep(0.02)
        return forced

    def _unmount(self) -> list[str]:
        prefix = str(self.root) + "/"
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4].encode().decode("unicode_escape") for line in f]
        forced = []
        for point in sorted({p for p in points if p.startswith(prefix)}, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30,
                           env={"PATH": nt.BARE_PATH})
            forced.append(f"mount {point}")
        return forced

    def _delete_sandboxes(self) -> list[str]:
        forced = []
        for sandbox in sorted(self.sandboxes):
            path = pathlib.Path(sandbox)
            if path.parent == pathlib.Path("/run/netns") and path.exists():
                nt.ip("netns", "del", path.name, check=False)
                forced.append(f"netns {path.name}")
        return forced

    def _remove_cni_cache(self) -> list[str]:
        forced = []
        for net in self.networks:
            for path in CNI_CACHE.glob(f"{net}-*"):
                path.unlink(missing_ok=True)
                forced.append(f"libcni cache {path}")
        return forced

    def _remove_cgroups(self) -> None:
        """Our cgroup parent in every hierarchy (podman leaves it and its conmon child behind)."""
        for top in self._cgroup_dirs():
            for dirpath, _dirs, _files in os.walk(top, topdown=False):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass


def _probe() -> str | None:
    """Why podman cannot run a trivial container here, else None."""
    world = Podman([nt.GO_PLUGIN_DIR])
    try:
        args = [*world.run_args("--rm", network="none"), "/bin/true"]
        try:
            proc = world(*args)
        except AssertionError as exc:
            return f"podman cannot run a container here: {exc}"
        if proc.returncode != 0:
            return (f"podman cannot run a container here: `podman {' '.join(args)}` exited {proc.returncode}: "
                    f"{proc.stderr.strip() or proc.stdout.strip()}")
        return None
    finally:
        world.cleanup()


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def podman_usable() -> None:
    """Skips (once per session) unless podman, runc and a static busybox can run a container."""
    reason = _missing() or _probe()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def podman(podman_usable: None, cni_bin: pathlib.Path) -> Iterator[Podman]:
    # Our shims first; /usr/lib/cni for any reference plugin podman may want.
    world = Podman([cni_bin, nt.GO_PLUGIN_DIR])
    try:
        yield world
    finally:
        forced = world.cleanup()
    assert not forced, f"podman left these behind after `podman rm` (now removed): {forced}"


@pytest.fixture
def network(podman: Podman, master) -> dict[str, Any]:
    """A ``macvlan-rdma`` + ``lease-ipam`` conflist (cniVersion 1.0.0) on a fresh veth master."""
    m = master()
    prefix, cidr = nt.random_subnet()
    name = f"{nt.PREFIX}-podman"
    plugin = nt.macvlan(m.name, nt.lease_ipam(podman.data_dir, cidr, gateway=f"{prefix}.1"),
                        mode="bridge", rdma="auto")  # a veth has no RDMA device: "auto" reports none
    podman.write_network(nt.conflist(name, "1.0.0", plugin))
    return {"name": name, "master": m, "prefix": prefix}


# --------------------------------------------------------------------------- helpers


def claims(podman: Podman, net: str) -> list[dict]:
    """lease-ipam's claims for ``net`` as the operator CLI lists them."""
    proc = subprocess.run([sys.executable, "-m", "rdmanet.cli", "ipam", "ls", "--data-dir", str(podman.data_dir),
                           "--network", net, "-o", "json"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, f"rdmanet ipam ls exited {proc.returncode}: {proc.stderr}"
    return [c for n in json.loads(proc.stdout)["networks"] for c in n["claims"]]


def wait_released(podman: Podman, timeout: float = RELEASE_TIMEOUT) -> dict[str, str]:
    """Poll the store until no reservation is left (or time runs out); the last view."""
    deadline = time.monotonic() + timeout
    while (owners := nt.owners(podman.data_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return owners


def inet_lines(text: str) -> dict[str, list[str]]:
    """{ifname: [cidr, ...]} of the IPv4 lines of busybox ``ip -o addr show``."""
    out: dict[str, list[str]] = {}
    for m in re.finditer(r"^\d+:\s+(\S+)\s+inet\s+(\S+)", text, re.MULTILINE):
        out.setdefault(m.group(1), []).append(m.group(2))
    return out


def macvlan_sandboxes(master_ifindex: int) -> set[str]:
    """Namespaces under /run/netns holding a macvlan whose lower device has ``master_ifindex``."""
    found = set()
    for path in pathlib.Path("/run/netns").glob("netns-*"):
        proc = nt.ip("-n", path.name, "-d", "-j", "link", "show", check=False)
        if proc.returncode != 0:
            continue
        for entry in json.loads(proc.stdout or "[]"):
            if entry.get("linkinfo", {}).get("info_kind") == "macvlan" and entry.get("link_index") == master_ifindex:
                found.add(path.name)
    return found


# --------------------------------------------------------------------------- tests


def test_run_rm_container_sees_its_address(podman, network):
    """``podman run --rm``: the container's own ``ip`` shows lease-ipam's address on a macvlan;
    when it exits, podman's cleanup runs DEL and nothing of the attachment is left."""
    net, prefix = network["name"], network["prefix"]
    master_index = nt.link(None, network["master"].name)["ifindex"]
    before = macvlan_sandboxes(master_index)

    out = podman.ok(*podman.run_args("--rm", network=net), "/bin/sh", "-c", "ip -o addr show; cat /proc/net/if_inet6")

    addrs = inet_lines(out).get(IFNAME, [])
    assert len(addrs) == 1, f"expected one IPv4 address on {IFNAME}:\n{out}"
    [cidr] = addrs
    assert cidr.startswith(f"{prefix}.") and cidr.endswith("/24"), out
    assert re.search(rf"^[0-9a-f]{{32}} .* {IFNAME}$", out, re.MULTILINE), f"{IFNAME} missing from /proc/net/if_inet6:\n{out}"

    assert wait_released(podman) == {}, "DEL did not release the lease"
    assert claims(podman, net) == []
    assert podman.ok("ps", "-a", "-q") == ""
    assert macvlan_sandboxes(master_index) == before
    assert list(CNI_CACHE.glob(f"{net}-*")) == []


def test_detached_container_address_and_del_on_exit(podman, network):
    """A long-running container: its address agrees inside (``podman exec``), on the host (its
    netns holds a macvlan of our master) and in the store. Then its process exits by itself
    (no podman command involved) and conmon's exit command (``podman container cleanup``) runs
    DEL: lease, macvlan, netns and libcni's cache entry are gone before the container is removed."""
    net, prefix, m = network["name"], network["prefix"], network["master"]
    name = f"{nt.PREFIX}-ctr"
    stop_file = podman.rootfs / "tmp" / "stop"  # the rootfs is a host directory: the test can write it
    # Runs until /tmp/stop appears; busybox sh as PID 1 ignores SIGTERM unless trapped.
    podman.ok(*podman.run_args("-d", "--name", name, network=net),
              "/bin/sh", "-c", "trap 'exit 0' TERM; while [ ! -e /tmp/stop ]; do sleep 0.1; done")
    doc = podman.inspect(name)
    cid, pid = doc["Id"], doc["State"]["Pid"]
    sandbox = doc["NetworkSettings"]["SandboxKey"]
    attached = doc["NetworkSettings"]["Networks"][net]
    addr, mac = attached["IPAddress"], attached["MacAddress"]
    assert addr.startswith(f"{prefix}.") and attached["IPPrefixLen"] == 24, attached
    assert attached["Gateway"] == f"{prefix}.1", attached

    # The store: one claim, for this container's eth0.
    [claim] = claims(podman, net)
    assert (claim["address"], claim["containerID"], claim["ifname"]) == (addr, cid, IFNAME), claim
    assert nt.owners(podman.data_dir) == {addr: cid}

    # Inside the container.
    inside = podman.ok("exec", name, "/bin/ip", "-o", "addr", "show", "dev", IFNAME)
    assert inet_lines(inside) == {IFNAME: [f"{addr}/24"]}, inside
    assert podman.ok("exec", name, "/bin/cat", f"/sys/class/net/{IFNAME}/address").strip() == mac

    # From the host: the sandbox is the container's netns, and eth0 there is our macvlan.
    assert pathlib.Path(sandbox).parent == pathlib.Path("/run/netns"), sandbox
    assert os.stat(sandbox).st_ino == os.stat(f"/proc/{pid}/ns/net").st_ino
    ns = pathlib.Path(sandbox).name
    link = nt.link(ns, IFNAME)
    assert link is not None and link["linkinfo"]["info_kind"] == "macvlan", link
    assert nt.macvlan_mode(link) == "bridge"
    assert link["link_index"] == nt.link(None, m.name)["ifindex"], "the macvlan's lower device is not our master"
    assert link["address"] == mac
    assert nt.addresses(ns, IFNAME) == [f"{addr}/24"]
    assert len(list(CNI_CACHE.glob(f"{net}-{cid}-*"))) == 1  # libcni cached the ADD result

    # The container's process exits by itself; podman (through conmon) runs DEL.
    stop_file.touch()
    assert wait_released(podman) == {}, "DEL did not release the lease after the container exited"
    assert podman.ok("wait", name).strip() == "0"
    assert claims(podman, net) == []
    assert not os.path.exists(sandbox), f"{sandbox} is left after the container exited"
    assert list(CNI_CACHE.glob(f"{net}-*")) == []
    assert json.loads(podman.ok("container", "inspect", name))[0]["State"]["Status"] == "exited"

    podman.ok("rm", name)
    assert podman.ok("ps", "-a", "-q") == ""
    assert nt.owners(podman.data_dir) == {}
