"""The node policy's device allow-lists (rdmanet.cni.linux.device_policy), kubeconfigs by file,
and the policy as a file says it: pure logic, no kernel (the real-kernel side is in
netns_tests/test_tenant_devices.py)."""

from __future__ import annotations

import json
import os

import pytest

from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.linux import device_policy as dp
from rdmanet.cni.linux import roots
from policy_file import write_policy

VF = dp.Device("ens1f0v2", pci="0000:3b:00.2", pf_pci="0000:3b:00.0", pf_netdev="ens1f0", vendor_device="15b3:101e")


def rules(doc, key="hostDevices"):
    return dp.rules_from_json(doc, key, host_in_use=key == "hostDevices")


@pytest.mark.parametrize("rule, matches", [
    ({"name": "ens1f0v2"}, True), ({"name": "ens1f0v*"}, True), ({"name": "ens2*"}, False),
    ({"pciAddress": "0000:3B:00.2"}, True), ({"pciAddress": "0000:3b:00.3"}, False),
    ({"pf": "ens1f0"}, True), ({"pf": "0000:3b:00.0"}, True), ({"pf": "ens2f0"}, False),
    ({"vendorDevice": "15B3:101E"}, True), ({"vendorDevice": "15b3:1017"}, False),
    ({"pf": "ens1f0", "vendorDevice": "15b3:1017"}, False),  # every key given must match
])
def test_a_rule_matches_when_every_key_it_gives_does(rule, matches):
    (parsed,) = rules([rule])
    assert parsed.matches(VF) is matches


@pytest.mark.parametrize("doc, key, problem", [
    ({"name": "x"}, "hostDevices", "must be a list"),
    ([{}], "hostDevices", "hostDevices[0] must be an object"),
    ([{"hostInUse": True}], "hostDevices", "names no device"),
    ([{"nmae": "x"}], "masters", "unknown keys ['nmae']"),
    ([{"name": "x", "hostInUse": True}], "masters", "unknown keys ['hostInUse']"),  # masters are not taken
    ([{"pciAddress": "3b:00.2"}], "hostDevices", "is not a PCI address"),
    ([{"vendorDevice": "mellanox"}], "hostDevices", "is not vendor:device"),
    ([{"name": ""}], "hostDevices", "must be a non-empty string"),
    ([{"name": "x", "hostInUse": "yes"}], "hostDevices", "must be true or false"),
])
def test_bad_rules_are_refused_naming_the_entry(doc, key, problem):
    with pytest.raises(ValueError) as err:
        rules(doc, key)
    assert problem in str(err.value)


def test_the_policy_reads_and_says_its_allow_lists(tmp_path):
    path = write_policy(tmp_path / "p.json", hostDevices=[{"pf": "ens1f0"}, {"name": "eth5", "hostInUse": True}],
                        hostDevicesFromDeviceID=False, masters=[{"name": "ens*"}], rdmaMasters=False,
                        kubeconfigs=["/etc/cni/net.d/lease.kubeconfig"], leaseNamespaces=None)
    policy = roots.load_policy_file(str(path))
    assert policy.host_devices == (dp.Rule(pf="ens1f0"), dp.Rule(name="eth5", host_in_use=True))
    assert (policy.host_devices_from_device_id, policy.rdma_masters, policy.lease_namespaces) == (False, False, None)
    doc = policy.to_json()
    assert doc["hostDevices"] == [{"pf": "ens1f0"}, {"name": "eth5", "hostInUse": True}]
    assert doc["masters"] == [{"name": "ens*"}] and doc["kubeconfigs"] == ["/etc/cni/net.d/lease.kubeconfig"]
    assert roots.policy_from_dict(json.loads(json.dumps(doc)), "again") == policy  # what the demo writes back


@pytest.mark.parametrize("content, problem", [
    ({"kubeconfigRoots": ["/etc/cni/net.d"]}, "kubeconfigRoots is no longer read: use kubeconfigs"),
    ({"hostDevices": [{"name": "x", "hostInuse": True}]}, "unknown keys ['hostInuse']"),
    ({"rdmaMasters": "no"}, "rdmaMasters must be true or false"),
    ({"kubeconfigs": "/etc/x"}, "kubeconfigs must be a list of absolute files"),
])
def test_unusable_allow_lists_make_the_policy_file_unusable(tmp_path, content, problem):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(content))
    os.chmod(path, 0o600)
    with pytest.raises(roots.PolicyError) as err:
        roots.load_policy_file(str(path))
    assert problem in str(err.value)


# --------------------------------------------------------------------------- the checks

DEFAULTS = roots.NodePolicy()


def refused(fn, *args, **kw) -> CNIError:
    with pytest.raises(CNIError) as err:
        fn(*args, **kw)
    assert err.value.code == 7
    return err.value


