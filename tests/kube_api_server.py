"""A small, in-process fake Kubernetes API server for tests and benchmarks.

It speaks enough of the real apiserver's HTTP/JSON API that the official
``kubernetes`` Python client works against it unmodified:

* ``coordination.k8s.io/v1`` leases
  (``/apis/coordination.k8s.io/v1/namespaces/{ns}/leases[/{name}]`` and
  ``/apis/coordination.k8s.io/v1/leases``)
* core ``v1`` pods (``/api/v1/namespaces/{ns}/pods[/{name}]`` and
  ``/api/v1/pods``)
* core ``v1`` nodes (``/api/v1/nodes[/{name}]``; cluster-scoped, made by ``add_node()`` or a
  create)
* core ``v1`` events (``/api/v1/namespaces/{ns}/events[/{name}]`` and ``/api/v1/events``),
  validated as the apiserver validates a core/v1 Event (``involvedObject.namespace`` is the
  event's namespace, ...)
* whereabouts' ``whereabouts.cni.cncf.io/v1alpha1`` ippools and overlappingrangeipreservations
  (namespaced), as if its CRDs were installed

Verbs: create (POST), get, list, watch (``?watch=true``, chunked stream),
update (PUT, optimistic concurrency on ``metadata.resourceVersion``), patch
(JSON patch / merge patch / strategic merge patch treated as merge patch),
delete (with ``preconditions``) and deletecollection.

Namespaces: a new server has ``NAMESPACES``; creating in another one is 404 (``add_namespace()``
or a create of the Namespace makes one; ``POST /api/v1/namespaces``, 409 for one that exists). A pod's status on create is the server's (``Pending``); a pod bound to a node is
deleted gracefully (``deletionTimestamp``, stays until a delete with ``gracePeriodSeconds: 0``, as
its kubelet confirms), an unbound one at once. A Lease's MicroTime needs its 6 fractional digits.

Metadata is filled like the apiserver does it: ``uid`` (uuid4), one global
increasing ``resourceVersion`` counter, RFC3339 ``creationTimestamp``,
``namespace``.  Errors are ``Status`` objects with the real reasons
(``AlreadyExists``, ``NotFound``, ``Conflict``, ``Invalid``, ``BadRequest``,
``Expired``, ``TooManyRequests``, ``InternalError`` ...).

Usage in tests::

    from kube_api_server import KubeAPIServer, write_kubeconfig

    with KubeAPIServer() as server:
        write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace="ns")
        cfg = kubernetes.client.Configuration(host=server.url)
        api = kubernetes.client.CoordinationV1Api(kubernetes.client.ApiClient(cfg))
        ...
        server.counts()[("create", "leases")]

Test controls (all thread-safe): ``counts()``, ``reset_counts()``,
``request_log()``, ``inject_latency()``, ``fail_next()``, ``fail_rate()``,
``clear_faults()``, ``add_namespace()``, ``add_pod()``, ``delete_pod()``, ``add_node()``, ``delete_node()``, ``objects()``,
``get_object()``, ``compact()``, ``resource_version``, ``pause_watches()``,
``resume_watches()``, ``drop_watches()``, ``active_watches``.

Watch semantics (as the apiserver's watch cache serves them): ``?watch=true&resourceVersion=N``
streams one JSON event per line (``ADDED``/``MODIFIED``/``DELETED``) for every change after N
that the label/field selectors match (an object leaving the selection is a ``DELETED``, one
entering it an ``ADDED``); with ``allowWatchBookmarks=true`` a ``BOOKMARK`` carrying only
``metadata.resourceVersion`` every ``bookmark_interval`` seconds; ``timeoutSeconds`` ends the
stream cleanly. The event history is bounded (``max_events``; ``compact()`` drops it): a watch
from an older resourceVersion gets HTTP 200 and one ``ERROR`` event whose object is a
``Status`` with code 410, reason ``Expired`` ("too old resource version"), then the end of the
stream. ``pause_watches()`` holds events (and bookmarks) back from every stream, as a lagging
watch would, until ``resume_watches()``; ``drop_watches()`` cuts every open stream without the
terminating chunk (a broken connection). Watch requests are counted as ``("watch", resource)``.

The same controls are reachable over HTTP for other processes (not counted):
``GET /_control/counts``, ``POST /_control/reset_counts``,
``POST /_control/fail_next`` ``{"n", "status", "retry_after", "verb", "resource"}``,
``POST /_control/fail_rate`` ``{"p", "status", "retry_after", "verb", "resource"}``,
``POST /_control/latency`` ``{"seconds"}``, ``POST /_control/clear_faults``,
``GET /_control/objects/{resource}``, ``POST /_control/pods``
``{"namespace", "name", "uid", "node", "labels"}``,
``DELETE /_control/pods/{namespace}/{name}``, ``POST /_control/nodes`` ``{"name", "labels"}``,
``DELETE /_control/nodes/{name}``, ``POST /_control/watches`` ``{"paused"}``,
``POST /_control/drop_watches``.

In-process access (benchmarks simulating thousands of clients in one process, no HTTP):
``handle(method, path, query, body_bytes, client)`` serves one request (a watch answers an
:class:`InProcessWatch` whose ``lines()`` yield the event lines); :class:`InProcessApiClient`
puts it under ``rdmanet.ipam.store.kube.ApiClientTransport`` in place of the ``kubernetes`` ApiClient.
Bodies are real JSON bytes. ``client_stats()`` counts per client: requests by verb, bytes in and
out, watch events and bytes delivered (HTTP requests too, under the ``X-Rdmanet-Client`` header,
else ``http``). In-process watches with the same selectors form one group, indexed by one of the
selector's ``key=value`` requirements, so delivering an event costs one match per group whose
indexed label the object carries, not one per watch; ``hold_watch()`` registers a watch nobody
reads (still counted per event); ``restart_watches()`` drops history and every stream.

Run standalone: ``python tests/kube_api_server.py --port 8080 [--kubeconfig PATH]``.
"""

from __future__ import annotations

import argparse
import base64
import bisect
import copy
import datetime as _dt
import email.utils
import json
import random
import re
import select
import socket
import socketserver
import ssl
import sys
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = [
    "RESOURCES",
    "KubeAPIServer",
    "ResourceType",
    "parse_field_selector",
    "parse_label_selector",
    "write_kubeconfig",
]


# --------------------------------------------------------------------------
# Resource types
# --------------------------------------------------------------------------


class ResourceType:
    def __init__(self, plural: str, kind: str, group: str, version: str,
                 fields: dict[str, Callable[[dict], str]], key: str | None = None,
                 status_subresource: bool = False, subresource: str = ""):
        self.plural = plural
        self.kind = kind
        self.group = group
        self.version = version
        self.fields = fields  # supported fieldSelector fields
        self.key = key or plural  # where its objects are kept (RESOURCES' key: two groups may share a plural)
        # a custom resource with the status subresource: a create or update of the object keeps
        # the status the server has, and only a write of ``<name>/status`` (``subresource``) changes it
        self.status_subresource = status_subresource
        self.subresource = subresource

    def status(self) -> "ResourceType":
        """The ``/status`` subresource of this type (same objects, same plural in the counts)."""
        return ResourceType(self.plural, self.kind, self.group, self.version, self.fields, self.key,
                            self.status_subresource, "status")

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``leases.coordination.k8s.io`` / ``pods`` as used in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


def _meta_field(key: str) -> Callable[[dict], str]:
    return lambda o: str(o.get("metadata", {}).get(key) or "")


def _path_field(*keys: str) -> Callable[[dict], str]:
    def get(o: dict) -> str:
        cur: Any = o
        for k in keys:
            if not isinstance(cur, dict):
                return ""
            cur = cur.get(k)
        return "" if cur is None else str(cur)
    return get


RESOURCES: dict[str, ResourceType] = {
    "leases": ResourceType(
        "leases", "Lease", "coordination.k8s.io", "v1",
        {"metadata.name": _meta_field("name"),
         "metadata.namespace": _meta_field("namespace")}),
    "pods": ResourceType(
        "pods", "Pod", "", "v1",
        {"metadata.name": _meta_field("name"),
         "metadata.namespace": _meta_field("namespace"),
         "metadata.uid": _meta_field("uid"),
         "spec.nodeName": _path_field("spec", "nodeName"),
         "spec.serviceAccountName": _path_field("spec", "serviceAccountName"),
         "spec.restartPolicy": _path_field("spec", "restartPolicy"),
         "spec.schedulerName": _path_field("spec", "schedulerName"),
         "status.phase": _path_field("status", "phase"),
         "status.podIP": _path_field("status", "podIP"),
         "status.nominatedNodeName": _path_field("status", "nominatedNodeName")}),
    "nodes": ResourceType(
        "nodes", "Node", "", "v1",
        {"metadata.name": _meta_field("name")}),
    "namespaces": ResourceType(
        "namespaces", "Namespace", "", "v1",
        {"metadata.name": _meta_field("name")}),
    "events": ResourceType(
        "events", "Event", "", "v1",
        {"metadata.name": _meta_field("name"),
         "metadata.namespace": _meta_field("namespace"),
         "involvedObject.kind": _path_field("involvedObject", "kind"),
         "involvedObject.namespace": _path_field("involvedObject", "namespace"),
         "involvedObject.name": _path_field("involvedObject", "name"),
         "involvedObject.uid": _path_field("involvedObject", "uid"),
         "reason": _path_field("reason"),
         "type": _path_field("type"),
         "source": _path_field("source", "component")}),
}

# whereabouts' CRDs (lease-ipam reads them while a cluster migrates from whereabouts)
for _plural, _kind in (("ippools", "IPPool"), ("overlappingrangeipreservations", "OverlappingRangeIPReservation")):
    RESOURCES[_plural] = ResourceType(_plural, _kind, "whereabouts.cni.cncf.io", "v1alpha1",
                                      {"metadata.name": _meta_field("name"),
                                       "metadata.namespace": _meta_field("namespace")})

# nv-ipam's CRDs (lease-ipam reads a NAD's poolName from them): the same plural as whereabouts'
# IPPool, another group; their status is a subresource (nv-ipam's controller writes it)
for _plural, _kind in (("ippools", "IPPool"), ("cidrpools", "CIDRPool")):
    RESOURCES[f"{_plural}.nv-ipam.nvidia.com"] = ResourceType(
        _plural, _kind, "nv-ipam.nvidia.com", "v1alpha1",
        {"metadata.name": _meta_field("name"), "metadata.namespace": _meta_field("namespace")},
        key=f"{_plural}.nv-ipam.nvidia.com", status_subresource=True)

# The namespaces a new server has: the system ones and those this project's tests use. An object
# in any other namespace is refused (404, as the apiserver's NamespaceLifecycle admission) until a
# test makes it (add_namespace()); add_pod() makes its own.
NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease",
              "ipam", "rdmanet-ipam", "rdmanet-system", "ns-a", "db", "ctx-ns", "nvidia-network-operator")

_MICROTIME_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")

_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
    405: "MethodNotAllowed", 406: "NotAcceptable", 409: "Conflict", 410: "Expired",
    415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests",
    500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout",
}
_PHRASES = {
    200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized",
    403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed", 409: "Conflict",
    410: "Gone", 415: "Unsupported Media Type", 422: "Unprocessable Entity",
    429: "Too Many Requests", 500: "Internal Server Error",
    503: "Service Unavailable", 504: "Gateway Timeout",
}


