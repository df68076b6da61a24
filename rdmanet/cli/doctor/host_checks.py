"""Judging the host facts (``host_facts``): pure functions from facts to findings.

Areas: ``nic`` (RDMA-capable PCI functions), ``link`` (their netdevs), ``rdma`` (RDMA devices and
ports), ``rdma-mode`` (the netns mode and what it means for each plugin), ``sriov``, ``modules``,
``dev`` (/dev/infiniband).

Facts relied on, besides those in ``host_facts``:

- RoCE carries at most the largest IB MTU (256, 512, 1024, 2048, 4096) that fits in the netdev
  MTU less 88 bytes of RoCE headers: a 1500-byte port runs RoCE at 1024, 4096 needs 4184 or more.
- An InfiniBand port in state INIT has a physical link but no subnet manager has configured it.
- rxe and siw cannot be moved to another netns (the move answers EOPNOTSUPP in any mode).
- ``nvidia_peermem`` lets an RDMA NIC read and write GPU memory directly (GPUDirect RDMA through
  peer memory); without it NCCL stages through host memory unless it uses DMA-BUF.
"""

from __future__ import annotations

from typing import Optional

from rdmanet.cni.core.rdma_policy import EXCLUSIVE, SHARED
from rdmanet.cni.linux.sysfs import DPDK_DRIVERS

from . import nic_models
from .findings import Finding, error, info, ok, warn
from .host_facts import HostFacts, Netdev, PciFunction, RdmaDevice

ROCE_HEADERS = 88
IB_MTUS = (4096, 2048, 1024, 512, 256)


def _state(text: Optional[str]) -> str:
    """``4: ACTIVE`` -> ``ACTIVE``."""
    if not text:
        return "?"
    return text.split(":", 1)[1].strip() if ":" in text else text.strip()


def roce_mtu(netdev_mtu: int) -> Optional[int]:
    """The largest RoCE (IB) MTU a netdev MTU allows."""
    return next((m for m in IB_MTUS if m <= netdev_mtu - ROCE_HEADERS), None)


def _model(fn: PciFunction, facts: HostFacts) -> str:
    pf = facts.pci.get(fn.physfn) if fn.physfn else None
    pf_model = nic_models.lookup(pf.vendor, pf.device) if pf else None
    return nic_models.describe(fn.vendor, fn.device, pf_model)


def _joined(items, empty: str = "none") -> str:
    return ", ".join(items) if items else empty


def _has_module(facts: HostFacts, name: str) -> Optional[bool]:
    """True/False when the module list is readable, None when unknown."""
    if not facts.modules.source:
        return None
    return facts.modules.state.get(name) is not None


# --------------------------------------------------------------------------- nic, link


def check_nics(facts: HostFacts) -> list[Finding]:
    if not facts.nic_functions():
        return [info("nic", "-", "no RDMA-capable PCI NIC (no NVIDIA/Mellanox network function, none with an RDMA device)",
                     "nothing to do unless this node should serve RDMA pods")]
    out = []
    for fn in facts.nic_functions():
        model = nic_models.lookup(fn.vendor, fn.device)
        what = (f"{_model(fn, facts)} [{nic_models.pci_id(fn.vendor, fn.device)}], driver {fn.driver or 'none'}, "
                f"netdev {_joined(fn.netdevs)}, RDMA {_joined(fn.rdma)}")
        want = model.driver if model else None
        if fn.driver is None:
            fix = (f"load its driver (modprobe {want})" if want else "load its network driver") + \
                  (f" or bind it: echo {fn.address} > /sys/bus/pci/drivers/{want}/bind" if want else "")
            out.append(error("nic", fn.address, what + ": no driver is bound, the NIC is unused", fix))
        elif fn.driver in DPDK_DRIVERS:
            out.append(info("nic", fn.address, what + f": bound to {fn.driver} for DPDK (no netdev, no RDMA device)",
                            f"for kernel networking and RDMA bind it to {want or 'its network driver'} instead"))
        elif want and fn.driver != want:
            out.append(warn("nic", fn.address, what + f": bound to {fn.driver}, not {want}",
                            f"bind it to {want} for netdev + RDMA"))
        elif not fn.rdma and nic_models.is_mellanox(fn.vendor):
            ib_driver = "mlx4_ib" if want == nic_models.MLX4 else "mlx5_ib"
            loaded = _has_module(facts, ib_driver)
            if loaded is False:
                fix = f"modprobe {ib_driver} (and list it in /etc/modules-load.d/ so it loads at boot)"
            else:
                fix = (f"RoCE may be disabled on the port: see 'devlink dev param show pci/{fn.address} name enable_roce'"
                       f"; {ib_driver} must be loaded")
            out.append(warn("nic", fn.address, what + ": no RDMA device, so pods get no RDMA on it", fix))
        elif model is None and nic_models.is_mellanox(fn.vendor):
            out.append(ok("nic", fn.address, what + " (model not in rdmanet's table)"))
        else:
            out.append(ok("nic", fn.address, what))
    return out


