"""rdmanet.cni.linux.vf_settings without root: sriov-cni's validation rules, the diff/plan, the snapshot's
JSON form, and apply/restore against a fake PF that speaks real pyroute2 messages (requests are
built by pyroute2's own link("set") argument processing, encoded and decoded; answers are encoded
IFLA_VFINFO_LIST messages), so the attribute layout is checked as well as the logic.
The real-kernel counterpart runs on netdevsim in the test VM (netns_tests/test_vm_vf.py)."""

from __future__ import annotations

import copy
import errno
import json
import types

import pytest
from pyroute2.iproute.linux import get_arguments_processor
from pyroute2.netlink import NLM_F_ACK, NLM_F_REQUEST
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWLINK
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from rdmanet.cni.core.errors import INVALID_CONFIG, LINK_FAILURE, CNIError
from rdmanet.cni.linux import vf_settings as vs
from rdmanet.cni.linux.vf_settings import VfSettings

PF_INDEX = 7


def kernel_vf(**over):
    state = {"mac": "00:00:00:00:00:00", "vlan": 0, "qos": 0, "proto": 0x8100, "min": 0, "max": 0,
             "spoofchk": 1, "trust": 0, "link_state": 0}
    state.update(over)
    return state


class FakePF:
    """An IPRoute stand-in holding one PF's VF table, answering like the kernel's do_setvfinfo /
    rtnl_fill_vfinfo (and netdevsim: out-of-range VF -> EINVAL)."""

    def __init__(self, num_vfs=4, name="eth0"):
        self.name = name
        self.vfs = {i: kernel_vf() for i in range(num_vfs)}
        self.fail = {}  # IFLA_VF_* -> errno
        self.refuse = lambda name, entry: None  # or an errno for this request
        self.mac_busy = 0  # answer EBUSY to this many MAC requests
        self.mac_sticks = True  # False: accept MAC requests but keep the old MAC
        self.requests = []  # (IFLA_VF_* name, decoded payload) per set request
        self.raw = []  # encoded hand-built requests
        self.seq = 0
        self.outcome = {}  # msg_seq -> answer or NetlinkError, for get()
        self.cleaned = []
        self.gets = 0

    # -- the IPRoute API used by vf_settings
    def link(self, command, **kw):
        if kw.get("index") != PF_INDEX:
            raise NetlinkError(errno.ENODEV, "No such device")
        if command == "get":
            assert kw.get("ext_mask") == vs.RTEXT_FILTER_VF, "VF info needs ext_mask RTEXT_FILTER_VF"
            self.gets += 1
            return [self._answer()]
        assert command == "set"
        return self._set(self._request(kw))

    def put(self, msg, msg_type, msg_flags):
        """A hand-built request (vf_settings.vlan_list_msg): check the header, encode it as the
        socket would, decode it with pyroute2's real ifinfmsg; get() gives the outcome."""
        assert msg_type == RTM_NEWLINK and msg_flags == NLM_F_REQUEST | NLM_F_ACK
        msg.encode()
        self.raw.append(bytes(msg.data))
        decoded = ifinfmsg(msg.data)
        decoded.decode()
        self.seq += 1
        try:
            if decoded["index"] != PF_INDEX:
                raise NetlinkError(errno.ENODEV, "No such device")
            self.outcome[self.seq] = self._set(decoded)
        except NetlinkError as exc:
            self.outcome[self.seq] = exc
        return types.SimpleNamespace(msg_seq=self.seq, cleanup=lambda: self.cleaned.append(True))

    def get(self, msg_seq):
        outcome = self.outcome.pop(msg_seq)
        if isinstance(outcome, NetlinkError):
            raise outcome
        return outcome

    @staticmethod
    def _request(kw):
        """The request message exactly as pyroute2 would send it, encoded and decoded again."""
        rf = get_arguments_processor("link", "set", copy.deepcopy(kw))
        msg = ifinfmsg()
        for field in msg.fields:
            msg[field[0]] = rf.get_value(field[0], default=0, mode="field")
        for key, value in rf.items():
            nla = ifinfmsg.name2nla(key)
            if msg.valid_nla(nla) and value is not None:
                msg["attrs"].append([nla, value])
        msg.encode()
        decoded = ifinfmsg(msg.data)
        decoded.decode()
        return decoded

    def _set(self, msg):
        infos = msg.get_attr("IFLA_VFINFO_LIST").get_attrs("IFLA_VF_INFO")
        assert len(infos) == 1
        attrs = infos[0]["attrs"]
        assert len(attrs) == 1, f"one VF attribute per request, got {attrs}"
        name, payload = attrs[0]
        self.requests.append((name, dict(payload) if name != "IFLA_VF_VLAN_LIST" else
                              [dict(e) for e in payload.get_attrs("IFLA_VF_VLAN_INFO")]))
        if name in self.fail:
            raise NetlinkError(self.fail[name], "refused")
        entry = payload.get_attrs("IFLA_VF_VLAN_INFO")[0] if name == "IFLA_VF_VLAN_LIST" else payload
        code = self.refuse(name, entry)
        if code:
            raise NetlinkError(code, "refused")
        vf = entry["vf"]
        if vf not in self.vfs:
            raise NetlinkError(errno.EINVAL, "Invalid argument")
        state = self.vfs[vf]
        if name == "IFLA_VF_MAC":
            if self.mac_busy:
                self.mac_busy -= 1
                raise NetlinkError(errno.EBUSY, "busy")
            if self.mac_sticks:
                state["mac"] = entry["mac"]
        elif name == "IFLA_VF_VLAN":
            state.update(vlan=entry["vlan"], qos=entry["qos"], proto=0x8100)
        elif name == "IFLA_VF_VLAN_LIST":
            state.update(vlan=entry["vlan"], qos=entry["qos"], proto=entry["proto"])
        elif name == "IFLA_VF_RATE":
            state.update(min=entry["min_tx_rate"], max=entry["max_tx_rate"])
        elif name == "IFLA_VF_SPOOFCHK":
            state["spoofchk"] = entry["spoofchk"]
        elif name == "IFLA_VF_TRUST":
            state["trust"] = entry["trust"]
        elif name == "IFLA_VF_LINK_STATE":
            state["link_state"] = entry["link_state"]
        else:
            raise AssertionError(f"unexpected {name}")
        return [msg]

    def _answer(self):
        vfinfo = []
        for i, st in sorted(self.vfs.items()):
            vfinfo.append(("IFLA_VF_INFO", {"attrs": [
                ("IFLA_VF_MAC", {"vf": i, "mac": st["mac"]}),
                ("IFLA_VF_VLAN", {"vf": i, "vlan": st["vlan"], "qos": st["qos"]}),
                ("IFLA_VF_VLAN_LIST", {"attrs": [("IFLA_VF_VLAN_INFO",
                                                  {"vf": i, "vlan": st["vlan"], "qos": st["qos"], "proto": st["proto"]})]}),
                ("IFLA_VF_TX_RATE", {"vf": i, "tx_rate": st["max"]}),
                ("IFLA_VF_SPOOFCHK", {"vf": i, "spoofchk": st["spoofchk"]}),
                ("IFLA_VF_LINK_STATE", {"vf": i, "link_state": st["link_state"]}),
                ("IFLA_VF_RATE", {"vf": i, "min_tx_rate": st["min"], "max_tx_rate": st["max"]}),
                ("IFLA_VF_TRUST", {"vf": i, "trust": st["trust"]}),
            ]}))
        msg = ifinfmsg()
        msg["index"] = PF_INDEX
        msg["attrs"] = [("IFLA_IFNAME", self.name), ("IFLA_NUM_VF", len(self.vfs)),
                        ("IFLA_VFINFO_LIST", {"attrs": vfinfo})]
        msg.encode()
        decoded = ifinfmsg(msg.data)
        decoded.decode()
        return decoded


