"""InfiniBand refusals against Debian's 6.1 kernel under qemu (the SAME boot as test_vm_rdma.py,
vm/shared_boot.py; the ``ipoib`` and ``hd_ib_vf`` sections of vm/guest_checks.py).

No kernel driver gives an InfiniBand port without hardware (rdma_rxe and siw have an Ethernet
link layer), so what the real kernel can answer is asked of it here:

- the ``ipoib`` link kind without ib_ipoib (its autoload refused by a modprobe.d rule, as on a
  node without the module): EOPNOTSUPP; with ib_ipoib loaded, a parent that is not an IPoIB netdev (veth, lo) or
  does not exist: ENODEV; no parent at all: EINVAL;
- ipoib-rdma ADD, run as a runtime runs it, with a fake sysfs tree that calls the veth the IPoIB
  netdev of a ConnectX-6 port (so every check before the kernel passes): the documented error
  100 in both module states, and nothing left (no link in the pod or the host, no address);
- a VF GUID request to a device that cannot take one (a netdevsim PF: no ndo_set_vf_guid):
  EOPNOTSUPP, and host-device-rdma ADD of an "IB VF" of it with runtimeConfig.infinibandGUID:
  error 100 naming the GUID and its source, the PF's VFs, the VF netdev, state and IPAM as before,
  no driver rebind.

Skipped like test_vm_rdma.py when the VM cannot run; a failed boot fails the tests.
"""

from __future__ import annotations

import errno

import pytest

try:
    from netns_tests.vm import harness, shared_boot
except ImportError:  # netns_tests not importable as a package: the test's dir is on sys.path
    from vm import harness, shared_boot  # type: ignore[no-redef]

_reason = harness.vm_available()
pytestmark = pytest.mark.skipif(_reason is not None, reason=f"test VM unavailable: {_reason}")
NO_MODULE = "create IPoIB child of master ibk0 (pkey 0x8001, mode datagram): the kernel has no ipoib link kind: ib_ipoib is not loaded"
NOT_IPOIB = "create IPoIB child of master ibk0 (pkey 0x8001, mode datagram): master ibk0 is not an IPoIB netdev"
NOTHING = {"host": [], "ipam": [], "pod": ["lo"]}


@pytest.fixture(scope="module")
def vm(request):
    return shared_boot.guest_report(request)


def section(vm, name: str) -> dict:
    return shared_boot.section(vm, name)


def plugin_error(call: dict) -> dict:
    assert call["rc"] not in (0, None), call
    assert "Traceback" not in call["stderr"], call["stderr"]
    return call["stdout"]


def test_ipoib_kind_without_ib_ipoib_is_eopnotsupp(vm):
    entry = section(vm, "ipoib")
    assert entry["module_before"] is False and entry["module_still_absent"] is True
    assert entry["errno_no_module"] == errno.EOPNOTSUPP
    lib = entry["lib_no_module"]
    assert lib["code"] == 100 and lib["msg"].endswith("the kernel has no ipoib link kind: ib_ipoib is not loaded"), lib
    assert "modprobe ib_ipoib" in lib["details"]


def test_ipoib_kind_with_ib_ipoib_refuses_what_is_not_an_ipoib_parent(vm):
    entry = section(vm, "ipoib")
    assert entry["module_after"] is True
    assert entry["errno_with_module"] == {
        "veth_parent": errno.ENODEV,
        "veth_parent_connected": errno.ENODEV,
        "lo_parent": errno.ENODEV,
        "no_parent": errno.EINVAL,
        "parent_9999": errno.ENODEV,
    }
    lib = entry["lib_with_module"]
    assert lib["code"] == 100 and "master ibk0 is not an IPoIB netdev" in lib["msg"] and "macvlan-rdma" in lib["details"]


def test_ipoib_rdma_add_without_the_module(vm):
    entry = section(vm, "ipoib")
    err = plugin_error(entry["add_no_module"])
    assert (err["code"], err["msg"]) == (100, NO_MODULE)
    assert entry["left_no_module"] == NOTHING


def test_ipoib_rdma_add_with_the_module_and_a_non_ipoib_parent(vm):
    entry = section(vm, "ipoib")
    err = plugin_error(entry["add_with_module"])
    assert (err["code"], err["msg"]) == (100, NOT_IPOIB)
    assert entry["left_with_module"] == NOTHING


def test_vf_guid_to_a_device_that_cannot_take_one(vm):
    entry = section(vm, "hd_ib_vf")
    pf = section(vm, "netdevsim")["pf"]
    lib = entry["lib"]
    assert lib["code"] == 100
    assert lib["msg"] == f"set node GUID 02:00:00:00:00:00:00:03 (from guid) on VF 3 of {pf}: Operation not supported"
    assert entry["read_back"] == [None, None]  # netdevsim has no ndo_get_vf_guid either


def test_host_device_rdma_on_an_ib_vf_that_cannot_take_the_guid(vm):
    entry = section(vm, "hd_ib_vf")
    pf = section(vm, "netdevsim")["pf"]
    err = plugin_error(entry["add"])
    assert err["code"] == 100
    assert err["msg"] == (f"set node GUID 02:00:00:00:00:00:00:03 (from runtimeConfig.infinibandGUID) on VF 3 of {pf}: "
                          "Operation not supported")
    vf3 = lambda vfinfo: [v for v in vfinfo if v["vf"] == 3]  # noqa: E731 - hd_vf changes VF 0 meanwhile
    assert vf3(entry["vfinfo_after"]) == vf3(entry["vfinfo_before"]) != []
    assert {k: v for k, v in entry["veth_after"].items() if k not in ("stats", "stats64")} == \
        {k: v for k, v in entry["veth_before"].items() if k not in ("stats", "stats64")}
    assert [f for f in entry["state_files"] if f.endswith(".json")] == [], entry["state_files"]  # locks/ may stay
    assert entry["ipam"] == [] and entry["pod_links"] == ["lo"]
    assert entry["rebind_files"] == []
