"""The InfiniBand GUIDs this node's ports and VFs already use, so that a VF never gets one of them.

A GUID is a port's identity on the fabric: the subnet manager grants partition membership
(pkeys) per port GUID, so a VF given another port's or VF's GUID takes that membership over.
In use are, for every RDMA device in sysfs, its node GUID (``/sys/class/infiniband/<dev>/node_guid``)
and each port's GUID (the interface ID, low 64 bits, of GID 0: ``ports/<p>/gids/0``); for every
PF in the host netns with VFs enabled, the node and port GUID of each VF as the PF reports them
(``IFLA_VF_INFO``, rdmanet.cni.linux.vf_guid). All-zero and all-ones mean "unset" and are never in use.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Iterable, Optional

from rdmanet.cni.core.infiniband import ALL_ONES_GUID, ZERO_GUID

from . import infiniband, sysfs, vf_guid


def _port_guid(device: str, port: int, root: str) -> Optional[int]:
    text = sysfs.read_attribute(f"/sys/class/infiniband/{device}/ports/{port}/gids/0", root)
    try:
        return int(ipaddress.IPv6Address(text)) & ((1 << 64) - 1) if text else None
    except ValueError:
        return None


def rdma_guids(root: str, skip: Iterable[str] = ()) -> dict[int, str]:
    """{GUID: what uses it} of the node and port GUIDs of every RDMA device but ``skip``."""
    found: dict[int, str] = {}
    for device in sysfs.rdma_devices(root):
        if device in skip:
            continue
        node = infiniband.node_guid(device, root)
        if node is not None:
            found.setdefault(node, f"the node GUID of RDMA device {device}")
        for port in infiniband.ports(device, root):
            guid = _port_guid(device, port, root)
            if guid is not None:
                found.setdefault(guid, f"the port GUID of {device} port {port}")
    return found


def vf_guids(ipr: Any, root: str, skip: Optional[tuple[str, int]] = None) -> dict[int, str]:
    """{GUID: what uses it} of the node and port GUIDs of every VF of every PF in the netns of
    ``ipr`` (``skip``: the (PF netdev, VF index) to leave out)."""
    found: dict[int, str] = {}
    for msg in ipr.get_links():
        name = msg.get("IFLA_IFNAME")
        numvfs = sysfs.read_attribute(f"/sys/class/net/{name}/device/sriov_numvfs", root)
        if not name or not numvfs or not numvfs.isdigit() or int(numvfs) == 0:
            continue
        reply = ipr.link("get", index=msg["index"], ext_mask=vf_guid.RTEXT_FILTER_VF)[0]
        for vf in range(int(numvfs)):
            if skip == (name, vf):
                continue
            for which, guid in zip(("node", "port"), vf_guid.guids_in(reply, vf)):
                if guid is not None:
                    found.setdefault(guid, f"the {which} GUID of VF {vf} of {name}")
    return found


def in_use(ipr: Any, root: str, guid: int, *, own_devices: Iterable[str] = (),
           own_vf: Optional[tuple[str, int]] = None) -> Optional[str]:
    """What on this node already uses ``guid`` (a VF's own RDMA devices and the VF itself
    aside), or None."""
    if guid in (ZERO_GUID, ALL_ONES_GUID):
        return None
    return rdma_guids(root, own_devices).get(guid) or vf_guids(ipr, root, own_vf).get(guid)
