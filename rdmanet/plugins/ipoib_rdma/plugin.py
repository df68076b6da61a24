"""ipoib-rdma verbs, as short steps over rdmanet.cni.core and rdmanet.cni.linux (the IB counterpart of macvlan-rdma).

ADD: resolve the master (an IPoIB netdev: ``/sys/class/net/<if>/type`` 32) and its pkey/mode
defaults, check the pkey against the port's pkey table and the MTU against the mode, decide the
shared RDMA device, remove what a killed ADD of the same attachment left, then create the child in
the host netns under the temporary name derived from the attachment (ipoib-cni creates it in the
host too), mark it with the attachment's in-progress marker (IFLA_IFALIAS), move it into the pod,
let IPAM allocate, replace a finished child of the same attachment (a repeat ADD), rename it to
CNI_IFNAME, configure addresses and routes, write the device-info file, mark it done. Every step
is undone if a later one fails.

Crash safety (rdmanet.cni.linux.attachment_link): between creation and the marker the child carries the
derived name; from then on it carries the marker wherever it is (an alias survives netns moves),
so a DEL or a repeat ADD after a SIGKILL at any instant finds it.

DEL: IPAM first; then every link that carries the attachment's marker (or the temporary name) in
the pod netns and in the host netns. The host matters because the kernel does not destroy an
IPoIB child whose netns dies: it returns it to the host (``netns_refund``), where ipoib-cni would
leave it to pile up. The marker is the proof of ownership, whatever the link's kind: only root
marks host links, and the only links a dying pod netns returns to the host are IPoIB children
and physical devices, which cannot be deleted (they are left alone).
"""

from __future__ import annotations

import errno
import logging
from contextlib import ExitStack
from typing import Iterator, Optional

from pyroute2.netlink.exceptions import NetlinkError

from rdmanet.cni.core import deadline as call_deadline
from rdmanet.cni.core.check import previous
from rdmanet.cni.core.errors import INVALID_CONFIG, INVALID_ENVIRONMENT, NOT_AVAILABLE, CNIError, check_failed
from rdmanet.cni.core.gc import valid_attachments
from rdmanet.cni.core.infiniband import MIN_MTU, PKEY_MASK, connected_capable, mtu_limit, parse_hwaddr, pkey_text
from rdmanet.cni.core.invocation import Invocation
from rdmanet.cni.core.ipam_exec import IPAM
from rdmanet.cni.core.result import DNS, Interface, Result
from rdmanet.cni.core.rollback import quietly
from rdmanet.cni.linux import (attachment_link, attachment_lock, device_info, infiniband, ipoib, links, netns, rail_routing,
                               shared_rdma, sysctl, sysfs)
from rdmanet.cni.linux import device_policy
from rdmanet.cni.linux import pod as pod_ns
from rdmanet.cni.linux.links import Link
from rdmanet.cni.linux.pod import check_addresses, check_routes

from .config import IpoibConf, load_conf

log = logging.getLogger("rdmanet.ipoib-rdma")


