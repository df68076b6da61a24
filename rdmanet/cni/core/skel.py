"""Dispatch of one CNI call to a plugin, and the only place that writes to stdout.

A plugin is an object with ``add``, ``delete``, ``check``, ``gc`` and ``status`` methods, each
taking an :class:`Invocation`. ``add`` returns a :class:`Result`; the others return None. Any
failure is a :class:`CNIError`; anything else is a bug, reported as code 999 with the traceback
on stderr (never on stdout).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import traceback
from typing import IO, Mapping, Protocol

from . import deadline as call_deadline
from . import env as request_env
from . import limits, nesting
from .errors import INTERNAL, TRY_AGAIN_LATER, CNIError
from .invocation import Invocation, command_from, parse_invocation
from .result import Result
from .version import LATEST, SUPPORTED_VERSIONS, version_info

log = logging.getLogger("rdmanet")


class Plugin(Protocol):
    # An interface plugin's executable name (never run as an IPAM: rdmanet.cni.core.nesting); None for an IPAM.
    interface_plugin: str | None

    def add(self, inv: Invocation) -> Result: ...
    def delete(self, inv: Invocation) -> None: ...
    def check(self, inv: Invocation) -> None: ...
    def gc(self, inv: Invocation) -> None: ...
    def status(self, inv: Invocation) -> None: ...


def _error_version(stdin: bytes) -> str:
    """Errors are rendered in the config's version when we can read it, else the latest."""
    if len(stdin) > limits.MAX_CONFIG_BYTES:
        return LATEST
    try:
        version = json.loads(stdin).get("cniVersion")
    except Exception:
        return LATEST
    return version if version in SUPPORTED_VERSIONS else LATEST


def handle(plugin: Plugin, environ: Mapping[str, str], stdin: bytes,
           deadline: call_deadline.Deadline | None = None) -> tuple[int, dict | None]:
    """Run one call; returns (exit code, JSON document to print or None).

    ``environ`` is the call's environment for its whole duration (:mod:`rdmanet.cni.core.env`): in the
    daemon, concurrent calls each see their own. ``deadline`` (:mod:`rdmanet.cni.core.deadline`) bounds
    the call; by default the one of the call this one runs inside (an in-process IPAM), else
    ``RDMANET_CALL_TIMEOUT`` seconds (50) from now."""
    if deadline is None:
        deadline = call_deadline.active() or call_deadline.Deadline.after(call_deadline.seconds_from(environ))
    with request_env.scoped(environ), call_deadline.scoped(deadline):
        return _handle(plugin, environ, stdin)


# Resource exhaustion is the node's state, not a bug: the runtime should retry the call later.
EXHAUSTED = {errno.EMFILE: "too many open files in the process", errno.ENFILE: "too many open files on the node",
             errno.ENOMEM: "out of memory", errno.ENOBUFS: "out of kernel buffer space"}


def exhausted(exc: BaseException) -> str | None:
    """What ran out, when ``exc`` (or an exception it came from) is a resource exhaustion."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, MemoryError):
            return "out of memory"
        if isinstance(exc, OSError) and exc.errno in EXHAUSTED:
            return f"{EXHAUSTED[exc.errno]} ({errno.errorcode[exc.errno]})"
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _handle(plugin: Plugin, environ: Mapping[str, str], stdin: bytes) -> tuple[int, dict | None]:
    try:
        if command_from(environ) == "VERSION":
            return 0, version_info()
        caller = environ.get(nesting.CALLER_ENV)
        if caller and getattr(plugin, "interface_plugin", None):
            raise nesting.nested(plugin.interface_plugin, caller)
        inv = parse_invocation(environ, stdin)
        log.debug("%s container=%s ifname=%s netns=%s", inv.command, inv.container_id, inv.ifname, inv.netns)
        if inv.command == "ADD":
            return 0, plugin.add(inv).to_json(inv.cni_version)
        getattr(plugin, {"DEL": "delete"}.get(inv.command, inv.command.lower()))(inv)
        return 0, None
    except CNIError as err:
        log.info("CNI error %d: %s (%s)", err.code, err.msg, err.details)
        return 1, err.to_dict(_error_version(stdin))
    except Exception as exc:  # a bug: say so on stdout as a CNI error, traceback on stderr
        if (what := exhausted(exc)) is not None:
            log.warning("call failed, %s: %s", what, exc)
            err = CNIError(TRY_AGAIN_LATER, f"{what}: {exc}", "the node is short of a resource; the runtime retries the call "
                           "(raise LimitNOFILE / the memory limit of the rdmanet daemon if this persists)")
            return 1, err.to_dict(_error_version(stdin))
        traceback.print_exc(file=sys.stderr)
        err = CNIError(INTERNAL, f"internal error: {type(exc).__name__}: {exc}", "this is a bug in rdmanet; the traceback is on stderr")
        return 1, err.to_dict(_error_version(stdin))


def configure_logging(environ: Mapping[str, str]) -> None:
    """Logs go to stderr (libcni passes it through to the runtime's log), never to stdout."""
    level = environ.get("RDMANET_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level, logging.WARNING),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def read_stdin(environ: Mapping[str, str], stdin: IO[bytes] | None = None) -> bytes:
    """The call's stdin; VERSION ignores it (it may be a tty). At most one byte more than
    :data:`limits.MAX_CONFIG_BYTES` is read: a larger config is refused without being held."""
    if environ.get("CNI_COMMAND") == "VERSION":
        return b""
    source = stdin or sys.stdin.buffer
    chunks, size = [], 0
    while size <= limits.MAX_CONFIG_BYTES:
        chunk = source.read(limits.MAX_CONFIG_BYTES + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def render(document: dict | None) -> str:
    """What a call prints on stdout: the document as one JSON line, or nothing."""
    return "" if document is None else json.dumps(document) + "\n"


def main(plugin: Plugin, environ: Mapping[str, str] | None = None, stdin: IO[bytes] | None = None,
         stdout: IO[str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    configure_logging(environ)
    raw = read_stdin(environ, stdin)
    code, document = handle(plugin, environ, raw)
    out = stdout or sys.stdout
    if document is not None:
        out.write(render(document))
        out.flush()
    return code
