"""Which host device a host-device-rdma config selects: pure logic over ``rdmanet.cni.linux.sysfs``.

The ways to name the device (host-device's, plus the device ID Multus hands over):

- a **device ID**: top-level ``deviceID``, then ``pciBusID``, then ``runtimeConfig.deviceID``.
  Multus (pkg/types/conf.go) sets ``deviceID`` and ``pciBusID`` to the same value (and the
  ``deviceID`` capability to it too), so equal values are one selector; different values are an
  error naming both keys rather than a silent pick (host-device lets runtimeConfig win, a NAD's
  static ID would otherwise override the device plugin's allocation or the reverse). The ID is a
  PCI address ``dddd:bb:dd.f`` (looked up under /sys/bus/pci, lower-cased) or an auxiliary
  device name such as ``mlx5_core.sf.2`` (under /sys/bus/auxiliary).
- a **name selector**: ``device`` (taken as given; the plugin checks it over netlink),
  ``hwaddr`` (the caller's netlink lookup) or ``kernelpath`` (``/sys/devices/...``, its
  ``net/`` entry).

At least one way must be given. Several are fine when they agree on the netdev (e.g. the
``device`` a NAD names is the netdev of the VF Multus allocated), otherwise an error names both
keys and what each selected.

A device ID whose PCI function has no netdev is DPDK mode when its driver is vfio-pci,
uio_pci_generic or igb_uio (sriov-cni, host-device), an error otherwise. For an SR-IOV VF the
PF (``physfn``), the PF's netdev (first of ``physfn/net``) and the VF index (``virtfnN``, N <
``sriov_numvfs``) are filled, as sriov-cni needs them to set VF knobs through the PF. An mlx5
sub-function (auxiliary) is not a VF: its pf_* fields stay None.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Callable, Literal, Optional

from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, CNIError
from rdmanet.cni.linux import sysfs

Kind = Literal["pci", "auxiliary"]

# (conf_fields key, name shown to the user), in precedence order.
DEVICE_ID_KEYS = (("deviceID", "deviceID"), ("pciBusID", "pciBusID"), ("runtimeDeviceID", "runtimeConfig.deviceID"))
DEVICE_ID_SHOWN = frozenset(shown for _, shown in DEVICE_ID_KEYS)
NAME_KEYS = ("device", "hwaddr", "kernelpath")

_AUX_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)+$")  # <module>.<device>.<id>
_SHORT_PCI_RE = re.compile(r"^[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")
_IFNAME_BAD = re.compile(r"[/:\s\0]")

_FIX_DEVICE_PLUGIN = (
    "check the device plugin's resourceName and selectors (the NAD's "
    "k8s.v1.cni.cncf.io/resourceName annotation) or the configured ID"
)


@dataclass(frozen=True)
class DeviceRef:
    """The selected host device.

    ``netdev`` is None in DPDK mode; ``selector`` is the config key that chose it (the device
    ID key when one was given, else the first of device, hwaddr, kernelpath); ``device_id`` and
    ``kind`` identify the device on its bus (None for a virtual netdev); the pf_* fields and
    ``vf_index`` are set for an SR-IOV VF only.
    """

    netdev: Optional[str]
    selector: str
    device_id: Optional[str]
    kind: Optional[Kind]
    pf_pci: Optional[str]
    pf_netdev: Optional[str]
    vf_index: Optional[int]
    driver: Optional[str]
    dpdk: bool

    @property
    def lock_key(self) -> str:
        """What identifies the device across renames and netns moves: its bus ID, else its name."""
        return self.device_id or f"netdev-{self.netdev}"

    def describe(self) -> str:
        if self.vf_index is not None:
            return f"VF {self.vf_index} ({self.device_id}) of {self.pf_netdev or self.pf_pci}"
        if self.device_id:
            return f"{self.kind} device {self.device_id}" + (f" ({self.netdev})" if self.netdev else "")
        return f"netdev {self.netdev}"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "DeviceRef":
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})


def _err(msg: str, fix: str) -> CNIError:
    return CNIError(INVALID_CONFIG, msg, fix)


def _given(conf_fields: dict, key: str, shown: str) -> Optional[str]:
    value = conf_fields.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _err(f"{shown} must be a string, got {type(value).__name__}", f'set "{shown}" to a string or remove it')
    return value


def _device_id(conf_fields: dict) -> Optional[tuple[str, str]]:
    """(shown key, ID) from the device-ID keys; equal values collapse, different ones fail."""
    chosen: Optional[tuple[str, str]] = None
    for key, shown in DEVICE_ID_KEYS:
        value = _given(conf_fields, key, shown)
        if value is None:
            continue
        if sysfs.is_pci_address(value):
            value = value.lower()
        if chosen is None:
            chosen = (shown, value)
        elif chosen[1] != value:
            raise _err(
                f'{chosen[0]} "{chosen[1]}" and {shown} "{value}" name different devices',
                f"Multus sets deviceID and pciBusID (and the deviceID capability) to the same value; "
                f"remove {shown} or {chosen[0]} from the network config",
            )
    return chosen


def _kind_of(shown: str, dev_id: str, root: str) -> Kind:
    """Check the ID's format and that it exists; PCI-shaped IDs are only looked up as PCI."""
    if sysfs.is_pci_address(dev_id):
        kind: Kind = "pci"
    elif _AUX_NAME_RE.fullmatch(dev_id):
        kind = "auxiliary"
    else:
        hint = f" (a PCI address needs its domain: 0000:{dev_id.lower()})" if _SHORT_PCI_RE.fullmatch(dev_id) else ""
        raise _err(
            f"{shown} {dev_id!r}: not a PCI address (dddd:bb:dd.f) or an auxiliary device name (e.g. mlx5_core.sf.2)",
            f"set {shown} to the device's PCI address or auxiliary name{hint}; {_FIX_DEVICE_PLUGIN}",
        )
    if not sysfs.device_exists(kind, dev_id, root):
        raise _err(
            f"{shown} {dev_id}: no such PCI or auxiliary device",
            f"neither /sys/bus/pci/devices/{dev_id} nor /sys/bus/auxiliary/devices/{dev_id} exists on this node; "
            + _FIX_DEVICE_PLUGIN,
        )
    return kind


