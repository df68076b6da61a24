"""The launcher that is the file ``macvlan-rdma`` / ``host-device-rdma`` / ``ipoib-rdma`` / ``lease-ipam`` in a CNI
bin dir. STANDARD LIBRARY ONLY: a pod start must not pay for pydantic/pyroute2 imports. It also
runs on a node's own ``python3`` (DaemonSet mode, below), so it keeps to Python 3.6 syntax and
library (a test parses it with ``feature_version=(3, 6)``).

:func:`render_shim` writes the shim under ``#!<python> -IS``: a few lines (:mod:`rdmanet.node.boot`) that
run the hot path (:mod:`rdmanet.node.fast`) from its code marshalled beside the shim (``.<name>.code``,
:func:`code_path`, which the shim checks and rewrites itself), the sources compiled only on a cold
path, the plugin name, the venv's site-packages (or None: daemon only) and the daemon socket.

Protocol: one request per connection, answered once; the daemon then closes. A CNI call uses a
binary framing, so that the shim needs neither ``json`` nor ``socket.py`` (together ~9 ms of
imports on every exec, as much as a Go plugin's whole ADD):

    request   b"RDMANET 2 <plugin> <env bytes> <stdin bytes>\\n" <env> <stdin>
              env: the complete environment as b"KEY=VALUE" entries joined by NUL bytes
    answer    b"<exit code> <stdout bytes> <stderr bytes>\\n" <stdout> <stderr>
           or b"exec <why>\\n"      the daemon declines: run the call in-process

Tools (``rdmanet daemon --check``, doctor, tests) speak one JSON line each way:

    health    {"health": true}  ->  {"ok": true, "pid": ..., "uptime": ..., "requests": ...}
    call      {"v": 1, "plugin": "<name>", "env": {...}, "stdin_b64": "..."}
              -> {"code": ..., "stdout_b64": "...", "stderr_b64": "..."} or {"exec": true, "why": ...}
              (the framing of the first shims; still served)

A DEL that does not succeed (the daemon is down or restarting, the API server is out) is written
to ``<socket dir>/del-journal/`` in the same binary framing, one file per (plugin, containerID,
ifname); the daemon replays those DELs when it starts and periodically (:mod:`rdmanet.node.del_journal`),
because Multus' thick plugin logs a failed DEL and reports success: nobody else would retry it.
An ADD of the attachment removes its entry first.

A connect that finds the daemon's accept queue full (EAGAIN: a burst of calls, many pods starting
at once) is retried for up to ``BUSY_SECONDS``: a busy daemon is not an absent one.

Nothing is sent before the server is known to be the daemon: its credentials (SO_PEERCRED, those
of whoever bound the socket) must be root's or those of the uid the shim was rendered with
(``server_uid``, install.sh: 0). Anyone else listening there (a socket bound in a directory others
may write, while the daemon was down) gets nothing: the call goes on as with no daemon at all.

Two kinds of shim:

**With a fallback** (``site_dir`` set; host mode of install.sh, the tests): when nothing answers
on the socket (absent, ECONNREFUSED, EACCES, ...) the call runs in-process from ``site_dir``:
same stdout, same exit code. When the daemon goes away after taking the request (EOF or reset
before the answer), DEL/CHECK/GC/STATUS/VERSION run in-process (idempotent), while ADD answers
CNI error 11 (try again later) instead of re-running an ADD that may be half done.

**Daemon only** (``site_dir`` None; DaemonSet mode of install.sh, ``python -m rdmanet.node
--daemon-only``). The shim runs on the node, under the node's interpreter (install.sh
``--host-python``, Python >= 3.6), but the plugin code and its dependencies live in the
DaemonSet's image, not on the node: there is nothing to run in-process. So every call goes to the
daemon, and when the daemon does not answer (not running, restarting, gone during the call) the
shim prints CNI error 11 (try again later) naming the socket and asking whether the rdmanet
DaemonSet pod runs on this node, and exits 1: the runtime retries ADD and DEL later, nothing was
half done, and nothing is reported as released that was not (a DEL that "succeeded" without the
daemon would leak its address). Two verbs answer differently without the daemon: VERSION, which
the shim then answers itself, byte for byte as the plugins do (a test compares), so a runtime or
install.sh can probe a shim before the daemon is up; and STATUS, which answers CNI error 50
(plugin not available), the code the spec gives STATUS for "ADD cannot succeed now".
"""

