"""The node daemon dies during a burst of pod starts (SIGKILL: OOM, an eviction; SIGTERM: a
rolling upgrade), with macvlan-rdma + lease-ipam (local store) through the shims (root), and
with host-device-rdma (one veth "device" per pod, its peer in a netns the test owns, so a device
lost in a temporary netns shows as a missing device).

What a runtime sees and does: each ADD either succeeds, with its link and address really in the
pod, or fails with CNI error 11 (try again later), never with a half-done success. A failed ADD
is followed by the runtime's DEL; a successful one is DELed later. After the DELs (in-process
for a shim with a fallback, through a restarted daemon for a daemon-only shim) no pod netns
holds anything but lo, and the store holds no reservation; nothing an ADD granted was lost from
the store before its DEL. host-device-rdma: every device is back in the host with its name, MAC,
MTU and alias, and no state file, allocation record or netns mounted under the state dir is left.

Seeded like test_kill_at_random (``RDMANET_KILL_SEED`` replays the kill instants).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import secrets
import shutil
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor

import pytest

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]

try:
    from netns_tests.test_host_device_rdma import ORIGINAL_MAC, assert_restored, nothing_recorded
except ImportError:  # pragma: no cover
    from test_host_device_rdma import ORIGINAL_MAC, assert_restored, nothing_recorded  # type: ignore[no-redef]

from rdmanet.node.launcher import write_shim
from rdmanet.node.testing import Daemon

SEED = int(os.environ.get("RDMANET_KILL_SEED") or secrets.randbits(32))
BURST = 12

pytestmark = pytest.mark.skipif(nt.lease_ipam_missing() is not None, reason=str(nt.lease_ipam_missing()))


@pytest.fixture
def node():
    """A private bin dir with the three shims, either kind, and the daemon socket path."""
    root = pathlib.Path(tempfile.mkdtemp(prefix=f"{nt.PREFIX}-node-"))
    daemons: list[Daemon] = []

    def shims(fallback: bool) -> pathlib.Path:
        import sys
        import sysconfig

        from rdmanet.node.launcher import PLUGINS

        for name in PLUGINS:
            write_shim(str(root / "bin" / name), name, sys.executable,
                       sysconfig.get_path("purelib") if fallback else None, str(root / "run" / "daemon.sock"))
        return root

    def start() -> Daemon:
        daemons.append(Daemon(str(root / "run" / "daemon.sock")))
        return daemons[-1]

    (root / "bin").mkdir()
    nt.node_policy_env(root)  # the node policy the calls name (rdmanet.cni.linux.roots): the store under root
    try:
        yield shims, start
    finally:
        for d in daemons:
            if d.proc.poll() is None:
                d.proc.kill()
            d.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def _conf(master: str, data_dir: pathlib.Path, prefix: str) -> dict:
    return nt.single("killnet", "1.0.0", nt.macvlan(master, nt.lease_ipam(data_dir, f"{prefix}.0/24", gateway=f"{prefix}.1")))


def _run(root: pathlib.Path, command: str, stdin: dict, ns, cid: str, plugin: str = nt.PLUGIN):
    return nt.raw_exec(root / "bin" / plugin, command, stdin, netns=ns.path, container_id=cid,
                       cni_path=[root / "bin"], timeout=120, extra_env={"RDMANET_NODE_POLICY": str(root / "node-policy.json")})


def _burst_with_daemon_dying(root, start, stdin, namespaces, how: str, rng: random.Random):
    """BURST concurrent ADDs; the daemon gets ``how`` after a random instant within the burst."""
    daemon = start()
    delay = rng.uniform(0.0, 0.4)
    with ThreadPoolExecutor(len(namespaces)) as pool:
        futures = [pool.submit(_run, root, "ADD", stdin, ns, f"cid-{i}") for i, ns in enumerate(namespaces)]
        time.sleep(delay)
        if how == "SIGKILL":
            daemon.proc.kill()
        else:
            daemon.terminate()
        adds = [f.result() for f in futures]
    daemon.proc.wait(timeout=60)
    return adds, delay


def _check_outcomes(adds, namespaces, data_dir: pathlib.Path, where: str) -> list[int]:
    """Every ADD succeeded for real or answered 11; the indexes of the successful ones."""
    granted = []
    owners = nt.owners(data_dir)
    for i, (proc, ns) in enumerate(zip(adds, namespaces)):
        nt.no_traceback(proc)
        if proc.returncode == 0:
            result = json.loads(proc.stdout)
            address = result["ips"][0]["address"]
            assert nt.addresses(ns.name, "net1") == [address], f"{where}: ADD {i} succeeded without its address"
            assert owners.get(nt.bare_ip(address)) == f"cid-{i}", f"{where}: ADD {i}'s address is not in the store"
            granted.append(i)
        else:
            err = nt.cni_error(proc)
            assert err["code"] == 11, f"{where}: ADD {i} answered {err} (expected success or 11)"
    print(f"{where}: {len(granted)} of {len(adds)} ADDs succeeded, the rest answered 11")
    return granted


def _del_all(root, stdin, namespaces, data_dir: pathlib.Path, where: str) -> None:
    for i, ns in enumerate(namespaces):
        proc = _run(root, "DEL", stdin, ns, f"cid-{i}")
        assert proc.returncode == 0, f"{where}: DEL {i}: {proc.stdout} {proc.stderr}"
        assert {name for _, name in nt.link_names(ns.name)} == {"lo"}, f"{where}: pod {i}: {nt.link_names(ns.name)}"
    assert nt.owners(data_dir) == {}, f"{where}: reservations left {nt.owners(data_dir)}"


def _burst(node, netns, master, how: str, fallback: bool):
    """Shims of one kind, a burst of ADDs with the daemon dying in it, the outcomes checked."""
    shims, start = node
    root = shims(fallback=fallback)
    m = master()
    prefix, _ = nt.random_subnet()
    data_dir = root / "data"
    stdin = _conf(m.name, data_dir, prefix)
    namespaces = [netns() for _ in range(BURST)]
    rng = random.Random(f"{SEED}/{how}/{'fallback' if fallback else 'daemon-only'}")
    adds, delay = _burst_with_daemon_dying(root, start, stdin, namespaces, how, rng)
    where = f"seed {SEED}: daemon {how} {delay * 1000:.0f} ms into the burst"
    granted = _check_outcomes(adds, namespaces, data_dir, where)
    return root, stdin, namespaces, data_dir, where, adds, granted


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_daemon_dies_during_a_burst_fallback_shims(node, netns, master, how):
    """Host-mode shims (with an in-process fallback): ADDs cut off by the daemon's death answer
    11; on SIGTERM the daemon finishes the calls it took, and the rest run in-process."""
    root, stdin, namespaces, data_dir, where, adds, granted = _burst(node, netns, master, how, fallback=True)
    if how == "SIGTERM":
        assert len(granted) == BURST, f"{where}: a SIGTERMed daemon finishes what it took: {[a.stdout for a in adds]}"
    _del_all(root, stdin, namespaces, data_dir, where)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_daemon_dies_during_a_burst_daemon_only_shims(node, netns, master, how):
    """DaemonSet shims (no fallback): while the daemon is down every ADD and DEL answers 11 and
    changes nothing; after the restart the runtime's retried DELs repair everything."""
    root, stdin, namespaces, data_dir, where, _, granted = _burst(node, netns, master, how, fallback=False)
    owners = nt.owners(data_dir)
    proc = _run(root, "DEL", stdin, namespaces[0], "cid-0")
    assert nt.cni_error(proc)["code"] == 11, f"{where}: DEL without a daemon must not report success"
    assert nt.owners(data_dir) == owners, f"{where}: a DEL without the daemon changed the store"
    for i in granted:
        assert nt.addresses(namespaces[i].name, "net1"), f"{where}: pod {i} lost its address"
    _, start = node
    start()
    _del_all(root, stdin, namespaces, data_dir, where)


