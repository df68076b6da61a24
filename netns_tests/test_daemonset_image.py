"""The rdmanet image, built from deploy/Containerfile and run the way deploy/daemonset.yaml runs it.

What a cluster operator does, on one machine, with nothing pulled from a container registry:

* **The base.** ``debian:bookworm-slim`` is made here with ``mmdebstrap`` (minbase, merged /usr,
  the slim image's dpkg path excludes) from Debian's packages, through this machine's own apt
  sources, and ``podman import``-ed under that name. The tarball is cached between runs in
  ``/var/cache/rdmanet-tests/`` (``RDMANET_TEST_IMAGE_CACHE``; rebuilt after a week, so security
  updates come in), under a lock, so concurrent sessions build it once.
* **The build.** ``podman build`` with the real ``deploy/Containerfile`` and the build context of
  this checkout. pip in the build reaches the package index the way this machine's pip does:
  its configured CA bundle (``pip config`` / ``PIP_CERT``) and index (``index-url`` /
  ``PIP_INDEX_URL``, when one is set) are handed over as the build secrets ``pip_ca`` and
  ``pip_index_url`` the Containerfile documents. Nothing of that may end up in the image.
* **The node.** A private mount namespace (a slave of the machine's, so nothing mounted in it
  leaks out) and PID namespace, whose PID 1 is a small reaper: every hostPath of the manifest
  (``/opt/cni/bin``, ``/etc/cni/net.d``, ``/var/lib/cni``, ``/run/rdmanet``, ``/var/run/netns``,
  the device-info dir) is a private directory bind-mounted there, so the machine's real
  ``/opt/cni/bin`` and ``/etc/cni/net.d`` are never touched. The pod's ``hostPID`` is that PID
  namespace, so ``/proc/1/root`` (install.sh's ``--host-root``) is this node's root.
* **The pod.** ``podman run`` with what deploy/daemonset.yaml says, read from the file itself:
  privileged, host network and PID, every volumeMount with its hostPath and mount propagation,
  command, args, env (``fieldRef`` ``spec.nodeName`` and ``status.podIP`` resolved as the kubelet does), the memory
  limit, the termination grace period, the ServiceAccount mounted read-only (a token the fake
  API server requires, its CA) and ``KUBERNETES_SERVICE_HOST``/``PORT`` pointing at a fake API
  server on TLS (tests/kube_api_server.py). Readiness is the manifest's readinessProbe, run with
  ``podman exec``.

Then a pod attach through the node's shims with the project's cnitool (libcni) client, run in the
node's namespace: ADD/CHECK/DEL of macvlan-rdma + lease-ipam on the Kubernetes store (the Lease
is created with this node's name and deleted); the container stopped (the shims answer 11, the
Lease stays); started again (the pending DEL succeeds); the uninstall README gives, run in the pod
(shims and kubeconfig removed, and nothing comes back while the pod runs on).

Cost: the first run on a machine spends ~1.5 min on mmdebstrap; every run spends ~2.5 min on
``podman build`` (vfs storage, fresh each session: the build itself is under test) and ~30 s on
the pod. scripts/test.sh runs this module once (not again in its daemon-mode pass: the image
always serves through its own daemon).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from rdmanet.node import launcher

try:
    from netns_tests import cnitool_client as cc
    from netns_tests import nstools as nt
    from netns_tests.test_podman import Podman
    from netns_tests.test_podman import _missing as podman_missing
except ImportError:  # pragma: no cover
    import cnitool_client as cc  # type: ignore[no-redef]
    import nstools as nt  # type: ignore[no-redef]
    from test_podman import Podman  # type: ignore[no-redef]
    from test_podman import _missing as podman_missing  # type: ignore[no-redef]

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from kube_api_server import KubeAPIServer  # noqa: E402
from test_install_script import json_lines  # noqa: E402  (every line one JSON object, or the line is shown)

MANIFEST = REPO / "deploy" / "daemonset.yaml"
CONTAINERFILE = REPO / "deploy" / "Containerfile"
LOCK = REPO / "deploy" / "requirements.lock"
CACHE = pathlib.Path(os.environ.get("RDMANET_TEST_IMAGE_CACHE", "/var/cache/rdmanet-tests"))
BASE_NAME = "debian:bookworm-slim"  # what the Containerfile's BASE_IMAGE defaults to
BASE_MAX_AGE = 7 * 24 * 3600
SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"  # where the kubelet mounts the token
NAMESPACE_OF_SA = "rdmanet-system"
PLUGINS = tuple(sorted(launcher.PLUGINS))  # the shims install.sh writes
DAEMONSET_PHRASE = "is the rdmanet DaemonSet pod running on this node?"
REFRESH_SECONDS = "1"  # RDMANET_KUBECONFIG_REFRESH_SECONDS for the pod: rounds every second
BUILD_TIMEOUT = 1200
MMDEBSTRAP = shutil.which("mmdebstrap", path=nt.BARE_PATH)
HINT = "apt-get install mmdebstrap podman runc busybox-static util-linux openssl, as scripts/test.sh does"

# The slim variant's dpkg excludes (as Debian's own debian:*-slim images are made).
SLIM_EXCLUDES = ("path-exclude=/usr/share/man/*", "path-exclude=/usr/share/doc/*",
                 "path-include=/usr/share/doc/*/copyright", "path-exclude=/usr/share/info/*",
                 "path-exclude=/usr/share/locale/*", "path-include=/usr/share/locale/locale.alias",
                 "path-exclude=/usr/share/groff/*", "path-exclude=/usr/share/linda/*",
                 "path-exclude=/usr/share/lintian/*")


# --------------------------------------------------------------------------- prerequisites


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "builds and runs a privileged container: run as root"
    reason = podman_missing()
    if reason:
        return reason
    for tool in ("unshare", "nsenter", "openssl"):
        if shutil.which(tool, path=nt.BARE_PATH) is None:
            return f"{tool} is not installed: {HINT}"
    if MMDEBSTRAP is None:
        return f"mmdebstrap is not installed: {HINT}"
    if not _apt_sources():
        return "no Debian bookworm apt source on this machine for mmdebstrap to make the base from"
    return None


def _apt_sources() -> list[str]:
    """This machine's Debian bookworm apt sources (deb822 files or one-line lists): the base is made
    from Debian's packages the way this machine reaches them."""
    out = []
    for path in sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*.sources")):
        text = path.read_text(errors="replace")
        if re.search(r"^Suites:.*\bbookworm\b", text, re.MULTILINE) and "debian-archive-keyring" in text:
            out.append(str(path))
    for path in [pathlib.Path("/etc/apt/sources.list"), *sorted(pathlib.Path("/etc/apt/sources.list.d").glob("*.list"))]:
        if path.is_file():
            out += [line.strip() for line in path.read_text(errors="replace").splitlines()
                    if re.match(r"^deb\s+\S+\s+bookworm", line.strip())]
    return out


