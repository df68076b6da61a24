"""host-device-rdma and macvlan-rdma's GID report against Debian's kernel under qemu.

The SAME boot as test_vm_rdma.py and test_vm_vf.py (vm/shared_boot.py): the guest runs the
``hd_*`` sections of ``vm/guest_checks.py`` (its docstring lists them) and these tests assert on
the report. The plugins are executed as a runtime would (``/work/main/.venv/bin/host-device-rdma``
with a JSON config on stdin, host-local IPAM, host-device-rdma's state dir (the node policy's) in the guest's /tmp).

RDMA netns modes, with soft-RoCE:

- rxe cannot change netns (the kernel answers the nldev SET with EOPNOTSUPP: the driver has no
  ``disassociate_ucontext``), so the exclusive-mode ADD must fail with 101 and undo the netdev
  move it already made.
- An rxe device also dies when *its own* netdev leaves init_net (rxe listens to the netdev's
  NETDEV_UNREGISTER, which a netns move sends): ``test_rxe_dies_when_its_netdev_changes_netns``.
  Moving rxe0's real netdev would destroy rxe0 before the plugin's RDMA move, so the plugin is
  shown rxe0 as the RDMA device of another veth, ``hdv0``, through a fake sysfs tree
  (``RDMANET_SYSFS_ROOT``: ``sys/class/infiniband/rxe0/parent`` = ``hdv0``, the lookup rxe
  devices really get); the nldev requests go to the real rxe0.

SR-IOV: VF 0 of a real netdevsim PF (its VF knobs through the PF are real), with a veth as the
VF's netdev, mapped to a fake VF PCI address by the same fake tree (``net/``, ``physfn``,
``virtfn0``, ``sriov_numvfs``).

Skipped like test_vm_rdma.py when the VM cannot run; a failed boot fails the tests.
"""

from __future__ import annotations

import ipaddress
import re

import pytest

try:
    from netns_tests.vm import harness, shared_boot
except ImportError:  # netns_tests not importable as a package: the test's dir is on sys.path
    from vm import harness, shared_boot  # type: ignore[no-redef]

RXE = "rxe0"
HD_NETDEV, HD_MTU = "hdv0", 1400
VF_NETDEV, VF_PCI, VF = "vfnet0", "0000:3b:00.2", 0
EXCLUSIVE_FIX = "rdma system set netns exclusive"

COUNTERS = ("stats", "stats64")  # left out of before/after comparisons, as in guest_checks

_reason = harness.vm_available()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"test VM unavailable: {_reason}")


@pytest.fixture(scope="module")
def vm(request):
    return shared_boot.guest_report(request)


def section(vm, name: str) -> dict:
    return shared_boot.section(vm, name)


def comparable(link):
    return None if link is None else {k: v for k, v in link.items() if k not in COUNTERS}


def assert_link_as_before(before: dict, after: dict) -> None:
    assert after is not None, "the device is not back in the host netns"
    assert comparable(after) == comparable(before), {"before": before, "after": after}
    # spelled out, the fields the plugin itself restores
    for key in ("ifname", "address", "mtu", "operstate", "flags", "ifindex"):
        assert after.get(key) == before.get(key), key
    assert "ifalias" not in after


def cni_error(call: dict) -> dict:
    assert call["rc"] != 0, call
    err = call["stdout"]
    assert isinstance(err, dict) and "code" in err, call
    return err


def ok(call: dict) -> dict:
    assert call["rc"] == 0, call
    return call["stdout"]


def state_json(files: list[str]) -> list[str]:
    """State files and allocation records; the per-device lock files may stay."""
    return [f for f in files if not f.startswith("locks/")]


# ------------------------------------------------------------------------------- kernel facts


def test_fake_tree_gives_hdv0_rxe0_while_the_real_one_sits_on_rxenet0(vm):
    entry = section(vm, "hd_setup")
    assert entry["fake_rdma_devices"] == [RXE]
    assert entry["real_rdma_devices"] == []


def test_rxe_dies_when_its_netdev_changes_netns(vm):
    """Why the tests below use the fake parent: rxe unregisters itself when its netdev moves."""
    entry = section(vm, "hd_setup")
    assert entry["rxe9_before_move"] is True
    assert "rxe9" not in entry["rxe9_after_move"], entry
    assert RXE in entry["rxe9_after_move"]


# ------------------------------------------------------------------------ RDMA netns modes


