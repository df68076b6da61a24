"""Shared RDMA mode (macvlan-rdma, ipoib-rdma): nothing moves; the plugin checks that the master
port has an RDMA device the pod can use, and reports it in the device-info file."""

from __future__ import annotations

import logging
from typing import Optional

from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.rdma_policy import SharedDecision, decide_shared

from . import sysfs

log = logging.getLogger("rdmanet")


def decide(setting: str, master: str) -> SharedDecision:
    """``rdma`` ("auto"/"required"/"off") for ``master``, from sysfs and the RDMA netns mode."""
    if setting == "off":
        return SharedDecision(None)
    devices = sysfs.rdma_devices_for_netdev(master, root=sysfs.default_root())
    mode = None
    if devices or setting == "required":
        from . import rdma_netlink  # only with a device to ask about

        mode = rdma_netlink.netns_mode()
    return decide_shared(setting, master, devices, mode)


def report(decision: SharedDecision, device_info_path: Optional[str], inv: Invocation, master: str) -> None:
    """Log the decision; write the RDMA device to the device-info file when there is one."""
    if decision.warning:
        log.warning("%s", decision.warning)
    if decision.device is None:
        return
    log.info("%s/%s: shared RDMA device %s of master %s", inv.container_id[:12], inv.ifname, decision.device, master)
    if device_info_path:
        from . import device_info

        device_info.write_rdma_device_info(
            device_info_path, pci_address=sysfs.pci_address_of_netdev(master, root=sysfs.default_root()),
            rdma_device=decision.device,
        )