def _link_text(dev: Netdev) -> str:
    carrier = {True: "carrier on", False: "no carrier", None: "carrier ?"}[dev.carrier]
    speed = f"{dev.speed} Mb/s" if dev.speed else "speed ?"
    return f"{dev.operstate or '?'}, {carrier}, {speed}, MTU {dev.mtu if dev.mtu is not None else '?'}"


def _nic_netdevs(facts: HostFacts) -> list[str]:
    """Netdevs of the NIC functions and of the RDMA devices (PF ports, SFs, rxe parents), in order."""
    names: list[str] = []
    for fn in facts.nic_functions():
        names += fn.netdevs
    for dev in facts.rdma.values():
        if dev.parent_kind != "pci" or dev.parent_id not in facts.pci or facts.pci[dev.parent_id].physfn is None:
            names += dev.netdevs
    seen: list[str] = []
    for n in names:
        if n not in seen:
            seen.append(n)
    return seen


def check_links(facts: HostFacts) -> list[Finding]:
    out = []
    for name in _nic_netdevs(facts):
        dev = facts.netdevs.get(name)
        if dev is None or not dev.exists:
            continue
        text = _link_text(dev)
        if dev.operstate == "down" and dev.carrier is not True:
            out.append(warn("link", name, text + ": the link is down",
                            f"ip link set dev {name} up; if it stays down check the cable, transceiver and switch port"))
        elif dev.carrier is False:
            out.append(warn("link", name, text + ": no carrier", "check the cable, transceiver and switch port"))
        else:
            out.append(ok("link", name, text))
        roce = any(p.link_layer == "Ethernet" for ib in dev.rdma if ib in facts.rdma for p in facts.rdma[ib].ports)
        if roce and dev.mtu is not None and dev.mtu < 4096 + ROCE_HEADERS:
            limit = roce_mtu(dev.mtu)
            out.append(info("link", name, f"MTU {dev.mtu} limits RoCE to a {limit or 'no'}-byte MTU (4096 needs {4096 + ROCE_HEADERS})",
                            f"for full-size RoCE frames set the MTU to 9000 on {name}, the switch ports and the peers"))
    return out


# --------------------------------------------------------------------------- rdma


def _soft_kind(name: str) -> str:
    if name.startswith("rxe"):
        return "soft-RoCE (rxe)"
    if name.startswith("siw"):
        return "soft-iWARP (siw)"
    return "software RDMA device"


def _port_text(dev: RdmaDevice) -> str:
    parts = []
    for p in dev.ports:
        layer = {"Ethernet": "RoCE", "InfiniBand": "InfiniBand"}.get(p.link_layer or "", p.link_layer or "?")
        text = f"port {p.number} {_state(p.state)} ({_state(p.phys_state)}), {layer}"
        if p.rate:
            text += f", {p.rate}"
        parts.append(text)
    return "; ".join(parts) or "no ports"