def _netdevs_of_id(shown: str, kind: Kind, dev_id: str, driver: Optional[str], root: str) -> list[str]:
    """The ID's netdevs; [] only for a PCI function in DPDK mode, otherwise at least one."""
    found = sysfs.netdevs_of_pci(dev_id, root) if kind == "pci" else sysfs.netdevs_of_auxiliary(dev_id, root)
    if found or (kind == "pci" and driver in sysfs.DPDK_DRIVERS):
        return found
    if kind == "auxiliary":
        raise _err(
            f"{shown} {dev_id}: auxiliary device has no netdev (driver: {driver or 'none bound'})",
            "activate the sub-function and bind it to its driver (devlink port function set ... state active), "
            f"or {_FIX_DEVICE_PLUGIN}",
        )
    if driver is None:
        raise _err(
            f"{shown} {dev_id}: PCI device has no netdev and no driver bound",
            f"bind it to its kernel network driver (or to one of {', '.join(sysfs.DPDK_DRIVERS)} for DPDK mode)",
        )
    raise _err(
        f'{shown} {dev_id}: PCI device has no netdev and its driver "{driver}" is not a DPDK driver',
        f"bind it to its kernel network driver (or to one of {', '.join(sysfs.DPDK_DRIVERS)} for DPDK mode)",
    )


def _by_name(key: str, value: str, netdev_by_mac: Callable[[str], Optional[str]], root: str) -> str:
    """The netdev a name selector names."""
    if key == "device":
        if len(value) > 15 or value in (".", "..") or _IFNAME_BAD.search(value):
            raise _err(
                f"device {value!r}: not a valid interface name",
                "set device to a host interface name such as ens1f0",
            )
        return value
    if key == "hwaddr":
        mac = value.replace("-", ":").lower()
        found = netdev_by_mac(mac)
        if not found:
            raise _err(
                f"hwaddr {mac}: no host interface has this MAC address",
                'check the address (ip -br link) or select the interface with "device"',
            )
        return found
    try:
        found_list = sysfs.netdev_of_kernelpath(value, root)
    except ValueError as exc:
        raise _err(f"kernelpath: {exc}", "set kernelpath to the device's /sys/devices/... directory") from None
    if len(found_list) != 1:
        what = "no netdev" if not found_list else f"{len(found_list)} netdevs ({', '.join(found_list)})"
        raise _err(
            f"kernelpath {value}: {what} under {value.rstrip('/')}/net",
            'set kernelpath to the directory of the network device itself, or select the interface with "device"',
        )
    return found_list[0]