import _socket  # not socket.py: its imports (enum, selectors) cost ~7 ms per exec
import binascii
import os
import sys
import time

DEFAULT_SOCKET = "/run/rdmanet/daemon.sock"
SOCKET_ENV = "RDMANET_DAEMON_SOCKET"
PROTOCOL = 2  # the binary call framing
JSON_PROTOCOL = 1  # the JSON call framing
MAX_LINE = 64 << 20
# plugin name -> (module, class); the daemon uses the same table.
PLUGINS = {
    "macvlan-rdma": ("rdmanet.plugins.macvlan_rdma.plugin", "MacvlanRdma"),
    "host-device-rdma": ("rdmanet.plugins.host_device_rdma.plugin", "HostDeviceRdma"),
    "ipoib-rdma": ("rdmanet.plugins.ipoib_rdma.plugin", "IpoibRdma"),
    "lease-ipam": ("rdmanet.ipam.plugin", "LeaseIPAM"),
}
# Copies of rdmanet.cni.core (checked equal by the tests): this file may import nothing of ours.
SUPPORTED_VERSIONS = ("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
LATEST = "1.1.0"
TRY_AGAIN_LATER = 11
NOT_AVAILABLE = 50  # STATUS: ADD cannot succeed now
SHIM_LAUNCHER = "rdmanet_shim_launcher"  # __name__ of this code when a shim runs it (rdmanet.node.fast._launcher)
BUSY_SECONDS = 10.0  # how long a connect waits while the daemon's accept queue is full
JOURNAL_DIR = "del-journal"  # beside the socket: DELs that failed, replayed by the daemon


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


def _connect(sock, socket_path, busy_seconds=BUSY_SECONDS):
    """connect(), waiting while the daemon's accept queue is full.

    A connect to a unix socket whose listen backlog is full fails at once with EAGAIN (the socket
    has a timeout, so it is non-blocking): the daemon is busy with a burst of calls (many pods
    starting at once), not gone. Retry for up to ``busy_seconds`` before calling it absent."""
    deadline = time.monotonic() + busy_seconds
    delay = 0.002
    while True:
        try:
            sock.connect(socket_path)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.05)


def peer_refused(sock, server_uid=0):
    """Why the server on the connected unix socket ``sock`` is not the daemon (None: it is): its
    uid (SO_PEERCRED: whoever bound and listens) must be 0 or ``server_uid``.
    Shared with :mod:`rdmanet.node.fast` (a copy there: it imports nothing of ours)."""
    try:
        creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    except OSError as exc:
        return "cannot read the credentials of its server: %s" % (exc,)
    uid = int.from_bytes(creds[4:8], sys.byteorder)
    if uid in (0, server_uid):
        return None
    return ("it is served by uid %d, not by root%s: nothing was sent to it (is the socket's directory writable "
            "by others?)" % (uid, "" if not server_uid else " or uid %d" % server_uid))


