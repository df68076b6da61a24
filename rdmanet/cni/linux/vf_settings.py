"""SR-IOV VF settings applied through the PF over rtnetlink: sriov-cni's VF knobs, and their restore.

The PF holds each VF's administrative settings; they are set with RTM_NEWLINK on the PF carrying
``IFLA_VFINFO_LIST`` → ``IFLA_VF_INFO`` → one ``IFLA_VF_*`` attribute (pyroute2:
``ipr.link("set", index=pf_index, vf={"vf": n, ...})``) and read back from the PF's
``IFLA_VFINFO_LIST`` (a GETLINK with ``ext_mask=RTEXT_FILTER_VF``).

:class:`VfSettings` has one Optional field per knob (None = leave alone / unknown):

================ ================================ ==============================================
field            values                           kernel attribute (one request per row)
================ ================================ ==============================================
mac              "aa:bb:cc:dd:ee:ff" (admin MAC)  IFLA_VF_MAC, retried and read back
vlan, qos,       0-4094, 0-7,                     IFLA_VF_VLAN (802.1q) or IFLA_VF_VLAN_LIST
vlan_proto       "802.1q" | "802.1ad"             (802.1ad: see VlanListMsg), all three at once
min_tx_rate,     Mbps, 0 = no limit               IFLA_VF_RATE, both at once
max_tx_rate
spoofchk         bool                             IFLA_VF_SPOOFCHK
trust            bool                             IFLA_VF_TRUST
link_state       "auto" | "enable" | "disable"    IFLA_VF_LINK_STATE
================ ================================ ==============================================

:func:`apply_vf` changes only what differs from the VF's current settings and returns the
snapshot of the previous values of exactly what it changed; :func:`restore_vf` writes such a
snapshot back (best effort, every field attempted). Snapshots go through ``to_dict`` /
``from_dict`` into the plugin's JSON state file.

Rules (sriov-cni's ``LoadConf``; :func:`validate`): ``vlan`` 0-4094; ``qos`` 0-7 and only with
``vlan`` set, a non-zero ``qos`` needs a non-zero ``vlan``; ``vlan_proto`` only with ``vlan`` set,
case-insensitive, 802.1ad needs a non-zero ``vlan``. When ``vlan`` is set, a missing ``qos`` means
0 and a missing ``vlan_proto`` 802.1q, as in sriov-cni (the three are one kernel request).
Unlike sriov-cni, a rate left None keeps its current value instead of being reset to 0.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Optional

from pyroute2.netlink import nla, nlmsg
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWLINK

from rdmanet.cni.core.errors import INVALID_CONFIG, LINK_FAILURE, CNIError

from .netlink_request import send

RTEXT_FILTER_VF = 1
LINK_STATES = {"auto": 0, "enable": 1, "disable": 2}  # IFLA_VF_LINK_STATE_*
LINK_STATE_NAMES = {v: k for k, v in LINK_STATES.items()}
VLAN_PROTOS = {"802.1q": 0x8100, "802.1ad": 0x88A8}  # ETH_P_8021Q, ETH_P_8021AD
VLAN_PROTO_NAMES = {v: k for k, v in VLAN_PROTOS.items()}
U32_UNSET = 0xFFFFFFFF  # the kernel reports spoofchk / trust as (u32)-1 when the driver does not
ZERO_MAC = "00:00:00:00:00:00"

MAC_ATTEMPTS = 20  # sriov-cni: 20 tries 100 ms apart, each verified by reading the MAC back
MAC_RETRY_DELAY = 0.1
# errnos for which another MAC attempt cannot help
PERMANENT_ERRNOS = frozenset({errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES, errno.ENODEV,
                              errno.ENOENT, errno.ERANGE, errno.EADDRNOTAVAIL})

FIELDS = ("mac", "vlan", "qos", "vlan_proto", "spoofchk", "trust", "link_state", "min_tx_rate", "max_tx_rate")

# The kernel requests, in the order apply_vf sends them (sriov-cni's order; restore goes backwards).
# Each group's fields are written together, so a changed group is snapshotted whole.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vlan", ("vlan", "qos", "vlan_proto")),
    ("mac", ("mac",)),
    ("rate", ("min_tx_rate", "max_tx_rate")),
    ("spoofchk", ("spoofchk",)),
    ("trust", ("trust",)),
    ("link_state", ("link_state",)),
)

# sriov-cni's config keys, for the messages that tell a user what to change
CONFIG_KEYS = {
    "vlan": "vlan / vlanQoS / vlanProto",
    "mac": "mac",
    "rate": "min_tx_rate / max_tx_rate",
    "spoofchk": "spoofchk",
    "trust": "trust",
    "link_state": "link_state",
}

_MAC_RE = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


@dataclass
class VfSettings:
    """A VF's PF-side settings; None = leave alone (wanted) / not known or not changed (snapshot)."""

    mac: Optional[str] = None
    vlan: Optional[int] = None
    qos: Optional[int] = None
    vlan_proto: Optional[str] = None
    spoofchk: Optional[bool] = None
    trust: Optional[bool] = None
    link_state: Optional[str] = None
    min_tx_rate: Optional[int] = None
    max_tx_rate: Optional[int] = None

    def fields_set(self) -> list[str]:
        return [f for f in FIELDS if getattr(self, f) is not None]

    def is_empty(self) -> bool:
        return not self.fields_set()

    def to_dict(self) -> dict[str, Any]:
        """The fields that are not None (JSON types only)."""
        return {f: getattr(self, f) for f in self.fields_set()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VfSettings":
        """The inverse of ``to_dict``; ValueError on unknown keys or wrong types."""
        if not isinstance(data, dict):
            raise ValueError(f"VF settings must be a JSON object, not {type(data).__name__}")
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise ValueError(f"unknown VF settings {unknown} (known: {', '.join(FIELDS)})")
        types = {"mac": str, "vlan_proto": str, "link_state": str, "spoofchk": bool, "trust": bool}
        for key, value in data.items():
            if value is None:
                continue
            want = types.get(key, int)
            if not isinstance(value, want) or (want is int and isinstance(value, bool)):
                raise ValueError(f"VF setting {key} must be {want.__name__}, not {value!r}")
        return cls(**data)

    def describe(self) -> str:
        """``mac 02:..., vlan 100 qos 3 proto 802.1q, spoofchk off, ...`` (the set fields only)."""
        parts = []
        for name, fields in GROUPS:
            if any(getattr(self, f) is not None for f in fields):
                parts.append(_describe_group(name, self))
        return ", ".join(parts) or "nothing"


def _onoff(value: Optional[bool]) -> str:
    return "?" if value is None else ("on" if value else "off")


def _describe_group(name: str, s: VfSettings) -> str:
    if name == "vlan":
        return f"vlan {s.vlan} qos {s.qos} proto {s.vlan_proto}"
    if name == "rate":
        return f"min_tx_rate {s.min_tx_rate} max_tx_rate {s.max_tx_rate} Mbps"
    if name in ("spoofchk", "trust"):
        return f"{name} {_onoff(getattr(s, name))}"
    return f"{name} {getattr(s, name)}"


# --------------------------------------------------------------------------- pure parts


def normalize_mac(value: str) -> str:
    """``AA-BB-...`` / ``aa:bb:...`` → ``aa:bb:cc:dd:ee:ff``; ValueError when it is not a MAC."""
    mac = str(value).strip().lower().replace("-", ":")
    if not _MAC_RE.match(mac):
        raise ValueError(f"{value!r} is not a MAC address like 0a:58:0a:01:01:05")
    return mac


def validate(wanted: VfSettings) -> VfSettings:
    """Check ``wanted`` with sriov-cni's rules and return it normalised (MAC and protocol lowercase;
    ``qos`` 0 and ``vlan_proto`` 802.1q filled in when ``vlan`` is set). CNIError 7 when invalid.
    Beyond sriov-cni: the MAC must be unicast (or all zero, "no admin MAC"), the rates fit the
    kernel's u32, and min_tx_rate <= max_tx_rate when both are non-zero."""

    def bad(msg: str, fix: str) -> CNIError:
        return CNIError(INVALID_CONFIG, f"invalid VF settings: {msg}", fix)

    out = dataclasses.replace(wanted)
    for f in ("vlan", "qos", "min_tx_rate", "max_tx_rate"):
        value = getattr(out, f)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise bad(f"{f} must be an integer, not {value!r}", f"give {f} as a JSON number")
    for f in ("spoofchk", "trust"):
        value = getattr(out, f)
        if value is not None and not isinstance(value, bool):
            raise bad(f"{f} must be a boolean, not {value!r}", f'give {f} as "on" or "off"')
    if out.mac is not None:
        try:
            out.mac = normalize_mac(out.mac)
        except ValueError as exc:
            raise bad(str(exc), "give the VF MAC address as six hex octets separated by colons") from None
        if out.mac != ZERO_MAC and int(out.mac[:2], 16) & 1:
            raise bad(f"{out.mac} is a multicast MAC address", "give a unicast MAC address (lowest bit of the first octet 0)")
    if out.vlan is None:
        if out.qos is not None:
            raise bad("vlan must be set to set vlanQoS", "add vlan (1-4094) or remove vlanQoS")
        if out.vlan_proto is not None:
            raise bad("vlan must be set to set vlanProto", "add vlan (1-4094) or remove vlanProto")
    else:
        if not 0 <= out.vlan <= 4094:
            raise bad(f"vlan {out.vlan} is outside 0-4094", "use a VLAN ID 1-4094, or 0 for no VLAN")
        if out.qos is None:
            out.qos = 0
        if not 0 <= out.qos <= 7:
            raise bad(f"vlanQoS {out.qos} is outside 0-7", "use a 802.1p priority 0-7")
        if out.qos != 0 and out.vlan == 0:
            raise bad(f"vlanQoS {out.qos} needs a non-zero vlan", "set vlan to 1-4094 or vlanQoS to 0")
        proto = "802.1q" if out.vlan_proto is None else str(out.vlan_proto).lower()
        if proto not in VLAN_PROTOS:
            raise bad(f"vlanProto {out.vlan_proto!r} is not 802.1q or 802.1ad", 'use "802.1q" (default) or "802.1ad"')
        if proto == "802.1ad" and out.vlan == 0:
            raise bad("vlanProto 802.1ad needs a non-zero vlan", "set vlan to 1-4094 or use 802.1q")
        out.vlan_proto = proto
    if out.link_state is not None:
        out.link_state = str(out.link_state).lower()
        if out.link_state not in LINK_STATES:
            raise bad(f"link_state {wanted.link_state!r} is not auto, enable or disable", 'use "auto", "enable" or "disable"')
    for f in ("min_tx_rate", "max_tx_rate"):
        value = getattr(out, f)
        if value is not None and not 0 <= value <= 0xFFFFFFFF:
            raise bad(f"{f} {value} is outside 0-4294967295 Mbps", f"give {f} in Mbps, 0 for no limit")
    if out.min_tx_rate and out.max_tx_rate and out.min_tx_rate > out.max_tx_rate:
        raise bad(f"min_tx_rate {out.min_tx_rate} is above max_tx_rate {out.max_tx_rate}",
                  "make min_tx_rate <= max_tx_rate (0 means no limit)")
    return out


def changed_fields(current: VfSettings, wanted: VfSettings) -> list[str]:
    """The fields ``wanted`` sets to a value other than ``current``'s (both normalised)."""
    return [f for f in wanted.fields_set() if getattr(wanted, f) != getattr(current, f)]


def plan(current: VfSettings, wanted: VfSettings) -> list[tuple[str, VfSettings, VfSettings]]:
    """The requests ``apply_vf`` sends, in order: ``(group, new values, previous values)`` for every
    group with a changed field. A request writes its whole group, so the new values take the
    fields ``wanted`` leaves None from ``current``, and the previous values cover the whole group.
    ``wanted`` must be validated."""
    changed = set(changed_fields(current, wanted))
    steps = []
    for name, fields in GROUPS:
        if not changed & set(fields):
            continue
        new, old = VfSettings(), VfSettings()
        for f in fields:
            value = getattr(wanted, f)
            setattr(new, f, getattr(current, f) if value is None else value)
            setattr(old, f, getattr(current, f))
        steps.append((name, new, old))
    return steps


class VlanListMsg(nlmsg):
    """RTM_NEWLINK ``IFLA_VFINFO_LIST`` → ``IFLA_VF_INFO`` → ``IFLA_VF_VLAN_LIST`` →
    ``IFLA_VF_VLAN_INFO`` with the whole 16-byte ``struct ifla_vf_vlan_info`` (vf, vlan, qos,
    __be16 vlan_proto, 2 bytes of tail padding). pyroute2's own ``ivvi`` (what
    ``vf={"vlan": [...]}`` sends) stops after vlan_proto, 14 bytes, and the kernel (6.1's
    do_setvfinfo checks ``nla_len(attr) < sizeof(struct ifla_vf_vlan_info)``) answers EINVAL.

    Not a subclass of pyroute2's ifinfmsg on purpose: pyroute2 marks a message class's NLA table
    compiled with a class attribute that subclasses inherit, so once any ifinfmsg was used a
    subclass would silently encode with ifinfmsg's tables (the 14-byte ivvi) instead of these."""

    fields = (("family", "B"), ("__align", "x"), ("ifi_type", "H"), ("index", "i"), ("flags", "I"), ("change", "I"))
    nla_map = ((22, "IFLA_VFINFO_LIST", "vflist"),)

    class vflist(nla):
        nla_map = ((1, "IFLA_VF_INFO", "vfinfo"),)

        class vfinfo(nla):
            nla_map = ((12, "IFLA_VF_VLAN_LIST", "vlist"),)

            class vlist(nla):
                nla_map = ((1, "IFLA_VF_VLAN_INFO", "info"),)

                class info(nla):
                    fields = (("vf", "I"), ("vlan", "I"), ("qos", "I"), ("proto", ">H"), ("pad", "H"))


def vlan_list_msg(pf_index: int, vf: int, values: VfSettings) -> VlanListMsg:
    """The request setting vlan, qos and a protocol other than 802.1Q (IFLA_VF_VLAN_LIST)."""
    msg = VlanListMsg()
    msg["index"] = pf_index
    info = {"vf": vf, "vlan": values.vlan, "qos": values.qos or 0, "proto": _proto_number(values.vlan_proto), "pad": 0}
    msg["attrs"] = [("IFLA_VFINFO_LIST", {"attrs": [("IFLA_VF_INFO", {"attrs": [
        ("IFLA_VF_VLAN_LIST", {"attrs": [("IFLA_VF_VLAN_INFO", info)]})]})]})]
    return msg


def uses_vlan_list(values: VfSettings) -> bool:
    return _proto_number(values.vlan_proto) != VLAN_PROTOS["802.1q"]


def vf_request(vf: int, group: str, values: VfSettings) -> dict[str, Any]:
    """The ``vf=`` argument of ``ipr.link("set", ...)`` writing ``group`` with ``values`` (a fresh
    dict: pyroute2 consumes it). Not for a VLAN with 802.1ad (``vlan_list_msg``)."""
    if group == "mac":
        return {"vf": vf, "mac": values.mac.lower()}
    if group == "vlan":
        if uses_vlan_list(values):
            raise ValueError("a VLAN protocol other than 802.1Q goes in vlan_list_msg()")
        return {"vf": vf, "vlan": {"vlan": values.vlan, "qos": values.qos or 0}}  # IFLA_VF_VLAN
    if group == "rate":
        return {"vf": vf, "rate": {"min_tx_rate": values.min_tx_rate or 0, "max_tx_rate": values.max_tx_rate or 0}}
    if group in ("spoofchk", "trust"):
        return {"vf": vf, group: int(bool(getattr(values, group)))}
    if group == "link_state":
        state = values.link_state
        return {"vf": vf, "link_state": LINK_STATES[state] if state in LINK_STATES else int(state)}  # as read
    raise ValueError(f"unknown VF settings group {group!r}")


def _proto_number(name: Optional[str]) -> int:
    if name is None:
        return VLAN_PROTOS["802.1q"]
    if name in VLAN_PROTOS:
        return VLAN_PROTOS[name]
    if name.startswith("0x"):  # a protocol read back that is neither (kept as found)
        return int(name, 16)
    raise ValueError(f"unknown VLAN protocol {name!r}")


def _proto_name(number: int) -> str:
    if number == 0:  # drivers that never set it (netdevsim before any VLAN request) mean 802.1Q
        return "802.1q"
    return VLAN_PROTO_NAMES.get(number, f"0x{number:04x}")


def _fix_for(code: int, group: str, pf: str) -> str:
    key = CONFIG_KEYS[group]
    if code == errno.EOPNOTSUPP:
        return f"the driver of {pf} does not support this VF setting; remove {key} from the network config"
    if code == errno.EINVAL:
        return (f"the driver of {pf} refused the value, or the VF index is not below its sriov_numvfs; "
                f"check {key} and the node's kernel log (dmesg)")
    if code in (errno.EPERM, errno.EACCES):
        return "the plugin needs CAP_NET_ADMIN in the host network namespace"
    if code == errno.EBUSY:
        return f"the VF is busy; retry, and check the node's kernel log (dmesg) for {pf}"
    return f"check the node's kernel log (dmesg) for {pf}"


class _Refused(Exception):
    """One request the kernel refused (or a MAC that did not stick): ``what: why``."""

    def __init__(self, group: str, what: str, why: str, fix: str) -> None:
        super().__init__(f"{what}: {why}")
        self.group, self.what, self.why, self.fix = group, what, why, fix

    def to_cni(self, vf: int, pf: str) -> CNIError:
        return CNIError(LINK_FAILURE, f"{self.what} on VF {vf} of {pf}: {self.why}", self.fix)


def _refused(group: str, what: str, code: int, pf: str) -> _Refused:
    return _Refused(group, what, os.strerror(code), f"{_fix_for(code, group, pf)} (errno {code})")


# --------------------------------------------------------------------------- kernel side


def parse_vfinfo(msg: Any) -> dict[int, VfSettings]:
    """``{vf index: VfSettings}`` from a GETLINK answer's ``IFLA_VFINFO_LIST`` (pyroute2 message)."""
    out: dict[int, VfSettings] = {}
    vflist = msg.get_attr("IFLA_VFINFO_LIST")
    if not vflist:
        return out
    for info in vflist.get_attrs("IFLA_VF_INFO"):
        s = VfSettings()
        index = None
        mac = info.get_attr("IFLA_VF_MAC")
        if mac is not None:
            index = mac["vf"]
            s.mac = str(mac["mac"]).lower()
        vlan = info.get_attr("IFLA_VF_VLAN")
        if vlan is not None:
            index = vlan["vf"] if index is None else index
            s.vlan, s.qos, s.vlan_proto = vlan["vlan"], vlan["qos"], "802.1q"
        vlist = info.get_attr("IFLA_VF_VLAN_LIST")
        if vlist is not None:
            entries = vlist.get_attrs("IFLA_VF_VLAN_INFO")
            if entries:
                s.vlan, s.qos, s.vlan_proto = entries[0]["vlan"], entries[0]["qos"], _proto_name(entries[0]["proto"])
        rate = info.get_attr("IFLA_VF_RATE")
        if rate is not None:
            index = rate["vf"] if index is None else index
            s.min_tx_rate, s.max_tx_rate = rate["min_tx_rate"], rate["max_tx_rate"]
        for name, attr in (("spoofchk", "IFLA_VF_SPOOFCHK"), ("trust", "IFLA_VF_TRUST")):
            value = info.get_attr(attr)
            if value is not None:
                index = value["vf"] if index is None else index
                if value[name] != U32_UNSET:
                    setattr(s, name, bool(value[name]))
        state = info.get_attr("IFLA_VF_LINK_STATE")
        if state is not None:
            index = state["vf"] if index is None else index
            s.link_state = LINK_STATE_NAMES.get(state["link_state"], str(state["link_state"]))
        if index is not None:
            out[index] = s
    return out


def _get_pf(ipr: Any, pf_index: int) -> Any:
    try:
        return ipr.link("get", index=pf_index, ext_mask=RTEXT_FILTER_VF)[0]
    except NetlinkError as exc:
        raise CNIError(LINK_FAILURE, f"read the VF settings of PF index {pf_index}: {os.strerror(exc.code)}",
                       f"the PF must exist in the plugin's network namespace (errno {exc.code})") from None


def _pf_name(msg: Any, pf_index: int) -> str:
    return msg.get_attr("IFLA_IFNAME") or f"index {pf_index}"


def _read(ipr: Any, pf_index: int, vf: int) -> tuple[VfSettings, str]:
    msg = _get_pf(ipr, pf_index)
    pf = _pf_name(msg, pf_index)
    vfs = parse_vfinfo(msg)
    if vf not in vfs:
        have = f"VFs 0-{max(vfs)}" if vfs else "no VFs"
        num = msg.get_attr("IFLA_NUM_VF")
        raise CNIError(
            LINK_FAILURE,
            f"VF {vf} of {pf} does not exist: {pf} reports {have}",
            f"the VF index must be below {pf}'s sriov_numvfs ({num if num is not None else len(vfs)}); "
            "check deviceID and /sys/class/net/<pf>/device/sriov_numvfs",
        )
    return vfs[vf], pf


def vf_exists(ipr: Any, pf_index: int, vf: int) -> bool:
    """Whether the PF with ifindex ``pf_index`` still reports VF ``vf`` (False when the PF is gone)."""
    try:
        return vf in parse_vfinfo(_get_pf(ipr, pf_index))
    except CNIError:
        return False


def snapshot_for(current: VfSettings, wanted: VfSettings) -> VfSettings:
    """What :func:`apply_vf` will return for ``wanted`` on a VF that has ``current``: the previous
    values of every group it will change. Recorded before the act, it lets a rollback or a DEL
    restore a VF whose ADD was interrupted half-way."""
    snapshot = VfSettings()
    for _, _, old in plan(current, validate(wanted)):
        for f in old.fields_set():
            setattr(snapshot, f, getattr(old, f))
    return snapshot


def read_vf(ipr: Any, pf_index: int, vf: int) -> VfSettings:
    """The current settings of VF ``vf`` of the PF with ifindex ``pf_index`` (``ipr`` is an IPRoute
    in the PF's netns). Fields the driver does not report stay None (e.g. spoofchk and trust of
    drivers without them). CNIError 100 when the PF or the VF does not exist."""
    return _read(ipr, pf_index, vf)[0]


def _action(group: str, values: VfSettings) -> str:
    """What a request does, for messages: "enable trust", "set vlan 100 qos 3 proto 802.1q"."""
    if group in ("spoofchk", "trust"):
        return f"{'enable' if getattr(values, group) else 'disable'} {group}"
    return "set " + _describe_group(group, values)


def _set(ipr: Any, pf_index: int, pf: str, vf: int, group: str, values: VfSettings) -> None:
    """Send one group's request; _Refused when the kernel says no."""
    try:
        if group == "vlan" and uses_vlan_list(values):
            send(ipr, vlan_list_msg(pf_index, vf, values), RTM_NEWLINK)
        else:
            ipr.link("set", index=pf_index, vf=vf_request(vf, group, values))
    except NetlinkError as exc:
        raise _refused(group, _action(group, values), exc.code, pf) from None


def _set_mac(ipr: Any, pf_index: int, pf: str, vf: int, mac: str) -> None:
    """Set the admin MAC and read it back, up to MAC_ATTEMPTS times MAC_RETRY_DELAY apart, as
    sriov-cni does (a VF being reset answers EBUSY or keeps its old MAC for a moment). Errnos that
    another attempt cannot change (PERMANENT_ERRNOS) fail at once."""
    mac = mac.lower()
    what = f"set mac {mac}"
    why = ""
    for attempt in range(MAC_ATTEMPTS):
        if attempt:
            time.sleep(MAC_RETRY_DELAY)
        try:
            ipr.link("set", index=pf_index, vf=vf_request(vf, "mac", VfSettings(mac=mac)))
        except NetlinkError as exc:
            if exc.code in PERMANENT_ERRNOS or attempt == MAC_ATTEMPTS - 1:
                raise _refused("mac", what, exc.code, pf) from None
            why = os.strerror(exc.code)
            continue
        now = _read(ipr, pf_index, vf)[0].mac
        if now == mac:
            return
        why = f"it reads back as {now}"
    raise _Refused("mac", what, f"{why} after {MAC_ATTEMPTS} attempts",
                   f"the driver of {pf} does not keep the MAC; check the node's kernel log (dmesg)")


def _write(ipr: Any, pf_index: int, pf: str, vf: int, group: str, values: VfSettings) -> None:
    if group == "mac":
        _set_mac(ipr, pf_index, pf, vf, values.mac)
    else:
        _set(ipr, pf_index, pf, vf, group, values)


def apply_vf(ipr: Any, pf_index: int, vf: int, wanted: VfSettings) -> VfSettings:
    """Apply ``wanted`` (validated first: CNIError 7) to VF ``vf`` of PF ``pf_index`` and return the
    previous values of what was changed (only the groups that differed; empty when nothing did).

    Requests go in sriov-cni's order: vlan/qos/proto, MAC (retried and read back), rates,
    spoofchk, trust, link state. When one is refused, the ones already made are undone (best
    effort) and CNIError 100 ``"<what> on VF <n> of <pf>: <strerror>"`` is raised; its details say
    what to do and what became of the undo. A previous value the driver does not report (None in
    ``read_vf``, e.g. spoofchk of some drivers) cannot be snapshotted, so it is not restored."""
    wanted = validate(wanted)
    current, pf = _read(ipr, pf_index, vf)
    snapshot = VfSettings()
    done: list[str] = []
    for group, new, old in plan(current, wanted):
        try:
            _write(ipr, pf_index, pf, vf, group, new)
        except _Refused as refused:
            err = refused.to_cni(vf, pf)
            if done:
                try:
                    restore_vf(ipr, pf_index, vf, snapshot)
                    err.details += f"; the settings changed before it ({', '.join(done)}) were restored"
                except CNIError as undo:
                    err.details += f"; restoring the settings changed before it also failed: {undo.msg}"
            raise err from None
        done.append(group)
        for f in dict(GROUPS)[group]:
            setattr(snapshot, f, getattr(old, f))
    return snapshot


def restore_vf(ipr: Any, pf_index: int, vf: int, snapshot: VfSettings) -> None:
    """Write ``snapshot`` (from ``apply_vf``) back, group by group in reverse order. Best effort:
    every group is attempted, then one CNIError 100 lists each that failed. A group the snapshot
    holds only in part takes its other fields from the VF's current settings."""
    if snapshot.is_empty():
        return
    try:
        current, pf = _read(ipr, pf_index, vf)
    except CNIError as exc:
        raise CNIError(LINK_FAILURE, f"could not restore VF {vf} ({snapshot.describe()}): {exc.msg}", exc.details) from None
    failed: list[_Refused] = []
    for group, fields in reversed(GROUPS):
        if all(getattr(snapshot, f) is None for f in fields):
            continue
        values = VfSettings()
        for f in fields:
            value = getattr(snapshot, f)
            setattr(values, f, getattr(current, f) if value is None else value)
        if group == "vlan" and values.vlan is None:
            failed.append(_Refused(group, "set vlan", "no VLAN ID in the snapshot nor on the VF",
                                   "give the snapshot's vlan"))
            continue
        try:
            _write(ipr, pf_index, pf, vf, group, values)
        except _Refused as refused:
            failed.append(refused)
    if failed:
        raise CNIError(LINK_FAILURE, f"could not restore VF {vf} of {pf}: " + "; ".join(str(r) for r in failed),
                       "; ".join(dict.fromkeys(r.fix for r in failed)))
