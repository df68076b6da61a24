"""The Lease store's objects as a user sees them with kubectl: claims (one per address) and
node blocks (``rdmanet.io/kind=block``), told apart by their label."""

from __future__ import annotations

KIND = "rdmanet.io/kind"


def is_block(obj: dict) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(KIND) == "block"


def claim_leases(server, namespace: str) -> list[dict]:
    return [o for o in server.objects("leases", namespace) if not is_block(o)]


def block_leases(server, namespace: str) -> list[dict]:
    return [o for o in server.objects("leases", namespace) if is_block(o)]