def test_required_in_shared_mode_fails_101_and_changes_nothing(vm):
    entry = section(vm, "hd_required")
    assert entry["mode"] == "shared"
    err = cni_error(entry["add"])
    assert err["code"] == 101, err
    assert EXCLUSIVE_FIX in err["msg"] + " " + err.get("details", ""), err
    assert f"{RXE} cannot move into the pod" in err["msg"], err
    assert_link_as_before(entry["before"], entry["after"])
    assert entry["before"]["mtu"] == HD_MTU and "UP" in entry["before"]["flags"]
    assert state_json(entry["state_files"]) == []
    assert entry["pod_links"] == ["lo"]
    assert entry["ipam"] == []
    assert RXE in entry["rdma_devs"]


def test_exclusive_auto_rxe_cannot_move_and_everything_is_rolled_back(vm):
    entry = section(vm, "hd_exclusive")
    assert entry["mode"] == "exclusive"
    err = cni_error(entry["auto_add"])
    assert err["code"] == 101, err
    # the kernel's answer to a well-formed move of rxe0, named, with why
    assert err["msg"] == f"move RDMA device {RXE} into the pod: Operation not supported", err
    assert "cannot change netns" in err["details"], err
    assert "rxe/siw" in err["details"], err
    # the netdev had been moved, renamed, given MTU 1300 and a MAC, and set up in the pod: all undone
    assert_link_as_before(entry["before"], entry["auto_after"])
    assert entry["auto_pod_links"] == ["lo"]
    assert state_json(entry["auto_state_files"]) == []
    assert entry["auto_ipam"] == []
    assert entry["rxe_after_auto"] == entry["rxe_before"]  # still in init_net, same index


def test_exclusive_auto_on_rxe_own_netdev_keeps_rxe_alive(vm):
    """rxe0's own netdev (real sysfs): rxe dies when its netdev changes netns, so ADD asks for the
    RDMA move first; the kernel refuses it, nothing moved, and rxe0 is still there."""
    entry = section(vm, "hd_exclusive")
    err = cni_error(entry["real_add"])
    assert err["code"] == 101 and "Operation not supported" in err["msg"], err
    assert_link_as_before(entry["real_before"], entry["real_after"])
    assert entry["rxe_after_real"] == entry["rxe_before"]


def test_exclusive_rdma_off_moves_only_the_netdev(vm):
    entry = section(vm, "hd_exclusive")
    result = ok(entry["off_add"])
    [iface] = result["interfaces"]
    assert iface == {"name": "net1", "mac": "02:00:00:00:00:24", "sandbox": "/run/netns/hd-pod-excl"}
    address = result["ips"][0]["address"]
    assert ipaddress.ip_interface(address).ip in ipaddress.ip_network("198.18.7.0/24")
    assert entry["off_host_link"] is None
    pod = entry["off_pod_link"]
    assert pod["address"] == "02:00:00:00:00:24" and pod["mtu"] == 1300
    assert pod["ifalias"] == HD_NETDEV
    assert "UP" in pod["flags"]
    assert pod["linkinfo"]["info_kind"] == "veth"
    assert pod["ifindex"] == entry["before"]["ifindex"]  # the same device, not a new one
    assert entry["off_pod_addrs"]["ipv4"] == [address]
    assert address.split("/")[0] in entry["off_ipam"]
    assert state_json(entry["off_state_files"]) != []
    # RDMA untouched: rxe0 stays in init_net; in exclusive mode the pod sees no RDMA device
    assert RXE in entry["off_rdma_host"]
    assert entry["off_rdma_pod"] == []


def test_exclusive_rdma_off_del_restores(vm):
    entry = section(vm, "hd_exclusive")
    dele = entry["off_del"]
    assert dele["rc"] == 0 and dele["stdout"] is None, dele
    assert_link_as_before(entry["before"], entry["del_after"])
    assert entry["del_pod_links"] == ["lo"]
    assert state_json(entry["del_state_files"]) == []
    assert entry["del_ipam"] == []
    assert RXE in entry["del_rdma_host"]


# --------------------------------------------------------------------------- a real PF's VF


