"""The launcher that is the file ``macvlan-rdma`` / ``host-device-rdma`` / ``lease-ipam`` in a CNI
bin dir. STANDARD LIBRARY ONLY: a pod start must not pay for pydantic/pyroute2 imports.

:func:`render_shim` writes this module's own source into the shim, with the plugin name, the
venv's site-packages and the daemon socket baked in, under ``#!<python> -IS``.

Protocol (one request per connection, both sides one JSON line ending in ``\\n``):

    request   {"v": 1, "plugin": "<name>", "env": {<the complete environment>},
               "stdin_b64": "<stdin, base64>"}
    answer    {"code": <exit code>, "stdout_b64": "...", "stderr_b64": "..."}
           or {"exec": true}      the daemon declines: run the call in-process
    health    {"health": true}  ->  {"ok": true, "pid": ..., "uptime": ..., "requests": ...}

When nothing answers on the socket (absent, ECONNREFUSED, EACCES, ...) the call runs
in-process from ``site_dir``: same stdout, same exit code. When the daemon goes away after taking
the request (EOF or reset before the answer), DEL/CHECK/GC/STATUS/VERSION run in-process
(idempotent), while ADD answers CNI error 11 (try again later) instead of re-running an ADD
that may be half done.
"""

import binascii
import json
import os
import socket
import sys

DEFAULT_SOCKET = "/run/rdmanet/daemon.sock"
SOCKET_ENV = "RDMANET_DAEMON_SOCKET"
PROTOCOL = 1
MAX_LINE = 64 << 20
# plugin name -> (module, class); the daemon uses the same table.
PLUGINS = {
    "macvlan-rdma": ("cni.macvlan_rdma.plugin", "MacvlanRdma"),
    "host-device-rdma": ("cni.host_device_rdma.plugin", "HostDeviceRdma"),
    "lease-ipam": ("ipam.plugin", "LeaseIPAM"),
}
# Copies of cni.core (checked equal by the tests): this file may import nothing of ours.
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = "1.1.0"
TRY_AGAIN_LATER = 11


class NoDaemon(Exception):
    """Nothing answered: the call runs in-process."""


class DaemonLost(Exception):
    """The daemon took the request and went away before answering."""


def b64(data):
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def unb64(text):
    return binascii.a2b_base64(text)


def read_line(sock, limit=MAX_LINE):
    """One ``\\n``-terminated line from ``sock``; None on EOF before the newline."""
    chunks = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise ValueError("line too long")


def exchange(socket_path, request, timeout=None):
    """Send one request document, return the answer document (NoDaemon / DaemonLost)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5.0)
        try:
            sock.connect(socket_path)
        except OSError as exc:  # ENOENT, ECONNREFUSED, EACCES, ENOTDIR, timeout: nobody home
            raise NoDaemon(str(exc)) from None
        sock.settimeout(timeout)
        try:
            sock.sendall(json.dumps(request).encode() + b"\n")
            line = read_line(sock)
        except OSError as exc:
            raise DaemonLost(str(exc)) from None
        if line is None:
            raise DaemonLost("the daemon closed the connection before answering")
        try:
            return json.loads(line)
        except ValueError:
            raise DaemonLost("the daemon sent an unreadable answer") from None
    finally:
        sock.close()


def _error_version(stdin):
    try:
        version = json.loads(stdin).get("cniVersion")
    except Exception:
        return LATEST
    return version if version in SUPPORTED_VERSIONS else LATEST


def try_again_later(stdin, why):
    return json.dumps({
        "cniVersion": _error_version(stdin),
        "code": TRY_AGAIN_LATER,
        "msg": "the rdmanet daemon went away during ADD; try again later",
        "details": why,
    }) + "\n"


def in_process(plugin, site_dir, stdin):
    """Run the call here, exactly as the console script would (skel.main)."""
    import io
    import site

    site.addsitedir(site_dir)  # also runs its .pth files (editable installs)
    from cni.core import skel

    module, cls = PLUGINS[plugin]
    instance = getattr(__import__(module, fromlist=[cls]), cls)()
    return skel.main(instance, os.environ, io.BytesIO(stdin))


def run(plugin, site_dir, socket_path=DEFAULT_SOCKET):
    environ = os.environ
    command = environ.get("CNI_COMMAND", "")
    stdin = b"" if command == "VERSION" else sys.stdin.buffer.read()  # VERSION: stdin may be a tty
    path = environ.get(SOCKET_ENV) or socket_path or DEFAULT_SOCKET
    request = {"v": PROTOCOL, "plugin": plugin, "env": dict(environ), "stdin_b64": b64(stdin)}
    try:
        answer = exchange(path, request)
    except NoDaemon:
        return in_process(plugin, site_dir, stdin)
    except DaemonLost as exc:
        if command == "ADD":
            sys.stdout.write(try_again_later(stdin, str(exc)))
            sys.stdout.flush()
            return 1
        return in_process(plugin, site_dir, stdin)
    if answer.get("exec"):
        return in_process(plugin, site_dir, stdin)
    err = unb64(answer.get("stderr_b64", ""))
    if err:
        sys.stderr.buffer.write(err)
        sys.stderr.flush()
    out = unb64(answer.get("stdout_b64", ""))
    if out:
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    return int(answer.get("code", 1))


def render_shim(plugin_name, python, site_dir, socket_path=DEFAULT_SOCKET):
    """The text of the bin-dir file for ``plugin_name``: this module plus a call to :func:`run`."""
    if plugin_name not in PLUGINS:
        raise ValueError("unknown plugin %r" % (plugin_name,))
    if not os.path.isabs(python):
        raise ValueError("the interpreter path must be absolute: %r" % (python,))
    with open(__file__.replace(".pyc", ".py"), encoding="utf-8") as fh:
        source = fh.read()
    return "#!%s -IS\n# rdmanet CNI shim for %s (generated by shim.launcher.render_shim; do not edit)\n%s\n\nif __name__ == \"__main__\":\n    sys.exit(run(%r, %r, %r))\n" % (
        python, plugin_name, source, plugin_name, site_dir, socket_path)


def write_shim(path, plugin_name, python, site_dir, socket_path=DEFAULT_SOCKET):
    """Write the shim at ``path`` (0755) by write + rename: a runtime never execs half a file."""
    tmp = os.path.join(os.path.dirname(path) or ".", ".%s.tmp" % os.path.basename(path))
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(render_shim(plugin_name, python, site_dir, socket_path))
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)
