"""The cold half of a shim's start (:mod:`shim.boot` says when it runs): compile :mod:`shim.fast`
from the source the shim carries, and save its marshalled code beside the shim for the next exec.
STANDARD LIBRARY ONLY, Python 3.6 syntax, like :mod:`shim.launcher`: it runs under the node's
interpreter in DaemonSet mode."""

import binascii
import marshal
import posix

LAUNCHER_FILENAME = "<rdmanet shim: shim/launcher.py>"


def rebuild(fast_source, path, head, launcher_source=None):
    """The code of :mod:`shim.fast`; saved at ``path`` behind ``head`` (the interpreter's magic
    number and the sources' stamp) and a crc32, unless ``head`` is None (no magic number known).
    With ``launcher_source``, the code of :mod:`shim.launcher` follows in the same file (a second
    marshalled object: ``marshal.loads`` of the body still gives shim.fast's code), for the cold
    paths (:func:`shim.fast._launcher`), which then compile nothing (~2 ms per in-process call)."""
    code = compile(fast_source, "<rdmanet shim: shim/fast.py>", "exec")
    if head:
        body = marshal.dumps(code)
        if launcher_source is not None:
            body += marshal.dumps(compile(launcher_source, LAUNCHER_FILENAME, "exec"))
        save(path, seal(head, body))
    return code


def seal(head, body):
    """A file beside a shim: ``head``, the crc32 of ``body`` (8 hex digits), ``body``
    (:mod:`shim.boot` checks its code file the same way, inline)."""
    return head + b"%08x" % binascii.crc32(body) + body


def unseal(data, head):
    """The body of ``data`` made by :func:`seal` behind ``head``, or None (another head, cut short
    or altered)."""
    body = memoryview(data)[len(head) + 8:]
    return body if data[:len(head) + 8] == head + b"%08x" % binascii.crc32(body) else None


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