def pip_settings() -> dict[str, str]:
    """The CA bundle and index this machine's pip uses (``pip config list`` with its environment,
    which overrides the files), as pip itself resolves them: the last value listed wins."""
    proc = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          timeout=60, check=False)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^(\S+)\.(cert|index-url)='(.*)'$", line.strip())
        if m:
            found[m.group(2)] = m.group(3)
    found.update({k: os.environ[v] for k, v in (("cert", "PIP_CERT"), ("index-url", "PIP_INDEX_URL")) if os.environ.get(v)})
    return found


# --------------------------------------------------------------------------- the base image


def base_tarball() -> pathlib.Path:
    """debian:bookworm-slim as a tarball made with mmdebstrap; cached, rebuilt once a week."""
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    options = ["--mode=root", "--variant=minbase", "--format=tar",
               "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr", *(f"--dpkgopt={x}" for x in SLIM_EXCLUDES)]
    sources = _apt_sources()
    key = hashlib.sha256(json.dumps([options, [pathlib.Path(s).read_text() if s.startswith("/") else s
                                               for s in sources]]).encode()).hexdigest()[:12]
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / f"debian-bookworm-slim-{arch}-{key}.tar"
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be making it right now
        if target.is_file() and time.time() - target.stat().st_mtime < BASE_MAX_AGE:
            return target
        partial = target.with_suffix(f".{os.getpid()}.tmp")
        try:
            proc = subprocess.run([MMDEBSTRAP, *options, "bookworm", str(partial), *sources], capture_output=True,
                                  text=True, timeout=900, check=False, env={"PATH": nt.BARE_PATH})
            assert proc.returncode == 0, f"mmdebstrap failed:\n{proc.stderr[-4000:]}"
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        for old in CACHE.glob(f"debian-bookworm-slim-{arch}-*.tar"):
            if old != target:
                old.unlink(missing_ok=True)
    return target


