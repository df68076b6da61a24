"""What host-device-rdma records of one attachment: a typed, versioned record, one JSON file each.

ADD writes it before its first change to the device and again before each further act, with
the intent of that act (the VF settings and their previous values, the GUIDs, the RDMA move, the
netdev move), so that a rollback, a later DEL, a repeat ADD or GC can undo an ADD stopped at any
point from this record alone (rdmanet.cni.linux.state writes it by write + rename).

The file is a JSON object::

    {"version": 1, "network", "containerID", "ifname", "netns", "netns_id", "token", "ipam",
     "device":   the selected device (selection.DeviceRef),
     "original": the netdev as it was in the host: name, MAC, MTU, up, alias, ifindex, and what
                 recognises it later (kind, permanent MAC, bus device; a veth's peer),
     "netdev":   {"pod_index"}: the netdev's move into the pod (intent), its ifindex there,
     "vf":       {"pf", "vf", "applied", "snapshot"}: VF settings set through the PF (vf.py),
     "ib":       {"pf", "vf", "guid", "source", "previous": {"node", "port"}, "set"}: IB VF GUIDs (ib_vf.py),
     "rdma":     {"device"}: the RDMA device moved into the pod,
     "done":     the ADD finished, "repair": what an undo could not do (a later DEL retries)}

The sections an ADD did not get to (or that do not apply) are left out. A file of another
``version``, or one that is not such a record, cannot be read: :meth:`AttachmentState.from_dict`
raises ValueError and the state directory reads it as no state.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

from rdmanet.cni.linux.links import Link
from rdmanet.cni.linux.vf_settings import VfSettings

from .selection import DeviceRef

STATE_VERSION = 1

_KINDS = {str: "a string", int: "an integer", bool: "true or false", dict: "an object", list: "a list"}


def _field(data: dict, key: str, kind: type, where: str, *, optional: bool = False) -> Any:
    """``data[key]`` checked to be of JSON type ``kind``; ValueError naming the key otherwise."""
    value = data.get(key)
    if value is None:
        if optional:
            return None
        raise ValueError(f"{where}{key} is missing")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}{key} must be {_KINDS[kind]}, not {value!r}")
    return value


def _object(data: Any, where: str) -> dict:
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be an object, not {data!r}")
    return data


@dataclass
class Original:
    """The netdev as ADD found it in the host, and what tells it from a link that only looks like
    it (moves.identify): its kind, permanent MAC and bus device ("" for a virtual device), and for
    a veth its peer's ifindex and the nsid the host gives the peer's netns (None: the host)."""

    name: str
    mac: str
    mtu: int
    up: bool
    alias: str
    index: int
    kind: str = ""
    perm_mac: str = ""
    parent_dev: str = ""
    peer_index: Optional[int] = None
    peer_nsid: Optional[int] = None

    @classmethod
    def of_link(cls, link: Link) -> "Original":
        """``link`` as read in the host, with its identity."""
        return cls(name=link.name, mac=link.mac, mtu=link.mtu, up=link.up, alias=link.alias, index=link.index,
                   **identity_of(link))

    @property
    def strongly_identified(self) -> bool:
        """A physical device (burnt-in MAC or bus device) can be recognised wherever it is, by any index."""
        return bool(self.perm_mac or self.parent_dev)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "Original":
        data, where = _object(data, "original"), "original."
        return cls(name=_field(data, "name", str, where), mac=_field(data, "mac", str, where),
                   mtu=_field(data, "mtu", int, where), up=_field(data, "up", bool, where),
                   alias=_field(data, "alias", str, where), index=_field(data, "index", int, where),
                   kind=_field(data, "kind", str, where), perm_mac=_field(data, "perm_mac", str, where),
                   parent_dev=_field(data, "parent_dev", str, where),
                   peer_index=_field(data, "peer_index", int, where, optional=True),
                   peer_nsid=_field(data, "peer_nsid", int, where, optional=True))


def identity_of(link: Link) -> dict:
    """The :class:`Original` fields that recognise ``link`` (read in the host) later, beside its ifindex."""
    found: dict = {"kind": link.kind, "perm_mac": link.perm_mac, "parent_dev": link.parent_dev}
    if link.kind == "veth":
        found.update(peer_index=link.parent_index, peer_nsid=link.parent_netnsid)
    return found


@dataclass
class VfRecord:
    """The VF settings ADD applies through the PF, and the previous values of exactly those (vf.py)."""

    pf: Optional[str]
    vf: int
    applied: VfSettings
    snapshot: VfSettings

    def to_dict(self) -> dict:
        return {"pf": self.pf, "vf": self.vf, "applied": self.applied.to_dict(), "snapshot": self.snapshot.to_dict()}

    @classmethod
    def from_dict(cls, data: Any) -> "VfRecord":
        data, where = _object(data, "vf"), "vf."
        return cls(pf=_field(data, "pf", str, where, optional=True), vf=_field(data, "vf", int, where),
                   applied=VfSettings.from_dict(_field(data, "applied", dict, where)),
                   snapshot=VfSettings.from_dict(_field(data, "snapshot", dict, where)))


@dataclass
class IbRecord:
    """An InfiniBand VF's GUIDs (ib_vf.py): the one in use, where it came from, the VF's previous
    node and port GUID, and whether ADD has set it (from then on DEL writes the previous ones back)."""

    pf: Optional[str]
    vf: int
    guid: Optional[str]
    source: str
    previous_node: Optional[str]
    previous_port: Optional[str]
    guid_set: bool = False

    def to_dict(self) -> dict:
        return {"pf": self.pf, "vf": self.vf, "guid": self.guid, "source": self.source,
                "previous": {"node": self.previous_node, "port": self.previous_port}, "set": self.guid_set}

    @classmethod
    def from_dict(cls, data: Any) -> "IbRecord":
        data, where = _object(data, "ib"), "ib."
        previous = _object(_field(data, "previous", dict, where), "ib.previous")
        return cls(pf=_field(data, "pf", str, where, optional=True), vf=_field(data, "vf", int, where),
                   guid=_field(data, "guid", str, where, optional=True), source=_field(data, "source", str, where),
                   previous_node=_field(previous, "node", str, "ib.previous.", optional=True),
                   previous_port=_field(previous, "port", str, "ib.previous.", optional=True),
                   guid_set=_field(data, "set", bool, where))


def _device_from_dict(data: Any) -> DeviceRef:
    data, where = _object(data, "device"), "device."
    text = {name: _field(data, name, str, where, optional=True)
            for name in ("netdev", "device_id", "kind", "pf_pci", "pf_netdev", "driver")}
    if text["kind"] not in (None, "pci", "auxiliary"):
        raise ValueError(f"device.kind must be pci or auxiliary, not {text['kind']!r}")
    return DeviceRef(selector=_field(data, "selector", str, where), vf_index=_field(data, "vf_index", int, where, optional=True),
                     dpdk=_field(data, "dpdk", bool, where), **text)


def _netns_id(data: Any) -> Optional[dict]:
    if data is None:
        return None
    data = _object(data, "netns_id")
    return {"dev": _field(data, "dev", int, "netns_id."), "ino": _field(data, "ino", int, "netns_id.")}


@dataclass
class AttachmentState:
    """One attachment's record (the module docstring lists its sections)."""

    network: str
    container_id: str
    ifname: str
    netns: str
    netns_id: Optional[dict]  # rdmanet.cni.linux.netns.identity of the pod netns at ADD
    token: str  # unique to the ADD; the device's allocation record carries it while the ADD holds the device
    device: DeviceRef
    ipam: bool
    original: Optional[Original] = None
    pod_index: Optional[int] = None  # "netdev": the netdev's move into the pod was decided; its ifindex there
    vf: Optional[VfRecord] = None
    ib: Optional[IbRecord] = None
    rdma_device: Optional[str] = None  # "rdma": moved into the pod with the netdev
    done: bool = False
    repair: list[str] = field(default_factory=list)

    @property
    def attachment(self) -> str:
        return f"{self.network}/{self.container_id}/{self.ifname}"

    @property
    def moves_netdev(self) -> bool:
        """The netdev's move into the pod was recorded (the device may be in the pod)."""
        return self.pod_index is not None

    def to_dict(self) -> dict:
        doc: dict = {"version": STATE_VERSION, "network": self.network, "containerID": self.container_id,
                     "ifname": self.ifname, "netns": self.netns, "netns_id": self.netns_id, "token": self.token,
                     "device": self.device.to_dict(), "ipam": self.ipam, "done": self.done}
        if self.original is not None:
            doc["original"] = self.original.to_dict()
        if self.pod_index is not None:
            doc["netdev"] = {"pod_index": self.pod_index}
        if self.vf is not None:
            doc["vf"] = self.vf.to_dict()
        if self.ib is not None:
            doc["ib"] = self.ib.to_dict()
        if self.rdma_device is not None:
            doc["rdma"] = {"device": self.rdma_device}
        if self.repair:
            doc["repair"] = list(self.repair)
        return doc

    @classmethod
    def from_dict(cls, data: dict) -> "AttachmentState":
        """The record of a state file's JSON object; ValueError for another version or a malformed one."""
        version = data.get("version")
        if version != STATE_VERSION:
            raise ValueError(f"state version {version!r}, this plugin reads version {STATE_VERSION}")
        netdev = _field(data, "netdev", dict, "", optional=True)
        rdma = _field(data, "rdma", dict, "", optional=True)
        repair = _field(data, "repair", list, "", optional=True) or []
        if not all(isinstance(line, str) for line in repair):
            raise ValueError(f"repair must be a list of strings, not {repair!r}")
        optional = {key: parse(data[key]) if data.get(key) is not None else None
                    for key, parse in (("original", Original.from_dict), ("vf", VfRecord.from_dict), ("ib", IbRecord.from_dict))}
        return cls(network=_field(data, "network", str, ""), container_id=_field(data, "containerID", str, ""),
                   ifname=_field(data, "ifname", str, ""), netns=_field(data, "netns", str, ""),
                   netns_id=_netns_id(data.get("netns_id")), token=_field(data, "token", str, ""),
                   device=_device_from_dict(data.get("device")), ipam=_field(data, "ipam", bool, ""),
                   pod_index=_field(netdev, "pod_index", int, "netdev.") if netdev is not None else None,
                   rdma_device=_field(rdma, "device", str, "rdma.") if rdma is not None else None,
                   done=_field(data, "done", bool, ""), repair=repair, **optional)
