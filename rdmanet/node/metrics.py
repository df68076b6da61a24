"""The node daemon's Prometheus metrics (``prometheus_client``), on ``--metrics-port``.

Off unless a port is given (``rdmanet daemon --metrics-port N`` or ``RDMANET_METRICS_PORT``); the
address defaults to 127.0.0.1 (``--metrics-address`` / ``RDMANET_METRICS_ADDRESS``), so a host
install exposes nothing unless asked. The DaemonSet sets the port and binds the pod's IP, which
with hostNetwork is the node's: Prometheus scrapes it there, as it scrapes Multus thick's.

Per call (from the daemon's call records, :mod:`rdmanet.node.call_record`):

- ``rdmanet_cni_calls_total{plugin, command, code}``: ``code`` is the CNI error code, 0 on success;
- ``rdmanet_cni_call_duration_seconds{plugin, command}``: from the accept to the answer.

At each scrape, from what the process holds (no API request, no lock wait: :mod:`rdmanet.ipam.usage`):

- ``rdmanet_ipam_addresses_in_use{network, range, store}`` and ``rdmanet_ipam_addresses_free``:
  every lease-ipam network the daemon served (local store: the store's count; Lease store: this
  node's claims, and the free addresses of the blocks it holds);
- ``rdmanet_ipam_blocks_owned{network}``: the node blocks this node holds (Lease store);
- ``rdmanet_ipam_addresses_freed_total{by}``: claims freed by the CNI GC verb (``cni-gc``), the
  node GC (``node-gc``), the reconciler (``reconciler``);
- ``rdmanet_del_journal_entries``: DELs journaled by the shims, waiting for their replay;
- ``rdmanet_kube_api_requests_total{method, code}`` (``code`` ``unreachable`` when no answer
  came) and ``rdmanet_kube_api_errors_total{method, code}`` (unreachable, 401, 403, 429, 5xx:
  the answers that are not lease-ipam's protocol, where 404 and 409 are);
- ``rdmanet_lease_watch_restarts_total{reason}``: Lease watches that ended other than by their
  timeout (``expired``: 410 and a re-List; ``broken``; ``error``);
- ``rdmanet_pod_events_total{reason, result}``: pod events written, dropped by the rate limit,
  or failed (:mod:`rdmanet.node.pod_events`);
- the process's own (``process_*``: CPU, memory, fds).
"""

from __future__ import annotations

import os
import socket
import threading
from collections import OrderedDict
from typing import Any, Iterable, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rdmanet.cni.core import env as request_env
from rdmanet.cni.linux.roots import POLICY_ENV
from rdmanet.ipam import node_identity, telemetry

from .call_record import CallRecord

PORT_ENV, ADDRESS_ENV = "RDMANET_METRICS_PORT", "RDMANET_METRICS_ADDRESS"
DEFAULT_ADDRESS = "127.0.0.1"
DAEMONSET_PORT = 9731  # what deploy/daemonset.yaml declares
# a call is ~3 ms through the daemon; a Lease-store ADD waits for the API server; the deadline is 50 s
DURATION_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0)
MAX_NETWORKS = 256  # networks whose usage a scrape reports (the most recently served)
ERROR_CODES = {"401", "403", "429"}


def _ipam_type(config: Any) -> Optional[str]:
    ipam = config.get("ipam") if isinstance(config, dict) else None
    return ipam.get("type") if isinstance(ipam, dict) else None


