"""Kubernetes Events on pods, as Multus records them: a ``Warning`` for every failed ADD (the
plugin, the network, the CNI error's code, message and fix), a ``Normal`` for every address a
cleaner freed (the CNI GC verb, the node GC, the reconciler). ``kubectl describe pod`` then
says why a pod has no ``net1``, and where its address went.

- **Whose credentials.** The daemon's own, never a NAD's (a NAD is a tenant's): ``--kubeconfig``
  / ``RDMANET_KUBECONFIG`` when given, else the kubeconfig install.sh writes in DaemonSet mode for
  the pod's service account (``/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig``, the one the node GC
  uses), else the in-cluster service account, else none: no events (a host without a cluster).
  A kubeconfig is read again when it changes (install.sh rewrites it as the token rotates). RBAC:
  ``create`` on ``events``, nothing more (``deploy/rbac.yaml``): an event is never updated, so a
  repeat is a new event, which the rate limits below keep rare.
- **Never in a call's way.** A call only puts the event in a bounded queue (``QUEUED``; full:
  dropped and counted); one thread writes them, each request bounded by ``TIMEOUT`` seconds. An
  API server that is away costs the calls nothing.
- **Rate-limited.** One event per pod, reason and ``PER_POD_SECONDS`` (a pod whose ADD the
  kubelet retries gets one Warning per minute, not one per retry), and at most ``BURST`` events
  then ``RATE`` per second from this node (a node-wide outage does not turn into an event storm).
- Written as the core/v1 API validates them: in the pod's namespace, ``involvedObject`` the pod
  (with its UID), ``source`` and ``reportingComponent`` rdmanet on this node, without
  ``eventTime`` (the form ``create`` alone serves), the message cut to 1024 characters.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from rdmanet.ipam import telemetry

from .call_record import CallRecord

log = logging.getLogger("rdmanet.node.events")

KUBECONFIG_ENV = "RDMANET_KUBECONFIG"
DAEMONSET_KUBECONFIG = "/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig"
COMPONENT = "rdmanet"
ADD_FAILED, ADDRESS_FREED = "AddFailed", "AddressFreed"
QUEUED = 256
TIMEOUT = 5.0
PER_POD_SECONDS = 60.0
RATE, BURST = 1.0, 20
MAX_MESSAGE = 1024
MAX_KEYS = 65536

Result = Callable[[str, str], None]  # (reason, "written" | "rate_limited" | "dropped" | "failed")


@dataclass(frozen=True)
class PodEvent:
    namespace: str
    pod: str
    uid: Optional[str]
    type: str  # "Normal" or "Warning"
    reason: str
    message: str


def add_failed(record: CallRecord) -> Optional[PodEvent]:
    """The Warning for a failed ADD of a pod (None: not an ADD, not failed, no pod named)."""
    if record.command != "ADD" or record.ok or not record.pod_namespace or not record.pod_name:
        return None
    text = (f"{record.plugin} ADD of network {record.network or '?'} ({record.ifname or '?'}, container "
            f"{(record.container or '?')[:12]}) failed: CNI error {record.code}: {record.msg}")
    if record.details:
        text += f"; fix: {record.details}"
    return PodEvent(record.pod_namespace, record.pod_name, record.pod_uid, "Warning", ADD_FAILED, text)


def address_freed(freed: telemetry.Freed) -> Optional[PodEvent]:
    """The Normal for an address a cleaner freed (None: the claim names no pod)."""
    if not freed.pod_namespace or not freed.pod_name:
        return None
    who = {telemetry.CNI_GC: "CNI GC", telemetry.NODE_GC: "the node GC of rdmanet daemon",
           telemetry.RECONCILER: "the rdmanet reconciler"}.get(freed.by, freed.by)
    text = (f"{who} freed {freed.address} of network {freed.network or '?'} ({freed.ifname or '?'}, container "
            f"{(freed.container_id or '?')[:12]}): {freed.reason}")
    return PodEvent(freed.pod_namespace, freed.pod_name, freed.pod_uid, "Normal", ADDRESS_FREED, text)


class Credentials:
    """The daemon's API client for events, made on first use and again when its kubeconfig changes."""

    def __init__(self, kubeconfig: Optional[str] = None) -> None:
        self.kubeconfig = kubeconfig
        self._api: Any = None
        self._stamp: Any = None

    def source(self) -> Optional[str]:
        """The kubeconfig to use, "" for the in-cluster service account, None for none."""
        if self.kubeconfig:
            return self.kubeconfig
        if os.path.isfile(DAEMONSET_KUBECONFIG):
            return DAEMONSET_KUBECONFIG
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return ""
        return None

    def api(self) -> Any:
        """A ``CoreV1Api``, or None when the daemon has no credentials."""
        from kubernetes import client, config

        where = self.source()
        if where is None:
            return None
        try:
            st = os.stat(where) if where else None
        except OSError:
            st = None
        stamp = (where, st.st_ino, st.st_mtime_ns, st.st_size) if st is not None else (where,)
        if self._api is None or stamp != self._stamp:
            cfg = client.Configuration()
            if where:
                config.load_kube_config(config_file=where, client_configuration=cfg, persist_config=False)
            else:
                config.load_incluster_config(client_configuration=cfg)
            cfg.retries = False
            self._api, self._stamp = client.CoreV1Api(client.ApiClient(cfg)), stamp
        return self._api


