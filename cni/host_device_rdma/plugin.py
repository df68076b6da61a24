"""host-device-rdma verbs (cni-contract sections 4-6).

ADD, as steps each undone if a later one fails:
  select the device -> lock it -> refuse it if a live pod holds it -> decide the RDMA move ->
  save the state (intent) -> apply VF settings through the PF -> move the RDMA device
  (exclusive mode) -> move the netdev through a temporary netns (rename to CNI_IFNAME, alias =
  original name) into the pod -> IPAM -> device-info file -> save the state (done).
DEL undoes it from the state file alone, and treats "already gone" as done at every step.
"""

from __future__ import annotations

import errno
import logging
import os
from contextlib import ExitStack, contextmanager
from typing import Iterator, Optional

from cni.core.errors import (
    INVALID_CONFIG,
    INVALID_ENVIRONMENT,
    RDMA_MISMATCH,
    CNIError,
    check_failed,
)
from cni.core.gc import valid_attachments
from cni.core.invocation import Invocation
from cni.core.ipam_exec import IPAM
from cni.core.rdma_policy import decide_exclusive
from cni.core.result import DNS, Interface, Result
from cni.core.rollback import quietly
from cni.linux import links, netns, sysfs
from cni.linux.state import StateDir

from . import device_lock
from .config import HostDeviceConf, effective_mac, load_conf
from .moves import move_into_pod, move_to_host, restore_in_host
from .selection import DeviceRef, select_device

log = logging.getLogger("rdmanet.host-device-rdma")
STATE_VERSION = 1



