"""A pool's ``nodeSelector`` judged as Kubernetes judges a NodeSelector (terms ORed, requirements
ANDed), for the node name and labels lease-ipam reads."""

from __future__ import annotations

import pytest

from rdmanet.ipam.node_selector import matches

LABELS = {"nvidia.com/ib": "true", "rack": "7"}


def term(*expressions, fields=()):
    return {"matchExpressions": list(expressions), **({"matchFields": list(fields)} if fields else {})}


def req(key, op, *values):
    return {"key": key, "operator": op, **({"values": list(values)} if values else {})}


@pytest.mark.parametrize("selector, selected", [
    (None, True),  # nv-ipam: no selector, every node
    ({"nodeSelectorTerms": []}, True),
    ({"nodeSelectorTerms": [{}]}, False),  # a term without requirements selects nothing
    ({"nodeSelectorTerms": [term(req("nvidia.com/ib", "In", "true"))]}, True),
    ({"nodeSelectorTerms": [term(req("nvidia.com/ib", "NotIn", "true"))]}, False),
    ({"nodeSelectorTerms": [term(req("gpu", "NotIn", "a100"))]}, True),  # absent label: NotIn holds
    ({"nodeSelectorTerms": [term(req("gpu", "Exists"))]}, False),
    ({"nodeSelectorTerms": [term(req("gpu", "DoesNotExist"))]}, True),
    ({"nodeSelectorTerms": [term(req("rack", "Gt", "6"), req("rack", "Lt", "8"))]}, True),
    ({"nodeSelectorTerms": [term(req("rack", "Gt", "7"))]}, False),
    ({"nodeSelectorTerms": [term(req("nvidia.com/ib", "Gt", "1"))]}, False),  # not an integer
    ({"nodeSelectorTerms": [term(req("gpu", "Exists")), term(req("rack", "In", "7"))]}, True),  # ORed
    ({"nodeSelectorTerms": [term(req("rack", "In", "7"), req("gpu", "Exists"))]}, False),  # ANDed
    ({"nodeSelectorTerms": [term(fields=[req("metadata.name", "In", "node-b")])]}, True),
    ({"nodeSelectorTerms": [term(fields=[req("metadata.name", "NotIn", "node-b")])]}, False),
    ({"nodeSelectorTerms": [term(fields=[req("metadata.uid", "In", "x")])]}, False),  # the one field known
])
def test_a_node_is_selected_as_kubernetes_selects_it(selector, selected):
    assert matches(selector, "node-b", LABELS) is selected
