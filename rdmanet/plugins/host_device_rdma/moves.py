"""Moving a netdev into a pod and back, each way in one rtnetlink request.

Into the pod: one RTM_NEWLINK on the host's socket moves the device (IFLA_NET_NS_FD), names it
CNI_IFNAME (IFLA_IFNAME) and sets IFLA_IFALIAS = the original name; then, in the pod, MTU and MAC
are set and it goes up. Back to the host: in the pod the device goes down and gets its original
MAC, MTU and name back, then one request moves it home (naming it, when the pod had a link of that
name) with its original alias, and it goes up again if it was up before ADD.

The kernel serves a request under the RTNL lock, so the move and the rename happen together:
neither the pod nor the host ever holds the device under the other side's name, and a kill (the
request is one syscall) leaves it either where it was or where it was going, never in between.
(Listeners on the target side may see a notification with the old name just before the rename's:
hence the rename in the pod first on the way home, where udev and NetworkManager listen.)
When the name is taken on the other side, the kernel refuses the request and the device stays
where it was (EEXIST). That is what upstream host-device gets from its temporary netns (rename
there, then move on), for one kernel move per direction instead of two: a move waits for the
kernel's RCU grace periods, 15-30 ms here, and was most of an ADD or DEL.

A moved link is followed by its ifindex (the kernel keeps it across a netns move unless the
target already uses it), never found again by a name a pod could have given another link.
:func:`identify` tells the device ADD moved from a link that only looks like it: a pod may delete
the device and create a link of the same kind, name, MAC and even ifindex. What it cannot forge is
checked, as recorded at ADD: a physical device's permanent MAC and bus device (e.g. the PCI
address); a veth's peer, its ifindex and network namespace (a pod cannot make a link there). A
virtual device with neither (a dummy) cannot be told from a forgery once it is in a pod: DEL
leaves what it finds there, which dies with the pod.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Optional

from pyroute2.netlink.exceptions import NetlinkError

from rdmanet.cni.core.errors import INVALID_ENVIRONMENT, LINK_FAILURE, CNIError
from rdmanet.cni.linux import links, netns
from rdmanet.cni.linux.links import Link

from .attachment_state import Original

log = logging.getLogger("rdmanet.host-device-rdma")


def identify(link: Optional[Link], recorded: Original, pod_fd: Optional[int] = None) -> bool:
    """Whether ``link`` is the device recorded at ADD.

    ``pod_fd``: the namespace ``link`` was read in when it is a pod's (None: the host's, where no
    pod makes links). There a device without a permanent identity is the one recorded only if it
    is a veth whose peer, still at its recorded ifindex in its recorded netns, is a veth whose own
    peer is ``link`` in that pod: a link a pod made has its peer in the pod or in a netns of the
    pod's, never where the device's was."""
    if link is None or link.kind != recorded.kind:
        return False
    if recorded.strongly_identified:
        return all(not getattr(recorded, f) or getattr(link, f) == getattr(recorded, f) for f in ("perm_mac", "parent_dev"))
    if pod_fd is None:
        return True
    if link.kind != "veth" or recorded.peer_index is None or link.parent_index != recorded.peer_index:
        return False
    with links.rtnl_in() as host:  # the peer's dump first: it makes the host name the pod's netns by an nsid
        peer = links.link_in(host, recorded.peer_index, recorded.peer_nsid)
        return (peer is not None and peer.kind == "veth" and peer.parent_index == link.index
                and peer.parent_netnsid is not None and peer.parent_netnsid == links.nsid_of(host, pod_fd))


def _followed(ipr, index: int, name: str) -> Link:
    """The link that was ``index`` before a netns move, in the namespace of ``ipr``: the same index
    unless the kernel had to renumber it (then its name, which this call just set or checked)."""
    link = links.link_by_index(ipr, index)
    if link is not None and link.name == name:
        return link
    found = links.find_link(ipr, name)
    if found is None:
        raise CNIError(LINK_FAILURE, f"{name} (ifindex {index}) is not where it was just moved", "see the daemon log; DEL the attachment")
    return found


def move_into_pod(host, link: Link, pod_fd: int, ifname: str, *, mtu: Optional[int], mac: Optional[str]) -> Link:
    """Move ``link`` (found in the host on ``host``) into the pod as ``ifname``; the link there.
    If a step in the pod fails, the device is sent home as it was before the error is raised."""
    original = Original.of_link(link)
    with links.rtnl_in_fd(pod_fd) as pod:
        if clash := links.find_link(pod, ifname):
            raise CNIError(INVALID_ENVIRONMENT, f"CNI_IFNAME {ifname} already exists in the pod netns (a {clash.kind or 'link'})",
                           "choose another interface name, or DEL the attachment that owns it first")
        # Up in the same request (the kernel applies it after the move and the name) unless MTU
        # or MAC are to be set first; a MAC or an MTU in it would be set before the name.
        up_now = {} if mtu or mac else {"state": "up"}
        links.set_attrs(host, link.index, f"move {link.name} into the pod netns as {ifname}",
                        net_ns_fd=pod_fd, ifname=ifname, ifalias=link.name, **up_now)
        moved = _followed(pod, link.index, ifname)
        try:
            if link.name in moved.altnames:  # the pod would know the device by its host name too
                links.drop_altname(pod, moved.index, link.name)
            if up_now:
                return moved
            if mtu:
                links.set_attrs(pod, moved.index, f"set MTU {mtu} on {ifname}", mtu=mtu)
            if mac:
                links.set_attrs(pod, moved.index, f"set MAC {mac} on {ifname}", address=mac)
            links.set_up(pod, moved.index, ifname)
        except CNIError:
            move_to_host(pod_fd, links.link_by_index(pod, moved.index) or moved, original)  # as it is now
            raise
        return links.link_by_index(pod, moved.index)


def move_to_host(pod_fd: int, link: Link, original: Original) -> None:
    """Send ``link`` (as the caller just read it in the pod) home as it was.

    The device gets its original name in the pod first, so that the host (udev, NetworkManager)
    sees it arrive under that name only; when the pod has a link of that name, the move request
    names it instead. If the host netns already has another link called like the original
    (created while the device was in the pod), the device stays in the pod as the pod had it and
    CNIError 100 says so, and the stranger is not touched.
    """
    with links.rtnl_in_fd(pod_fd) as pod:
        _refuse_name_clash(link.name, original.name)
        _restore(pod, link.index, original, up=False, name=False, current=link)
        renamed = _rename_unless_taken(pod, link.index, link.name, original.name)
        # name (when the pod had a link of that name), alias and up/down are applied after the move
        attrs = {"ifname": original.name, **({"state": "up"} if original.up else {})}
        if (link.alias or "") != original.alias:
            attrs["ifalias"] = original.alias
        host_fd = netns.current_netns_fd()  # this thread never left the host netns
        try:
            links.set_attrs(pod, link.index, f"return {link.name} to the host netns as {original.name}", net_ns_fd=host_fd, **attrs)
        except CNIError:
            if links.link_by_index(pod, link.index) is not None:  # refused, so still in the pod
                _as_the_pod_had_it(pod, link, renamed)
            raise  # else home, and a later DEL restores what is left (restore_in_host)
        finally:
            os.close(host_fd)


def _rename_unless_taken(pod, index: int, name: str, new: str) -> bool:
    """Rename the link in the pod; False (nothing done) when the pod has a link called ``new``."""
    if name == new:
        return False
    try:
        pod.link("set", index=index, ifname=new)
    except NetlinkError as exc:
        if exc.code == errno.EEXIST:
            return False
        raise links.kernel_error(f"rename {name} to {new} in the pod netns", exc) from exc
    return True


def _as_the_pod_had_it(pod, link: Link, renamed: bool) -> None:
    try:
        if renamed:
            links.set_attrs(pod, link.index, f"rename it back to {link.name}", ifname=link.name)
        if link.up:
            links.set_up(pod, link.index, link.name)
    except CNIError as exc:
        log.error("could not give %s back to the pod as it was after the host refused it: %s", link.name, exc.msg)


def _refuse_name_clash(ifname: str, name: str) -> None:
    with links.rtnl_in() as host:
        if links.find_link(host, name) is not None:
            raise CNIError(LINK_FAILURE, f"cannot return {ifname} to the host as {name}: the host netns already has a link {name}",
                           f"rename or remove the host's {name} (it is not the device this attachment took), then DEL again")


def restore_in_host(original: Original) -> bool:
    """For a device already in the host (its pod netns died, or ADD stopped before moving it):
    find it by its permanent MAC or bus device (a physical device), else by the alias ADD set,
    else by its original name (with its original MAC), and restore it. False when it is nowhere
    (a virtual device died). A link with the original name but another MAC is someone else's
    (created after the device left) and is left alone."""
    with links.rtnl_in() as host:
        link = None
        if original.strongly_identified:
            link = next((l for l in map(links.Link.from_msg, host.get_links()) if identify(l, original)), None)
        if link is None:
            link = links.find_by_alias(host, original.name)
            if link is not None and not identify(link, original):
                link = None
        if link is None:
            by_name = links.find_link(host, original.name)
            if by_name is not None and identify(by_name, original) and (not original.mac or by_name.mac == original.mac):
                link = by_name
        if link is None:
            return False
        _restore(host, link.index, original, up=original.up)
    return True


def _restore(ipr, index: int, original: Original, *, up: bool, name: bool = True, current: Optional[Link] = None) -> None:
    """Give the link the original's MAC, MTU, alias and (unless ``name`` is False) name, then the
    up/down state ``up``. A link that already is as it was is left alone (no down/up flap of a
    host device that never left). ``current``: the link as just read, if the caller has it."""
    current = current or links.link_by_index(ipr, index)
    attrs = {}
    if name and (current.alias or "") != original.alias:
        attrs["ifalias"] = original.alias
    if name and current.name != original.name:
        attrs["ifname"] = original.name
    if original.mac and current.mac != original.mac:
        attrs["address"] = original.mac
    if original.mtu and current.mtu != original.mtu:
        attrs["mtu"] = original.mtu
    if not attrs and current.up == up:
        return
    if current.up:
        links.set_attrs(ipr, index, f"set {current.name} down", state="down")
    if attrs:
        links.set_attrs(ipr, index, f"restore {original.name} ({', '.join(_WHAT[a] for a in attrs)})", **attrs)
    if up:
        links.set_up(ipr, index, original.name)


_WHAT = {"ifalias": "alias", "ifname": "name", "address": "MAC", "mtu": "MTU"}
