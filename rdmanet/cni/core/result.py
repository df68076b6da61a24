"""CNI results: one model, parsed from any supported version and rendered in the requested one.

Rendering rules (SPEC.md and pkg/types/{040,100}): before 1.0.0 every ``ips[]`` entry carries
``version`` ("4"/"6"); from 1.0.0 it is gone. ``interfaces[].mtu``, ``pciID``, ``socketPath``
and the extra route fields exist only at 1.1.0. IPAM plugins return the abbreviated form:
no ``interfaces`` and no ``ips[].interface``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .errors import DECODING_FAILURE, CNIError
from .version import at_least

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPInterface = Union[ipaddress.IPv4Interface, ipaddress.IPv6Interface]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]


@dataclass
class Interface:
    """An entry of a CNI result's ``interfaces``."""

    name: str
    mac: str = ""
    sandbox: str = ""
    mtu: Optional[int] = None
    pci_id: str = ""
    socket_path: str = ""

    def to_json(self, version: str) -> dict:
        out: dict[str, Any] = {"name": self.name}
        if self.mac:
            out["mac"] = self.mac
        if at_least(version, "1.1.0"):
            if self.mtu:
                out["mtu"] = self.mtu
        if self.sandbox:
            out["sandbox"] = self.sandbox
        if at_least(version, "1.1.0"):
            if self.socket_path:
                out["socketPath"] = self.socket_path
            if self.pci_id:
                out["pciID"] = self.pci_id
        return out


@dataclass
class IPConfig:
    """An entry of a CNI result's ``ips``."""

    address: IPInterface
    gateway: Optional[IPAddress] = None
    interface: Optional[int] = None

    @property
    def family(self) -> int:
        return self.address.version

    def to_json(self, version: str) -> dict:
        out: dict[str, Any] = {}
        if not at_least(version, "1.0.0"):
            out["version"] = str(self.address.version)
        if self.interface is not None:
            out["interface"] = self.interface
        out["address"] = str(self.address)
        if self.gateway is not None:
            out["gateway"] = str(self.gateway)
        return out


@dataclass
class Route:
    """An entry of a CNI result's ``routes``."""

    dst: IPNetwork
    gw: Optional[IPAddress] = None
    mtu: Optional[int] = None
    advmss: Optional[int] = None
    priority: Optional[int] = None
    table: Optional[int] = None
    scope: Optional[int] = None

    _EXTRA = ("mtu", "advmss", "priority", "table", "scope")

    def to_json(self, version: str) -> dict:
        out: dict[str, Any] = {"dst": str(self.dst)}
        if self.gw is not None:
            out["gw"] = str(self.gw)
        if at_least(version, "1.1.0"):
            for key in self._EXTRA:
                value = getattr(self, key)
                if value is not None:
                    out[key] = value
        return out


@dataclass
class DNS:
    """A CNI result's ``dns``."""

    nameservers: list[str] = field(default_factory=list)
    domain: str = ""
    search: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        out: dict[str, Any] = {}
        if self.nameservers:
            out["nameservers"] = list(self.nameservers)
        if self.domain:
            out["domain"] = self.domain
        if self.search:
            out["search"] = list(self.search)
        if self.options:
            out["options"] = list(self.options)
        return out

    @classmethod
    def from_json(cls, data: Optional[dict]) -> "DNS":
        data = data or {}
        if not isinstance(data, dict):
            raise ValueError("dns must be an object")
        return cls(
            nameservers=list(data.get("nameservers") or []),
            domain=data.get("domain") or "",
            search=list(data.get("search") or []),
            options=list(data.get("options") or []),
        )


@dataclass
class Result:
    """A CNI result: interfaces, ips, routes, dns (to_json writes it for a cniVersion)."""

    interfaces: list[Interface] = field(default_factory=list)
    ips: list[IPConfig] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    dns: DNS = field(default_factory=DNS)

    def to_json(self, version: str) -> dict:
        out: dict[str, Any] = {"cniVersion": version}
        if self.interfaces:
            out["interfaces"] = [i.to_json(version) for i in self.interfaces]
        if self.ips:
            out["ips"] = [ip.to_json(version) for ip in self.ips]
        if self.routes:
            out["routes"] = [r.to_json(version) for r in self.routes]
        out["dns"] = self.dns.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any, what: str = "result") -> "Result":
        """Parse a result of any version >= 0.3.0 (prevResult, or a delegated IPAM's answer)."""
        if not isinstance(data, dict):
            raise CNIError(DECODING_FAILURE, f"{what}: expected a JSON object", repr(data)[:200])
        try:
            interfaces = [
                Interface(
                    name=i["name"],
                    mac=i.get("mac", "") or "",
                    sandbox=i.get("sandbox", "") or "",
                    mtu=i.get("mtu"),
                    pci_id=i.get("pciID", "") or "",
                    socket_path=i.get("socketPath", "") or "",
                )
                for i in data.get("interfaces") or []
            ]
            ips = [
                IPConfig(
                    address=ipaddress.ip_interface(ip["address"]),
                    gateway=ipaddress.ip_address(ip["gateway"]) if ip.get("gateway") else None,
                    interface=ip.get("interface"),
                )
                for ip in data.get("ips") or []
            ]
            routes = [
                Route(
                    dst=ipaddress.ip_network(r["dst"], strict=False),
                    gw=ipaddress.ip_address(r["gw"]) if r.get("gw") else None,
                    **{k: r[k] for k in Route._EXTRA if r.get(k) is not None},
                )
                for r in data.get("routes") or []
            ]
            dns = DNS.from_json(data.get("dns"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CNIError(DECODING_FAILURE, f"{what}: cannot parse: {exc}", "the result must follow the CNI spec") from exc
        return cls(interfaces=interfaces, ips=ips, routes=routes, dns=dns)
