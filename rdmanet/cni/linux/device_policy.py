"""Which host links a network config may take or build on: the node policy's device allow-lists.

host-device-rdma moves a link out of the host into one pod; macvlan-rdma and ipoib-rdma build the
pod's interface on a host link (``master``). A NAD is tenant input, so neither may name just any
link of the node (docs/security.md):

- host-device-rdma moves a device only when the node owner allowed it: the device a device-ID key
  names (``deviceID``, ``pciBusID``, ``runtimeConfig.deviceID``: Multus sets them from the device
  plugin's allocation) unless ``hostDevicesFromDeviceID`` is false, and any device a
  ``hostDevices`` rule matches. Even then never a link the host uses (:func:`host_uses`) unless a
  rule that matches it says ``"hostInUse": true``.
- a ``master`` must have an RDMA device (unless ``rdmaMasters`` is false) or match a ``masters``
  rule; a config without ``master`` falls back to the default-route link only when a ``masters``
  rule matches that link.

A rule is an object whose keys must all match: ``name`` (an interface name, a shell pattern such
as ``ens1f*`` allowed), ``pciAddress`` (the device's PCI function), ``pf`` (the VFs of that PF,
named by its netdev or PCI address), ``vendorDevice`` (``"15b3:101e"``: the PCI vendor and device
IDs), and ``hostInUse`` (a host-device rule only: move it even when the host uses it).

Refusals are CNI error 7 naming the config key, the device and the policy setting that would
allow it.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from rdmanet.cni.core.errors import INVALID_CONFIG, CNIError

from . import sysfs

RULE_KEYS = ("name", "pciAddress", "pf", "vendorDevice", "hostInUse")
_VENDOR_DEVICE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")
_POLICY_DOC = "the node policy (docs/security.md); a network config cannot"
# Kinds of host links stacked on another one: while the host has one, the lower link is in use.
_UPPER_KINDS = frozenset(("vlan", "macvlan", "macvtap", "ipvlan", "ipvtap"))


@dataclass(frozen=True)
class Rule:
    """One entry of ``hostDevices`` or ``masters``: every key given must match."""

    name: Optional[str] = None
    pci_address: Optional[str] = None
    pf: Optional[str] = None
    vendor_device: Optional[str] = None
    host_in_use: bool = False

    def to_json(self) -> dict:
        doc = {"name": self.name, "pciAddress": self.pci_address, "pf": self.pf, "vendorDevice": self.vendor_device}
        doc = {k: v for k, v in doc.items() if v is not None}
        if self.host_in_use:
            doc["hostInUse"] = True
        return doc

    def text(self) -> str:
        return json.dumps(self.to_json())

    def matches(self, device: "Device") -> bool:
        if self.name is not None and not (device.name and fnmatch.fnmatchcase(device.name, self.name)):
            return False
        if self.pci_address is not None and device.pci != self.pci_address:
            return False
        if self.pf is not None and self.pf not in (device.pf_pci, device.pf_netdev):
            return False
        if self.vendor_device is not None and device.vendor_device != self.vendor_device:
            return False
        return True


def rules_from_json(value: Any, key: str, *, host_in_use: bool) -> tuple[Rule, ...]:
    """The rules of policy key ``key`` (a list of objects); ValueError naming what is wrong."""
    if not isinstance(value, list):
        raise ValueError(f"{key} must be a list of objects such as {{\"name\": \"ens1f0\"}}")
    rules = []
    allowed = RULE_KEYS if host_in_use else RULE_KEYS[:-1]
    for i, entry in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(entry, dict) or not entry:
            raise ValueError(f"{where} must be an object with one or more of {', '.join(allowed)}")
        unknown = sorted(set(entry) - set(allowed))
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown} (known: {', '.join(allowed)})")
        for field in ("name", "pciAddress", "pf", "vendorDevice"):
            if field in entry and (not isinstance(entry[field], str) or not entry[field]):
                raise ValueError(f"{where}.{field} must be a non-empty string")
        if "hostInUse" in entry and not isinstance(entry["hostInUse"], bool):
            raise ValueError(f"{where}.hostInUse must be true or false")
        if not set(entry) - {"hostInUse"}:
            raise ValueError(f"{where} names no device: give name, pciAddress, pf or vendorDevice")
        pci = entry.get("pciAddress")
        if pci is not None and not sysfs.is_pci_address(pci):
            raise ValueError(f"{where}.pciAddress {pci!r} is not a PCI address such as 0000:3b:00.2")
        vendor_device = entry.get("vendorDevice")
        if vendor_device is not None and not _VENDOR_DEVICE.match(vendor_device.lower()):
            raise ValueError(f"{where}.vendorDevice {vendor_device!r} is not vendor:device in hex such as 15b3:101e")
        pf = entry.get("pf")
        rules.append(Rule(name=entry.get("name"), pci_address=pci.lower() if pci else None,
                          pf=pf.lower() if pf and sysfs.is_pci_address(pf) else pf,
                          vendor_device=vendor_device.lower() if vendor_device else None,
                          host_in_use=entry.get("hostInUse", False)))
    return tuple(rules)


# --------------------------------------------------------------------------- what a device is


@dataclass(frozen=True)
class Device:
    """What the rules look at: a netdev's name and the PCI function behind it."""

    name: Optional[str]
    pci: Optional[str] = None
    pf_pci: Optional[str] = None
    pf_netdev: Optional[str] = None
    vendor_device: Optional[str] = None


