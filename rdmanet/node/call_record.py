"""What the daemon records of each CNI call it serves: one structured log line (``"event":
"call"``), and the facts its metrics and pod events are made from.

The line says who asked (plugin, command, network, container ID, ifname, the pod's namespace,
name and UID from Multus' CNI_ARGS), what came of it (on success the addresses an ADD gave; on
failure the CNI error's code, message and fix, not the exit status, which is 1 for every error)
and how long it took. So ``kubectl logs`` of the DaemonSet answers "why has this pod no net1":
``jq 'select(.event == "call" and .code != 0)'``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from rdmanet.cni.core.args import parse_cni_args
from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.linux.roots import POLICY_ENV

MAX_TEXT = 1024  # a message or fix longer than this is cut in the log line


def _config(stdin: bytes) -> Optional[dict]:
    try:
        doc = json.loads(stdin)
    except (ValueError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _pod(env: Mapping[str, str]) -> dict[str, str]:
    try:
        args = parse_cni_args(env.get("CNI_ARGS", ""))
    except CNIError:
        return {}
    return {key: args[key] for key in ("K8S_POD_NAMESPACE", "K8S_POD_NAME", "K8S_POD_UID") if args.get(key)}


def _addresses(document: Any) -> tuple[str, ...]:
    ips = document.get("ips") if isinstance(document, dict) else None
    if not isinstance(ips, list):
        return ()
    return tuple(ip["address"] for ip in ips if isinstance(ip, dict) and isinstance(ip.get("address"), str))


def _cut(text: Any) -> str:
    text = text if isinstance(text, str) else ""
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 3] + "..."


@dataclass(frozen=True)
class CallRecord:
    plugin: str
    command: str
    network: Optional[str]
    container: Optional[str]
    ifname: Optional[str]
    pod_namespace: Optional[str]
    pod_name: Optional[str]
    pod_uid: Optional[str]
    exit: int  # the process's exit status: 0, or 1 for any CNI error
    code: int  # 0 on success, else the CNI error's code
    msg: str
    details: str
    ips: tuple[str, ...]  # an ADD's addresses
    seconds: float
    node: Optional[str]
    config: Optional[dict] = field(default=None, repr=False, compare=False)  # the network config on stdin
    policy: Optional[str] = None  # the node policy file the call's environment names

    @classmethod
    def of(cls, plugin: str, env: Mapping[str, str], stdin: bytes, exit_code: int, document: Any,
           seconds: float) -> "CallRecord":
        """The record of one call: its environment and stdin, its exit status and the document it
        printed (a result, a VERSION answer, a CNI error, or None)."""
        pod, config = _pod(env), _config(stdin)
        name = config.get("name") if config is not None else None
        failed = exit_code != 0
        error = document if failed and isinstance(document, dict) else {}
        code = error.get("code") if isinstance(error.get("code"), int) else (exit_code if failed else 0)
        return cls(plugin=plugin, command=env.get("CNI_COMMAND", ""), network=name if isinstance(name, str) else None,
                   container=env.get("CNI_CONTAINERID"), ifname=env.get("CNI_IFNAME"),
                   pod_namespace=pod.get("K8S_POD_NAMESPACE"), pod_name=pod.get("K8S_POD_NAME"),
                   pod_uid=pod.get("K8S_POD_UID"), exit=exit_code, code=code, msg=_cut(error.get("msg")),
                   details=_cut(error.get("details")), ips=() if failed else _addresses(document),
                   seconds=seconds, node=env.get("RDMANET_NODE_NAME"), config=config,
                   policy=env.get(POLICY_ENV))

    @property
    def ok(self) -> bool:
        return self.exit == 0

    @property
    def pod(self) -> Optional[str]:
        return f"{self.pod_namespace}/{self.pod_name}" if self.pod_namespace and self.pod_name else None

    def log_fields(self) -> dict[str, Any]:
        """The fields of the daemon's ``call`` line (``log_event("call", level, **fields)``)."""
        fields: dict[str, Any] = {"plugin": self.plugin, "command": self.command, "network": self.network,
                                  "container": self.container, "ifname": self.ifname, "pod": self.pod,
                                  "pod_uid": self.pod_uid, "result": "ok" if self.ok else "error", "code": self.code}
        if self.ok:
            if self.command == "ADD":
                fields["ips"] = list(self.ips)
        else:
            fields["msg"] = self.msg
            if self.details:
                fields["details"] = self.details
        fields["ms"] = round(self.seconds * 1000, 1)
        return fields

    @property
    def level(self) -> str:
        return "info" if self.ok else "warning"
