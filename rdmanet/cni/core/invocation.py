"""One plugin call: the CNI_* environment and the stdin config, validated like Go's skel.

Required variables per verb (SPEC.md, pkg/skel): ADD and CHECK need CNI_CONTAINERID,
CNI_NETNS, CNI_IFNAME and CNI_PATH; DEL the same except that CNI_NETNS may be empty; GC needs
CNI_PATH; STATUS and VERSION need nothing. Every missing variable is named in one error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from . import limits
from .args import parse_cni_args
from .errors import (
    DECODING_FAILURE,
    INVALID_CONFIG,
    INVALID_ENVIRONMENT,
    UNKNOWN_CONTAINER,
    CNIError,
)
from .version import IMPLICIT_VERSION, require_supported

COMMANDS = ("ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION")
_REQUIRED = {
    "ADD": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "CHECK": ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"),
    "DEL": ("CNI_CONTAINERID", "CNI_IFNAME", "CNI_PATH"),
    "GC": ("CNI_PATH",),
    "STATUS": (),
}
# Container IDs and network names: pkg/utils/utils.go.
NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$")
IFNAME_MAX = 15  # IFNAMSIZ - 1


def validate_ifname(ifname: str, what: str = "CNI_IFNAME") -> None:
    problem = None
    if not ifname:
        problem = "is empty"
    elif len(ifname) > IFNAME_MAX:
        problem = f"is longer than {IFNAME_MAX} characters"
    elif ifname in (".", ".."):
        problem = "may not be '.' or '..'"
    elif any(c in ifname for c in "/:") or any(c.isspace() for c in ifname):
        problem = "may not contain '/', ':' or whitespace"
    if problem:
        raise CNIError(
            INVALID_ENVIRONMENT,
            f"{what} {ifname!r} {problem}",
            f"use an interface name of 1-{IFNAME_MAX} characters without '/', ':' or spaces, e.g. net1",
        )


def validate_container_id(container_id: str) -> None:
    if not NAME_RE.match(container_id):
        raise CNIError(
            INVALID_ENVIRONMENT,
            f"CNI_CONTAINERID {container_id!r} contains invalid characters",
            "a container ID must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$",
        )


@dataclass
class Invocation:
    """One CNI call: the verb and its CNI_* environment, parsed."""

    command: str
    container_id: str = ""
    netns: str = ""
    ifname: str = ""
    path: list[str] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    stdin: bytes = b""
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def cni_version(self) -> str:
        return self.config.get("cniVersion") or IMPLICIT_VERSION

    @property
    def network_name(self) -> str:
        return self.config.get("name", "")

    @property
    def runtime_config(self) -> dict:
        rc = self.config.get("runtimeConfig")
        return rc if isinstance(rc, dict) else {}

    @property
    def args_cni(self) -> dict:
        """The ``args.cni`` convention block (labels, ips, Multus cni-args)."""
        args = self.config.get("args")
        cni = args.get("cni") if isinstance(args, dict) else None
        return cni if isinstance(cni, dict) else {}


def command_from(environ: Mapping[str, str]) -> str:
    command = environ.get("CNI_COMMAND", "")
    if not command:
        raise CNIError(INVALID_ENVIRONMENT, "required env variables [CNI_COMMAND] missing", "set CNI_COMMAND")
    if command not in COMMANDS:
        raise CNIError(
            INVALID_ENVIRONMENT,
            f"unknown CNI_COMMAND {command!r}",
            f"CNI_COMMAND must be one of {', '.join(COMMANDS)}",
        )
    return command


def decode_config(stdin: bytes) -> dict[str, Any]:
    """The stdin config as a dict, within :mod:`rdmanet.cni.core.limits` (size, depth, entries)."""
    limits.check_size(stdin)
    try:
        config = json.loads(stdin)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CNIError(DECODING_FAILURE, f"network config on stdin is not valid JSON: {exc}", "pass the network configuration as a JSON object on stdin") from exc
    except RecursionError:
        raise CNIError(INVALID_CONFIG, f"invalid network config: nested deeper than {limits.MAX_DEPTH} levels", limits.FIX) from None
    if not isinstance(config, dict):
        raise CNIError(DECODING_FAILURE, "network config on stdin must be a JSON object", f"got {type(config).__name__}")
    limits.check_shape(config)
    return config


def parse_invocation(environ: Mapping[str, str], stdin: bytes) -> Invocation:
    """Validate env and stdin for ADD/DEL/CHECK/GC/STATUS; raises CNIError with the spec's codes."""
    command = command_from(environ)
    missing = [name for name in _REQUIRED[command] if name not in environ or (environ[name] == "" and name != "CNI_PATH")]
    if missing:
        raise CNIError(
            INVALID_ENVIRONMENT,
            f"required env variables [{','.join(missing)}] missing",
            f"{command} needs {', '.join(_REQUIRED[command])}",
        )
    inv = Invocation(
        command=command,
        container_id=environ.get("CNI_CONTAINERID", ""),
        netns=environ.get("CNI_NETNS", ""),
        ifname=environ.get("CNI_IFNAME", ""),
        path=[p for p in environ.get("CNI_PATH", "").split(":") if p],
        args=parse_cni_args(environ.get("CNI_ARGS", "")),
        env=dict(environ),
        stdin=stdin,
    )
    if command in ("ADD", "CHECK", "DEL"):
        if not inv.container_id:
            raise CNIError(UNKNOWN_CONTAINER, "missing CNI_CONTAINERID", "set CNI_CONTAINERID")
        validate_container_id(inv.container_id)
        validate_ifname(inv.ifname)
        if command != "DEL" and "%" in inv.ifname:  # DEL must still clean up after a rejected ADD
            raise CNIError(
                INVALID_ENVIRONMENT,
                f"CNI_IFNAME {inv.ifname!r} contains '%'",
                "the kernel reads '%d' in a link name as a pattern and picks another name; "
                "use a literal interface name such as net1 (Multus: the 'interface' of the pod's network annotation)",
            )
    inv.config = decode_config(stdin)
    version = inv.config.get("cniVersion", IMPLICIT_VERSION)
    if not isinstance(version, str):
        raise CNIError(DECODING_FAILURE, "cniVersion must be a string", 'e.g. "cniVersion": "1.0.0"')
    require_supported(version, command)
    name = inv.config.get("name")
    if not isinstance(name, str) or not name:
        raise CNIError(INVALID_CONFIG, "missing network name", 'set "name" in the network configuration')
    if not NAME_RE.match(name):
        raise CNIError(INVALID_CONFIG, f"invalid network name {name!r}", "a network name must match ^[a-zA-Z0-9][a-zA-Z0-9_.\\-]*$")
    return inv
