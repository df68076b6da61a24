"""macvlan-rdma's network configuration: the Go macvlan plugin's fields plus ``rdma``."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator

from rdmanet.cni.core import macaddr
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.macaddr import normalize_mac
from rdmanet.cni.core.netconf import NetConf, load
from rdmanet.cni.core.rail_settings import RailSettings


class MacvlanConf(NetConf, RailSettings):
    master: Optional[str] = Field(
        None, min_length=1, max_length=15,
        description="name an existing host interface (the RDMA NIC port), or omit master to use the default route's interface",
    )
    mode: Literal["bridge", "private", "vepa", "passthru"] = Field(
        "bridge", description="mode is one of bridge, private, vepa, passthru"
    )
    mtu: int = Field(0, ge=0, description="mtu is 0 (inherit) or at most the master's MTU")
    mac: Optional[str] = Field(None, description="mac is a unicast MAC address such as 0a:58:0a:01:01:05")
    linkInContainer: bool = Field(False, description="linkInContainer is true when master lives in the pod's netns")
    rdma: Literal["auto", "required", "off"] = Field(
        "auto", description='rdma is "auto" (report the RDMA device when present), "required" or "off"'
    )

    @field_validator("mac")
    @classmethod
    def _mac(cls, value: Optional[str]) -> Optional[str]:
        return normalize_mac(value, "mac") if value else value


def load_conf(inv: Invocation) -> MacvlanConf:
    return load(MacvlanConf, inv.config)


def effective_mac(conf: MacvlanConf, inv: Invocation) -> Optional[str]:
    return macaddr.effective_mac(conf.mac, conf.runtimeConfig.mac, inv)
