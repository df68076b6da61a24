"""host-device-rdma verbs (cni-contract sections 4-6).

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

DEL and GC undo from the state file alone, and treat "already gone" as done at every step (netns
gone, a leftover plain file at its path, a newer netns at the same path, device or VF/PF gone);
a device a killed call of an earlier version left in its staging netns is sent home first.
They touch the device only while its allocation record carries the state's token (a stale DEL
after the device went to another pod cleans up only its own state and IPAM), and move only the
link that *is* the device (ifindex, kind, permanent MAC, bus device as recorded at ADD), never
whatever the pod named CNI_IFNAME.

Serialisation (device_lock): ADD, DEL and GC of one attachment hold its attachment lock; whoever
touches a device holds its device lock.

State files and allocation records are written by write + rename, without fsync
(rdmanet.cni.linux.state, ``durable=False``): a kill at any instant leaves each file whole, old or new,
and every later call sees it at once through the page cache. Only a power loss or kernel crash
can lose a write or tear a file, and a reboot also undoes everything an ADD did: pod netns die,
devices come up in the host as the boot names them, VFs and their settings, GUIDs and RDMA
devices are set up anew, and a record whose netns is gone is stale (taken over by the next ADD).
So a lost, older or torn state (read as none) leaves a DEL nothing to undo but the IPAM
reservation and the file, which it removes; it never fails with 74.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
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
from .moves import (identify, identity_of, move_into_pod, move_to_host, rescue_from_staging, restore_in_host,
                    strongly_identified)
from .selection import DEVICE_ID_SHOWN, DeviceRef, select_device

if TYPE_CHECKING:
    from .config import HostDeviceConf

log = logging.getLogger("rdmanet.host-device-rdma")
STATE_VERSION = 2  # 2: token, netns_id, netdev intent, identity of the device; 1 is still undone


class HostDeviceRdma:
    interface_plugin = "host-device-rdma"  # never an IPAM (rdmanet.cni.core.nesting)

    def add(self, inv: Invocation) -> Result:
        from .config import effective_mac, load_conf, state_root  # pydantic: the verbs that read the whole config

        conf = load_conf(inv)
        mac = effective_mac(conf, inv)
        netns.refuse_own(inv.netns, inv.env)
        device_info.check_path(conf.runtimeConfig.CNIDeviceInfoFile)
        root = state_root(conf)
        states = StateDir(root, durable=False)
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
        states = StateDir(root, durable=False)
        key = states.key(inv.network_name, inv.container_id, inv.ifname)
        with device_lock.attachment_held(root, _holder(inv)):
            state = states.load(key)
            errors = []
            if state is not None:
                errors += undo_attachment(state, inv.netns or state.get("netns", ""), root)
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
        states = StateDir(root, durable=False)
        state = states.load(states.key(inv.network_name, inv.container_id, inv.ifname))
        if state is None or not state.get("done"):
            raise check_failed(f"no completed attachment {inv.container_id}/{inv.ifname} in {root}")
        if conf.ipam:
            IPAM(conf.ipam.type, inv).check()
        ref = DeviceRef.from_dict(state["device"])
        expected = next((i for i in prev.interfaces if i.name == inv.ifname), None)
        try:
            if not ref.dpdk:
                with netns.opened(inv.netns) as pod_fd, links.rtnl_in_fd(pod_fd) as pod:
                    link = links.find_link(pod, inv.ifname)
                    if link is None:
                        raise check_failed(f"{inv.ifname} is missing from {inv.netns}")
                    if state.get("netdev") and (link.index != state["netdev"].get("pod_index")
                                                or not _is_the_device(link, state, pod_fd)):
                        raise check_failed(f"{inv.ifname} in {inv.netns} is not the device ADD moved there "
                                           f"({state['original']['name']}, ifindex {state['netdev'].get('pod_index')})")
                    if expected and expected.mac and link.mac != expected.mac.lower():
                        raise check_failed(f"{inv.ifname} has MAC {link.mac}, expected {expected.mac}")
                    present = set(links.addresses(pod, link.index))
                    for ip in prev.ips:
                        if ip.address not in present:
                            raise check_failed(f"address {ip.address} is missing from {inv.ifname}")
                    with _open_pod(inv.netns) as pod_fd:
                        rail_routing.check(pod, pod_fd, inv.ifname, link.index, list(prev.ips), conf)
            rdma = state.get("rdma")
            if rdma and rdma.get("moved"):
                from rdmanet.cni.linux import rdma_netlink

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
        if state.get("ib"):
            with links.rtnl_in() as host:
                problem = ib_vf.check(host, ref, state["ib"])
            if problem:
                raise check_failed(problem)

    def gc(self, inv: Invocation) -> None:
        from .config import load_conf, state_root

        conf = load_conf(inv)
        root = state_root(conf)
        states = StateDir(root, durable=False)
        valid = valid_attachments(inv.config)
        if valid is not None:
            for key, listed in states.entries():
                if listed.get("network") != inv.network_name:
                    continue
                if (listed.get("containerID"), listed.get("ifname")) in valid:
                    continue
                holder = f"{listed['network']}/{listed['containerID']}/{listed['ifname']}"
                try:
                    with device_lock.attachment_held(root, holder):
                        state = states.load(key)  # again, under the lock: a DEL may have finished it
                        if state is None:
                            continue
                        errors = undo_attachment(state, state.get("netns", ""), root)
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


class _Add:
    """One ADD's steps; the caller holds the attachment lock and the device lock."""

    def __init__(self, inv: Invocation, conf: HostDeviceConf, mac: Optional[str], states: StateDir, key: str,
                 host, ref: DeviceRef) -> None:
        self.inv, self.conf, self.mac, self.states, self.key, self.host, self.ref = inv, conf, mac, states, key, host, ref
        self.root = states.root
        self.undo = Undo()
        self.state: dict = {}
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
        inv, conf, ref, host = self.inv, self.conf, self.ref, self.host
        step = call_deadline.check
        holder = _holder(inv)
        stale = device_lock.refuse_if_allocated(self.root, ref.lock_key, holder)
        if stale is not None:
            log.info("device %s: the allocation record of %s is stale (its netns %s is gone); taking the device over",
                     ref.lock_key, stale.get("attachment"), stale.get("netns"))
            ref = self.ref = _recover_from_stale(self.states, stale, ref)
        if conf.vf_knobs_set() and ref.vf_index is None:
            raise CNIError(INVALID_CONFIG, f"VF settings given but {ref.describe()} is not an SR-IOV VF",
                           "remove vlan/spoofchk/trust/link_state/tx rates, or select a VF")
        ib_vf.check_keys(ref, conf, inv, self.mac)
        rdma_device = _rdma_device(conf, ref)
        pod_id = netns.identity(inv.netns)
        if pod_id is None:
            raise CNIError(INVALID_ENVIRONMENT, f"CNI_NETNS {inv.netns} is not a network namespace", "pass an existing network namespace path")
        link = None
        if not ref.dpdk:
            link = links.find_link(host, ref.netdev)
            if link is None:
                raise CNIError(INVALID_CONFIG, f"{ref.selector}: device {ref.netdev} is not in the host network namespace",
                               "it may be in another pod, or the name is wrong (see 'ip link')")
        self.state = state = {
            "version": STATE_VERSION, "network": inv.network_name, "containerID": inv.container_id, "ifname": inv.ifname,
            "netns": inv.netns, "netns_id": pod_id, "token": uuid.uuid4().hex, "device": ref.to_dict(), "ipam": bool(conf.ipam)}
        if link is not None:
            state["original"] = {"name": link.name, "mac": link.mac, "mtu": link.mtu, "up": link.up, "alias": link.alias,
                                 "index": link.index, **identity_of(link)}
            if not (rdma_device or ib_vf.is_ib_vf(ref) or (ref.vf_index is not None and (conf.vf_knobs_set() or self.mac))):
                # the netdev's move is the next change to the device: its intent goes with the claim
                # (one state write less; the kernel keeps an ifindex across moves unless taken)
                state["netdev"] = {"pod_index": link.index}
        step("claiming the device")
        self._save()  # the attachment exists from here on (for DEL, GC and a repeat ADD)
        device_lock.record_allocation(self.root, ref.lock_key, holder, inv.netns, pod_id, state["token"])
        self.claimed = True
        result = Result()
        if ref.dpdk:
            result.interfaces = [Interface(name=inv.ifname, sandbox=inv.netns, pci_id=ref.device_id or "")]
        if ref.vf_index is not None and (conf.vf_knobs_set() or self.mac):
            from .vf import apply_vf_settings, plan_vf_settings

            step("applying the VF settings")
            state["vf"] = plan_vf_settings(host, ref, conf, self.mac)
            self._save()
            self.undo.push(f"restore the settings of VF {ref.vf_index}", _restore_vf, ref, state["vf"])
            apply_vf_settings(host, ref, state["vf"])
        if ib_vf.is_ib_vf(ref):
            step("setting the GUIDs of the InfiniBand VF")
            state["ib"] = ib_vf.plan(host, ref, conf, inv)
            self._save()
            self.undo.push(f"restore the GUIDs of VF {ref.vf_index}", _restore_ib, ref, state["ib"],
                           (state.get("original") or {}).get("name"))
            ref = self.ref = ib_vf.apply(host, ref, state["ib"], self._save)
            if link is not None:
                link = _after_rebind(host, ref, state)
                self._save()
            rdma_device = _rdma_device(conf, ref)  # the rebind re-created it
        with _open_pod(inv.netns) as pod_fd:
            if rdma_device:
                # RDMA first: a soft-RoCE device dies when its netdev leaves init_net, and a driver
                # that cannot change netns must fail before anything else moved.
                step(f"moving RDMA device {rdma_device}")
                state["rdma"] = {"device": rdma_device, "moved": True}
                self._save()
                self.undo.push(f"move RDMA device {rdma_device} back to the host", _move_rdma_to_host, rdma_device, inv.netns, pod_id)
                _move_rdma_into_pod(rdma_device, pod_fd)
            if link is not None:
                step(f"moving {link.name} into the pod")
                if "netdev" not in state:
                    # the kernel keeps an ifindex across netns moves unless the target already uses it
                    state["netdev"] = {"pod_index": link.index}
                    self._save()
                self.undo.push(f"return {link.name} to the host", _netdev_to_host, state, inv.netns, self.root)
                moved = move_into_pod(host, link, pod_fd, inv.ifname, mtu=conf.mtu or None, mac=self.mac)
                if moved.index != link.index:
                    state["netdev"]["pod_index"] = moved.index
                    self._save()
                result.interfaces = [Interface(name=inv.ifname, mac=moved.mac, mtu=moved.mtu, sandbox=inv.netns,
                                               pci_id=ref.device_id if ref.kind == "pci" else "")]
            if conf.ipam:
                step("IPAM ADD")
                IPAM(conf.ipam.type, inv).add_into(result, self.undo)
                if link is not None:  # DPDK: the addresses are returned for the workload to use, not configured
                    step("configuring the addresses")
                    self.undo.push(f"remove the policy routing of {inv.ifname}", rail_routing.detach_in, inv.netns, inv.ifname)
                    with links.rtnl_in_fd(pod_fd) as pod:
                        pod_ns.configure(pod, pod_fd, moved.index, inv.ifname, result.ips, result.routes, conf)
        if conf.dns:
            result.dns = DNS.from_json(conf.dns)
        step("writing the device-info file")
        _write_device_info(conf, ref, rdma_device)
        step("finishing")
        state["done"] = True
        self._save()
        self.undo.dismiss()
        log.info("ADD %s: %s -> %s:%s%s", self.key, ref.describe(), inv.netns, inv.ifname,
                 f" with RDMA device {rdma_device}" if rdma_device else "")
        return result

    def _roll_back(self, exc: BaseException) -> None:
        failed = self.undo.run()
        if not self.state:
            return  # nothing was recorded, nothing was done
        if failed:
            self.state["repair"] = failed
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
            device_lock.release_allocation(self.root, self.ref.lock_key, self.state)
        self.states.remove(self.key)