# --------------------------------------------------------------------------- the node


HIDEABLE = {"/opt", "/run"}  # top-level dirs a node may have private wholesale (see Node._mount_points)

REAPER = """
import os, signal, time
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.2)
"""


class Node:
    """A private mount + PID namespace standing in for a Kubernetes node (see the module docstring).

    ``root`` holds the node's private directories, mirrored by path (``root/opt/cni/bin`` is the
    node's ``/opt/cni/bin``): this process reads them there, the node's processes at their paths."""

    def __init__(self, host_paths: list[str]) -> None:
        self.root = pathlib.Path(tempfile.mkdtemp(prefix=f"{nt.PREFIX}-node-"))
        self.unshare = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "slave", "--pid", "--fork", "--mount-proc", "--",
             "/usr/bin/python3", "-I", "-S", "-c", REAPER], start_new_session=True, env={"PATH": nt.BARE_PATH})
        self.pid = self._init_pid()
        self.wrap = ["nsenter", "-t", str(self.pid), "-m", "-p", "--"]
        self.netns: list[str] = []
        for path in self._mount_points(host_paths):
            (self.root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
            self.sh(f'mount --bind {self.path(path)} {path}')
        for path in host_paths:
            self.path(path).mkdir(parents=True, exist_ok=True)  # hostPath type DirectoryOrCreate
        # /run/netns a shared mount point before the pod starts, as on a node that runs pods: the
        # pod's HostToContainer mount then receives the netns bind mounts made later.
        self.sh("mkdir -p /run/netns && mount --bind /run/netns /run/netns && mount --make-shared /run/netns")

    def _init_pid(self) -> int:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for task in pathlib.Path(f"/proc/{self.unshare.pid}/task").glob("*"):
                children = (task / "children").read_text().split() if (task / "children").exists() else []
                if children and os.readlink(f"/proc/{children[0]}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
                    return int(children[0])
            time.sleep(0.02)
        raise AssertionError("the node namespace did not come up")

    @staticmethod
    def _mount_points(host_paths: list[str]) -> list[str]:
        """Where to bind a private directory so every host path is one: the path itself when it
        exists here, else its nearest existing ancestor (whose private twin then holds it), as
        long as hiding that ancestor in the node is harmless (/opt, /run). Under any other
        ancestor (/etc, /var/lib: podman in the node needs them) the missing directory is made
        on the machine, empty, as the kubelet would (DirectoryOrCreate), and bound over."""
        points: list[str] = []
        for path in sorted(os.path.realpath(p) for p in host_paths):
            if any(path == p or path.startswith(p + "/") for p in points):
                continue
            point = path
            while not os.path.isdir(point):
                point = os.path.dirname(point)
            if point != path and point not in HIDEABLE:
                os.makedirs(path, exist_ok=True)
                point = path
            points = [p for p in points if not p.startswith(point + "/")] + [point]
        return points

    def path(self, node_path: str) -> pathlib.Path:
        """This process's path of the node's ``node_path``."""
        return self.root / os.path.realpath(node_path).lstrip("/")

    def sh(self, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*self.wrap, "sh", "-c", script], capture_output=True, text=True, timeout=60,
                              env={"PATH": nt.BARE_PATH})
        assert not check or proc.returncode == 0, f"{script}: {proc.stderr}"
        return proc

    def add_netns(self, name: str) -> str:
        self.sh(f"ip netns add {name} && ip -n {name} link set lo up")
        self.netns.append(name)
        return f"/var/run/netns/{name}"

    def cleanup(self) -> None:
        for name in self.netns:
            self.sh(f"ip netns del {name}", check=False)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)  # PID 1 of the namespace: the kernel kills the rest
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.unshare.pid, signal.SIGKILL)
        self.unshare.wait(30)
        shutil.rmtree(self.root, ignore_errors=True)


