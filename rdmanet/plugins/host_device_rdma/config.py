"""host-device-rdma's network configuration: host-device's selectors, sriov-cni's VF knobs, ``rdma``."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, field_validator

from rdmanet.cni.core import macaddr
from rdmanet.cni.core.infiniband import parse_pkey
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.netconf import NetConf, load
from rdmanet.cni.core.rail_settings import RailSettings
from rdmanet.cni.linux import roots

from . import state_dir

DEFAULT_STATE_DIR = roots.NodePolicy().host_device_state_dir  # the node policy's hostDeviceStateDir


class HostDeviceConf(NetConf, RailSettings):
    device: Optional[str] = Field(None, min_length=1, max_length=15, description="device is a host interface name, e.g. ens1f0")
    hwaddr: Optional[str] = Field(None, description="hwaddr is the MAC address of the host interface to move")
    kernelpath: Optional[str] = Field(None, description="kernelpath is a /sys/devices/... path of the device")
    pciBusID: Optional[str] = Field(None, description="pciBusID is a PCI address dddd:bb:dd.f (Multus sets it from the resourceName)")
    deviceID: Optional[str] = Field(None, description="deviceID is a PCI address or auxiliary device name (Multus sets it from the resourceName)")
    mtu: int = Field(0, ge=0, le=65535, description="mtu is 0 (keep) or the MTU to set in the pod")
    mac: Optional[str] = Field(None, description="mac is a unicast MAC address such as 0a:58:0a:01:01:05")
    vlan: Optional[int] = Field(None, ge=0, le=4094, description="vlan is a VF VLAN ID 0-4094 (SR-IOV VFs only)")
    vlanQoS: Optional[int] = Field(None, ge=0, le=7, description="vlanQoS is 0-7 and needs a non-zero vlan")
    vlanProto: Optional[str] = Field(None, description='vlanProto is "802.1q" or "802.1ad"')
    spoofchk: Optional[Literal["on", "off"]] = Field(None, description='spoofchk is "on" or "off"')
    trust: Optional[Literal["on", "off"]] = Field(None, description='trust is "on" or "off"')
    link_state: Optional[Literal["auto", "enable", "disable"]] = Field(None, description='link_state is "auto", "enable" or "disable"')
    min_tx_rate: Optional[int] = Field(None, ge=0, description="min_tx_rate is in Mbps, 0 disables it")
    max_tx_rate: Optional[int] = Field(None, ge=0, description="max_tx_rate is in Mbps, 0 disables it")
    rdma: Literal["auto", "required", "off"] = Field(
        "auto", description='rdma is "auto" (move the RDMA device in exclusive mode), "required" or "off"'
    )
    guid: Optional[str] = Field(None, description="guid is an InfiniBand VF GUID of 8 octets such as 02:00:00:00:00:00:00:01 "
                                "(runtimeConfig.infinibandGUID, the infinibandGUID capability, wins)")
    pkey: Optional[Union[int, str]] = Field(None, description='pkey is the IB VF\'s partition key such as "0x8001", for '
                                            "the subnet manager (ib-kubernetes); the plugin validates and records it")
    # Not the config's to choose: state, locks and allocation records live in the node's one
    # directory (the node policy's hostDeviceStateDir). A config may only repeat that directory.
    stateDir: Optional[str] = Field(None, description="stateDir is set by the node owner (node policy hostDeviceStateDir); remove it")

    @field_validator("mac", "hwaddr")
    @classmethod
    def _mac(cls, value: Optional[str], info) -> Optional[str]:
        return macaddr.normalize_mac(value, info.field_name) if value else value

    @field_validator("pkey")
    @classmethod
    def _pkey(cls, value: Optional[Union[int, str]]) -> Optional[int]:
        return None if value is None else parse_pkey(value)

    @field_validator("vlanProto")
    @classmethod
    def _proto(cls, value: Optional[str]) -> Optional[str]:
        if value is not None and value.lower() not in ("802.1q", "802.1ad"):
            raise ValueError(f'{value!r} is not "802.1q" or "802.1ad"')
        return value.lower() if value else value

    def vf_knobs_set(self) -> bool:
        return any(getattr(self, k) is not None for k in
                   ("vlan", "vlanQoS", "vlanProto", "spoofchk", "trust", "link_state", "min_tx_rate", "max_tx_rate"))


def state_root(conf: HostDeviceConf) -> str:
    """Where this plugin keeps its state files, locks and allocation records: the one place that
    decides it (every verb and helper takes the directory from here). It is the node's
    (:func:`load_conf` put the node policy's hostDeviceStateDir in ``conf.stateDir``), made 0700
    or checked (a real directory, root's, closed to others: rdmanet.cni.linux.roots)."""
    return roots.ensure_dir(conf.stateDir)


def load_conf(inv: Invocation) -> HostDeviceConf:
    """The config, with ``stateDir`` set to the node's state directory.

    A config naming another directory is CNI error 7, except on DEL, which must still undo what
    ADD did: there it is ignored with a warning (the node's directory is used)."""
    conf = load(HostDeviceConf, inv.config)
    conf.stateDir = state_dir.checked(conf.stateDir, inv.command)
    return conf


def effective_mac(conf: HostDeviceConf, inv: Invocation) -> Optional[str]:
    return macaddr.effective_mac(conf.mac, conf.runtimeConfig.mac, inv)
