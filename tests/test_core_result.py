"""Result parsing (prevResult, IPAM answers) and rendering across versions."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.core.result import Result

GO_040 = {
    "cniVersion": "0.4.0",
    "interfaces": [{"name": "net1", "mac": "0a:58:0a:01:01:05", "sandbox": "/run/netns/p"}],
    "ips": [
        {"version": "4", "interface": 0, "address": "10.1.1.5/24", "gateway": "10.1.1.1"},
        {"version": "6", "interface": 0, "address": "fd00::5/64"},
    ],
    "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.1.1"}, {"dst": "fd01::/64"}],
    "dns": {"nameservers": ["10.1.1.53"], "search": ["svc.local"]},
}


def test_roundtrip_040_and_drop_version_at_100():
    result = Result.from_json(GO_040)
    assert result.to_json("0.4.0") == GO_040
    doc = result.to_json("1.0.0")
    assert doc["cniVersion"] == "1.0.0"
    assert all("version" not in ip for ip in doc["ips"])


def test_110_only_fields():
    data = {
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "net1", "mac": "0a:00:00:00:00:01", "mtu": 9000, "sandbox": "/x", "pciID": "0000:3b:00.2"}],
        "ips": [{"interface": 0, "address": "10.0.0.1/24"}],
        "routes": [{"dst": "10.2.0.0/16", "gw": "10.0.0.254", "mtu": 1400, "table": 100, "priority": 5}],
        "dns": {},
    }
    result = Result.from_json(data)
    assert result.to_json("1.1.0") == data
    old = result.to_json("1.0.0")
    assert "mtu" not in old["interfaces"][0] and "pciID" not in old["interfaces"][0]
    assert old["routes"][0] == {"dst": "10.2.0.0/16", "gw": "10.0.0.254"}


def test_ipam_result_has_no_interfaces_key():
    result = Result.from_json({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/24"}]})
    doc = result.to_json("1.0.0")
    assert "interfaces" not in doc and "interface" not in doc["ips"][0]


@pytest.mark.parametrize("bad", [[], "x", {"ips": [{"address": "nope"}]}, {"ips": [{}]}, {"routes": [{"gw": "1.1.1.1"}]}])
def test_garbage_is_decoding_failure(bad):
    with pytest.raises(CNIError) as err:
        Result.from_json(bad, "prevResult")
    assert err.value.code == 6 and "prevResult" in err.value.msg


@given(st.ip_addresses(), st.integers(0, 32), st.sampled_from(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]))
def test_any_address_survives_render_and_parse(address, prefix, version):
    prefix = prefix if address.version == 4 else prefix * 4
    data = {"cniVersion": version, "ips": [{"address": f"{address}/{prefix}", "interface": 0}]}
    result = Result.from_json(data)
    again = Result.from_json(result.to_json(version))
    assert again.ips == result.ips
