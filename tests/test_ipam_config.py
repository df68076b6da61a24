"""rdmanet.ipam.config: whereabouts and host-local forms normalised to range sets; errors name field and fix."""

from __future__ import annotations

import ipaddress

import pytest

from rdmanet.cni.core.errors import INVALID_CONFIG, CNIError
from rdmanet.ipam.config import parse_ipam_config
from rdmanet.ipam.location import DEFAULT_DATA_DIR, store_location


def conf(ipam: dict, name: str = "net-a") -> dict:
    return {"cniVersion": "1.0.0", "name": name, "type": "macvlan", "ipam": {"type": "lease-ipam", **ipam}}


def ip(text: str) -> int:
    return int(ipaddress.ip_address(text))


def error(ipam: dict) -> CNIError:
    with pytest.raises(CNIError) as info:
        parse_ipam_config(conf(ipam))
    assert info.value.code == INVALID_CONFIG
    assert info.value.details, "every config error carries a fix"
    return info.value


def test_plain_cidr_usable_addresses_and_defaults():
    c = parse_ipam_config(conf({"range": "10.1.1.0/24"}))
    (rs,) = c.range_sets
    (r,) = rs.ranges
    assert (r.start, r.end) == (ip("10.1.1.1"), ip("10.1.1.254"))
    assert r.gateway is None and r.blocked == []
    assert c.domain == "net-a" and c.data_dir == DEFAULT_DATA_DIR


def test_host_bits_are_ignored():
    (rs,) = parse_ipam_config(conf({"range": "10.1.1.77/24"})).range_sets
    assert str(rs.ranges[0].subnet) == "10.1.1.0/24"


def test_dash_form_sets_start_and_end():
    (rs,) = parse_ipam_config(conf({"range": "10.0.0.10-10.0.0.20/24"})).range_sets
    r = rs.ranges[0]
    assert str(r.subnet) == "10.0.0.0/24" and (r.start, r.end) == (ip("10.0.0.10"), ip("10.0.0.20"))


def test_range_start_end_gateway_exclude():
    c = parse_ipam_config(conf({"range": "10.1.1.0/24", "range_start": "10.1.1.100", "range_end": "10.1.1.200",
                                "gateway": "10.1.1.1", "exclude": ["10.1.1.128/30", "10.1.1.150", "10.1.1.129/32"]}))
    r = c.range_sets[0].ranges[0]
    assert (r.start, r.end) == (ip("10.1.1.100"), ip("10.1.1.200"))
    assert str(r.gateway) == "10.1.1.1"
    assert r.excludes == ((ip("10.1.1.128"), ip("10.1.1.131")), (ip("10.1.1.150"), ip("10.1.1.150")))
    assert (ip("10.1.1.1"), ip("10.1.1.1")) in r.blocked


@pytest.mark.parametrize("cidr,first,last", [
    ("10.0.0.0/31", "10.0.0.0", "10.0.0.1"),
    ("10.0.0.7/32", "10.0.0.7", "10.0.0.7"),
    ("fd00::/127", "fd00::", "fd00::1"),
    ("fd00::9/128", "fd00::9", "fd00::9"),
    ("fd00::/64", "fd00::1", "fd00::ffff:ffff:ffff:fffe"),
])
def test_point_to_point_and_v6_bounds(cidr, first, last):
    r = parse_ipam_config(conf({"range": cidr})).range_sets[0].ranges[0]
    assert (r.start, r.end) == (ip(first), ip(last))


def test_ipranges_dual_stack_top_level_first_and_gateway_by_family():
    c = parse_ipam_config(conf({"range": "10.1.1.0/24", "gateway": "10.1.1.1",
                                "ipRanges": [{"range": "fd00:1::/64", "exclude": ["fd00:1::/120"]},
                                             {"range": "10.2.0.0/16", "range_start": "10.2.0.10"}]}))
    fams = [rs.family for rs in c.range_sets]
    assert fams == [4, 6, 4]
    assert str(c.range_sets[0].ranges[0].gateway) == "10.1.1.1"
    assert c.range_sets[1].ranges[0].gateway is None and c.range_sets[2].ranges[0].gateway is None
    assert c.range_sets[2].ranges[0].start == ip("10.2.0.10")


