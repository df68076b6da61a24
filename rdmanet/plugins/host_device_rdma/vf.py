"""sriov-cni's VF knobs for host-device-rdma: applied through the PF, snapshotted, restored.

The state file keeps a :class:`VfRecord`: what ADD sets and the previous values of exactly those
fields, so DEL and GC restore only what was changed. It is written *before* the settings are
applied (:func:`plan_vf_settings`), so an ADD interrupted half-way is undone too. A PF or VF that no longer exists (the PF was unbound, ``sriov_numvfs`` was lowered,
the node rebooted into fewer VFs) has nothing left to restore: :func:`restore_vf_settings` is a
no-op then, never an error a DEL would repeat forever.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional

from rdmanet.cni.core.errors import INVALID_CONFIG, LINK_FAILURE, CNIError
from rdmanet.cni.linux import links
from rdmanet.cni.linux.vf_settings import VfSettings, apply_vf, read_vf, restore_vf, snapshot_for, validate, vf_exists

from .attachment_state import VfRecord
from .selection import DeviceRef

if TYPE_CHECKING:
    from .config import HostDeviceConf  # annotations only: the models are the verbs' to import

log = logging.getLogger("rdmanet.host-device-rdma")


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


def plan_vf_settings(host, ref: DeviceRef, conf: HostDeviceConf, mac: Optional[str]) -> VfRecord:
    """The state entry for the settings ADD is about to apply, with the previous values (intent)."""
    wanted = validate(wanted_settings(conf, mac))  # stored as the kernel will read it back
    current = read_vf(host, _pf_index(host, ref, ref.pf_netdev), ref.vf_index)
    return VfRecord(pf=ref.pf_netdev, vf=ref.vf_index, applied=wanted, snapshot=snapshot_for(current, wanted))


def apply_vf_settings(host, ref: DeviceRef, saved: VfRecord) -> None:
    apply_vf(host, _pf_index(host, ref, saved.pf), saved.vf, saved.applied)


def restore_vf_settings(host, ref: DeviceRef, saved: VfRecord) -> None:
    pf = links.find_link(host, saved.pf) if saved.pf else None
    if pf is None or not vf_exists(host, pf.index, saved.vf):
        log.info("VF %s of %s no longer exists: its settings went with it, nothing to restore", saved.vf, saved.pf)
        return
    restore_vf(host, pf.index, saved.vf, saved.snapshot)


def check_vf_settings(host, ref: DeviceRef, saved: VfRecord) -> Optional[str]:
    """None when the VF still has what ADD applied, else what differs."""
    current = read_vf(host, _pf_index(host, ref, saved.pf), saved.vf)
    for field, value in saved.applied.to_dict().items():
        if getattr(current, field) != value:
            return f"VF {saved.vf} of {saved.pf}: {field} is {getattr(current, field)!r}, ADD set {value!r}"
    return None
