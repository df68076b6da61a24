"""macvlan-rdma's config model and RDMA policy: pure logic, no kernel."""

import pytest

from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.rdma_policy import decide_shared
from rdmanet.plugins.macvlan_rdma.config import effective_mac, load_conf


def inv(config=None, args=None):
    base = {"cniVersion": "1.0.0", "name": "n", "type": "macvlan-rdma", "master": "ens1f0"}
    base.update(config or {})
    return Invocation(command="ADD", config=base, args=args or {})


def error_of(config):
    with pytest.raises(CNIError) as err:
        load_conf(inv(config))
    return err.value


def test_defaults():
    conf = load_conf(inv())
    assert (conf.mode, conf.mtu, conf.rdma, conf.linkInContainer) == ("bridge", 0, "auto", False)


def test_unknown_keys_from_multus_are_tolerated():
    conf = load_conf(inv({"deviceID": "0000:3b:00.2", "pciBusID": "0000:3b:00.2", "cni.dev/x": 1}))
    assert conf.master == "ens1f0"


@pytest.mark.parametrize("config,field,fix_word", [
    ({"mode": "bridged"}, "mode", "bridge, private, vepa, passthru"),
    ({"mode": 5}, "mode", "bridge"),
    ({"mtu": "1500"}, "mtu", "mtu"),
    ({"mtu": -1}, "mtu", "mtu"),
    ({"master": 7}, "master", "interface"),
    ({"master": "a" * 16}, "master", "interface"),
    ({"mac": "zz:00:00:00:00:01"}, "mac", "unicast"),
    ({"mac": "01:00:5e:00:00:01"}, "mac", "unicast"),
    ({"rdma": "yes"}, "rdma", "required"),
    ({"linkInContainer": "true"}, "linkInContainer", "true"),
    ({"ipam": {"range": "10.0.0.0/24"}}, "ipam.type", "IPAM"),
    ({"runtimeConfig": {"mac": 5}}, "runtimeConfig.mac", "MAC"),
])
def test_bad_fields_are_named_with_a_fix(config, field, fix_word):
    err = error_of(config)
    assert err.code == 7
    assert field in err.msg
    assert fix_word in err.details


def test_mac_precedence_config_args_runtime():
    conf_mac = {"mac": "0A:00:00:00:00:01"}
    assert effective_mac(load_conf(inv(conf_mac)), inv(conf_mac)) == "0a:00:00:00:00:01"
    i = inv(conf_mac, args={"MAC": "0a:00:00:00:00:02"})
    assert effective_mac(load_conf(i), i) == "0a:00:00:00:00:02"
    full = {**conf_mac, "runtimeConfig": {"mac": "0a:00:00:00:00:03"}}
    i = inv(full, args={"MAC": "0a:00:00:00:00:02"})
    assert effective_mac(load_conf(i), i) == "0a:00:00:00:00:03"


def test_bad_mac_in_cni_args_is_named():
    i = inv(args={"MAC": "nope"})
    with pytest.raises(CNIError) as err:
        effective_mac(load_conf(i), i)
    assert err.value.code == 7 and "CNI_ARGS MAC" in err.value.msg


class TestSharedPolicy:
    def test_auto_reports_single_device_in_shared_mode(self):
        assert decide_shared("auto", "ens1f0", ["mlx5_0"], "shared").device == "mlx5_0"

    def test_auto_without_device_is_quiet(self):
        d = decide_shared("auto", "veth0", [], None)
        assert d.device is None and not d.warning

    def test_auto_in_exclusive_mode_warns_and_reports_nothing(self):
        d = decide_shared("auto", "ens1f0", ["mlx5_0"], "exclusive")
        assert d.device is None and "exclusive" in d.warning

    def test_off_never_looks(self):
        assert decide_shared("off", "ens1f0", ["mlx5_0"], "exclusive").device is None

    @pytest.mark.parametrize("devices,mode,needle", [
        ([], "shared", "no RDMA device"),
        (["mlx5_0"], "exclusive", "rdma system set netns shared"),
        (["mlx5_0"], None, "modprobe"),
        (["mlx5_0", "mlx5_1"], "shared", "several"),
    ])
    def test_required_fails_with_the_fix(self, devices, mode, needle):
        with pytest.raises(CNIError) as err:
            decide_shared("required", "ens1f0", devices, mode)
        assert err.value.code == 101
        assert needle in err.value.msg + err.value.details

    def test_required_succeeds_in_shared_mode(self):
        assert decide_shared("required", "ens1f0", ["mlx5_0"], "shared").device == "mlx5_0"
