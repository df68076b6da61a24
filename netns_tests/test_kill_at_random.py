"""An ADD killed at a random instant (SIGKILL, as a runtime's timeout or the OOM killer does it)
leaves nothing that the runtime's DEL or a repeat ADD does not repair.

Each round starts an ADD of macvlan-rdma + lease-ipam (local store) as a runtime does (raw exec,
bare CNI environment), kills it after a delay drawn over the ADD's own measured duration, then
either DELs twice (both must exit 0) or repeats the ADD. Afterwards the pod netns and the host
hold exactly what they held before the round (or after one clean ADD, for the repeat), and the
store holds no reservation once the attachment is DELed.

Through the daemon, killing the shim does not kill the daemon's ADD: the runtime's DEL (or repeat
ADD) waits for it on the attachment's lock, and the ADD, seeing its caller gone at its next step,
gives up and undoes what it did (cni.linux.attachment_lock, cni.core.deadline).

The rounds are seeded: every assertion names the seed and the round, and
``RDMANET_KILL_SEED=<seed>`` replays the same delays. ``RDMANET_KILL_ROUNDS`` sets the number of
rounds (the suite's default keeps CI short; a larger number is an opt-in soak run).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import time

import pytest

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]

SEED = int(os.environ.get("RDMANET_KILL_SEED") or secrets.randbits(32))
ROUNDS = int(os.environ.get("RDMANET_KILL_ROUNDS", "12"))

pytestmark = pytest.mark.skipif(nt.lease_ipam_missing() is not None, reason=str(nt.lease_ipam_missing()))


def _start(cni, command: str, stdin: dict, ns, cid: str) -> subprocess.Popen:
    env = nt.bare_env(CNI_COMMAND=command, CNI_CONTAINERID=cid, CNI_NETNS=ns.path, CNI_IFNAME="net1",
                      CNI_PATH=os.fspath(cni.cni_bin), **cni.policy_env)
    proc = subprocess.Popen([os.fspath(cni.plugin())], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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


def _measured_add(cni, stdin: dict, ns, cid: str) -> float:
    """One clean ADD + DEL; the ADD's duration."""
    start = time.monotonic()
    nt.ok(cni.exec("ADD", stdin, ns=ns, container_id=cid))
    took = time.monotonic() - start
    nt.ok(cni.exec("DEL", stdin, ns=ns, container_id=cid))
    return took


@pytest.mark.parametrize("then", ["DEL", "ADD"])
def test_macvlan_rdma_add_killed_at_a_random_instant(cni, netns, master, then):
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    stdin = nt.single(f"{ns.name}-net", "1.0.0",
                      nt.macvlan(m.name, nt.lease_ipam(cni.data_dir, f"{prefix}.0/24", gateway=f"{prefix}.1")))
    host_before = nt.link_names()
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
        assert nt.link_names() == host_before, f"{where}: host links changed"
    # After all that, a fresh attachment works as on a clean host.
    nt.ok(cni.exec("ADD", stdin, ns=ns, container_id="rdt-fresh"))
    nt.ok(cni.exec("DEL", stdin, ns=ns, container_id="rdt-fresh"))
    assert nt.owners(cni.data_dir) == {}