def _recover_from_stale(states: StateDir, stale: dict, ref: DeviceRef) -> DeviceRef:
    """The pod that held the device is gone, its DEL has not come yet, and a physical device
    came back to the host under its pod name (CNI_IFNAME). Before another pod takes it, give it
    back its own name, MAC, MTU and alias from the holder's state, or the new ADD would record
    the pod name as the device's original one (and lose the real name for good). The holder's
    DEL, when it comes, finds the device claimed by another token and leaves it alone."""
    network, _, rest = (stale.get("attachment") or "").partition("/")
    container_id, _, ifname = rest.partition("/")
    previous = states.load(states.key(network, container_id, ifname)) if ifname else None
    if (not previous or previous.get("token") != stale.get("token") or not previous.get("original") or ref.dpdk
            or not ref.device_id):  # a device named by its netdev: its lock and selection follow the name
        return ref
    original = previous["original"]
    try:
        _rescue_from_staging(states.root, previous)
        restored = restore_in_host(original)
    except CNIError as exc:
        log.warning("could not give %s back its name before taking it over: %s", original["name"], exc.msg)
        return ref
    if restored and ref.netdev != original["name"]:
        log.info("%s came back from the gone pod of %s as %s: restored before the takeover", original["name"],
                 stale.get("attachment"), ref.netdev)
        return dataclasses.replace(ref, netdev=original["name"])
    return ref


