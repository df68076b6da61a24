"""host-device-rdma's per-attachment record (attachment_state.py) and the state directory that
keeps it (rdmanet.cni.linux.state): the JSON it writes, what it refuses to read, and how a file
it cannot read is treated."""

from __future__ import annotations

import json

import pytest

from rdmanet.cni.core.errors import IO_FAILURE, CNIError
from rdmanet.cni.linux.links import Link
from rdmanet.cni.linux.state import StateDir
from rdmanet.cni.linux.vf_settings import VfSettings
from rdmanet.plugins.host_device_rdma.attachment_state import (STATE_VERSION, AttachmentState, IbRecord, Original,
                                                             VfRecord)
from rdmanet.plugins.host_device_rdma.selection import DeviceRef

VF = DeviceRef(netdev="ens1f0v0", selector="deviceID", device_id="0000:3b:00.2", kind="pci", pf_pci="0000:3b:00.0",
               pf_netdev="ens1f0", vf_index=0, driver="mlx5_core", dpdk=False)


def minimal() -> AttachmentState:
    return AttachmentState(network="net", container_id="c1", ifname="net1", netns="/run/netns/p",
                           netns_id={"dev": 4, "ino": 4026532000}, token="ab" * 16, device=VF, ipam=True)


def complete() -> AttachmentState:
    state = minimal()
    state.original = Original(name="ens1f0v0", mac="02:00:00:00:00:01", mtu=1500, up=True, alias="", index=12,
                              perm_mac="", parent_dev="0000:3b:00.2")
    state.pod_index = 12
    state.vf = VfRecord(pf="ens1f0", vf=0, applied=VfSettings(vlan=100, qos=0, vlan_proto="802.1q", trust=False),
                        snapshot=VfSettings(vlan=0, qos=0, vlan_proto="802.1q", trust=True))
    state.ib = IbRecord(pf="ens1f0", vf=0, guid="02:00:00:00:00:00:00:aa", source="the VF's own",
                        previous_node="02:00:00:00:00:00:00:aa", previous_port=None)
    state.rdma_device = "mlx5_4"
    state.repair = ["return ens1f0v0 to the host: the host netns already has a link ens1f0v0"]
    return state


@pytest.mark.parametrize("state", [minimal(), complete()], ids=["claimed", "every-section"])
def test_a_record_reads_back_as_written(state):
    assert AttachmentState.from_dict(json.loads(json.dumps(state.to_dict()))) == state


def test_the_json_names_each_section_and_leaves_out_what_did_not_happen():
    doc = minimal().to_dict()
    assert doc["version"] == STATE_VERSION and doc["containerID"] == "c1" and doc["done"] is False
    assert not {"original", "netdev", "vf", "ib", "rdma", "repair"} & set(doc)
    doc = complete().to_dict()
    assert doc["netdev"] == {"pod_index": 12} and doc["rdma"] == {"device": "mlx5_4"}
    assert doc["ib"] == {"pf": "ens1f0", "vf": 0, "guid": "02:00:00:00:00:00:00:aa", "source": "the VF's own",
                         "previous": {"node": "02:00:00:00:00:00:00:aa", "port": None}, "set": False}
    assert doc["vf"]["applied"] == {"vlan": 100, "qos": 0, "vlan_proto": "802.1q", "trust": False}


def test_the_original_of_a_veth_records_its_peer_and_of_a_physical_device_its_bus_device():
    veth = Link(index=7, name="hd0", kind="veth", mac="02:00:00:00:00:07", mtu=1400, up=True, parent_index=8,
                parent_netnsid=3)
    assert Original.of_link(veth) == Original(name="hd0", mac="02:00:00:00:00:07", mtu=1400, up=True, alias="", index=7,
                                              kind="veth", peer_index=8, peer_nsid=3)
    nic = Link(index=5, name="ens1f0", kind="", mac="b8:ce:f6:00:00:01", mtu=9000, up=False, perm_mac="b8:ce:f6:00:00:01",
               parent_dev="0000:3b:00.0")
    original = Original.of_link(nic)
    assert original.strongly_identified and original.peer_index is None
    assert not Original.of_link(veth).strongly_identified


def _broken(change) -> dict:
    doc = complete().to_dict()
    change(doc)
    return doc


@pytest.mark.parametrize("doc, says", [
    pytest.param(_broken(lambda d: d.update(version=STATE_VERSION + 1)), "state version", id="another-version"),
    pytest.param(_broken(lambda d: d.pop("version")), "state version None", id="no-version"),
    pytest.param(_broken(lambda d: d.pop("token")), "token is missing", id="no-token"),
    pytest.param(_broken(lambda d: d.update(ipam="yes")), "ipam must be true or false", id="ipam-type"),
    pytest.param(_broken(lambda d: d["original"].update(mtu="1500")), "original.mtu must be an integer", id="mtu-type"),
    pytest.param(_broken(lambda d: d["original"].update(up=1)), "original.up must be true or false", id="up-type"),
    pytest.param(_broken(lambda d: d.update(netdev={"pod_index": True})), "netdev.pod_index must be an integer", id="bool-index"),
    pytest.param(_broken(lambda d: d["device"].update(kind="usb")), "device.kind must be pci or auxiliary", id="device-kind"),
    pytest.param(_broken(lambda d: d["device"].pop("dpdk")), "device.dpdk is missing", id="device-dpdk"),
    pytest.param(_broken(lambda d: d["vf"]["applied"].update(colour="blue")), "unknown VF settings", id="vf-unknown"),
    pytest.param(_broken(lambda d: d["ib"].update(previous=[])), "ib.previous must be an object", id="ib-previous"),
    pytest.param(_broken(lambda d: d.update(rdma="mlx5_4")), "rdma must be an object", id="rdma-type"),
    pytest.param(_broken(lambda d: d.update(repair=[1])), "repair must be a list of strings", id="repair-type"),
    pytest.param(_broken(lambda d: d.update(netns_id={"dev": 4})), "netns_id.ino is missing", id="netns-id"),
])
def test_a_record_that_is_not_this_version_or_not_whole_is_refused(doc, says):
    with pytest.raises(ValueError, match=says):
        AttachmentState.from_dict(doc)


def test_the_state_dir_saves_by_rename_and_loads_the_record(tmp_path):
    states = StateDir(str(tmp_path), AttachmentState, durable=False)
    key = states.key("net", "c1", "net1")
    states.save(key, complete())
    assert states.load(key) == complete()
    assert [name for name, _ in states.entries()] == [key]
    assert sorted(p.name for p in tmp_path.iterdir()) == [key]  # no temp file left


@pytest.mark.parametrize("content", [
    b"", b'{"version": 1, "network": "n', b"[]",
    json.dumps({**complete().to_dict(), "version": STATE_VERSION + 1}).encode(),
], ids=["empty", "cut", "not-an-object", "another-version"])
def test_a_file_it_cannot_read_is_no_state_where_nothing_outlives_a_reboot_else_an_io_failure(tmp_path, content):
    states = StateDir(str(tmp_path), AttachmentState, durable=False)
    key = states.key("net", "c1", "net1")
    (tmp_path / key).write_bytes(content)
    assert states.load(key) is None
    assert list(states.entries()) == []
    states.remove(key)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / key).write_bytes(content)
    with pytest.raises(CNIError) as err:
        StateDir(str(tmp_path), AttachmentState).load(key)
    assert err.value.code == IO_FAILURE and key in err.value.msg