def check_rdma_devices(facts: HostFacts) -> list[Finding]:
    out = []
    if not facts.rdma:
        if facts.mode.status == "absent":
            out.append(info("rdma", "-", "no RDMA devices: this kernel has no RDMA core loaded",
                            "nothing to do unless this node should serve RDMA pods (then load the NIC's RDMA driver, e.g. mlx5_ib)"))
        else:
            out.append(info("rdma", "-", "no RDMA devices in /sys/class/infiniband",
                            "nothing to do unless this node should serve RDMA pods"))
        return out
    for dev in facts.rdma.values():
        if dev.parent_kind == "pci":
            parent = f"PCI {dev.parent_id}"
        elif dev.parent_kind == "auxiliary":
            parent = f"SF {dev.parent_id}"
        else:
            parent = f"{_soft_kind(dev.name)}, no PCI parent"
        text = f"{dev.name} <-> {_joined(dev.netdevs, 'no netdev')} ({parent}), {_port_text(dev)}"
        if dev.uverbs:
            text += ", " + " ".join(dev.uverbs)
        if dev.fw_ver:
            text += f", fw {dev.fw_ver}"
        down = [p for p in dev.ports if _state(p.state) != "ACTIVE"]
        if down:
            p = down[0]
            if p.link_layer == "InfiniBand" and _state(p.state) == "INIT":
                fix = "the port has a link but no subnet manager configured it: run opensm on the fabric (or check UFM)"
            else:
                fix = (f"bring the netdev up (ip link set dev {dev.netdevs[0]} up) and check the link" if dev.netdevs
                       else "check the port's link")
            out.append(warn("rdma", dev.name, text + f": port {p.number} is not ACTIVE", fix))
        elif dev.parent_kind is None:
            out.append(info("rdma", dev.name, text,
                            "software RDMA is for labs and CI: no offload, and it cannot move into a pod netns "
                            "(host-device-rdma in exclusive mode fails for it)"))
        else:
            out.append(ok("rdma", dev.name, text))
    return out


# --------------------------------------------------------------------------- netns mode


SWITCH_TO_SHARED = "rdma system set netns shared (or the module option 'ib_core netns_mode=1')"
SWITCH_TO_EXCLUSIVE = ("rdma system set netns exclusive while no pod netns exists, or at boot with the module option "
                       "'ib_core netns_mode=0'")


def check_netns_mode(facts: HostFacts) -> list[Finding]:
    mode = facts.mode
    hardware = bool(facts.rdma) or any(nic_models.is_mellanox(f.vendor) for f in facts.pci.values())
    if mode.status == "ok" and mode.mode == SHARED:
        return [info("rdma-mode", "shared",
                     "RDMA netns mode is shared: every netns sees every RDMA device. macvlan-rdma: pods use the "
                     "master's RDMA device (the shared-device-plugin setup). host-device-rdma: moves the netdev only; "
                     "its RDMA device stays shared, and rdma \"required\" refuses ADD",
                     f"for per-pod RDMA isolation (SR-IOV VFs with host-device-rdma): {SWITCH_TO_EXCLUSIVE}")]
    if mode.status == "ok" and mode.mode == EXCLUSIVE:
        return [info("rdma-mode", "exclusive",
                     "RDMA netns mode is exclusive: an RDMA device belongs to one netns. host-device-rdma: moves the "
                     "device's RDMA device into the pod with the netdev (the SR-IOV VF setup). macvlan-rdma: pods see "
                     "no RDMA device (rdma \"auto\" attaches without one, \"required\" refuses ADD)",
                     f"for macvlan-rdma pods sharing a port's RDMA device: {SWITCH_TO_SHARED}")]
    if mode.status == "absent":
        if hardware:
            return [warn("rdma-mode", "-", f"cannot read the RDMA netns mode: {mode.detail}",
                         "load the RDMA drivers (modprobe mlx5_ib ib_uverbs; ib_core comes with them)")]
        return [info("rdma-mode", "-", f"no RDMA on this host: {mode.detail}; the plugins attach netdevs without RDMA",
                     "nothing to do unless this node should serve RDMA pods")]
    if mode.status == "unsupported":
        return [warn("rdma-mode", "-", f"{mode.detail}; such a kernel behaves as shared: host-device-rdma never "
                     "moves RDMA devices", "use Linux 5.2 or later for exclusive mode")]
    return [warn("rdma-mode", "-", f"cannot read the RDMA netns mode: {mode.detail}",
                 "run 'rdma system' to see the mode; run doctor as root")]


