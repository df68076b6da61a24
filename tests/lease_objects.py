"""The Lease store's objects as a user sees them with kubectl: claims (one per address) and node
blocks. A block's record is the claim Lease of its first usable address, labelled
``rdmanet.io/block-owner``: a claim while it names an attachment (``holderIdentity``), and the
block's only object either way."""

from __future__ import annotations

OWNER = "rdmanet.io/block-owner"


def _labels(obj: dict) -> dict:
    return (obj.get("metadata") or {}).get("labels") or {}


def is_block(obj: dict) -> bool:
    return bool(_labels(obj).get(OWNER))


def holds_address(obj: dict) -> bool:
    """A claim: a Lease of an address that names an attachment (a free block record does not)."""
    return not _labels(obj).get(OWNER) or bool((obj.get("spec") or {}).get("holderIdentity"))


def claim_leases(server, namespace: str) -> list[dict]:
    return [o for o in server.objects("leases", namespace) if holds_address(o)]


def block_leases(server, namespace: str) -> list[dict]:
    return [o for o in server.objects("leases", namespace) if is_block(o)]


def block_owner(obj: dict) -> str:
    """The node holding a block (its record's ``block-owner`` annotation)."""
    notes = (obj.get("metadata") or {}).get("annotations") or {}
    return notes.get(OWNER) or ""
