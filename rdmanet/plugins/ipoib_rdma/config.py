"""ipoib-rdma's network configuration: the ipoib plugin's fields (``master``, ``mtu``, ``ipam``)
plus ``pkey``, ``mode`` and ``rdma``. A NAD written for ``"type": "ipoib"`` works by changing
``type`` only."""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import Field, field_validator

from rdmanet.cni.core.infiniband import parse_pkey
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.netconf import NetConf, load
from rdmanet.cni.core.rail_settings import RailSettings


class IpoibConf(NetConf, RailSettings):
    master: str = Field(
        min_length=1, max_length=15,
        description='set "master" to the IPoIB netdev of an InfiniBand port, e.g. "master": "ib0" (the ipoib plugin\'s key)',
    )
    mtu: int = Field(0, ge=0, le=0xFFFF, description="mtu is 0 (inherit), else 68-4092 in datagram mode (the port's IB MTU - 4), 68-65520 in connected mode")
    pkey: Optional[Union[int, str]] = Field(
        None, description='pkey is a partition key such as "0x8001" or "0x7fff" (default: the master\'s)',
    )
    mode: Optional[Literal["datagram", "connected"]] = Field(
        None, description='mode is "datagram" or "connected" (default: the master\'s)'
    )
    rdma: Literal["auto", "required", "off"] = Field(
        "auto", description='rdma is "auto" (report the RDMA device when present), "required" or "off"'
    )

    @field_validator("pkey")
    @classmethod
    def _pkey(cls, value: Optional[Union[int, str]]) -> Optional[int]:
        return None if value is None else parse_pkey(value)


def load_conf(inv: Invocation) -> IpoibConf:
    return load(IpoibConf, inv.config)
