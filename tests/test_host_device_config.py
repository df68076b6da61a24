"""host-device-rdma's config model and the exclusive-mode RDMA policy: pure logic, no kernel."""

import itertools

import pytest

from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.rdma_policy import EXCLUSIVE, EXCLUSIVE_MODE_FIX, SHARED, decide_exclusive
from rdmanet.plugins.host_device_rdma.config import DEFAULT_STATE_DIR, effective_mac, load_conf
from rdmanet.cni.linux import roots
from policy_file import write_policy


def inv(config=None, args=None):
    base = {"cniVersion": "1.0.0", "name": "n", "type": "host-device-rdma", "device": "ens1f0v0"}
    base.update(config or {})
    return Invocation(command="ADD", config=base, args=args or {})


def error_of(config):
    with pytest.raises(CNIError) as err:
        load_conf(inv(config))
    return err.value


# --------------------------------------------------------------------------- the config model


def test_defaults(monkeypatch):
    monkeypatch.delenv(roots.POLICY_ENV)  # no node policy file: the built-in defaults
    monkeypatch.setattr(roots, "DEFAULT_POLICY_FILE", "/nonexistent/rdmanet-node-policy.json")
    conf = load_conf(inv())
    assert (conf.mtu, conf.rdma, conf.stateDir, conf.mac) == (0, "auto", DEFAULT_STATE_DIR, None)
    assert DEFAULT_STATE_DIR == "/var/lib/cni/host-device-rdma"
    assert not conf.vf_knobs_set()


def test_state_dir_is_the_nodes_and_a_config_cannot_move_it(tmp_path, monkeypatch):
    node_dir = tmp_path / "node-hd"
    monkeypatch.setenv(roots.POLICY_ENV, str(write_policy(tmp_path / "policy.json", hostDeviceStateDir=str(node_dir))))
    assert load_conf(inv()).stateDir == str(node_dir)
    assert load_conf(inv({"stateDir": str(node_dir) + "/"})).stateDir == str(node_dir)  # the same directory: accepted
    err = error_of({"stateDir": "/proc/1/root/tmp/tenant"})
    assert err.code == 7 and "stateDir" in err.msg and "/proc/1/root/tmp/tenant" in err.msg and str(node_dir) in err.msg
    assert "remove stateDir" in err.details
    # DEL must still undo an ADD: the config's stateDir is ignored, the node's directory used
    deleting = Invocation(command="DEL", config={**inv().config, "stateDir": "/tmp/tenant"})
    assert load_conf(deleting).stateDir == str(node_dir)


def test_what_multus_injects_is_accepted():
    conf = load_conf(inv({"deviceID": "0000:3b:00.2", "pciBusID": "0000:3b:00.2", "cni.dev/x": 1,
                          "runtimeConfig": {"deviceID": "0000:3b:00.2", "CNIDeviceInfoFile": "/var/run/x"}}))
    assert (conf.deviceID, conf.pciBusID, conf.runtimeConfig.deviceID) == ("0000:3b:00.2",) * 3


def test_valid_vf_knobs():
    conf = load_conf(inv({"vlan": 4094, "vlanQoS": 7, "vlanProto": "802.1AD", "spoofchk": "off", "trust": "on",
                          "link_state": "enable", "min_tx_rate": 0, "max_tx_rate": 1000, "mtu": 9000,
                          "mac": "0A-58-0A-01-01-05"}))
    assert conf.vlanProto == "802.1ad" and conf.mac == "0a:58:0a:01:01:05"
    assert conf.vf_knobs_set()


