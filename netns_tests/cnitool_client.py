"""Build and drive the libcni-based ``cnitool`` front end (``cnitool/main.go``).

The netns tests use this as a real CNI runtime: the Go program is compiled
against Debian's libcni (package golang-github-appc-cni-dev, GOPATH mode) with
Debian's Go, and then invoked once per CNI verb with a bare environment.

    binary = build(build_dir)
    proc = run(binary, "add", "mynet", "/run/netns/x",
               netconfpath=conf_dir, cni_path=[plugin_dir],
               cache_dir=cache_dir)
    result = json.loads(proc.stdout)

Neither function skips or fails a test by itself: ``build`` raises
``RuntimeError`` and ``run`` returns the ``CompletedProcess`` whatever the exit
status, so the caller decides what a failure means. ``missing_prerequisites``
tells a caller whether building can work at all on this machine.

Output contract of the binary:

* ``add`` prints the CNI result (libcni ``Result.Print()``) on stdout;
  ``check``, ``del``, ``gc`` and ``status`` print nothing on success.
* On failure the exit status is 1 and the error text is on stderr; when the
  error is a CNI error (``*types.Error``: from a plugin, or from libcni's own
  validators) stdout also carries ``{"code": N, "msg": "...", "details": "..."}``
  (see ``error_of``).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "GO",
    "GOPATH",
    "LIBCNI_DIR",
    "SOURCE",
    "BARE_PATH",
    "missing_prerequisites",
    "build",
    "run",
    "container_id",
    "error_of",
]

GO = "/usr/bin/go"
GOPATH = "/usr/share/gocode"
LIBCNI_DIR = pathlib.Path(GOPATH) / "src/github.com/containernetworking/cni/libcni"
SOURCE = pathlib.Path(__file__).resolve().parent / "cnitool" / "main.go"
BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
BINARY_NAME = "cnitool"
BUILD_TIMEOUT = 600


def missing_prerequisites() -> str | None:
    """Return why ``build`` cannot work here (Go or libcni missing), else None."""
    if not os.access(GO, os.X_OK):
        return f"Go compiler {GO} not found (install Debian's golang-go / golang-1.19-go)"
    if not (LIBCNI_DIR / "api.go").is_file():
        return f"libcni source not found at {LIBCNI_DIR} (install golang-github-appc-cni-dev)"
    if not SOURCE.is_file():
        return f"cnitool source {SOURCE} is missing"
    return None


def build(build_dir: pathlib.Path) -> pathlib.Path:
    """Compile ``cnitool/main.go`` into ``build_dir/cnitool`` and return its path.

    Nothing is compiled when the binary already exists and is newer than
    ``main.go``. The build runs in GOPATH mode against Debian's libcni with a
    private GOCACHE under ``build_dir``; a failure raises ``RuntimeError``
    carrying go's output.
    """
    build_dir = pathlib.Path(build_dir)
    binary = build_dir / BINARY_NAME
    source = SOURCE
    if binary.is_file() and binary.stat().st_mtime > source.stat().st_mtime:
        return binary

    reason = missing_prerequisites()
    if reason is not None:
        raise RuntimeError(f"cannot build cnitool: {reason}")

    build_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": BARE_PATH,
        "HOME": str(build_dir),
        "GO111MODULE": "off",
        "GOPATH": GOPATH,
        "GOCACHE": str(build_dir / "gocache"),
        "GOENV": "off",
        "GOFLAGS": "",
        "CGO_ENABLED": "0",
    }
    # Build to a temporary name and rename, so a concurrent or interrupted
    # build never leaves a truncated binary that looks up to date.
    partial = build_dir / f".{BINARY_NAME}.{os.getpid()}.tmp"
    cmd = [GO, "build", "-o", str(partial), str(source)]
    try:
        proc = subprocess.run(
            cmd,
            cwd=str(source.parent),
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"cannot run {' '.join(cmd)}: {exc}") from exc
    if proc.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"building cnitool failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}"
        )
    os.replace(partial, binary)
    return binary


def _path_list(value: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> str:
    if isinstance(value, (str, os.PathLike)):
        return os.fspath(value)
    return ":".join(os.fspath(v) for v in value)


def run(
    binary: pathlib.Path | str,
    verb: str,
    net: str,
    netns_path: pathlib.Path | str,
    *,
    netconfpath: pathlib.Path | str,
    cni_path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    ifname: str = "eth0",
    cni_args: str | None = None,
    cap_args: Mapping[str, Any] | str | None = None,
    cache_dir: pathlib.Path | str | None = None,
    valid_attachments: Sequence[Mapping[str, str]] | str | None = None,
    extra_env: Mapping[str, str] | None = None,
    wrap: Sequence[str] = (),
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``cnitool <verb> <net> <netns_path>`` and return the finished process.

    The child gets a bare environment: PATH plus only the CNI variables given
    here. ``cni_path`` is a ':'-joined string or a sequence of directories;
    ``cap_args`` and ``valid_attachments`` may be Python objects (JSON-encoded
    here) or ready JSON strings; ``None`` leaves a variable unset.
    ``extra_env`` adds further variables (e.g. ``RDMANET_SYSFS_ROOT``); libcni
    passes the runtime's environment on to every plugin it executes. ``wrap``
    is a command prefix that runs cnitool elsewhere (e.g. ``nsenter -t PID -m --``
    for a node's private mount namespace). The exit status is not checked.
    """
    env = {
        "PATH": BARE_PATH,
        "NETCONFPATH": os.fspath(netconfpath),
        "CNI_PATH": _path_list(cni_path),
        "CNI_IFNAME": ifname,
    }
    if cni_args is not None:
        env["CNI_ARGS"] = cni_args
    if cap_args is not None:
        env["CAP_ARGS"] = cap_args if isinstance(cap_args, str) else json.dumps(cap_args)
    if cache_dir is not None:
        env["CNI_CACHE_DIR"] = os.fspath(cache_dir)
    if valid_attachments is not None:
        env["CNI_VALID_ATTACHMENTS"] = (
            valid_attachments
            if isinstance(valid_attachments, str)
            else json.dumps(list(valid_attachments))
        )
    if extra_env:
        env.update(extra_env)
    return subprocess.run(
        [*wrap, os.fspath(binary), verb, net, os.fspath(netns_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def container_id(netns_path: pathlib.Path | str) -> str:
    """The container ID cnitool derives for ``netns_path`` (as upstream cnitool)."""
    absolute = os.path.abspath(os.fspath(netns_path))
    return "cnitool-" + hashlib.sha512(absolute.encode()).digest()[:10].hex()


def error_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any] | None:
    """The ``{"code", "msg", "details"}`` CNI error a failed run printed, if any."""
    if proc.returncode == 0:
        return None
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "code" in obj and "msg" in obj:
            return obj
    return None


if __name__ == "__main__":  # pragma: no cover - manual use
    import sys
    import tempfile

    out = build(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(tempfile.mkdtemp()))
    print(out)
