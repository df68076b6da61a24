"""InfiniBand SR-IOV VFs for host-device-rdma: the node and port GUID (ib-sriov-cni's job).

An IB VF needs a GUID before RDMA works in the pod; a never-initialised mlx5 VF has all zeros
("VF ... GUID is not valid" against ib-sriov-cni). The GUID comes from, in order:

1. ``runtimeConfig.infinibandGUID`` (Multus' ``infiniband-guid`` network element, passed when the
   config declares ``"capabilities": {"infinibandGUID": true}``);
2. the config's ``guid``;
3. when the VF's current GUID is all-zero (or all-ones, ib-sriov-cni's "unset"): a GUID derived
   from the attachment (rdmanet.cni.core.infiniband.derive_guid of network/containerID/ifname), so a
   repeated ADD sets the same one.

Otherwise the VF keeps the GUID it has. A GUID given but all-zero, all-ones or not 8 octets is a
CNI error naming where it came from. Setting it (ib-sriov-cni's order): node GUID, then port GUID
through the PF (rdmanet.cni.linux.vf_guid), then the VF driver is unbound and bound so they take effect,
all before the RDMA device and the netdev move. The rebind re-creates the VF's netdev (its name
may change) and RDMA device; the caller looks both up again.

The state file keeps an :class:`IbRecord` (the GUID, its source, the VF's previous node and port
GUID), written before the first request, so DEL and GC restore the previous GUIDs (all-zero
written back as all-ones, as ib-sriov-cni does: mlx5 takes that as "unset") and rebind again.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, Optional

from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, LINK_FAILURE, CNIError
from rdmanet.cni.core.infiniband import ALL_ONES_GUID, ZERO_GUID, derive_guid, guid_of_hwaddr, guid_text, parse_guid
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.linux import ib_guids, infiniband, links, sysfs, vf_guid

from .attachment_state import IbRecord
from .selection import DeviceRef

if TYPE_CHECKING:
    from .config import HostDeviceConf  # annotations only: the models are the verbs' to import

log = logging.getLogger("rdmanet.host-device-rdma")
DERIVED = "derived from the attachment"
KEPT = "the VF's own"
REBIND_WAIT = 10.0  # seconds for the VF's netdev to come back after bind (ib-sriov-cni polls 10 s too)


def is_ib_vf(ref: DeviceRef, root: Optional[str] = None) -> bool:
    """An SR-IOV VF whose PF netdev is an IPoIB netdev (ARPHRD 32): an InfiniBand VF."""
    if ref.vf_index is None or not ref.pf_netdev:
        return False
    return infiniband.is_ipoib(ref.pf_netdev, root or sysfs.default_root())


def check_keys(ref: DeviceRef, conf: HostDeviceConf, inv: Invocation, mac: Optional[str]) -> None:
    """``guid``, ``pkey`` or runtimeConfig.infinibandGUID on anything but an IB VF is a config
    error; so is a MAC for an IB VF (its 20-byte IPoIB address follows the port GUID)."""
    given = [k for k, v in (("guid", conf.guid), ("pkey", conf.pkey),
                            ("runtimeConfig.infinibandGUID", inv.runtime_config.get("infinibandGUID"))) if v not in (None, "")]
    ib = is_ib_vf(ref)
    if given and not ib:
        raise CNIError(INVALID_CONFIG, f"{' and '.join(given)} given but {ref.describe()} is not an InfiniBand VF",
                       "remove them, or select a VF of an InfiniBand PF (its PF netdev is IPoIB: /sys/class/net/<pf>/type is 32)")
    if mac and ib:
        raise CNIError(INVALID_CONFIG, f"a MAC address ({mac}) does not apply to {ref.describe()}, an InfiniBand VF: its "
                       "IPoIB address follows the port GUID",
                       'remove mac (config, CNI_ARGS MAC, runtimeConfig.mac); give "guid" or the pod\'s infiniband-guid instead')


def requested_guid(conf: HostDeviceConf, inv: Invocation) -> tuple[Optional[int], str]:
    """(GUID, where it came from) of runtimeConfig.infinibandGUID, else the config's ``guid``;
    (None, "") when neither is given. CNIError 7 naming the source for a bad one."""
    for value, source in ((inv.runtime_config.get("infinibandGUID"), "runtimeConfig.infinibandGUID"), (conf.guid, "guid")):
        if value is None or value == "":
            continue
        try:
            return parse_guid(value), f"from {source}"
        except ValueError as exc:
            raise CNIError(INVALID_CONFIG, f"invalid network config: {source}: {exc}",
                           "give a VF GUID of 8 octets that is neither all-zero nor all-ones, e.g. 02:00:00:00:00:00:00:01 "
                           "(Multus: the network element's \"infiniband-guid\" with the infinibandGUID capability)") from None
    return None, ""


def plan(host, ref: DeviceRef, conf: HostDeviceConf, inv: Invocation) -> IbRecord:
    """The record of what ADD will do to the VF's GUIDs (nothing changed yet)."""
    pf = _pf(host, ref)
    previous_node, previous_port = current_guids(host, pf.index, ref)
    guid, source = requested_guid(conf, inv)
    current = previous_port if previous_port is not None else previous_node
    if guid is None and current in (None, ZERO_GUID, ALL_ONES_GUID):
        guid, source = derive_guid(f"{inv.network_name}/{inv.container_id}/{inv.ifname}"), DERIVED
        log.info("VF %s has no GUID (%s): using %s, %s", ref.device_id, "unknown" if current is None else guid_text(current),
                 guid_text(guid), source)
    if guid is not None:
        _refuse_taken(host, ref, guid, source)
    return IbRecord(pf=ref.pf_netdev, vf=ref.vf_index, guid=_text(guid if guid is not None else current),
                    source=source or KEPT, previous_node=_text(previous_node), previous_port=_text(previous_port))