@pytest.fixture
def pf():
    return FakePF()


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch):
    slept = []
    monkeypatch.setattr(vs.time, "sleep", slept.append)
    return slept


WANTED = VfSettings(mac="02:AA:BB:CC:DD:01", vlan=100, qos=3, spoofchk=False, trust=True,
                    link_state="disable", min_tx_rate=10, max_tx_rate=100)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("wanted, message", [
    (VfSettings(vlan=4095), "vlan 4095 is outside 0-4094"),
    (VfSettings(vlan=-1), "vlan -1 is outside 0-4094"),
    (VfSettings(vlan=10, qos=8), "vlanQoS 8 is outside 0-7"),
    (VfSettings(qos=3), "vlan must be set to set vlanQoS"),
    (VfSettings(qos=0), "vlan must be set to set vlanQoS"),
    (VfSettings(vlan=0, qos=1), "vlanQoS 1 needs a non-zero vlan"),
    (VfSettings(vlan_proto="802.1ad"), "vlan must be set to set vlanProto"),
    (VfSettings(vlan=0, vlan_proto="802.1AD"), "802.1ad needs a non-zero vlan"),
    (VfSettings(vlan=5, vlan_proto="802.1x"), "is not 802.1q or 802.1ad"),
    (VfSettings(link_state="up"), "link_state 'up' is not auto, enable or disable"),
    (VfSettings(mac="02:00:00:00:00"), "is not a MAC address"),
    (VfSettings(mac="03:00:00:00:00:01"), "multicast"),
    (VfSettings(min_tx_rate=-1), "min_tx_rate -1 is outside"),
    (VfSettings(min_tx_rate=200, max_tx_rate=100), "min_tx_rate 200 is above max_tx_rate 100"),
    (VfSettings(vlan=True), "vlan must be an integer"),
    (VfSettings(spoofchk="on"), "spoofchk must be a boolean"),
])
def test_validate_rejects_like_sriov_cni(wanted, message):
    with pytest.raises(CNIError) as info:
        vs.validate(wanted)
    assert info.value.code == INVALID_CONFIG
    assert message in info.value.msg
    assert info.value.details


