"""IPAM delegation (SPEC section 4, pkg/invoke): exec ``ipam.type`` found on CNI_PATH with the
same environment and the complete stdin; only CNI_COMMAND changes with the verb.

:data:`IN_PROCESS` lets a long-lived process (the node daemon) run an IPAM plugin it has already
imported instead of exec'ing it: a handler takes the environment (with CNI_COMMAND set to the
verb) and stdin, and returns ``(exit code, stdout document or None)`` exactly as
:func:`rdmanet.cni.core.skel.handle` does.

The IPAM plugins of this distribution (:data:`IN_PROCESS_PLUGINS`: ``lease-ipam``) always run
in-process, in the daemon and in a plugin's own process alike: an exec would start a second
interpreter and import the stack again (~180 ms) to give the same answer. A call carrying a test
crash hook (:data:`CRASH_HOOKS`, which ``os._exit()``) is exec'd in a process of its own.

Either way the plugin must still be found on CNI_PATH (same errors as an exec), and its answer
goes through the same parsing as an exec'd plugin's stdout. Any other IPAM is exec'd.

An exec'd plugin runs under the call's deadline (:mod:`rdmanet.cni.core.deadline`): when the deadline
passes, or (ADD only) the caller goes away, it is killed (with its process group) and the call
fails with CNI error 11; the caller's rollback then sends the IPAM DEL."""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from . import deadline as call_deadline
from . import nesting
from .errors import INVALID_CONFIG, IPAM_FAILURE, CNIError
from .invocation import Invocation
from .result import Result
from .rollback import quietly
from .skel import handle, render

if TYPE_CHECKING:
    import subprocess

# A handler returns None to decline (the plugin is exec'd as usual).
InProcessHandler = Callable[[Mapping[str, str], bytes], "Optional[tuple[int, Optional[dict]]]"]
IN_PROCESS: dict[str, InProcessHandler] = {}
# IPAM type -> (module, class) of the plugins shipped with rdmanet, imported on first use.
IN_PROCESS_PLUGINS = {"lease-ipam": ("rdmanet.ipam.plugin", "LeaseIPAM")}
# Test-only hooks that os._exit() the process that runs the plugin.
CRASH_HOOKS = ("LEASE_IPAM_TEST_CRASH_AT", "HOST_DEVICE_RDMA_TEST_CRASH_AT")
log = logging.getLogger("rdmanet.node")  # the daemon writes it whatever the call's log level


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
    env[nesting.CALLER_ENV] = f"{inv.config.get('type')} {inv.network_name}/{inv.container_id}/{inv.ifname}"
    answer = _in_process(name, env, inv.stdin if stdin is None else stdin)
    if answer is not None:
        code, document = answer
        # What the exec'd plugin would have printed (skel.main), parsed the same way.
        out = render(document).encode()
        return _parse_answer(name, command, out.strip(), code)
    out, returncode = _run_bounded(binary, command, env, inv.stdin if stdin is None else stdin)
    return _parse_answer(name, command, out.strip(), returncode)


def _run_bounded(binary: str, command: str, env: Mapping[str, str], stdin: bytes) -> tuple[bytes, int]:
    """(stdout, exit code) of ``binary``, killed when the call's deadline passes or, for ADD, its
    caller goes away."""
    import subprocess  # only for an exec'd IPAM: lease-ipam runs in-process (~5 ms of imports saved)

    deadline = call_deadline.current()
    try:
        proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=env,
                                start_new_session=True)  # its own process group: killed with its children
    except OSError as exc:
        raise CNIError(IPAM_FAILURE, f"cannot run IPAM plugin {binary}: {exc}", "check the plugin binary is executable") from exc
    pending: bytes | None = stdin
    while True:
        try:
            out, _ = proc.communicate(input=pending, timeout=min(0.1, max(deadline.remaining(), 0.01)))
            return out, proc.returncode
        except subprocess.TimeoutExpired:
            pending = None
        if deadline.remaining() <= 0:
            why = f"did not answer {command} in time"
        elif command == "ADD" and deadline.caller_gone():
            why = f"was still running {command} when the caller went away"
        else:
            continue
        _kill(proc)
        raise call_deadline.Abandoned(f"IPAM plugin {binary} {why}; it was killed",
                                      "the runtime retries the call; a slow IPAM must answer within the call timeout "
                                      f"({call_deadline.TIMEOUT_ENV}, default {call_deadline.DEFAULT_SECONDS:.0f} s)")