# --------------------------------------------------------------------------- sriov


def check_sriov(facts: HostFacts) -> list[Finding]:
    out = []
    for pf in facts.nic_functions():
        if not pf.sriov_totalvfs:
            continue
        vfs = [(n, facts.pci.get(addr), addr) for n, addr in pf.vfs]
        with_rdma = [fn.rdma[0] for _, fn, _ in vfs if fn and fn.rdma]
        dpdk = sum(1 for _, fn, _ in vfs if fn and fn.driver in DPDK_DRIVERS)
        unbound = sum(1 for _, fn, _ in vfs if fn is None or fn.driver is None)
        head = f"{pf.sriov_numvfs or 0} of {pf.sriov_totalvfs} VFs enabled"
        if not pf.vfs:
            out.append(info("sriov", pf.address, head,
                            f"to give pods VFs: echo N > /sys/bus/pci/devices/{pf.address}/sriov_numvfs "
                            "(or let the SR-IOV network operator do it)"))
            continue
        out.append(info("sriov", pf.address, f"{head}: {len(with_rdma)} with RDMA ({_joined(with_rdma)}), "
                                             f"{dpdk} DPDK, {unbound} without a driver"))
        for n, fn, addr in vfs:
            subject = addr
            if fn is None or fn.driver is None:
                out.append(warn("sriov", subject, f"VF {n} of {pf.address}: no driver bound: no device plugin can hand it out",
                                f"bind it: echo {addr} > /sys/bus/pci/drivers/mlx5_core/bind (netdev + RDMA) or to vfio-pci (DPDK)"
                                if nic_models.is_mellanox(pf.vendor) else
                                f"bind it to its VF driver (netdev) or to vfio-pci (DPDK): echo {addr} > /sys/bus/pci/drivers/<driver>/bind"))
                continue
            text = f"VF {n} of {pf.address}: {_model(fn, facts)}, driver {fn.driver}"
            if fn.driver in DPDK_DRIVERS:
                out.append(info("sriov", subject, text + " (DPDK: no netdev; host-device-rdma hands it over without moving a netdev)"))
            elif not fn.rdma:
                text += f", netdev {_joined(fn.netdevs)}, no RDMA device"
                loaded = _has_module(facts, "mlx5_ib")
                fix = ("modprobe mlx5_ib" if loaded is False else
                       "enable RoCE for the VF (devlink port function ... roce enable, before binding the VF driver)")
                out.append(warn("sriov", subject, text, fix))
            else:
                out.append(ok("sriov", subject, text + f", netdev {_joined(fn.netdevs)}, RDMA {_joined(fn.rdma)}"))
    return out


# --------------------------------------------------------------------------- modules, dev