def test_host_local_ranges_form_with_default_gateway():
    c = parse_ipam_config(conf({"ranges": [[{"subnet": "10.9.0.0/24", "rangeStart": "10.9.0.50"},
                                            {"subnet": "10.9.1.0/24", "gateway": "10.9.1.254"}],
                                           [{"subnet": "fd09::/64"}]], "dataDir": "/tmp/x"}))
    a, b = c.range_sets
    assert len(a.ranges) == 2 and a.family == 4 and b.family == 6
    assert str(a.ranges[0].gateway) == "10.9.0.1"  # host-local's default
    assert str(a.ranges[1].gateway) == "10.9.1.254"
    assert c.data_dir == "/tmp/x"


def test_network_name_routes_dns_and_whereabouts_keys():
    c = parse_ipam_config(conf({
        "range": "10.1.1.0/24", "network_name": "dom1", "routes": [{"dst": "0.0.0.0/0", "gw": "10.1.1.1"}, {"dst": "10.9.0.0/16"}],
        "dns": {"nameservers": ["10.1.1.53"], "search": ["example"]},
        "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"},
        "enable_overlapping_ranges": False, "configuration_path": "/etc/cni/net.d/x.conf", "leader_lease_duration": 1500,
        "leader_renew_deadline": 1000, "leader_retry_period": 500, "log_file": "/tmp/l", "log_level": "debug",
    }))
    assert c.domain == "dom1@ranges:10.1.1.0/24"  # overlapping ranges off: the named domain, per range
    assert [str(r.dst) for r in c.routes] == ["0.0.0.0/0", "10.9.0.0/16"] and str(c.routes[0].gw) == "10.1.1.1"
    assert c.dns.nameservers == ["10.1.1.53"] and c.dns.search == ["example"]



def test_dns_lists_left_out_are_empty_and_never_shared():
    """dns.nameservers/search/options default to [] (not a factory): every parsed dns block gets
    lists of its own, so one network's DNS never shows in another's in the daemon's process."""
    from rdmanet.ipam.config import DNSConf

    first = DNSConf.model_validate({"domain": "a.example"})
    for name in ("nameservers", "search", "options"):
        getattr(first, name).append("leak")
    second = DNSConf.model_validate({"domain": "b.example"})
    assert (second.nameservers, second.search, second.options) == ([], [], [])
    c = parse_ipam_config(conf({"range": "10.1.2.0/24", "dns": {"domain": "b.example"}}))
    assert (c.dns.domain, c.dns.nameservers, c.dns.search, c.dns.options) == ("b.example", [], [], [])

def test_store_location_is_lenient_about_ranges():
    assert store_location(conf({"range": "garbage", "dataDir": "/var/lib/cni/d"})) == ("/var/lib/cni/d", "net-a")
    assert store_location(conf({"network_name": "x"})) == (DEFAULT_DATA_DIR, "x")