def test_validate_normalises_and_fills_sriov_cni_defaults():
    out = vs.validate(VfSettings(mac="02-AA-bb-CC-dd-01", vlan=100, vlan_proto="802.1AD", link_state="Enable"))
    assert out == VfSettings(mac="02:aa:bb:cc:dd:01", vlan=100, qos=0, vlan_proto="802.1ad", link_state="enable")
    assert vs.validate(VfSettings(vlan=0)) == VfSettings(vlan=0, qos=0, vlan_proto="802.1q")
    assert vs.validate(VfSettings(vlan=4094, qos=7, vlan_proto="802.1Q")).vlan_proto == "802.1q"
    assert vs.validate(VfSettings(min_tx_rate=50, max_tx_rate=0)).max_tx_rate == 0  # 0 = no limit
    assert vs.validate(VfSettings(mac="00:00:00:00:00:00")).mac == vs.ZERO_MAC  # "no admin MAC"
    assert vs.validate(VfSettings()) == VfSettings()


def test_validate_does_not_modify_its_argument():
    wanted = VfSettings(vlan=5, vlan_proto="802.1AD")
    vs.validate(wanted)
    assert wanted == VfSettings(vlan=5, vlan_proto="802.1AD")


# --------------------------------------------------------------------------- snapshot JSON


def test_snapshot_json_round_trip():
    snap = VfSettings(mac="00:00:00:00:00:00", vlan=0, qos=0, vlan_proto="802.1q", spoofchk=True, trust=False,
                      link_state="auto", min_tx_rate=0, max_tx_rate=0)
    text = json.dumps(snap.to_dict())
    assert VfSettings.from_dict(json.loads(text)) == snap
    assert VfSettings(trust=False).to_dict() == {"trust": False}  # None fields are left out
    assert VfSettings.from_dict({}) == VfSettings()
    assert VfSettings.from_dict({"vlan": None}) == VfSettings()