def test_by_default_only_the_device_a_device_id_names_moves():
    dp.check_host_device(DEFAULTS, "deviceID", VF, True, [])
    err = refused(dp.check_host_device, DEFAULTS, "device", VF, False, [])
    assert err.msg.startswith("invalid network config: device: host-device-rdma may not move ens1f0v2: it is not the "
                              "device the device plugin allocated (deviceID) and no hostDevices rule")
    assert '"hostDevices": [{"name": "ens1f0v2"}]' in err.details
    strict = roots.NodePolicy(host_devices_from_device_id=False)
    err = refused(dp.check_host_device, strict, "runtimeConfig.deviceID", VF, True, [])
    assert "hostDevicesFromDeviceID: false" in err.msg


def test_a_device_the_host_uses_moves_only_with_host_in_use():
    uses = ["it carries the host address 10.0.0.5/24", "it is the link of the host's default route"]
    err = refused(dp.check_host_device, DEFAULTS, "deviceID", VF, True, uses)  # even the device plugin's
    assert err.msg == ("invalid network config: deviceID: host-device-rdma does not move ens1f0v2, the host uses it: "
                       "it carries the host address 10.0.0.5/24; it is the link of the host's default route")
    assert '"hostDevices": [{"name": "ens1f0v2", "hostInUse": true}]' in err.details
    listed = roots.NodePolicy(host_devices=rules([{"pf": "ens1f0"}]))
    refused(dp.check_host_device, listed, "device", VF, False, uses)
    explicit = roots.NodePolicy(host_devices=rules([{"pf": "ens1f0"}, {"name": "ens1f0v2", "hostInUse": True}]))
    dp.check_host_device(explicit, "device", VF, False, uses)


def test_masters_are_links_with_an_rdma_device_or_listed():
    eth = dp.Device("eth1")
    dp.check_master(DEFAULTS, "master", VF, ["mlx5_2"])
    err = refused(dp.check_master, DEFAULTS, "master", eth, [])
    assert err.msg.startswith("invalid network config: master: eth1 is not a master this node allows: it has no RDMA "
                              "device, and no masters rule of the node policy (built-in defaults) matches it")
    assert '"masters": [{"name": "eth1"}]' in err.details
    dp.check_master(roots.NodePolicy(masters=rules([{"name": "eth*"}], "masters")), "master", eth, [])
    err = refused(dp.check_master, roots.NodePolicy(rdma_masters=False), "master", VF, ["mlx5_2"])
    assert "rdmaMasters: false" in err.msg


def test_the_default_route_link_is_a_master_only_when_listed():
    eth = dp.Device("eth0")
    err = refused(dp.check_master, DEFAULTS, "master", eth, ["mlx5_0"], defaulted=True)  # even with an RDMA device
    assert err.msg.startswith("invalid network config: master is not set, and the default-route link eth0 is taken as "
                              "master only when the node policy (built-in defaults) lists it in masters")
    dp.check_master(roots.NodePolicy(masters=rules([{"name": "eth0"}], "masters")), "master", eth, [], defaulted=True)


# --------------------------------------------------------------------------- kubeconfigs by file


def test_kubeconfigs_are_listed_by_file_not_by_root():
    files = DEFAULTS.kubeconfigs
    placed = roots.place_kubeconfig("k", "/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig", files)
    assert placed == roots.Placed("/etc/cni/net.d/rdmanet.d", ("rdmanet.kubeconfig",))
    for bad in ("/etc/cni/net.d/multus.d/multus.kubeconfig", "/etc/cni/net.d/rdmanet.d/other.kubeconfig",
                "/etc/cni/net.d/rdmanet.d/../multus.d/multus.kubeconfig", "relative.kubeconfig"):
        err = refused(roots.place_kubeconfig, "ipam.kubernetes.kubeconfig", bad, files)
        assert err.msg.startswith(f"invalid network config: ipam.kubernetes.kubeconfig: {bad!r} is not a kubeconfig "
                                  "this node lets a network config name (kubeconfigs: /etc/cni/net.d/rdmanet.d/")


def test_a_kubeconfig_pattern_is_checked_below_its_literal_directory(tmp_path):
    (tmp_path / "kube" / "team").mkdir(parents=True)
    (tmp_path / "kube" / "team" / "a.kubeconfig").write_text("apiVersion: v1\n")
    pattern = f"{tmp_path}/kube/*/*.kubeconfig"
    placed = roots.place_kubeconfig("k", str(tmp_path / "kube" / "team" / "a.kubeconfig"), [pattern])
    assert placed == roots.Placed(str(tmp_path / "kube"), ("team", "a.kubeconfig"))
    policy = roots.NodePolicy(kubeconfigs=(pattern,))
    assert roots.read_file("kubeconfig", "k", str(tmp_path / "kube" / "team" / "a.kubeconfig"), policy=policy)
    os.chmod(tmp_path / "kube" / "team", 0o777)  # a component the pattern leaves open, writable by others
    err = refused(roots.read_file, "kubeconfig", "k", str(tmp_path / "kube" / "team" / "a.kubeconfig"), policy=policy)
    assert "writable by nobody else" in err.details
