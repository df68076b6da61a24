"""host-device-rdma's verbs: ADD, DEL, CHECK, GC and STATUS.

ADD, as steps, each with its undo registered (and its intent saved in the state file) *before*
the act, so a failure, a timeout, a caller that hung up or a crash at any step leaves a state a
rollback, a later DEL or a repeat ADD can undo from:
  select the device -> lock it -> refuse it if a live pod holds it -> decide the RDMA move ->
  save the state and claim the device (allocation record with this ADD's token) -> apply VF
  settings through the PF -> InfiniBand VF: node and port GUID through the PF, then a driver
  rebind (ib_vf.py) -> move the RDMA device (exclusive mode) -> move the netdev into the pod,
  named CNI_IFNAME with the original name as alias, in one request (moves.py) -> IPAM ->
  device-info file -> save the state (done).
Between steps ADD stops when its deadline passed or its caller went away (rdmanet.cni.core.deadline) and
undoes what it did. A rollback that could not undo everything keeps the state file, marked
``repair``, and the claim on the device: a later DEL (or repeat ADD, or GC) tries again.

A repeat ADD of the attachment (the runtime lost the answer of a killed call) first undoes
whatever the earlier one left, finished or not, as DEL would, and then ADDs: one clean ADD.

DEL and GC undo from the state file alone (attachment_state.py), and treat "already gone" as
done at every step (netns gone, a leftover plain file at its path, a newer netns at the same
path, device or VF/PF gone). They touch the device only while its allocation record carries the
state's token (a stale DEL after the device went to another pod cleans up only its own state and
IPAM), and move only the link that *is* the device (ifindex, kind, permanent MAC, bus device as
recorded at ADD), never whatever the pod named CNI_IFNAME.

Serialisation (device_lock): ADD, DEL and GC of one attachment hold its attachment lock; whoever
touches a device holds its device lock.

State files and allocation records are written by write + rename, without fsync
(rdmanet.cni.linux.state, ``durable=False``): a kill at any instant leaves each file whole, old or new,
and every later call sees it at once through the page cache. Only a power loss or kernel crash
can lose a write or tear a file, and a reboot also undoes everything an ADD did: pod netns die,
devices come up in the host as the boot names them, VFs and their settings, GUIDs and RDMA
devices are set up anew, and a record whose netns is gone is stale (taken over by the next ADD).
So a lost or torn state, like one of another version (read as none), leaves a DEL nothing to
undo but the IPAM reservation and the file, which it removes; it never fails with CNI error 5.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Optional

from rdmanet.cni.core import deadline as call_deadline
from rdmanet.cni.core.errors import (
    INVALID_CONFIG,
    INVALID_ENVIRONMENT,
    LINK_FAILURE,
    RDMA_MISMATCH,
    CNIError,
    check_failed,
)
from rdmanet.cni.core.gc import valid_attachments
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.ipam_exec import IPAM
from rdmanet.cni.core.rdma_policy import decide_exclusive
from rdmanet.cni.core.result import DNS, Interface, Result
from rdmanet.cni.core.rollback import Undo
from rdmanet.cni.linux import device_info, links, netns, rail_routing, roots, sysfs
from rdmanet.cni.linux import pod as pod_ns
from rdmanet.cni.linux import device_policy
from rdmanet.cni.linux.state import StateDir

from . import device_lock, ib_vf, state_dir
from .attachment_state import AttachmentState, IbRecord, Original, VfRecord, identity_of
from .moves import identify, move_into_pod, move_to_host, restore_in_host
from .selection import DEVICE_ID_SHOWN, DeviceRef, select_device

if TYPE_CHECKING:
    from .config import HostDeviceConf

log = logging.getLogger("rdmanet.host-device-rdma")


def _states(root: str) -> StateDir[AttachmentState]:
    return StateDir(root, AttachmentState, durable=False)


class HostDeviceRdma:
    interface_plugin = "host-device-rdma"  # never an IPAM (rdmanet.cni.core.nesting)

    def add(self, inv: Invocation) -> Result:
        from .config import effective_mac, load_conf, state_root  # pydantic: the verbs that read the whole config

        conf = load_conf(inv)
        mac = effective_mac(conf, inv)
        netns.refuse_own(inv.netns, inv.env)
        device_info.check_path(conf.runtimeConfig.CNIDeviceInfoFile)
        root = state_root(conf)
        states = _states(root)
        key = states.key(inv.network_name, inv.container_id, inv.ifname)
        with device_lock.attachment_held(root, _holder(inv)):
            # An ADD whose caller went away while it waited (its shim was killed) must not undo
            # what a later ADD of the runtime, served first, has built: it stops here.
            call_deadline.check("looking at the attachment's earlier ADD")
            _clear_previous(states, key, conf, inv)
            call_deadline.check("selecting the device")
            with links.rtnl_in() as host:
                ref = _select(conf, host)
                with device_lock.held(root, ref.lock_key):
                    return _Add(inv, conf, mac, states, key, host, ref).run()

    def delete(self, inv: Invocation) -> None:
        root = state_dir.for_delete(inv.config)  # DEL reads the state it recorded, not the config's models
        ipam = IPAM.of(inv)
        states = _states(root)
        key = states.key(inv.network_name, inv.container_id, inv.ifname)
        with device_lock.attachment_held(root, _holder(inv)):
            state = states.load(key)
            errors = []
            if state is not None:
                errors += undo_attachment(state, inv.netns or state.netns, root)
            if ipam is not None:
                try:
                    ipam.delete()
                except CNIError as exc:
                    errors.append(exc)
            if state is not None:
                _forget_or_keep(states, key, state, errors)
            else:
                states.remove(key)  # the temp file of a first save a kill cut short
            if errors:
                raise errors[0]

    def check(self, inv: Invocation) -> None:
        from .config import load_conf, state_root

        conf = load_conf(inv)
        if conf.prevResult is None:
            raise CNIError(INVALID_CONFIG, "CHECK: required prevResult missing", "the runtime passes the ADD result as prevResult")
        prev = Result.from_json(conf.prevResult, "prevResult")
        root = state_root(conf)
        states = _states(root)
        state = states.load(states.key(inv.network_name, inv.container_id, inv.ifname))
        if state is None or not state.done:
            raise check_failed(f"no completed attachment {inv.container_id}/{inv.ifname} in {root}")
        if conf.ipam:
            IPAM(conf.ipam.type, inv).check()
        try:
            if not state.device.dpdk:
                _check_netdev_in_pod(inv, conf, prev, state)
            if state.rdma_device is not None:
                _check_rdma_in_pod(inv.netns, state.rdma_device)
        except netns.NetnsGone:
            raise check_failed(f"netns {inv.netns} does not exist") from None
        _check_vf(state)

    def gc(self, inv: Invocation) -> None:
        from .config import load_conf, state_root

        conf = load_conf(inv)
        root = state_root(conf)
        states = _states(root)
        valid = valid_attachments(inv.config)
        if valid is not None:
            for key, listed in states.entries():
                if listed.network != inv.network_name:
                    continue
                if (listed.container_id, listed.ifname) in valid:
                    continue
                try:
                    with device_lock.attachment_held(root, listed.attachment):
                        state = states.load(key)  # again, under the lock: a DEL may have finished it
                        if state is None:
                            continue
                        errors = undo_attachment(state, state.netns, root)
                        _forget_or_keep(states, key, state, errors)
                except CNIError as exc:
                    errors = [exc]
                if errors:
                    log.warning("GC of %s: %s", key, "; ".join(e.msg for e in errors))
                else:
                    log.info("GC removed %s", key)
        if conf.ipam:
            IPAM(conf.ipam.type, inv).gc()

    def status(self, inv: Invocation) -> None:
        from .config import load_conf

        conf = load_conf(inv)
        if conf.ipam:
            IPAM(conf.ipam.type, inv).status()


def _check_netdev_in_pod(inv: Invocation, conf: HostDeviceConf, prev: Result, state: AttachmentState) -> None:
    """CHECK in the pod: the device is there as CNI_IFNAME (the one ADD moved), with the MAC,
    addresses and policy routing of the ADD's result."""
    expected = next((i for i in prev.interfaces if i.name == inv.ifname), None)
    with netns.opened(inv.netns) as pod_fd, links.rtnl_in_fd(pod_fd) as pod:
        link = links.find_link(pod, inv.ifname)
        if link is None:
            raise check_failed(f"{inv.ifname} is missing from {inv.netns}")
        if state.moves_netdev and (link.index != state.pod_index or not _is_the_device(link, state, pod_fd)):
            raise check_failed(f"{inv.ifname} in {inv.netns} is not the device ADD moved there "
                               f"({state.original.name}, ifindex {state.pod_index})")
        if expected and expected.mac and link.mac != expected.mac.lower():
            raise check_failed(f"{inv.ifname} has MAC {link.mac}, expected {expected.mac}")
        present = set(links.addresses(pod, link.index))
        for ip in prev.ips:
            if ip.address not in present:
                raise check_failed(f"address {ip.address} is missing from {inv.ifname}")
        with _open_pod(inv.netns) as pod_fd:
            rail_routing.check(pod, pod_fd, inv.ifname, link.index, list(prev.ips), conf)