def test_vf_add_sets_the_vf_through_the_real_pf(vm):
    entry = section(vm, "hd_vf")
    result = ok(entry["add"])
    [iface] = result["interfaces"]
    assert iface == {"name": "net1", "mac": "02:00:00:00:00:42", "sandbox": "/run/netns/hd-pod-vf"}
    before, after = entry["vfinfo_before"], entry["vfinfo_after_add"]
    assert before[VF]["spoofchk"] is True and before[VF]["trust"] is False
    vf = after[VF]
    assert vf["address"] == "02:00:00:00:00:42"
    assert vf["vlan_list"] == [{"vlan": 100, "qos": 2}]
    assert vf["spoofchk"] is False and vf["trust"] is True
    # nothing else on the VF, and no other VF, changed
    assert {k: v for k, v in vf.items() if k not in ("address", "vlan_list", "spoofchk", "trust")} == \
        {k: v for k, v in before[VF].items() if k not in ("address", "vlan_list", "spoofchk", "trust")}
    assert [v for v in after if v["vf"] != VF] == [v for v in before if v["vf"] != VF]
    # the VF's netdev (the veth) is in the pod with the MAC, renamed, its host name as alias
    pod = entry["pod_link"]
    assert pod["address"] == "02:00:00:00:00:42" and pod["ifalias"] == VF_NETDEV and "UP" in pod["flags"]
    assert entry["host_link_after_add"] is None
    address = result["ips"][0]["address"]
    assert entry["pod_addrs"]["ipv4"] == [address]
    assert address.split("/")[0] in entry["ipam"]
    assert state_json(entry["state_files"]) != []


def test_vf_check_passes(vm):
    entry = section(vm, "hd_vf")
    check = entry["check"]
    assert check["rc"] == 0 and check["stdout"] is None, check


def test_vf_del_restores_vfinfo_and_the_netdev(vm):
    entry = section(vm, "hd_vf")
    dele = entry["del"]
    assert dele["rc"] == 0 and dele["stdout"] is None, dele
    assert entry["vfinfo_after_del"] == entry["vfinfo_before"]
    assert entry["before"]["operstate"] == "DOWN"
    assert_link_as_before(entry["before"], entry["del_after"])
    assert entry["del_pod_links"] == ["lo"]
    assert state_json(entry["del_state_files"]) == []
    assert entry["del_ipam"] == []


def vf_of(vfinfo: list, vf: int) -> dict:
    return next(v for v in vfinfo if v["vf"] == vf)


def test_a_pf_whose_vfs_are_enabled_is_not_moved(vm):
    """The node policy allows the PF by name, but its VFs are enabled: moving it would give one
    pod the MAC, VLAN and trust of every VF. CNI error 7 names the key, the PF, why, and the
    setting that would allow it; the PF and its VFs are as before and nothing is recorded."""
    entry = section(vm, "hd_pf_vfs_in_use")
    assert entry["sriov_numvfs"] == 4
    err = cni_error(entry["add"])
    assert err["code"] == 7, err
    assert err["msg"].startswith(f"invalid network config: device: host-device-rdma does not move {entry['pf']}, "
                                 "the host uses it: "), err
    assert "SR-IOV PF with 4 VFs enabled" in err["msg"], err
    assert '"hostInUse": true' in err["details"] and f'"name": "{entry["pf"]}"' in err["details"], err
    assert_link_as_before(entry["before"], entry["after"])
    assert entry["vfinfo_after"] == entry["vfinfo_before"]
    assert entry["pod_links"] == ["lo"]
    assert state_json(entry["state_files"]) == [] and entry["ipam"] == []


def test_vf_stale_del_leaves_the_vf_another_pod_holds_alone(vm):
    """After a (simulated) reboot pod B got VF 0 that pod A had; A's late DEL must not restore A's
    snapshot onto B's VF (nor touch B's netdev): only A's own state and address go."""
    entry = section(vm, "hd_vf_stale")
    ok(entry["add_a"])
    ok(entry["add_b"])
    assert entry["vf_after_add_b"] == {"mac": "02:00:00:00:00:0b", "vlan": 200}
    dele = entry["del_a"]
    assert dele["rc"] == 0 and dele["stdout"] is None, dele
    assert entry["vf_after_stale_del"] == {"mac": "02:00:00:00:00:0b", "vlan": 200}
    assert entry["pod_b_after_stale_del"] == entry["pod_b_after_add_b"] is not None
    assert [f for f in state_json(entry["state_files_after_stale_del"]) if "stale-a" in f] == []


def test_vf_del_of_the_holder_after_a_stale_del_restores_the_vf(vm):
    entry = section(vm, "hd_vf_stale")
    dele = entry["del_b"]
    assert dele["rc"] == 0 and dele["stdout"] is None, dele
    assert vf_of(entry["vfinfo_after_del_b"], VF) == vf_of(entry["vfinfo_before"], VF)
    assert_link_as_before(entry["host_before"], entry["host_after"])
    assert state_json(entry["state_files_after"]) == []
    assert entry["ipam_after"] == []


