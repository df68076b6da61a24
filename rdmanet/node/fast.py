"""The shim's hot path: a CNI call the daemon answers, with nothing compiled or imported that it
does not need. STANDARD LIBRARY ONLY, Python 3.6 syntax (like :mod:`rdmanet.node.launcher`).

A shim is a script, and a script is compiled on every exec (no ``.pyc``): compiling all of
:mod:`rdmanet.node.launcher` and importing ``os`` cost ~3 ms per call, a third of a Go plugin's whole
ADD. So the shim runs this module from a code object marshalled beside it (:mod:`rdmanet.node.boot`), and
compiles the launcher only on a cold path (from ``_SOURCES``, given by the shim).

The hot path uses only built-in modules (``posix``, ``_socket``, ``binascii``, ``sys``): it
reads the call, looks for a journaled DEL of the attachment on ADD (one lstat; one found is removed
under its lock by :func:`rdmanet.node.launcher.forget_del`),
sends the request once and writes the daemon's answer. Everything else goes to the launcher with
what happened so far, so that nothing is sent twice: connect failures (no daemon, a full accept
queue to wait for) run the launcher's own call from the start, a daemon that declines or goes away
after taking the request is handled there as :func:`rdmanet.node.launcher.run` handles it, and so is a DEL
that did not succeed (journaled).
"""

import _socket
import binascii
import posix
import sys

DEFAULT_SOCKET = "/run/rdmanet/daemon.sock"
SOCKET_ENV = b"RDMANET_DAEMON_SOCKET"
PROTOCOL = 2
JOURNAL_DIR = "del-journal"
LAUNCHER_FILENAME = "<rdmanet shim: rdmanet/node/launcher.py>"  # as rdmanet.node.codecache compiles it


def _fsdecode(value):
    return value.decode("utf-8", "surrogateescape")  # = os.fsdecode on Linux


def _dirname(path):
    """posixpath.dirname without importing os."""
    i = path.rfind("/") + 1
    head = path[:i]
    if head and head != "/" * len(head):
        head = head.rstrip("/")
    return head


def journal_path(socket_path, plugin, environb):
    """= :func:`rdmanet.node.launcher.journal_path` (a test compares them)."""
    key = b"\0".join((plugin.encode("ascii"), environb.get(b"CNI_CONTAINERID", b""), environb.get(b"CNI_IFNAME", b"")))
    name = binascii.hexlify(key)
    if len(name) > 200:
        name = name[:184] + (b"%08x" % binascii.crc32(key))
    directory = _dirname(socket_path)
    prefix = directory + "/" if directory and not directory.endswith("/") else directory
    return prefix + JOURNAL_DIR + "/" + name.decode("ascii") + ".del"


def _launcher():
    """The launcher's functions: its code from the shim's code file when the shim ran from one
    (``_CODE_BODY``, checked whole by :mod:`rdmanet.node.boot`; the second object :mod:`rdmanet.node.codecache`
    wrote), else compiled from the shim's own copy (``_SOURCES``), or the module (imported)."""
    packed = globals().get("_SOURCES")
    if packed is None:
        from rdmanet.node import launcher

        return vars(launcher)
    namespace = {"__name__": "rdmanet_shim_launcher", "__file__": globals().get("__file__", "")}
    code = _launcher_code(globals().get("_CODE_BODY"))
    if code is None:
        import zlib

        source = zlib.decompress(binascii.a2b_base64(packed)).decode("utf-8").split("\0")[2]
        code = compile(source, LAUNCHER_FILENAME, "exec")
    exec(code, namespace)
    return namespace


def _launcher_code(body):
    """The launcher's code object after rdmanet.node.fast's in a code file's body, or None."""
    if body is None:
        return None
    import _io
    import marshal

    stream = _io.BytesIO(body)
    try:
        marshal.load(stream)  # rdmanet.node.fast's code (running already)
        code = marshal.load(stream)
    except (EOFError, ValueError, TypeError):
        return None
    return code if getattr(code, "co_filename", None) == LAUNCHER_FILENAME else None


def peer_refused(sock, server_uid):
    """= :func:`rdmanet.node.launcher.peer_refused` (a test compares them): None when the server is
    root or ``server_uid``, else why nothing may be sent to it."""
    try:
        creds = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    except OSError as exc:
        return "cannot read the credentials of its server: %s" % (exc,)
    uid = int.from_bytes(creds[4:8], sys.byteorder)
    if uid in (0, server_uid):
        return None
    return ("it is served by uid %d, not by root%s: nothing was sent to it (is the socket's directory writable "
            "by others?)" % (uid, "" if not server_uid else " or uid %d" % server_uid))