# --------------------------------------------------------------------------- podman


class NodePodman(Podman):
    """test_podman's isolated podman (private config, storage, cgroup parent, teardown), whose
    commands run in a node's namespaces once :attr:`wrap` is set."""

    wrap: list[str] = []

    def __init__(self, cni_plugin_dirs: list) -> None:
        super().__init__(cni_plugin_dirs)
        # overlay where the kernel has it: a container of a 240 MB image starts in a second, where
        # vfs (test_podman's choice, enough for a busybox tree) copies the whole image each time
        if "\toverlay\n" in pathlib.Path("/proc/filesystems").read_text():
            conf = pathlib.Path(self.env["CONTAINERS_STORAGE_CONF"])
            conf.write_text(conf.read_text().replace('driver = "vfs"', 'driver = "overlay"'))

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([*self.wrap, "podman", *args], capture_output=True, text=True, env=self.env,
                                  timeout=timeout, check=False, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"podman {' '.join(args)} did not finish in {timeout} s: {exc.stderr!r}") from None


@pytest.fixture(scope="module")
def image() -> Iterator[tuple[NodePodman, str, dict]]:
    """The image, built once per module: (podman, its name, facts about the build)."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    world = NodePodman([nt.GO_PLUGIN_DIR])
    try:
        started = time.monotonic()
        tarball = base_tarball()
        world.ok("import", tarball.as_posix(), BASE_NAME)
        base_seconds = time.monotonic() - started
        secrets_dir = world.root / "secrets"
        secrets_dir.mkdir()
        build = ["build", "--network", "host", "--cgroup-parent", world.cgroup_parent, "-f", str(CONTAINERFILE)]
        pip = pip_settings()
        if pip.get("cert"):
            build += ["--secret", f"id=pip_ca,src={pip['cert']}"]
        if pip.get("index-url", "").startswith(("http://", "https://")):  # a file:// index is not in the build
            (secrets_dir / "index-url").write_text(pip["index-url"] + "\n")
            build += ["--secret", f"id=pip_index_url,src={secrets_dir / 'index-url'}"]
        name = f"localhost/rdmanet-test:{nt.PREFIX}"
        started = time.monotonic()
        world.ok(*build, "-t", name, str(REPO), timeout=BUILD_TIMEOUT)
        facts = {"base_seconds": base_seconds, "build_seconds": time.monotonic() - started, "pip": pip}
        print(f"\nimage {name}: base {base_seconds:.0f} s, build {facts['build_seconds']:.0f} s")
        yield world, name, facts
    finally:
        forced = world.cleanup()
    assert not forced, f"podman left these behind after `podman rm` (now removed): {forced}"


# --------------------------------------------------------------------------- the manifest


def daemonset() -> dict:
    [doc] = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d.get("kind") == "DaemonSet"]
    return doc


def quantity_bytes(q: str) -> int:
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", q)
    assert m, f"memory quantity {q!r} not understood by this test"
    return int(m.group(1)) * {None: 1, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}[m.group(2)]


def host_paths(ds: dict) -> list[str]:
    """The hostPaths the kubelet makes (type DirectoryOrCreate): the node's private directories."""
    return [v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]
            if "hostPath" in v and v["hostPath"].get("type") == "DirectoryOrCreate"]