class ApiError(Exception):
    """Raised inside the server to produce a Status response."""

    def __init__(self, code: int, message: str, reason: str | None = None,
                 details: dict | None = None, headers: dict | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details
        self.headers = headers or {}

    def status(self) -> dict:
        st = {"kind": "Status", "apiVersion": "v1", "metadata": {},
              "status": "Failure", "message": self.message,
              "reason": self.reason, "code": self.code}
        if self.details is not None:
            st["details"] = self.details
        return st


def _details(rt: ResourceType, name: str | None, kind: str | None = None, **extra) -> dict:
    d: dict[str, Any] = {}
    if name:
        d["name"] = name
    if rt.group:
        d["group"] = rt.group
    d["kind"] = kind or rt.plural
    d.update(extra)
    return d


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN_RE = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_QUALIFIED_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric "
                  "characters, '-' or '.', and must start and end with an alphanumeric "
                  "character (e.g. 'example.com', regex used for validation is "
                  "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")


def _subdomain_errors(value: str) -> list[str]:
    errs = []
    if len(value) > 253:
        errs.append("must be no more than 253 characters")
    if not _DNS1123_SUBDOMAIN_RE.match(value):
        errs.append(_SUBDOMAIN_MSG)
    return errs


def _label_key_errors(key: str) -> list[str]:
    errs = []
    prefix, _, name = key.rpartition("/")
    if "/" in key:
        if not prefix:
            errs.append("prefix part must be non-empty")
        else:
            errs += ["prefix part " + e for e in _subdomain_errors(prefix)]
    if not name:
        errs.append("name part must be non-empty")
    else:
        if len(name) > 63:
            errs.append("name part must be no more than 63 characters")
        if not _QUALIFIED_NAME_RE.match(name):
            errs.append("name part must consist of alphanumeric characters, '-', '_' or '.', "
                        "and must start and end with an alphanumeric character")
    return errs


def _label_value_errors(value: Any) -> list[str]:
    if not isinstance(value, str):
        return ["must be a string"]
    errs = []
    if len(value) > 63:
        errs.append("must be no more than 63 characters")
    if not _LABEL_VALUE_RE.match(value):
        errs.append("a valid label must be an empty string or consist of alphanumeric "
                    "characters, '-', '_' or '.', and must start and end with an "
                    "alphanumeric character")
    return errs


def _decode_times(rt: ResourceType, obj: dict) -> None:
    """A Lease's MicroTime fields take RFC 3339 with exactly 6 fractional digits; anything else
    fails decoding (400, before validation), as the apiserver's JSON decoder does."""
    if rt.plural != "leases":
        return
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    for field in ("acquireTime", "renewTime"):
        value = spec.get(field)
        if value is not None and not (isinstance(value, str) and _MICROTIME_RE.match(value)):
            raise ApiError(400, f'Lease in version "v1" cannot be handled as a Lease: v1.Lease.Spec: '
                                f'v1.LeaseSpec.{field[0].upper()}{field[1:]}: parsing time {json.dumps(value)} '
                                f'as "2006-01-02T15:04:05.000000Z07:00"')


def _validate(rt: ResourceType, obj: dict) -> None:
    """Raise 422 Invalid with causes, like the apiserver's validation."""
    meta = obj.get("metadata") or {}
    name = meta.get("name") or ""
    causes: list[dict] = []

    def bad(field: str, value: Any, msg: str, reason: str = "FieldValueInvalid") -> None:
        if reason == "FieldValueRequired":
            causes.append({"reason": reason, "message": f"Required value: {msg}", "field": field})
        else:
            causes.append({"reason": reason,
                           "message": f"Invalid value: {json.dumps(value)}: {msg}",
                           "field": field})

    if not name:
        bad("metadata.name", name, "name or generateName is required", "FieldValueRequired")
    else:
        for e in _subdomain_errors(name):
            bad("metadata.name", name, e)
    for key, value in (meta.get("labels") or {}).items():
        for e in _label_key_errors(key):
            bad("metadata.labels", key, e)
        for e in _label_value_errors(value):
            bad("metadata.labels", value, e)
    ann = meta.get("annotations") or {}
    for key, value in ann.items():
        for e in _label_key_errors(key):
            bad("metadata.annotations", key, e)
        if not isinstance(value, str):
            bad("metadata.annotations", value, "must be a string")
    if rt.plural == "leases":
        spec = obj.get("spec") or {}
        lds = spec.get("leaseDurationSeconds")
        if lds is not None and (not isinstance(lds, int) or lds <= 0):
            bad("spec.leaseDurationSeconds", lds, "must be greater than 0")
        lt = spec.get("leaseTransitions")
        if lt is not None and (not isinstance(lt, int) or lt < 0):
            bad("spec.leaseTransitions", lt, "must be greater than or equal to 0")
    if rt.plural == "pods":
        containers = (obj.get("spec") or {}).get("containers")
        if not containers:
            bad("spec.containers", None, "", "FieldValueRequired")
    if rt.plural == "events":
        _validate_event(obj, meta, bad)
    if causes:
        text = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
        if len(causes) > 1:
            text = f"[{text}]"
        raise ApiError(422, f'{rt.kind}{"." + rt.group if rt.group else ""} "{name}" is invalid: {text}',
                       details=_details(rt, name, kind=rt.kind, causes=causes))


def _validate_event(obj: dict, meta: dict, bad: Callable[..., None]) -> None:
    """core/v1 Event as the apiserver's event validation has it for a core/v1 request: without
    ``eventTime`` (the legacy form) ``involvedObject.namespace`` must be the event's namespace
    (or, for an object without one, the event is in "" or default); with ``eventTime`` it also
    needs ``reportingComponent``, ``reportingInstance``, ``action`` and ``reason`` within their
    lengths. ``type``, when set, is Normal or Warning."""
    involved = obj.get("involvedObject") if isinstance(obj.get("involvedObject"), dict) else {}
    ns, ins = meta.get("namespace") or "", involved.get("namespace") or ""
    if not obj.get("eventTime"):
        if (ins and ins != ns) or (not ins and ns not in ("", "default")):
            bad("involvedObject.namespace", ins, "does not match event.namespace")
    else:
        if not ins and ns not in ("default", "kube-system"):
            bad("involvedObject.namespace", ins, "does not match event.namespace")
        for key, limit in (("reportingComponent", 253), ("reportingInstance", 128), ("action", 128), ("reason", 128)):
            if not obj.get(key):
                bad(key, "", "", "FieldValueRequired")
            elif len(str(obj[key])) > limit:
                bad(key, "", f"can have at most {limit} characters")
        if len(str(obj.get("message") or "")) > 1024:
            bad("message", "", "can have at most 1024 characters")
    if obj.get("type") not in (None, "", "Normal", "Warning"):
        bad("type", obj.get("type"), 'supported values: "Normal", "Warning"', "FieldValueNotSupported")


# --------------------------------------------------------------------------
# Selectors
# --------------------------------------------------------------------------