def _vendor_device(pci: Optional[str], root: str) -> Optional[str]:
    if not pci:
        return None
    vendor = sysfs.read_attribute(f"/sys/bus/pci/devices/{pci}/vendor", root)
    device = sysfs.read_attribute(f"/sys/bus/pci/devices/{pci}/device", root)
    if not vendor or not device:
        return None
    return f"{vendor.lower().removeprefix('0x')}:{device.lower().removeprefix('0x')}"


def device(name: Optional[str], pci: Optional[str], root: str) -> Device:
    """The facts the rules match, for netdev ``name`` and/or PCI function ``pci``."""
    if pci is None and name:
        ident = sysfs.device_id_of_netdev(name, root)
        pci = ident[1] if ident is not None and ident[0] == "pci" else None
    pf_pci = sysfs.pf_of_vf(pci, root) if pci else None
    pf_netdev = sysfs.pf_netdev_of_vf(pci, root) if pf_pci else None
    return Device(name, pci, pf_pci, pf_netdev, _vendor_device(pci, root))


def _matching(rules: Sequence[Rule], dev: Device) -> list[Rule]:
    return [rule for rule in rules if rule.matches(dev)]


def _suggested(dev: Device, **extra: Any) -> str:
    """The rule that would allow ``dev``, as the node owner would write it."""
    rule = {"name": dev.name} if dev.name else {"pciAddress": dev.pci}
    return json.dumps({**rule, **extra})


# --------------------------------------------------------------------------- the host's use of a link


def _link_local(address: ipaddress.IPv4Interface | ipaddress.IPv6Interface) -> bool:
    return address.version == 6 and address.ip.is_link_local


def host_uses(ipr: Any, index: int, name: str, root: str) -> list[str]:
    """Why the host (the netns of ``ipr``) uses link ``index`` (``name``): its addresses (IPv6
    link-local aside) and routes (the kernel's link-local and multicast ones aside), the default
    route through it, a bond or bridge it is a port of, host links stacked on it, VFs enabled on
    it. [] when it is free to take."""
    from . import links  # pyroute2: only when a link is checked (rdmanet.cni.linux.roots imports the rules)

    reasons = []
    addresses = [str(a) for a in links.addresses(ipr, index) if not _link_local(a)]
    if addresses:
        reasons.append(f"it carries the host address{'es' if len(addresses) > 1 else ''} {', '.join(addresses)}")
    default = links.default_route_link(ipr)
    if default == name:
        reasons.append("it is the link of the host's default route")
    routes = [r for family in (2, 10) for r in ipr.get_routes(family=family) if _route_via(r, index)]
    if routes and default != name:
        reasons.append(f"{len(routes)} host route{'s' if len(routes) > 1 else ''} go{'' if len(routes) > 1 else 'es'} through it")
    for msg in ipr.get_links():
        other = msg.get("IFLA_IFNAME")
        if msg["index"] == index:
            port_of = msg.get("IFLA_MASTER")
            if port_of:
                lower = links.link_by_index(ipr, port_of)
                reasons.append(f"it is a port of {lower.name if lower else f'link #{port_of}'}")
            continue
        info = links.Link.from_msg(msg)
        if info.kind in _UPPER_KINDS and info.parent_index == index and info.parent_netnsid is None:
            reasons.append(f"the host's {info.kind} {other} is stacked on it")
    numvfs = sysfs.read_attribute(f"/sys/class/net/{name}/device/sriov_numvfs", root)
    if numvfs and numvfs.isdigit() and int(numvfs) > 0:
        reasons.append(f"it is an SR-IOV PF with {numvfs} VFs enabled (their MAC, VLAN and trust are set through it)")
    return reasons