def pod_run_args(ds: dict, *, name: str, image: str, node_name: str, sa_dir: pathlib.Path,
                 service: tuple[str, int], cgroup_parent: str, extra_env: dict[str, str]) -> list[str]:
    """``podman run`` options that do what the kubelet does with this DaemonSet's pod."""
    spec = ds["spec"]["template"]["spec"]
    [c] = spec["containers"]
    args = ["run", "-d", "--name", name, "--cgroup-parent", cgroup_parent, "--log-driver", "k8s-file"]
    args += ["--network", "host"] if spec.get("hostNetwork") else []
    args += ["--pid", "host"] if spec.get("hostPID") else []
    args += ["--privileged"] if c.get("securityContext", {}).get("privileged") else []
    if "memory" in c.get("resources", {}).get("limits", {}):
        args += ["--memory", str(quantity_bytes(c["resources"]["limits"]["memory"]))]
    args += ["--stop-timeout", str(spec.get("terminationGracePeriodSeconds", 30))]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for m in c["volumeMounts"]:
        source = volumes[m["name"]]["hostPath"]["path"]
        options = [o for o in ("ro" if m.get("readOnly") else "",
                               {"HostToContainer": "rslave", "Bidirectional": "rshared"}.get(m.get("mountPropagation", ""), ""))
                   if o]
        args += ["-v", f"{source}:{m['mountPath']}" + (":" + ",".join(options) if options else "")]
    if spec.get("automountServiceAccountToken", True):
        args += ["-v", f"{sa_dir}:{SA_MOUNT}:ro"]
    env = {"KUBERNETES_SERVICE_HOST": service[0], "KUBERNETES_SERVICE_PORT": str(service[1])}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            # the kubelet's values: the node's name; the pod's IP, with hostNetwork the node's (here: loopback)
            known = {"spec.nodeName": node_name, "status.podIP": "127.0.0.1"}
            assert field in known, f"env {e['name']}: fieldRef {field} not known to this test"
            env[e["name"]] = known[field]
    env.update(extra_env)
    for k, v in env.items():
        args += ["-e", f"{k}={v}"]
    args += ["--entrypoint", json.dumps(c["command"]), image, *c.get("args", [])]
    return args


def probe(ds: dict, kind: str) -> list[str]:
    return ds["spec"]["template"]["spec"]["containers"][0][kind]["exec"]["command"]


# --------------------------------------------------------------------------- helpers


def pod_log(world: NodePodman, name: str) -> str:
    proc = world("logs", name)
    return proc.stdout + proc.stderr


