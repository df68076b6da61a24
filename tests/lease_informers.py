"""The daemon's Lease informers as the block tests look at them: one node's informer, and a wait
for what its watch is about to deliver."""

from __future__ import annotations

import time

from rdmanet.ipam.store import lease_cache


def informer_of(node: str):
    """The one informer of ``node``'s own objects (node-scoped watch)."""
    [inf] = [i for i in lease_cache.informers() if i.name.endswith("/" + node)]
    return inf


def wait_until(predicate, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)
