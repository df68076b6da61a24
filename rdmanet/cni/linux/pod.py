"""Steps every plugin that puts a link into a pod shares: the pod's namespace, and what CHECK
compares in it (addresses and routes against prevResult)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterable, Iterator

from rdmanet.cni.core.errors import INVALID_ENVIRONMENT, CNIError, check_failed
from rdmanet.cni.core.result import IPConfig, Result, Route

from . import links, neighbour_probe, netns, rail_routing
from .links import Link

if TYPE_CHECKING:
    from rdmanet.cni.core.rail_settings import RailSettings

GONE_FIX = "pass an existing network namespace path such as /run/netns/<name> or /proc/<pid>/ns/net"


def gone(path: str) -> CNIError:
    return CNIError(INVALID_ENVIRONMENT, f"CNI_NETNS {path} does not exist or is not a network namespace", GONE_FIX)


@contextmanager
def rtnl(path: str) -> Iterator[links.IPRoute]:
    """An rtnetlink socket in the pod's netns; CNIError 4 when the netns does not exist."""
    try:
        with links.rtnl_in(path) as pod:
            yield pod
    except netns.NetnsGone:
        raise gone(path) from None


@contextmanager
def fd(path: str) -> Iterator[int]:
    """An fd of the pod's netns, closed at the end; CNIError 4 when the netns does not exist."""
    try:
        opened = netns.open_netns(path)
    except netns.NetnsGone:
        raise gone(path) from None
    try:
        yield opened
    finally:
        os.close(opened)


def configure(pod, pod_fd: int, index: int, ifname: str, ips: list[IPConfig], routes: list[Route],
              settings: RailSettings) -> None:
    """Addresses and routes of the pod's new interface ``index``: its addresses, then its routes
    (in the main table, or with policy routing in a multi-rail pod: rdmanet.cni.linux.rail_routing),
    with the optional probes for a conflicting address before and the gateway after
    (rdmanet.cni.linux.neighbour_probe). The caller registers ``rail_routing.detach`` as its undo
    first."""
    timeout = settings.probeTimeoutMs / 1000
    if settings.detectAddressConflict:
        links.set_up(pod, index, ifname)  # to probe before the addresses are set
        neighbour_probe.refuse_conflicts(pod_fd, links.link_by_index(pod, index), ifname, ips, timeout)
    plan = rail_routing.decide(pod, index, ifname, ips, settings)
    links.configure_in_pod(pod, pod_fd, index, ifname, ips, rail_routing.main_routes(plan, routes))
    rail_routing.attach(pod, pod_fd, plan, ips, routes)
    if settings.checkGateway:
        neighbour_probe.require_gateways(pod_fd, links.link_by_index(pod, index), ifname, ips, timeout)


def check_addresses(pod, link: Link, prev: Result, expected_index: int) -> None:
    """Every prevResult address of interface ``expected_index`` is on ``link``."""
    present = set(links.addresses(pod, link.index))
    for ip in prev.ips:
        if ip.interface is not None and ip.interface != expected_index:
            continue
        if ip.address not in present:
            raise check_failed(f"address {ip.address} is missing from {link.name}")


def check_routes(pod, prev: Result, tables: Iterable[int] = (rail_routing.MAIN_TABLE,)) -> None:
    """Every prevResult route (without gw: via its family's gateway) is in the pod's main table
    or one of the other ``tables``."""
    if not prev.routes:
        return
    gateways = {ip.family: ip.gateway for ip in prev.ips if ip.gateway is not None}
    present = set()
    for link_msg in pod.get_links():
        for table in tables:
            for route in links.routes(pod, link_msg["index"], table):
                present.add((route.dst, route.gw))
    for route in prev.routes:
        gw = route.gw if route.gw is not None else gateways.get(route.dst.version)
        if (route.dst, gw) not in present:
            raise check_failed(f"route {route.dst} via {gw} is missing")
