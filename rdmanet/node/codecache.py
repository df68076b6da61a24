"""The cold half of a shim's start (:mod:`rdmanet.node.boot` says when it runs): compile :mod:`rdmanet.node.fast`
from the source the shim carries, and save its marshalled code beside the shim for the next exec.
STANDARD LIBRARY ONLY, Python 3.6 syntax, like :mod:`rdmanet.node.launcher`: it runs under the node's
interpreter in DaemonSet mode."""

import binascii
import marshal
import posix

LAUNCHER_FILENAME = "<rdmanet shim: rdmanet/node/launcher.py>"


def rebuild(fast_source, path, head, launcher_source=None):
    """The code of :mod:`rdmanet.node.fast`; saved at ``path`` behind ``head`` (the interpreter's magic
    number and the sources' stamp) and a crc32, unless ``head`` is None (no magic number known).
    With ``launcher_source``, the code of :mod:`rdmanet.node.launcher` follows in the same file (a second
    marshalled object: ``marshal.loads`` of the body still gives rdmanet.node.fast's code), for the cold
    paths (:func:`rdmanet.node.fast._launcher`), which then compile nothing (~2 ms per in-process call)."""
    code = compile(fast_source, "<rdmanet shim: rdmanet/node/fast.py>", "exec")
    if head:
        body = marshal.dumps(code)
        if launcher_source is not None:
            body += marshal.dumps(compile(launcher_source, LAUNCHER_FILENAME, "exec"))
        save(path, seal(head, body))
    return code


def seal(head, body):
    """A file beside a shim: ``head``, the crc32 of ``body`` (8 hex digits), ``body``
    (:mod:`rdmanet.node.boot` checks its code file the same way, inline)."""
    return head + b"%08x" % binascii.crc32(body) + body


def save(path, data):
    """``data`` at ``path`` by write + rename from ``<path>.<pid>.<random>.tmp``: a kill at any
    instant leaves the old file or the new one, and at worst a temporary that nothing reads (the
    installer's --uninstall removes those). Nothing when the caller may not write there."""
    tmp = "%s.%d.%s.tmp" % (path, posix.getpid(), binascii.hexlify(posix.urandom(4)).decode("ascii"))
    try:
        fd = posix.open(tmp, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC, 0o644)
    except OSError:
        return
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[posix.write(fd, view):]
        finally:
            posix.close(fd)
        posix.rename(tmp, path)
    except OSError:
        try:
            posix.unlink(tmp)
        except OSError:
            pass