def _send(socket_path, data, timeout, server_uid=None):
    """Connect, send ``data``, return everything the daemon sends until it closes. The server
    must be root or ``server_uid`` (None: the caller's own uid), else NoDaemon."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(5.0)
        try:
            _connect(sock, socket_path)
        except OSError as exc:  # ENOENT, ECONNREFUSED, EACCES, ENOTDIR, timeout: nobody home
            raise NoDaemon(str(exc)) from None
        refused = peer_refused(sock, os.geteuid() if server_uid is None else server_uid)
        if refused is not None:
            raise NoDaemon("%s: %s" % (socket_path, refused))
        sock.settimeout(timeout)
        chunks = []
        try:
            sock.sendall(data)
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError as exc:
            raise DaemonLost(str(exc)) from None
        return b"".join(chunks)
    finally:
        sock.close()


def frame(plugin, environb, stdin):
    """A CNI call in the binary framing (the request, and a journal entry)."""
    env = b"\0".join(k + b"=" + v for k, v in environb.items())
    head = ("RDMANET %d %s %d %d\n" % (PROTOCOL, plugin, len(env), len(stdin))).encode("ascii")
    return head + env + stdin


def call(socket_path, plugin, environb, stdin, timeout=None, server_uid=None):
    """One CNI call in the binary framing: (exit code, stdout, stderr), or (None, why, b"") when
    the daemon declines it (NoDaemon / DaemonLost)."""
    line, newline, rest = _send(socket_path, frame(plugin, environb, stdin), timeout, server_uid).partition(b"\n")
    if not newline:
        raise DaemonLost("the daemon closed the connection before answering")
    if line.startswith(b"exec"):
        return None, line[5:].decode("utf-8", "replace"), b""
    try:
        code, n_out, n_err = (int(field) for field in line.split())
    except ValueError:
        raise DaemonLost("the daemon sent an unreadable answer") from None
    if len(rest) != n_out + n_err:
        raise DaemonLost("the daemon's answer was cut short")
    return code, rest[:n_out], rest[n_out:]


def exchange(socket_path, request, timeout=None):
    """Send one JSON request document, return the answer document (NoDaemon / DaemonLost)."""
    import json

    line, newline, _ = _send(socket_path, json.dumps(request).encode() + b"\n", timeout).partition(b"\n")
    if not newline:
        raise DaemonLost("the daemon closed the connection before answering")
    try:
        return json.loads(line)
    except ValueError:
        raise DaemonLost("the daemon sent an unreadable answer") from None


def _error_version(stdin):
    import json

    try:
        version = json.loads(stdin).get("cniVersion")
    except Exception:
        return LATEST
    return version if version in SUPPORTED_VERSIONS else LATEST


def cni_error(stdin, code, msg, details):
    """A CNI error document (one line), in the config's version when it is readable."""
    import json

    return json.dumps({"cniVersion": _error_version(stdin), "code": code, "msg": msg, "details": details}) + "\n"


def try_again_later(stdin, why):
    return cni_error(stdin, TRY_AGAIN_LATER, "the rdmanet daemon went away during ADD; try again later", why)


def version_answer():
    """What the plugins print for VERSION (skel.render(version.version_info())), byte for byte."""
    import json

    return json.dumps({"cniVersion": LATEST, "supportedVersions": list(SUPPORTED_VERSIONS)}) + "\n"


def no_daemon(command, stdin, socket_path, why):
    """(exit code, stdout) of a daemon-only shim whose daemon does not answer."""
    if command == "VERSION":
        return 0, version_answer()
    msg = ("the rdmanet daemon does not answer on %s: is the rdmanet DaemonSet pod running on this node?"
           % (socket_path,))
    details = ("%s; this shim has no in-process fallback (the plugin code is in the DaemonSet's image), "
               "nothing was done: try again later" % (why,))
    code = NOT_AVAILABLE if command == "STATUS" else TRY_AGAIN_LATER
    return 1, cni_error(stdin, code, msg, details)


def in_process(plugin, site_dir, stdin):
    """Run the call here, exactly as the console script would (skel.main).

    The cyclic garbage collector is off for the call: the process ends with it (:func:`finish`).
    While a macvlan-rdma ADD imports its ~270 modules, whose objects live to the end, the collector
    ran ~65 times for ~14 ms of CPU (~6 % of the call) and found ~500 unreachable objects among
    ~28 000. What the call leaves in reference cycles goes back with the process's memory.

    Run by a shim, what the standard library compiles from text while the call imports (~70
    dataclasses' methods, ~800 forward references, ~25 namedtuples) comes compiled from beside the shim
    (:func:`texts_path`, :mod:`rdmanet.node.compiled_texts`): ~12 ms of CPU per call. A VERSION call uses
    that file but never writes it (a probe, such as ``rdmanet doctor``'s, leaves the bin dir as
    it was); the first call of another verb does."""
    import gc
    import io
    import site

    gc.disable()

    site.addsitedir(site_dir)  # also runs its .pth files (editable installs)
    texts = None
    if __name__ == SHIM_LAUNCHER and __file__:  # run by a shim: __file__ is the shim (rdmanet.node.fast)
        from rdmanet.node import compiled_texts

        texts = compiled_texts.install(texts_path(__file__))
    from rdmanet.cni.core import skel

    module, cls = PLUGINS[plugin]
    instance = getattr(__import__(module, fromlist=[cls]), cls)()
    code = skel.main(instance, os.environ, io.BytesIO(stdin))
    if texts is not None and os.environ.get("CNI_COMMAND") != "VERSION":
        texts.save()  # not for VERSION: the probe of install.sh, `rdmanet doctor`, runtimes writes nothing
    return code