def _forget_or_keep(states: StateDir, key: str, state: dict, errors: list) -> None:
    """After an undo: forget the attachment, or keep its state marked as needing repair."""
    if not errors:
        states.remove(key)
        return
    state["repair"] = [e.msg for e in errors]
    states.save(key, state)


def _clear_previous(states: StateDir, key: str, conf: HostDeviceConf, inv: Invocation) -> None:
    """A repeat ADD of an attachment ends as one clean ADD. Whatever an earlier ADD of it left
    (finished, interrupted by a kill or a deadline, or with an incomplete rollback) is undone
    first, as its DEL would (the device back in the host as it was, the IPAM reservation
    released), so this ADD starts from the host as it was: the runtime retries an ADD whose answer
    it lost (the call was killed after the attachment was complete), and SPEC lets a plugin treat
    an ADD of an existing attachment as a replacement."""
    previous = states.load(key)
    if previous is None:
        return
    if previous.get("done"):
        log.info("ADD %s: the attachment exists (a repeat ADD): undoing it first", key)
    errors = undo_attachment(previous, previous.get("netns", ""), states.root)
    if not errors and conf.ipam:
        try:
            IPAM(conf.ipam.type, inv).delete()
        except CNIError as exc:
            errors.append(exc)
    _forget_or_keep(states, key, previous, errors)
    if errors:
        raise errors[0]