class IpoibRdma:
    interface_plugin = "ipoib-rdma"  # never an IPAM (rdmanet.cni.core.nesting)

    @attachment_lock.serialised
    def add(self, inv: Invocation) -> Result:
        conf = load_conf(inv)
        netns.refuse_own(inv.netns, inv.env)
        device_info.check_path(conf.runtimeConfig.CNIDeviceInfoFile)
        with ExitStack() as stack:
            host = stack.enter_context(links.rtnl_in())
            pod = stack.enter_context(pod_ns.rtnl(inv.netns))
            master = _master(conf, host, allowed=True)
            pkey, mode = _pkey_and_mode(conf, master)
            rdma = shared_rdma.decide(conf.rdma, master.name)
            _remove_owned(host, inv, "host", leftovers_only=True)  # what a killed ADD of this attachment left
            _remove_owned(pod, inv, "pod", leftovers_only=True)
            finished = _previous_attachment(pod, inv)
            pod_fd = stack.enter_context(pod_ns.fd(inv.netns))
            undo = stack.enter_context(ExitStack())
            undo.callback(_remove_owned, host, inv, "host", leftovers_only=True)
            undo.callback(_remove_owned, pod, inv, "pod", leftovers_only=True)
            link = _create(inv, host, pod, pod_fd, master, pkey, mode)
            call_deadline.check("creating the IPoIB child")
            result = Result(interfaces=[Interface(name=inv.ifname, mac=link.mac, sandbox=inv.netns)])
            if conf.ipam:
                IPAM(conf.ipam.type, inv).add_into(result, undo)
                call_deadline.check("allocating the addresses")
            if finished is not None:
                links.delete(pod, finished.index)
            link = _rename(conf, inv, pod, pod_fd, link)
            result.interfaces[0].mtu = link.mtu
            if conf.ipam:
                undo.callback(quietly, rail_routing.detach, pod, inv.ifname)  # never hides the error that undoes the ADD
                pod_ns.configure(pod, pod_fd, link.index, inv.ifname, result.ips, result.routes, conf)
            else:
                links.set_up(pod, link.index, inv.ifname)
            if conf.dns:
                result.dns = DNS.from_json(conf.dns)
            shared_rdma.report(rdma, conf.runtimeConfig.CNIDeviceInfoFile, inv, master.name)
            links.set_attrs(pod, link.index, f"mark {inv.ifname} done",
                            ifalias=attachment_link.marker(inv.container_id, inv.ifname, done=True))
            undo.pop_all()
            port = infiniband.port_of_netdev(master.name, sysfs.default_root()) if rdma.device else None
            log.info("ADD %s/%s: IPoIB child of %s (pkey %s, %s) in %s%s", inv.container_id[:12], inv.ifname,
                     master.name, pkey_text(pkey), mode, inv.netns, f", RDMA {port.describe()}" if port else "")
            return result

    @attachment_lock.serialised
    def delete(self, inv: Invocation) -> None:
        conf = load_conf(inv)
        if conf.ipam:
            IPAM(conf.ipam.type, inv).delete()
        if inv.netns:
            netns.refuse_own(inv.netns, inv.env)
            try:
                with links.rtnl_in(inv.netns) as pod:
                    rail_routing.detach(pod, inv.ifname)
                    _remove_owned(pod, inv, "pod")
            except netns.NetnsGone:
                log.info("DEL: netns %s is gone; looking for a refunded child in the host", inv.netns)
        with links.rtnl_in() as host:
            _remove_owned(host, inv, "host")

    def check(self, inv: Invocation) -> None:
        conf = load_conf(inv)
        prev, expected, index = previous(conf.prevResult, inv)
        if conf.ipam:
            IPAM(conf.ipam.type, inv).check()
        try:
            with links.rtnl_in() as host, links.rtnl_in(inv.netns) as pod, pod_ns.fd(inv.netns) as pod_fd:
                master = _master(conf, host)
                pkey, mode = _pkey_and_mode(conf, master, check_table=False)
                link = links.find_link(pod, inv.ifname)
                check_link(link, inv.ifname, inv.netns, master, pkey, mode, conf.mtu, expected.mac)
                check_addresses(pod, link, prev, expected_index=index)
                ips = [ip for ip in prev.ips if ip.interface in (None, index)]
                routed = rail_routing.check(pod, pod_fd, inv.ifname, link.index, ips, conf)
                check_routes(pod, prev, rail_routing.tables(inv.ifname, routed))
        except netns.NetnsGone:
            raise check_failed(f"netns {inv.netns} does not exist") from None

    def gc(self, inv: Invocation) -> None:
        """IPAM's GC, and the finished IPoIB children the kernel returned to the host when their
        pod's netns died, for attachments no longer valid. Children still being made (in-progress
        marker) belong to a running ADD of some network and are left to it."""
        conf = load_conf(inv)
        valid = valid_attachments(inv.config)
        if valid is not None:
            keep = {attachment_link.marker(cid, ifname, done=True) for cid, ifname in valid}
            with links.rtnl_in() as host:
                for msg in host.get_links():
                    link = Link.from_msg(msg)
                    if attachment_link.is_done(link.alias) and link.alias not in keep:
                        log.info("GC: removing %s (%s), returned to the host by a dead pod netns", link.name, link.alias)
                        _delete(host, link, "host")
        if conf.ipam:
            IPAM(conf.ipam.type, inv).gc()

    def status(self, inv: Invocation) -> None:
        conf = load_conf(inv)
        with links.rtnl_in() as host:
            try:
                _master(conf, host)
            except CNIError as exc:
                raise CNIError(NOT_AVAILABLE, exc.msg, exc.details) from None
        if conf.ipam:
            IPAM(conf.ipam.type, inv).status()


