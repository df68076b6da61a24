"""What ``install.sh --uninstall`` clears after the plugins and the demo (rdmanet.cli.leftovers),
on trees the real plugin made: the demo's store, the lock files, the DEL journal, the run dir and
the directories install created go; live claims, pending DELs, host-device state and a lock a
call holds stay, each said."""

from __future__ import annotations

import fcntl
import json
import os

from rdmanet.cli import leftovers
from rdmanet.cli.demo import CONTAINER_ID, IFNAME, NETWORK, demo_config
from rdmanet.cni.core import skel
from rdmanet.ipam.plugin import LeaseIPAM


def lease_ipam(command: str, data_dir, name: str, cid: str, subnet: str = "198.18.100.0/24") -> None:
    config = demo_config("eth0") if name == NETWORK else {"cniVersion": "1.0.0", "name": name, "type": "macvlan-rdma",
                                                          "ipam": {"type": "lease-ipam", "range": subnet}}
    config["ipam"] = dict(config["ipam"], dataDir=str(data_dir))
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/x", "CNI_IFNAME": IFNAME, "CNI_PATH": "/x"}
    code, out = skel.handle(LeaseIPAM(), env, json.dumps(config).encode())
    assert code == 0, out


def tree(tmp_path):
    data, run, hd = tmp_path / "lease-ipam", tmp_path / "run", tmp_path / "host-device-rdma"
    (run / "locks").mkdir(parents=True)
    for i in range(3):
        (run / "locks" / f"{i:02x}.lock").write_text("")
    (run / "del-journal").mkdir()
    (run / "del-journal" / ".123.456.tmp").write_text("")  # a shim killed while journaling
    hd.mkdir()
    (hd / "locks").mkdir()
    return data, run, hd


def test_after_demo_down_everything_goes(tmp_path):
    data, run, hd = tree(tmp_path)
    lease_ipam("ADD", data, NETWORK, CONTAINER_ID)
    lease_ipam("DEL", data, NETWORK, CONTAINER_ID)  # rdmanet demo --down
    created = tmp_path / "opt-cni-bin"
    created.mkdir()
    lines = leftovers.clean(str(data), str(run), str(hd), [str(created)])
    assert lines == [f"removed {data / NETWORK}", f"removed {data}", f"removed 3 lock file(s) in {run / 'locks'}",
                     f"removed {run / 'locks'}", f"removed {run / 'del-journal'}", f"removed {run}", f"removed {created}"]
    assert sorted(os.listdir(tmp_path)) == ["host-device-rdma"]  # not install's: no state in it, left as it is
    assert leftovers.clean(str(data), str(run), str(hd), [str(created)]) == []  # again: nothing said, nothing done


def test_what_is_in_use_is_kept_and_said(tmp_path):
    data, run, hd = tree(tmp_path)
    lease_ipam("ADD", data, NETWORK, CONTAINER_ID)  # rdmanet demo --keep
    lease_ipam("ADD", data, "team-net", "c1", "10.3.0.0/24")
    (run / "del-journal" / "lease-ipam-abc.del").write_text("RDMANET 2 lease-ipam 0 0\n")
    (hd / "team-net-c2-net1.json").write_text("{}")
    held = os.open(run / "locks" / "01.lock", os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)  # a call running now
    created = tmp_path / "opt-cni-bin"
    created.mkdir()
    (created / "macvlan").write_text("")  # another plugin went there since
    try:
        lines = leftovers.clean(str(data), str(run), str(hd), [str(created)])
    finally:
        os.close(held)
    assert lines == [
        f"kept {data / NETWORK}: the demo's attachment still holds 198.18.100.2 (rdmanet demo --down releases it)",
        f"kept {data / 'team-net'}: 1 live claim(s) of network team-net (rdmanet ipam ls --data-dir {data} lists them)",
        f"left {data}: it holds what is kept above",
        f"removed 2 lock file(s) in {run / 'locks'}",
        f"kept 1 lock file(s) in {run / 'locks'}: a CNI call holds them now",
        f"kept {run / 'del-journal'}: 1 DEL(s) the daemon has not replayed yet (their addresses stay claimed until "
        "a daemon replays them, or the reconciler frees them)",
        f"kept {hd}: the state of 1 host-device-rdma attachment(s) (their DEL moves the device home)",
        f"left {run}: it holds what is kept above",
        f"left {created}: it holds files of others (install.sh created it)"]
    assert os.listdir(data / NETWORK) and os.listdir(run / "locks") == ["01.lock"]
