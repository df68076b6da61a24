"""InfiniBand VF GUIDs without a kernel that can take one (no driver but mlx5's IB PF has
ndo_set_vf_guid: drivers/infiniband/ulp/ipoib/ipoib_main.c forwards it to the IB provider, and
netdevsim has none): the requests' bytes against the kernel ABI
(``struct ifla_vf_guid``, IFLA_VF_IB_NODE_GUID 10 / PORT_GUID 11 inside IFLA_VFINFO_LIST 22 →
IFLA_VF_INFO 1), the read-back of a PF's answer, the order of the requests, the driver rebind in a
fake sysfs tree, and where the GUID comes from. The kernel's refusal is tested for real in
netns_tests/test_host_device_ib.py and in the VM stage."""

from __future__ import annotations

import json
import struct
import sys

import pytest

from rdmanet.cni.core import env
from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.core.invocation import parse_invocation
from rdmanet.plugins.host_device_rdma import ib_vf
from rdmanet.plugins.host_device_rdma.attachment_state import IbRecord
from rdmanet.plugins.host_device_rdma.config import load_conf
from rdmanet.plugins.host_device_rdma.selection import DeviceRef
from rdmanet.cni.linux import vf_guid
from netns_tests import ib_trees

RTM_NEWLINK = 16
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
IFLA_VFINFO_LIST, IFLA_VF_INFO, IFLA_VF_MAC = 22, 1, 1
GUID = 0x1122334455667788


def nla(kind: int, payload: bytes) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def ifla_vf_guid(vf: int, guid: int) -> bytes:
    """struct ifla_vf_guid {__u32 vf; __u64 guid;}: 16 bytes, the u64 aligned to 8, host order."""
    return struct.pack("=I4xQ", vf, guid)


def request_bytes(pf_index: int, vf: int, kind: int, guid: int, seq: int = 9) -> bytes:
    body = struct.pack("=BxHiII", 0, 0, pf_index, 0, 0) + nla(IFLA_VFINFO_LIST, nla(IFLA_VF_INFO, nla(kind, ifla_vf_guid(vf, guid))))
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, seq, 0) + body


def encoded(msg, seq: int = 9) -> bytes:
    msg["header"]["type"] = RTM_NEWLINK
    msg["header"]["flags"] = NLM_F_REQUEST | NLM_F_ACK
    msg["header"]["sequence_number"] = seq
    msg.encode()
    return bytes(msg.data)


@pytest.mark.parametrize("which, kind", [("node", 10), ("port", 11)])
def test_guid_request_is_the_kernels_struct(which, kind):
    assert encoded(vf_guid.guid_request(5, 3, which, GUID)) == request_bytes(5, 3, kind, GUID)


def test_the_guid_is_in_host_byte_order():
    """11:22:..:88 is the number 0x1122...88 (iproute2) stored as a native u64: on this
    little-endian machine its bytes are reversed; pyroute2's own encoding reverses them on every
    host and pads the payload to 36 bytes."""
    data = encoded(vf_guid.guid_request(1, 0, "node", GUID))
    payload = data[-16:]
    assert payload[8:] == GUID.to_bytes(8, sys.byteorder)
    if sys.byteorder == "little":
        assert payload[8:] == bytes.fromhex("8877665544332211")
    assert struct.unpack("=HH", data[-20:-16]) == (20, 10)  # nla header: 4 + 16 bytes, type NODE_GUID


class Recorder:
    """Records what the plugin puts on the wire and acknowledges it: the test asserts the bytes
    and their order (the kernel ABI), never that a mock said yes."""

    def __init__(self):
        self.sent: list[bytes] = []

    def put(self, msg, msg_type, flags):
        msg["header"]["type"], msg["header"]["flags"], msg["header"]["sequence_number"] = msg_type, flags, 9
        msg.encode()
        self.sent.append(bytes(msg.data))

        class Request:
            msg_seq = 9
        return Request()

    def get(self, msg_seq):
        return []


def test_node_guid_then_port_guid_in_two_requests():
    """do_setvfinfo returns after the node GUID: a port GUID in the same request would be ignored."""
    rec = Recorder()
    vf_guid.set_guids(rec, 5, "ib0", 2, GUID)
    assert rec.sent == [request_bytes(5, 2, 10, GUID), request_bytes(5, 2, 11, GUID)]


@pytest.mark.parametrize("code, words", [(95, "only the IPoIB netdev of an InfiniBand PF"), (22, "sriov_numvfs"), (1, "CAP_NET_ADMIN")])
def test_refusals_name_the_guid_its_source_and_the_fix(code, words):
    err = vf_guid.refusal(code, "port", GUID, 2, "ib0", "from guid")
    assert err.code == 100
    assert err.msg.startswith("set port GUID 11:22:33:44:55:66:77:88 (from guid) on VF 2 of ib0: ")
    assert words in err.details and f"(errno {code})" in err.details


def pf_answer(vfs: dict[int, tuple[int, int]]):
    """RTM_NEWLINK of a PF with IFLA_VFINFO_LIST as rtnl_fill_vfinfo writes it (MAC first, then
    the two GUIDs when the driver has ndo_get_vf_guid), decoded by pyroute2."""
    from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

    infos = b"".join(
        nla(IFLA_VF_INFO, nla(IFLA_VF_MAC, struct.pack("=I32s", vf, b"\0" * 32))
            + nla(10, ifla_vf_guid(vf, node)) + nla(11, ifla_vf_guid(vf, port)))
        for vf, (node, port) in vfs.items())
    body = struct.pack("=BxHiII", 0, 32, 5, 0, 0) + nla(3, b"ib0\0") + nla(IFLA_VFINFO_LIST, infos)
    msg = ifinfmsg(struct.pack("=IHHII", 16 + len(body), RTM_NEWLINK, 0, 1, 0) + body)
    msg.decode()
    return msg


