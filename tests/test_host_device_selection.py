"""host-device-rdma device selection over the fake SR-IOV host of test_sysfs.py.

The host (see ``build_sriov_host``): PF 0000:03:00.0 (ens2f0np0, sriov_numvfs=3), VF0
0000:03:00.2 (ens2f0v0, mlx5_core), VF1 0000:03:00.3 (vfio-pci), VF2 0000:03:00.4 (acme_vf, no
netdev), 0000:03:00.5 (a VF only a stale virtfn3 names), SF mlx5_core.sf.2 (enp3s0f0s2),
virtio-net 0000:00:03.0 (eth0), unbound 0000:00:04.0.
"""

from __future__ import annotations

import dataclasses

import pytest

from rdmanet.cni.core.errors import CNIError
from rdmanet.plugins.host_device_rdma.selection import DeviceRef, select_device
from test_sysfs import H_BARE, H_PF, build_sriov_host

MACS = {"0c:42:a1:00:00:02": "ens2f0v0", "0c:42:a1:00:00:00": "ens2f0np0"}


@pytest.fixture
def host(tmp_path):
    return build_sriov_host(tmp_path)


def select(host, **fields) -> DeviceRef:
    return select_device(fields, netdev_by_mac=MACS.get, root=host.root)


def fails(host, **fields) -> CNIError:
    with pytest.raises(CNIError) as e:
        select(host, **fields)
    return e.value


def text(err: CNIError) -> str:
    return f"{err.msg}\n{err.details}"


VF0 = DeviceRef(
    netdev="ens2f0v0", selector="deviceID", device_id="0000:03:00.2", kind="pci", pf_pci="0000:03:00.0",
    pf_netdev="ens2f0np0", vf_index=0, driver="mlx5_core", dpdk=False,
)

# ------------------------------------------------------------------ device IDs


def test_vf_by_device_id(host):
    assert select(host, deviceID="0000:03:00.2") == VF0


def test_upper_case_pci_address_is_lowered(host):
    assert select(host, deviceID="0000:03:00.2".upper()) == VF0


def test_pf_by_device_id(host):
    assert select(host, deviceID="0000:03:00.0") == DeviceRef(
        netdev="ens2f0np0", selector="deviceID", device_id="0000:03:00.0", kind="pci", pf_pci=None,
        pf_netdev=None, vf_index=None, driver="mlx5_core", dpdk=False,
    )


def test_vfio_vf_is_dpdk(host):
    assert select(host, deviceID="0000:03:00.3") == DeviceRef(
        netdev=None, selector="deviceID", device_id="0000:03:00.3", kind="pci", pf_pci="0000:03:00.0",
        pf_netdev="ens2f0np0", vf_index=1, driver="vfio-pci", dpdk=True,
    )


@pytest.mark.parametrize("driver", ["uio_pci_generic", "igb_uio"])
def test_other_dpdk_drivers(host, driver):
    host.driver(H_BARE, "pci", driver)
    ref = select(host, deviceID="0000:00:04.0")
    assert ref.dpdk and ref.netdev is None and ref.driver == driver and ref.pf_pci is None


def test_auxiliary_sf(host):
    assert select(host, deviceID="mlx5_core.sf.2") == DeviceRef(
        netdev="enp3s0f0s2", selector="deviceID", device_id="mlx5_core.sf.2", kind="auxiliary", pf_pci=None,
        pf_netdev=None, vf_index=None, driver="mlx5_core.sf", dpdk=False,
    )


def test_virtio_by_pci_bus_id(host):
    ref = select(host, pciBusID="0000:00:03.0")
    got = (ref.netdev, ref.selector, ref.kind, ref.driver, ref.dpdk)
    assert got == ("eth0", "pciBusID", "pci", "virtio-pci", False)


def test_runtime_config_device_id(host):
    ref = select(host, runtimeDeviceID="0000:03:00.2")
    assert ref == DeviceRef(**{**VF0.__dict__, "selector": "runtimeConfig.deviceID"})


def test_multus_device_id_equals_pci_bus_id(host):
    # Multus injects both (and the deviceID capability) with the same value
    assert select(host, deviceID="0000:03:00.2", pciBusID="0000:03:00.2", runtimeDeviceID="0000:03:00.2") == VF0
    assert select(host, deviceID="0000:03:00.2", pciBusID="0000:03:00.2".upper()) == VF0


def test_empty_values_are_not_given(host):
    assert select(host, deviceID="0000:03:00.2", pciBusID="", device=None) == VF0


@pytest.mark.parametrize(
    "fields, keys",
    [
        ({"deviceID": "0000:03:00.2", "pciBusID": "0000:03:00.0"}, ("deviceID", "pciBusID")),
        ({"deviceID": "0000:03:00.2", "runtimeDeviceID": "mlx5_core.sf.2"}, ("deviceID", "runtimeConfig.deviceID")),
        ({"pciBusID": "0000:03:00.2", "runtimeDeviceID": "0000:03:00.0"}, ("pciBusID", "runtimeConfig.deviceID")),
    ],
)
def test_different_device_ids_conflict(host, fields, keys):
    err = fails(host, **fields)
    assert err.code == 7
    for key in keys:
        assert key in err.msg
    for value in fields.values():
        assert value in err.msg
    assert "same value" in err.details and "remove" in err.details


