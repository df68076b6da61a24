"""nv-ipam's pools as a test writes them, on the fake or the real API server alike: the pool (spec,
annotations) by a create, its status (each node's block or prefix, which nv-ipam's controller
writes) by an update of the status subresource; and the blocks nv-ipam's controller assigns."""

from __future__ import annotations

import ipaddress
from typing import Optional

from kube_api_server import RESOURCES

IPPOOL = RESOURCES["ippools.nv-ipam.nvidia.com"]
CIDRPOOL = RESOURCES["cidrpools.nv-ipam.nvidia.com"]
OPERATOR_NS = "nvidia-network-operator"  # where the NVIDIA Network Operator's guides put the pools


def put_pool(server, rt, namespace: str, name: str, spec: dict, allocations: Optional[list] = None,
             annotations: Optional[dict] = None) -> dict:
    meta: dict = {"name": name}
    if annotations:
        meta["annotations"] = dict(annotations)
    code, obj = server.api_create(rt, namespace, {"metadata": meta, "spec": spec}, False)
    assert code == 201, obj
    if allocations is not None:
        obj = set_allocations(server, rt, namespace, name, allocations)
    return obj


def set_allocations(server, rt, namespace: str, name: str, allocations: list) -> dict:
    """What nv-ipam's controller does: the pool's status.allocations replaced (status subresource)."""
    current = server.get_object(rt.key, namespace, name)
    code, obj = server.api_update(rt.status(), namespace, name, {**current, "status": {"allocations": allocations}},
                                  False)
    assert code == 200, obj
    return obj


def annotate(server, rt, namespace: str, name: str, annotations: dict) -> dict:
    current = server.get_object(rt.key, namespace, name)
    meta = dict(current["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), **annotations}
    code, obj = server.api_update(rt, namespace, name, {**current, "metadata": meta}, False)
    assert code == 200, obj
    return obj


def ippool_blocks(subnet: str, size: int, nodes: list[str]) -> list[dict]:
    """Each node's block as nv-ipam's controller assigns them: ``size`` addresses each, one after
    the other from the subnet's first usable address, the nodes in sorted order."""
    net = ipaddress.ip_network(subnet)
    first = int(net.network_address) + 1
    out = []
    for i, node in enumerate(sorted(nodes)):
        start = first + i * size
        out.append({"nodeName": node, "startIP": str(ipaddress.ip_address(start)),
                    "endIP": str(ipaddress.ip_address(start + size - 1))})
    return out
