"""The node blocks of Nodes that no longer exist, released by the reconciler CronJob.

A node releases its own empty blocks (:mod:`rdmanet.ipam.store.kube_blocks`, the node GC); a
Node that is gone (scaled down, replaced) never will, and the remaining nodes would borrow from
its blocks for ever. So each ``--all`` run of the reconciler:

1. Lists the Nodes (their names) and the block records of every domain.
2. A block whose owner is not a Node and whose record is free (no attachment; a first-design
   block Lease is always free) is noted: the annotation ``rdmanet.io/owner-gone-since`` is set to
   the API server's time (the ``Date`` of its answer), by a resourceVersion-guarded update.
3. A block noted at least ``grace`` seconds ago by the server's clock, its owner still no Node,
   is deleted with uid and resourceVersion preconditions: a record claimed or changed since the
   List (its owner back and using it, a borrower taking it) meets 409 and is left alone.
4. A noted block whose owner is a Node again loses the note.

A record that names an attachment is never touched here: that claim is judged by its pod (the
liveness rule); once freed, the block is released by a later run. Claims, not blocks, keep
addresses, so a released block never frees an address anyone holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import quote

from .reconcile import ApiError, KubeTarget
from .store.lease_names import GROUP, parse_time

GONE_SINCE = f"{GROUP}/owner-gone-since"

NOTED = "noted"  # the owner is gone: the note set, released after the grace
WAITING = "waiting"  # noted less than the grace ago
RELEASED = "released"  # deleted
HELD = "held"  # its record names an attachment: left to the claim's liveness
CLEARED = "cleared"  # its owner is a Node again: the note removed
LEFT = "left"  # changed or gone since the List (409/404)
ERROR = "error"


@dataclass
class BlockAction:
    name: str
    block: str
    owner: str
    action: str
    reason: str = ""

    def to_json(self) -> dict:
        return {"lease": self.name, "block": self.block, "owner": self.owner, "action": self.action,
                "reason": self.reason}


def _annotate(target: KubeTarget, block: Any, since: Optional[str]) -> None:
    """Set (or with None remove) the note on the block's Lease, re-read just now; 409 when it
    changed since the List."""
    path, body, meta = target._reread(block)
    notes = dict(meta.get("annotations") or {})
    if since is None:
        notes.pop(GONE_SINCE, None)
    else:
        notes[GONE_SINCE] = since
    meta["annotations"] = notes
    target.api.request("PUT", path, body=body)


def release_blocks_of_gone_nodes(target: KubeTarget, grace: float, dry_run: bool = False) -> list[BlockAction]:
    """One pass (see the module's docstring); the blocks acted on or waiting, each with why."""
    from .block_planner import list_nodes

    nodes = set(list_nodes(target))
    records = target.list_block_records(annotations=True)
    out: list[BlockAction] = []
    now = target.api.server_time
    for block, claim, notes in records:
        noted = parse_time(notes.get(GONE_SINCE))
        act = BlockAction(block.name, block.id, block.node, "")
        try:
            if block.node in nodes:
                if noted is None:
                    continue
                act.action, act.reason = CLEARED, f"Node {block.node} exists again"
                if not dry_run:
                    _annotate(target, block, None)
            elif claim is not None and not claim.free:
                act.action, act.reason = HELD, "its record holds a claim: judged by its pod, released once free"
            elif now is None:
                act.action, act.reason = WAITING, "the API server's answer carried no Date"
            elif noted is None:
                act.action, act.reason = NOTED, f"no Node {block.node}: released after {grace:g} s"
                if not dry_run:
                    _annotate(target, block, now.strftime("%Y-%m-%dT%H:%M:%SZ"))
            elif (now - noted).total_seconds() < grace:
                act.action = WAITING
                act.reason = f"no Node {block.node} for {int((now - noted).total_seconds())} s of {grace:g} s"
            else:
                act.action, act.reason = RELEASED, f"no Node {block.node} for {int((now - noted).total_seconds())} s"
                if not dry_run:
                    body = {"apiVersion": "v1", "kind": "DeleteOptions",
                            "preconditions": {"uid": block.uid, "resourceVersion": block.resource_version}}
                    target.api.request("DELETE", f"{target.leases}/{quote(block.name, safe='')}", body=body)
        except ApiError as err:
            if err.status in (404, 409):
                act.action, act.reason = LEFT, f"changed since listed ({err.message or err.status})"
            else:
                act.action, act.reason = ERROR, str(err)
        out.append(act)
    return out