# ------------------------------------------------------------------ device ID errors


@pytest.mark.parametrize("key, shown", [("deviceID", "deviceID"), ("pciBusID", "pciBusID"),
                                        ("runtimeDeviceID", "runtimeConfig.deviceID")])
@pytest.mark.parametrize("dev_id", ["0000:99:00.0", "mlx5_core.sf.9"])
def test_missing_device(host, key, shown, dev_id):
    err = fails(host, **{key: dev_id})
    assert err.code == 7
    assert err.msg == f"{shown} {dev_id}: no such PCI or auxiliary device"
    assert "resourceName" in err.details and "selectors" in err.details


@pytest.mark.parametrize("dev_id", ["03:00.2", "a/b", "..", "0000:03:00.8", "eth0", "x" * 3 + " y"])
def test_malformed_device_id(host, dev_id):
    err = fails(host, deviceID=dev_id)
    assert err.code == 7
    assert "deviceID" in err.msg and "not a PCI address" in err.msg
    assert "resourceName" in err.details


def test_short_pci_address_hint(host):
    assert "0000:03:00.2" in fails(host, deviceID="03:00.2").details


def test_device_id_wrong_type(host):
    err = fails(host, pciBusID=42)
    assert err.code == 7 and "pciBusID must be a string" in err.msg and "pciBusID" in err.details


def test_no_netdev_unknown_driver(host):
    err = fails(host, deviceID="0000:03:00.4")
    assert err.code == 7
    assert "deviceID 0000:03:00.4" in err.msg and '"acme_vf"' in err.msg
    assert "bind it to its kernel network driver" in err.details and "vfio-pci" in err.details


def test_no_netdev_no_driver(host):
    err = fails(host, deviceID="0000:00:04.0")
    assert err.code == 7 and "no driver bound" in err.msg and "bind it" in err.details


def test_sf_without_netdev(host):
    import shutil

    shutil.rmtree(f"{host.root}/{H_PF}/mlx5_core.sf.2/net")
    err = fails(host, deviceID="mlx5_core.sf.2")
    assert err.code == 7 and "deviceID mlx5_core.sf.2" in err.msg and "no netdev" in err.msg
    assert "activate" in err.details


def test_two_netdevs_need_device(host):
    host.netdev(H_PF, "ens2f0np0x")
    err = fails(host, deviceID="0000:03:00.0")
    assert err.code == 7 and "ens2f0np0, ens2f0np0x" in err.msg and "deviceID" in err.msg
    assert '"device"' in err.details
    # naming one of them with "device" agrees with the device ID
    ref = select(host, deviceID="0000:03:00.0", device="ens2f0np0x")
    assert (ref.netdev, ref.selector, ref.device_id) == ("ens2f0np0x", "deviceID", "0000:03:00.0")


def test_vf_index_not_found(host):
    # 0000:03:00.5 has physfn, but only virtfn3 names it and sriov_numvfs is 3
    err = fails(host, deviceID="0000:03:00.5")
    assert err.code == 7 and "deviceID" in err.msg and "0000:03:00.0" in err.msg
    assert "sriov_numvfs" in err.details


def test_vf_whose_virtfn_link_is_missing(host):
    import os

    os.unlink(f"{host.root}/{H_PF}/virtfn0")
    err = fails(host, device="ens2f0v0")
    assert err.code == 7 and err.msg.startswith("device:") and "virtfn" in err.msg


def test_vf_whose_pf_has_no_netdev(host):
    import shutil

    shutil.rmtree(f"{host.root}/{H_PF}/net")
    ref = select(host, deviceID="0000:03:00.2")
    assert (ref.pf_pci, ref.pf_netdev, ref.vf_index) == ("0000:03:00.0", None, 0)


def test_sysfs_loop_is_io_failure(host):
    import os

    vf0 = f"{host.root}/sys/bus/pci/devices/0000:03:00.2"
    os.unlink(f"{vf0}/physfn")
    os.symlink("physfn", f"{vf0}/physfn")  # physfn -> physfn
    err = fails(host, deviceID="0000:03:00.2")
    assert err.code == 5 and "sysfs" in err.msg and "symbolic links" in err.msg


# ------------------------------------------------------------------ name selectors


def test_device_by_name(host):
    assert select(host, device="ens2f0v0") == DeviceRef(**{**VF0.__dict__, "selector": "device"})


def test_device_not_in_sysfs_is_taken_as_given(host):
    # the plugin checks existence over netlink; a virtual or unknown name has no device ID
    assert select(host, device="dummy0") == DeviceRef(
        netdev="dummy0", selector="device", device_id=None, kind=None, pf_pci=None, pf_netdev=None,
        vf_index=None, driver=None, dpdk=False,
    )


