"""Whether a Node matches a Kubernetes ``NodeSelector`` (core/v1), as a pool's ``nodeSelector`` says
which nodes it serves.

Facts relied on (Kubernetes API, ``NodeSelector``; nv-ipam's README on the pools' ``nodeSelector``):
- ``nodeSelectorTerms`` are ORed; within a term, every ``matchExpressions`` and ``matchFields``
  requirement must hold (ANDed). A term with no requirement matches nothing.
- Operators: ``In`` / ``NotIn`` (the label's value in / not in ``values``; ``NotIn`` also holds
  when the label is absent), ``Exists`` / ``DoesNotExist``, ``Gt`` / ``Lt`` (one integer value,
  compared with the label's value parsed as an integer; absent or not an integer: no match).
- ``matchFields`` know one field, ``metadata.name``, with ``In`` / ``NotIn``.
- nv-ipam: a pool without a selector (or with no terms) serves every node.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence


def _requirement_holds(req: Mapping[str, Any], value: Optional[str]) -> bool:
    op = req.get("operator")
    values = [v for v in (req.get("values") or []) if isinstance(v, str)]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, want = int(value), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _term_matches(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    expressions: Sequence[Any] = term.get("matchExpressions") or []
    fields: Sequence[Any] = term.get("matchFields") or []
    if not expressions and not fields:
        return False
    for req in expressions:
        key = req.get("key") if isinstance(req, Mapping) else None
        if not isinstance(key, str) or not _requirement_holds(req, labels.get(key)):
            return False
    for req in fields:
        if not isinstance(req, Mapping) or req.get("key") != "metadata.name" or req.get("operator") not in ("In", "NotIn"):
            return False
        if not _requirement_holds(req, name):
            return False
    return True


def selects_every_node(selector: Optional[Mapping[str, Any]]) -> bool:
    """No selector, or one without terms: every node (nv-ipam's reading)."""
    return not selector or not (selector.get("nodeSelectorTerms") or [])


def matches(selector: Optional[Mapping[str, Any]], name: str, labels: Mapping[str, str]) -> bool:
    """Whether the node ``name`` with ``labels`` is selected."""
    if selects_every_node(selector):
        return True
    return any(isinstance(term, Mapping) and _term_matches(term, name, labels)
               for term in selector.get("nodeSelectorTerms") or [])