def wait_ready(world: NodePodman, name: str, ds: dict, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        proc = world("exec", name, *probe(ds, "readinessProbe"))
        if proc.returncode == 0:
            return
        state = json.loads(world.ok("container", "inspect", name))[0]["State"]
        if not state.get("Running") or time.monotonic() > deadline:
            raise AssertionError(f"the pod is not ready ({state.get('Status')}): {proc.stdout}{proc.stderr}\n"
                                 f"{pod_log(world, name)}")
        time.sleep(0.5)


def tree(path: pathlib.Path) -> dict[str, Any]:
    """Names, modes and contents under ``path`` (None when it does not exist)."""
    if not path.exists():
        return {}
    return {str(p): (p.lstat().st_mode, p.read_bytes() if p.is_file() else None) for p in sorted([path, *path.rglob("*")])}


def self_signed(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    cert, key = directory / "apiserver.crt", directory / "apiserver.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=kube-apiserver",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:TRUE"],
                   capture_output=True, check=True, timeout=60)
    return cert, key


def leases(kube: KubeAPIServer) -> list[dict]:
    """The claim Leases (one per held address): a block's record whose address is free (no holder,
    labelled rdmanet.io/block-owner) and a first-design block Lease (rdmanet.io/kind=block) are not claims."""
    def labels(o: dict) -> dict:
        return (o.get("metadata") or {}).get("labels") or {}

    return [o for o in kube.objects("leases", NAMESPACE_OF_SA) if labels(o).get("rdmanet.io/kind") != "block"
            and (not labels(o).get("rdmanet.io/block-owner") or (o.get("spec") or {}).get("holderIdentity"))]


# --------------------------------------------------------------------------- tests


def test_the_image_holds_the_locked_venv_and_no_build_inputs(image):
    """No pip, no setuptools, no source tree; the dependencies are the lock's, exactly; no build
    secret in any file of the image."""
    world, name, facts = image

    def run(*cmd: str) -> subprocess.CompletedProcess[str]:
        return world("run", "--rm", "--network", "none", "--cgroup-parent", world.cgroup_parent,
                     "--entrypoint", cmd[0], name, *cmd[1:])

    script = ("for py in /opt/rdmanet/bin/python /usr/bin/python3; do for m in pip setuptools ensurepip; do "
              "$py -c \"import $m\" 2>/dev/null && echo $py:$m; done; done; echo ---; "
              "ls -A /usr/src /usr/src/rdmanet; echo ---; ls -A /run/secrets 2>/dev/null; echo ---; "
              "rdmanet version -o json; echo ---; /opt/rdmanet/bin/python -c 'import kubernetes.client, "
              "kubernetes.config, kubernetes.watch, pyroute2, pydantic, rdmanet.node.daemon, rdmanet.ipam.store.kube' && echo imports ok")
    proc = run("/bin/sh", "-c", script)
    importable, listing, secrets, version, imports = proc.stdout.split("---\n")
    assert importable == "", f"pip/setuptools in the image: {importable}"
    assert listing.split() == ["/usr/src:", "rdmanet", "/usr/src/rdmanet:", "install.sh"], listing
    assert secrets == "", secrets
    pins = dict(re.findall(r"^([A-Za-z0-9._-]+)==(\S+) ", LOCK.read_text(), re.MULTILINE))
    pins = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins.items()}
    assert json.loads(version)["dependencies"] == pins
    assert imports == "imports ok\n", proc.stderr

    # no file of the image is the CA bundle the build was handed (nor holds the index URL)
    cid = world.ok("create", "--cgroup-parent", world.cgroup_parent, name).strip()
    export = world.root / "export.tar"
    world.ok("export", "-o", str(export), cid)
    world.ok("rm", cid)
    secret_sums = set()
    if facts["pip"].get("cert"):
        secret_sums.add(hashlib.sha256(pathlib.Path(facts["pip"]["cert"]).read_bytes()).hexdigest())
    index = facts["pip"].get("index-url", "").encode()
    with tarfile.open(export) as tar:
        for member in tar:
            if member.isfile():
                data = tar.extractfile(member).read()
                assert hashlib.sha256(data).hexdigest() not in secret_sums, f"{member.name} is the build's CA secret"
                assert not (index.startswith(b"http") and index in data), f"{member.name} holds the index URL"
    export.unlink()
    history = world.ok("history", "--no-trunc", name)
    assert "secrets" not in history and "pip_ca" not in history

    size = json.loads(world.ok("image", "inspect", name))[0]["Size"]
    print(f"image size {size / 1e6:.0f} MB")
    assert size < 280e6, f"the image is {size / 1e6:.0f} MB; README states ~240 MB"


