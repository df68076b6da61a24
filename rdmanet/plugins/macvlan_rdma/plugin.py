"""macvlan-rdma verbs, as short steps over rdmanet.cni.core and rdmanet.cni.linux (the keys and verbs of
containernetworking/plugins' plugins/main/macvlan, plus RDMA).

ADD: check RDMA policy, resolve the master, remove what a killed ADD of the same attachment
left, create the macvlan inside the pod netns under a temporary name derived from the
attachment, let IPAM allocate, replace a finished link of the same attachment (a repeat ADD),
mark and rename the new one in one request, configure addresses and routes, write the
device-info file, mark the link done. Every step is undone if a later one fails. DEL releases IPAM
first and then deletes the link under CNI_IFNAME and the temporary name; a netns or link that is
already gone is success. A kill at any instant therefore leaves only states a later DEL or
repeat ADD recognises (rdmanet.cni.linux.attachment_link).
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import ExitStack
from typing import TYPE_CHECKING, Optional

from rdmanet.cni.core.errors import (
    INVALID_CONFIG,
    INVALID_ENVIRONMENT,
    NOT_AVAILABLE,
    CNIError,
    check_failed,
)
from rdmanet.cni.core import deadline as call_deadline
from rdmanet.cni.core.check import previous
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.ipam_exec import IPAM
from rdmanet.cni.core.result import DNS, Interface, Result
from rdmanet.cni.core.rollback import quietly
from rdmanet.cni.linux import (attachment_link, attachment_lock, device_info, link_delete, links, netns, rail_routing,
                               shared_rdma, sysfs)
from rdmanet.cni.linux import device_policy
from rdmanet.cni.linux import pod as pod_ns
from rdmanet.cni.linux.links import Link, LinkBasics
from rdmanet.cni.linux.pod import check_addresses, check_routes

if TYPE_CHECKING:
    from .config import MacvlanConf

log = logging.getLogger("rdmanet.macvlan-rdma")


class MacvlanRdma:
    interface_plugin = "macvlan-rdma"  # never an IPAM (rdmanet.cni.core.nesting)

    @attachment_lock.serialised
    def add(self, inv: Invocation) -> Result:
        from .config import effective_mac, load_conf  # pydantic: only the verbs that read the whole config

        conf = load_conf(inv)
        mac = effective_mac(conf, inv)
        netns.refuse_own(inv.netns, inv.env)
        device_info.check_path(conf.runtimeConfig.CNIDeviceInfoFile)
        with ExitStack() as stack:
            host = stack.enter_context(links.rtnl_in())
            pod = stack.enter_context(pod_ns.rtnl(inv.netns))
            master = _master(conf, host, pod, allowed=True)
            rdma = shared_rdma.decide(conf.rdma, master.name)
            stale, named = attachment_link.look_up(pod, TEMP_PREFIX, "macvlan", inv.container_id, inv.ifname)
            _remove_leftovers(pod, inv, stale)
            previous = _previous_attachment(named, inv)
            undo = stack.enter_context(ExitStack())
            link = _create(conf, inv, host if not conf.linkInContainer else pod, pod, master, mac)
            undo.callback(links.delete, pod, link.index)
            call_deadline.check("creating the macvlan")
            result = Result(interfaces=[Interface(name=inv.ifname, mac=link.mac, sandbox=inv.netns, mtu=link.mtu)])
            if conf.ipam:
                IPAM(conf.ipam.type, inv).add_into(result, undo)
                call_deadline.check("allocating the addresses")
            if previous is not None:
                links.delete(pod, previous.index)
            links.set_attrs(pod, link.index, f"rename {link.name} to {inv.ifname}", ifname=inv.ifname,
                            ifalias=attachment_link.marker(inv.container_id, inv.ifname))
            if conf.ipam:
                pod_fd = stack.enter_context(pod_ns.fd(inv.netns))
                undo.callback(quietly, rail_routing.detach, pod, inv.ifname)  # never hides the error that undoes the ADD
                pod_ns.configure(pod, pod_fd, link.index, inv.ifname, result.ips, result.routes, conf)
            else:
                links.set_up(pod, link.index, inv.ifname)
            if conf.dns:
                result.dns = DNS.from_json(conf.dns)
            shared_rdma.report(rdma, conf.runtimeConfig.CNIDeviceInfoFile, inv, master.name)
            if rdma.device is not None and result.ips:
                _report_gid_indexes(rdma.device, inv, result)
            links.set_attrs(pod, link.index, f"mark {inv.ifname} done",
                            ifalias=attachment_link.marker(inv.container_id, inv.ifname, done=True))
            undo.pop_all()
            return result

    @attachment_lock.serialised
    def delete(self, inv: Invocation) -> None:
        ipam = IPAM.of(inv)  # DEL needs the IPAM's type only: no config models
        if ipam is not None:
            ipam.delete()
        if not inv.netns:
            return
        netns.refuse_own(inv.netns, inv.env)
        try:
            with links.rtnl_in(inv.netns) as pod:
                stale, link = attachment_link.look_up(pod, TEMP_PREFIX, "macvlan", inv.container_id, inv.ifname)
                _remove_leftovers(pod, inv, stale)
                if link is None:
                    rail_routing.detach(pod, inv.ifname)  # what an ADD killed before its link was named left
                    return
                ours = attachment_link.is_ours(link.alias, inv.container_id, inv.ifname)
                # A macvlan without any alias was made by an rdmanet before links were marked.
                if link.kind != "macvlan" or not (ours or not link.alias):
                    what = f"a {link.kind or 'link'}" if link.kind != "macvlan" else f"a macvlan with alias {link.alias!r}"
                    log.warning("DEL: %s in %s is %s, not this attachment's macvlan; leaving it", inv.ifname, inv.netns, what)
                    return
                rail_routing.detach(pod, inv.ifname)
                link_delete.delete_until_unlisted(pod, link.index)  # the daemon answers before the kernel frees it
        except netns.NetnsGone:
            log.info("DEL: netns %s is gone; nothing to remove", inv.netns)

    def check(self, inv: Invocation) -> None:
        from .config import load_conf

        conf = load_conf(inv)
        prev, expected, index = previous(conf.prevResult, inv)
        if conf.ipam:
            IPAM(conf.ipam.type, inv).check()
        try:
            with links.rtnl_in() as host, links.rtnl_in(inv.netns) as pod, pod_ns.fd(inv.netns) as pod_fd:
                master = _master(conf, host, pod)
                link = links.find_link(pod, inv.ifname)
                _check_link(conf, link, expected, master, inv)
                check_addresses(pod, link, prev, expected_index=index)
                ips = [ip for ip in prev.ips if ip.interface in (None, index)]
                routed = rail_routing.check(pod, pod_fd, inv.ifname, link.index, ips, conf)
                check_routes(pod, prev, rail_routing.tables(inv.ifname, routed))
        except netns.NetnsGone:
            raise check_failed(f"netns {inv.netns} does not exist") from None

    def gc(self, inv: Invocation) -> None:
        # macvlan-rdma keeps no state of its own: links die with their netns.
        ipam = IPAM.of(inv)
        if ipam is not None:
            ipam.gc()

    def status(self, inv: Invocation) -> None:
        from .config import load_conf

        conf = load_conf(inv)
        if conf.master and not conf.linkInContainer:
            with links.rtnl_in() as host:
                if links.find_link(host, conf.master) is None:
                    raise CNIError(NOT_AVAILABLE, f"master {conf.master} does not exist", "create the interface or fix master")
        if conf.ipam:
            IPAM(conf.ipam.type, inv).status()



def _master(conf: MacvlanConf, host, pod, *, allowed: bool = False) -> LinkBasics:
    """The master link; ``allowed``: also one the node policy lets a config use (ADD)."""
    where = pod if conf.linkInContainer else host
    name = conf.master or links.default_route_link(where)
    if not name:
        raise CNIError(INVALID_CONFIG, "master is not set and there is no default route to take it from",
                       "set \"master\" to the RDMA NIC port, e.g. \"master\": \"ens1f0\"")
    link = links.find_basics(where, name)
    if link is None:
        ns = "the pod's" if conf.linkInContainer else "the host"
        raise CNIError(INVALID_CONFIG, f"master {name!r} does not exist in {ns} network namespace",
                       "set \"master\" to an existing interface (see 'ip link')")
    if allowed and not conf.linkInContainer:  # a link in the pod's netns is the pod's own
        device_policy.check_master_link("master", link.name, defaulted=conf.master is None)
    if conf.mtu and conf.mtu > link.mtu:
        raise CNIError(INVALID_CONFIG, f"invalid network config: mtu {conf.mtu} is above master {name}'s MTU {link.mtu}",
                       f"set mtu between 0 and {link.mtu}")
    return link


TEMP_PREFIX = "mvr"


def _remove_leftovers(pod, inv: Invocation, stale: list) -> None:
    """Delete the macvlans an unfinished (killed) ADD of this attachment left (``stale``, from
    attachment_link.look_up): under the derived temporary name, or under CNI_IFNAME with this
    attachment's in-progress marker."""
    for link in stale:
        log.info("%s/%s: removing %s left by an earlier ADD", inv.container_id[:12], inv.ifname, link.name)
        links.delete(pod, link.index)


