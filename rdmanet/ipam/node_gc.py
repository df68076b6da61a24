"""The node-level GC of the Lease store, run by the node daemon: frees this node's claims whose
pod is gone, and claims a newer sandbox of the same pod replaced.

Why: Multus calls CNI GC only for the cluster network's delegate, and its thick plugin turns a
failed DEL into success; the DEL journal (:mod:`rdmanet.node.del_journal`) catches DELs that reached a
shim, but not those that never did (a node that rebooted, a runtime that skipped the DEL, a
journal lost with /run). So every node daemon reconciles its own claims.

What it runs is the reconciler (:mod:`rdmanet.ipam.reconcile`: by pod UID, mirror pods for static pods,
a grace period, N consecutive misses counted on the Lease itself, preconditioned deletes),
scoped to the claims labelled with this node (``rdmanet.io/node``), across every domain of each
cluster store the daemon knows of:
- the stores it served a call for since it started (``remember``, from the Lease store factory);
- the store whereabouts' flat file names at its default locations;
- ``rdmanet.kubeconfig`` that install.sh writes in DaemonSet mode, when it exists.

The node's name is ``RDMANET_NODE_NAME`` (:mod:`rdmanet.ipam.node_identity`), confirmed through
each store's API (a GET of the Node) before its run: never the hostname. Without a confirmed
Node the node GC does not run (a ``node_gc_off`` or ``node_gc_skipped`` log line says why).

Settings (the daemon's environment): ``RDMANET_NODE_GC_SECONDS`` (interval, default 120; 0 turns
it off), ``RDMANET_NODE_GC_GRACE_SECONDS`` (claims younger than this are never judged, default
300), ``RDMANET_NODE_GC_MISSES`` (default 3). With the defaults a claim of a deleted pod goes
about 4 to 6 minutes after its pod, well within a pool's life; a live pod's claim never goes.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from typing import Any, Callable, Optional

from rdmanet.cni.core.errors import IO_FAILURE, CNIError

from . import node_identity, telemetry

log = logging.getLogger("rdmanet.ipam.gc")

INTERVAL = 120.0
GRACE = 300.0
MISSES = 3
DAEMONSET_KUBECONFIG = "/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig"

_seen: dict[tuple, Any] = {}  # (kubeconfig, api_root, namespace) -> KubeSettings
_lock = threading.Lock()


def remember(settings: Any) -> None:
    """A Lease store this process served a call for (cheap: a dict insert)."""
    key = (settings.kubeconfig, settings.api_root, settings.namespace)
    if key not in _seen:
        with _lock:
            _seen[key] = settings


Say = Callable[..., None]  # (event, level="info", **fields): the daemon's structured log line


def _log(event: str, level: str = "info", **fields: Any) -> None:
    log.log(logging.WARNING if level in ("warning", "error") else logging.INFO, "%s %s", event, fields)


def known_settings(say: Say = _log) -> list[Any]:
    """Every cluster store this node's GC reaches (see the module docstring), once each."""
    from .kube_config import KubeSettings, kube_settings

    found = {}
    with _lock:
        found.update(_seen)
    candidates = [{"ipam": {"type": "lease-ipam"}}]  # whereabouts' flat file, at its default locations
    if os.path.isfile(DAEMONSET_KUBECONFIG):
        candidates.append({"ipam": {"type": "lease-ipam", "kubernetes": {"kubeconfig": DAEMONSET_KUBECONFIG}}})
    for config in candidates:
        try:
            settings = kube_settings(config)
        except CNIError as err:
            say("node_gc_config", "warning", error=err.msg)
            continue
        if isinstance(settings, KubeSettings):
            found.setdefault((settings.kubeconfig, settings.api_root, settings.namespace), settings)
    return list(found.values())


def node_name() -> Optional[str]:
    """The node name the daemon was given (``RDMANET_NODE_NAME``, else the environment file
    install.sh writes); None: none, and no node GC runs. Never the hostname."""
    return node_identity.configured().name


