"""lease-ipam's local store deletes only its own files, under its own directory: proved beside Go's
host-local (Debian's containernetworking-plugins) on the real filesystem, through the plugins the
runtime execs (the shims; with RDMANET_TEST_PLUGINS=daemon, the daemon).

host-local keeps ``<dataDir>/<network name>/<ip>`` files holding ``<containerID>\\r\\n<ifname>``;
lease-ipam's store of the same network name under the same ``dataDir`` is that very directory.
A user who points ``dataDir`` there (or shares /var/lib/cni/networks) must lose nothing:
host-local's reservations are never handed out again and never removed, by ADD (with or without
a requested address), DEL or GC; lease-ipam's default directory is one of its own
(/var/lib/cni/lease-ipam)."""

from __future__ import annotations

import json
import os

import pytest

from rdmanet.ipam.location import DEFAULT_DATA_DIR

import nstools as nt

NET = "shared-net"


def host_local(cni, command, cid, **ipam):
    conf = {"cniVersion": "1.0.0", "name": NET, "type": "host-local",
            "ipam": {"type": "host-local", "subnet": "10.88.0.0/24", "dataDir": str(cni.host_local_dir), **ipam}}
    # host-local is an IPAM plugin: its stdin is the network config, its ipam block its own
    return nt.raw_exec(cni.cni_bin / "host-local", command, conf, netns="/var/run/netns/none", container_id=cid,
                       cni_path=[cni.cni_bin])


def lease_ipam(cni, command, cid, extra=None, **ipam):
    conf = {"cniVersion": "1.1.0", "name": NET, "type": "lease-ipam",
            "ipam": {"type": "lease-ipam", "range": "10.88.0.0/24", "dataDir": str(cni.host_local_dir), **ipam},
            **(extra or {})}
    return cni.exec(command, conf, ns="/var/run/netns/none", plugin="lease-ipam", container_id=cid)


def answer(proc):
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def files(cni):
    d = cni.host_local_dir / NET
    return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}


def test_host_locals_reservation_is_never_handed_out_nor_removed(cni):
    made = host_local(cni, "ADD", "hl-1")
    assert made.returncode == 0, made.stdout + made.stderr
    [ip] = [a["address"].split("/")[0] for a in answer(made)["ips"]]
    theirs = files(cni)[ip]
    assert theirs == b"hl-1\r\nnet1"  # host-local's own format, not lease-ipam's

    # a requested address that host-local holds: refused, its file untouched
    asked = lease_ipam(cni, "ADD", "li-asks", {"runtimeConfig": {"ips": [f"{ip}/24"]}})
    doc = answer(asked)
    assert asked.returncode != 0 and doc["code"] == 103 and "did not write" in doc["msg"], asked.stdout
    assert files(cni)[ip] == theirs

    # an ADD without a request: any address but host-local's
    got = lease_ipam(cni, "ADD", "li-1")
    assert got.returncode == 0, got.stdout + got.stderr
    mine = answer(got)["ips"][0]["address"].split("/")[0]
    assert mine != ip

    # GC that keeps no lease-ipam attachment: lease-ipam's own claim goes, host-local's stays
    gc = lease_ipam(cni, "GC", "gc", {"cni.dev/valid-attachments": []})
    assert gc.returncode == 0, gc.stdout + gc.stderr
    left = files(cni)
    assert left[ip] == theirs and mine not in left

    # DEL of a lease-ipam attachment under host-local's container ID: nothing of host-local's goes
    assert lease_ipam(cni, "DEL", "hl-1").returncode == 0
    assert files(cni)[ip] == theirs
    # and host-local still manages its own reservation
    assert host_local(cni, "DEL", "hl-1").returncode == 0
    assert ip not in files(cni)


def test_the_default_data_dir_is_lease_ipams_own():
    assert DEFAULT_DATA_DIR == "/var/lib/cni/lease-ipam"
    assert os.path.commonpath([DEFAULT_DATA_DIR, "/var/lib/cni/networks"]) == "/var/lib/cni"


@pytest.mark.parametrize("content", [b"", b"\0" * 64, b'{"containerID": "c-1", "ifn'])
def test_an_interrupted_write_of_its_own_is_still_freed(cni, content):
    """The rule that makes a crashed ADD's file reclaimable still holds for lease-ipam's own
    format: an empty file, a zero-filled one (a power loss) or a torn document of ours goes on GC."""
    store = cni.host_local_dir / NET
    assert lease_ipam(cni, "ADD", "li-1").returncode == 0
    (store / "10.88.0.200").write_bytes(content)
    assert lease_ipam(cni, "GC", "gc", {"cni.dev/valid-attachments": [{"containerID": "li-1", "ifname": "net1"}]}
                      ).returncode == 0
    assert not (store / "10.88.0.200").exists()