def _check_rdma_in_pod(netns_path: str, device: str) -> None:
    from rdmanet.cni.linux import rdma_netlink

    with netns.entered(netns_path):
        nl = rdma_netlink.RdmaNetlink()
    with nl:
        if nl.device_by_name(device) is None:
            raise check_failed(f"RDMA device {device} is not in {netns_path}")


def _check_vf(state: AttachmentState) -> None:
    """CHECK through the PF: the VF still has the settings and the GUIDs ADD set."""
    if state.vf is not None:
        from .vf import check_vf_settings

        with links.rtnl_in() as host:
            problem = check_vf_settings(host, state.device, state.vf)
        if problem:
            raise check_failed(problem)
    if state.ib is not None:
        with links.rtnl_in() as host:
            problem = ib_vf.check(host, state.device, state.ib)
        if problem:
            raise check_failed(problem)


class _Add:
    """One ADD's steps; the caller holds the attachment lock and the device lock."""

    def __init__(self, inv: Invocation, conf: HostDeviceConf, mac: Optional[str], states: StateDir[AttachmentState],
                 key: str, host, ref: DeviceRef) -> None:
        self.inv, self.conf, self.mac, self.states, self.key, self.host, self.ref = inv, conf, mac, states, key, host, ref
        self.root = states.root
        self.undo = Undo()
        self.state: Optional[AttachmentState] = None
        self.claimed = False

    def run(self) -> Result:
        try:
            return self._steps()
        except BaseException as exc:
            self._roll_back(exc)
            raise

    def _save(self) -> None:
        self.states.save(self.key, self.state)

    def _steps(self) -> Result:
        inv, conf, step = self.inv, self.conf, call_deadline.check
        self._take_over_if_stale()
        self._refuse_keys_that_do_not_apply()
        rdma_device = _rdma_device(conf, self.ref)
        pod_id = netns.identity(inv.netns)
        if pod_id is None:
            raise CNIError(INVALID_ENVIRONMENT, f"CNI_NETNS {inv.netns} is not a network namespace", "pass an existing network namespace path")
        link = self._host_link()
        step("claiming the device")
        self._claim(link, pod_id, rdma_device)
        result = Result()
        if self.ref.dpdk:
            result.interfaces = [Interface(name=inv.ifname, sandbox=inv.netns, pci_id=self.ref.device_id or "")]
        if self._sets_vf():
            step("applying the VF settings")
            self._apply_vf_settings()
        if ib_vf.is_ib_vf(self.ref):
            step("setting the GUIDs of the InfiniBand VF")
            link = self._set_ib_guids(link)
            rdma_device = _rdma_device(conf, self.ref)  # the rebind re-created it
        with _open_pod(inv.netns) as pod_fd:
            if rdma_device:
                # RDMA first: a soft-RoCE device dies when its netdev leaves init_net, and a driver
                # that cannot change netns must fail before anything else moved.
                step(f"moving RDMA device {rdma_device}")
                self._move_rdma(rdma_device, pod_fd, pod_id)
            moved = None
            if link is not None:
                step(f"moving {link.name} into the pod")
                moved = self._move_netdev(link, pod_fd)
                result.interfaces = [Interface(name=inv.ifname, mac=moved.mac, mtu=moved.mtu, sandbox=inv.netns,
                                               pci_id=self.ref.device_id if self.ref.kind == "pci" else "")]
            if conf.ipam:
                step("IPAM ADD")
                self._ipam(result, pod_fd, moved)
        if conf.dns:
            result.dns = DNS.from_json(conf.dns)
        step("writing the device-info file")
        _write_device_info(conf, self.ref, rdma_device)
        step("finishing")
        self.state.done = True
        self._save()
        self.undo.dismiss()
        log.info("ADD %s: %s -> %s:%s%s", self.key, self.ref.describe(), inv.netns, inv.ifname,
                 f" with RDMA device {rdma_device}" if rdma_device else "")
        return result

    def _take_over_if_stale(self) -> None:
        """Refuse the device while another live attachment holds it (106); a record whose netns
        is gone is stale, and the device is taken over."""
        stale = device_lock.refuse_if_allocated(self.root, self.ref.lock_key, _holder(self.inv))
        if stale is not None:
            log.info("device %s: the allocation record of %s is stale (its netns %s is gone); taking the device over",
                     self.ref.lock_key, stale.get("attachment"), stale.get("netns"))
            self.ref = _recover_from_stale(self.states, stale, self.ref)

    def _refuse_keys_that_do_not_apply(self) -> None:
        if self.conf.vf_knobs_set() and self.ref.vf_index is None:
            raise CNIError(INVALID_CONFIG, f"VF settings given but {self.ref.describe()} is not an SR-IOV VF",
                           "remove vlan/spoofchk/trust/link_state/tx rates, or select a VF")
        ib_vf.check_keys(self.ref, self.conf, self.inv, self.mac)

    def _host_link(self) -> Optional[links.Link]:
        """The device's netdev in the host (None in DPDK mode)."""
        if self.ref.dpdk:
            return None
        link = links.find_link(self.host, self.ref.netdev)
        if link is None:
            raise CNIError(INVALID_CONFIG, f"{self.ref.selector}: device {self.ref.netdev} is not in the host network namespace",
                           "it may be in another pod, or the name is wrong (see 'ip link')")
        return link

    def _sets_vf(self) -> bool:
        return self.ref.vf_index is not None and bool(self.conf.vf_knobs_set() or self.mac)

    def _claim(self, link: Optional[links.Link], pod_id: dict, rdma_device: Optional[str]) -> None:
        """Save the attachment's state and claim the device for this ADD's token: the attachment
        exists from here on (for DEL, GC and a repeat ADD)."""
        inv, ref = self.inv, self.ref
        self.state = state = AttachmentState(network=inv.network_name, container_id=inv.container_id, ifname=inv.ifname,
                                             netns=inv.netns, netns_id=pod_id, token=uuid.uuid4().hex, device=ref,
                                             ipam=bool(self.conf.ipam))
        if link is not None:
            state.original = Original.of_link(link)
            if not (rdma_device or ib_vf.is_ib_vf(ref) or self._sets_vf()):
                # the netdev's move is the next change to the device: its intent goes with the claim
                # (one state write less; the kernel keeps an ifindex across moves unless taken)
                state.pod_index = link.index
        self._save()
        device_lock.record_allocation(self.root, ref.lock_key, _holder(inv), inv.netns, pod_id, state.token)
        self.claimed = True

    def _apply_vf_settings(self) -> None:
        from .vf import apply_vf_settings, plan_vf_settings

        ref = self.ref
        self.state.vf = plan_vf_settings(self.host, ref, self.conf, self.mac)
        self._save()
        self.undo.push(f"restore the settings of VF {ref.vf_index}", _restore_vf, ref, self.state.vf)
        apply_vf_settings(self.host, ref, self.state.vf)

    def _set_ib_guids(self, link: Optional[links.Link]) -> Optional[links.Link]:
        """Node and port GUID through the PF, then the driver rebind; the VF's netdev as the
        rebind re-created it."""
        state, ref = self.state, self.ref
        state.ib = ib_vf.plan(self.host, ref, self.conf, self.inv)
        self._save()
        self.undo.push(f"restore the GUIDs of VF {ref.vf_index}", _restore_ib, ref, state.ib,
                       state.original.name if state.original else None)
        ref = self.ref = ib_vf.apply(self.host, ref, state.ib, self._save)
        if link is None:
            return None
        link = _after_rebind(self.host, ref, state)
        self._save()
        return link

    def _move_rdma(self, rdma_device: str, pod_fd: int, pod_id: dict) -> None:
        self.state.rdma_device = rdma_device
        self._save()
        self.undo.push(f"move RDMA device {rdma_device} back to the host", _move_rdma_to_host, rdma_device, self.inv.netns, pod_id)
        _move_rdma_into_pod(rdma_device, pod_fd)

    def _move_netdev(self, link: links.Link, pod_fd: int) -> links.Link:
        state = self.state
        if not state.moves_netdev:
            # the kernel keeps an ifindex across netns moves unless the target already uses it
            state.pod_index = link.index
            self._save()
        self.undo.push(f"return {link.name} to the host", _netdev_to_host, state, self.inv.netns)
        moved = move_into_pod(self.host, link, pod_fd, self.inv.ifname, mtu=self.conf.mtu or None, mac=self.mac)
        if moved.index != link.index:
            state.pod_index = moved.index
            self._save()
        return moved

    def _ipam(self, result: Result, pod_fd: int, moved: Optional[links.Link]) -> None:
        """IPAM ADD; the addresses and routes on the moved netdev (DPDK: the addresses are
        returned for the workload to use, not configured)."""
        inv = self.inv
        IPAM(self.conf.ipam.type, inv).add_into(result, self.undo)
        if moved is not None:
            call_deadline.check("configuring the addresses")
            self.undo.push(f"remove the policy routing of {inv.ifname}", rail_routing.detach_in, inv.netns, inv.ifname)
            with links.rtnl_in_fd(pod_fd) as pod:
                pod_ns.configure(pod, pod_fd, moved.index, inv.ifname, result.ips, result.routes, self.conf)

    def _roll_back(self, exc: BaseException) -> None:
        failed = self.undo.run()
        if self.state is None:
            return  # nothing was recorded, nothing was done
        if failed:
            self.state.repair = failed
            try:
                self._save()
            except CNIError as save_exc:
                log.error("could not mark %s as needing repair: %s", self.key, save_exc.msg)
            note = (f"; the rollback could not undo everything ({'; '.join(failed)}): the state file "
                    f"{os.path.join(self.root, self.key)} is kept, a DEL of the attachment retries it")
            if isinstance(exc, CNIError):
                exc.details = (exc.details or "") + note
            log.error("ADD %s failed and its rollback is incomplete%s", self.key, note)
            return
        if self.claimed:
            device_lock.release_allocation(self.root, self.ref.lock_key, self.state.token)
        self.states.remove(self.key)