def test_device_sf_and_virtio_by_name(host):
    sf = select(host, device="enp3s0f0s2")
    assert (sf.kind, sf.device_id, sf.driver, sf.pf_pci) == ("auxiliary", "mlx5_core.sf.2", "mlx5_core.sf", None)
    virtio = select(host, device="eth0")
    assert (virtio.kind, virtio.device_id, virtio.driver) == ("pci", "0000:00:03.0", "virtio-pci")


@pytest.mark.parametrize("name", ["a/b", "..", "with space", "a:b", "x" * 16])
def test_invalid_device_name(host, name):
    err = fails(host, device=name)
    assert err.code == 7 and "device" in err.msg and "interface name" in err.details


def test_hwaddr(host):
    assert select(host, hwaddr="0C-42-A1-00-00-02") == DeviceRef(**{**VF0.__dict__, "selector": "hwaddr"})


def test_hwaddr_callback_gets_lower_case_colon_form(host):
    seen = []
    by_mac = lambda m: seen.append(m) or "ens2f0np0"  # noqa: E731
    select_device({"hwaddr": "0C:42:A1:00:00:00"}, netdev_by_mac=by_mac, root=host.root)
    assert seen == ["0c:42:a1:00:00:00"]


def test_hwaddr_not_found(host):
    err = fails(host, hwaddr="0c:42:a1:ff:ff:ff")
    assert err.code == 7 and "hwaddr 0c:42:a1:ff:ff:ff" in err.msg and '"device"' in err.details


def test_kernelpath(host):
    ref = select(host, kernelpath="/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.2")
    assert ref == DeviceRef(**{**VF0.__dict__, "selector": "kernelpath"})


def test_kernelpath_sf(host):
    ref = select(host, kernelpath="/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0/mlx5_core.sf.2")
    assert (ref.netdev, ref.kind, ref.device_id) == ("enp3s0f0s2", "auxiliary", "mlx5_core.sf.2")


@pytest.mark.parametrize(
    "path, words",
    [
        ("/sys/class/net/ens2f0v0", ["/sys/devices/"]),
        ("/sys/devices/../class", [".."]),
        ("/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.3", ["no netdev"]),
        ("/sys/devices/nosuch", ["no netdev"]),
    ],
)
def test_kernelpath_errors(host, path, words):
    err = fails(host, kernelpath=path)
    assert err.code == 7 and "kernelpath" in err.msg and "kernelpath" in err.details
    for w in words:
        assert w in err.msg


def test_kernelpath_two_netdevs(host):
    host.netdev(H_PF, "ens2f0np0x")
    err = fails(host, kernelpath=f"/{H_PF}")
    assert err.code == 7 and "ens2f0np0, ens2f0np0x" in err.msg and '"device"' in err.details


# ------------------------------------------------------------------ combinations


def test_nothing_given(host):
    err = fails(host)
    assert err.code == 7
    for key in ("device", "hwaddr", "kernelpath", "pciBusID", "deviceID"):
        assert key in err.msg
    assert "resourceName" in err.details


def test_only_empty_values_is_nothing_given(host):
    assert fails(host, device="", deviceID=None).msg.startswith("no device selected")


def test_name_and_device_id_agree(host):
    ref = select(host, device="ens2f0v0", deviceID="0000:03:00.2", pciBusID="0000:03:00.2")
    assert ref == VF0  # the device ID key is reported


def test_name_and_device_id_disagree(host):
    err = fails(host, device="ens2f0np0", deviceID="0000:03:00.2")
    assert err.code == 7
    for word in ("device", "ens2f0np0", "deviceID", "0000:03:00.2", "ens2f0v0"):
        assert word in err.msg
    assert "only one" in err.details


def test_name_given_for_dpdk_device_id(host):
    err = fails(host, device="ens2f0v0", pciBusID="0000:03:00.3")
    assert err.code == 7 and "pciBusID" in err.msg and "no netdev (DPDK mode)" in err.msg


def test_two_name_selectors_agree(host):
    ref = select(host, device="ens2f0v0", hwaddr="0c:42:a1:00:00:02",
                 kernelpath="/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.2")
    assert ref == DeviceRef(**{**VF0.__dict__, "selector": "device"})


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"device": "ens2f0v0", "hwaddr": "0c:42:a1:00:00:00"}, ["device", "ens2f0v0", "hwaddr", "ens2f0np0"]),
        ({"hwaddr": "0c:42:a1:00:00:02", "kernelpath": f"/{H_PF}"}, ["hwaddr", "ens2f0v0", "kernelpath", "ens2f0np0"]),
    ],
)
def test_two_name_selectors_disagree(host, fields, words):
    err = fails(host, **fields)
    assert err.code == 7
    for w in words:
        assert w in err.msg
    assert "only one" in err.details


def test_device_ref_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        VF0.netdev = "x"  # type: ignore[misc]
