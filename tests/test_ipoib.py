"""ipoib-rdma without a kernel: the config, the IB values, the sysfs facts of ConnectX IB ports
(fake trees, netns_tests/ib_trees.py), and the rtnetlink bytes: the request that creates an IPoIB
child compared with the kernel ABI (include/uapi/linux/if_link.h) byte for byte,
and a kernel's answer describing one decoded into what CHECK compares.

No IPoIB child can be created on any kernel without an HCA, so these bytes are the proof of the
successful path until someone runs it on an IB fabric (README "What is proven where")."""

from __future__ import annotations

import socket
import struct

import pytest

from rdmanet.cni.core import env
from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.core.infiniband import (
    connected_capable,
    derive_guid,
    guid_of_hwaddr,
    guid_text,
    mtu_limit,
    parse_guid,
    parse_pkey,
    pkey_text,
)
from rdmanet.cni.core.invocation import parse_invocation
from rdmanet.plugins.ipoib_rdma import plugin as ipoib_plugin
from rdmanet.plugins.ipoib_rdma.config import load_conf
from rdmanet.cni.linux import infiniband as ib
from rdmanet.cni.linux import ipoib
from rdmanet.cni.linux.links import Link
from netns_tests import ib_trees

RTM_NEWLINK = 16
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_LINKINFO = 1, 3, 4, 5, 18
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
IFLA_IPOIB_PKEY, IFLA_IPOIB_MODE, IFLA_IPOIB_UMCAST = 1, 2, 3
ARPHRD_INFINIBAND = 32
HWADDR = ib_trees.HWADDR


def nla(kind: int, payload: bytes) -> bytes:
    """One netlink attribute: u16 len, u16 type, payload, padded to 4 bytes (native order)."""
    head = struct.pack("=HH", 4 + len(payload), kind)
    return head + payload + b"\0" * (-len(payload) % 4)


def nlmsg(msg_type: int, flags: int, seq: int, body: bytes) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), msg_type, flags, seq, 0) + body


def ifinfomsg(ifi_type: int = 0, index: int = 0, flags: int = 0) -> bytes:
    return struct.pack("=BxHiII", socket.AF_UNSPEC, ifi_type, index, flags, 0)


# --------------------------------------------------------------------------- values


@pytest.mark.parametrize("value, key", [("0x8001", 1), ("0x1", 1), ("0x7fff", 0x7FFF), ("0xFFFF", 0x7FFF), (0x8002, 2), (5, 5)])
def test_pkeys_in_every_form_name_the_15_bit_key(value, key):
    assert parse_pkey(value) == key
    assert pkey_text(key) == f"0x{key | 0x8000:04x}"


@pytest.mark.parametrize("value", ["0x0", "0x8000", 0, 0x8000, 0x10000, -1, "8001", "0x", "0x12345", True, 1.5])
def test_bad_pkeys(value):
    with pytest.raises(ValueError):
        parse_pkey(value)


def test_guid_text_is_big_endian_like_iproute2():
    assert parse_guid("11:22:33:44:55:66:77:88") == 0x1122334455667788
    assert guid_text(0x1122334455667788) == "11:22:33:44:55:66:77:88"


@pytest.mark.parametrize("value", ["00:00:00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff:ff:ff", "11:22:33:44:55:66",
                                   "11:22:33:44:55:66:77", "11-22-33-44-55-66-77-88", "zz:22:33:44:55:66:77:88", ""])
def test_bad_guids(value):
    with pytest.raises(ValueError):
        parse_guid(value)


def test_derived_guid_is_stable_and_in_the_ib_kubernetes_pool():
    a, b = derive_guid("net/cid/net1"), derive_guid("net/cid/net1")
    assert a == b and a >> 56 == 0x02
    assert derive_guid("net/cid/net2") != a


def test_ipoib_address_carries_the_port_guid_and_the_rc_flag():
    assert guid_of_hwaddr(HWADDR) == 0xB8599F0300D46E2B
    assert connected_capable(HWADDR)
    assert not connected_capable("00" + HWADDR[2:])


def test_mtu_limits_per_mode():
    assert mtu_limit("connected", "datagram", 2044) == 65520
    assert mtu_limit("datagram", "datagram", 2044) == 2044  # a 2K fabric
    assert mtu_limit("datagram", "connected", 65520) == 4092


# --------------------------------------------------------------------------- config


def invocation(conf: dict, command: str = "ADD"):
    import json

    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x", "CNI_IFNAME": "net1",
           "CNI_PATH": "/opt/cni/bin"}
    return parse_invocation(env, json.dumps(conf).encode())