class PodEvents:
    """The queue, the rate limits and the thread that writes the events."""

    def __init__(self, credentials: Credentials, node: str, result: Optional[Result] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.credentials = credentials
        self.node = node
        self.result = result or (lambda reason, outcome: None)
        self.clock = clock
        self._queue: "queue.Queue[Optional[PodEvent]]" = queue.Queue(QUEUED)
        self._lock = threading.Lock()
        self._last: dict[tuple, float] = {}
        self._tokens, self._filled = float(BURST), clock()
        self._thread: Optional[threading.Thread] = None
        self._failed_logged = 0.0
        self._pending = 0
        self._idle = threading.Condition(self._lock)

    # -- what the daemon hands in (never blocks) ----------------------------------------------

    def observe(self, record: CallRecord) -> None:
        self.emit(add_failed(record))

    def freed(self, freed: telemetry.Freed) -> None:
        self.emit(address_freed(freed))

    def emit(self, event: Optional[PodEvent]) -> None:
        if event is None or self.credentials.source() is None:  # no cluster to tell
            return
        key = (event.namespace, event.pod, event.uid, event.reason)
        now = self.clock()
        with self._lock:
            if now - self._last.get(key, -PER_POD_SECONDS) < PER_POD_SECONDS or not self._take(now):
                limited = True
            else:
                limited = False
                if len(self._last) >= MAX_KEYS:
                    self._last = {k: t for k, t in self._last.items() if now - t < PER_POD_SECONDS}
                self._last[key] = now
                self._pending += 1
        if limited:
            self.result(event.reason, "rate_limited")
            return
        self._start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self._done()
            self.result(event.reason, "dropped")

    def _take(self, now: float) -> bool:
        self._tokens = min(float(BURST), self._tokens + (now - self._filled) * RATE)
        self._filled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    # -- the writer ----------------------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pod-events", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                self.result(event.reason, "written" if self._write(event) else "failed")
            finally:
                self._done()

    def _done(self) -> None:
        with self._lock:
            self._pending -= 1
            self._idle.notify_all()

    def _write(self, event: PodEvent) -> bool:
        try:
            api = self.credentials.api()
            if api is None:
                return False
            api.create_namespaced_event(event.namespace, body(event, self.node), _request_timeout=(TIMEOUT, TIMEOUT),
                                        _preload_content=False).release_conn()
            return True
        except Exception as exc:  # noqa: BLE001 - an event is best effort: log now and then, go on
            now = self.clock()
            if now - self._failed_logged > 60.0:
                self._failed_logged = now
                log.warning("cannot write the %s event on pod %s/%s: %s", event.reason, event.namespace, event.pod,
                            getattr(exc, "reason", None) or exc)
            return False

    def flush(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until the queued events are written; True if they are."""
        end = self.clock() + timeout
        with self._lock:
            while self._pending > 0:
                left = end - self.clock()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True


def body(event: PodEvent, node: str) -> dict:
    """The core/v1 Event (the legacy form: no eventTime, so ``create`` alone is enough)."""
    now = datetime.now(timezone.utc)
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": "v1", "kind": "Pod", "namespace": event.namespace, "name": event.pod}
    if event.uid:
        involved["uid"] = event.uid
    message = event.message if len(event.message) <= MAX_MESSAGE else event.message[:MAX_MESSAGE - 3] + "..."
    name = f"{event.pod[:200]}.{time.time_ns():x}"
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": event.namespace},
            "involvedObject": involved, "reason": event.reason, "message": message, "type": event.type,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "source": {"component": COMPONENT, **({"host": node} if node else {})},
            "reportingComponent": COMPONENT, "reportingInstance": node or ""}
