"""``rdmanet ipam plan``: write a plan of node blocks to the Lease store (the plan itself:
:mod:`rdmanet.ipam.block_plan`; docs/lease-ipam.md "Planned blocks").

One run: List the nodes (``/api/v1/nodes``, the ``--node-selector`` label selector, paginated,
names kept), List the domain's block records (``rdmanet.io/ipam-domain=<hash>,rdmanet.io/block-owner``
and the first design's ``rdmanet.io/kind=block`` Leases, paginated, parsed page by page), make
the plan, then (unless ``dry_run``) DELETE the free planned records of nodes not listed (uid and
resourceVersion preconditions: one claimed or changed since the List is left, 404/409 skipped)
and POST each planned record (a free block record labelled ``rdmanet.io/planned=true``). A 409 on
a create means the address was claimed meanwhile (a node's ADD, a borrower): skipped, counted,
and the node gets the next free block instead if there is one.

Every request goes through :class:`rdmanet.ipam.reconcile.KubeAPI` (the store's transport).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence
from urllib.parse import quote

from rdmanet.cni.core.errors import INVALID_CONFIG, NOT_AVAILABLE, CNIError

from .block_plan import PlanBlock, PlanError, Record, block_sets, make_plan
from .reconcile import ApiError, KubeTarget
from .ranges import RangeSet
from .store.block_records import free_record_body

NODES_PATH = "/api/v1/nodes"


@dataclass
class PlanOutcome:
    """What a run did (or, with ``dry_run``, would do)."""

    domain: str
    namespace: str
    dry_run: bool
    shares: dict  # range set index -> blocks per node
    before: dict  # node -> records held before the run
    planned: dict = field(default_factory=dict)  # node -> records this run created (or would)
    created: list = field(default_factory=list)  # record names
    deleted: list = field(default_factory=list)  # record names of gone nodes' free planned records
    skipped: list = field(default_factory=list)  # record names whose create met 409 (claimed meanwhile)
    kept: list = field(default_factory=list)  # gone nodes' records whose delete met 404/409
    errors: list = field(default_factory=list)  # "name: message" of other failures

    def after(self, node: str) -> int:
        return self.before.get(node, 0) + self.planned.get(node, 0)

    def to_json(self) -> dict:
        nodes = [{"node": n, "before": self.before[n], "planned": self.planned.get(n, 0), "after": self.after(n)}
                 for n in sorted(self.before)]
        return {"domain": self.domain, "namespace": self.namespace, "dry_run": self.dry_run,
                "blocks_per_node": {str(k): v for k, v in sorted(self.shares.items())},
                "nodes": nodes,
                "totals": {"nodes": len(nodes), "before": sum(n["before"] for n in nodes),
                           "planned": sum(n["planned"] for n in nodes), "after": sum(n["after"] for n in nodes),
                           "created": len(self.created), "deleted": len(self.deleted),
                           "skipped": len(self.skipped), "kept": len(self.kept), "errors": len(self.errors)},
                "created": self.created, "deleted": self.deleted, "skipped": self.skipped, "kept": self.kept,
                "errors": self.errors}


def list_nodes(target: KubeTarget, node_selector: str = "") -> list[str]:
    """The names of the nodes ``node_selector`` selects (every node without one), page by page."""
    names: list[str] = []

    def each(item: dict) -> None:
        name = (item.get("metadata") or {}).get("name")
        if isinstance(name, str) and name:
            names.append(name)

    query = [("labelSelector", node_selector)] if node_selector else []
    try:
        target.pages(NODES_PATH, query, each, names.clear)
    except ApiError as err:
        if err.status == 400:
            raise CNIError(INVALID_CONFIG, f"--node-selector {node_selector!r} is not a label selector: {err.message}",
                           "e.g. --node-selector node-role.kubernetes.io/gpu=true") from None
        raise CNIError(NOT_AVAILABLE, f"cannot list nodes: {err}",
                       "the planner needs list on nodes (cluster-scoped): bind the ClusterRole "
                       "rdmanet-node-lister (deploy/rbac.yaml) to its identity") from None
    return sorted(set(names))


def list_records(target: KubeTarget) -> list[Record]:
    """The domain's block records (and first-design block Leases, never planned, never deleted,
    counted as their node's), parsed page by page (:meth:`KubeTarget.list_block_records`)."""
    return [Record(block.name, block.ip, block.size, block.node, block.planned, claim is not None and claim.free,
                   block.uid, block.resource_version) for block, claim in target.list_block_records()]