def _previous_attachment(link: Optional[Link], inv: Invocation) -> Optional[Link]:
    """The finished macvlan of this same attachment (a repeat ADD, e.g. the runtime's retry after
    it lost the first ADD's answer), which the new one replaces once IPAM has answered; any other
    link under CNI_IFNAME (``link``: what attachment_link.look_up found there) is a CNI error 4."""
    if link is None:
        return None
    if link.kind == "macvlan" and link.alias == attachment_link.marker(inv.container_id, inv.ifname, done=True):
        return link
    raise CNIError(INVALID_ENVIRONMENT, f"CNI_IFNAME {inv.ifname} already exists in {inv.netns} (a {link.kind or 'link'})",
                   "choose another interface name, or DEL the attachment that owns it first")


def _create(conf: MacvlanConf, inv: Invocation, creator, pod, master: LinkBasics, mac: Optional[str]) -> LinkBasics:
    """Create under the attachment's temporary name inside the pod netns (the name is what a
    later DEL or repeat ADD finds it by until the rename marks it)."""
    tmp = attachment_link.temporary_name(TEMP_PREFIX, inv.container_id, inv.ifname)
    pod_fd = None if conf.linkInContainer else netns.open_netns(inv.netns)
    try:
        links.create_macvlan(creator, tmp, master.index, conf.mode, pod_fd, mac, conf.mtu or None, master_name=master.name)
    finally:
        if pod_fd is not None:
            os.close(pod_fd)
    return links.find_basics(pod, tmp)