@pytest.mark.parametrize("config, field, fix_word", [
    pytest.param({"vlan": 5000}, "vlan", "0-4094", id="vlan-5000"),
    pytest.param({"vlan": -1}, "vlan", "0-4094", id="vlan-negative"),
    pytest.param({"vlanQoS": 9}, "vlanQoS", "0-7", id="vlanQoS-9"),
    pytest.param({"vlanProto": "802.1x"}, "vlanProto", '"802.1q" or "802.1ad"', id="vlanProto-802.1x"),
    pytest.param({"spoofchk": "yes"}, "spoofchk", '"on" or "off"', id="spoofchk-yes"),
    pytest.param({"trust": True}, "trust", '"on" or "off"', id="trust-bool"),
    pytest.param({"link_state": "up"}, "link_state", '"auto", "enable" or "disable"', id="link_state-up"),
    pytest.param({"mtu": "1500"}, "mtu", "MTU", id="mtu-string"),
    pytest.param({"mtu": 70000}, "mtu", "MTU", id="mtu-70000"),
    pytest.param({"mac": "01:00:5e:00:00:01"}, "mac", "unicast", id="mac-multicast"),
    pytest.param({"mac": "zz:00:00:00:00:01"}, "mac", "unicast", id="mac-garbage"),
    pytest.param({"hwaddr": "ff:ff:ff:ff:ff:ff"}, "hwaddr", "MAC", id="hwaddr-broadcast"),
    pytest.param({"stateDir": "var/lib/cni/hd"}, "stateDir", "remove stateDir", id="stateDir-relative"),
    pytest.param({"stateDir": 5}, "stateDir", "node owner", id="stateDir-number"),
    pytest.param({"rdma": "yes"}, "rdma", '"required"', id="rdma-yes"),
    pytest.param({"device": "a" * 16}, "device", "interface name", id="device-too-long"),
    pytest.param({"min_tx_rate": -5}, "min_tx_rate", "Mbps", id="min_tx_rate-negative"),
    pytest.param({"ipam": {"range": "10.0.0.0/24"}}, "ipam.type", "IPAM", id="ipam-without-type"),
    pytest.param({"runtimeConfig": {"deviceID": 7}}, "runtimeConfig.deviceID", "PCI address", id="runtime-deviceID"),
])
def test_bad_fields_are_named_with_a_fix(config, field, fix_word):
    err = error_of(config)
    assert err.code == 7
    assert err.msg.startswith("invalid network config: ")
    assert f" {field}:" in err.msg, err.msg
    assert fix_word in err.details, err.details


def test_multicast_mac_message_says_why():
    err = error_of({"mac": "01:00:5e:00:00:01"})
    assert "multicast" in err.msg


def test_every_bad_field_is_named():
    err = error_of({"vlan": 5000, "spoofchk": "yes", "stateDir": 5})
    for field in ("vlan", "spoofchk", "stateDir"):
        assert f" {field}:" in err.msg, err.msg


def test_mac_precedence_config_args_runtime():
    conf_mac = {"mac": "0A:00:00:00:00:01"}
    assert effective_mac(load_conf(inv(conf_mac)), inv(conf_mac)) == "0a:00:00:00:00:01"
    i = inv(conf_mac, args={"MAC": "0a:00:00:00:00:02"})
    assert effective_mac(load_conf(i), i) == "0a:00:00:00:00:02"
    full = {**conf_mac, "runtimeConfig": {"mac": "0A:00:00:00:00:03"}}
    i = inv(full, args={"MAC": "0a:00:00:00:00:02"})
    assert effective_mac(load_conf(i), i) == "0a:00:00:00:00:03"


def test_bad_cni_args_mac_is_a_config_error():
    i = inv(args={"MAC": "01:00:00:00:00:02"})
    with pytest.raises(CNIError) as err:
        effective_mac(load_conf(i), i)
    assert err.value.code == 7 and "CNI_ARGS MAC" in err.value.msg


# --------------------------------------------------------------------------- decide_exclusive


SETTINGS = ("auto", "required", "off")
MODES = (EXCLUSIVE, SHARED, None)
DEVICES = ([], ["mlx5_3"], ["mlx5_3", "mlx5_4"])


def expected(setting, mode, devices):
    """("move", name) / ("keep", None) / ("error", words that must appear in msg+details)."""
    if setting == "off":
        return ("keep", None)
    if len(devices) > 1:
        return ("error", ["several RDMA devices", "mlx5_3", "mlx5_4", '"rdma": "off"'])
    if not devices:
        return ("error", ['"required"', "no RDMA device", "0000:3b:00.2"]) if setting == "required" else ("keep", None)
    if mode == EXCLUSIVE:
        return ("move", "mlx5_3")
    if setting == "required":
        found = "shared" if mode == SHARED else "unknown"
        return ("error", ['"required"', found, "mlx5_3", "rdma system set netns exclusive"])
    return ("keep", None)


@pytest.mark.parametrize(
    "setting, mode, devices",
    [pytest.param(s, m, d, id=f"{s}-{m or 'no-netlink'}-{len(d)}dev")
     for s, m, d in itertools.product(SETTINGS, MODES, DEVICES)],
)
def test_decide_exclusive(setting, mode, devices):
    what, value = expected(setting, mode, devices)
    if what == "error":
        with pytest.raises(CNIError) as err:
            decide_exclusive(setting, "0000:3b:00.2", list(devices), mode)
        assert err.value.code == 101
        text = f"{err.value.msg} {err.value.details}"
        for word in value:
            assert word in text, (word, text)
    else:
        assert decide_exclusive(setting, "0000:3b:00.2", list(devices), mode) == value


def test_exclusive_mode_fix_names_both_ways_to_switch():
    assert "rdma system set netns exclusive" in EXCLUSIVE_MODE_FIX
    assert "netns_mode=0" in EXCLUSIVE_MODE_FIX