class HostDeviceRdma:
    def add(self, inv: Invocation) -> Result:
        conf = load_conf(inv)
        mac = effective_mac(conf, inv)
        netns.refuse_own(inv.netns, inv.env)
        states = StateDir(conf.stateDir)
        key = states.key(inv.network_name, inv.container_id, inv.ifname)
        holder = _holder(inv)
        _clear_previous(states, key)
        with links.rtnl_in() as host, ExitStack() as undo:
            ref = _select(conf, host)
            undo.enter_context(device_lock.held(conf.stateDir, ref.lock_key))
            device_lock.refuse_if_allocated(conf.stateDir, ref.lock_key, holder)
            if conf.vf_knobs_set() and ref.vf_index is None:
                raise CNIError(INVALID_CONFIG, f"VF settings given but {ref.describe()} is not an SR-IOV VF",
                               "remove vlan/spoofchk/trust/link_state/tx rates, or select a VF")
            rdma_device = _rdma_device(conf, ref)
            state = {"version": STATE_VERSION, "network": inv.network_name, "containerID": inv.container_id,
                     "ifname": inv.ifname, "netns": inv.netns, "device": ref.to_dict(), "ipam": bool(conf.ipam)}
            result = Result()
            if ref.dpdk:
                result.interfaces = [Interface(name=inv.ifname, sandbox=inv.netns, pci_id=ref.device_id or "")]
            else:
                link = links.find_link(host, ref.netdev)
                if link is None:
                    raise CNIError(INVALID_CONFIG, f"{ref.selector}: device {ref.netdev} is not in the host network namespace",
                                   "it may be in another pod, or the name is wrong (see 'ip link')")
                state["original"] = {"name": link.name, "mac": link.mac, "mtu": link.mtu, "up": link.up, "alias": link.alias}
            states.save(key, state)
            undo.callback(states.remove, key)
            if ref.vf_index is not None and (conf.vf_knobs_set() or mac):
                from .vf import apply_vf_settings, restore_vf_settings

                state["vf"] = apply_vf_settings(host, ref, conf, mac)
                states.save(key, state)
                undo.callback(quietly, restore_vf_settings, host, ref, state["vf"])
            pod_fd = undo.enter_context(_open_pod(inv.netns))
            if rdma_device:
                # RDMA first: a soft-RoCE device dies when its netdev leaves init_net, and a driver
                # that cannot change netns must fail before anything else moved.
                _move_rdma_into_pod(rdma_device, pod_fd)
                state["rdma"] = {"device": rdma_device, "moved": True}
                states.save(key, state)
                undo.callback(quietly, _move_rdma_to_host, rdma_device, inv.netns)
            if not ref.dpdk:
                moved = move_into_pod(host, link, pod_fd, inv.ifname, mtu=conf.mtu or None, mac=mac)
                undo.callback(quietly, move_to_host, pod_fd, inv.ifname, state["original"])
                result.interfaces = [Interface(name=inv.ifname, mac=moved.mac, mtu=moved.mtu, sandbox=inv.netns,
                                               pci_id=ref.device_id if ref.kind == "pci" else "")]
            if conf.ipam:
                IPAM(conf.ipam.type, inv).add_into(result, undo)
                if not ref.dpdk:  # DPDK: the addresses are returned for the workload to use, not configured
                    with links.rtnl_in_fd(pod_fd) as pod:
                        links.configure_in_pod(pod, pod_fd, moved.index, inv.ifname, result.ips, result.routes)
            if conf.dns:
                result.dns = DNS.from_json(conf.dns)
            _write_device_info(conf, ref, rdma_device)
            device_lock.record_allocation(conf.stateDir, ref.lock_key, holder, inv.netns)
            state["done"] = True
            states.save(key, state)
            undo.pop_all()
            log.info("ADD %s: %s -> %s:%s%s", key, ref.describe(), inv.netns, inv.ifname,
                     f" with RDMA device {rdma_device}" if rdma_device else "")
            return result

    def delete(self, inv: Invocation) -> None:
        conf = load_conf(inv)
        states = StateDir(conf.stateDir)
        key = states.key(inv.network_name, inv.container_id, inv.ifname)
        state = states.load(key)
        errors = []
        if state is not None:
            errors += undo_attachment(state, inv.netns or state.get("netns", ""), conf.stateDir)
        if conf.ipam:
            try:
                IPAM(conf.ipam.type, inv).delete()
            except CNIError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
        if state is not None:
            device_lock.release_allocation(conf.stateDir, DeviceRef.from_dict(state["device"]).lock_key, _holder(inv))
            states.remove(key)

    def check(self, inv: Invocation) -> None:
        conf = load_conf(inv)
        if conf.prevResult is None:
            raise CNIError(INVALID_CONFIG, "CHECK: required prevResult missing", "the runtime passes the ADD result as prevResult")
        prev = Result.from_json(conf.prevResult, "prevResult")
        states = StateDir(conf.stateDir)
        state = states.load(states.key(inv.network_name, inv.container_id, inv.ifname))
        if state is None or not state.get("done"):
            raise check_failed(f"no completed attachment {inv.container_id}/{inv.ifname} in {conf.stateDir}")
        if conf.ipam:
            IPAM(conf.ipam.type, inv).check()
        ref = DeviceRef.from_dict(state["device"])
        expected = next((i for i in prev.interfaces if i.name == inv.ifname), None)
        try:
            if not ref.dpdk:
                with links.rtnl_in(inv.netns) as pod:
                    link = links.find_link(pod, inv.ifname)
                    if link is None:
                        raise check_failed(f"{inv.ifname} is missing from {inv.netns}")
                    if expected and expected.mac and link.mac != expected.mac.lower():
                        raise check_failed(f"{inv.ifname} has MAC {link.mac}, expected {expected.mac}")
                    present = set(links.addresses(pod, link.index))
                    for ip in prev.ips:
                        if ip.address not in present:
                            raise check_failed(f"address {ip.address} is missing from {inv.ifname}")
            rdma = state.get("rdma")
            if rdma and rdma.get("moved"):
                from cni.linux import rdma_netlink

                with netns.entered(inv.netns):
                    nl = rdma_netlink.RdmaNetlink()
                with nl:
                    if nl.device_by_name(rdma["device"]) is None:
                        raise check_failed(f"RDMA device {rdma['device']} is not in {inv.netns}")
        except netns.NetnsGone:
            raise check_failed(f"netns {inv.netns} does not exist") from None
        if state.get("vf"):
            from .vf import check_vf_settings

            with links.rtnl_in() as host:
                problem = check_vf_settings(host, ref, state["vf"])
            if problem:
                raise check_failed(problem)

    def gc(self, inv: Invocation) -> None:
        conf = load_conf(inv)
        valid = valid_attachments(inv.config)
        if valid is not None:
            for key, state in StateDir(conf.stateDir).entries():
                if state.get("network") != inv.network_name:
                    continue
                if (state.get("containerID"), state.get("ifname")) in valid:
                    continue
                errors = undo_attachment(state, state.get("netns", ""), conf.stateDir)
                if errors:
                    log.warning("GC of %s: %s", key, "; ".join(e.msg for e in errors))
                    continue
                holder = f"{state['network']}/{state['containerID']}/{state['ifname']}"
                device_lock.release_allocation(conf.stateDir, DeviceRef.from_dict(state["device"]).lock_key, holder)
                StateDir(conf.stateDir).remove(key)
                log.info("GC removed %s", key)
        if conf.ipam:
            IPAM(conf.ipam.type, inv).gc()

    def status(self, inv: Invocation) -> None:
        conf = load_conf(inv)
        if conf.ipam:
            IPAM(conf.ipam.type, inv).status()