def _split_top_level(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


_SET_RE = re.compile(r"^\s*([^\s!=<>(),]+)\s+(in|notin)\s*\(([^()]*)\)\s*$")
_OP_RE = re.compile(r"^\s*([^\s!=<>(),]+)\s*(==|!=|=|>|<)\s*([^\s!=<>(),]*)\s*$")
_EXISTS_RE = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s*$")

Matcher = Callable[[dict], bool]


def parse_label_selector(selector: str | None) -> Matcher:
    """Parse a Kubernetes label selector into a predicate over a labels dict.

    Supports ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x,y)``,
    ``a``, ``!a``, ``a>1``, ``a<1``; comma means AND.  Raises ``ValueError``.
    """
    if selector is None or not selector.strip():
        return lambda labels: True
    reqs: list[Matcher] = []
    for part in _split_top_level(selector):
        if not part.strip():
            raise ValueError(f"unable to parse requirement: empty requirement in {selector!r}")
        m = _SET_RE.match(part)
        if m:
            key, op, vals = m.group(1), m.group(2), m.group(3)
            values = {v.strip() for v in vals.split(",") if v.strip()}
            if not values:
                raise ValueError(f"for '{op}' operator, values set can't be empty")
            if op == "in":
                reqs.append(lambda l, k=key, vs=values: k in l and l[k] in vs)
            else:
                reqs.append(lambda l, k=key, vs=values: k not in l or l[k] not in vs)
            continue
        m = _OP_RE.match(part)
        if m:
            key, op, val = m.groups()
            if op in ("=", "=="):
                reqs.append(lambda l, k=key, v=val: k in l and l[k] == v)
            elif op == "!=":
                reqs.append(lambda l, k=key, v=val: k not in l or l[k] != v)
            else:
                try:
                    num = int(val)
                except ValueError:
                    raise ValueError(f"for '{op}' operator, the value must be an integer") from None

                def cmp(l, k=key, n=num, gt=(op == ">")):
                    try:
                        x = int(l[k])
                    except (KeyError, ValueError):
                        return False
                    return x > n if gt else x < n
                reqs.append(cmp)
            continue
        m = _EXISTS_RE.match(part)
        if m:
            neg, key = m.groups()
            if neg:
                reqs.append(lambda l, k=key: k not in l)
            else:
                reqs.append(lambda l, k=key: k in l)
            continue
        raise ValueError(f"unable to parse requirement: {part.strip()!r}")
    return lambda labels: all(r(labels) for r in reqs)


def parse_field_selector(selector: str | None, rt: ResourceType) -> Matcher:
    """Parse a field selector (``f=v``, ``f==v``, ``f!=v``, comma = AND) for ``rt``."""
    if selector is None or not selector.strip():
        return lambda obj: True
    reqs: list[Matcher] = []
    for part in selector.split(","):
        m = re.match(r"^\s*([^=!\s]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not m:
            raise ValueError(f"invalid field selector requirement: {part!r}")
        field, op, val = m.groups()
        getter = rt.fields.get(field)
        if getter is None:
            raise ValueError(f'field label not supported: {field}')
        if op == "!=":
            reqs.append(lambda o, g=getter, v=val: g(o) != v)
        else:
            reqs.append(lambda o, g=getter, v=val: g(o) == v)
    return lambda obj: all(r(obj) for r in reqs)


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


_clock_offset = [0.0]  # seconds the servers' clock is ahead of this machine's (:meth:`KubeAPIServer.advance_clock`)


def _server_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC) + _dt.timedelta(seconds=_clock_offset[0])


def _now_rfc3339() -> str:
    return _server_now().strftime("%Y-%m-%dT%H:%M:%SZ")


def _http_date() -> str:
    """The ``Date`` header: the server's time, as every apiserver answer carries it."""
    return email.utils.format_datetime(_server_now().replace(microsecond=0), usegmt=True)


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (null removes a key)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = _merge_patch(result.get(k), v)
    return result


def _json_pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _json_patch(doc: Any, ops: list) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, test, copy, move)."""
    doc = copy.deepcopy(doc)

    def parent(path: str) -> tuple[Any, str]:
        parts = _json_pointer(path)
        if not parts:
            raise ApiError(422, "cannot patch the document root")
        cur = doc
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur, parts[-1]

    def get(path: str) -> Any:
        cur = doc
        for p in _json_pointer(path):
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur

    try:
        for op in ops:
            kind, path = op["op"], op["path"]
            if kind in ("add", "replace"):
                par, key = parent(path)
                val = copy.deepcopy(op["value"])
                if isinstance(par, list):
                    if key == "-":
                        par.append(val)
                    elif kind == "add":
                        par.insert(int(key), val)
                    else:
                        par[int(key)] = val
                else:
                    if kind == "replace" and key not in par:
                        raise ApiError(422, f"replace operation does not apply: doc is missing path: {path}")
                    par[key] = val
            elif kind == "remove":
                par, key = parent(path)
                if isinstance(par, list):
                    del par[int(key)]
                else:
                    del par[key]
            elif kind == "test":
                if get(path) != op["value"]:
                    raise ApiError(422, f"testing value {path} failed")
            elif kind in ("copy", "move"):
                val = copy.deepcopy(get(op["from"]))
                if kind == "move":
                    par, key = parent(op["from"])
                    del par[int(key) if isinstance(par, list) else key]
                par, key = parent(path)
                if isinstance(par, list):
                    par.insert(len(par) if key == "-" else int(key), val)
                else:
                    par[key] = val
            else:
                raise ApiError(422, f"unexpected JSON patch operation {kind!r}")
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise ApiError(422, f"the server rejected our request due to an error in our request: {e}") from None
    return doc


def _without_rv(obj: dict) -> dict:
    o = copy.deepcopy(obj)
    o.get("metadata", {}).pop("resourceVersion", None)
    o.get("metadata", {}).pop("managedFields", None)
    o.pop("kind", None)
    o.pop("apiVersion", None)
    return o


class _Fault:
    def __init__(self, remaining: int | None, p: float | None, status: int | str,
                 retry_after: float | None, verb: str | None, resource: str | None):
        self.remaining = remaining
        self.p = p
        self.status = status
        self.retry_after = retry_after
        self.verb = verb
        self.resource = resource

    def matches(self, verb: str, resource: str) -> bool:
        return ((self.verb is None or self.verb == verb)
                and (self.resource is None or self.resource == resource))


def _fault_error(fault: _Fault, rt: ResourceType, name: str | None) -> ApiError:
    """The Status an injected (non-drop) fault answers, as the HTTP handler sends it."""
    code = int(fault.status)
    headers = {}
    retry_after = fault.retry_after
    if retry_after is None and code == 429:
        retry_after = 1
    details = _details(rt, name)
    if retry_after is not None:
        ra = int(retry_after) if float(retry_after).is_integer() else retry_after
        headers["Retry-After"] = str(ra)
        details["retryAfterSeconds"] = int(max(1, round(float(retry_after))))
    msg = {429: "Too many requests, please try again later.",
           500: "Internal error occurred: injected fault",
           503: "the server is currently unable to handle the request",
           504: "the server was unable to return a response in the time allotted, "
                "but may still be processing the request"}.get(code, "injected fault")
    return ApiError(code, msg, details=details, headers=headers)


class FaultControls:
    """The fault controls of the fake server, shared with the real server's proxy
    (tests/kube_real_server.py): ``inject_latency``, ``fail_next``, ``fail_rate``, ``clear_faults``,
    and what a request handler asks (``_latency_for``, ``_pick_fault``). Needs ``_stats_lock``."""

    def _init_faults(self) -> None:
        self._latency = 0.0
        self._latency_filter: tuple[str | None, str | None] = (None, None)
        self._faults: list[_Fault] = []
        self._rng = random.Random()

    def inject_latency(self, seconds: float, verb: str | None = None,
                       resource: str | None = None) -> None:
        """Delay every (matching) API request by ``seconds`` before handling it."""
        with self._stats_lock:
            self._latency = float(seconds)
            self._latency_filter = (verb, resource)

    def fail_next(self, n: int = 1, status: int | str = 500, retry_after: float | None = None,
                  verb: str | None = None, resource: str | None = None) -> None:
        """Fail the next ``n`` (matching) API requests with ``status``.
        ``status="drop"`` closes the connection without a response; ``status="lost"`` serves
        the request (a create is made, a delete done) and then closes the connection without
        the response (the answer lost on the way back).  429 responses
        carry ``Retry-After`` (default 1 second)."""
        with self._stats_lock:
            self._faults.append(_Fault(int(n), None, status, retry_after, verb, resource))

    def fail_rate(self, p: float, status: int | str = 500, retry_after: float | None = None,
                  verb: str | None = None, resource: str | None = None,
                  seed: int | None = None) -> None:
        """Fail each (matching) API request with probability ``p``; ``p=0`` removes
        all rate faults."""
        with self._stats_lock:
            self._faults = [f for f in self._faults if f.p is None]
            if seed is not None:
                self._rng.seed(seed)
            if p > 0:
                self._faults.append(_Fault(None, float(p), status, retry_after, verb, resource))

    def clear_faults(self) -> None:
        with self._stats_lock:
            self._faults.clear()
            self._latency = 0.0
            self._latency_filter = (None, None)

    def _pick_fault(self, verb: str, resource: str) -> _Fault | None:
        with self._stats_lock:
            for f in self._faults:
                if not f.matches(verb, resource):
                    continue
                if f.remaining is not None:
                    f.remaining -= 1
                    if f.remaining <= 0:
                        self._faults.remove(f)
                    return f
                if self._rng.random() < f.p:
                    return f
            return None

    def _latency_for(self, verb: str, resource: str) -> float:
        with self._stats_lock:
            v, r = self._latency_filter
            if (v is None or v == verb) and (r is None or r == resource):
                return self._latency
            return 0.0


# --------------------------------------------------------------------------
# In-process access: many simulated clients in one process, without HTTP
# --------------------------------------------------------------------------

_EQUALITY_RE = re.compile(r"^\s*([^\s!=<>(),]+)\s*(==|=)\s*([^\s!=<>(),]*)\s*$")


def _equalities(selector: str | None) -> list[tuple[str, str]]:
    """The ``key=value`` requirements of a label selector (those an event's labels must carry)."""
    if not selector or not selector.strip():
        return []
    out = []
    for part in _split_top_level(selector):
        m = _EQUALITY_RE.match(part)
        if m:
            out.append((m.group(1), m.group(3)))
    return out


def _memberships(selector: str | None) -> list[tuple[str, set[str]]]:
    """The ``key in (v1,v2,...)`` requirements of a label selector."""
    if not selector or not selector.strip():
        return []
    out = []
    for part in _split_top_level(selector):
        m = _SET_RE.match(part)
        if m and m.group(2) == "in":
            out.append((m.group(1), {v.strip() for v in m.group(3).split(",") if v.strip()}))
    return out


class _WatchGroup:
    """Watches of one (resource, namespace, label selector, field selector): they all receive the
    same events, so each event is matched and serialised once per group, not once per watch.
    ``live`` watches get the event lines; ``held`` clients (a watch nobody reads: a simulated node
    that is idle) are only counted, from the group's running totals since they joined."""

    def __init__(self, key: tuple, rt: ResourceType, ns: str | None, lsel: Matcher, fsel: Matcher,
                 index_key: tuple[str, str, str] | None) -> None:
        self.key = key
        self.rt = rt
        self.ns = ns
        self.lsel = lsel
        self.fsel = fsel
        self.index_key = index_key
        self.live: list[InProcessWatch] = []
        self.held: dict[str, tuple[int, int]] = {}  # client -> (events, bytes) of the group when it joined
        self.events = 0  # delivered to each member since the group was made
        self.bytes = 0


class InProcessWatch:
    """An open in-process watch: the event lines (JSON + newline, bytes) the server delivers to it."""

    _BROKEN = object()

    def __init__(self, server: "KubeAPIServer", client: str, group: _WatchGroup, timeout: float) -> None:
        import queue

        self.server = server
        self.client = client
        self.group = group
        self.deadline = time.monotonic() + timeout
        self.queue: Any = queue.SimpleQueue()
        self.open = True

    def lines(self) -> Any:
        """Yield event lines until ``timeoutSeconds`` (a clean end), :meth:`close` or the server's
        end; raises ConnectionResetError when the server dropped it (:meth:`KubeAPIServer.restart_watches`)."""
        import queue

        try:
            while True:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    return
                try:
                    item = self.queue.get(timeout=left)
                except queue.Empty:
                    return
                if item is None:
                    return
                if item is InProcessWatch._BROKEN:
                    raise ConnectionResetError("watch connection dropped by the API server")
                yield item
        finally:
            self.close()

    def close(self) -> None:
        if self.open:
            self.open = False
            self.server._unwatch(self)
            self.queue.put(None)

    def drop(self) -> None:
        if self.open:
            self.open = False
            self.server._unwatch(self)
            self.queue.put(InProcessWatch._BROKEN)


class _InProcessResponse:
    """What ``kubernetes.client.ApiClient.call_api`` answers, as lease-ipam's transport reads it."""

    def __init__(self, status: int, headers: dict, data: bytes = b"", watch: InProcessWatch | None = None) -> None:
        self.status = status
        self.headers = headers
        self.data = data
        self.response = _InProcessRaw(data, watch)

    def read(self) -> bytes:
        return self.data


class _InProcessRaw:
    """The urllib3 response under it (what a watch stream is read from)."""

    def __init__(self, data: bytes, watch: InProcessWatch | None) -> None:
        self.data = data
        self.watch = watch
        self.chunked = watch is not None

    def stream(self, amt: Any = None) -> Any:
        return self.watch.lines() if self.watch is not None else iter((self.data,))

    def read1(self, amt: int = -1) -> bytes:
        data, self.data = self.data, b""
        return data

    def read(self) -> bytes:
        return self.read1()

    def shutdown(self) -> None:
        if self.watch is not None:
            self.watch.close()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.close()

    def release_conn(self) -> None:
        pass


class InProcessApiClient:
    """A stand-in for ``kubernetes.client.ApiClient`` that calls :meth:`KubeAPIServer.handle`:
    the request and answer bodies are real JSON bytes (counted per client), but there is no
    HTTP, socket or thread per request. Only ``param_serialize`` and ``call_api`` are provided
    (what ``rdmanet.ipam.store.kube.ApiClientTransport`` uses). ``client`` names the caller in the
    server's per-client accounting; ``who``, when given, is called per request and, when it
    answers a name, attributes that request to it instead (a shared connection used by many
    simulated nodes)."""

    def __init__(self, server: "KubeAPIServer", client: str, who: Callable[[], str | None] | None = None) -> None:
        import types

        self.server = server
        self.client = client
        self.who = who
        self.configuration = types.SimpleNamespace(host=f"inprocess://{client}")

    def param_serialize(self, method: str, resource_path: str, query_params: Any = None,
                        header_params: Any = None, body: Any = None, **_: Any) -> tuple:
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        return (method, resource_path, list(query_params or ()), data)

    def call_api(self, method: str, path: str, query: list, data: bytes | None,
                 _request_timeout: Any = None) -> _InProcessResponse:
        client = (self.who() if self.who is not None else None) or self.client
        status, headers, answer = self.server.handle(method, path, query, data, client)
        if isinstance(answer, InProcessWatch):
            return _InProcessResponse(status, headers, watch=answer)
        return _InProcessResponse(status, headers, answer)


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


def _shutdown_all(socks: list) -> None:
    """Cut connections under their handlers' feet (their reads see EOF at once)."""
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), which can block on DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = host
        self.server_port = port