TEMP_PREFIX = "ipr"


def temporary_name(inv: Invocation) -> str:
    return attachment_link.temporary_name(TEMP_PREFIX, inv.container_id, inv.ifname)


def _master(conf: IpoibConf, host, *, allowed: bool = False) -> Link:
    """The master link; ``allowed``: also one the node policy lets a config use (ADD)."""
    root = sysfs.default_root()
    link = links.find_link(host, conf.master)
    if link is None:
        raise CNIError(INVALID_CONFIG, f"master {conf.master!r} does not exist in the host network namespace",
                       'set "master" to the IPoIB netdev of an InfiniBand port, e.g. "ib0" (see \'ip -br link\')')
    if not infiniband.is_ipoib(link.name, root):
        raise not_ipoib(link.name, root)
    if allowed:
        device_policy.check_master_link("master", link.name)
    return link


def not_ipoib(name: str, root: str) -> CNIError:
    """master is not an IPoIB netdev: say what it is and which plugin fits it."""
    kind = {infiniband.ARPHRD_ETHER: "an Ethernet netdev"}.get(infiniband.netdev_type(name, root), "not an IPoIB netdev")
    port = infiniband.port_of_netdev(name, root)
    if port is not None and infiniband.link_layer(port, root) == "Ethernet":
        kind = f"a RoCE port (RDMA device {port.device}, link layer Ethernet)"
    msg = f"master {name} is {kind}, not the IPoIB netdev of an InfiniBand port"
    if not infiniband.module_loaded("ib_ipoib", root):
        msg += " (and ib_ipoib is not loaded)"
    return CNIError(INVALID_CONFIG, msg, ipoib.MACVLAN_FIX)


def _pkey_and_mode(conf: IpoibConf, master: Link, check_table: bool = True) -> tuple[int, str]:
    """The child's pkey and mode: the config's, else the master's (ipoib-cni since 2023); checked
    against the port's pkey table, the master's RC capability and the mode's MTU limit."""
    root = sysfs.default_root()
    parent = infiniband.ipoib_parent(master.name, root)
    pkey = conf.pkey if conf.pkey is not None else (parent.pkey or PKEY_MASK)
    mode = conf.mode or parent.mode or "datagram"
    port = infiniband.port_of_netdev(master.name, root)
    table = infiniband.port_pkeys(port, root) if port is not None and check_table else None
    if table is not None and pkey not in table:
        have = ", ".join(pkey_text(k) for k in table) or "none"
        raise CNIError(INVALID_CONFIG, f"pkey {pkey_text(pkey)} is not in the pkey table of {port.describe()} behind "
                       f"master {master.name} (it has {have})",
                       "ask the subnet manager to add this port to the partition (opensm partitions.conf, UFM), "
                       "or set \"pkey\" to one of those (omit it for the master's)")
    if mode == "connected" and _has_hwaddr(master) and not connected_capable(master.mac):
        raise CNIError(INVALID_CONFIG, f"mode connected: master {master.name} cannot run connected mode (no RC flag in "
                       "its IPoIB address: enhanced IPoIB, ConnectX-4 and later, is datagram only)",
                       'set "mode": "datagram" or omit mode')
    if conf.mtu:
        limit = mtu_limit(mode, parent.mode or "", master.mtu)
        if not MIN_MTU <= conf.mtu <= limit:
            raise CNIError(INVALID_CONFIG, f"invalid network config: mtu {conf.mtu} is outside what {mode} mode allows "
                           f"on master {master.name} ({MIN_MTU}-{limit})",
                           f"set mtu between {MIN_MTU} and {limit}, 0 to inherit"
                           + ("; connected mode allows up to 65520" if mode == "datagram" else ""))
    return pkey, mode


def _has_hwaddr(link: Link) -> bool:
    try:
        parse_hwaddr(link.mac)
        return True
    except ValueError:
        return False