def test_vf_del_after_the_vf_is_gone_succeeds(vm):
    """sriov_numvfs went to 0 while the pod held VF 0 (its settings went with it): DEL has
    nothing to restore on the VF, succeeds, and forgets the attachment."""
    entry = section(vm, "hd_vf_gone")
    ok(entry["add"])
    assert entry["vf_after_add"]["vlan"] == 300
    assert not entry["vfinfo_after_numvfs_0"]
    dele = entry["del"]
    assert dele["rc"] == 0 and dele["stdout"] is None, dele
    assert state_json(entry["state_files_after"]) == []
    assert entry["ipam_after"] == []


# ------------------------------------------------------------------- macvlan-rdma GID index

GID_LINE = re.compile(
    r"(?P<who>\S+)/net1: RDMA device rxe0 port (?P<port>\d+) GID index (?P<index>\d+) \((?P<type>[^)]+)\) for (?P<ip>\S+)"
)


def test_macvlan_rdma_logs_the_gid_index_of_the_pod_address(vm):
    entry = section(vm, "plugin")
    add = entry["add"]
    result = ok(add)
    ip4 = result["ips"][0]["address"].split("/")[0]
    lines = [m for m in GID_LINE.finditer(add["stderr"])]
    assert len(lines) == 1, add["stderr"]
    logged = lines[0]
    assert logged["who"] == "vmpod1" and logged["ip"] == ip4 and logged["type"] == "RoCE v2"
    # the index the kernel's GID table (read independently in the guest) gives that address
    mapped = "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}".format(*map(int, ip4.split(".")))
    [table] = [g for g in entry["gids"] if g["gid"] == mapped and g["type"] == "RoCE v2"]
    assert int(logged["port"]) == 1 and int(logged["index"]) == table["index"], (logged.group(0), entry["gids"])
    assert entry["gid_index_lib"] == [1, table["index"], "RoCE v2"]
    assert "unknown" not in add["stderr"]


# ------------------------------------------------------------------- a kill with a PF between two netns


def test_pf_a_killed_add_left_in_the_pod_comes_home_on_del(vm):
    """The netdevsim PF's port netdev (a bus device: a netns that dies hands such a device back
    to the host, under a kernel-made or the pod's name) as host-device-rdma's device; the ADD is
    killed (os._exit at that step, tests/crash_steps.py) right after the one request that moved it
    into the pod and named it. It is there as net1 with its original name as alias (never in the host
    under the pod's name, nor in the pod under its own), and DEL brings it home as it was and
    leaves no state, allocation record or reservation."""
    entry = section(vm, "hd_pf_killed")
    before = entry["before"]
    assert entry["add_killed"]["rc"] == 137, entry["add_killed"]
    assert entry["host_after_kill"] is None, "the device is still (or back) in the host"
    assert entry["pod_links_after_kill"] == ["lo", "net1"]
    assert entry["pod_link_after_kill"] == {"ifalias": before["ifname"], "address": before["address"],
                                            "parentdev": before.get("parentdev")}
    dele = entry["del"]
    assert dele["rc"] == 0 and dele["stdout"] is None, dele
    assert_link_as_before(before, entry["after_del"])
    assert state_json(entry["files_after_del"]) == []  # no state file or allocation record (locks may stay)


def test_pf_in_a_deleted_pod_netns_is_restored_by_del(vm):
    """The pod netns is deleted with the PF's port netdev in it (the runtime's DEL comes later):
    the kernel hands the device back to the host under its pod name (CNI_IFNAME, the alias ADD
    set still on it), unlike a veth, which dies. DEL, with the netns gone, finds it by its bus
    device and gives it back its name, MAC, MTU and state."""
    entry = section(vm, "hd_pf_killed")
    ok(entry["add"])
    assert entry["pod_link"]["ifalias"] == entry["before"]["ifname"]
    refunded = entry["host_after_netns_del"]
    assert refunded is not None and refunded["ifalias"] == entry["before"]["ifname"], refunded
    assert refunded["parentdev"] == entry["before"]["parentdev"]
    dele = entry["del_gone"]
    assert dele["rc"] == 0 and dele["stdout"] is None, dele
    assert state_json(entry["files_after"]) == []
    assert entry["ipam_after"] == []
    assert_link_as_before(entry["before"], entry["after_del_gone"])