def run_once(node: str, grace: float = GRACE, misses: int = MISSES, say: Say = _log) -> list[Any]:
    """One pass over this node's claims in every known store whose API confirms a Node of that
    name (a store that does not is skipped, and said so); returns the reconciler's outcomes."""
    from .reconcile import KubeTarget, reconcile_target

    outcomes = []
    for settings in known_settings(say):
        try:
            target = KubeTarget.for_settings(settings, node=node)
            found = node_identity.confirm(target.api, node)
            if found.name is None:
                say("node_gc_skipped", "warning", node=node, kubeconfig=settings.kubeconfig or "in-cluster",
                    why=f"this node's name is not confirmed: {found.reason}", fix=found.fix)
                continue
            outcome = reconcile_target(target, grace_seconds=grace, misses=misses, freed_by=telemetry.NODE_GC)
            for block in release_blocks(target, node, grace):
                say("node_gc_block_released", block=block.id, node=node)
        except CNIError as err:
            say("node_gc_failed", "warning", node=node, kubeconfig=settings.kubeconfig or "in-cluster", error=err.msg)
            continue
        for action in outcome.actions:
            if action.action in ("freed", "miss", "error", "conflict"):
                c = action.claim
                say("node_gc_" + action.action, "warning" if action.action in ("error", "conflict") else "info",
                    address=c.address, pod=c.pod, container=c.container_id, ifname=c.ifname, reason=action.reason)
        outcomes.append(outcome)
    return outcomes


_empty_since: dict[str, float] = {}  # block Lease UID -> when a run first found it holding no claim


def release_blocks(target: Any, node: str, grace: float, now: Optional[float] = None) -> list[Any]:
    """Release this node's address blocks (store/kube_blocks.py) that held none of its claims in
    two runs at least ``grace`` seconds apart: the DEL that emptied a block may have been the node's last
    call, so the daemon's GC gives the block back. The delete carries uid/resourceVersion
    preconditions (a block re-acquired since is left alone); a claim made in the block meanwhile
    stays valid (claims, not blocks, keep addresses). Returns the blocks released."""
    import ipaddress

    from .reconcile import ApiError

    blocks = [b for b in target.list_blocks() if b.node == node and not b.planned]  # a plan's blocks stay while empty
    if len(_empty_since) > 65536:  # entries of blocks released elsewhere: forget them all (a run's delay)
        _empty_since.clear()
    if not blocks:
        return []
    used: dict[str, list[int]] = {}
    for c in target.list_claims():
        dhash = c.name.split("-")[1] if c.name.count("-") >= 2 else ""
        try:
            used.setdefault(dhash, []).append(int(ipaddress.ip_address(c.address)))
        except (TypeError, ValueError):
            continue
    for values in used.values():
        values.sort()
    now = time.monotonic() if now is None else now
    released = []
    for b in blocks:
        dhash = b.name.split("-")[1]
        values = used.get(dhash, [])
        i = bisect.bisect_left(values, int(b.ip))
        if i < len(values) and values[i] <= b.last:
            _empty_since.pop(b.uid, None)
            continue
        since = _empty_since.setdefault(b.uid, now)
        if now - since < grace:
            continue
        body = {"apiVersion": "v1", "kind": "DeleteOptions",
                "preconditions": {"uid": b.uid, "resourceVersion": b.resource_version}}
        try:
            target.api.request("DELETE", f"{target.leases}/{b.name}", body=body)
        except ApiError as err:
            if err.status not in (404, 409):
                raise CNIError(IO_FAILURE, f"could not release block {b.id}: {err}", "the next node GC retries") from None
        else:
            released.append(b)
        _empty_since.pop(b.uid, None)
    return released


def _setting(name: str, default: float, say: Say) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        say("node_gc_setting", "warning", name=name, value=os.environ.get(name), using=default)
        return default


def start(stop: threading.Event, say: Say = _log) -> Optional[threading.Thread]:
    """In the daemon: run every ``RDMANET_NODE_GC_SECONDS`` until ``stop`` is set (None: turned off);
    ``say`` writes the daemon's structured log lines."""
    interval = _setting("RDMANET_NODE_GC_SECONDS", INTERVAL, say)
    if interval <= 0:
        return None
    grace = _setting("RDMANET_NODE_GC_GRACE_SECONDS", GRACE, say)
    misses = max(1, int(_setting("RDMANET_NODE_GC_MISSES", MISSES, say)))
    node = node_name()
    if not node:
        say("node_gc_off", "warning", why=f"no node name: {node_identity.NODE_ENV} is set neither in the daemon's "
                                          f"environment nor in {node_identity.ENVIRONMENT_FILE}",
            fix="host mode: re-run install.sh (it writes the name of this host's Node there), or install.sh --node-name NAME")
        return None

    def loop() -> None:
        while not stop.wait(interval):
            try:
                run_once(node, grace, misses, say)
            except Exception as exc:  # noqa: BLE001 - the daemon goes on serving; the next round retries
                say("node_gc_failed", "error", node=node, error=f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=loop, name="node-gc", daemon=True)
    thread.start()
    return thread