def _sriov(shown: str, kind: Optional[str], dev_id: Optional[str], root: str):
    """(pf_pci, pf_netdev, vf_index) for a VF, all None otherwise."""
    if kind != "pci" or dev_id is None:
        return None, None, None
    pf = sysfs.pf_of_vf(dev_id, root)
    if pf is None:
        return None, None, None
    index = sysfs.vf_index(pf, dev_id, root)
    if index is None:
        raise _err(
            f"{shown}: {dev_id} is a VF of {pf} but no virtfnN link of {pf} below sriov_numvfs points to it",
            f"check /sys/bus/pci/devices/{pf}/sriov_numvfs and its virtfn* links (the VF may be going away); "
            + _FIX_DEVICE_PLUGIN,
        )
    return pf, sysfs.pf_netdev_of_vf(dev_id, root), index


def select_device(
    conf_fields: dict,
    *,
    netdev_by_mac: Callable[[str], Optional[str]],
    root: str = "/",
) -> DeviceRef:
    """Resolve the config's selectors to one host device.

    ``conf_fields`` holds "device", "hwaddr", "kernelpath", "pciBusID", "deviceID" and
    "runtimeDeviceID" (``runtimeConfig.deviceID``); absent, None and "" mean not given.
    ``netdev_by_mac`` maps a lower-case MAC to a host netdev name (or None). Raises CNIError
    (7) naming the key and the fix, or (5) when sysfs cannot be read.
    """
    try:
        return _select(conf_fields, netdev_by_mac, root)
    except OSError as exc:
        raise CNIError(
            IO_FAILURE, f"reading sysfs to select the device: {exc}", "check that /sys is mounted and readable"
        ) from None


def _select(conf_fields: dict, netdev_by_mac: Callable[[str], Optional[str]], root: str) -> DeviceRef:
    dev = _device_id(conf_fields)
    names = [(k, v) for k in NAME_KEYS if (v := _given(conf_fields, k, k)) is not None]
    if dev is None and not names:
        raise _err(
            "no device selected: set one of device, hwaddr, kernelpath, pciBusID or deviceID",
            "with Multus, deviceID comes from the device plugin named by the NAD's "
            'k8s.v1.cni.cncf.io/resourceName annotation; without one, name the host interface with "device"',
        )

    # Every name selector must name the same netdev.
    netdev: Optional[str] = None
    first: Optional[tuple[str, str]] = None
    for key, value in names:
        found = _by_name(key, value, netdev_by_mac, root)
        if first is None:
            first, netdev = (key, value), found
        elif found != netdev:
            raise _err(
                f'{first[0]} "{first[1]}" selects {netdev} but {key} "{value}" selects {found}',
                "set only one of them, or make both name the same interface",
            )

    if dev is not None:
        shown, dev_id = dev
        kind = _kind_of(shown, dev_id, root)
        driver = sysfs.driver_of_device(kind, dev_id, root)
        found_list = _netdevs_of_id(shown, kind, dev_id, driver, root)
        if first is not None and netdev not in found_list:
            has = ", ".join(found_list) if found_list else "no netdev (DPDK mode)"
            raise _err(
                f'{first[0]} "{first[1]}" selects {netdev} but {shown} {dev_id} has {has}',
                f"set only one of them, or make {first[0]} name the interface of {dev_id}",
            )
        if first is None and len(found_list) > 1:
            raise _err(
                f"{shown} {dev_id}: device has {len(found_list)} netdevs ({', '.join(found_list)})",
                'also set "device" to the one to use',
            )
        if netdev is None and found_list:
            netdev = found_list[0]
        pf, pf_netdev, index = _sriov(shown, kind, dev_id, root)
        return DeviceRef(
            netdev=netdev, selector=shown, device_id=dev_id, kind=kind, pf_pci=pf,
            pf_netdev=pf_netdev, vf_index=index, driver=driver, dpdk=not found_list,
        )

    assert first is not None and netdev is not None
    ident = sysfs.device_id_of_netdev(netdev, root)
    kind, dev_id = ident if ident is not None else (None, None)
    driver = sysfs.driver_of_device(kind, dev_id, root) if kind is not None else None
    pf, pf_netdev, index = _sriov(first[0], kind, dev_id, root)
    return DeviceRef(
        netdev=netdev, selector=first[0], device_id=dev_id, kind=kind, pf_pci=pf,
        pf_netdev=pf_netdev, vf_index=index, driver=driver, dpdk=False,
    )