def undo_attachment(state: dict, netns_path: str, root: str) -> list[CNIError]:
    """Put everything an ADD changed on its device back, under the device lock, if the device is
    still this attachment's (its allocation record carries the state's token); returns the errors
    of steps that could not be done. The claim is dropped once everything is undone."""
    ref = DeviceRef.from_dict(state["device"])
    errors: list[CNIError] = []
    _collect(errors, _policy_routing_off, state, netns_path)
    with device_lock.held(root, ref.lock_key):
        device_lock.remove_partial_writes_of_record(root, ref.lock_key)
        record = device_lock.read_record(root, ref.lock_key)
        if not device_lock.owns(record, state):
            if record is not None:
                log.warning("%s/%s: %s is held by %s now (netns %s): the device is left alone, only this attachment's "
                            "own state and IPAM are cleaned up", state.get("containerID"), state.get("ifname"),
                            ref.describe(), record.get("attachment"), record.get("netns"))
            return errors
        device_errors = _undo_device(state, ref, netns_path, root)
        if not device_errors:
            device_lock.release_allocation(root, ref.lock_key, state)
        return errors + device_errors


def _policy_routing_off(state: dict, netns_path: str) -> None:
    """The attachment's rules and tables in the pod (rdmanet.cni.linux.rail_routing), while the
    pod netns is still the one ADD used."""
    if netns.is_alive(netns_path, state.get("netns_id")):
        rail_routing.detach_in(netns_path, state["ifname"])


def _undo_device(state: dict, ref: DeviceRef, netns_path: str, root: str) -> list[CNIError]:
    errors: list[CNIError] = []
    original = state.get("original")
    # version 1 states recorded no netdev intent: the netdev was moved if it had an original
    if original and not ref.dpdk and ("netdev" in state or state.get("version", 1) < 2):
        _collect(errors, _netdev_to_host, state, netns_path, root)
    rdma = state.get("rdma")
    if rdma and rdma.get("moved") and netns_path:
        _collect(errors, _move_rdma_to_host, rdma["device"], netns_path, state.get("netns_id"))
    if state.get("vf"):
        _collect(errors, _restore_vf, ref, state["vf"])
    if state.get("ib"):
        _collect(errors, _restore_ib, ref, state["ib"], (original or {}).get("name"))
    return errors


def _restore_vf(ref: DeviceRef, saved: dict) -> None:
    from .vf import restore_vf_settings

    with links.rtnl_in() as host:
        restore_vf_settings(host, ref, saved)


def _restore_ib(ref: DeviceRef, record: dict, original_name: Optional[str]) -> None:
    with links.rtnl_in() as host:
        ib_vf.restore(host, ref, record, original_name)


