"""The pure parts of multi-rail routing and the neighbour probes: slots, tables and priorities
derived from interface names, which IPAM routes go to the main table, the config keys the three
plugins share, and the probe frames (byte layout and checksums, answers parsed)."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.result import Route
from rdmanet.cni.linux import neighbour_probe as probe
from rdmanet.cni.linux import rail_routing as rails


@pytest.mark.parametrize("names", [[f"net{k}" for k in range(1, 9)], [f"rail{k}" for k in range(8)],
                                   [f"ib{k}" for k in range(8)], ["gpu-rail", "nic-east", "hca", "data", "storage",
                                                                  "mgmt", "rdma", "roce"]])
def test_eight_interfaces_never_share_a_table_or_a_priority(names):
    tables = {rails.table_of(n) for n in names} | {rails.saved_table_of(n) for n in names}
    assert len(tables) == 2 * len(names)
    assert len({rails.priority_of(n) for n in names}) == len(names)
    for name in names:
        assert 0 < rails.priority_of(name) < 32766  # before the main table's rule
        assert rails.table_of(name) not in (253, 254, 255)


def test_slots_of_numbered_and_other_names():
    assert [rails.slot(n) for n in ("net1", "net8", "rail0", "ib7", "eth999")] == [1, 8, 0, 7, 999]
    assert rails.table_of("net3") == 10_003 and rails.priority_of("net3") == 10_003
    assert rails.saved_table_of("net3") == 20_003
    for name in ("rdma", "net1000", "eth"):  # no number, or one too large: a hash above the numbers
        assert rails.NUMBERED_SLOTS <= rails.slot(name) < rails.SLOTS
        assert rails.slot(name) == rails.slot(name)


def _route(dst: str, gw: str | None = None, priority: int | None = None) -> Route:
    return Route(dst=ipaddress.ip_network(dst), gw=ipaddress.ip_address(gw) if gw else None, priority=priority)


def test_main_table_routes_of_a_routed_interface():
    routes = [_route("0.0.0.0/0"), _route("198.19.250.0/24"), _route("198.19.251.0/24", priority=5), _route("fd00::/8")]
    plan = rails.Plan("net3", 7, frozenset({4}))
    assert rails.main_routes(plan, routes) == [_route("198.19.250.0/24", priority=10_003),
                                               _route("198.19.251.0/24", priority=5), _route("fd00::/8")]
    assert rails.main_routes(rails.Plan("net3", 7, frozenset()), routes) == routes


def _inv(config: dict) -> Invocation:
    return Invocation(command="ADD", container_id="c", netns="/run/netns/x", ifname="net1", config=config)


@pytest.mark.parametrize("plugin", ["macvlan_rdma", "host_device_rdma", "ipoib_rdma"])
@pytest.mark.parametrize("key,value", [("policyRouting", "sometimes"), ("defaultRoute", "yes"),
                                       ("detectAddressConflict", 1), ("checkGateway", "true"), ("probeTimeoutMs", 0),
                                       ("probeTimeoutMs", 60_000)])
def test_every_plugin_names_a_bad_key_and_its_fix(plugin, key, value):
    import importlib

    config = importlib.import_module(f"rdmanet.plugins.{plugin}.config")
    stdin = {"cniVersion": "1.0.0", "name": "n", "type": "t", "master": "ens1", "device": "ens1", key: value}
    with pytest.raises(CNIError) as info:
        config.load_conf(_inv(stdin))
    assert info.value.code == 7 and key in info.value.msg and key in info.value.details


@pytest.mark.parametrize("plugin", ["macvlan_rdma", "host_device_rdma", "ipoib_rdma"])
def test_defaults_route_per_interface_when_needed_and_probe_nothing(plugin):
    import importlib

    config = importlib.import_module(f"rdmanet.plugins.{plugin}.config")
    conf = config.load_conf(_inv({"cniVersion": "1.0.0", "name": "n", "type": "t", "master": "ens1", "device": "ens1"}))
    assert (conf.policyRouting, conf.defaultRoute, conf.detectAddressConflict, conf.checkGateway) == ("auto", False, False, False)


# --------------------------------------------------------------------------- probe frames

MAC = "02:00:00:00:00:01"


def _valid_icmpv6(frame: bytes) -> bool:
    src, dst = frame[22:38], frame[38:54]
    body = frame[54:]
    pseudo = src + dst + struct.pack("!I3xB", len(body), 58)
    return probe._checksum(pseudo + body) == 0


def test_arp_probe_and_request():
    target = ipaddress.IPv4Address("198.19.30.50")
    frame = probe.arp_request(MAC, probe.UNSPECIFIED4, target)
    assert frame[:6] == b"\xff" * 6 and frame[6:12] == bytes.fromhex("020000000001") and frame[12:14] == b"\x08\x06"
    assert struct.unpack_from("!HHBBH", frame, 14) == (1, 0x0800, 6, 4, 1)
    assert frame[28:32] == bytes(4) and frame[38:42] == target.packed  # sender 0.0.0.0: a probe
    request = probe.arp_request(MAC, ipaddress.IPv4Address("198.19.30.51"), target)
    assert request[28:32] == ipaddress.IPv4Address("198.19.30.51").packed


def test_arp_reply_names_its_sender():
    target = ipaddress.IPv4Address("198.19.30.50")
    holder = bytes.fromhex("0a0b0c0d0e0f")
    reply = (bytes.fromhex("020000000001") + holder + b"\x08\x06"
             + struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 2, holder, target.packed, bytes(6), bytes(4)))
    assert probe.arp_answerer(reply, target) == "0a:0b:0c:0d:0e:0f"
    assert probe.arp_answerer(reply, ipaddress.IPv4Address("198.19.30.51")) is None
    assert probe.arp_answerer(probe.arp_request(MAC, probe.UNSPECIFIED4, target), target) is None  # a request


@pytest.mark.parametrize("source", ["::", "fd00:30::51"])
def test_neighbour_solicitation(source):
    target = ipaddress.IPv6Address("fd00:30::1:2:50")
    frame = probe.neighbour_solicitation(MAC, ipaddress.IPv6Address(source), target)
    assert frame[:6] == bytes.fromhex("3333ff020050") and frame[12:14] == b"\x86\xdd"
    assert frame[20] == 58 and frame[21] == 255  # ICMPv6, hop limit 255
    assert frame[38:54] == ipaddress.IPv6Address("ff02::1:ff02:50").packed
    assert frame[54] == 135 and frame[62:78] == target.packed
    assert _valid_icmpv6(frame)
    assert (len(frame) == 78) == (source == "::")  # a DAD probe carries no source link-layer address


def test_neighbour_advertisement_names_its_sender():
    target = ipaddress.IPv6Address("fd00:30::50")
    sender = bytes.fromhex("0a0b0c0d0e0f")
    body = struct.pack("!BBHI16s", 136, 0, 0, 0x20000000, target.packed)
    ipv6 = struct.pack("!IHBB16s16s", 6 << 28, len(body) + 8, 58, 255, target.packed,
                       ipaddress.IPv6Address("ff02::1").packed)
    frame = bytes.fromhex("333300000001") + sender + b"\x86\xdd" + ipv6 + body
    assert probe.neighbour_answerer(frame + struct.pack("!BB6s", 2, 1, bytes.fromhex("111111111111")), target) == "11:11:11:11:11:11"
    assert probe.neighbour_answerer(frame, target) == "0a:0b:0c:0d:0e:0f"  # no option: the frame's source
    assert probe.neighbour_answerer(frame, ipaddress.IPv6Address("fd00:30::51")) is None