def test_a_nad_rendered_by_the_network_operator_works_by_changing_type():
    """IPoIBNetwork renders {cniVersion 0.3.1, name, type "ipoib", master, ipam}."""
    nad = {"cniVersion": "0.3.1", "name": "ipoib-network-a", "type": "ipoib", "master": "ibs1f0",
           "ipam": {"type": "nv-ipam", "poolName": "ipoib-pool-a"}}
    conf = load_conf(invocation({**nad, "type": "ipoib-rdma"}))
    assert (conf.master, conf.pkey, conf.mode, conf.mtu, conf.rdma, conf.ipam.type) == ("ibs1f0", None, None, 0, "auto", "nv-ipam")


@pytest.mark.parametrize("extra, field", [({"mode": "ud"}, "mode"), ({"pkey": "0x8000"}, "pkey"), ({"mtu": -1}, "mtu"),
                                          ({"rdma": "yes"}, "rdma"), ({"master": ""}, "master")])
def test_bad_config_names_the_field(extra, field):
    with pytest.raises(CNIError) as err:
        load_conf(invocation({"cniVersion": "1.0.0", "name": "n", "type": "ipoib-rdma", "master": "ib0", **extra}))
    assert err.value.code == 7 and f"{field}:" in err.value.msg and err.value.details


def test_temporary_name():
    inv = invocation({"cniVersion": "1.0.0", "name": "ibnet", "type": "ipoib-rdma", "master": "ib0"})
    name = ipoib_plugin.temporary_name(inv)
    assert len(name) == 15 and name.startswith("ipr")


# --------------------------------------------------------------------------- sysfs of ConnectX IB ports


@pytest.fixture
def tree(tmp_path):
    ib_trees.ipoib_port(tmp_path, "ibp59s0f0", pkeys=(0xFFFF, 0x8001, 0x0002))
    ib_trees.roce_port(tmp_path, "ens2f0np0")
    ib_trees.ib_vf(tmp_path, "0000:3b:00.2", netdev="ibp59s0f0v0", ibdev="mlx5_4")
    return str(tmp_path)


def test_ipoib_port_is_recognised(tree):
    assert ib.netdev_type("ibp59s0f0", tree) == ARPHRD_INFINIBAND and ib.is_ipoib("ibp59s0f0", tree)
    assert ib.ipoib_parent("ibp59s0f0", tree) == ib.IpoibParent(pkey=0x7FFF, mode="datagram", umcast=False)
    port = ib.port_of_netdev("ibp59s0f0", tree)
    assert port == ib.IbPort("mlx5_0", 1)
    assert (ib.link_layer(port, tree), ib.port_state(port, tree), ib.phys_state(port, tree)) == ("InfiniBand", "ACTIVE", "LinkUp")
    assert ib.port_pkeys(port, tree) == [0x7FFF, 1, 2]  # empty slots (0x0000) left out
    assert ib.node_guid("mlx5_0", tree) == 0xB8599F0300D46E2A
    assert ib.module_loaded("ib_ipoib", tree)


def test_roce_port_is_not_ipoib(tree):
    assert ib.netdev_type("ens2f0np0", tree) == 1 and not ib.is_ipoib("ens2f0np0", tree)
    assert ib.link_layer(ib.port_of_netdev("ens2f0np0", tree), tree) == "Ethernet"
    assert ib.ipoib_parent("ens2f0np0", tree) == ib.IpoibParent(None, None, None)


def test_uninitialised_ib_vf(tree):
    assert ib.is_ipoib("ibp59s0f0v0", tree)
    assert ib.node_guid("mlx5_4", tree) == 0
    assert ib.port_state(ib.port_of_netdev("ibp59s0f0v0", tree), tree) == "INIT"


def test_not_ipoib_error_says_which_plugin_fits(tree):
    err = ipoib_plugin.not_ipoib("ens2f0np0", tree)
    assert err.code == 7
    assert err.msg == "master ens2f0np0 is a RoCE port (RDMA device mlx5_2, link layer Ethernet), not the IPoIB netdev of an InfiniBand port"
    assert "macvlan-rdma" in err.details


# --------------------------------------------------------------------------- the request's bytes


def test_child_request_bytes_match_the_kernel_abi():
    """``ip link add ipr0 link <7> type ipoib pkey 0x8001 mode connected umcast 1``."""
    msg = ipoib.child_request("ipr0", 7, 0x0001, "connected")
    msg["header"]["type"] = RTM_NEWLINK
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK | ipoib.REQUEST_FLAGS
    msg["header"]["sequence_number"] = 42
    msg.encode()
    u16 = lambda v: struct.pack("=H", v)  # noqa: E731 - nla_get_u16: host order
    info_data = (nla(IFLA_IPOIB_PKEY, u16(0x8001)) + nla(IFLA_IPOIB_MODE, u16(1)) + nla(IFLA_IPOIB_UMCAST, u16(1)))
    expected = nlmsg(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 42, ifinfomsg() + b"".join([
        nla(IFLA_IFNAME, b"ipr0\0"),
        nla(IFLA_LINK, struct.pack("=I", 7)),
        nla(IFLA_LINKINFO, nla(IFLA_INFO_KIND, b"ipoib\0") + nla(IFLA_INFO_DATA, info_data)),
    ]))
    assert bytes(msg.data) == expected