def check_modules(facts: HostFacts) -> list[Finding]:
    mods = facts.modules
    if not mods.source:
        return [info("modules", "-", "cannot tell which modules are loaded: neither /proc/modules nor /sys/module is readable",
                     "run 'lsmod' on the host, or give --proc-root / --sysfs-root")]
    has = {name: mods.state.get(name) for name in mods.state}
    drivers = {m.driver for m in (nic_models.lookup(f.vendor, f.device) for f in facts.pci.values()) if m}
    mlx5_hw, mlx4_hw = nic_models.MLX5 in drivers, nic_models.MLX4 in drivers
    rdma = bool(facts.rdma)

    def state(name: str) -> str:
        return {"loaded": "loaded", "built-in": "built in"}.get(has.get(name) or "", "not loaded")

    out = []

    def judge(name: str, role: str, needed: bool, fix: str, severity=error) -> None:
        if has.get(name):
            out.append(ok("modules", name, f"{state(name)}: {role}"))
        elif needed:
            out.append(severity("modules", name, f"not loaded: {role}", fix))
        else:
            out.append(info("modules", name, f"not loaded: {role}"))

    judge("mlx5_core", "the ConnectX-4 and later / BlueField network driver", mlx5_hw, "modprobe mlx5_core")
    judge("mlx5_ib", "RDMA on ConnectX-4 and later (creates mlx5_N); without it a ConnectX has no RDMA", mlx5_hw,
          "modprobe mlx5_ib (and list it in /etc/modules-load.d/)")
    if mlx4_hw or has.get("mlx4_core"):
        judge("mlx4_core", "the ConnectX-3 network driver", mlx4_hw, "modprobe mlx4_core")
        judge("mlx4_ib", "RDMA on ConnectX-3", mlx4_hw, "modprobe mlx4_ib")
    judge("ib_core", "the RDMA core (RDMA netlink, /sys/class/infiniband, the netns mode)", mlx5_hw or mlx4_hw or rdma,
          "load the NIC's RDMA driver (modprobe mlx5_ib pulls in ib_core)")
    judge("ib_uverbs", "user-space verbs, /dev/infiniband/uverbsN (libibverbs, NCCL, UCX)", rdma, "modprobe ib_uverbs")
    judge("rdma_ucm", "the RDMA connection manager from user space, /dev/infiniband/rdma_cm (rping, perftest -R, UCX, MPI)",
          rdma, "modprobe rdma_ucm", severity=warn)
    soft = [d.name for d in facts.rdma.values() if d.parent_kind is None]
    if has.get("rdma_rxe"):
        out.append(info("modules", "rdma_rxe", f"{state('rdma_rxe')}: soft-RoCE over any Ethernet netdev"
                        + (f" (devices: {', '.join(soft)})" if soft else "")))
    else:
        out.append(info("modules", "rdma_rxe", "not loaded: soft-RoCE (only for labs without RDMA NICs)"))
    gpu = has.get("nvidia")
    if has.get("nvidia_peermem"):
        out.append(ok("modules", "nvidia_peermem", f"{state('nvidia_peermem')}: GPUDirect RDMA, the NIC reads and writes GPU memory directly"))
    elif gpu and rdma:
        out.append(warn("modules", "nvidia_peermem",
                        "not loaded while the NVIDIA GPU driver is: GPUDirect RDMA through peer memory is off, so NCCL "
                        "stages RDMA through host memory unless it uses DMA-BUF",
                        "modprobe nvidia-peermem (it ships with the NVIDIA driver), or use DMA-BUF (open GPU kernel modules)"))
    elif gpu:
        out.append(info("modules", "nvidia_peermem", "not loaded: GPUDirect RDMA needs it (or DMA-BUF) once the node has RDMA"))
    else:
        out.append(info("modules", "nvidia_peermem", "not loaded, and no NVIDIA GPU driver either: GPUDirect RDMA does not apply here"))
    return out


def check_dev(facts: HostFacts) -> list[Finding]:
    dev = facts.dev
    rdma = list(facts.rdma.values())
    if not dev.exists:
        if rdma:
            return [error("dev", dev.path, "missing while the host has RDMA devices: pods get no verbs devices",
                          "modprobe ib_uverbs (and rdma_ucm); check that devtmpfs/udev populate /dev")]
        return [info("dev", dev.path, "absent (no RDMA device)")]
    uverbs = [e for e in dev.entries if e.startswith("uverbs")]
    umad = [e for e in dev.entries if e.startswith("umad")]
    text = "contents: " + (" ".join(dev.entries) or "(empty)")
    if rdma and not uverbs:
        return [error("dev", dev.path, text + ": no uverbsN, so no user-space verbs",
                      "modprobe ib_uverbs")]
    if len(uverbs) < len(rdma):
        return [warn("dev", dev.path, text + f": {len(rdma)} RDMA devices but {len(uverbs)} uverbs",
                     "modprobe ib_uverbs; check that udev created every uverbsN")]
    notes = []
    if "rdma_cm" not in dev.entries and rdma:
        notes.append("no rdma_cm (RDMA CM users fail: modprobe rdma_ucm)")
    if umad:
        notes.append(f"{len(umad)} umad (InfiniBand management)")
    return [ok("dev", dev.path, text + ("; " + "; ".join(notes) if notes else ""))]


def check_host(facts: HostFacts) -> list[Finding]:
    out: list[Finding] = []
    from .ib_checks import check_infiniband

    for check in (check_nics, check_links, check_rdma_devices, check_netns_mode, check_sriov, check_modules, check_dev,
                  check_infiniband):
        out += check(facts)
    return out