class DaemonMetrics:
    """The daemon's registry: :meth:`observe` each call record; :meth:`serve` the HTTP endpoint."""

    def __init__(self, journal_dir: str) -> None:
        self.journal_dir = journal_dir
        self.registry = CollectorRegistry()
        self.calls = Counter("rdmanet_cni_calls", "CNI calls served by the daemon, by plugin, command and CNI "
                             "result code (0: success)", ["plugin", "command", "code"], registry=self.registry)
        self.duration = Histogram("rdmanet_cni_call_duration_seconds", "CNI call duration in the daemon, from the "
                                  "accept to the answer", ["plugin", "command"], buckets=DURATION_BUCKETS,
                                  registry=self.registry)
        self.events = Counter("rdmanet_pod_events", "Pod events, by reason and result (written, rate_limited, "
                              "dropped, failed)", ["reason", "result"], registry=self.registry)
        self._networks: OrderedDict[tuple, tuple[dict, str, Optional[str]]] = OrderedDict()
        self._lock = threading.Lock()
        ProcessCollector(registry=self.registry)
        self.registry.register(_Scraped(self))
        self.server: Any = None

    def observe(self, record: CallRecord) -> None:
        self.calls.labels(record.plugin, record.command, str(record.code)).inc()
        self.duration.labels(record.plugin, record.command).observe(record.seconds)
        if record.ok and record.command in ("ADD", "CHECK", "DEL") and _ipam_type(record.config) == "lease-ipam":
            # as the Lease store names the node (store/kube.py)
            node = record.node or node_identity.configured().name or socket.gethostname()
            key = (record.network, node, record.policy)
            with self._lock:
                self._networks[key] = (record.config, node, record.policy)
                self._networks.move_to_end(key)
                while len(self._networks) > MAX_NETWORKS:
                    self._networks.popitem(last=False)

    def event(self, reason: str, result: str) -> None:
        self.events.labels(reason, result).inc()

    def networks(self) -> list[tuple[dict, str, Optional[str]]]:
        with self._lock:
            return list(self._networks.values())

    def serve(self, address: str, port: int) -> None:
        """Serve ``/metrics`` on ``address:port`` in a thread of its own; OSError when it cannot bind."""
        self.server, _ = start_http_server(port, addr=address, registry=self.registry)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class _Scraped:
    """What is read at each scrape: usage per network, cleaners' frees, API requests, watches,
    the DEL journal."""

    def __init__(self, metrics: DaemonMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # computed at collect time; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        yield from self._usage()
        snap = telemetry.snapshot()
        freed = CounterMetricFamily("rdmanet_ipam_addresses_freed", "Claims freed by a cleaner: the CNI GC verb, "
                                    "the node GC, the reconciler", labels=["by"])
        for by in (telemetry.CNI_GC, telemetry.NODE_GC, telemetry.RECONCILER):
            freed.add_metric([by], snap.freed.get(by, 0))
        yield freed
        requests = CounterMetricFamily("rdmanet_kube_api_requests", "Requests to the Kubernetes API server, by "
                                       "method and HTTP status (unreachable: no answer)", labels=["method", "code"])
        errors = CounterMetricFamily("rdmanet_kube_api_errors", "Requests to the Kubernetes API server that failed: "
                                     "no answer, 401, 403, 429, 5xx", labels=["method", "code"])
        for (method, code), count in sorted(snap.requests.items()):
            requests.add_metric([method, code], count)
            if code == telemetry.UNREACHABLE or code in ERROR_CODES or code.startswith("5"):
                errors.add_metric([method, code], count)
        yield requests
        yield errors
        restarts = CounterMetricFamily("rdmanet_lease_watch_restarts", "Lease watches that ended other than by "
                                       "their timeout (expired: 410 and a re-List; broken; error)", labels=["reason"])
        for reason in ("expired", "broken", "error"):
            restarts.add_metric([reason], snap.restarts.get(reason, 0))
        yield restarts
        yield GaugeMetricFamily("rdmanet_del_journal_entries", "DELs the shims journaled, waiting for the daemon's "
                                "replay", value=self._journal_depth())

    def _usage(self) -> Iterable[Metric]:
        from rdmanet.ipam.usage import network_usage

        in_use = GaugeMetricFamily("rdmanet_ipam_addresses_in_use", "Addresses in use per network and range "
                                   "(Lease store: this node's claims)", labels=["network", "range", "store"])
        free = GaugeMetricFamily("rdmanet_ipam_addresses_free", "Free addresses per network and range (Lease "
                                 "store: in the blocks this node holds)", labels=["network", "range", "store"])
        blocks = GaugeMetricFamily("rdmanet_ipam_blocks_owned", "Node blocks this node holds", labels=["network"])
        seen = set()
        for config, node, policy in self.metrics.networks():
            name = str(config.get("name") or "")
            try:
                with request_env.scoped({POLICY_ENV: policy} if policy else {}):
                    usage = network_usage(config, node)
            except Exception:  # noqa: BLE001 - a config that no longer loads, an unreadable store: not reported
                continue
            if usage is None or (name, usage.ranges) in seen:
                continue
            seen.add((name, usage.ranges))
            for described, used, left in zip(usage.ranges, usage.used, usage.free):
                in_use.add_metric([name, described, usage.store], used)
                free.add_metric([name, described, usage.store], left)
            if usage.blocks is not None:
                blocks.add_metric([name], usage.blocks)
        yield in_use
        yield free
        yield blocks

    def _journal_depth(self) -> int:
        try:
            return sum(1 for name in os.listdir(self.metrics.journal_dir)
                       if name.endswith(".del") and not name.startswith("."))
        except OSError:
            return 0


def address_and_port(port: Optional[int], address: Optional[str], environ=os.environ) -> tuple[str, int]:
    """The metrics endpoint from the flags, else the environment; port 0: off."""
    if port is None:
        raw = environ.get(PORT_ENV, "").strip()
        try:
            port = int(raw) if raw else 0
        except ValueError:
            raise ValueError(f"{PORT_ENV}={raw!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics port {port} is not a port number (1-65535; 0: off)")
    return (address or environ.get(ADDRESS_ENV, "").strip() or DEFAULT_ADDRESS), port