def _after_rebind(host, ref: DeviceRef, state: dict) -> links.Link:
    """The IB VF's netdev as the rebind re-created it (new ifindex, maybe a new name), recorded as
    the device to move and recognise; its IPoIB address follows the GUID, which DEL restores, so
    the address is never set back."""
    link = links.find_link(host, ref.netdev)
    if link is None:
        raise CNIError(LINK_FAILURE, f"{ref.describe()}: netdev {ref.netdev} is not in the host netns after the driver rebind",
                       "see the node's kernel log (dmesg) for the VF's driver")
    state["original"].update(index=link.index, mac="", **identity_of(link))
    return link


def _is_the_device(link: Optional[links.Link], state: dict, pod_fd: Optional[int] = None) -> bool:
    return identify(link, state["original"], pod_fd)


def _find_in_pod(pod, pod_fd: int, state: dict) -> Optional[links.Link]:
    """The device ADD moved, in the pod: at its recorded ifindex if that link is it, else (a
    physical device the pod moved away and back) by its permanent MAC / bus device. A version 1
    state (no ifindex recorded) falls back to CNI_IFNAME with the alias ADD set."""
    original = state["original"]
    index = (state.get("netdev") or {}).get("pod_index")
    if index is None:
        link = links.find_link(pod, state["ifname"])
        return link if link is not None and link.alias == original["name"] else None
    link = links.link_by_index(pod, index)
    if _is_the_device(link, state, pod_fd):
        return link
    if strongly_identified(original):
        return next((l for l in map(links.Link.from_msg, pod.get_links()) if _is_the_device(l, state)), None)
    return None


def staging_path(root: str, state: dict) -> str:
    """Where an earlier version let the attachment's device wait between two netns while it moved
    (moves.py): derived from the attachment, under the node's state dir."""
    attachment = f"{state['network']}/{state['containerID']}/{state['ifname']}"
    directory = roots.ensure_dir(os.path.join(root, "netns"), key="staging netns directory")
    return os.path.join(directory, "staging-" + hashlib.sha256(attachment.encode()).hexdigest()[:24])


def _rescue_from_staging(root: str, state: dict) -> None:
    """An ADD of an earlier version recorded a staging netns (``netdev.staging``): its ADD or DEL,
    killed while the device waited there, left it in that netns."""
    netdev = state.get("netdev") or {}
    if "staging" in netdev:
        rescue_from_staging(staging_path(root, state), state["original"], netdev.get("pod_index"))


def _netdev_to_host(state: dict, netns_path: str, root: str) -> None:
    original = state["original"]
    _rescue_from_staging(root, state)
    if netns.is_alive(netns_path, state.get("netns_id")):
        try:
            with _open_pod(netns_path) as pod_fd:
                with links.rtnl_in_fd(pod_fd) as pod:
                    link = _find_in_pod(pod, pod_fd, state)
                    index = (state.get("netdev") or {}).get("pod_index")
                    found = None if link is not None else (links.find_link(pod, state["ifname"])
                                                           or (links.link_by_index(pod, index) if index else None))
                if link is not None:
                    move_to_host(pod_fd, link, original)
                    return
                if found is not None:
                    log.warning("DEL %s/%s: %s (%s, ifindex %d) in %s is not the device ADD moved there (%s, "
                                "ifindex %s: %s): it is left in the pod and nothing of the host's is touched",
                                state.get("containerID"), state["ifname"], found.name, found.kind or "link", found.index,
                                netns_path, original["name"], index, _identity_text(original))
        except CNIError as exc:
            if exc.code != INVALID_ENVIRONMENT:  # INVALID_ENVIRONMENT: the netns went away meanwhile
                raise
    # The pod netns is gone (a physical device came back by itself under its pod name), the
    # device never left, or the pod no longer has it: look for it in the host.
    if not restore_in_host(original):
        log.info("%s: the device is neither in the pod nor in the host (a virtual device dies with its netns): "
                 "nothing to restore", original["name"])


def _identity_text(original: dict) -> str:
    """What DEL recognises the device by (moves.identify), for the log."""
    if strongly_identified(original):
        return f"permanent MAC {original.get('perm_mac') or '-'}, bus device {original.get('parent_dev') or '-'}"
    if "peer_index" in original:
        where = "the host" if original.get("peer_nsid") is None else f"the netns of id {original['peer_nsid']}"
        return f"a veth whose peer is ifindex {original['peer_index']} in {where}"
    return f"a {original.get('kind') or 'virtual'} device with nothing a pod could not forge"


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