def _recover_from_stale(states: StateDir[AttachmentState], stale: dict, ref: DeviceRef) -> DeviceRef:
    """The pod that held the device is gone, its DEL has not come yet, and a physical device
    came back to the host under its pod name (CNI_IFNAME). Before another pod takes it, give it
    back its own name, MAC, MTU and alias from the holder's state, or the new ADD would record
    the pod name as the device's original one (and lose the real name for good). The holder's
    DEL, when it comes, finds the device claimed by another token and leaves it alone."""
    network, _, rest = (stale.get("attachment") or "").partition("/")
    container_id, _, ifname = rest.partition("/")
    previous = states.load(states.key(network, container_id, ifname)) if ifname else None
    if (previous is None or previous.token != stale.get("token") or previous.original is None or ref.dpdk
            or not ref.device_id):  # a device named by its netdev: its lock and selection follow the name
        return ref
    original = previous.original
    try:
        restored = restore_in_host(original)
    except CNIError as exc:
        log.warning("could not give %s back its name before taking it over: %s", original.name, exc.msg)
        return ref
    if restored and ref.netdev != original.name:
        log.info("%s came back from the gone pod of %s as %s: restored before the takeover", original.name,
                 stale.get("attachment"), ref.netdev)
        return dataclasses.replace(ref, netdev=original.name)
    return ref


