"""SR-IOV VF settings (rdmanet/cni/linux/vf_settings.py) against a real kernel: netdevsim VFs in the test VM.

Debian's kernel has no netdevsim, so prepare.sh builds netdevsim.ko out of tree once per kernel;
in the SAME boot as the rxe checks (vm/shared_boot.py, shared with test_vm_rdma.py) the guest loads
it, creates ``netdevsim10`` with one port and 4 VFs, and runs the VF sections of
``vm/guest_checks.py``: apply sriov-cni's knobs to VF 1 through the PF, read them back with
``read_vf`` and with ``ip -d -j link show`` (``vfinfo_list``), restore the snapshot after a JSON
round trip and compare the PF's whole ``vfinfo_list`` with the one before.

Skipped like test_vm_rdma.py when the VM cannot run at all. When it can, a missing netdevsim.ko
(prepare.sh could not build it) FAILS these tests with prepare.sh's reason: it is not a skip.
"""

from __future__ import annotations

import errno

import pytest

try:
    from netns_tests.vm import harness, shared_boot
except ImportError:  # netns_tests not importable as a package: the test's dir is on sys.path
    from vm import harness, shared_boot  # type: ignore[no-redef]

VF, VF_AD, NUM_VFS = 1, 2, 4
MAC = "02:5a:00:00:00:01"

_reason = harness.vm_available()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"test VM unavailable: {_reason}")


@pytest.fixture(scope="module")
def vm(request):
    return shared_boot.guest_report(request)


def section(vm, name: str) -> dict:
    return shared_boot.section(vm, name)


def without(vfinfo: list, *indexes: int) -> list:
    return [v for v in vfinfo if v["vf"] not in indexes]


def test_netdevsim_module_was_built():
    ko, why = harness.netdevsim_module()
    assert ko is not None, why


def test_netdevsim_pf_has_4_vfs(vm):
    entry = section(vm, "netdevsim")
    assert entry["sriov_numvfs"] == NUM_VFS
    assert [v["vf"] for v in entry["vfinfo_before"]] == list(range(NUM_VFS))
    # netdevsim's VFs start with spoofchk off; the guest turned it on for VF 1 with the ip tool,
    # like a real NIC's default, so that apply/restore have to change it both ways
    assert entry["vfinfo_initial"][VF]["spoofchk"] is False
    assert entry["vfinfo_before"][VF]["spoofchk"] is True
    assert without(entry["vfinfo_before"], VF) == without(entry["vfinfo_initial"], VF)


def test_read_vf_agrees_with_ip_tool(vm):
    before = section(vm, "netdevsim")["vfinfo_before"][VF]
    read = section(vm, "vf_apply")["read_before"]
    assert read == {
        "mac": before["address"],
        "vlan": before["vlan_list"][0].get("vlan", 0),
        "qos": before["vlan_list"][0].get("qos", 0),
        "vlan_proto": "802.1q",
        "spoofchk": before["spoofchk"],
        "trust": before["trust"],
        "link_state": before["link_state"],
        "min_tx_rate": before["rate"]["min_tx"],
        "max_tx_rate": before["rate"]["max_tx"],
    }


def test_apply_vf_reads_back_in_lib_and_ip_tool(vm):
    entry = section(vm, "vf_apply")
    assert entry["read_after"] == {
        "mac": MAC, "vlan": 100, "qos": 3, "vlan_proto": "802.1q", "spoofchk": False, "trust": True,
        "link_state": "disable", "min_tx_rate": 10, "max_tx_rate": 100,
    }
    vf = entry["vfinfo_after"][VF]
    assert vf["address"] == MAC
    assert vf["vlan_list"] == [{"vlan": 100, "qos": 3}]
    assert vf["rate"] == {"max_tx": 100, "min_tx": 10}
    assert vf["spoofchk"] is False and vf["trust"] is True and vf["link_state"] == "disable"
    # nothing else moved
    before = section(vm, "netdevsim")["vfinfo_before"]
    assert without(entry["vfinfo_after"], VF) == without(before, VF)


def test_apply_vf_snapshot_is_exactly_the_previous_values(vm):
    entry = section(vm, "vf_apply")
    # every knob differed from VF 1's state, so the snapshot holds each previous value
    assert entry["snapshot"] == entry["read_before"]
    # applying the same settings again changes nothing and snapshots nothing
    assert entry["snapshot_again"] == {}


def test_restore_vf_gives_back_the_same_vfinfo_list(vm):
    before = section(vm, "netdevsim")["vfinfo_before"]
    entry = section(vm, "vf_restore")
    assert entry["vfinfo_after"] == before
    assert entry["read_after"] == section(vm, "vf_apply")["read_before"]


def test_8021ad_through_the_vlan_list(vm):
    entry = section(vm, "vf_8021ad")
    assert entry["snapshot"] == {"vlan": 0, "qos": 0, "vlan_proto": "802.1q"}
    assert {k: entry["read_after"][k] for k in ("vlan", "qos", "vlan_proto")} == {"vlan": 200, "qos": 5, "vlan_proto": "802.1ad"}
    assert entry["vfinfo_after"][VF_AD]["vlan_list"] == [{"vlan": 200, "qos": 5, "protocol": "802.1ad"}]
    assert without(entry["vfinfo_after"], VF_AD) == without(entry["vfinfo_before"], VF_AD)
    assert entry["vfinfo_restored"] == entry["vfinfo_before"]


def test_pyroute2_own_vlan_list_is_refused(vm):
    """The reason for vf_settings.VlanListMsg. When this fails, pyroute2 sends the whole
    struct ifla_vf_vlan_info and vf={"vlan": [...]} could be used again."""
    entry = section(vm, "vf_8021ad")
    assert entry["pyroute2_vlan_list_errno"] == errno.EINVAL
    assert entry["vfinfo_after_pyroute2"] == entry["vfinfo_restored"]


def test_out_of_range_vf_is_a_clear_error(vm):
    entry = section(vm, "vf_errors")
    pf = section(vm, "netdevsim")["pf"]
    for key in ("read_missing", "apply_missing"):
        err = entry[key]
        assert err.get("code") == 100, err
        assert err["msg"] == f"VF {NUM_VFS} of {pf} does not exist: {pf} reports VFs 0-{NUM_VFS - 1}", err
        assert f"sriov_numvfs ({NUM_VFS})" in err["details"], err
    # the kernel's own answer, and how apply_vf words it when the request gets that far
    assert entry["kernel_missing_errno"] == errno.EINVAL
    err = entry["apply_missing_in_kernel"]
    assert err.get("code") == 100, err
    assert err["msg"] == f"enable trust on VF {NUM_VFS} of {pf}: Invalid argument", err
    assert "not below its sriov_numvfs" in err["details"]


def test_driver_refusals_are_named_and_undone(vm):
    entry = section(vm, "vf_errors")
    pf = section(vm, "netdevsim")["pf"]
    assert entry["qos8"] == f"set vlan 100 qos 8 proto 802.1q on VF {VF} of {pf}: Invalid argument"
    # netdevsim refuses VF rates in switchdev mode: the VLAN set just before is undone
    err = entry["rates_switchdev"]
    assert err.get("code") == 100, err
    assert err["msg"] == f"set min_tx_rate 1 max_tx_rate 2 Mbps on VF 3 of {pf}: Operation not supported", err
    assert "remove min_tx_rate / max_tx_rate from the network config" in err["details"]
    assert "(vlan) were restored" in err["details"], err
    assert entry["vfinfo_after"] == entry["vfinfo_before"]
