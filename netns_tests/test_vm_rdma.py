"""rdmanet's RDMA code against a real RDMA netlink: Debian's kernel under qemu with rdma_rxe.

This host's kernel has no RDMA core, so ONE VM boot per session (vm/shared_boot.py, shared with
test_vm_vf.py) runs ``vm/guest_checks.py`` with the venv's interpreter inside the guest (soft-RoCE
``rxe0`` on a veth); it writes one JSON report, and each test below asserts one part of it on the host. See
``vm/harness.py`` for the VM, and each test for the kernel facts it relies on.

The whole module is skipped, with the reason, when the VM cannot run (not root, prepare.sh
failed, qemu missing). When it can, the boot must succeed: a failed boot fails the tests.
"""

from __future__ import annotations

import errno

import pytest

try:
    from netns_tests.vm import harness, shared_boot
except ImportError:  # netns_tests not importable as a package: the test's dir is on sys.path
    from vm import harness, shared_boot  # type: ignore[no-redef]

RXE, NETDEV = "rxe0", "rxenet0"
SHARED_FIX = "rdma system set netns shared"

_reason = harness.vm_available()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"test VM unavailable: {_reason}")


@pytest.fixture(scope="module")
def vm(request):
    """The parsed guest report (and the run) of the session's one VM boot, shared with
    test_vm_vf.py (vm/shared_boot.py): the first module to ask boots."""
    return shared_boot.guest_report(request)


def section(vm, name: str) -> dict:
    report, run = vm
    entry = report.get(name)
    assert entry is not None, f"no {name!r} in the guest report:\n{run.describe()}"
    assert entry["ok"], f"guest section {name!r} failed:\n{entry.get('error')}\nimport: {report.get('import_error')}"
    return entry


def test_guest_runs_debian_kernel_and_venv_python(vm):
    report, _ = vm
    assert report["kernel"] == harness._vm_env()["RDMANET_VM_KVER"]
    assert report["python"] == harness.VENV_PYTHON


def test_setup_rxe_on_veth(vm):
    entry = section(vm, "setup")
    assert f"link {RXE}/1" in entry["rdma_link"] and f"netdev {NETDEV}" in entry["rdma_link"]


def test_netns_mode_shared_by_default_matches_rdma_tool(vm):
    entry = section(vm, "mode")
    assert entry["lib"] == "shared"
    assert entry["tool"] == entry["lib"], entry["rdma_system_show"]


def test_list_devices_matches_rdma_tool(vm):
    entry = section(vm, "devices")
    assert entry["lib"] == entry["tool"]
    rxe = [d for d in entry["lib"] if d["name"] == RXE]
    assert len(rxe) == 1
    assert entry["by_name"] == rxe[0]
    assert entry["by_name_missing"] is None
    assert entry["socket"] == {"mode": "shared", "names": [d["name"] for d in entry["lib"]]}


def test_sysfs_rdma_devices_for_rxe_netdev(vm):
    entry = section(vm, "sysfs")
    assert entry["parent_file"] == NETDEV
    assert entry["has_device_link"] is False  # rxe is virtual: found through its parent file
    assert entry["netdev"] == [RXE]
    assert entry["peer"] == []
    assert entry["lo"] == []
    assert entry["pci_address"] is None


def test_move_device_request_reaches_driver_check(vm):
    """A well-formed SET with a valid netns fd gets past the fd, index and capability checks
    to the driver check, which rxe fails (no disassociate_ucontext)."""
    entry = section(vm, "move")
    assert entry["good_request"] == errno.EOPNOTSUPP, entry
    assert entry["bad_index"] in (errno.ENODEV, errno.EINVAL), entry
    assert entry["bad_fd"] in (errno.EBADF, errno.EINVAL), entry
    assert entry["still_in_init_netns"] is True


def test_macvlan_rdma_add_reports_rxe_and_del_cleans_up(vm):
    entry = section(vm, "plugin")
    assert entry["cni_path_has_host_local"], "host-local missing from /usr/lib/cni (containernetworking-plugins)"
    add = entry["add"]
    assert add["rc"] == 0, add
    result = add["stdout"]
    assert result["cniVersion"] == "1.0.0"
    assert [i["name"] for i in result["interfaces"]] == ["net1"]
    address = result["ips"][0]["address"]
    assert address.startswith("198.18.5.") and address.endswith("/24")
    # rxe0 has no PCI parent and a "pci" device-info file needs pci-address (device-info-spec
    # 1.1.0), so the device is reported in the log and no device-info file is invented
    assert f"shared RDMA device {RXE} of master" in add["stderr"], add["stderr"]
    assert "FileNotFoundError" in entry["devinfo"], entry["devinfo"]
    assert entry["link"]["kind"] == "macvlan" and entry["link"]["macvlan_mode"] == "bridge"
    assert entry["link"]["ipv4"] == [address]
    assert address.split("/")[0] in entry["ipam_files"]
    # the pod's macvlan shows up in rxe0's RoCE GID table under its pod-side name
    ip4 = address.split("/")[0]
    mapped = "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}".format(*map(int, ip4.split(".")))
    assert any(g["gid"] == mapped and g["type"] == "RoCE v2" for g in entry["gids"]), entry["gids"]
    dele = entry["del"]
    assert dele["rc"] == 0 and dele["stdout"] is None, dele
    assert entry["link_after_del"] is None
    assert ip4 not in entry["ipam_files_after_del"]


def test_exclusive_mode_required_rdma_fails_101(vm):
    entry = section(vm, "exclusive")
    assert entry["set_rc"] == 0, entry["set_stderr"]
    assert "netns exclusive" in entry["rdma_system_show"]
    assert entry["lib"] == "exclusive"
    assert entry["move_good_request"] == errno.EOPNOTSUPP
    add = entry["add"]
    assert add["rc"] != 0, add
    err = add["stdout"]
    assert err["code"] == 101, err
    assert SHARED_FIX in err["msg"] + " " + err.get("details", ""), err
    # nothing half-created: no link, no device-info file, no IP reservation
    assert entry["link_after_failed_add"] is None
    assert entry["devinfo_written"] is False
    assert [f for f in entry["ipam_files"] if f[0].isdigit()] == []