def test_daemonset_pod_serves_a_pod_attach_stops_restarts_and_uninstalls(image, master, cnitool, tmp_path):
    world, name, _ = image
    ds = daemonset()
    real_dirs = {d: tree(pathlib.Path(d)) for d in ("/opt/cni/bin", "/etc/cni/net.d")}
    node = Node(host_paths(ds))
    world.wrap = node.wrap
    kube = None
    pod = f"{nt.PREFIX}-ds"
    try:
        # the API server the pod's ServiceAccount belongs to: TLS, a token it requires
        token = "eyJhbGciOiJSUzI1NiJ9." + os.urandom(40).hex() + "." + os.urandom(20).hex()
        cert, key = self_signed(tmp_path)
        kube = KubeAPIServer(token=token, tls=(str(cert), str(key)))
        sa = tmp_path / "serviceaccount"
        sa.mkdir()
        (sa / "token").write_text(token)
        (sa / "ca.crt").write_bytes(cert.read_bytes())
        (sa / "namespace").write_text(NAMESPACE_OF_SA)
        node_name = f"{nt.PREFIX}-node"
        run = pod_run_args(ds, name=pod, image=name, node_name=node_name, sa_dir=sa, service=("127.0.0.1", kube.port),
                           cgroup_parent=world.cgroup_parent, extra_env={"RDMANET_KUBECONFIG_REFRESH_SECONDS": REFRESH_SECONDS})
        world.ok(*run)
        wait_ready(world, pod, ds)

        # the node: the shims under the node's python, the kubeconfig for this ServiceAccount
        args = dict(zip(ds["spec"]["template"]["spec"]["containers"][0]["args"][::2],
                        ds["spec"]["template"]["spec"]["containers"][0]["args"][1::2]))
        bin_dir, conf_dir, socket_path = (node.path(args[k]) for k in ("--bin-dir", "--conf-dir", "--socket"))
        # each shim and its hot path compiled by the node's python3 (install.sh's VERSION check: rdmanet/node/boot.py)
        assert sorted(os.listdir(bin_dir)) == sorted([*PLUGINS, *(f".{p}.code" for p in PLUGINS)])
        for plugin in PLUGINS:
            assert (bin_dir / plugin).read_text().startswith(f"#!{args['--host-python']} -IS\n")
        kubeconfig = conf_dir / "rdmanet.d" / "rdmanet.kubeconfig"
        assert kubeconfig.stat().st_mode & 0o777 == 0o600 and token in kubeconfig.read_text()
        assert f'"https://127.0.0.1:{kube.port}"' in kubeconfig.read_text()
        assert socket_path.exists()
        log = json_lines(pod_log(world, pod))
        assert [d["event"] for d in log if d["event"] == "installed"] == ["installed"] * len(PLUGINS)
        assert token not in pod_log(world, pod)

        # a pod attach through the node's shims, as the runtime does it (libcni, in the node)
        prefix, cidr = nt.random_subnet()
        m = master()
        netconf = tmp_path / "net.d"
        netconf.mkdir()
        # the kubeconfig install.sh wrote, by its node path, as every example NAD names it
        ipam = {"type": "lease-ipam", "range": cidr,
                "kubernetes": {"kubeconfig": f"{args['--conf-dir']}/rdmanet.d/rdmanet.kubeconfig"}}
        net = f"{nt.PREFIX}-dsnet"
        (netconf / f"{net}.conflist").write_text(json.dumps(nt.conflist(net, "1.0.0", nt.macvlan(m.name, ipam, mode="bridge", rdma="auto"))))
        cache = tmp_path / "cache"
        # the test's master is a veth without an RDMA device: the node owner allows it, in a policy
        # file the runtime names (in the node's CNI conf dir, which the pod mounts at the same path)
        policy = conf_dir / f"{nt.PREFIX}-node-policy.json"
        policy.write_text(json.dumps({"masters": [{"name": m.name}]}))
        policy.chmod(0o600)
        runtime_env = {"RDMANET_NODE_POLICY": f"{args['--conf-dir']}/{policy.name}"}

        def tool(verb: str, netns: str) -> subprocess.CompletedProcess[str]:
            return cc.run(cnitool, verb, net, netns, ifname="net1", netconfpath=netconf, cni_path=[args["--bin-dir"]],
                          cache_dir=cache, wrap=node.wrap, extra_env=runtime_env)

        first = node.add_netns(f"{nt.PREFIX}-p1")
        add = tool("add", first)
        assert add.returncode == 0, add.stdout + add.stderr + pod_log(world, pod)
        [ip] = json.loads(add.stdout)["ips"]
        assert ip["address"].startswith(f"{prefix}.") and ip["address"].endswith("/24"), add.stdout
        [lease] = leases(kube)
        assert lease["spec"]["holderIdentity"] == f"{cc.container_id(first)}/net1"
        assert lease["metadata"]["labels"]["rdmanet.io/node"] == node_name  # the manifest's fieldRef env
        inside = node.sh(f"ip -n {nt.PREFIX}-p1 -j -d addr show dev net1").stdout
        [link] = json.loads(inside)
        assert link["linkinfo"]["info_kind"] == "macvlan" and ip["address"].split("/")[0] in inside
        check = tool("check", first)
        assert check.returncode == 0, check.stdout + check.stderr
        delete = tool("del", first)
        assert delete.returncode == 0, delete.stdout + delete.stderr
        assert leases(kube) == []
        assert "net1" not in node.sh(f"ip -n {nt.PREFIX}-p1 -o link").stdout

        # the pod stopped (SIGTERM, the manifest's grace): the shims answer 11, nothing changes
        second = node.add_netns(f"{nt.PREFIX}-p2")
        add = tool("add", second)
        assert add.returncode == 0, add.stdout + add.stderr
        [held] = leases(kube)
        world.ok("stop", pod, timeout=120)
        assert json.loads(world.ok("container", "inspect", pod))[0]["State"]["ExitCode"] == 0
        assert not socket_path.exists()
        for verb in ("del", "check"):
            proc = tool(verb, second)
            err = cc.error_of(proc)
            assert proc.returncode == 1 and err and err["code"] == 11 and DAEMONSET_PHRASE in err["msg"], proc.stdout
        assert leases(kube) == [held]
        assert "net1" in node.sh(f"ip -n {nt.PREFIX}-p2 -o link").stdout

        # started again (a new pod on the node): the pending DEL goes through
        world.ok("start", pod)
        wait_ready(world, pod, ds)
        delete = tool("del", second)
        assert delete.returncode == 0, delete.stdout + delete.stderr
        assert leases(kube) == []
        assert "net1" not in node.sh(f"ip -n {nt.PREFIX}-p2 -o link").stdout

        # the uninstall README gives, in the running pod: shims and kubeconfig go, and stay gone
        proc = world("exec", pod, "/usr/src/rdmanet/install.sh", "--daemonset", "--uninstall")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json_lines(proc.stdout)[-1]["event"] == "uninstalled" and proc.stderr == ""
        assert os.listdir(bin_dir) == [] and not (conf_dir / "rdmanet.d").exists()
        (sa / "token").write_text(token + "x")  # a rotation the refresh loop would have written
        time.sleep(3 * float(REFRESH_SECONDS) + 1)
        assert os.listdir(bin_dir) == [] and not (conf_dir / "rdmanet.d").exists(), pod_log(world, pod)

        # every line the pod printed, over both runs, is one JSON object
        events = [d["event"] for d in json_lines(pod_log(world, pod))]
        assert events.count("daemon_starting") == 2 and "kubeconfig_refresh_stopped" in events, events
        world.ok("stop", pod, timeout=120)
        world.ok("rm", pod)
    finally:
        if kube is not None:
            kube.stop()
        with contextlib.suppress(AssertionError):
            world("rm", "-f", "-t", "0", pod)
        world.wrap = []
        node.cleanup()
    # the machine's own CNI dirs were never touched
    assert {d: tree(pathlib.Path(d)) for d in real_dirs} == real_dirs
