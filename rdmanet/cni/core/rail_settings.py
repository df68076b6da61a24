"""The network configuration keys of a pod with several interfaces (one per NIC "rail"), shared by
macvlan-rdma, host-device-rdma and ipoib-rdma: per-interface policy routing, the default-route
interface, and the optional probes before an address is committed.

Each field's ``description`` is the fix a user reads when the field is wrong (rdmanet.cni.core.netconf).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .netconf import Model

PROBE_TIMEOUT_MS_MAX = 10_000


class RailSettings(Model):
    policyRouting: Literal["auto", "on", "off"] = Field(
        "auto", description='policyRouting is "auto" (a routing table and source rules for this interface when the '
        'pod has another interface with an address of the same family), "on" or "off"')
    defaultRoute: bool = Field(
        False, description="defaultRoute is true to make this interface's gateway the pod's default route "
        "(in place of eth0's), else false")
    detectAddressConflict: bool = Field(
        False, description="detectAddressConflict is true to probe (ARP / IPv6 DAD) that no other host holds the "
        "address before it is set, else false")
    checkGateway: bool = Field(
        False, description="checkGateway is true to require an answer from the gateway (ARP / neighbour "
        "solicitation) before ADD succeeds, else false")
    probeTimeoutMs: int = Field(
        1000, ge=10, le=PROBE_TIMEOUT_MS_MAX,
        description=f"probeTimeoutMs is how long each probe waits for an answer, 10-{PROBE_TIMEOUT_MS_MAX} ms")