HD_BURST = 8


@pytest.mark.parametrize("fallback", [True, False], ids=["fallback", "daemon-only"])
def test_daemon_sigkilled_during_a_burst_of_host_device_adds(node, netns, master, fallback):
    """host-device-rdma: the daemon SIGKILLed while it moves devices: every ADD succeeded for
    real or answers 11, and the runtime's DELs (after a restart, for daemon-only shims) bring
    every device home as it was and leave nothing behind."""
    shims, start = node
    root = shims(fallback=fallback)
    prefix, _ = nt.random_subnet()
    data_dir = root / "data"
    fixture = netns()
    namespaces = [netns() for _ in range(HD_BURST)]
    devices, before = [], []
    for _ in namespaces:
        m = master(peer_ns=fixture)
        nt.ip("link", "set", m.name, "address", ORIGINAL_MAC)
        devices.append(m)
    before = [nt.settled_link(None, m.name) for m in devices]
    stdins = [nt.single("killnet", "1.0.0", {"type": "host-device-rdma", "device": m.name,
                                             "ipam": nt.lease_ipam(data_dir, f"{prefix}.0/24", gateway=f"{prefix}.1")})
              for m in devices]
    rng = random.Random(f"{SEED}/host-device/{'fallback' if fallback else 'daemon-only'}")
    daemon = start()
    delay = rng.uniform(0.0, 1.0)  # the burst takes about a second here: some finish, some are cut
    with ThreadPoolExecutor(HD_BURST) as pool:
        futures = [pool.submit(_run, root, "ADD", stdins[i], ns, f"cid-{i}", "host-device-rdma")
                   for i, ns in enumerate(namespaces)]
        time.sleep(delay)
        daemon.proc.kill()
        adds = [f.result() for f in futures]
    daemon.proc.wait(timeout=60)
    where = f"seed {SEED}: daemon SIGKILL {delay * 1000:.0f} ms into a burst of host-device-rdma ADDs"
    owners = nt.owners(data_dir)
    for i, (proc, ns) in enumerate(zip(adds, namespaces)):
        nt.no_traceback(proc)
        if proc.returncode == 0:
            address = json.loads(proc.stdout)["ips"][0]["address"]
            assert nt.addresses(ns.name, "net1") == [address], f"{where}: ADD {i} succeeded without its address"
            assert nt.link(ns.name, "net1")["ifalias"] == devices[i].name, f"{where}: ADD {i} succeeded without the device"
            assert owners.get(nt.bare_ip(address)) == f"cid-{i}", f"{where}: ADD {i}'s address is not in the store"
        else:
            assert nt.cni_error(proc)["code"] == 11, f"{where}: ADD {i} answered {nt.cni_error(proc)} (expected success or 11)"
    print(f"{where}: {sum(p.returncode == 0 for p in adds)} of {HD_BURST} ADDs succeeded, the rest answered 11")
    if not fallback:
        start()
    for i, ns in enumerate(namespaces):
        for attempt in (1, 2):
            proc = _run(root, "DEL", stdins[i], ns, f"cid-{i}", "host-device-rdma")
            assert proc.returncode == 0, f"{where}: DEL #{attempt} of {i}: {proc.stdout} {proc.stderr}"
        assert {name for _, name in nt.link_names(ns.name)} == {"lo"}, f"{where}: pod {i}: {nt.link_names(ns.name)}"
    for i, m in enumerate(devices):
        assert nt.link(fixture.name, m.peer) is not None, f"{where}: device {i} died (its peer is gone)"
        assert_restored(m.name, before[i])
    nothing_recorded(types.SimpleNamespace(root=root))
    assert nt.owners(data_dir) == {}, f"{where}: reservations left {nt.owners(data_dir)}"