def _clear_previous(states: StateDir, key: str) -> None:
    """A finished attachment must be DELed first (SPEC); one an interrupted ADD left behind is
    undone now, so a retried ADD starts from the host as it was."""
    previous = states.load(key)
    if previous is None:
        return
    if previous.get("done"):
        device = (previous.get("original") or {}).get("name") or DeviceRef.from_dict(previous["device"]).describe()
        raise CNIError(INVALID_ENVIRONMENT, f"attachment {previous['containerID']}/{previous['ifname']} of network "
                       f"{previous['network']} already exists (it holds {device})", "DEL the attachment before ADDing it again")
    errors = undo_attachment(previous, previous.get("netns", ""), states.root)
    if errors:
        raise errors[0]
    states.remove(key)


def undo_attachment(state: dict, netns_path: str, state_dir: str) -> list[CNIError]:
    """Put everything an ADD changed back; returns the errors of steps that could not be done."""
    errors: list[CNIError] = []
    ref = DeviceRef.from_dict(state["device"])
    original = state.get("original")
    if original and not ref.dpdk:
        _collect(errors, _netdev_to_host, netns_path, state["ifname"], original)
    rdma = state.get("rdma")
    if rdma and rdma.get("moved") and netns_path:
        _collect(errors, _move_rdma_to_host, rdma["device"], netns_path)
    if state.get("vf"):
        from .vf import restore_vf_settings

        def restore() -> None:
            with links.rtnl_in() as host:
                restore_vf_settings(host, ref, state["vf"])

        _collect(errors, restore)
    return errors


def _netdev_to_host(netns_path: str, ifname: str, original: dict) -> None:
    if netns_path:
        try:
            with _open_pod(netns_path) as pod_fd:
                if move_to_host(pod_fd, ifname, original):
                    return
        except CNIError as exc:
            if exc.code != INVALID_ENVIRONMENT:  # INVALID_ENVIRONMENT: the netns is gone
                raise
    # The pod netns is gone (a physical device came back by itself under its pod name) or the
    # device never left: find it by the alias ADD gave it, or by its original name.
    restore_in_host(original)


def _collect(errors: list, fn, *args) -> None:
    try:
        fn(*args)
    except CNIError as exc:
        errors.append(exc)
    except OSError as exc:
        errors.append(CNIError(100, f"{getattr(fn, '__name__', 'step')}: {exc}", "see the log"))


def _holder(inv: Invocation) -> str:
    return f"{inv.network_name}/{inv.container_id}/{inv.ifname}"