@pytest.mark.parametrize("ipam,field,fix_word", [
    ({"range": "10.1.1.0"}, "ipam.range", "CIDR"),
    ({"range": "banana/24"}, "ipam.range", "CIDR"),
    ({"range": "10.0.0.30-10.0.0.20/24"}, "ipam.range", "lower"),
    ({"range": "10.0.1.5-10.0.0.20/24"}, "ipam.range", "10.0.0.0/24"),
    ({"range": "10.1.1.0/24", "exclude": ["10.1.1.0/24", "nope"]}, "ipam.exclude[1]", "CIDR"),
    ({"range": "10.1.1.0/24", "exclude": ["fd00::/64"]}, "ipam.exclude[0]", "family"),
    ({"range": "10.1.1.0/24", "range_start": "10.1.2.5"}, "ipam.range_start", "inside 10.1.1.0/24"),
    ({"range": "10.1.1.0/24", "range_end": "10.1.0.5"}, "ipam.range_end", "inside 10.1.1.0/24"),
    ({"range": "10.1.1.0/24", "range_start": "x"}, "ipam.range_start", "IP address"),
    ({"range": "10.1.1.0/24", "range_start": "10.1.1.50", "range_end": "10.1.1.40"}, "ipam.range_start", "swap"),
    ({"range": "10.1.1.0/24", "range_start": "10.1.1.255"}, "ipam.range_start", "widen"),
    ({"range": "10.1.1.0/24", "gateway": "10.1.2.1"}, "ipam.gateway", "inside"),
    ({"ipRanges": [{"range": "10.1.1.0/24", "range_start": "10.2.0.1"}]}, "ipam.ipRanges[0].range_start", "inside"),
    ({"ipRanges": [{"range": "fd00::/64", "gateway": "10.0.0.1"}]}, "ipam.ipRanges[0].gateway", "inside"),
    ({}, "ipam.range", "range"),
    ({"exclude": ["10.0.0.1"]}, "ipam.range", "CIDR"),
    ({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "fd00::/64"}]]}, "ipam.ranges[0]", "own range set"),
    ({"ranges": [[]]}, "ipam.ranges[0]", "subnet"),
    ({"ranges": [[{"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}]]}, "ipam.ranges[0][0].gateway", "inside"),
    ({"range": "10.1.1.0/24", "ipRanges": [{"range": "10.1.1.128/25"}]}, "overlaps", "own addresses"),
    ({"range": "10.1.1.0/24", "network_name": "../etc"}, "ipam.network_name", "directory"),
    ({"range": "10.1.1.0/24", "dataDir": "relative/dir"}, "ipam.dataDir", "absolute"),
    ({"range": "10.1.1.0/24", "routes": [{"dst": "nope"}]}, "ipam.routes[0].dst", "CIDR"),
])
def test_errors_name_the_field_and_the_fix(ipam, field, fix_word):
    err = error(ipam)
    assert field in err.msg
    assert fix_word.lower() in (err.msg + " " + err.details).lower()


def test_type_errors_come_from_the_model_with_the_fix():
    err = error({"range": 10})
    assert "ipam.range" in err.msg and "CIDR" in err.details
    err = error({"range": "10.1.1.0/24", "exclude": "10.1.1.5"})
    assert "ipam.exclude" in err.msg and "list" in err.details
    err = error({"ipRanges": [{"range_start": "10.0.0.1"}]})
    assert "ipam.ipRanges[0].range" in err.msg


def test_missing_ipam_block():
    with pytest.raises(CNIError) as info:
        parse_ipam_config({"name": "n", "type": "macvlan"})
    assert info.value.code == INVALID_CONFIG and "ipam" in info.value.msg


@pytest.mark.parametrize("ipam, field, fix_word", [
    ({"poolName": "a,b,c"}, "ipam.poolName", "pool-v4,pool-v6"),
    ({"poolName": "Pool_A"}, "ipam.poolName", "ipoib-pool-a"),
    ({"poolName": "a,a"}, "ipam.poolName", "once"),
    ({"poolName": 7}, "ipam.poolName", "pool-v4,pool-v6"),
    ({"poolName": "a", "poolType": "spiderpool"}, "ipam.poolType", "cidrpool"),
    ({"poolName": "a", "poolNamespace": "Kube_System"}, "ipam.poolNamespace", "kube-system"),
    ({"poolNamespace": "kube-system", "range": "10.1.1.0/24"}, "ipam.poolNamespace", "poolName"),
    ({"poolName": "a", "range": "10.1.1.0/24"}, "ipam.range", "remove range"),
    ({"poolName": "a", "datastore": "local"}, "ipam.datastore", '"kubernetes"'),
])
def test_nv_ipam_pool_keys_are_checked_before_any_request(ipam, field, fix_word):
    err = error(ipam)
    assert f"invalid network config: {field}" in err.msg, err.msg
    assert fix_word in err.details


def test_nv_ipam_pool_names_select_the_cluster_store_and_need_no_range():
    from rdmanet.ipam.pool_ref import PoolRef

    c = parse_ipam_config(conf({"poolName": "pool-v4, pool-v6", "poolType": "CIDRPool"}))
    assert c.pools == PoolRef("cidrpool", ("pool-v4", "pool-v6")) and c.range_sets == ()
    assert parse_ipam_config(conf({"poolType": "ippool"}, name="ipoib-pool-a")).pools.names == ("ipoib-pool-a",)
    # with enable_overlapping_ranges false the domain is keyed by the pools (the network's name by default)
    assert store_location(conf({"poolType": "ippool", "enable_overlapping_ranges": False}, name="pool-x"))[1].endswith(
        "@ranges:ippool/pool-x")