def _create(inv: Invocation, host, pod, pod_fd: int, master: Link, pkey: int, mode: str) -> Link:
    """In the host under the temporary name, marked in progress, moved into the pod."""
    tmp = temporary_name(inv)
    ipoib.create_child(host, tmp, master.index, master.name, pkey, mode)
    child = links.find_link(host, tmp)
    links.set_attrs(host, child.index, f"mark {tmp}", ifalias=attachment_link.marker(inv.container_id, inv.ifname))
    links.set_attrs(host, child.index, f"move {tmp} into the pod netns", net_ns_fd=pod_fd)
    return links.find_link(pod, tmp)


def _rename(conf: IpoibConf, inv: Invocation, pod, pod_fd: int, link: Link) -> Link:
    links.rename(pod, link.index, inv.ifname)
    with netns.entered_fd(pod_fd):  # as ipoib-cni does
        sysctl.set_interface_sysctl("ipv4", inv.ifname, "proxy_arp", "1")
    if conf.mtu:
        links.set_attrs(pod, link.index, f"set MTU {conf.mtu} on {inv.ifname}", mtu=conf.mtu)
    return links.link_by_index(pod, link.index)


def _previous_attachment(pod, inv: Invocation) -> Optional[Link]:
    """The finished child of this same attachment (a repeat ADD after the runtime lost the first
    answer), replaced once IPAM has answered; any other link under CNI_IFNAME is error 4."""
    link = links.find_link(pod, inv.ifname)
    if link is None:
        return None
    if link.alias == attachment_link.marker(inv.container_id, inv.ifname, done=True):
        return link
    raise CNIError(INVALID_ENVIRONMENT, f"CNI_IFNAME {inv.ifname} already exists in {inv.netns} (a {link.kind or 'link'})",
                   "choose another interface name, or DEL the attachment that owns it first")


def owned(ipr, inv: Invocation, leftovers_only: bool = False) -> Iterator[Link]:
    """The links in ``ipr``'s netns that are this attachment's child: its marker (in progress, or
    done unless ``leftovers_only``), or its temporary name (a kill between creation and marking)."""
    marks = {attachment_link.marker(inv.container_id, inv.ifname)}
    if not leftovers_only:
        marks.add(attachment_link.marker(inv.container_id, inv.ifname, done=True))
    tmp = temporary_name(inv)
    for msg in ipr.get_links():
        link = Link.from_msg(msg)
        if link.alias in marks or link.name == tmp:
            yield link


def _remove_owned(ipr, inv: Invocation, where: str, leftovers_only: bool = False) -> None:
    for link in list(owned(ipr, inv, leftovers_only)):
        _delete(ipr, link, where)


def _delete(ipr, link: Link, where: str) -> None:
    log.info("deleting %s (%s, %s) in the %s netns", link.name, link.kind or "link", link.alias, where)
    try:
        ipr.link("del", index=link.index)
    except NetlinkError as exc:
        if exc.code == errno.ENODEV:
            return
        if exc.code == errno.EOPNOTSUPP:  # a physical device someone marked: never one of ours
            log.warning("cannot delete %s in the %s netns (not a virtual link); leaving it", link.name, where)
            return
        raise links.kernel_error(f"delete {link.name} in the {where} netns", exc) from None


def check_link(link: Optional[Link], ifname: str, netns_path: str, master: Link, pkey: int, mode: str,
               mtu: int, mac: str) -> None:
    """CHECK's comparison of the pod's link with what ADD made (kind, parent, pkey, mode, MTU, address)."""
    if link is None:
        raise check_failed(f"interface {ifname} is missing from {netns_path}")
    if link.kind != ipoib.KIND:
        raise check_failed(f"{ifname} is a {link.kind or 'plain link'}, not an IPoIB child")
    if link.parent_index != master.index:
        raise check_failed(f"{ifname} is not a child of master {master.name}")
    if link.ipoib_pkey is None or link.ipoib_pkey & PKEY_MASK != pkey:
        found = "none" if link.ipoib_pkey is None else pkey_text(link.ipoib_pkey)
        raise check_failed(f"{ifname} has pkey {found}, expected {pkey_text(pkey)}")
    if link.ipoib_mode != mode:
        raise check_failed(f"{ifname} is in {link.ipoib_mode or 'no'} mode, expected {mode}")
    if mtu and link.mtu != mtu:
        raise check_failed(f"{ifname} has MTU {link.mtu}, expected {mtu}")
    if mac and link.mac != mac.lower():
        raise check_failed(f"{ifname} has address {link.mac}, expected {mac}")