def finish(code):
    """End the process after a call that ran here (the shim's in-process path), as the
    interpreter's exit would, less the teardown of every module the call imported: with the
    plugin's ~270 modules (pydantic, pyroute2, ...) that teardown is ~15-20 ms of CPU, more than
    the call's own work. What an exit does for the call is still done, in its order: the exit
    handlers (``atexit``: logging's flush and close, filelock's release of held locks,
    ``weakref.finalize`` callbacks) and the flush of stdout and stderr; then ``os._exit(code)``.

    Returns ``code`` (for the normal exit) when another thread is alive (the interpreter's exit
    would wait for it), when this interpreter has no ``atexit._run_exitfuncs``, or when stdout
    or stderr cannot be flushed (the interpreter reports that and exits 120)."""
    threading = sys.modules.get("threading")
    if threading is not None and threading.active_count() > 1:
        return code
    import atexit

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None or not isinstance(code, int):
        return code
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return code
    run_exit_handlers()  # clears them: they run once
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(code & 0xFF)


def _print(text):
    sys.stdout.write(text)
    sys.stdout.flush()


def journal_path(socket_path, plugin, environb):
    """The journal entry of one attachment's DEL: ``<socket dir>/del-journal/<hex key>.del``."""
    key = b"\0".join((plugin.encode("ascii"), environb.get(b"CNI_CONTAINERID", b""), environb.get(b"CNI_IFNAME", b"")))
    name = binascii.hexlify(key)
    if len(name) > 200:
        name = name[:184] + (b"%08x" % binascii.crc32(key))
    return os.path.join(os.path.dirname(socket_path), JOURNAL_DIR, name.decode("ascii") + ".del")


def journal_del(socket_path, plugin, environb, stdin):
    """Keep a DEL that did not succeed for the daemon to replay: Multus' thick plugin logs a
    failed DEL and reports success, so the runtime never retries it. Written by rename (the
    daemon never reads half an entry); a later ADD of the attachment removes it first."""
    path = journal_path(socket_path, plugin, environb)
    directory = os.path.dirname(path)
    tmp = os.path.join(directory, ".%d.%d.tmp" % (os.getpid(), int(time.time() * 1e6)))
    try:
        try:
            os.mkdir(directory, 0o700)  # not its parents: the socket's directory is the daemon's
        except FileExistsError:
            pass
        st = os.lstat(directory)  # a symlink or someone else's directory planted there: never written into
        if (st.st_mode & 0o170000) != 0o040000 or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise OSError("not a directory of uid %d closed to others (uid %d, mode %o)"
                          % (os.geteuid(), st.st_uid, st.st_mode & 0o7777))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            data = memoryview(frame(plugin, environb, stdin))
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        sys.stderr.write("rdmanet shim: cannot journal the failed DEL in %s: %s\n" % (directory, exc))
        try:
            os.unlink(tmp)
        except OSError:
            pass


JOURNAL_LOCKS = 64  # lock stripes in the journal directory (".lock-NN": a replay skips dot files)


def journal_lock(entry):
    """The flock (a file descriptor to close) serialising one attachment's journal entry: a
    replay holds it from its re-check of the entry to the entry's removal after its DEL, and an
    ADD that finds an entry holds it to remove the entry, so the ADD runs either before the
    replay looked (which then finds no entry) or after its DEL (never undone by it)."""
    import fcntl  # only when an entry exists: the ADD hot path does not pay for it

    directory, name = os.path.split(entry)
    lock = os.path.join(directory, ".lock-%02d" % (binascii.crc32(name.encode()) % JOURNAL_LOCKS))
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def forget_del(socket_path, plugin, environb):
    """The attachment is being added again: a journaled DEL of it must not be replayed after this
    returns (see :func:`journal_lock`). No entry (the usual case) costs one lstat."""
    path = journal_path(socket_path, plugin, environb)
    try:
        os.lstat(path)
    except OSError:
        return  # none: a replay removes an entry only after its DEL, so none is running for it
    try:
        fd = journal_lock(path)
    except OSError:
        fd = -1  # no lock to be had: remove it anyway (as before the lock existed)
    try:
        os.unlink(path)
    except OSError:
        pass
    finally:
        if fd >= 0:
            os.close(fd)