def _forget_or_keep(states: StateDir[AttachmentState], key: str, state: AttachmentState, errors: list) -> None:
    """After an undo: forget the attachment, or keep its state marked as needing repair."""
    if not errors:
        states.remove(key)
        return
    state.repair = [e.msg for e in errors]
    states.save(key, state)


def _clear_previous(states: StateDir[AttachmentState], key: str, conf: HostDeviceConf, inv: Invocation) -> None:
    """A repeat ADD of an attachment ends as one clean ADD. Whatever an earlier ADD of it left
    (finished, interrupted by a kill or a deadline, or with an incomplete rollback) is undone
    first, as its DEL would (the device back in the host as it was, the IPAM reservation
    released), so this ADD starts from the host as it was: the runtime retries an ADD whose answer
    it lost (the call was killed after the attachment was complete), and the CNI spec lets a
    plugin treat an ADD of an existing attachment as a replacement."""
    previous = states.load(key)
    if previous is None:
        return
    if previous.done:
        log.info("ADD %s: the attachment exists (a repeat ADD): undoing it first", key)
    errors = undo_attachment(previous, previous.netns, states.root)
    if not errors and conf.ipam:
        try:
            IPAM(conf.ipam.type, inv).delete()
        except CNIError as exc:
            errors.append(exc)
    _forget_or_keep(states, key, previous, errors)
    if errors:
        raise errors[0]