@pytest.mark.parametrize("data, message", [
    ({"vlan_id": 3}, "unknown VF settings ['vlan_id']"),
    ({"vlan": "3"}, "vlan must be int"),
    ({"trust": 1}, "trust must be bool"),
    ({"min_tx_rate": True}, "min_tx_rate must be int"),
    ([], "must be a JSON object"),
])
def test_from_dict_rejects_garbage(data, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        VfSettings.from_dict(data)


# --------------------------------------------------------------------------- diff and plan


CURRENT = VfSettings(mac="00:00:00:00:00:00", vlan=0, qos=0, vlan_proto="802.1q", spoofchk=True, trust=False,
                     link_state="auto", min_tx_rate=0, max_tx_rate=0)


def test_changed_fields_and_plan_groups():
    wanted = vs.validate(VfSettings(vlan=100, spoofchk=True, trust=True, max_tx_rate=100))
    assert vs.changed_fields(CURRENT, wanted) == ["vlan", "trust", "max_tx_rate"]
    steps = vs.plan(CURRENT, wanted)
    assert [s[0] for s in steps] == ["vlan", "rate", "trust"]
    name, new, old = steps[0]
    assert new == VfSettings(vlan=100, qos=0, vlan_proto="802.1q")
    assert old == VfSettings(vlan=0, qos=0, vlan_proto="802.1q")  # the whole group
    name, new, old = steps[1]
    assert new == VfSettings(min_tx_rate=0, max_tx_rate=100)  # min left None: keeps its value
    assert old == VfSettings(min_tx_rate=0, max_tx_rate=0)


def test_plan_is_empty_when_nothing_differs():
    same = vs.validate(VfSettings(mac="00:00:00:00:00:00", vlan=0, spoofchk=True, link_state="auto"))
    assert vs.changed_fields(CURRENT, same) == []
    assert vs.plan(CURRENT, same) == []


def test_plan_proto_alone_changes_the_vlan_group():
    cur = VfSettings(vlan=100, qos=3, vlan_proto="802.1q")
    steps = vs.plan(cur, vs.validate(VfSettings(vlan=100, qos=3, vlan_proto="802.1ad")))
    assert [(s[0], s[1].vlan_proto, s[2].vlan_proto) for s in steps] == [("vlan", "802.1ad", "802.1q")]


def test_vf_request_shapes():
    assert vs.vf_request(1, "vlan", VfSettings(vlan=100, qos=3, vlan_proto="802.1q")) == \
        {"vf": 1, "vlan": {"vlan": 100, "qos": 3}}
    with pytest.raises(ValueError, match="vlan_list_msg"):
        vs.vf_request(1, "vlan", VfSettings(vlan=100, qos=3, vlan_proto="802.1ad"))
    assert vs.vf_request(2, "rate", VfSettings(min_tx_rate=10, max_tx_rate=100)) == \
        {"vf": 2, "rate": {"min_tx_rate": 10, "max_tx_rate": 100}}
    assert vs.vf_request(0, "spoofchk", VfSettings(spoofchk=False)) == {"vf": 0, "spoofchk": 0}
    assert vs.vf_request(0, "trust", VfSettings(trust=True)) == {"vf": 0, "trust": 1}
    assert vs.vf_request(0, "link_state", VfSettings(link_state="disable")) == {"vf": 0, "link_state": 2}
    assert vs.vf_request(0, "mac", VfSettings(mac="02:00:00:00:00:01")) == {"vf": 0, "mac": "02:00:00:00:00:01"}


def test_vlan_list_msg_carries_the_whole_struct_ifla_vf_vlan_info():
    FakePF()._answer()  # pyroute2's ifinfmsg in use first (its compiled NLA tables must not leak in)
    msg = vs.vlan_list_msg(PF_INDEX, 3, VfSettings(vlan=200, qos=5, vlan_proto="802.1ad"))
    msg["header"]["type"] = RTM_NEWLINK
    msg.encode()
    data = bytes(msg.data)
    # nlmsghdr 16 + ifinfomsg 16, then the nest: VFINFO_LIST(22) > VF_INFO(1) > VF_VLAN_LIST(12) > VLAN_INFO(1)
    assert data[32:].hex() == (
        "20001600" "1c000100" "18000c00" "14000100"  # len 20 = 4 + sizeof(struct ifla_vf_vlan_info) 16
        "03000000" "c8000000" "05000000" "88a8" "0000"  # vf 3, vlan 200, qos 5, __be16 0x88a8, padding
    )
    assert int.from_bytes(data[20:24], "little") == PF_INDEX


def test_describe():
    assert WANTED.describe() == ("vlan 100 qos 3 proto None, mac 02:AA:BB:CC:DD:01, min_tx_rate 10 max_tx_rate 100 Mbps, "
                                 "spoofchk off, trust on, link_state disable")
    assert VfSettings().describe() == "nothing"


# --------------------------------------------------------------------------- read


def test_read_vf_fills_every_field(pf):
    pf.vfs[2] = kernel_vf(mac="02:00:00:00:00:02", vlan=7, qos=2, proto=0x88A8, min=5, max=50, spoofchk=0, trust=1,
                          link_state=2)
    assert vs.read_vf(pf, PF_INDEX, 2) == VfSettings(
        mac="02:00:00:00:00:02", vlan=7, qos=2, vlan_proto="802.1ad", spoofchk=False, trust=True,
        link_state="disable", min_tx_rate=5, max_tx_rate=50)
    assert vs.read_vf(pf, PF_INDEX, 0) == CURRENT


def test_read_vf_unreported_flags_and_proto_zero(pf):
    pf.vfs[1] = kernel_vf(proto=0, spoofchk=vs.U32_UNSET, trust=vs.U32_UNSET)
    got = vs.read_vf(pf, PF_INDEX, 1)
    assert got.vlan_proto == "802.1q"  # netdevsim reports 0 until a VLAN is set
    assert got.spoofchk is None and got.trust is None  # (u32)-1: the driver does not say


def test_read_vf_missing_vf_is_a_clear_error(pf):
    with pytest.raises(CNIError) as info:
        vs.read_vf(pf, PF_INDEX, 4)
    assert info.value.code == LINK_FAILURE
    assert info.value.msg == "VF 4 of eth0 does not exist: eth0 reports VFs 0-3"
    assert "sriov_numvfs (4)" in info.value.details


def test_read_vf_pf_without_vfs(pf):
    pf.vfs = {}
    with pytest.raises(CNIError, match="VF 0 of eth0 does not exist: eth0 reports no VFs"):
        vs.read_vf(pf, PF_INDEX, 0)


def test_read_vf_missing_pf(pf):
    with pytest.raises(CNIError, match="PF index 99: No such device"):
        vs.read_vf(pf, 99, 0)


# --------------------------------------------------------------------------- apply and restore


def test_apply_then_restore_round_trip(pf):
    before = copy.deepcopy(pf.vfs)
    snap = vs.apply_vf(pf, PF_INDEX, 1, WANTED)
    assert vs.read_vf(pf, PF_INDEX, 1) == VfSettings(
        mac="02:aa:bb:cc:dd:01", vlan=100, qos=3, vlan_proto="802.1q", spoofchk=False, trust=True,
        link_state="disable", min_tx_rate=10, max_tx_rate=100)
    # one request per group, in sriov-cni's order, the attributes pyroute2 really encodes
    assert [name for name, _ in pf.requests] == ["IFLA_VF_VLAN", "IFLA_VF_MAC", "IFLA_VF_RATE", "IFLA_VF_SPOOFCHK",
                                                 "IFLA_VF_TRUST", "IFLA_VF_LINK_STATE"]
    assert pf.requests[0][1] == {"vf": 1, "vlan": 100, "qos": 3}
    assert pf.requests[2][1] == {"vf": 1, "min_tx_rate": 10, "max_tx_rate": 100}
    assert snap == CURRENT  # every field changed, so the snapshot holds the previous value of each
    assert VfSettings.from_dict(json.loads(json.dumps(snap.to_dict()))) == snap
    assert {i: pf.vfs[i] for i in (0, 2, 3)} == {i: before[i] for i in (0, 2, 3)}  # other VFs untouched

    pf.requests.clear()
    vs.restore_vf(pf, PF_INDEX, 1, snap)
    assert pf.vfs == before
    assert [name for name, _ in pf.requests] == ["IFLA_VF_LINK_STATE", "IFLA_VF_TRUST", "IFLA_VF_SPOOFCHK",
                                                 "IFLA_VF_RATE", "IFLA_VF_MAC", "IFLA_VF_VLAN"]


def test_apply_snapshots_only_what_changed(pf):
    snap = vs.apply_vf(pf, PF_INDEX, 0, VfSettings(spoofchk=True, trust=True, vlan=0))
    assert snap == VfSettings(trust=False)  # spoofchk was on already, vlan 0 already
    assert [name for name, _ in pf.requests] == ["IFLA_VF_TRUST"]
    pf.requests.clear()
    assert vs.apply_vf(pf, PF_INDEX, 0, VfSettings(spoofchk=True, trust=True)) == VfSettings()
    assert pf.requests == []
    vs.restore_vf(pf, PF_INDEX, 0, VfSettings())  # empty snapshot: nothing sent
    assert pf.requests == [] and pf.gets == 2


def test_apply_8021ad_uses_the_vlan_list(pf):
    snap = vs.apply_vf(pf, PF_INDEX, 3, VfSettings(vlan=200, qos=1, vlan_proto="802.1AD"))
    assert pf.requests == [("IFLA_VF_VLAN_LIST", [{"vf": 3, "vlan": 200, "qos": 1, "proto": 0x88A8}])]
    assert len(pf.raw) == 1 and pf.raw[0][44:48].hex() == "14000100"  # IFLA_VF_VLAN_INFO of 4 + 16 bytes
    assert pf.cleaned == [True] and pf.outcome == {}
    assert pf.vfs[3]["proto"] == 0x88A8
    assert snap == VfSettings(vlan=0, qos=0, vlan_proto="802.1q")
    vs.restore_vf(pf, PF_INDEX, 3, snap)
    assert pf.requests[-1] == ("IFLA_VF_VLAN", {"vf": 3, "vlan": 0, "qos": 0})
    assert pf.vfs[3] == kernel_vf()


def test_apply_invalid_settings_sends_nothing(pf):
    with pytest.raises(CNIError) as info:
        vs.apply_vf(pf, PF_INDEX, 1, VfSettings(qos=3))
    assert info.value.code == INVALID_CONFIG
    assert pf.requests == [] and pf.gets == 0


def test_apply_missing_vf(pf):
    with pytest.raises(CNIError, match="VF 9 of eth0 does not exist"):
        vs.apply_vf(pf, PF_INDEX, 9, VfSettings(trust=True))
    assert pf.requests == []


def test_kernel_refusal_names_what_vf_pf_and_fix_and_undoes_earlier_changes(pf):
    before = copy.deepcopy(pf.vfs)
    pf.fail["IFLA_VF_TRUST"] = errno.EOPNOTSUPP
    with pytest.raises(CNIError) as info:
        vs.apply_vf(pf, PF_INDEX, 1, WANTED)
    err = info.value
    assert err.code == LINK_FAILURE
    assert err.msg == "enable trust on VF 1 of eth0: Operation not supported"
    assert "does not support this VF setting; remove trust from the network config" in err.details
    assert f"(errno {errno.EOPNOTSUPP})" in err.details
    assert "(vlan, mac, rate, spoofchk) were restored" in err.details
    assert pf.vfs == before


def test_refused_undo_is_reported(pf):
    pf.fail["IFLA_VF_LINK_STATE"] = errno.EINVAL
    pf.fail["IFLA_VF_SPOOFCHK"] = errno.EPERM
    with pytest.raises(CNIError) as info:
        vs.apply_vf(pf, PF_INDEX, 0, VfSettings(trust=True, link_state="enable"))
    assert info.value.msg == "set link_state enable on VF 0 of eth0: Invalid argument"
    assert "restoring the settings changed before it also failed" not in info.value.details
    assert "(trust) were restored" in info.value.details
    assert pf.vfs[0] == kernel_vf()
    # now make the undo fail too: setting VLAN 5 works, going back to 0 does not
    pf.fail = {"IFLA_VF_LINK_STATE": errno.EINVAL}
    pf.refuse = lambda name, entry: errno.EIO if name == "IFLA_VF_VLAN" and entry["vlan"] == 0 else None
    with pytest.raises(CNIError) as info:
        vs.apply_vf(pf, PF_INDEX, 0, VfSettings(vlan=5, link_state="enable"))
    assert info.value.msg == "set link_state enable on VF 0 of eth0: Invalid argument"
    assert "restoring the settings changed before it also failed: could not restore VF 0 of eth0: " \
           "set vlan 0 qos 0 proto 802.1q: Input/output error" in info.value.details


def test_kernel_einval_for_out_of_range_vf_on_set(pf, monkeypatch):
    # read_vf normally catches it; a VF that vanished between read and set gets the kernel's EINVAL
    monkeypatch.setattr(vs, "_read", lambda ipr, idx, vf: (CURRENT, "eth0"))
    with pytest.raises(CNIError) as info:
        vs.apply_vf(pf, PF_INDEX, 4, VfSettings(trust=True))
    assert info.value.msg == "enable trust on VF 4 of eth0: Invalid argument"
    assert "not below its sriov_numvfs" in info.value.details


def test_mac_retried_on_ebusy(pf, no_sleep):
    pf.mac_busy = 3
    snap = vs.apply_vf(pf, PF_INDEX, 2, VfSettings(mac="02:00:00:00:00:22"))
    assert snap == VfSettings(mac="00:00:00:00:00:00")
    assert pf.vfs[2]["mac"] == "02:00:00:00:00:22"
    assert no_sleep == [vs.MAC_RETRY_DELAY] * 3
    assert [n for n, _ in pf.requests].count("IFLA_VF_MAC") == 4


def test_mac_that_does_not_stick_fails_after_20_attempts(pf, no_sleep):
    pf.mac_sticks = False
    with pytest.raises(CNIError) as info:
        vs.apply_vf(pf, PF_INDEX, 2, VfSettings(mac="02:00:00:00:00:22"))
    assert info.value.msg == ("set mac 02:00:00:00:00:22 on VF 2 of eth0: it reads back as 00:00:00:00:00:00 "
                              "after 20 attempts")
    assert len(no_sleep) == 19 and len(pf.requests) == 20


def test_mac_permanent_error_is_not_retried(pf, no_sleep):
    pf.fail["IFLA_VF_MAC"] = errno.EINVAL
    with pytest.raises(CNIError, match=r"^set mac 02:00:00:00:00:22 on VF 2 of eth0: Invalid argument$"):
        vs.apply_vf(pf, PF_INDEX, 2, VfSettings(mac="02:00:00:00:00:22"))
    assert no_sleep == [] and len(pf.requests) == 1


def test_mac_busy_all_the_time(pf, no_sleep):
    pf.mac_busy = 100
    with pytest.raises(CNIError, match="Device or resource busy"):
        vs.apply_vf(pf, PF_INDEX, 2, VfSettings(mac="02:00:00:00:00:22"))
    assert len(pf.requests) == 20


def test_restore_is_best_effort_and_lists_every_failure(pf):
    before = copy.deepcopy(pf.vfs)
    snap = vs.apply_vf(pf, PF_INDEX, 1, WANTED)
    pf.fail = {"IFLA_VF_TRUST": errno.EOPNOTSUPP, "IFLA_VF_RATE": errno.EINVAL}
    with pytest.raises(CNIError) as info:
        vs.restore_vf(pf, PF_INDEX, 1, snap)
    assert info.value.code == LINK_FAILURE
    assert info.value.msg == ("could not restore VF 1 of eth0: disable trust: Operation not supported; "
                              "set min_tx_rate 0 max_tx_rate 0 Mbps: Invalid argument")
    # everything else was restored
    got = pf.vfs[1]
    assert (got["mac"], got["vlan"], got["qos"], got["spoofchk"], got["link_state"]) == \
           ("00:00:00:00:00:00", 0, 0, 1, 0)
    assert got["trust"] == 1 and got["max"] == 100
    pf.fail = {}
    vs.restore_vf(pf, PF_INDEX, 1, snap)
    assert pf.vfs == before


def test_restore_partial_group_takes_the_rest_from_the_vf(pf):
    vs.apply_vf(pf, PF_INDEX, 1, VfSettings(min_tx_rate=10, max_tx_rate=100))
    vs.restore_vf(pf, PF_INDEX, 1, VfSettings(max_tx_rate=0))
    assert (pf.vfs[1]["min"], pf.vfs[1]["max"]) == (10, 0)


def test_restore_when_the_vf_is_gone(pf):
    with pytest.raises(CNIError) as info:
        vs.restore_vf(pf, PF_INDEX, 8, VfSettings(trust=False))
    assert info.value.msg == ("could not restore VF 8 (trust off): VF 8 of eth0 does not exist: "
                              "eth0 reports VFs 0-3")