def run(plugin, site_dir, socket_path=DEFAULT_SOCKET, server_uid=0):
    """One CNI call. ``site_dir`` None (or empty): daemon only, no in-process fallback.
    ``server_uid``: besides root, the uid the daemon may run as (see :func:`peer_refused`).

    A DEL that fails, by any path, is journaled for the daemon to replay (see :func:`journal_del`)."""
    environ = os.environ
    command = environ.get("CNI_COMMAND", "")
    stdin = b"" if command == "VERSION" else sys.stdin.buffer.read()  # VERSION: stdin may be a tty
    path = environ.get(SOCKET_ENV) or socket_path or DEFAULT_SOCKET
    if command == "ADD":
        forget_del(path, plugin, os.environb)  # before the ADD: a replay never undoes what it adds
    return resume(plugin, site_dir, path, command, stdin, server_uid=server_uid)


def resume(plugin, site_dir, path, command, stdin, first=None, server_uid=0):
    """The call from its exchange with the daemon on. ``first``: what the shim's hot path
    (:mod:`rdmanet.node.fast`) already got, so nothing is sent twice: an answer tuple (a declined call, or
    a DEL that did not succeed) or a DaemonLost; None to call the daemon here."""
    code = _run(plugin, site_dir, path, command, stdin, first, server_uid)
    if command == "DEL" and code != 0:
        journal_del(path, plugin, os.environb, stdin)
    return code


def _run(plugin, site_dir, path, command, stdin, first=None, server_uid=0):
    try:
        if first is None:
            code, out, err = call(path, plugin, os.environb, stdin, server_uid=server_uid)
        elif isinstance(first, Exception):
            raise first
        else:
            code, out, err = first
    except NoDaemon as exc:
        if not site_dir:
            code, out = no_daemon(command, stdin, path, "cannot connect: %s" % (exc,))
            _print(out)
            return code
        return in_process(plugin, site_dir, stdin)
    except DaemonLost as exc:
        if command == "ADD":
            _print(try_again_later(stdin, str(exc)))
            return 1
        if not site_dir:
            code, out = no_daemon(command, stdin, path, "it went away during the call: %s" % (exc,))
            _print(out)
            return code
        return in_process(plugin, site_dir, stdin)
    if code is None:  # declined: out is why
        if not site_dir:
            code, text = no_daemon(command, stdin, path, "it declined the call (%s)" % (
                out or "it asked for an in-process run",))
            _print(text)
            return code
        return in_process(plugin, site_dir, stdin)
    if err:
        sys.stderr.buffer.write(err)
        sys.stderr.flush()
    if out:
        sys.stdout.buffer.write(out)
        sys.stdout.flush()
    return code


def _boot_code(source):
    """rdmanet/node/boot.py less its docstring (the shim's file is tokenized on every exec)."""
    import ast

    first = ast.parse(source).body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        source = "\n".join(source.splitlines()[first.end_lineno:]).lstrip("\n") + "\n"
    return source


def _shim_sources():
    """({module: source} of rdmanet/node/boot, codecache, fast and launcher, the stamp of the code file)."""
    import hashlib

    here = os.path.dirname(os.path.abspath(__file__))
    sources = {}
    for name in ("boot", "codecache", "fast", "launcher"):
        with open(os.path.join(here, name + ".py"), encoding="utf-8") as fh:
            sources[name] = fh.read()
    # what the code file holds depends on these (how it is compiled, from what)
    stamp = hashlib.sha256("\0".join(sources[name] for name in ("codecache", "fast", "launcher")).encode("utf-8"))
    stamp = stamp.hexdigest()[:32]
    return sources, stamp.encode("ascii")