def _refuse_taken(host, ref: DeviceRef, guid: int, source: str) -> None:
    """A GUID another port or VF of the node has (rdmanet.cni.linux.ib_guids) is CNI error 7:
    the VF would take that port's partition membership."""
    root = sysfs.default_root()
    own = sysfs.rdma_devices_for_device_id(ref.device_id, root) if ref.device_id else []
    user = ib_guids.in_use(host, root, guid, own_devices=own, own_vf=(ref.pf_netdev, ref.vf_index))
    if user is None:
        return
    where = source.removeprefix("from ")
    raise CNIError(INVALID_CONFIG, f"invalid network config: {where}: GUID {guid_text(guid)} is already {user} on this "
                   f"node; given to {ref.describe()} it would take that port's partition membership",
                   "give a GUID no port or VF of the node has (ib-kubernetes allocates unique ones from its pool), "
                   "or none: a VF without a GUID gets one derived from the attachment")


def apply(host, ref: DeviceRef, record: IbRecord, save) -> DeviceRef:
    """Set node and port GUID through the PF, rebind the VF's driver; the DeviceRef with the VF's
    netdev as it is after the rebind. ``save()`` persists ``record`` (marked set first)."""
    if record.source == KEPT:
        return ref
    guid = parse_guid(record.guid)
    pf_index = _pf(host, ref).index
    record.guid_set = True  # from here on DEL restores: a kill between the two requests leaves one set
    save()
    try:
        vf_guid.set_guid(host, pf_index, ref.pf_netdev, ref.vf_index, "node", guid, record.source)
    except CNIError:
        record.guid_set = False  # the kernel refused the first request: nothing changed, nothing to restore
        save()
        raise
    vf_guid.set_guid(host, pf_index, ref.pf_netdev, ref.vf_index, "port", guid, record.source)
    log.info("VF %s (%s of %s): node and port GUID %s (%s)", ref.vf_index, ref.device_id, ref.pf_netdev,
             record.guid, record.source)
    return rebind(ref)


