"""An ADD killed at a random instant (SIGKILL, as a runtime's timeout or the OOM killer does it)
leaves nothing that the runtime's DEL or a repeat ADD does not repair.

Each round starts an ADD as a runtime does (raw exec, bare CNI environment), kills it after a
delay drawn over the ADD's own measured duration, then either DELs twice (both must exit 0) or
repeats the ADD. Afterwards the pod netns and the host hold exactly what they held before the
round (or after one clean ADD, for the repeat), and the store holds no reservation once the
attachment is DELed. The plugins:

- macvlan-rdma + lease-ipam (local store);
- a multi-rail pod: eth0 plus four macvlan-rdma rails in one subnet, each with its routing table
  and rules (rdmanet.cni.linux.rail_routing); one rail's ADD is killed, the rails before it are
  attached. The pod must end with exactly the rules, tables and main routes it had before (its
  eth0 default route among them), after the DELs or after a repeat ADD and its DELs;
- host-device-rdma + lease-ipam (local store, and the Kubernetes store against the fake API
  server, tests/kube_api_server.py). The device is a veth end in the host whose peer sits in a
  netns the test owns: a veth dies with the netns it is in, so a device a killed call left in a
  temporary netns that nobody finds again shows as a missing device. After each round it must be
  back in the host with its name, MAC, MTU, up state and alias, its peer alive, and no state
  file, allocation record or netns mounted under the state dir may be left
  (rdmanet/plugins/host_device_rdma/moves.py).

Through the daemon, killing the shim does not kill the daemon's ADD: the runtime's DEL (or repeat
ADD) waits for it on the attachment's lock, and the ADD, seeing its caller gone at its next step,
gives up and undoes what it did (rdmanet.cni.linux.attachment_lock, rdmanet.cni.core.deadline).

The rounds are seeded: every assertion names the seed and the round, and
``RDMANET_KILL_SEED=<seed>`` replays the same delays. ``RDMANET_KILL_ROUNDS`` sets the number of
rounds (the suite's default keeps CI short; a larger number is an opt-in soak run).
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import secrets
import signal
import subprocess
import sys
import time

import pytest

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]

try:
    from netns_tests.test_host_device_rdma import ORIGINAL_MAC, assert_restored, nothing_recorded
    from netns_tests.test_multi_rail import pod_with_eth0, rail
except ImportError:  # pragma: no cover
    from test_host_device_rdma import ORIGINAL_MAC, assert_restored, nothing_recorded  # type: ignore[no-redef]
    from test_multi_rail import pod_with_eth0, rail  # type: ignore[no-redef]

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from kube_api_server import KubeAPIServer, write_kubeconfig  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

SEED = int(os.environ.get("RDMANET_KILL_SEED") or secrets.randbits(32))
# Rounds per case; RDMANET_KILL_ROUNDS sets them all (a soak). The defaults keep the suite short:
# host-device-rdma has four cases, and an in-process ADD with the Kubernetes client costs more.
ROUNDS = int(os.environ.get("RDMANET_KILL_ROUNDS") or 12)
RAIL_ROUNDS = int(os.environ.get("RDMANET_KILL_ROUNDS") or 8)
HD_ROUNDS = {"local store": int(os.environ.get("RDMANET_KILL_ROUNDS") or 6),
             "Kubernetes store": int(os.environ.get("RDMANET_KILL_ROUNDS") or 3)}
HD = "host-device-rdma"
LEASE_NS = "rdt-kill"

pytestmark = pytest.mark.skipif(nt.lease_ipam_missing() is not None, reason=str(nt.lease_ipam_missing()))


def _host_links(*fixture: str) -> set[tuple[int, str]]:
    """The host's links that this test or the plugins could have made or moved: this session's
    (nt.PREFIX), the plugins' temporary names, links carrying a marker or a fixture's name as
    alias, macvlans on a fixture. Other sessions on the machine (other suites' veths) are left out."""
    out = set()
    for entry in nt.links():
        name, alias = entry["ifname"], entry.get("ifalias") or ""
        if (name.startswith((nt.PREFIX, "mvr", "ipr")) or alias.startswith("rdmanet:") or alias in fixture
                or entry.get("link") in fixture):
            out.add((entry["ifindex"], name))
    return out


def _start(cni, command: str, stdin: dict, ns, cid: str, plugin: str = nt.PLUGIN, ifname: str = "net1") -> subprocess.Popen:
    env = nt.bare_env(CNI_COMMAND=command, CNI_CONTAINERID=cid, CNI_NETNS=ns.path, CNI_IFNAME=ifname,
                      CNI_PATH=os.fspath(cni.cni_bin), **cni.policy_env)
    proc = subprocess.Popen([os.fspath(cni.plugin(plugin))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdin.write(json.dumps(stdin).encode())
    proc.stdin.close()
    return proc


def _kill_after(proc: subprocess.Popen, delay: float) -> str:
    """SIGKILL ``proc`` ``delay`` seconds after it started; what happened, for the messages."""
    time.sleep(delay)
    outcome = "killed"
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    else:
        outcome = f"finished first (exit {proc.returncode})"
    proc.wait(timeout=60)
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    # An ADD that was not killed must have succeeded: a failing one would make the round vacuous.
    assert proc.returncode in (0, -signal.SIGKILL), f"ADD failed on its own: {out!r} {err[-2000:]!r}"
    return outcome


def _measured_add(cni, stdin: dict, ns, cid: str, plugin: str = nt.PLUGIN) -> float:
    """One clean ADD + DEL; the ADD's duration."""
    start = time.monotonic()
    nt.ok(cni.exec("ADD", stdin, ns=ns, container_id=cid, plugin=plugin))
    took = time.monotonic() - start
    nt.ok(cni.exec("DEL", stdin, ns=ns, container_id=cid, plugin=plugin))
    return took


@pytest.mark.parametrize("then", ["DEL", "ADD"])
def test_macvlan_rdma_add_killed_at_a_random_instant(cni, netns, master, then):
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0",
                      nt.macvlan(m.name, nt.lease_ipam(cni.data_dir, f"{prefix}.0/24", gateway=f"{prefix}.1")))
    host_before = _host_links(m.name)
    _measured_add(cni, stdin, ns, "rdt-warm-up")  # a daemon's first call of a network costs more
    duration = _measured_add(cni, stdin, ns, "rdt-measure")
    rng = random.Random(f"{SEED}/{then}")
    print(f"kill-at-random seed {SEED}: {ROUNDS} rounds over an ADD of {duration * 1000:.0f} ms "
          f"(replay with RDMANET_KILL_SEED={SEED})")
    for n in range(ROUNDS):
        cid = f"rdt-kill-{n}"
        delay = rng.uniform(0, duration * 1.2)
        outcome = _kill_after(_start(cni, "ADD", stdin, ns, cid), delay)
        where = f"seed {SEED} ({then}) round {n}: ADD {outcome} after {delay * 1000:.1f} ms"
        if then == "DEL":
            for attempt in (1, 2):
                proc = cni.exec("DEL", stdin, ns=ns, container_id=cid)
                assert proc.returncode == 0, f"{where}: DEL #{attempt} failed: {proc.stdout} {proc.stderr}"
            assert {name for _, name in nt.link_names(ns.name)} == {"lo"}, f"{where}: {nt.link_names(ns.name)}"
        else:
            proc = cni.exec("ADD", stdin, ns=ns, container_id=cid)
            assert proc.returncode == 0, f"{where}: repeat ADD failed: {proc.stdout} {proc.stderr}"
            result = json.loads(proc.stdout)
            assert {name for _, name in nt.link_names(ns.name)} == {"lo", "net1"}, f"{where}: {nt.link_names(ns.name)}"
            assert nt.addresses(ns.name, "net1") == [result["ips"][0]["address"]], where
            assert list(nt.owners(cni.data_dir).values()) == [cid], f"{where}: {nt.owners(cni.data_dir)}"
            proc = cni.exec("DEL", stdin, ns=ns, container_id=cid)
            assert proc.returncode == 0, f"{where}: DEL failed: {proc.stdout} {proc.stderr}"
            assert {name for _, name in nt.link_names(ns.name)} == {"lo"}, f"{where}: {nt.link_names(ns.name)}"
        assert nt.owners(cni.data_dir) == {}, f"{where}: reservations left {nt.owners(cni.data_dir)}"
        assert _host_links(m.name) == host_before, f"{where}: host links changed"
    # After all that, a fresh attachment works as on a clean host.
    nt.ok(cni.exec("ADD", stdin, ns=ns, container_id="rdt-fresh"))
    nt.ok(cni.exec("DEL", stdin, ns=ns, container_id="rdt-fresh"))
    assert nt.owners(cni.data_dir) == {}


def _routing(ns) -> dict:
    """Everything of a pod's routing a rail could leave behind: its rules, and the routes of every
    table but the kernel's local ones (by family)."""
    out = {}
    for family in ("-4", "-6"):
        out[f"rules{family}"] = sorted(json.dumps(r, sort_keys=True) for r in nt.ip_json(family, "rule", "show", ns=ns.name))
        routes = nt.ip_json(family, "route", "show", "table", "all", ns=ns.name)
        out[f"routes{family}"] = sorted(json.dumps({k: v for k, v in r.items() if k not in ("flags", "expires")}, sort_keys=True)
                                        for r in routes if r.get("table") != "local")
    return out


@pytest.mark.parametrize("then", ["DEL", "ADD"])
def test_multi_rail_add_killed_at_a_random_instant(cni, netns, master, then):
    pod, _cluster = pod_with_eth0(netns, master)
    prefix, _ = nt.random_subnet()
    rails = []
    for k in range(1, 5):
        m, _peer = rail(netns, master, f"{prefix}.{200 + k}/24")
        ipam = nt.lease_ipam(cni.data_dir, f"{prefix}.0/24", network_name=f"{pod.name}-rails")
        rails.append((f"net{k}", nt.single(f"{pod.name}-rail{k}", "1.0.0", nt.macvlan(m.name, ipam))))
    before = _routing(pod)

    def add(ifname: str, stdin: dict, cid: str) -> None:
        nt.ok(cni.exec("ADD", stdin, ns=pod, ifname=ifname, container_id=cid))

    def delete_all(cid: str, where: str) -> None:
        for attempt in (1, 2):
            for ifname, stdin in reversed(rails):
                proc = cni.exec("DEL", stdin, ns=pod, ifname=ifname, container_id=cid)
                assert proc.returncode == 0, f"{where}: DEL {ifname} #{attempt} failed: {proc.stdout} {proc.stderr}"

    for ifname, stdin in rails[:2]:  # a daemon's first calls of a network cost more
        add(ifname, stdin, "rdt-warm-up")
    delete_all("rdt-warm-up", "warm-up")
    start = time.monotonic()
    for ifname, stdin in rails:
        add(ifname, stdin, "rdt-measure")
    duration = (time.monotonic() - start) / len(rails)
    delete_all("rdt-measure", "measure")
    assert _routing(pod) == before, "a clean ADD + DEL of the four rails changed the pod's routing"
    rng = random.Random(f"{SEED}/rails/{then}")
    print(f"kill-at-random seed {SEED}: {RAIL_ROUNDS} rounds over a rail ADD of {duration * 1000:.0f} ms "
          f"(replay with RDMANET_KILL_SEED={SEED})")
    for n in range(RAIL_ROUNDS):
        cid = f"rdt-kill-rail-{n}"
        killed = rng.randrange(len(rails))
        delay = rng.uniform(0, duration * 1.2)
        for ifname, stdin in rails[:killed]:
            add(ifname, stdin, cid)
        ifname, stdin = rails[killed]
        outcome = _kill_after(_start(cni, "ADD", stdin, pod, cid, ifname=ifname), delay)
        where = f"seed {SEED} (rails, {then}) round {n}: ADD of {ifname} {outcome} after {delay * 1000:.1f} ms"
        if then == "ADD":
            for ifname, stdin in rails[killed:]:
                proc = cni.exec("ADD", stdin, ns=pod, ifname=ifname, container_id=cid)
                assert proc.returncode == 0, f"{where}: ADD of {ifname} failed: {proc.stdout} {proc.stderr}"
            rules = nt.ip_json("-4", "rule", "show", ns=pod.name)
            for k in range(1, 5):
                mine = [r for r in rules if r.get("table") == str(10_000 + k)]
                assert len(mine) == 2, f"{where}: net{k} has the rules {mine}, expected its oif and from rules once"
        delete_all(cid, where)
        assert {name for _, name in nt.link_names(pod.name)} == {"lo", "eth0"}, f"{where}: {nt.link_names(pod.name)}"
        assert _routing(pod) == before, f"{where}: the pod's rules or tables changed"
        assert nt.owners(cni.data_dir) == {}, f"{where}: reservations left {nt.owners(cni.data_dir)}"


class _LocalStore:
    """lease-ipam's local file store in the test's data dir."""

    name = "local store"

    def __init__(self, cni) -> None:
        self.cni = cni

    def ipam(self, prefix: str) -> dict:
        return nt.lease_ipam(self.cni.data_dir, f"{prefix}.0/24", gateway=f"{prefix}.1")

    def held(self) -> dict[str, str]:
        """{address: holder} of every reservation."""
        return nt.owners(self.cni.data_dir)


class _KubeStore:
    """lease-ipam's Kubernetes store against the fake API server (a Lease per address)."""

    name = "Kubernetes store"

    def __init__(self, cni, server: KubeAPIServer) -> None:
        self.server = server
        self.kubeconfig = write_kubeconfig(cni.root / "kubeconfig", server.url, namespace=LEASE_NS)

    def ipam(self, prefix: str) -> dict:
        return {"type": "lease-ipam", "range": f"{prefix}.0/24", "gateway": f"{prefix}.1",
                "kubernetes": {"kubeconfig": str(self.kubeconfig)}}

    def held(self) -> dict[str, str]:
        """{address: holder} of every claim (a node's address block stays the node's: not a leak)."""
        return {o["metadata"]["annotations"]["rdmanet.io/ip"]: o["spec"]["holderIdentity"].split("/")[0]
                for o in claim_leases(self.server, LEASE_NS)}


@pytest.fixture(params=["local", "kube"])
def store(request, cni):
    if request.param == "local":
        yield _LocalStore(cni)
        return
    with KubeAPIServer() as server:
        server.add_namespace(LEASE_NS)
        yield _KubeStore(cni, server)


@pytest.mark.parametrize("then", ["DEL", "ADD"])
def test_host_device_rdma_add_killed_at_a_random_instant(cni, netns, master, store, then):
    ns, fixture = netns(), netns()
    m = master(peer_ns=fixture)  # the "device": its peer lives in the test's own netns
    nt.ip("link", "set", m.name, "address", ORIGINAL_MAC)
    nt.ip("link", "set", m.name, "alias", "rdt-kill-device")
    before = nt.settled_link(None, m.name)
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0", {"type": HD, "device": m.name, "ipam": store.ipam(prefix)})
    host_before = _host_links(m.name)
    _measured_add(cni, stdin, ns, "rdt-warm-up", plugin=HD)  # a daemon's first call sets up its API client
    duration = _measured_add(cni, stdin, ns, "rdt-measure", plugin=HD)
    rng = random.Random(f"{SEED}/{HD}/{store.name}/{then}")
    rounds = HD_ROUNDS[store.name]
    print(f"kill-at-random seed {SEED}: {rounds} rounds of {HD} ({store.name}, then {then}) over an ADD "
          f"of {duration * 1000:.0f} ms (replay with RDMANET_KILL_SEED={SEED})")

    def home(where: str) -> None:
        assert {name for _, name in nt.link_names(ns.name)} == {"lo"}, f"{where}: pod netns: {nt.link_names(ns.name)}"
        assert nt.link(fixture.name, m.peer) is not None, f"{where}: the device died (its peer is gone)"
        try:
            assert_restored(m.name, before)
            nothing_recorded(cni)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None
        assert store.held() == {}, f"{where}: reservations left {store.held()}"
        assert _host_links(m.name) == host_before, f"{where}: host links changed"

    for n in range(rounds):
        cid = f"rdt-kill-{n}"
        delay = rng.uniform(0, duration * 1.2)
        outcome = _kill_after(_start(cni, "ADD", stdin, ns, cid, plugin=HD), delay)
        where = f"seed {SEED} ({HD}, {store.name}, {then}) round {n}: ADD {outcome} after {delay * 1000:.1f} ms"
        if then == "DEL":
            for attempt in (1, 2):
                proc = cni.exec("DEL", stdin, ns=ns, container_id=cid, plugin=HD)
                assert proc.returncode == 0, f"{where}: DEL #{attempt} failed: {proc.stdout} {proc.stderr}"
        else:
            proc = cni.exec("ADD", stdin, ns=ns, container_id=cid, plugin=HD)
            assert proc.returncode == 0, f"{where}: repeat ADD failed: {proc.stdout} {proc.stderr}"
            [ip] = json.loads(proc.stdout)["ips"]
            assert {name for _, name in nt.link_names(ns.name)} == {"lo", "net1"}, f"{where}: {nt.link_names(ns.name)}"
            assert nt.link(ns.name, "net1")["address"] == ORIGINAL_MAC, where
            assert nt.addresses(ns.name, "net1") == [ip["address"]], where
            assert store.held() == {nt.bare_ip(ip["address"]): cid}, f"{where}: {store.held()}"
            proc = cni.exec("DEL", stdin, ns=ns, container_id=cid, plugin=HD)
            assert proc.returncode == 0, f"{where}: DEL failed: {proc.stdout} {proc.stderr}"
        home(where)
    # After all that, a fresh attachment works as on a clean host.
    nt.ok(cni.exec("ADD", stdin, ns=ns, container_id="rdt-fresh", plugin=HD))
    assert nt.link(ns.name, "net1")["ifalias"] == m.name
    nt.ok(cni.exec("DEL", stdin, ns=ns, container_id="rdt-fresh", plugin=HD))
    home(f"seed {SEED}: the fresh ADD + DEL")