def _ask(path, request, server_uid=0):
    """(answer bytes, None), or (None, ("connect" | "lost", why)). Nothing is sent to a server
    that is not root or ``server_uid`` (SO_PEERCRED): a "connect" failure, the launcher decides."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(5.0)
        try:
            sock.connect(path)
        except OSError as exc:  # absent, refused, or a full accept queue: the launcher decides
            return None, ("connect", str(exc))
        refused = peer_refused(sock, server_uid)
        if refused is not None:
            return None, ("connect", refused)
        sock.settimeout(None)
        answer = b""
        try:
            sock.sendall(request)
            while not _whole(answer):  # not until the daemon closes: its close may wait for its GIL
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except OSError as exc:
            return None, ("lost", str(exc))
        return answer, None
    finally:
        sock.close()


def _whole(answer):
    """Whether ``answer`` holds all the daemon will send: its head line and as many bytes as that
    line announces (or a line :func:`_parse` refuses: reading on would not mend it)."""
    line, newline, rest = answer.partition(b"\n")
    if not newline:
        return False
    fields = line.split()
    if line.startswith(b"exec") or len(fields) != 3:
        return True
    try:
        return len(rest) >= int(fields[1]) + int(fields[2])
    except ValueError:
        return True


def _parse(answer):
    """(code, stdout, stderr), (None, why, b"") when declined, or a ("lost", why) pair."""
    line, newline, rest = answer.partition(b"\n")
    if not newline:
        return ("lost", "the daemon closed the connection before answering")
    if line.startswith(b"exec"):
        return None, line[5:].decode("utf-8", "replace"), b""
    try:
        code, n_out, n_err = (int(field) for field in line.split())
    except ValueError:
        return ("lost", "the daemon sent an unreadable answer")
    if len(rest) != n_out + n_err:
        return ("lost", "the daemon's answer was cut short")
    return code, rest[:n_out], rest[n_out:]


def run(plugin, site_dir, socket_path=DEFAULT_SOCKET, server_uid=0, exit_now=False):
    """One CNI call, as :func:`rdmanet.node.launcher.run`. ``exit_now`` (the shim): a call the daemon
    answered ends the process once the answer is written (``posix._exit``), without the
    interpreter's teardown (~1 ms: nothing of this process needs it); other calls end through
    :func:`rdmanet.node.launcher.finish` (exit handlers, flushes, no teardown), or return when it says so."""
    environb = posix.environ
    command = _fsdecode(environb.get(b"CNI_COMMAND", b""))
    stdin = b"" if command == "VERSION" else sys.stdin.buffer.read()  # VERSION: stdin may be a tty
    override = environb.get(SOCKET_ENV)
    path = (_fsdecode(override) if override else None) or socket_path or DEFAULT_SOCKET
    if command == "ADD":  # before the ADD: a replay never undoes it (launcher.forget_del)
        try:
            posix.lstat(journal_path(path, plugin, environb))
        except OSError:
            pass  # no journaled DEL of the attachment: the usual case
        else:
            _launcher()["forget_del"](path, plugin, environb)
    env = b"\0".join(k + b"=" + v for k, v in environb.items())
    head = ("RDMANET %d %s %d %d\n" % (PROTOCOL, plugin, len(env), len(stdin))).encode("ascii")
    answer, failed = _ask(path, head + env + stdin, server_uid)
    first = None
    if failed is None:
        parsed = _parse(answer)
        if parsed[0] == "lost":
            failed = parsed
        elif parsed[0] is None:
            first = parsed  # declined
        else:
            code, out, err = parsed
            if command == "DEL" and code != 0:
                first = parsed  # journaled by the launcher
            else:
                if err:
                    sys.stderr.buffer.write(err)
                    sys.stderr.flush()
                if out:
                    sys.stdout.buffer.write(out)
                    sys.stdout.flush()
                if exit_now:
                    posix._exit(code)
                return code
    launcher = _launcher()
    if failed is not None:
        first = None if failed[0] == "connect" else launcher["DaemonLost"](failed[1])
    code = launcher["resume"](plugin, site_dir, path, command, stdin, first, server_uid)
    if exit_now:  # the shim: no teardown of what an in-process call imported (launcher.finish)
        return launcher["finish"](code)
    return code