@contextmanager
def _open_pod(path: str) -> Iterator[int]:
    try:
        fd = netns.open_netns(path)
    except netns.NetnsGone:
        raise CNIError(INVALID_ENVIRONMENT, f"CNI_NETNS {path} does not exist", "pass an existing network namespace path") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _select(conf: HostDeviceConf, host) -> DeviceRef:
    fields = {
        "device": conf.device, "hwaddr": conf.hwaddr, "kernelpath": conf.kernelpath,
        "pciBusID": conf.pciBusID, "deviceID": conf.deviceID, "runtimeDeviceID": conf.runtimeConfig.deviceID,
    }

    def netdev_by_mac(mac: str) -> Optional[str]:
        for msg in host.get_links():
            if (msg.get("IFLA_ADDRESS") or "").lower() == mac:
                return msg.get("IFLA_IFNAME")
        return None

    return select_device(fields, netdev_by_mac=netdev_by_mac, root=sysfs.default_root())


def _rdma_device(conf: HostDeviceConf, ref: DeviceRef) -> Optional[str]:
    if conf.rdma == "off":
        return None
    from cni.linux import rdma_netlink

    if ref.device_id:
        devices = sysfs.rdma_devices_for_device_id(ref.device_id, root=sysfs.default_root())
    else:
        devices = sysfs.rdma_devices_for_netdev(ref.netdev, root=sysfs.default_root())
    mode = rdma_netlink.netns_mode() if devices or conf.rdma == "required" else None
    return decide_exclusive(conf.rdma, ref.describe(), devices, mode)


def _move_rdma_into_pod(name: str, pod_fd: int) -> None:
    from cni.linux import rdma_netlink

    try:
        device = rdma_netlink.device_by_name(name)
        if device is None:
            raise CNIError(RDMA_MISMATCH, f"RDMA device {name} is not in the host network namespace",
                           "another pod may hold it; check 'rdma dev' and the state files")
        rdma_netlink.move_device(device.index, pod_fd)
    except OSError as exc:
        hint = ("this RDMA driver cannot change netns (rxe/siw cannot; mlx5, mlx4, irdma and hns can)"
                if exc.errno == errno.EOPNOTSUPP else "see 'rdma system' and 'rdma dev'")
        raise CNIError(RDMA_MISMATCH, f"move RDMA device {name} into the pod: {os.strerror(exc.errno or 0)}", hint) from None


def _move_rdma_to_host(name: str, netns_path: str) -> None:
    """From a socket opened inside the pod (the kernel resolves the index in the socket's netns)."""
    from cni.linux import rdma_netlink

    try:
        with netns.entered(netns_path):
            nl = rdma_netlink.RdmaNetlink()
    except netns.NetnsGone:
        return  # the kernel returns RDMA devices of a dying netns to init_net
    host_fd = netns.current_netns_fd()
    try:
        with nl:
            device = nl.device_by_name(name)
            if device is not None:
                nl.move_device(device.index, host_fd)
    except OSError as exc:
        raise CNIError(RDMA_MISMATCH, f"move RDMA device {name} back to the host: {os.strerror(exc.errno or 0)}",
                       "see 'rdma dev' inside the pod netns") from None
    finally:
        os.close(host_fd)


def _write_device_info(conf: HostDeviceConf, ref: DeviceRef, rdma_device: Optional[str]) -> None:
    """device-info-spec 1.1.0 "pci" file: pci-address, pf-pci-address for a VF, rdma-device when
    one moved with the netdev. Multus may have created it (0444) from the device plugin's file."""
    path = conf.runtimeConfig.CNIDeviceInfoFile
    if not path or not (rdma_device or ref.kind == "pci"):
        return
    from cni.linux import device_info

    device_info.write_rdma_device_info(path, pci_address=ref.device_id if ref.kind == "pci" else None,
                                       rdma_device=rdma_device, pf_pci_address=ref.pf_pci)
