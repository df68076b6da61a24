"""What lease-ipam did in this process, for whoever hosts it: the node daemon turns it into
Prometheus metrics and pod events (rdmanet.node), the CLI's reconciler into events.

- ``api_request``: every request to the API server through the official client's transport
  (``store/kube_transport.py``: the daemon's and the CLI's), by method and HTTP status, or
  ``"unreachable"`` when none came back;
- ``watch_restart``: a Lease watch that ended other than by its own timeout (``store/lease_cache.py``:
  410 Expired and a re-List, a broken stream, a refused or failed request);
- ``freed``: every claim a cleaner freed (the CNI GC verb, the node GC, the reconciler), with the
  pod it belonged to; listeners (``on_freed``) hear each one, in the cleaner's thread, and must
  not block it.

Counting is a dict update under a lock: nothing here slows a verb.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Optional

CNI_GC, NODE_GC, RECONCILER = "cni-gc", "node-gc", "reconciler"
UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Freed:
    """One claim a cleaner freed."""

    by: str  # CNI_GC, NODE_GC or RECONCILER
    address: str
    network: str
    container_id: str
    ifname: str
    pod_namespace: Optional[str]
    pod_name: Optional[str]
    pod_uid: Optional[str]
    node: Optional[str]
    reason: str


_lock = threading.Lock()
_requests: Counter = Counter()  # (method, status or UNREACHABLE)
_restarts: Counter = Counter()  # reason
_freed: Counter = Counter()  # by
_listeners: list[Callable[[Freed], None]] = []


def api_request(method: str, status: Optional[int]) -> None:
    with _lock:
        _requests[(method, UNREACHABLE if status is None else str(status))] += 1


def watch_restart(reason: str) -> None:
    with _lock:
        _restarts[reason] += 1


def freed(claim: Freed) -> None:
    with _lock:
        _freed[claim.by] += 1
        listeners = list(_listeners)
    for listener in listeners:
        listener(claim)


def on_freed(listener: Callable[[Freed], None]) -> None:
    with _lock:
        _listeners.append(listener)


def remove_listener(listener: Callable[[Freed], None]) -> None:
    with _lock:
        if listener in _listeners:
            _listeners.remove(listener)


@dataclass(frozen=True)
class Snapshot:
    requests: dict  # (method, status) -> count
    restarts: dict  # reason -> count
    freed: dict  # by -> count


def snapshot() -> Snapshot:
    with _lock:
        return Snapshot(dict(_requests), dict(_restarts), dict(_freed))
