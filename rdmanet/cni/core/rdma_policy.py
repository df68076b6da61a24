"""What a plugin does with the RDMA device of its link, decided from facts gathered elsewhere.

Pure logic: the caller reads the netns mode over RDMA netlink and the device list from sysfs.
``rdma`` is the config key: "auto" (use and report the device when there is one), "required"
(fail unless the deployment can work), "off" (do not look).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import RDMA_MISMATCH, CNIError

SHARED = "shared"
EXCLUSIVE = "exclusive"

SHARED_MODE_FIX = (
    "switch the host to shared RDMA netns mode with 'rdma system set netns shared' "
    "(or load ib_core with netns_mode=1), or set \"rdma\": \"auto\""
)


@dataclass(frozen=True)
class SharedDecision:
    """The RDMA device a shared-mode pod gets, or None with why."""

    device: Optional[str]  # the RDMA device the pod can use, or None
    warning: str = ""


def decide_shared(setting: str, link: str, devices: list[str], mode: Optional[str]) -> SharedDecision:
    """Shared mode (macvlan-rdma): nothing moves; the pod uses the master's RDMA device."""
    if setting == "off":
        return SharedDecision(None)
    if len(devices) > 1 and setting == "required":
        raise CNIError(RDMA_MISMATCH, f"master {link} has several RDMA devices {devices}", "set \"rdma\": \"auto\" or use a port with one RDMA device")
    device = devices[0] if len(devices) == 1 else None
    if setting == "required":
        if device is None:
            raise CNIError(
                RDMA_MISMATCH,
                f'rdma is "required" but master {link} has no RDMA device',
                "pick a master port of an RDMA NIC (see /sys/class/net/<if>/device/infiniband/ or 'rdma link'), "
                'or set "rdma": "auto"',
            )
        if mode is None:
            raise CNIError(RDMA_MISMATCH, "rdma is \"required\" but this kernel has no RDMA netlink (ib_core not loaded)",
                           "load the RDMA core modules (modprobe ib_core ib_uverbs) or set \"rdma\": \"auto\"")
        if mode == EXCLUSIVE:
            raise CNIError(
                RDMA_MISMATCH,
                f"rdma is \"required\" but the RDMA netns mode is exclusive: the pod cannot use {device} over a macvlan",
                SHARED_MODE_FIX,
            )
        return SharedDecision(device)
    if device is not None and mode == EXCLUSIVE:
        return SharedDecision(None, f"RDMA netns mode is exclusive: {device} of {link} is not visible in the pod")
    if len(devices) > 1:
        return SharedDecision(None, f"master {link} has several RDMA devices {devices}; not reporting one")
    return SharedDecision(device)


EXCLUSIVE_MODE_FIX = (
    "switch the host to exclusive RDMA netns mode: 'rdma system set netns exclusive' while no pod "
    "netns exists, or at boot with the module parameter 'options ib_core netns_mode=0'; "
    'or set "rdma": "auto" to move only the netdev'
)


def decide_exclusive(setting: str, device_id: str, devices: list[str], mode: Optional[str]) -> Optional[str]:
    """Exclusive mode (host-device-rdma): the RDMA device to move with the netdev, or None.

    "auto" moves it when the host is in exclusive mode and the device has exactly one RDMA
    device; "required" fails unless that is so.
    """
    if setting == "off":
        return None
    if len(devices) > 1:
        raise CNIError(RDMA_MISMATCH, f"{device_id} has several RDMA devices {devices}, expected one",
                       'set "rdma": "off" or pick a single function (PF, VF or SF)')
    if not devices:
        if setting == "required":
            raise CNIError(RDMA_MISMATCH, f'rdma is "required" but {device_id} has no RDMA device',
                           "load the NIC's RDMA driver (e.g. mlx5_ib) or set \"rdma\": \"auto\"")
        return None
    if mode == EXCLUSIVE:
        return devices[0]
    if setting == "required":
        found = "shared" if mode == SHARED else "unknown (no RDMA netlink)"
        raise CNIError(RDMA_MISMATCH, f'rdma is "required" but the RDMA netns mode is {found}: {devices[0]} cannot move into the pod',
                       EXCLUSIVE_MODE_FIX)
    return None