def undo_attachment(state: AttachmentState, netns_path: str, root: str) -> list[CNIError]:
    """Put everything an ADD changed on its device back, under the device lock, if the device is
    still this attachment's (its allocation record carries the state's token); returns the errors
    of steps that could not be done. The claim is dropped once everything is undone."""
    ref = state.device
    errors: list[CNIError] = []
    _collect(errors, _policy_routing_off, state, netns_path)
    with device_lock.held(root, ref.lock_key):
        device_lock.remove_partial_writes_of_record(root, ref.lock_key)
        record = device_lock.read_record(root, ref.lock_key)
        if not device_lock.owns(record, state.token):
            if record is not None:
                log.warning("%s/%s: %s is held by %s now (netns %s): the device is left alone, only this attachment's "
                            "own state and IPAM are cleaned up", state.container_id, state.ifname,
                            ref.describe(), record.get("attachment"), record.get("netns"))
            return errors
        device_errors = _undo_device(state, netns_path)
        if not device_errors:
            device_lock.release_allocation(root, ref.lock_key, state.token)
        return errors + device_errors


def _policy_routing_off(state: AttachmentState, netns_path: str) -> None:
    """The attachment's rules and tables in the pod (rdmanet.cni.linux.rail_routing), while the
    pod netns is still the one ADD used."""
    if netns.is_alive(netns_path, state.netns_id):
        rail_routing.detach_in(netns_path, state.ifname)