def test_read_back_of_the_pfs_answer():
    msg = pf_answer({0: (0, 0), 1: (GUID, GUID + 1)})
    assert vf_guid.guids_in(msg, 1) == (GUID, GUID + 1)
    assert vf_guid.guids_in(msg, 0) == (0, 0)  # a fresh mlx5 VF
    assert vf_guid.guids_in(msg, 7) == (None, None)


# --------------------------------------------------------------------------- where the GUID comes from


def invocation(conf: dict, runtime: dict | None = None):
    stdin = {"cniVersion": "1.0.0", "name": "ibnet", "type": "host-device-rdma", **conf}
    if runtime:
        stdin["runtimeConfig"] = runtime
    environ = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x", "CNI_IFNAME": "net1",
               "CNI_PATH": "/opt/cni/bin"}
    return parse_invocation(environ, json.dumps(stdin).encode())


def test_runtime_config_wins_over_the_config():
    inv = invocation({"guid": "02:00:00:00:00:00:00:02"}, {"infinibandGUID": "02:00:00:00:00:00:00:01"})
    assert ib_vf.requested_guid(load_conf(inv), inv) == (0x0200000000000001, "from runtimeConfig.infinibandGUID")
    inv = invocation({"guid": "02:00:00:00:00:00:00:02"})
    assert ib_vf.requested_guid(load_conf(inv), inv) == (0x0200000000000002, "from guid")
    inv = invocation({})
    assert ib_vf.requested_guid(load_conf(inv), inv) == (None, "")


@pytest.mark.parametrize("value", ["00:00:00:00:00:00:00:00", "FF:FF:FF:FF:FF:FF:FF:FF", "02:00:00:00:00:01", "x"])
def test_bad_runtime_guid(value):
    inv = invocation({}, {"infinibandGUID": value})
    with pytest.raises(CNIError) as err:
        ib_vf.requested_guid(load_conf(inv), inv)
    assert err.value.code == 7 and err.value.msg.startswith("invalid network config: runtimeConfig.infinibandGUID: ")


# --------------------------------------------------------------------------- rebind in a fake tree


def test_rebind_writes_unbind_then_bind_and_finds_the_netdev_again(tmp_path):
    ib_trees.ib_vf(tmp_path, "0000:3b:00.2", netdev="ibp59s0f0v0", ibdev="mlx5_4", pf_netdev="ibp59s0f0")
    ref = DeviceRef(netdev="ibp59s0f0v0", selector="deviceID", device_id="0000:3b:00.2", kind="pci", pf_pci="0000:3b:00.0",
                    pf_netdev="ibp59s0f0", vf_index=0, driver="mlx5_core", dpdk=False)
    with env.scoped({"RDMANET_SYSFS_ROOT": str(tmp_path)}):
        assert ib_vf.is_ib_vf(ref)
        back = ib_vf.rebind(ref)
    drivers = tmp_path / "sys" / "bus" / "pci" / "drivers" / "mlx5_core"
    assert (drivers / "unbind").read_text() == "0000:3b:00.2" and (drivers / "bind").read_text() == "0000:3b:00.2"
    assert back == ref


def test_vfio_bound_vf_is_not_rebound(tmp_path):
    ref = DeviceRef(netdev=None, selector="deviceID", device_id="0000:3b:00.2", kind="pci", pf_pci="0000:3b:00.0",
                    pf_netdev="ibp59s0f0", vf_index=0, driver="vfio-pci", dpdk=True)
    with env.scoped({"RDMANET_SYSFS_ROOT": str(tmp_path)}):
        assert ib_vf.rebind(ref) == ref
    assert not (tmp_path / "sys").exists()


def test_restore_writes_the_previous_guids_all_zero_as_all_ones(tmp_path, monkeypatch):
    ib_trees.ib_vf(tmp_path, "0000:3b:00.2", netdev="ibp59s0f0v0", ibdev="mlx5_4", pf_netdev="ibp59s0f0")
    ref = DeviceRef(netdev="ibp59s0f0v0", selector="deviceID", device_id="0000:3b:00.2", kind="pci", pf_pci="0000:3b:00.0",
                    pf_netdev="ibp59s0f0", vf_index=0, driver="mlx5_core", dpdk=False)
    rec = Recorder()
    monkeypatch.setattr(ib_vf, "_pf", lambda host, r: type("PF", (), {"index": 5})())
    record = IbRecord(pf="ibp59s0f0", vf=0, guid="02:00:00:00:00:00:00:01", source="from guid", guid_set=True,
                      previous_node="00:00:00:00:00:00:00:00", previous_port="02:00:00:00:00:00:00:07")
    with env.scoped({"RDMANET_SYSFS_ROOT": str(tmp_path)}):
        ib_vf.restore(rec, ref, record)
    assert rec.sent == [request_bytes(5, 0, 10, 0xFFFF_FFFF_FFFF_FFFF), request_bytes(5, 0, 11, 0x0200000000000007)]
    assert (tmp_path / "sys" / "bus" / "pci" / "drivers" / "mlx5_core" / "bind").read_text() == "0000:3b:00.2"
    assert record.guid_set is False
