"""Moving a netdev into a pod and back, always through a temporary netns (Go host-device, 2024).

Into the pod: host -> temporary netns, renamed to CNI_IFNAME with IFLA_IFALIAS = the original
name (an altname equal to the old name dropped) -> pod, where MTU/MAC are set and it goes up.
The temporary netns keeps both the host and the pod free of half-renamed devices and of udev
or NetworkManager races. Back to the host: the reverse, restoring name, MAC, MTU, alias and the
up/down state recorded before ADD. If anything fails half-way the device is sent home first:
a virtual device left in a closing temporary netns would be destroyed.
"""

from __future__ import annotations

import os
from typing import Optional

from cni.core.errors import INVALID_ENVIRONMENT, CNIError
from cni.linux import links, netns
from cni.linux.links import Link


def move_into_pod(host, link: Link, pod_fd: int, ifname: str, *, mtu: Optional[int], mac: Optional[str]) -> Link:
    with links.rtnl_in_fd(pod_fd) as pod:
        if clash := links.find_link(pod, ifname):
            raise CNIError(INVALID_ENVIRONMENT, f"CNI_IFNAME {ifname} already exists in the pod netns (a {clash.kind or 'link'})",
                           "choose another interface name, or DEL the attachment that owns it first")
    original = {"name": link.name, "mac": link.mac, "mtu": link.mtu, "up": link.up, "alias": link.alias}
    with netns.temporary() as tmp:
        links.set_attrs(host, link.index, f"move {link.name} out of the host netns", net_ns_fd=tmp)
        with links.rtnl_in_fd(tmp) as staging:
            index = links.find_link(staging, link.name).index
            try:
                links.set_attrs(staging, index, f"rename {link.name} to {ifname}", ifname=ifname, ifalias=link.name)
                links.drop_altname(staging, index, link.name)
                links.set_attrs(staging, index, f"move {ifname} into the pod netns", net_ns_fd=pod_fd)
            except CNIError:
                _send_home(staging, index, original)
                raise
    with links.rtnl_in_fd(pod_fd) as pod:
        moved = links.find_link(pod, ifname)
        try:
            if mtu:
                links.set_attrs(pod, moved.index, f"set MTU {mtu} on {ifname}", mtu=mtu)
            if mac:
                links.set_attrs(pod, moved.index, f"set MAC {mac} on {ifname}", address=mac)
            links.set_up(pod, moved.index, ifname)
        except CNIError:
            move_to_host(pod_fd, ifname, original)
            raise
        return links.link_by_index(pod, moved.index)


def move_to_host(pod_fd: int, ifname: str, original: dict) -> bool:
    """Send ``ifname`` from the pod home as it was; False when the pod has no such link."""
    with links.rtnl_in_fd(pod_fd) as pod:
        link = links.find_link(pod, ifname)
        if link is None:
            return False
        links.set_attrs(pod, link.index, f"set {ifname} down", state="down")
        with netns.temporary() as tmp:
            links.set_attrs(pod, link.index, f"move {ifname} out of the pod netns", net_ns_fd=tmp)
            with links.rtnl_in_fd(tmp) as staging:
                _send_home(staging, links.find_link(staging, ifname).index, original)
    return True


def _send_home(staging, index: int, original: dict) -> None:
    """In the temporary netns: restore what we can, then always move to the host netns."""
    try:
        _restore(staging, index, original, up=False)
    finally:
        host_fd = netns.current_netns_fd()  # this thread never left the host netns
        try:
            links.set_attrs(staging, index, f"return {original['name']} to the host netns", net_ns_fd=host_fd)
        finally:
            os.close(host_fd)
    if original.get("up"):
        with links.rtnl_in() as host:
            back = links.find_link(host, original["name"])
            if back is not None:
                links.set_up(host, back.index, original["name"])


def restore_in_host(original: dict) -> bool:
    """For a device already in the host (its pod netns died): find it by the alias ADD set, or
    by its original name, and restore it. False when it is nowhere (a virtual device died)."""
    with links.rtnl_in() as host:
        link = links.find_by_alias(host, original["name"]) or links.find_link(host, original["name"])
        if link is None:
            return False
        _restore(host, link.index, original, up=original.get("up", False))
    return True


def _restore(ipr, index: int, original: dict, *, up: bool) -> None:
    current = links.link_by_index(ipr, index)
    if current.up:
        links.set_attrs(ipr, index, f"set {current.name} down", state="down")
    attrs = {"ifalias": original.get("alias") or ""}
    if current.name != original["name"]:
        attrs["ifname"] = original["name"]
    if original.get("mac") and current.mac != original["mac"]:
        attrs["address"] = original["mac"]
    if original.get("mtu") and current.mtu != original["mtu"]:
        attrs["mtu"] = original["mtu"]
    links.set_attrs(ipr, index, f"restore {original['name']} (name, MAC, MTU, alias)", **attrs)
    if up:
        links.set_up(ipr, index, original["name"])