def _undo_device(state: AttachmentState, netns_path: str) -> list[CNIError]:
    errors: list[CNIError] = []
    ref = state.device
    if state.original is not None and not ref.dpdk and state.moves_netdev:
        _collect(errors, _netdev_to_host, state, netns_path)
    if state.rdma_device is not None and netns_path:
        _collect(errors, _move_rdma_to_host, state.rdma_device, netns_path, state.netns_id)
    if state.vf is not None:
        _collect(errors, _restore_vf, ref, state.vf)
    if state.ib is not None:
        _collect(errors, _restore_ib, ref, state.ib, state.original.name if state.original else None)
    return errors


def _restore_vf(ref: DeviceRef, saved: VfRecord) -> None:
    from .vf import restore_vf_settings

    with links.rtnl_in() as host:
        restore_vf_settings(host, ref, saved)


def _restore_ib(ref: DeviceRef, record: IbRecord, original_name: Optional[str]) -> None:
    with links.rtnl_in() as host:
        ib_vf.restore(host, ref, record, original_name)


def _after_rebind(host, ref: DeviceRef, state: AttachmentState) -> links.Link:
    """The IB VF's netdev as the rebind re-created it (new ifindex, maybe a new name), recorded as
    the device to move and recognise; its IPoIB address follows the GUID, which DEL restores, so
    the address is never set back."""
    link = links.find_link(host, ref.netdev)
    if link is None:
        raise CNIError(LINK_FAILURE, f"{ref.describe()}: netdev {ref.netdev} is not in the host netns after the driver rebind",
                       "see the node's kernel log (dmesg) for the VF's driver")
    state.original = dataclasses.replace(state.original, index=link.index, mac="", **identity_of(link))
    return link


def _is_the_device(link: Optional[links.Link], state: AttachmentState, pod_fd: Optional[int] = None) -> bool:
    return identify(link, state.original, pod_fd)


def _find_in_pod(pod, pod_fd: int, state: AttachmentState) -> Optional[links.Link]:
    """The device ADD moved, in the pod: at its recorded ifindex if that link is it, else (a
    physical device the pod moved away and back) by its permanent MAC / bus device."""
    link = links.link_by_index(pod, state.pod_index)
    if _is_the_device(link, state, pod_fd):
        return link
    if state.original.strongly_identified:
        return next((l for l in map(links.Link.from_msg, pod.get_links()) if _is_the_device(l, state)), None)
    return None


