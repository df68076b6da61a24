"""Which Kubernetes Node this host is, known for sure before any cleaner acts for it.

The node GC frees claims of this node whose pods are gone, so it must never act under a name that
is not its Node's: a hostname is not one (node names are lower-cased; a kubelet may register an
FQDN or a ``--hostname-override``). The name comes from ``RDMANET_NODE_NAME``:
- DaemonSet: the downward API sets it from ``spec.nodeName``;
- host mode: ``install.sh --node-name NAME``, or by default the Node that matches this host (its
  hostname, lower-cased, its FQDN, its short name), confirmed through the API, is written to
  the daemon's environment file ``/etc/default/rdmanet`` (what ``rdmanet.service`` reads).

It is confirmed by a GET of ``/api/v1/nodes/<name>`` with the store's credentials. A daemon
whose name is unset or not confirmed runs no node GC, and ``rdmanet doctor`` says why.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from typing import Any, Mapping, Optional
from urllib.parse import quote

NODE_ENV = "RDMANET_NODE_NAME"
ENVIRONMENT_FILE = "/etc/default/rdmanet"  # the daemon's unit reads it (rdmanet.cli.systemd_units)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a Node's name: a DNS-1123 subdomain


@dataclass(frozen=True)
class Configured:
    name: Optional[str]
    source: str  # "environment", the environment file's path, or "" (none)


def read_environment_file(path: str = ENVIRONMENT_FILE) -> dict[str, str]:
    """``NAME=value`` lines of a systemd environment file (comments and blank lines skipped,
    one level of quotes removed)."""
    out: dict[str, str] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (FileNotFoundError, NotADirectoryError, PermissionError, UnicodeDecodeError):
        return out
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def configured(environ: Optional[Mapping[str, str]] = None, env_file: Optional[str] = None) -> Configured:
    """The node name this process was given: ``RDMANET_NODE_NAME``, else the environment file's."""
    environ = os.environ if environ is None else environ
    env_file = ENVIRONMENT_FILE if env_file is None else env_file
    if environ.get(NODE_ENV):
        return Configured(environ[NODE_ENV], "environment")
    value = read_environment_file(env_file).get(NODE_ENV)
    return Configured(value, env_file) if value else Configured(None, "")


def candidates(hostname: Optional[str] = None, fqdn: Optional[str] = None) -> list[str]:
    """The Node names this host may be registered under, most likely first: its hostname as is,
    lower-cased, its FQDN (lower-cased), its short name. Only valid Node names."""
    host = hostname if hostname is not None else socket.gethostname()
    full = fqdn if fqdn is not None else socket.getfqdn()
    out: list[str] = []
    for name in (host, host.lower(), full.lower(), host.lower().split(".")[0]):
        if name and name not in out and _NAME.match(name):
            out.append(name)
    return out


@dataclass(frozen=True)
class Confirmation:
    name: Optional[str]  # the Node's name, None when not confirmed
    uid: str = ""
    reason: str = ""  # why not confirmed
    fix: str = ""
    missing: bool = False  # the API answered that no such Node exists (not a failure to ask)


def confirm(api: Any, name: str) -> Confirmation:
    """Whether a Node named ``name`` exists, asked through ``api`` (a
    :class:`rdmanet.ipam.reconcile.KubeAPI`)."""
    from rdmanet.cni.core.errors import CNIError

    from .reconcile import ApiError

    if not _NAME.match(name or ""):
        return Confirmation(None, reason=f"{name!r} is not a valid Node name",
                            fix="give the Node's name as `kubectl get nodes` shows it")
    try:
        doc = api.request("GET", f"/api/v1/nodes/{quote(name, safe='')}")
    except ApiError as err:
        if err.status == 404:
            return Confirmation(None, reason=f"the cluster has no Node named {name}",
                                fix="set the name `kubectl get nodes` shows for this host: install.sh --node-name NAME",
                                missing=True)
        if err.status in (401, 403):
            return Confirmation(None, reason=f"the credentials may not read Node {name} ({err})",
                                fix="grant get on nodes (deploy/rbac.yaml, ClusterRole rdmanet-node-lister)")
        return Confirmation(None, reason=f"reading Node {name} failed: {err}", fix="see the API server's message")
    except CNIError as err:
        return Confirmation(None, reason=err.msg, fix=err.details)
    return Confirmation(name, str((doc.get("metadata") or {}).get("uid") or ""))


def match(api: Any, hostname: Optional[str] = None, fqdn: Optional[str] = None) -> Confirmation:
    """The Node this host is registered as: the first of :func:`candidates` the API confirms."""
    names = candidates(hostname, fqdn)
    for name in names:
        found = confirm(api, name)
        if found.name is not None or not found.missing:
            return found  # confirmed, or the API cannot tell (no use asking for the other names)
    return Confirmation(None, reason=f"no Node matches this host ({', '.join(names) or 'no valid name'})",
                        fix="give the Node's name: install.sh --node-name NAME")