def run_plan(target: KubeTarget, range_sets: Sequence[RangeSet], block_size: Optional[int], *,
             node_selector: str = "", blocks_per_node: Optional[int] = None, dry_run: bool = False) -> PlanOutcome:
    """List the nodes and the records of ``target``'s domain, plan, and write the plan (unless
    ``dry_run``). ``block_size``: the network's ``kubernetes.block_size`` (None: the family's
    default), as its nodes' stores use it."""
    nodes = list_nodes(target, node_selector)
    if not nodes:
        raise CNIError(INVALID_CONFIG, "no node matches" + (f" --node-selector {node_selector!r}" if node_selector else ""),
                       "a plan for no node would take every planned block back: check the selector")
    records = list_records(target)
    sets = block_sets(range_sets, block_size)
    try:
        plan = make_plan(sets, records, nodes, blocks_per_node)
    except PlanError as err:
        raise CNIError(INVALID_CONFIG, str(err.args[0]), err.args[1] if len(err.args) > 1 else "") from None
    outcome = PlanOutcome(target.domain, target.namespace, dry_run, dict(plan.shares), dict(plan.held))
    if dry_run:
        outcome.deleted = [r.name for r in plan.deletes]
        for c in plan.creates:
            outcome.created.append(_name(target, c.block))
            outcome.planned[c.node] = outcome.planned.get(c.node, 0) + 1
        return outcome
    for rec in plan.deletes:
        _delete(target, rec, outcome)
    for c in plan.creates:
        block: Optional[PlanBlock] = c.block
        while block is not None and not _create(target, c.node, block, outcome):
            block = plan.spare(block.range_set)  # its address was claimed meanwhile: the next free block
    return outcome


def _name(target: KubeTarget, block: PlanBlock) -> str:
    return free_record_body(target.namespace, target.domain, block.record_ip, block.id, block.subnet, "", True)[
        "metadata"]["name"]


def _create(target: KubeTarget, node: str, block: PlanBlock, outcome: PlanOutcome) -> bool:
    """POST the planned record; False when its address was claimed meanwhile (409)."""
    body = free_record_body(target.namespace, target.domain, block.record_ip, block.id, block.subnet, node, True)
    name = body["metadata"]["name"]
    try:
        target.api.request("POST", target.leases, body=body)
    except ApiError as err:
        if err.status == 409:
            outcome.skipped.append(name)
            return False
        outcome.errors.append(f"{name}: {err}")
        return True  # not a claim meanwhile: do not take another block for it
    outcome.created.append(name)
    outcome.planned[node] = outcome.planned.get(node, 0) + 1
    return True


def _delete(target: KubeTarget, rec: Record, outcome: PlanOutcome) -> None:
    body = {"apiVersion": "v1", "kind": "DeleteOptions",
            "preconditions": {"uid": rec.uid, "resourceVersion": rec.resource_version}}
    try:
        target.api.request("DELETE", f"{target.leases}/{quote(rec.name, safe='')}", body=body)
    except ApiError as err:
        if err.status in (404, 409):
            outcome.kept.append(rec.name)  # gone already, or claimed / changed since the List
            return
        outcome.errors.append(f"{rec.name}: {err}")
        return
    outcome.deleted.append(rec.name)


def plan_network(config: dict, *, node_selector: str = "", blocks_per_node: Optional[int] = None,
                 dry_run: bool = False) -> PlanOutcome:
    """``rdmanet ipam plan --network-config``: the network's ranges, block size and store, as
    ``rdmanet ipam ls`` reads them."""
    from .config import parse_ipam_config
    from .kube_config import kube_settings

    settings = kube_settings(config)
    if settings is None:
        raise CNIError(INVALID_CONFIG, "the network config's ipam block has no \"kubernetes\" key",
                       "a plan gives node blocks of the Kubernetes Lease store; add \"kubernetes\": {...} to ipam")
    parsed = parse_ipam_config(config)
    target = KubeTarget.from_config(config)
    return run_plan(target, parsed.range_sets, settings.block_size, node_selector=node_selector,
                    blocks_per_node=blocks_per_node, dry_run=dry_run)


def render_table(outcome: PlanOutcome) -> str:
    doc = outcome.to_json()
    head = f"{outcome.domain}  (namespace {outcome.namespace}; blocks per node: " + \
        ", ".join(f"range set {k}: {v}" for k, v in doc["blocks_per_node"].items()) + \
        (")  [dry run: nothing written]" if outcome.dry_run else ")")
    rows = [(n["node"], str(n["before"]), str(n["planned"]), str(n["after"])) for n in doc["nodes"]]
    t = doc["totals"]
    rows.append(("TOTAL", str(t["before"]), str(t["planned"]), str(t["after"])))
    widths = [max(len(x) for x in col) for col in zip(("NODE", "BEFORE", "PLANNED", "AFTER"), *rows)]
    lines = ["  " + "  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip()
             for line in [("NODE", "BEFORE", "PLANNED", "AFTER"), *rows]]
    tail = [f"  {'would delete' if outcome.dry_run else 'deleted'} {t['deleted']} free planned record(s) of gone nodes"]
    if t["skipped"]:
        tail.append(f"  skipped {t['skipped']} block(s) whose address was claimed meanwhile")
    if t["kept"]:
        tail.append(f"  left {t['kept']} record(s) of gone nodes claimed or changed since the List")
    tail.extend(f"  error: {e}" for e in outcome.errors)
    return head + "\n" + "\n".join(lines + tail) + "\n"