def _netdev_to_host(state: AttachmentState, netns_path: str) -> None:
    original = state.original
    if netns.is_alive(netns_path, state.netns_id):
        try:
            with _open_pod(netns_path) as pod_fd:
                with links.rtnl_in_fd(pod_fd) as pod:
                    link = _find_in_pod(pod, pod_fd, state)
                    index = state.pod_index
                    found = None if link is not None else (links.find_link(pod, state.ifname)
                                                           or (links.link_by_index(pod, index) if index else None))
                if link is not None:
                    move_to_host(pod_fd, link, original)
                    return
                if found is not None:
                    log.warning("DEL %s/%s: %s (%s, ifindex %d) in %s is not the device ADD moved there (%s, "
                                "ifindex %s: %s): it is left in the pod and nothing of the host's is touched",
                                state.container_id, state.ifname, found.name, found.kind or "link", found.index,
                                netns_path, original.name, index, _identity_text(original))
        except CNIError as exc:
            if exc.code != INVALID_ENVIRONMENT:  # INVALID_ENVIRONMENT: the netns went away meanwhile
                raise
    # The pod netns is gone (a physical device came back by itself under its pod name), the
    # device never left, or the pod no longer has it: look for it in the host.
    if not restore_in_host(original):
        log.info("%s: the device is neither in the pod nor in the host (a virtual device dies with its netns): "
                 "nothing to restore", original.name)


def _identity_text(original: Original) -> str:
    """What DEL recognises the device by (moves.identify), for the log."""
    if original.strongly_identified:
        return f"permanent MAC {original.perm_mac or '-'}, bus device {original.parent_dev or '-'}"
    if original.peer_index is not None:
        where = "the host" if original.peer_nsid is None else f"the netns of id {original.peer_nsid}"
        return f"a veth whose peer is ifindex {original.peer_index} in {where}"
    return f"a {original.kind or 'virtual'} device with nothing a pod could not forge"


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

    ref = select_device(fields, netdev_by_mac=netdev_by_mac, root=sysfs.default_root())
    _check_allowed(ref, host)
    return ref


def _check_allowed(ref: DeviceRef, host) -> None:
    """The node policy lets a network config move this device, and the host does not use it
    (rdmanet.cni.linux.device_policy); else CNI error 7 naming the key and the policy setting."""
    root = sysfs.default_root()
    dev = device_policy.device(ref.netdev, ref.device_id if ref.kind == "pci" else None, root)
    link = links.find_link(host, ref.netdev) if ref.netdev else None
    in_use = device_policy.host_uses(host, link.index, link.name, root) if link is not None else []
    device_policy.check_host_device(roots.current(), ref.selector, dev, ref.selector in DEVICE_ID_SHOWN, in_use)


def _rdma_device(conf: HostDeviceConf, ref: DeviceRef) -> Optional[str]:
    if conf.rdma == "off":
        return None
    if ref.device_id:
        devices = sysfs.rdma_devices_for_device_id(ref.device_id, root=sysfs.default_root())
    else:
        devices = sysfs.rdma_devices_for_netdev(ref.netdev, root=sysfs.default_root())
    mode = None
    if devices or conf.rdma == "required":
        from rdmanet.cni.linux import rdma_netlink  # only with a device to ask about

        mode = rdma_netlink.netns_mode()
    return decide_exclusive(conf.rdma, ref.describe(), devices, mode)


def _move_rdma_into_pod(name: str, pod_fd: int) -> None:
    from rdmanet.cni.linux import rdma_netlink

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


def _move_rdma_to_host(name: str, netns_path: str, netns_id: Optional[dict] = None) -> None:
    """From a socket opened inside the pod (the kernel resolves the index in the socket's netns).
    A pod netns that is gone (or is no longer the one recorded at ADD) has nothing to give back:
    the kernel returns the RDMA devices of a dying netns to init_net."""
    from rdmanet.cni.linux import rdma_netlink

    if not netns.is_alive(netns_path, netns_id):
        return
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
    device_info.write_rdma_device_info(path, pci_address=ref.device_id if ref.kind == "pci" else None,
                                       rdma_device=rdma_device, pf_pci_address=ref.pf_pci)
