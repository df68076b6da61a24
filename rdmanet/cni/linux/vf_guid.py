"""InfiniBand VF node and port GUIDs, set through the PF's IPoIB netdev over rtnetlink, and read back.

Kernel facts (net/core/rtnetlink.c ``do_setvfinfo``, include/uapi/linux/if_link.h,
drivers/infiniband/ulp/ipoib/ipoib_main.c):

- RTM_NEWLINK on the **PF** carrying ``IFLA_VFINFO_LIST`` (22) → ``IFLA_VF_INFO`` (1) →
  ``IFLA_VF_IB_NODE_GUID`` (10) or ``IFLA_VF_IB_PORT_GUID`` (11), each a ``struct ifla_vf_guid
  {__u32 vf; __u64 guid;}``: 16 bytes, 4 bytes of padding after ``vf``, the GUID in host byte order.
- ``do_setvfinfo`` returns right after handling the node GUID, so a port GUID in the same
  ``IFLA_VF_INFO`` is ignored: two requests, node then port (ib-sriov-cni, sriov-network-operator).
- A driver without ``ndo_set_vf_guid``, or a PF that is not ARPHRD_INFINIBAND, answers EOPNOTSUPP
  (only mlx5's IPoIB PF netdev implements it). A VF index at or above ``sriov_numvfs`` is EINVAL.
- Read back with RTM_GETLINK on the PF and ``IFLA_EXT_MASK`` RTEXT_FILTER_VF: each
  ``IFLA_VF_INFO`` then carries both GUIDs, when the driver has ``ndo_get_vf_guid`` (5.6+).
- The new GUIDs reach the VF only after its driver is unbound and bound again (done by the caller).

pyroute2's own ``vf={"ib_node_guid": ...}`` sends a 36-byte payload whose GUID bytes are reversed
unconditionally (right only on little-endian hosts); :class:`GuidMsg` sends the kernel's 16-byte
struct in this host's byte order, and tests/test_ib_vf.py compares it with the ABI byte for byte.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, Optional

from pyroute2.netlink import nla, nlmsg
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import RTM_NEWLINK

from rdmanet.cni.core.errors import LINK_FAILURE, CNIError
from rdmanet.cni.core.infiniband import guid_text

from .netlink_request import send

IFLA_VF_IB_NODE_GUID = 10
IFLA_VF_IB_PORT_GUID = 11
RTEXT_FILTER_VF = 1
KINDS = {"node": "IFLA_VF_IB_NODE_GUID", "port": "IFLA_VF_IB_PORT_GUID"}


class GuidMsg(nlmsg):
    """RTM_NEWLINK (ifinfomsg) with one VF GUID. Not an ifinfmsg subclass, for the reason
    vf_settings.VlanListMsg gives (pyroute2 would encode with ifinfmsg's compiled tables)."""

    fields = (("family", "B"), ("__align", "x"), ("ifi_type", "H"), ("index", "i"), ("flags", "I"), ("change", "I"))
    nla_map = ((22, "IFLA_VFINFO_LIST", "vflist"),)

    class vflist(nla):
        nla_map = ((1, "IFLA_VF_INFO", "vfinfo"),)

        class vfinfo(nla):
            nla_map = ((IFLA_VF_IB_NODE_GUID, "IFLA_VF_IB_NODE_GUID", "guid"),
                       (IFLA_VF_IB_PORT_GUID, "IFLA_VF_IB_PORT_GUID", "guid"))

            class guid(nla):
                # struct ifla_vf_guid: u32 vf, 4 bytes of padding, u64 guid (native order)
                fields = (("vf", "I"), ("__pad", "I"), ("guid", "Q"))


def guid_request(pf_index: int, vf: int, which: str, guid: int) -> GuidMsg:
    """The request setting the ``which`` ("node" or "port") GUID of VF ``vf`` of the PF."""
    msg = GuidMsg()
    msg["index"] = pf_index
    msg["attrs"] = [("IFLA_VFINFO_LIST", {"attrs": [("IFLA_VF_INFO", {"attrs": [
        (KINDS[which], {"vf": vf, "guid": guid})]})]})]
    return msg


def set_guids(ipr: Any, pf_index: int, pf: str, vf: int, guid: int, source: str = "") -> None:
    """Node GUID, then port GUID (the same value, as ib-sriov-cni sets them), each its own
    request. CNIError 100 naming the GUID, where it came from (``source``, e.g. "from
    runtimeConfig.infinibandGUID"), the VF and the fix."""
    for which in ("node", "port"):
        set_guid(ipr, pf_index, pf, vf, which, guid, source)


def set_guid(ipr: Any, pf_index: int, pf: str, vf: int, which: str, guid: int, source: str = "") -> None:
    """One request: the ``which`` ("node" or "port") GUID; CNIError 100 as :func:`set_guids`."""
    try:
        send(ipr, guid_request(pf_index, vf, which, guid), RTM_NEWLINK)
    except NetlinkError as exc:
        raise refusal(exc.code, which, guid, vf, pf, source) from None


def refusal(code: int, which: str, guid: int, vf: int, pf: str, source: str = "") -> CNIError:
    origin = f" ({source})" if source else ""
    msg = f"set {which} GUID {guid_text(guid)}{origin} on VF {vf} of {pf}: {os.strerror(code)}"
    if code == errno.EOPNOTSUPP:
        fix = (f"{pf} cannot set VF GUIDs: only the IPoIB netdev of an InfiniBand PF whose driver has ndo_set_vf_guid "
               "(mlx5) can; check that deviceID is a VF of an IB port (link layer InfiniBand), and that the PF is in "
               "the host netns")
    elif code == errno.EINVAL:
        fix = f"the driver refused the GUID or VF {vf} is not below {pf}'s sriov_numvfs; see the node's kernel log (dmesg)"
    elif code in (errno.EPERM, errno.EACCES):
        fix = "the plugin needs CAP_NET_ADMIN in the host network namespace"
    else:
        fix = f"see the node's kernel log (dmesg) for {pf}"
    return CNIError(LINK_FAILURE, msg, f"{fix} (errno {code})")


def raw_payloads(nested: Any) -> list[tuple[str, bytes]]:
    """(name, payload bytes as the kernel sent them) of each attribute of a pyroute2 nested nla,
    without decoding them: pyroute2 0.9.7 decodes IFLA_VF_IB_*_GUID as 36 bytes where the kernel
    sends 16, which fails (or reads the next attribute's bytes)."""
    out = []
    for slot in nested["attrs"]:
        cell = slot.cell[1] if hasattr(slot, "cell") else None
        data, offset, length = (getattr(cell, "data", None), getattr(cell, "offset", None), getattr(cell, "length", None))
        if data is not None and offset is not None and length:
            out.append((slot[0], bytes(data[offset + 4: offset + length])))
    return out


def guid_of_payload(payload: bytes) -> tuple[int, int]:
    """(vf, guid) of a ``struct ifla_vf_guid`` payload (16 bytes; longer ones are accepted)."""
    if len(payload) < 16:
        raise ValueError(f"struct ifla_vf_guid is 16 bytes, got {len(payload)}")
    return int.from_bytes(payload[0:4], sys.byteorder), int.from_bytes(payload[8:16], sys.byteorder)


def read_guids(ipr: Any, pf_index: int, vf: int) -> tuple[Optional[int], Optional[int]]:
    """(node GUID, port GUID) of VF ``vf`` as the PF reports them; None for what the driver does
    not report (no ``ndo_get_vf_guid``). CNIError 100 when the PF cannot be read."""
    try:
        msg = ipr.link("get", index=pf_index, ext_mask=RTEXT_FILTER_VF)[0]
    except NetlinkError as exc:
        raise CNIError(LINK_FAILURE, f"read the VF GUIDs of PF index {pf_index}: {os.strerror(exc.code)}",
                       f"the PF must be in the plugin's network namespace (errno {exc.code})") from None
    return guids_in(msg, vf)


def guids_in(msg: Any, vf: int) -> tuple[Optional[int], Optional[int]]:
    """(node, port) GUID of VF ``vf`` in a GETLINK answer of its PF (decoded by pyroute2)."""
    vflist = msg.get_attr("IFLA_VFINFO_LIST")
    if not vflist:
        return None, None
    for info in vflist.get_attrs("IFLA_VF_INFO"):
        found: dict[str, int] = {}
        index = None
        for name, payload in raw_payloads(info):
            which = next((w for w, n in KINDS.items() if n == name), None)
            if which is not None and len(payload) >= 16:
                index, found[which] = guid_of_payload(payload)
        if index == vf:
            return found.get("node"), found.get("port")
    return None, None
