"""macvlan-rdma's network configuration: the Go macvlan plugin's fields plus ``rdma``."""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, field_validator

from cni.core.args import split_list
from cni.core.invocation import Invocation
from cni.core.netconf import NetConf, load

_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}([:-][0-9a-fA-F]{2}){5}$")


def normalize_mac(value: str, field: str) -> str:
    if not _MAC_RE.match(value):
        raise ValueError(f"{value!r} is not a MAC address like 0a:58:0a:01:01:05 ({field})")
    mac = value.replace("-", ":").lower()
    if int(mac[:2], 16) & 1:
        raise ValueError(f"{value!r} is a multicast MAC address; use a unicast one ({field})")
    return mac


class MacvlanConf(NetConf):
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
    """config ``mac`` < CNI_ARGS ``MAC`` < ``runtimeConfig.mac`` (Go macvlan and sriov-cni)."""
    from cni.core.errors import INVALID_CONFIG, CNIError

    mac = conf.mac
    for value, where in ((inv.args.get("MAC"), "CNI_ARGS MAC"), (conf.runtimeConfig.mac, "runtimeConfig.mac")):
        if value:
            try:
                mac = normalize_mac(split_list(value)[0] if where.startswith("CNI") else value, where)
            except ValueError as exc:
                raise CNIError(INVALID_CONFIG, f"invalid network config: {exc}", "give a unicast MAC address such as 0a:58:0a:01:01:05") from None
    return mac