def _route_via(route: Any, index: int) -> bool:
    if route.get("RTA_TABLE") == 255:  # the local table: the addresses themselves, counted above
        return False
    dst = route.get("RTA_DST")
    if route["family"] == 10 and dst is not None and (dst.startswith("fe80:") or dst.startswith("ff00:")):
        return False  # the kernel's own routes for any IPv6-enabled link
    if route.get("RTA_OIF") == index:
        return True
    return any(hop.get("oif") == index for hop in route.get("RTA_MULTIPATH") or [])


# --------------------------------------------------------------------------- the checks


def check_host_device(policy: Any, key: str, dev: Device, by_device_id: bool, in_use: Sequence[str]) -> None:
    """host-device-rdma may move ``dev`` (selected by config key ``key``; ``by_device_id``: a
    device-ID key chose it) whose host uses are ``in_use`` (:func:`host_uses`); CNI error 7 if not."""
    what = dev.name or dev.pci
    rules = _matching(policy.host_devices, dev)
    allowed_by_id = by_device_id and policy.host_devices_from_device_id
    if not rules and not allowed_by_id:
        how = ("the device plugin's deviceID is not trusted on this node (hostDevicesFromDeviceID: false)"
               if by_device_id else "it is not the device the device plugin allocated (deviceID)")
        raise CNIError(INVALID_CONFIG,
                       f"invalid network config: {key}: host-device-rdma may not move {what}: {how} and no hostDevices "
                       f"rule of the node policy ({policy.source}) matches it",
                       f"select the device through the NAD's k8s.v1.cni.cncf.io/resourceName (Multus passes its deviceID), "
                       f"or the node owner allows it in {_POLICY_DOC}: \"hostDevices\": [{_suggested(dev)}]")
    if in_use and not any(rule.host_in_use for rule in rules):
        raise CNIError(INVALID_CONFIG,
                       f"invalid network config: {key}: host-device-rdma does not move {what}, the host uses it: "
                       f"{'; '.join(in_use)}",
                       f"free the link on the host first, or the node owner allows taking it anyway in {_POLICY_DOC}: "
                       f"\"hostDevices\": [{_suggested(dev, hostInUse=True)}]")


def check_master(policy: Any, key: str, dev: Device, rdma_devices: Sequence[str], *, defaulted: bool = False) -> None:
    """``dev`` may be the master of a macvlan-rdma/ipoib-rdma attachment; CNI error 7 if not.
    ``defaulted``: the config named no master and ``dev`` is the default-route link."""
    if _matching(policy.masters, dev):
        return
    rule = f"\"masters\": [{_suggested(dev)}]"
    if defaulted:
        raise CNIError(INVALID_CONFIG,
                       f"invalid network config: {key} is not set, and the default-route link {dev.name} is taken as "
                       f"master only when the node policy ({policy.source}) lists it in masters",
                       f"set \"{key}\" to a port of an RDMA NIC (see 'rdmanet doctor'); or the node owner allows the "
                       f"default-route link in {_POLICY_DOC}: {rule}")
    if rdma_devices and policy.rdma_masters:
        return
    why = ("it has no RDMA device" if not rdma_devices
           else f"the node policy allows only listed masters (rdmaMasters: false), RDMA device {', '.join(rdma_devices)} aside")
    raise CNIError(INVALID_CONFIG,
                   f"invalid network config: {key}: {dev.name} is not a master this node allows: {why}, and no masters "
                   f"rule of the node policy ({policy.source}) matches it",
                   f"set \"{key}\" to a port of an RDMA NIC (see 'rdmanet doctor'); or the node owner allows it in "
                   f"{_POLICY_DOC}: {rule}")


def check_master_link(key: str, name: str, *, defaulted: bool = False) -> None:
    """:func:`check_master` for host link ``name`` under the node policy of the call."""
    from . import roots  # roots reads the rules with this module

    root = sysfs.default_root()
    check_master(roots.current(), key, device(name, None, root), sysfs.rdma_devices_for_netdev(name, root),
                 defaulted=defaulted)