def _kill(proc: "subprocess.Popen") -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.communicate()


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
    """The IPAM half of a main plugin: allocate on ADD, release/forward on the other verbs.

    ``ipam.type`` naming one of our interface plugins (:mod:`rdmanet.cni.core.nesting`) is refused
    on ADD, CHECK and STATUS, and skipped on DEL and GC."""

    def __init__(self, ipam_type: str, inv: Invocation) -> None:
        self.type = ipam_type
        self.inv = inv

    def _refused(self, skipping: str = "") -> bool:
        """Raise (or, with ``skipping``, log and return True) when ipam.type is an interface plugin."""
        if self.type not in nesting.INTERFACE_PLUGINS:
            return False
        if not skipping:
            raise nesting.not_an_ipam(self.type)
        log.warning("ipam.type %s is an interface plugin, not an IPAM plugin: %s skipped (its ADD was refused, "
                    "nothing was allocated)", self.type, skipping)
        return True

    @classmethod
    def of(cls, inv: Invocation) -> "Optional[IPAM]":
        """The config's IPAM (None without an ``ipam`` object), read without the config models:
        for the verbs that need nothing else of the config (DEL and GC release what ADD made), so
        they pay no pydantic import and model building (~70 ms of CPU per exec'd call)."""
        ipam = inv.config.get("ipam")
        if ipam is None:
            return None
        kind = ipam.get("type") if isinstance(ipam, dict) else None
        if not isinstance(kind, str) or not kind:
            raise CNIError(INVALID_CONFIG, f"invalid network config: ipam.type: {kind!r} is not a plugin name",
                           'name the IPAM plugin binary, e.g. "ipam": {"type": "lease-ipam", ...}')
        return cls(kind, inv)

    def add(self) -> Result:
        self._refused()
        doc = exec_plugin(self.type, self.inv, "ADD")
        result = Result.from_json(doc, f"IPAM plugin {self.type} result")
        if not result.ips:
            raise CNIError(IPAM_FAILURE, f"IPAM plugin {self.type} returned no IP configuration", "check the ipam block's ranges")
        return result

    def add_into(self, result: Result, undo) -> None:
        """ADD, with the addresses on interface 0 of ``result`` (the plugin's one interface);
        registers the IPAM DEL on ``undo`` (an ExitStack or a :class:`rdmanet.cni.core.rollback.Undo`) for
        when a later step fails, and when the IPAM was killed half-way (deadline, caller gone: it
        may have reserved). Not when it answered an error: it reserved nothing then, and a DEL
        could release the reservation of the attachment's first ADD (host-local refuses a second
        ADD of an attachment as a duplicate). A crash in between is covered by the runtime's DEL,
        which always releases the attachment's reservation."""
        try:
            allocated = self.add()
        except call_deadline.Abandoned:
            undo.callback(quietly, self.delete)
            raise
        undo.callback(quietly, self.delete)
        for ip in allocated.ips:
            ip.interface = 0
        result.ips, result.routes, result.dns = allocated.ips, allocated.routes, allocated.dns

    def delete(self) -> None:
        if not self._refused(skipping="DEL"):
            exec_plugin(self.type, self.inv, "DEL")

    def check(self) -> None:
        self._refused()
        exec_plugin(self.type, self.inv, "CHECK")

    def gc(self) -> None:
        if not self._refused(skipping="GC"):
            exec_plugin(self.type, self.inv, "GC")

    def status(self) -> None:
        self._refused()
        exec_plugin(self.type, self.inv, "STATUS")