def test_datagram_mode_is_zero_and_the_full_member_bit_is_sent():
    msg = ipoib.child_request("x", 1, 0x7FFF, "datagram")
    msg.encode()
    data = bytes(msg.data)
    assert nla(IFLA_IPOIB_PKEY, struct.pack("=H", 0xFFFF)) + nla(IFLA_IPOIB_MODE, struct.pack("=H", 0)) in data


def test_unknown_mode_is_never_sent():
    with pytest.raises(ValueError):
        ipoib.child_request("x", 1, 1, "ud")


@pytest.mark.parametrize("code, words", [(95, "ib_ipoib is not loaded"), (19, "is not an IPoIB netdev"),
                                         (22, "Invalid argument"), (17, "the name is taken")])
def test_kernel_refusals_are_named(code, words):
    err = ipoib.refusal(code, "ib0", 1, "connected")
    assert err.code == 100 and words in err.msg and f"(errno {code})" in err.details
    assert err.msg.startswith("create IPoIB child of master ib0 (pkey 0x8001, mode connected)")


# --------------------------------------------------------------------------- a kernel's answer, decoded


def child_answer(*, pkey=0x8001, mode=1, parent=7, mtu=2044, kind=b"ipoib\0", hwaddr=HWADDR) -> Link:
    """RTM_NEWLINK as the kernel reports an IPoIB child (ipoib_fill_info), decoded by pyroute2."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    u16 = lambda v: struct.pack("=H", v)  # noqa: E731
    info = nla(IFLA_INFO_KIND, kind) + nla(IFLA_INFO_DATA, nla(IFLA_IPOIB_PKEY, u16(pkey)) + nla(IFLA_IPOIB_MODE, u16(mode))
                                           + nla(IFLA_IPOIB_UMCAST, u16(1)))
    body = ifinfomsg(ARPHRD_INFINIBAND, 12, 1) + b"".join([
        nla(IFLA_IFNAME, b"net1\0"), nla(IFLA_MTU, struct.pack("=I", mtu)), nla(IFLA_LINK, struct.pack("=I", parent)),
        nla(IFLA_ADDRESS, bytes(int(x, 16) for x in hwaddr.split(":"))), nla(IFLA_LINKINFO, info)])
    msg = ifinfmsg(nlmsg(RTM_NEWLINK, 0, 1, body))
    msg.decode()
    return Link.from_msg(msg)


MASTER = Link(index=7, name="ib0", kind="ipoib", mac=HWADDR, mtu=2044, up=True)


def test_answer_decodes_with_the_whole_20_byte_address():
    link = child_answer()
    assert (link.kind, link.link_type, link.parent_index, link.ipoib_pkey, link.ipoib_mode) == ("ipoib", 32, 7, 0x8001, "connected")
    assert link.mac == HWADDR and len(link.mac) == 59  # pyroute2's own IFLA_ADDRESS decode keeps 6 bytes
    ipoib_plugin.check_link(link, "net1", "/run/netns/p", MASTER, 1, "connected", 2044, HWADDR.upper())


@pytest.mark.parametrize("answer, expected_msg", [
    ({"kind": b"veth\0"}, "net1 is a veth, not an IPoIB child"),
    ({"parent": 9}, "net1 is not a child of master ib0"),
    ({"pkey": 0x8002}, "net1 has pkey 0x8002, expected 0x8001"),
    ({"mode": 0}, "net1 is in datagram mode, expected connected"),
    ({"mtu": 1500}, "net1 has MTU 1500, expected 2044"),
    ({"hwaddr": "80" + HWADDR[2:-2] + "ff"}, "net1 has address"),
])
def test_check_names_what_differs(answer, expected_msg):
    with pytest.raises(CNIError) as err:
        ipoib_plugin.check_link(child_answer(**answer), "net1", "/run/netns/p", MASTER, 1, "connected", 2044, HWADDR)
    assert err.value.code == 105 and expected_msg in err.value.msg


def test_connected_mode_on_an_enhanced_ipoib_master_is_refused(tmp_path):
    ib_trees.ipoib_port(tmp_path, "ib0", hwaddr="00" + HWADDR[2:])
    master = Link(index=7, name="ib0", kind="ipoib", mac="00" + HWADDR[2:], mtu=4092, up=True)
    conf = load_conf(invocation({"cniVersion": "1.0.0", "name": "n", "type": "ipoib-rdma", "master": "ib0", "mode": "connected"}))
    with env.scoped({"RDMANET_SYSFS_ROOT": str(tmp_path)}), pytest.raises(CNIError) as err:
        ipoib_plugin._pkey_and_mode(conf, master)
    assert err.value.code == 7 and "cannot run connected mode" in err.value.msg and '"datagram"' in err.value.details
