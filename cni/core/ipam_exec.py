"""IPAM delegation (SPEC section 4, pkg/invoke): exec ``ipam.type`` found on CNI_PATH with the
same environment and the complete stdin; only CNI_COMMAND changes with the verb.

:data:`IN_PROCESS` lets a long-lived process (the node daemon) run an IPAM plugin it has already
imported instead of exec'ing it: a handler takes the environment (with CNI_COMMAND set to the
verb) and stdin, and returns ``(exit code, stdout document or None)`` exactly as
:func:`cni.core.skel.handle` does.

The IPAM plugins of this distribution (:data:`IN_PROCESS_PLUGINS`: ``lease-ipam``) always run
in-process, in the daemon and in a plugin's own process alike: an exec would start a second
interpreter and import the stack again (~180 ms) to give the same answer. A call carrying a test
crash hook (:data:`CRASH_HOOKS`, which ``os._exit()``) is exec'd in a process of its own.

Either way the plugin must still be found on CNI_PATH (same errors as an exec), and its answer
goes through the same parsing as an exec'd plugin's stdout. Any other IPAM is exec'd."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
from typing import Callable, Mapping, Optional

from .errors import INVALID_CONFIG, IPAM_FAILURE, CNIError
from .invocation import Invocation
from .result import Result
from .rollback import quietly
from .skel import handle, render

# A handler returns None to decline (the plugin is exec'd as usual).
InProcessHandler = Callable[[Mapping[str, str], bytes], "Optional[tuple[int, Optional[dict]]]"]
IN_PROCESS: dict[str, InProcessHandler] = {}
# IPAM type -> (module, class) of the plugins shipped with rdmanet, imported on first use.
IN_PROCESS_PLUGINS = {"lease-ipam": ("ipam.plugin", "LeaseIPAM")}
# Test-only hooks that os._exit() the process that runs the plugin.
CRASH_HOOKS = ("LEASE_IPAM_TEST_CRASH_AT",)


def find_plugin(name: str, path: list[str]) -> str:
    if not name or "/" in name or name in (".", ".."):
        raise CNIError(INVALID_CONFIG, f"invalid plugin name {name!r}", "a plugin type is a bare binary name found on CNI_PATH")
    for directory in path:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate):
            return candidate
    raise CNIError(
        INVALID_CONFIG,
        f'failed to find plugin "{name}" in path {path}',
        f"install {name} into one of the CNI_PATH directories or fix ipam.type",
    )


def exec_plugin(name: str, inv: Invocation, command: str, stdin: Optional[bytes] = None) -> Optional[dict]:
    """Run plugin ``name`` for ``command``; returns its parsed stdout (None when empty)."""
    binary = find_plugin(name, inv.path)
    env = dict(inv.env)
    env["CNI_COMMAND"] = command
    answer = _in_process(name, env, inv.stdin if stdin is None else stdin)
    if answer is not None:
        code, document = answer
        # What the exec'd plugin would have printed (skel.main), parsed the same way.
        out = render(document).encode()
        return _parse_answer(name, command, out.strip(), code)
    try:
        proc = subprocess.run(
            [binary], input=inv.stdin if stdin is None else stdin, env=env, stdout=subprocess.PIPE, stderr=None, check=False
        )
    except OSError as exc:
        raise CNIError(IPAM_FAILURE, f"cannot run IPAM plugin {binary}: {exc}", "check the plugin binary is executable") from exc
    return _parse_answer(name, command, proc.stdout.strip(), proc.returncode)


def _in_process(name: str, env: Mapping[str, str], stdin: bytes) -> Optional[tuple[int, Optional[dict]]]:
    """The plugin's answer when it runs in this process, None when it must be exec'd."""
    handler = IN_PROCESS.get(name)
    if handler is not None:
        return handler(env, stdin)
    shipped = IN_PROCESS_PLUGINS.get(name)
    if shipped is None or any(hook in env for hook in CRASH_HOOKS):
        return None
    module, cls = shipped
    return handle(getattr(importlib.import_module(module), cls)(), env, stdin)


def _parse_answer(name: str, command: str, out: bytes, returncode: int) -> Optional[dict]:
    if returncode != 0:
        raise _plugin_error(name, command, out, returncode)
    if not out:
        return None
    try:
        return json.loads(out)
    except ValueError as exc:
        raise CNIError(IPAM_FAILURE, f"IPAM plugin {name} printed invalid JSON for {command}", out[:300].decode(errors="replace")) from exc


def _plugin_error(name: str, command: str, out: bytes, returncode: int) -> CNIError:
    try:
        doc = json.loads(out)
        return CNIError(int(doc["code"]), doc.get("msg", ""), doc.get("details", ""))
    except (ValueError, KeyError, TypeError):
        text = out[:300].decode(errors="replace")
        return CNIError(IPAM_FAILURE, f"IPAM plugin {name} failed {command} with exit code {returncode}", text)


class IPAM:
    """The IPAM half of a main plugin: allocate on ADD, release/forward on the other verbs."""

    def __init__(self, ipam_type: str, inv: Invocation) -> None:
        self.type = ipam_type
        self.inv = inv

    def add(self) -> Result:
        doc = exec_plugin(self.type, self.inv, "ADD")
        result = Result.from_json(doc, f"IPAM plugin {self.type} result")
        if not result.ips:
            raise CNIError(IPAM_FAILURE, f"IPAM plugin {self.type} returned no IP configuration", "check the ipam block's ranges")
        return result

    def add_into(self, result: Result, undo) -> None:
        """ADD, with the addresses on interface 0 of ``result`` (the plugin's one interface);
        registers the IPAM DEL on ``undo`` (an ExitStack) for when a later step fails."""
        allocated = self.add()
        undo.callback(quietly, self.delete)
        for ip in allocated.ips:
            ip.interface = 0
        result.ips, result.routes, result.dns = allocated.ips, allocated.routes, allocated.dns

    def delete(self) -> None:
        exec_plugin(self.type, self.inv, "DEL")

    def check(self) -> None:
        exec_plugin(self.type, self.inv, "CHECK")

    def gc(self) -> None:
        exec_plugin(self.type, self.inv, "GC")

    def status(self) -> None:
        exec_plugin(self.type, self.inv, "STATUS")