def restore(host, ref: DeviceRef, record: IbRecord, original_name: Optional[str] = None) -> None:
    """Write the previous GUIDs back (all-zero as all-ones), rebind, and give the VF's netdev its
    original name again when the rebind renamed it."""
    if not record.guid_set:
        return
    pf = _pf(host, ref)
    for which, text in (("node", record.previous_node), ("port", record.previous_port)):
        value = ALL_ONES_GUID if text is None or int(text.replace(":", ""), 16) == ZERO_GUID else int(text.replace(":", ""), 16)
        vf_guid.set_guid(host, pf.index, ref.pf_netdev, ref.vf_index, which, value, "the VF's previous one")
    back = rebind(ref)
    if original_name and back.netdev and back.netdev != original_name:
        link = links.find_link(host, back.netdev)
        if link is not None and links.find_link(host, original_name) is None:
            links.rename(host, link.index, original_name)
    record.guid_set = False


def current_guids(host, pf_index: int, ref: DeviceRef) -> tuple[Optional[int], Optional[int]]:
    """(node, port) GUID of the VF: from the PF over netlink (kernel >= 5.6), else the node GUID
    of the VF's RDMA device in sysfs and the port GUID in its IPoIB address (bytes 12-19)."""
    node, port = vf_guid.read_guids(host, pf_index, ref.vf_index)
    root = sysfs.default_root()
    if node is None and ref.device_id:
        for ibdev in sysfs.rdma_devices_for_device_id(ref.device_id, root):
            node = infiniband.node_guid(ibdev, root)
            break
    if port is None and ref.netdev:
        address = sysfs.read_attribute(f"/sys/class/net/{ref.netdev}/address", root)
        try:
            port = guid_of_hwaddr(address) if address else None
        except ValueError:
            port = None
    return node, port


def rebind(ref: DeviceRef) -> DeviceRef:
    """Unbind and bind the VF's driver (``/sys/bus/pci/drivers/<driver>/{unbind,bind}``) and wait
    for its netdev to come back; the DeviceRef with the netdev's current name."""
    root = sysfs.default_root()
    driver = ref.driver or sysfs.driver_of_pci(ref.device_id, root)
    if not driver or driver in sysfs.DPDK_DRIVERS:
        return ref  # vfio-pci: the guest's driver reads the GUID when it starts
    for action in ("unbind", "bind"):
        try:
            sysfs.write_attribute(f"/sys/bus/pci/drivers/{driver}/{action}", ref.device_id, root)
        except OSError as exc:
            raise CNIError(IO_FAILURE, f"{action} VF {ref.device_id} from {driver}: {exc}",
                           f"the new GUID reaches the VF only through a driver rebind; check the node's kernel log and "
                           f"/sys/bus/pci/devices/{ref.device_id}/driver") from None
    if ref.netdev is None:
        return ref
    deadline = time.monotonic() + REBIND_WAIT
    while True:
        found = sysfs.netdevs_of_pci(ref.device_id, root)
        if found:
            return dataclasses.replace(ref, netdev=found[0])
        if time.monotonic() > deadline:
            raise CNIError(LINK_FAILURE, f"VF {ref.device_id} has no netdev {REBIND_WAIT:.0f} s after rebinding {driver}",
                           "see the node's kernel log (dmesg) for the VF's driver")
        time.sleep(0.1)


def check(host, ref: DeviceRef, record: IbRecord) -> Optional[str]:
    """None when the VF still has the GUID ADD set (or the driver does not report it)."""
    if not record.guid_set:
        return None
    node, port = vf_guid.read_guids(host, _pf(host, ref).index, ref.vf_index)
    want = parse_guid(record.guid)
    for which, value in (("node", node), ("port", port)):
        if value is not None and value != want:
            return f"VF {ref.vf_index} of {ref.pf_netdev}: {which} GUID is {guid_text(value)}, ADD set {record.guid}"
    return None


def _pf(host, ref: DeviceRef) -> Any:
    link = links.find_link(host, ref.pf_netdev) if ref.pf_netdev else None
    if link is None:
        raise CNIError(LINK_FAILURE, f"PF {ref.pf_netdev or ref.pf_pci} of {ref.describe()} is not in the host network namespace",
                       "the PF must stay in the host netns while its VFs are used")
    return link


def _text(value: Optional[int]) -> Optional[str]:
    return None if value is None else guid_text(value)
