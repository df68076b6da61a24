"""The first lines of every shim: :func:`rdmanet.node.launcher.render_shim` writes this module's code (less
this docstring) at the top of the file, then ``_STAMP``, ``_SOURCES`` and the call
``sys.exit(run(<plugin>, <site dir or None>, <socket>, <daemon uid>))``. STANDARD LIBRARY ONLY, Python 3.6
syntax (a test parses it with ``feature_version=(3, 6)``), like :mod:`rdmanet.node.launcher`.

A script is compiled on every exec (never cached as ``.pyc``) and all of it is tokenized, string
literals included: so this code is short, and the shim's hot path (:mod:`rdmanet.node.fast`) runs from a
code object marshalled beside the shim, ``.<shim name>.code``::

    <the interpreter's MAGIC_NUMBER> <_STAMP> <crc32 of the marshal data, 8 hex digits> <marshal data>

(the marshal data: rdmanet.node.fast's code, then rdmanet.node.launcher's, which the cold paths run without
compiling it: ~2 ms of every in-process call)

loaded only when all three match: made by this very interpreter (the magic number changes with
the bytecode), from this very source (``_STAMP``, a digest of it that render_shim bakes in) and
whole. Any other file (none yet, a Python upgrade on the node, a reinstall, a crash mid-write on a
file system that lost data) is never loaded: the shim compiles its own copy of :mod:`rdmanet.node.fast`
and rewrites the file (:mod:`rdmanet.node.codecache`, by write + rename: no exec reads half of one). Where
the caller may not write (a read-only bin dir, a user who is not root) the shim compiles on every
exec, as the first shims did. The file needs no more trust than the shim: it sits in the same
directory, whose writers could replace the shim itself. :func:`rdmanet.node.launcher.write_shim` writes
it with a shim that falls back under the installer's own interpreter; a daemon-only shim's first
exec on the node (install.sh's VERSION check) writes it under the node's python3.

``_SOURCES`` holds :mod:`rdmanet.node.codecache`, :mod:`rdmanet.node.fast` and :mod:`rdmanet.node.launcher` as they were
when the shim was rendered, NUL-separated, zlib-compressed and base64-encoded (tokenizing them as
plain text cost ~0.4 ms per exec): the cold paths (no daemon, the daemon declining or going
away, a DEL that did not succeed: :func:`rdmanet.node.fast._launcher`) take the launcher's code from the
code file, or unpack and compile it when there is no valid one.
Compiling costs ~1 000 instructions a character here (Python 3.11), tokenizing a string literal
~80: so this code is one function without a docstring, and what only a cold start needs
(``_REBUILD``: unpack :mod:`rdmanet.node.codecache` and run it) is a string, compiled when it runs.
"""

import sys

_REBUILD = """
import binascii, zlib
cache, fast, launcher = zlib.decompress(binascii.a2b_base64(_SOURCES)).decode("utf-8").split("\\0")
exec(compile(cache, "<rdmanet shim: rdmanet/node/codecache.py>", "exec"))
exec(rebuild(fast, path, head, launcher), hot)
"""


def run(plugin, site_dir, socket_path, server_uid=0):
    import binascii
    import marshal

    where = __file__.rfind("/") + 1
    path = __file__[:where] + "." + __file__[where:] + ".code"
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None)
    head = (magic or b"") + _STAMP
    code = body = None
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        body = memoryview(data)[len(head) + 8:]
        if magic and data[:len(head) + 8] == head + b"%08x" % binascii.crc32(body):
            code = marshal.loads(body)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    hot = {"__name__": "rdmanet_shim", "__file__": __file__, "_SOURCES": _SOURCES, "_CODE_BODY": body if code else None}
    if code is None:  # compile rdmanet.node.fast; saved for the next exec unless no magic number is known
        exec(_REBUILD, {"_SOURCES": _SOURCES, "path": path, "head": head if magic else None, "hot": hot})
    else:
        exec(code, hot)
    return hot["run"](plugin, site_dir, socket_path, server_uid, exit_now=True)