GID_WAIT = 0.3  # seconds: the kernel adds RoCE GIDs from a workqueue after the address appears
GID_POLL = 0.03


def _report_gid_indexes(device: str, inv: Invocation, result: Result) -> None:
    """Log the RoCE GID index of each pod address on ``device`` (for NCCL_IB_GID_INDEX).

    The kernel fills the GID table asynchronously: poll for at most GID_WAIT. Informational
    only, so it never fails ADD.
    """
    who = f"{inv.container_id[:12]}/{inv.ifname}"
    addresses = [ip.address.ip for ip in result.ips]
    found: dict = {}
    try:
        root = sysfs.default_root()
        deadline = time.monotonic() + GID_WAIT
        while True:
            for address in addresses:
                if address not in found:
                    hit = sysfs.roce_gid_index(device, address, inv.ifname, root=root)
                    if hit is not None:
                        found[address] = hit
            if len(found) == len(addresses) or time.monotonic() >= deadline:
                break
            time.sleep(GID_POLL)
    except Exception as exc:  # noqa: BLE001 - a report, never a failure
        log.info("%s: RDMA device %s: GID index unknown (%s: %s)", who, device, type(exc).__name__, exc)
        return
    for address in addresses:
        if address in found:
            port, index, gid_type = found[address]
            log.info("%s: RDMA device %s port %d GID index %d (%s) for %s", who, device, port, index, gid_type, address)
        else:
            log.info("%s: RDMA device %s: GID index for %s unknown (not in the GID table after %d ms)",
                     who, device, address, int(GID_WAIT * 1000))


def _check_link(conf: MacvlanConf, link: Optional[Link], expected: Interface, master: LinkBasics, inv: Invocation) -> None:
    if link is None:
        raise check_failed(f"interface {inv.ifname} is missing from {inv.netns}")
    if link.kind != "macvlan":
        raise check_failed(f"{inv.ifname} is a {link.kind or 'plain link'}, not a macvlan")
    if link.alias and not attachment_link.is_ours(link.alias, inv.container_id, inv.ifname):
        raise check_failed(f"{inv.ifname} is not the macvlan this attachment made (its alias is {link.alias!r})")
    if link.macvlan_mode != conf.mode:
        raise check_failed(f"{inv.ifname} is in macvlan mode {link.macvlan_mode}, expected {conf.mode}")
    if expected.mac and link.mac != expected.mac.lower():
        raise check_failed(f"{inv.ifname} has MAC {link.mac}, expected {expected.mac}")
    if link.parent_index != master.index:
        raise check_failed(f"{inv.ifname} is not on master {master.name}")
    if conf.mtu and link.mtu != conf.mtu:
        raise check_failed(f"{inv.ifname} has MTU {link.mtu}, expected {conf.mtu}")