class KubeAPIServer(FaultControls):
    """Fake Kubernetes API server.  Starts serving on construction.

    :param port: TCP port on 127.0.0.1 (0 = pick a free one).
    :param token: if set, requests must carry ``Authorization: Bearer <token>``
                  (401 otherwise); by default any or no credential is accepted.
    :param max_events: watch history kept; older watch resourceVersions get 410.
    :param bookmark_interval: seconds between BOOKMARK events on watches that allow them.
    :param verbose: log each request to stderr.
    :param tls: ``(certfile, keyfile)``: serve HTTPS with that certificate (``url`` is then
                ``https://...``), as a real apiserver does; plain HTTP by default.
    :param client_ca: with ``tls``: a CA file; the TLS handshake then requires a client
                certificate that CA signed (x509 client authentication).
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", token: str | None = None,
                 max_events: int = 100_000, verbose: bool = False, start: bool = True,
                 bookmark_interval: float = 1.0, tls: tuple[str, str] | None = None,
                 client_ca: str | None = None):
        self._cond = threading.Condition(threading.RLock())
        self._store: dict[str, dict[tuple[str, str], dict]] = {r: {} for r in RESOURCES}
        self._rv = 1000
        self._namespaces: set[str] = set(NAMESPACES)
        # events: (rv, resource, type, obj, prev_obj) sorted by rv
        self._events: list[tuple[int, str, str, dict, dict | None]] = []
        self._compacted_rv = self._rv  # watches from rv < this get 410
        self._max_events = max_events
        self._snapshots: dict[str, list[dict]] = {}
        self._snapshot_order: deque[str] = deque()
        self._stopping = False

        self._stats_lock = threading.Lock()
        self._counts: Counter = Counter()
        self._log: deque[dict] = deque(maxlen=10_000)
        self._init_faults()
        self._connections: set[socket.socket] = set()
        self._active_watches = 0
        self._watch_sockets: set[socket.socket] = set()
        self._watch_paused = False
        self.bookmark_interval = float(bookmark_interval)
        # in-process access (see "In-process access" below): per-client accounting and watches
        self._client_stats: dict[str, Counter] = {}
        self._wgroups: dict[tuple, _WatchGroup] = {}  # (resource, ns, label sel, field sel) -> group
        self._windex: dict[tuple[str, str, str], set[_WatchGroup]] = {}  # (resource, key, value) -> groups
        self._wscan: set[_WatchGroup] = set()  # groups with no equality requirement to index by
        self._lindex: dict[tuple[str, str, str], set[tuple[str, str]]] = {}  # (resource, label, value) -> keys

        self.token = token
        self.verbose = verbose
        owner = self

        class Handler(_Handler):
            server_obj = owner

        self._httpd = _HTTPServer((host, port), Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            if client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(client_ca)
            # the handshake runs in the request's thread, not in the accepting one
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True,
                                                     do_handshake_on_connect=False)
        self.host = host
        self.port = self._httpd.server_address[1]
        self.url = f"{'https' if tls else 'http'}://{host}:{self.port}"
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> KubeAPIServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._httpd.serve_forever,
                                            kwargs={"poll_interval": 0.05},
                                            name=f"kube-api-server:{self.port}", daemon=True)
            self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread (for the command line)."""
        self._httpd.serve_forever(poll_interval=0.2)

    def stop(self) -> None:
        """Stop serving, end watches and close open keep-alive connections."""
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._cond.notify_all()
        _clock_offset[0] = 0.0
        if self._thread is not None:
            self._httpd.shutdown()
        self._httpd.server_close()
        with self._stats_lock:
            conns = list(self._connections)
        _shutdown_all(conns)
        if self._thread is not None:
            self._thread.join(timeout=5)

    close = stop

    def __enter__(self) -> KubeAPIServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- counters / log ------------------------------------------------------

    def counts(self) -> dict[tuple[str, str], int]:
        """Requests seen, keyed by ``(verb, resource)``; verbs are the apiserver's
        (``create get list watch update patch delete deletecollection``).  Requests
        failed by fault injection are counted too."""
        with self._stats_lock:
            return dict(self._counts)

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        with self._stats_lock:
            return sum(n for (v, r), n in self._counts.items()
                       if (verb is None or v == verb) and (resource is None or r == resource))

    def reset_counts(self) -> None:
        with self._stats_lock:
            self._counts.clear()
            self._log.clear()

    def request_log(self) -> list[dict]:
        """Recent requests: dicts with method, path, query, verb, resource,
        namespace, name, status, injected (fault), seconds."""
        with self._stats_lock:
            return [dict(e) for e in self._log]

    @property
    def active_watches(self) -> int:
        with self._stats_lock:
            return self._active_watches

    # -- watch controls --------------------------------------------------------

    def pause_watches(self) -> None:
        """Hold every watch's events (and bookmarks) back until :meth:`resume_watches`: a
        lagging watch. Streams stay open; new ones open too and wait the same way."""
        with self._cond:
            self._watch_paused = True

    def resume_watches(self) -> None:
        with self._cond:
            self._watch_paused = False
            self._cond.notify_all()

    def drop_watches(self) -> int:
        """Cut every open watch stream (no terminating chunk): a broken connection. Returns how many."""
        with self._stats_lock:
            socks = list(self._watch_sockets)
        _shutdown_all(socks)
        with self._cond:
            self._cond.notify_all()
        return len(socks)

    # -- direct object access --------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        with self._cond:
            return self._rv

    def objects(self, resource: str, namespace: str | None = None) -> list[dict]:
        """Snapshot (deep copies, with kind/apiVersion) of stored objects."""
        rt = RESOURCES[resource]
        with self._cond:
            items = [copy.deepcopy(o) for (ns, _), o in sorted(self._store[resource].items())
                     if namespace is None or ns == namespace]
        return [self._with_kind(rt, o) for o in items]

    def get_object(self, resource: str, namespace: str, name: str) -> dict | None:
        with self._cond:
            o = self._store[resource].get((namespace, name))
            return self._with_kind(RESOURCES[resource], copy.deepcopy(o)) if o else None

    def add_pod(self, namespace: str, name: str, uid: str | None = None,
                node: str | None = None, labels: dict | None = None,
                phase: str = "Running", pod_ip: str | None = None,
                annotations: dict | None = None) -> dict:
        """Create (or replace) a pod directly; emits a watch event.  Returns it."""
        spec: dict[str, Any] = {"containers": [{"name": "main", "image": "pause"}]}
        if node:
            spec["nodeName"] = node
        status: dict[str, Any] = {"phase": phase}
        if pod_ip:
            status["podIP"] = pod_ip
        meta: dict[str, Any] = {"name": name, "namespace": namespace,
                                "uid": uid or str(uuid.uuid4())}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        obj = {"metadata": meta, "spec": spec, "status": status}
        with self._cond:
            self._namespaces.add(namespace)
            prev = self._store["pods"].get((namespace, name))
            obj["metadata"]["creationTimestamp"] = _now_rfc3339()
            self._put("pods", obj, "MODIFIED" if prev else "ADDED", prev)
            return self._with_kind(RESOURCES["pods"], copy.deepcopy(obj))

    def delete_pod(self, namespace: str, name: str | None = None, uid: str | None = None) -> bool:
        """Delete a pod by name (or by uid); emits DELETED.  Returns whether it existed."""
        with self._cond:
            key = None
            if name is not None:
                key = (namespace, name) if (namespace, name) in self._store["pods"] else None
            elif uid is not None:
                for k, o in self._store["pods"].items():
                    if k[0] == namespace and o["metadata"].get("uid") == uid:
                        key = k
                        break
            if key is None:
                return False
            self._remove("pods", key)
            return True

    def add_namespace(self, name: str) -> None:
        """Make a namespace (objects in one the server does not have are refused with 404)."""
        with self._cond:
            self._namespaces.add(name)

    def add_node(self, name: str, labels: dict | None = None) -> dict:
        """Create (or replace) a node (cluster-scoped; listed and watched at ``/api/v1/nodes``,
        ``labelSelector`` applies); emits a watch event.  Returns it."""
        meta: dict[str, Any] = {"name": name, "uid": str(uuid.uuid4())}
        if labels:
            meta["labels"] = dict(labels)
        obj = {"metadata": meta, "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
        with self._cond:
            prev = self._store["nodes"].get(("", name))
            meta["creationTimestamp"] = _now_rfc3339()
            self._put("nodes", obj, "MODIFIED" if prev else "ADDED", prev)
            return self._with_kind(RESOURCES["nodes"], copy.deepcopy(obj))

    @staticmethod
    def advance_clock(seconds: float) -> None:
        """Move the servers' clock (creation times, ``Date``) ``seconds`` ahead: a test of what
        is judged by server time waits without sleeping. Undone when the server stops."""
        _clock_offset[0] += seconds

    def delete_node(self, name: str) -> bool:
        """Delete a node; emits DELETED.  Returns whether it existed."""
        with self._cond:
            if ("", name) not in self._store["nodes"]:
                return False
            self._remove("nodes", ("", name))
            return True

    def compact(self) -> None:
        """Drop all watch history: watches from any earlier resourceVersion get 410."""
        with self._cond:
            self._events.clear()
            self._compacted_rv = self._rv
            self._snapshots.clear()
            self._snapshot_order.clear()

    # -- in-process access (benchmarks: thousands of simulated clients in one process) ---------

    def handle(self, method: str, path: str, query: Any = (), body: bytes | None = None,
               client: str = "in-process") -> tuple[int, dict, Any]:
        """Serve one API request without HTTP: ``(status, headers, answer)``, ``answer`` being the
        JSON bytes of the response, or an :class:`InProcessWatch` for a 200 watch. Counted like an
        HTTP request (``counts()``, ``request_log()``, latency and fault injection; a ``"drop"``
        fault raises ConnectionResetError) and per ``client`` (:meth:`client_stats`): requests by
        verb, bytes received and sent, watch events and bytes delivered."""
        t0 = time.monotonic()
        q = {str(k): str(v) for k, v in (query.items() if isinstance(query, dict) else query)}
        self._account(client, bytes_in=len(body or b""))
        entry = {"method": method, "path": path, "query": q, "verb": None, "resource": None,
                 "namespace": None, "name": None, "status": None, "injected": False, "authorization": None}

        def answer(code: int, obj: Any, headers: dict | None = None) -> tuple[int, dict, bytes]:
            data = json.dumps(obj, separators=(",", ":")).encode()
            self._account(client, bytes_out=len(data), **{f"{entry['verb']}:{code}": 1})
            entry["status"], entry["seconds"] = code, time.monotonic() - t0
            with self._stats_lock:
                self._log.append(entry)
            return code, {"Content-Type": "application/json", "Date": _http_date(), **(headers or {})}, data

        lost = False
        route = self._route(path)
        if route is None:
            entry["verb"] = entry["resource"] = "unknown"
            self._count_request(client, "unknown", "unknown")
            return answer(404, ApiError(404, "the server could not find the requested resource", details={}).status())
        rt, ns, name = route
        watch = q.get("watch", "").lower() in ("true", "1")
        verb = _Handler._verb(method, name, watch, ns)
        entry.update(verb=verb or method.lower(), resource=rt.plural, namespace=ns, name=name)
        self._count_request(client, verb or method.lower(), rt.plural)
        try:
            if verb is None:
                raise ApiError(405, "the server does not allow this method on the requested resource",
                               details=_details(rt, name))
            delay = self._latency_for(verb, rt.plural)
            if delay > 0:
                time.sleep(delay)
            fault = self._pick_fault(verb, rt.plural)
            if fault is not None:
                entry["injected"] = True
                if fault.status == "drop":
                    raise ConnectionResetError("connection dropped by an injected fault")
                if fault.status != "lost" or verb == "watch":
                    raise _fault_error(fault, rt, name)
                lost = True
            try:
                doc: Any = json.loads(body) if body else None
            except ValueError:
                raise ApiError(400, "the body of the request was in an unknown format - "
                                    "accepted media types include: application/json") from None
            dry_run = q.get("dryRun") == "All"
            if verb == "watch":
                w = self._open_inprocess_watch(rt, ns, q, client)
                entry["status"], entry["seconds"] = 200, time.monotonic() - t0
                with self._stats_lock:
                    self._log.append(entry)
                return 200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}, w
            code, obj = self.api_call(verb, rt, ns, name, doc, "application/merge-patch+json", q, dry_run)
        except ApiError as e:
            if lost:
                raise ConnectionResetError("the answer was lost by an injected fault") from None
            return answer(e.code, e.status(), e.headers)
        if lost:
            raise ConnectionResetError("the answer was lost by an injected fault")
        return answer(code, obj)

    @staticmethod
    def _route(path: str) -> tuple[ResourceType, str | None, str | None] | None:
        for rx, resource, namespaced in _ROUTES:
            m = rx.match(path)
            if m:
                main, _, sub = resource.partition("/")
                rt = RESOURCES[main].status() if sub == "status" else RESOURCES[main]
                if namespaced is None:  # cluster-scoped, by name too (nodes)
                    return rt, "", m.group(1)
                return rt, (m.group(1) if namespaced else None), (m.group(2) if namespaced else None)
        return None

    def _account(self, client: str, **amounts: int) -> None:
        with self._stats_lock:
            stats = self._client_stats.get(client)
            if stats is None:
                stats = self._client_stats[client] = Counter()
            for k, v in amounts.items():
                stats[k] += v

    def _count_request(self, client: str, verb: str, resource: str) -> None:
        with self._stats_lock:
            self._counts[(verb, resource)] += 1
            stats = self._client_stats.get(client)
            if stats is None:
                stats = self._client_stats[client] = Counter()
            stats["requests"] += 1
            stats[f"req:{verb}"] += 1

    def client_stats(self) -> dict[str, Counter]:
        """Per client: ``requests``, ``req:<verb>``, ``<verb>:<status>`` (e.g. ``create:409``; not for
        watches), ``bytes_in`` (request bodies), ``bytes_out``
        (response bodies, watch streams excluded), ``watch_events`` and ``watch_bytes`` (event lines
        delivered to its watches, held ones included). HTTP requests count under the
        ``X-Rdmanet-Client`` header's value, else ``http``."""
        with self._cond:
            with self._stats_lock:
                out = {c: Counter(s) for c, s in self._client_stats.items()}
            for g in self._wgroups.values():
                for client, (e0, b0) in g.held.items():
                    s = out.setdefault(client, Counter())
                    s["watch_events"] += g.events - e0
                    s["watch_bytes"] += g.bytes - b0
        return out

    def reset_client_stats(self) -> None:
        with self._cond:
            with self._stats_lock:
                self._client_stats.clear()
            for g in self._wgroups.values():
                for client in g.held:
                    g.held[client] = (g.events, g.bytes)

    def watch_totals(self) -> dict[str, int]:
        """Open in-process watches (``live``), held ones (``held``) and their groups (``groups``)."""
        with self._cond:
            groups = list(self._wgroups.values())
            return {"groups": len(groups), "live": sum(len(g.live) for g in groups),
                    "held": sum(len(g.held) for g in groups)}

    def watches_of(self, client: str) -> list[tuple[str, str | None, str, str]]:
        """(resource, namespace, label selector, field selector) of each in-process watch ``client``
        has open or holds."""
        with self._cond:
            return sorted(g.key for g in self._wgroups.values()
                          if client in g.held or any(w.client == client for w in g.live))

    def hold_watch(self, client: str, path: str, query: Any) -> None:
        """Register a watch for ``client`` that nobody reads: every event its selectors match is
        counted as delivered to it (:meth:`client_stats`), at the cost of one group update per
        event whatever the number of such clients. For a simulated node whose daemon is idle."""
        q = {str(k): str(v) for k, v in (query.items() if isinstance(query, dict) else query)}
        route = self._route(path)
        if route is None:
            raise ValueError(f"no resource at {path}")
        rt, ns, _ = route
        lsel, fsel = self._matchers(rt, q)
        with self._cond:
            g = self._group(rt, ns, q.get("labelSelector", ""), q.get("fieldSelector", ""), lsel, fsel)
            g.held.setdefault(client, (g.events, g.bytes))

    def release_held(self, client: str) -> None:
        """End ``client``'s held watches (what they were delivered stays counted)."""
        with self._cond:
            for g in list(self._wgroups.values()):
                start = g.held.pop(client, None)
                if start is not None:
                    self._account(client, watch_events=g.events - start[0], watch_bytes=g.bytes - start[1])
                    self._drop_group_if_empty(g)

    def restart_watches(self, others_changed: bool = False) -> int:
        """An API server restart as its watchers see it: every open watch stream breaks
        (in-process and HTTP) and the history is gone (``compact``): kube-apiserver's watch
        cache starts anew at the newest resourceVersion, so a re-watch from an older one is
        answered 410 and the client Lists again, while one from the newest (a watcher whose
        last event or bookmark was the latest change) goes on without a 410, as on the tests'
        real server, where nothing else changes. ``others_changed``: the resourceVersion
        moves on first (a cluster's other objects change meanwhile), so every watcher meets
        410. Held watches stay (they are nobody's stream). Returns the number of streams broken."""
        with self._cond:
            if others_changed:
                self._bump()
            self.compact()
            live = [w for g in self._wgroups.values() for w in g.live]
        for w in live:
            w.drop()
        return len(live) + self.drop_watches()

    def _group(self, rt: ResourceType, ns: str | None, lstr: str, fstr: str, lsel: Matcher,
               fsel: Matcher) -> _WatchGroup:
        key = (rt.key, ns, lstr, fstr)
        g = self._wgroups.get(key)
        if g is not None:
            return g
        # index by the equality requirement fewest groups share (a node-scoped one, typically)
        best = None
        for k, v in _equalities(lstr):
            ik = (rt.key, k, v)
            if best is None or len(self._windex.get(ik, ())) <= len(self._windex.get(best, ())):
                best = ik
        g = self._wgroups[key] = _WatchGroup(key, rt, ns, lsel, fsel, best)
        if best is None:
            self._wscan.add(g)
        else:
            self._windex.setdefault(best, set()).add(g)
        return g

    def _drop_group_if_empty(self, g: _WatchGroup) -> None:
        if g.live or g.held or self._wgroups.get(g.key) is not g:
            return
        del self._wgroups[g.key]
        if g.index_key is None:
            self._wscan.discard(g)
        else:
            groups = self._windex.get(g.index_key)
            if groups is not None:
                groups.discard(g)
                if not groups:
                    del self._windex[g.index_key]

    def _unwatch(self, w: InProcessWatch) -> None:
        with self._cond:
            try:
                w.group.live.remove(w)
            except ValueError:
                return
            self._drop_group_if_empty(w.group)

    @staticmethod
    def _event_line(rt: ResourceType, etype: str, obj: dict) -> bytes:
        out = {"kind": rt.kind, "apiVersion": rt.api_version}
        out.update({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})
        return json.dumps({"type": etype, "object": out}, separators=(",", ":")).encode() + b"\n"

    def _open_inprocess_watch(self, rt: ResourceType, ns: str | None, q: dict, client: str) -> InProcessWatch:
        lsel, fsel = self._matchers(rt, q)
        try:
            timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else 1800.0
        except ValueError:
            raise ApiError(400, f"invalid timeoutSeconds {q['timeoutSeconds']!r}") from None
        rv_param = q.get("resourceVersion", "")
        send_initial = q.get("sendInitialEvents", "").lower() in ("true", "1")
        with self._cond:
            g = self._group(rt, ns, q.get("labelSelector", ""), q.get("fieldSelector", ""), lsel, fsel)
            w = InProcessWatch(self, client, g, timeout)
            lines: list[bytes] = []
            if rv_param in ("", "0") or send_initial:
                lines = [self._event_line(rt, "ADDED", o) for _, o in sorted(self._store[rt.key].items())
                         if self._matches(o, ns, lsel, fsel)]
                if send_initial:
                    lines.append(self._event_line(rt, "BOOKMARK", {"metadata": {
                        "resourceVersion": str(self._rv), "annotations": {"k8s.io/initial-events-end": "true"}}}))
            else:
                try:
                    last_rv = int(rv_param)
                except ValueError:
                    self._drop_group_if_empty(g)
                    raise ApiError(400, f"invalid resource version {rv_param!r}") from None
                if last_rv < self._compacted_rv:
                    line = json.dumps({"type": "ERROR", "object": ApiError(
                        410, f"too old resource version: {last_rv} ({self._compacted_rv})",
                        reason="Expired").status()}, separators=(",", ":")).encode() + b"\n"
                    self._account(client, watch_bytes=len(line))
                    w.queue.put(line)
                    w.open = False
                    w.queue.put(None)
                    self._drop_group_if_empty(g)
                    return w
                i = bisect.bisect_right(self._events, last_rv, key=lambda e: e[0])
                for _, resource, etype, obj, prev in self._events[i:]:
                    if resource == rt.key:
                        ev = self._watch_event(rt, etype, obj, prev, ns, lsel, fsel)
                        if ev is not None:
                            lines.append(self._event_line(rt, ev[0], ev[1]))
            for line in lines:
                w.queue.put(line)
            self._account(client, watch_events=len(lines), watch_bytes=sum(len(x) for x in lines))
            g.live.append(w)
            return w

    def _deliver(self, resource: str, etype: str, obj: dict, prev: dict | None) -> None:
        """Hand one change to every in-process watch (and held watch) whose selectors match it
        (call with ``_cond`` held). Only the groups indexed under one of the object's labels
        (old or new) and the unindexed ones are looked at."""
        groups: set[_WatchGroup] = set()
        for o in (obj, prev):
            if o:
                for k, v in ((o.get("metadata") or {}).get("labels") or {}).items():
                    found = self._windex.get((resource, k, v))
                    if found:
                        groups |= found
        groups |= {g for g in self._wscan if g.rt.key == resource}
        lines: dict[tuple[str, int], bytes] = {}
        for g in groups:
            ev = self._watch_event(g.rt, etype, obj, prev, g.ns, g.lsel, g.fsel)
            if ev is None:
                continue
            line = lines.get((ev[0], id(ev[1])))
            if line is None:
                line = lines[(ev[0], id(ev[1]))] = self._event_line(g.rt, ev[0], ev[1])
            g.events += 1
            g.bytes += len(line)
            for w in g.live:
                w.queue.put(line)
                self._account(w.client, watch_events=1, watch_bytes=len(line))

    # -- store internals (call with self._cond held) ----------------------------

    @staticmethod
    def _with_kind(rt: ResourceType, obj: dict) -> dict:
        out = {"kind": rt.kind, "apiVersion": rt.api_version}
        out.update({k: v for k, v in obj.items() if k not in ("kind", "apiVersion")})
        return out

    def _bump(self) -> int:
        self._rv += 1
        return self._rv

    def _record(self, resource: str, etype: str, obj: dict, prev: dict | None) -> None:
        self._events.append((self._rv, resource, etype, copy.deepcopy(obj),
                             copy.deepcopy(prev) if prev else None))
        if self._wgroups:
            self._deliver(resource, etype, obj, prev)
        if len(self._events) > self._max_events:
            drop = len(self._events) - self._max_events // 2
            self._compacted_rv = self._events[drop - 1][0]
            del self._events[:drop]
        self._cond.notify_all()

    def _put(self, resource: str, obj: dict, etype: str, prev: dict | None) -> None:
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._bump())
        key = (meta.get("namespace", ""), meta["name"])  # a cluster-scoped object (a node) has no namespace
        self._unindex_labels(resource, key, self._store[resource].get(key))
        self._store[resource][key] = obj
        for k, v in (meta.get("labels") or {}).items():
            self._lindex.setdefault((resource, k, v), set()).add(key)
        self._record(resource, etype, obj, prev)

    def _unindex_labels(self, resource: str, key: tuple[str, str], obj: dict | None) -> None:
        for k, v in ((obj or {}).get("metadata", {}).get("labels") or {}).items():
            keys = self._lindex.get((resource, k, v))
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._lindex[(resource, k, v)]

    def _selected_keys(self, resource: str, selector: str | None) -> list[tuple[str, str]]:
        """The sorted keys of the objects that may match ``selector``: those carrying the label of
        its rarest ``key=value`` requirement, or one of the values of a ``key in (...)``
        requirement (all objects when it has neither). The caller still matches each one."""
        best = None
        for k, v in _equalities(selector):
            keys = self._lindex.get((resource, k, v), set())
            if best is None or len(keys) < len(best):
                best = keys
        for k, values in _memberships(selector):
            keys = set().union(*(self._lindex.get((resource, k, v), set()) for v in values))
            if best is None or len(keys) < len(best):
                best = keys
        return sorted(self._store[resource] if best is None else best)

    def _remove(self, resource: str, key: tuple[str, str]) -> dict:
        obj = self._store[resource].pop(key)
        self._unindex_labels(resource, key, obj)
        gone = copy.deepcopy(obj)
        gone["metadata"]["resourceVersion"] = str(self._bump())
        self._record(resource, "DELETED", gone, obj)
        return gone

    def _remember_snapshot(self, items: list[dict]) -> str:
        sid = uuid.uuid4().hex
        self._snapshots[sid] = items
        self._snapshot_order.append(sid)
        while len(self._snapshot_order) > 1000:
            self._snapshots.pop(self._snapshot_order.popleft(), None)
        return sid

    # -- API operations (called by the handler) -------------------------------------

    def api_call(self, verb: str, rt: ResourceType, ns: str, name: str | None, body: Any, content_type: str,
                 q: dict, dry_run: bool) -> tuple[int, dict]:
        """One API verb other than watch, as both front ends (HTTP and in-process) serve it."""
        if verb == "create":
            return self.api_create(rt, ns, body, dry_run)
        if verb == "get":
            return self.api_get(rt, ns, name)
        if verb == "list":
            return self.api_list(rt, ns, q)
        if verb == "update":
            return self.api_update(rt, ns, name, body, dry_run)
        if verb == "patch":
            return self.api_patch(rt, ns, name, body, content_type, dry_run)
        if verb == "delete":
            if q.get("gracePeriodSeconds") not in (None, ""):  # DeleteOptions in the query, as clients send them
                body = {**(body if isinstance(body, dict) else {}), "gracePeriodSeconds": int(q["gracePeriodSeconds"])}
            return self.api_delete(rt, ns, name, body, dry_run)
        if verb == "deletecollection":
            return self.api_deletecollection(rt, ns, q, dry_run)
        raise ApiError(405, "method not allowed")

    def api_create(self, rt: ResourceType, ns: str, body: dict, dry_run: bool) -> tuple[int, dict]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        _decode_times(rt, body)
        with self._cond:
            if ns and ns not in self._namespaces:
                raise ApiError(404, f'namespaces "{ns}" not found', details={"name": ns, "kind": "namespaces"})
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if meta.get("namespace") and meta["namespace"] != ns:
            raise ApiError(400, "the namespace of the provided object does not match "
                                "the namespace sent on the request")
        if ns:  # a cluster-scoped object (a node) has none
            meta["namespace"] = ns
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(
                random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
        _validate(rt, obj)
        for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"):
            meta.pop(k, None)
        if rt.subresource:
            raise ApiError(405, "the server does not allow this method on the requested resource",
                           details=_details(rt, meta.get("name")))
        if rt.status_subresource:  # a custom resource's status is written through its subresource only
            obj.pop("status", None)
        if rt.plural == "pods":
            # a pod's status is the kubelet's (the status subresource): what a create carries is dropped
            obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
            obj.setdefault("spec", {}).setdefault("terminationGracePeriodSeconds", 30)
        with self._cond:
            key = (ns, meta["name"])
            if key in self._store[rt.key] or (rt.plural == "namespaces" and meta["name"] in self._namespaces):
                raise ApiError(409, f'{rt.qualified} "{meta["name"]}" already exists',
                               details=_details(rt, meta["name"]), reason="AlreadyExists")
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now_rfc3339()
            if dry_run:
                meta["resourceVersion"] = str(self._rv)
            else:
                self._put(rt.key, obj, "ADDED", None)
                if rt.plural == "namespaces":
                    self._namespaces.add(meta["name"])
            return 201, self._with_kind(rt, copy.deepcopy(obj))

    def api_get(self, rt: ResourceType, ns: str, name: str) -> tuple[int, dict]:
        with self._cond:
            obj = self._store[rt.key].get((ns, name))
            if obj is None:
                raise self._not_found(rt, name)
            return 200, self._with_kind(rt, copy.deepcopy(obj))

    @staticmethod
    def _not_found(rt: ResourceType, name: str) -> ApiError:
        return ApiError(404, f'{rt.qualified} "{name}" not found', details=_details(rt, name))

    @staticmethod
    def _conflict(rt: ResourceType, name: str) -> ApiError:
        return ApiError(409, f'Operation cannot be fulfilled on {rt.qualified} "{name}": the object '
                             "has been modified; please apply your changes to the latest version "
                             "and try again", details=_details(rt, name))

    def _replace(self, rt: ResourceType, ns: str, name: str, new: dict, dry_run: bool) -> tuple[int, dict]:
        """Shared by update and patch; caller holds the lock; ``new`` is the desired object."""
        cur = self._store[rt.key].get((ns, name))
        if cur is None:
            raise self._not_found(rt, name)
        meta = new.setdefault("metadata", {})
        if meta.get("namespace") and meta["namespace"] != ns:
            raise ApiError(400, "the namespace of the provided object does not match "
                                "the namespace sent on the request")
        if meta.get("name") and meta["name"] != name:
            raise ApiError(400, "the name of the object "
                                f"({meta['name']}) does not match the name on the URL ({name})")
        meta["name"], meta["namespace"] = name, ns
        rv = meta.get("resourceVersion")
        if rv and rv != cur["metadata"]["resourceVersion"]:
            raise self._conflict(rt, name)
        uid = meta.get("uid")
        if uid and uid != cur["metadata"]["uid"]:
            raise ApiError(409, f"Precondition failed: UID in precondition: {uid}, "
                                f"UID in object meta: {cur['metadata']['uid']}",
                           details=_details(rt, name))
        _validate(rt, new)
        meta["uid"] = cur["metadata"]["uid"]
        meta["creationTimestamp"] = cur["metadata"]["creationTimestamp"]
        meta["resourceVersion"] = cur["metadata"]["resourceVersion"]
        new.pop("kind", None)
        new.pop("apiVersion", None)
        if rt.plural == "pods" and "status" not in new and "status" in cur:
            new["status"] = copy.deepcopy(cur["status"])
        if rt.subresource == "status":  # only the status changes
            new = {**copy.deepcopy(cur), "status": copy.deepcopy(new.get("status")),
                   "metadata": {**copy.deepcopy(cur["metadata"]), "resourceVersion": cur["metadata"]["resourceVersion"]}}
            if new["status"] is None:
                del new["status"]
        elif rt.status_subresource:  # the object's own update keeps the status the server has
            new.pop("status", None)
            if "status" in cur:
                new["status"] = copy.deepcopy(cur["status"])
        if _without_rv(new) == _without_rv(cur) or dry_run:
            # no-op update: the apiserver neither bumps resourceVersion nor emits an event
            return 200, self._with_kind(rt, copy.deepcopy(new if dry_run else cur))
        self._put(rt.key, new, "MODIFIED", cur)
        return 200, self._with_kind(rt, copy.deepcopy(new))

    def api_update(self, rt: ResourceType, ns: str, name: str, body: dict, dry_run: bool) -> tuple[int, dict]:
        if not isinstance(body, dict):
            raise ApiError(400, "the body of the request was in an unknown format")
        _decode_times(rt, body)
        with self._cond:
            return self._replace(rt, ns, name, copy.deepcopy(body), dry_run)

    def api_patch(self, rt: ResourceType, ns: str, name: str, body: Any,
                  content_type: str, dry_run: bool) -> tuple[int, dict]:
        with self._cond:
            cur = self._store[rt.key].get((ns, name))
            if cur is None:
                raise self._not_found(rt, name)
            base = self._with_kind(rt, copy.deepcopy(cur))
            if "json-patch" in content_type:
                if not isinstance(body, list):
                    raise ApiError(400, "the body of the request was in an unknown format")
                new = _json_patch(base, body)
                # a JSON patch that doesn't touch resourceVersion carries the current one
            elif "merge-patch" in content_type:
                if not isinstance(body, dict):
                    raise ApiError(400, "the body of the request was in an unknown format")
                new = _merge_patch(base, body)
                if not (body.get("metadata") or {}).get("resourceVersion"):
                    new.setdefault("metadata", {})["resourceVersion"] = cur["metadata"]["resourceVersion"]
            else:
                raise ApiError(415, "the body of the request was in an unknown format - "
                                    "accepted media types include: application/json-patch+json, "
                                    "application/merge-patch+json, "
                                    "application/strategic-merge-patch+json")
            _decode_times(rt, new)
            return self._replace(rt, ns, name, new, dry_run)

    def api_delete(self, rt: ResourceType, ns: str, name: str, body: Any, dry_run: bool) -> tuple[int, dict]:
        pre = {}
        if isinstance(body, dict):
            pre = body.get("preconditions") or {}
        with self._cond:
            cur = self._store[rt.key].get((ns, name))
            if cur is None:
                raise self._not_found(rt, name)
            uid, rv = pre.get("uid"), pre.get("resourceVersion")
            if uid and uid != cur["metadata"]["uid"]:
                raise ApiError(409, f"Precondition failed: UID in precondition: {uid}, "
                                    f"UID in object meta: {cur['metadata']['uid']}",
                               details=_details(rt, name))
            if rv and rv != cur["metadata"]["resourceVersion"]:
                raise ApiError(409, f"Precondition failed: ResourceVersion in precondition: {rv}, "
                                    f"ResourceVersion in object meta: {cur['metadata']['resourceVersion']}",
                               details=_details(rt, name))
            if rt.plural == "pods" and (cur.get("spec") or {}).get("nodeName"):
                # A pod bound to a node is deleted gracefully: it is marked and stays until its
                # kubelet confirms (deletes it with grace period 0); an unbound pod goes at once.
                grace = body.get("gracePeriodSeconds") if isinstance(body, dict) else None
                if grace is None:
                    grace = cur["metadata"].get("deletionGracePeriodSeconds",
                                                cur["spec"].get("terminationGracePeriodSeconds", 30))
                if int(grace) > 0:
                    marked = copy.deepcopy(cur)
                    when = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=int(grace))
                    marked["metadata"]["deletionTimestamp"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
                    marked["metadata"]["deletionGracePeriodSeconds"] = int(grace)
                    if not dry_run and _without_rv(marked) != _without_rv(cur):
                        self._put(rt.key, marked, "MODIFIED", cur)
                    return 200, self._with_kind(rt, copy.deepcopy(marked))
            if dry_run:
                gone = copy.deepcopy(cur)
            else:
                gone = self._remove(rt.key, (ns, name))
            if rt.plural == "pods":
                # the apiserver returns the (final state of the) deleted pod
                return 200, self._with_kind(rt, gone)
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                         "status": "Success",
                         "details": _details(rt, name, uid=cur["metadata"]["uid"])}

    def _matchers(self, rt: ResourceType, q: dict) -> tuple[Matcher, Matcher]:
        try:
            lsel = parse_label_selector(q.get("labelSelector"))
        except ValueError as e:
            raise ApiError(400, f"unable to parse requirement: {e}") from None
        try:
            fsel = parse_field_selector(q.get("fieldSelector"), rt)
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        return lsel, fsel

    def _matches(self, obj: dict, ns: str | None, lsel: Matcher, fsel: Matcher) -> bool:
        meta = obj.get("metadata", {})
        return ((ns is None or (meta.get("namespace") or "") == ns)
                and lsel(meta.get("labels") or {}) and fsel(obj))

    def api_list(self, rt: ResourceType, ns: str | None, q: dict) -> tuple[int, dict]:
        lsel, fsel = self._matchers(rt, q)
        limit = 0
        if q.get("limit"):
            try:
                limit = max(0, int(q["limit"]))
            except ValueError:
                raise ApiError(400, f"invalid limit {q['limit']!r}") from None
        cont = q.get("continue")
        with self._cond:
            if cont:
                try:
                    tok = json.loads(base64.urlsafe_b64decode(cont.encode()))
                    sid, start, list_rv = tok["id"], int(tok["start"]), tok["rv"]
                except Exception:
                    raise ApiError(400, "continue key is not valid") from None
                items = self._snapshots.get(sid)
                if items is None:
                    raise ApiError(410, "The provided continue parameter is too old to display a "
                                        "consistent list result. You can start a new list without "
                                        "the continue parameter.", reason="Expired")
            else:
                # No copies: a stored object is never changed in place (every write stores a new
                # object, :meth:`_put`), and a List's items are only serialised. (Deep copies of
                # every item were most of the scale simulation's time when a daemon read a domain.)
                store = self._store[rt.key]
                items = [store[k] for k in self._selected_keys(rt.key, q.get("labelSelector"))
                         if self._matches(store[k], ns, lsel, fsel)]
                sid, start, list_rv = None, 0, str(self._rv)
            page = items[start:start + limit] if limit else items[start:]
            end = start + len(page)
            meta: dict[str, Any] = {"resourceVersion": list_rv}
            if limit and end < len(items):
                if sid is None:
                    sid = self._remember_snapshot(items)
                meta["continue"] = base64.urlsafe_b64encode(json.dumps(
                    {"id": sid, "start": end, "rv": list_rv}).encode()).decode()
                meta["remainingItemCount"] = len(items) - end
            elif sid is not None:
                self._snapshots.pop(sid, None)  # its last page: no token names it any more (memory: a
                # List of 95,000 Leases held in 1,000 snapshots took GBs in the scale simulation)
        return 200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version,
                     "metadata": meta, "items": page}

    def api_deletecollection(self, rt: ResourceType, ns: str, q: dict, dry_run: bool) -> tuple[int, dict]:
        lsel, fsel = self._matchers(rt, q)
        with self._cond:
            keys = [k for k, o in sorted(self._store[rt.key].items())
                    if self._matches(o, ns, lsel, fsel)]
            if not dry_run:
                for k in keys:
                    self._remove(rt.key, k)
        return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                     "details": _details(rt, None)}

    def _watch_event(self, rt: ResourceType, etype: str, obj: dict | None, prev: dict | None,
                     ns: str | None, lsel: Matcher, fsel: Matcher) -> tuple[str, dict] | None:
        """Selector-aware event translation, like the apiserver's watch cache."""
        cur_match = obj is not None and self._matches(obj, ns, lsel, fsel)
        prev_match = prev is not None and self._matches(prev, ns, lsel, fsel)
        if etype == "ADDED":
            return ("ADDED", obj) if cur_match else None
        if etype == "DELETED":
            return ("DELETED", obj) if prev_match else None
        if cur_match and prev_match:
            return ("MODIFIED", obj)
        if cur_match:
            return ("ADDED", obj)
        if prev_match:
            gone = copy.deepcopy(prev)
            gone["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
            return ("DELETED", gone)
        return None


# --------------------------------------------------------------------------
# HTTP handler
# --------------------------------------------------------------------------

_ROUTES = [
    (re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?/?$"), "leases", True),
    (re.compile(r"^/apis/coordination\.k8s\.io/v1/leases/?$"), "leases", False),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?/?$"), "pods", True),
    (re.compile(r"^/api/v1/pods/?$"), "pods", False),
    (re.compile(r"^/api/v1/nodes(?:/([^/]+))?/?$"), "nodes", None),
    (re.compile(r"^/api/v1/namespaces(?:/([^/]+))?/?$"), "namespaces", None),
    (re.compile(r"^/api/v1/namespaces/([^/]+)/events(?:/([^/]+))?/?$"), "events", True),
    (re.compile(r"^/api/v1/events/?$"), "events", False),
    (re.compile(r"^/apis/whereabouts\.cni\.cncf\.io/v1alpha1/namespaces/([^/]+)/ippools(?:/([^/]+))?/?$"), "ippools", True),
    (re.compile(r"^/apis/whereabouts\.cni\.cncf\.io/v1alpha1/namespaces/([^/]+)/overlappingrangeipreservations(?:/([^/]+))?/?$"),
     "overlappingrangeipreservations", True),
    (re.compile(r"^/apis/nv-ipam\.nvidia\.com/v1alpha1/namespaces/([^/]+)/ippools(?:/([^/]+))?/?$"),
     "ippools.nv-ipam.nvidia.com", True),
    (re.compile(r"^/apis/nv-ipam\.nvidia\.com/v1alpha1/namespaces/([^/]+)/cidrpools(?:/([^/]+))?/?$"),
     "cidrpools.nv-ipam.nvidia.com", True),
    (re.compile(r"^/apis/nv-ipam\.nvidia\.com/v1alpha1/namespaces/([^/]+)/ippools/([^/]+)/status/?$"),
     "ippools.nv-ipam.nvidia.com/status", True),
    (re.compile(r"^/apis/nv-ipam\.nvidia\.com/v1alpha1/namespaces/([^/]+)/cidrpools/([^/]+)/status/?$"),
     "cidrpools.nv-ipam.nvidia.com/status", True),
]

_VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.0-rdmanet-fake",
            "gitCommit": "0" * 40, "gitTreeState": "clean", "buildDate": "2024-01-01T00:00:00Z",
            "goVersion": "go1.22.0", "compiler": "gc", "platform": "linux/amd64"}


class _Handler(BaseHTTPRequestHandler):
    server_obj: KubeAPIServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server_version = "kube-apiserver-fake/1.0"
    sys_version = ""

    # -- plumbing ------------------------------------------------------------

    def setup(self) -> None:
        super().setup()
        with self.server_obj._stats_lock:
            self.server_obj._connections.add(self.connection)

    def finish(self) -> None:
        with self.server_obj._stats_lock:
            self.server_obj._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        if self.server_obj.verbose:
            sys.stderr.write("kube-api-server: %s - %s\n" % (self.address_string(), format % args))

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                line = self.rfile.readline()
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(data)
                data += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _send_json(self, code: int, obj: Any, headers: dict | None = None) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode()
        self.server_obj._account(self._client_name(), bytes_out=len(data))
        head = [f"HTTP/1.1 {code} {_PHRASES.get(code, 'Unknown')}",
                "Content-Type: application/json",
                f"Content-Length: {len(data)}",
                "Cache-Control: no-cache, private",
                f"Date: {_http_date()}"]
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}")
        if self.close_connection:
            head.append("Connection: close")
        self._status = code
        self._record()  # before the client can see the answer, so request_log() never lags it
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)

    def _client_name(self) -> str:
        headers = getattr(self, "headers", None)
        return (headers.get("X-Rdmanet-Client") if headers is not None else None) or "http"

    def _send_error(self, err: ApiError) -> None:
        self._send_json(err.code, err.status(), err.headers)

    # -- dispatch ----------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_OPTIONS(self) -> None:
        self._dispatch("OPTIONS")

    def _dispatch(self, method: str) -> None:
        srv = self.server_obj
        t0 = time.monotonic()
        self._status = 0
        self._lose = False
        split = urlsplit(self.path)
        path = split.path
        q = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        try:
            body_bytes = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            return
        entry = {"method": method, "path": path, "query": q, "verb": None, "resource": None,
                 "namespace": None, "name": None, "status": None, "injected": False,
                 "authorization": self.headers.get("Authorization")}
        self._entry, self._t0 = entry, t0
        try:
            if path.startswith("/_control/"):
                self._control(method, path, body_bytes)
                return
            if path in ("/healthz", "/readyz", "/livez"):
                data = b"ok"
                self.wfile.write(f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                return
            if path == "/version" and method == "GET":
                self._send_json(200, _VERSION)
                return
            if path == "/api" and method == "GET":
                self._send_json(200, {"kind": "APIVersions", "versions": ["v1"],
                                      "serverAddressByClientCIDRs": []})
                return

            route = KubeAPIServer._route(path)
            if route is None:
                self._count(entry, "unknown", "unknown")
                self._send_error(ApiError(404, "the server could not find the requested resource",
                                          details={}))
                return
            rt, ns, name = route
            resource = rt.plural
            watch = q.get("watch", "").lower() in ("true", "1")
            verb = self._verb(method, name, watch, ns)
            entry.update(namespace=ns, name=name)
            self._count(entry, verb or method.lower(), resource)
            if verb is None:
                self._send_error(ApiError(405, "the server does not allow this method on the "
                                               "requested resource", details=_details(rt, name)))
                return

            if srv.token is not None:
                scheme, _, given = self.headers.get("Authorization", "").partition(" ")
                if scheme.lower() != "bearer" or given != srv.token:  # the scheme in any case, as kube-apiserver takes it
                    self._send_error(ApiError(401, "Unauthorized"))
                    return

            delay = srv._latency_for(verb, resource)
            if delay > 0:
                time.sleep(delay)

            fault = srv._pick_fault(verb, resource)
            if fault is not None:
                entry["injected"] = True
                if fault.status == "lost" and verb != "watch":
                    self._lose = True  # served below, then the connection is cut before the answer
                else:
                    self._inject(fault, rt, name)
                    return

            body: Any = None
            if body_bytes:
                try:
                    body = json.loads(body_bytes)
                except ValueError:
                    raise ApiError(400, "the body of the request was in an unknown format - "
                                        "accepted media types include: application/json") from None
            dry_run = "All" in parse_qs(split.query).get("dryRun", [])
            if verb == "watch":
                self._watch(rt, ns, q)
                return
            code, obj = srv.api_call(verb, rt, ns, name, body, self.headers.get("Content-Type", ""), q, dry_run)
            if self._lose:
                self._cut(code)
                return
            self._send_json(code, obj)
        except ApiError as e:
            if self._lose:
                self._cut(e.code)
                return
            try:
                self._send_error(e)
            except OSError:
                self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 - report as InternalError, like the apiserver
            import traceback
            traceback.print_exc()
            try:
                self._send_error(ApiError(500, f"fake apiserver bug: {e!r}"))
            except OSError:
                self.close_connection = True
        finally:
            self._record()

    def _record(self) -> None:
        """Log the request once (at its answer, or at the end when none was sent)."""
        entry = getattr(self, "_entry", None)
        if entry is None:
            return
        self._entry = None
        if entry["verb"] is not None:
            entry["status"] = self._status
            entry["seconds"] = time.monotonic() - self._t0
            with self.server_obj._stats_lock:
                self.server_obj._log.append(entry)

    @staticmethod
    def _verb(method: str, name: str | None, watch: bool, ns: str | None) -> str | None:
        if method == "GET":
            if name:
                return None if watch else "get"
            return "watch" if watch else "list"
        if name:
            return {"PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method)
        if ns is None:
            return None
        return {"POST": "create", "DELETE": "deletecollection"}.get(method)

    def _count(self, entry: dict, verb: str, resource: str) -> None:
        entry["verb"], entry["resource"] = verb, resource
        with self.server_obj._stats_lock:
            self.server_obj._counts[(verb, resource)] += 1

    def _cut(self, code: int) -> None:
        """A ``"lost"`` fault: the request was served (``code``) but its answer never arrives."""
        self._status = code
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _inject(self, fault: _Fault, rt: ResourceType, name: str | None) -> None:
        if fault.status == "drop":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        self._send_error(_fault_error(fault, rt, name))

    # -- watch ---------------------------------------------------------------------

    def _client_gone(self) -> bool:
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if r:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True
        return False

    def _chunk(self, obj: dict) -> None:
        data = json.dumps(obj, separators=(",", ":")).encode() + b"\n"
        self.server_obj._account(self._client_name(), watch_events=1, watch_bytes=len(data))
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _watch(self, rt: ResourceType, ns: str | None, q: dict) -> None:
        srv = self.server_obj
        lsel, fsel = srv._matchers(rt, q)
        try:
            timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else 1800.0
        except ValueError:
            raise ApiError(400, f"invalid timeoutSeconds {q['timeoutSeconds']!r}") from None
        deadline = time.monotonic() + timeout
        bookmarks = q.get("allowWatchBookmarks", "").lower() in ("true", "1")
        rv_param = q.get("resourceVersion", "")
        send_initial = q.get("sendInitialEvents", "").lower() in ("true", "1")
        initial: list[dict] = []
        error: dict | None = None
        with srv._cond:
            if rv_param in ("", "0") or send_initial:
                initial = [copy.deepcopy(o) for _, o in sorted(srv._store[rt.key].items())
                           if srv._matches(o, ns, lsel, fsel)]
                last_rv = srv._rv
            else:
                try:
                    last_rv = int(rv_param)
                except ValueError:
                    raise ApiError(400, f"invalid resource version {rv_param!r}") from None
                if last_rv < srv._compacted_rv:
                    error = ApiError(410, f"too old resource version: {last_rv} ({srv._compacted_rv})",
                                     reason="Expired").status()
        head = ("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                "Cache-Control: no-cache, private\r\nTransfer-Encoding: chunked\r\n"
                f"Date: {_http_date()}\r\n\r\n")
        self._status = 200
        self._record()  # an open watch is in request_log() from its first byte, as in-process
        self.wfile.write(head.encode())
        with srv._stats_lock:
            srv._active_watches += 1
            srv._watch_sockets.add(self.connection)
        try:
            if error is not None:
                self._chunk({"type": "ERROR", "object": error})
                return
            for o in initial:
                self._chunk({"type": "ADDED", "object": srv._with_kind(rt, o)})
            if send_initial:
                self._chunk({"type": "BOOKMARK", "object": {
                    "kind": rt.kind, "apiVersion": rt.api_version,
                    "metadata": {"resourceVersion": str(last_rv),
                                 "annotations": {"k8s.io/initial-events-end": "true"}}}})
            interval = srv.bookmark_interval
            next_bookmark = time.monotonic() + interval
            while True:
                with srv._cond:
                    while True:
                        if srv._stopping:
                            return
                        paused = srv._watch_paused
                        if not paused and srv._events and srv._events[-1][0] > last_rv:
                            break
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            return
                        srv._cond.wait(min(remaining, 0.25))
                        if self._client_gone():
                            return
                        if bookmarks and not srv._watch_paused and time.monotonic() >= next_bookmark:
                            break
                    if last_rv < srv._compacted_rv:
                        batch = None
                    else:
                        i = bisect.bisect_right(srv._events, last_rv, key=lambda e: e[0])
                        batch = srv._events[i:]
                    current_rv = srv._rv
                if batch is None:
                    self._chunk({"type": "ERROR", "object": ApiError(
                        410, f"too old resource version: {last_rv} ({srv._compacted_rv})",
                        reason="Expired").status()})
                    return
                for ev_rv, resource, etype, obj, prev in batch:
                    last_rv = ev_rv
                    if resource != rt.key:
                        continue
                    ev = srv._watch_event(rt, etype, obj, prev, ns, lsel, fsel)
                    if ev is not None:
                        self._chunk({"type": ev[0], "object": srv._with_kind(rt, ev[1])})
                if bookmarks and time.monotonic() >= next_bookmark:
                    last_rv = max(last_rv, current_rv)
                    self._chunk({"type": "BOOKMARK", "object": {
                        "kind": rt.kind, "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(last_rv)}}})
                    next_bookmark = time.monotonic() + interval
                if time.monotonic() >= deadline:
                    return
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
        finally:
            with srv._stats_lock:
                srv._active_watches -= 1
                srv._watch_sockets.discard(self.connection)
            if not self.close_connection:
                try:
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    self.close_connection = True

    # -- cross-process control ---------------------------------------------------------

    def _control(self, method: str, path: str, body_bytes: bytes) -> None:
        srv = self.server_obj
        try:
            body = json.loads(body_bytes) if body_bytes else {}
        except ValueError:
            raise ApiError(400, "invalid JSON") from None
        parts = path.strip("/").split("/")[1:]
        op = parts[0] if parts else ""
        if op == "counts" and method == "GET":
            self._send_json(200, [{"verb": v, "resource": r, "count": n}
                                  for (v, r), n in sorted(srv.counts().items())])
        elif op == "reset_counts" and method == "POST":
            srv.reset_counts()
            self._send_json(200, {})
        elif op == "fail_next" and method == "POST":
            srv.fail_next(body.get("n", 1), body.get("status", 500), body.get("retry_after"),
                          body.get("verb"), body.get("resource"))
            self._send_json(200, {})
        elif op == "fail_rate" and method == "POST":
            srv.fail_rate(body.get("p", 0), body.get("status", 500), body.get("retry_after"),
                          body.get("verb"), body.get("resource"), body.get("seed"))
            self._send_json(200, {})
        elif op == "latency" and method == "POST":
            srv.inject_latency(body.get("seconds", 0), body.get("verb"), body.get("resource"))
            self._send_json(200, {})
        elif op == "clear_faults" and method == "POST":
            srv.clear_faults()
            self._send_json(200, {})
        elif op == "watches" and method == "POST":
            if body.get("paused"):
                srv.pause_watches()
            else:
                srv.resume_watches()
            self._send_json(200, {})
        elif op == "drop_watches" and method == "POST":
            self._send_json(200, {"dropped": srv.drop_watches()})
        elif op == "objects" and method == "GET" and len(parts) == 2 and parts[1] in RESOURCES:
            self._send_json(200, srv.objects(parts[1]))
        elif op == "pods" and method == "POST":
            self._send_json(201, srv.add_pod(body["namespace"], body["name"], body.get("uid"),
                                             body.get("node"), body.get("labels")))
        elif op == "pods" and method == "DELETE" and len(parts) == 3:
            self._send_json(200, {"deleted": srv.delete_pod(parts[1], parts[2])})
        elif op == "nodes" and method == "POST":
            self._send_json(201, srv.add_node(body["name"], body.get("labels")))
        elif op == "nodes" and method == "DELETE" and len(parts) == 2:
            self._send_json(200, {"deleted": srv.delete_node(parts[1])})
        else:
            raise ApiError(404, "unknown control endpoint")


# --------------------------------------------------------------------------
# kubeconfig
# --------------------------------------------------------------------------


def write_kubeconfig(path: Any, server_url: str, namespace: str | None = None,
                     token: str = "fake-token", context: str = "fake") -> str:
    """Write a kubeconfig (token user, no TLS) usable by
    ``kubernetes.config.load_kube_config(config_file=path)``.  Returns the path."""
    ctx: dict[str, Any] = {"cluster": context, "user": context}
    if namespace:
        ctx["namespace"] = namespace
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": {"server": server_url}}],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [{"name": context, "context": ctx}],
        "current-context": context,
        "preferences": {},
    }
    try:
        import yaml  # kubernetes depends on PyYAML
        text = yaml.safe_dump(cfg, sort_keys=False)
    except ImportError:  # JSON is valid YAML
        text = json.dumps(cfg, indent=2)
    with open(path, "w") as f:
        f.write(text)
    return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fake Kubernetes API server (leases, pods)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--kubeconfig", help="write a kubeconfig for this server here")
    ap.add_argument("--namespace", help="namespace for the kubeconfig context (the server has it)")
    ap.add_argument("--token", help="require this bearer token")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    srv = KubeAPIServer(port=args.port, host=args.host, token=args.token,
                        verbose=args.verbose, start=False)
    if args.namespace:
        srv.add_namespace(args.namespace)
    if args.kubeconfig:
        write_kubeconfig(args.kubeconfig, srv.url, args.namespace, token=args.token or "fake-token")
    print(srv.url, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