def render_shim(plugin_name, python, site_dir, socket_path=DEFAULT_SOCKET, server_uid=0):
    """The text of the bin-dir file for ``plugin_name``: :mod:`rdmanet.node.boot`'s code, ``_STAMP`` (a
    digest of :mod:`rdmanet.node.codecache`, :mod:`rdmanet.node.fast` and this module), ``_SOURCES`` (those three:
    zlib, base64) and the call ``sys.exit(run(<plugin>, <site dir or None>, <socket>, <server uid>))``.
    The hot path runs from :func:`code_path` beside the shim, which the shim itself checks and
    writes (see :mod:`rdmanet.node.boot`).

    ``site_dir`` None or empty: a daemon-only shim (no in-process fallback)."""
    import zlib

    if plugin_name not in PLUGINS:
        raise ValueError("unknown plugin %r" % (plugin_name,))
    if not os.path.isabs(python):
        raise ValueError("the interpreter path must be absolute: %r" % (python,))
    if any(c.isspace() for c in python):
        raise ValueError("the interpreter path must not contain white space: %r" % (python,))
    if not isinstance(server_uid, int) or isinstance(server_uid, bool) or server_uid < 0:
        raise ValueError("the daemon's uid must be a number: %r" % (server_uid,))
    site_dir = site_dir or None
    sources, stamp = _shim_sources()
    packed = "\0".join(sources[name] for name in ("codecache", "fast", "launcher")).encode("utf-8")
    packed = binascii.b2a_base64(zlib.compress(packed, 9), newline=False).decode("ascii")
    kind = "daemon only" if site_dir is None else "falls back to %r" % (site_dir,)
    return ("#!%s -IS\n# rdmanet CNI shim for %s (%s; generated by rdmanet.node.launcher.render_shim; do not edit)\n"
            "# rdmanet/node/boot.py; _SOURCES: rdmanet/node/codecache.py, rdmanet/node/fast.py and rdmanet/node/launcher.py (zlib, base64)\n%s\n"
            "_STAMP = %r\n_SOURCES = %r\n\nif __name__ == \"__main__\":\n    sys.exit(run(%r, %r, %r, %d))\n") % (
        python, plugin_name, kind, _boot_code(sources["boot"]), stamp, packed, plugin_name, site_dir, socket_path,
        server_uid)


def _beside(shim_path, suffix):
    """``<dir>/.<name><suffix>`` for the shim at ``<dir>/<name>``."""
    directory, name = os.path.split(shim_path)
    return os.path.join(directory, "." + name + suffix)


def code_path(shim_path):
    """Where the shim at ``shim_path`` keeps its compiled hot path: ``<dir>/.<name>.code`` (the
    shim writes it; see :mod:`rdmanet.node.boot`; install.sh's --uninstall removes it with the shim)."""
    return _beside(shim_path, ".code")


def texts_path(shim_path):
    """Where the shim at ``shim_path`` keeps the code its in-process calls compiled from text
    (dataclass methods, forward references): ``<dir>/.<name>.texts`` (:mod:`rdmanet.node.compiled_texts`;
    install.sh's --uninstall removes it)."""
    return _beside(shim_path, ".texts")


def write_shim(path, plugin_name, python, site_dir, socket_path=DEFAULT_SOCKET, server_uid=0):
    """Write the shim at ``path`` (0755) by write + rename: a runtime never execs half a file.

    The temporary file is ``.<name>.<random>.tmp`` in the same directory: a leading dot (a runtime
    listing the dir skips it) and unique (two installers at once never write into one file).

    A shim with a fallback (``site_dir``) whose interpreter is this one also gets its code file
    (:func:`code_path`) now, as its first exec would write it: so that calls to it, ``rdmanet
    doctor``'s among them, find it made. A daemon-only shim's interpreter is the node's (a path
    that may name another python here): its first exec on the node writes it."""
    import tempfile

    text = render_shim(plugin_name, python, site_dir, socket_path, server_uid)
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    if site_dir and os.path.realpath(python) == os.path.realpath(sys.executable):
        from rdmanet.node import codecache

        sources, stamp = _shim_sources()
        head = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER + stamp
        codecache.rebuild(sources["fast"], code_path(path), head, sources["launcher"])
