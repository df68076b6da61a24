"""sriov-cni's VF knobs for host-device-rdma: applied through the PF, snapshotted, restored.

The state file keeps ``{"pf", "vf", "applied", "snapshot"}``: what ADD set and the previous
values of exactly those fields, so DEL and GC restore only what was changed.
"""

from __future__ import annotations

from typing import Optional

from cni.core.errors import INVALID_CONFIG, LINK_FAILURE, CNIError
from cni.linux import links
from cni.linux.vf_settings import VfSettings, apply_vf, read_vf, restore_vf, validate

from .config import HostDeviceConf
from .selection import DeviceRef


def _onoff(value: Optional[str]) -> Optional[bool]:
    return None if value is None else value == "on"


def wanted_settings(conf: HostDeviceConf, mac: Optional[str]) -> VfSettings:
    return VfSettings(mac=mac, vlan=conf.vlan, qos=conf.vlanQoS, vlan_proto=conf.vlanProto,
                      spoofchk=_onoff(conf.spoofchk), trust=_onoff(conf.trust), link_state=conf.link_state,
                      min_tx_rate=conf.min_tx_rate, max_tx_rate=conf.max_tx_rate)


def _pf_index(host, ref: DeviceRef, pf: Optional[str]) -> int:
    if not pf:
        raise CNIError(INVALID_CONFIG, f"{ref.describe()}: its PF has no netdev, so VF settings cannot be applied",
                       "bind the PF to its kernel driver, or remove vlan/mac/spoofchk/trust/link_state/tx rates")
    link = links.find_link(host, pf)
    if link is None:
        raise CNIError(LINK_FAILURE, f"PF {pf} of {ref.describe()} is not in the host network namespace",
                       "the PF must stay in the host netns while its VFs are used")
    return link.index


def apply_vf_settings(host, ref: DeviceRef, conf: HostDeviceConf, mac: Optional[str]) -> dict:
    wanted = validate(wanted_settings(conf, mac))  # stored as the kernel will read it back
    snapshot = apply_vf(host, _pf_index(host, ref, ref.pf_netdev), ref.vf_index, wanted)
    return {"pf": ref.pf_netdev, "vf": ref.vf_index, "applied": wanted.to_dict(), "snapshot": snapshot.to_dict()}


def restore_vf_settings(host, ref: DeviceRef, saved: dict) -> None:
    restore_vf(host, _pf_index(host, ref, saved["pf"]), saved["vf"], VfSettings.from_dict(saved["snapshot"]))


def check_vf_settings(host, ref: DeviceRef, saved: dict) -> Optional[str]:
    """None when the VF still has what ADD applied, else what differs."""
    current = read_vf(host, _pf_index(host, ref, saved["pf"]), saved["vf"])
    for field, value in saved["applied"].items():
        if getattr(current, field) != value:
            return f"VF {saved['vf']} of {saved['pf']}: {field} is {getattr(current, field)!r}, ADD set {value!r}"
    return None
