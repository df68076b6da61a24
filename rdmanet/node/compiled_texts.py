"""The code that :mod:`dataclasses`, :mod:`typing` and :mod:`collections` compile from text
while a call imports,
compiled once per shim instead of on every in-process call. STANDARD LIBRARY ONLY: it runs before
anything else of ours is imported.

For each ``@dataclass`` the module writes the source of ``__init__``, ``__repr__``, ``__eq__``
(and ``__setattr__``, ``__delattr__``, ``__hash__`` when frozen) and compiles it with ``exec``:
~160 us of the ~230 us a class costs (Python 3.11); an in-process macvlan-rdma ADD creates ~70
dataclasses while it imports (annotated_types, pydantic, filelock, ours): ~10 ms of CPU. And
``typing.ForwardRef`` compiles each annotation written as a string (``eval`` mode, ~3 us): ~800
of them, pydantic_core's TypedDicts mostly, ~2.5 ms; and ``collections.namedtuple`` its
``__new__`` (``eval``, ~25 of them). The same texts on every call.

:func:`install` gives the three modules a name (``exec`` in dataclasses, ``compile`` in typing,
``eval`` in collections: module globals, ahead of the builtins) that takes the code compiled
earlier for the very same text from a file beside the shim (``.<name>.texts``)::

    <the interpreter's MAGIC_NUMBER> <crc32 of the marshal data, 8 hex digits> <marshal data>

(the marshal data: a dict, (mode, text) -> code object), and compiles what the file lacks as the
builtins would (filename ``"<string>"``, no inherited ``__future__`` flags: none of the three
modules has one). :meth:`Cache.save` rewrites the file when the call compiled something: the first calls
after an install or an upgrade. A file from another interpreter (the magic number changes with
the bytecode), cut short or altered is never loaded: the call compiles, as without a file. The
key is the whole text, so a changed class (a field added, a library upgraded) simply misses.
The file needs no more trust than the shim's ``.code`` (:mod:`rdmanet.node.boot`): it sits in the same
directory, whose writers could replace the shim itself; it is written by write + rename, and not
at all where the caller may not write (:func:`rdmanet.node.codecache.save`).
"""

import builtins
import marshal
import sys

from . import codecache

# more texts than this in the file (library upgrades leave texts nothing asks for): save only
# what this process used
MAX_ENTRIES = 8192
FILENAME = "<string>"
_builtin_exec = builtins.exec
_builtin_eval = builtins.eval
_builtin_compile = builtins.compile


def _magic():
    return getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", None)


def _callers_namespaces(locals):
    """The globals and locals ``exec``/``eval`` use when given no globals: those of the frame that
    called the :class:`Cache` method (two frames up from here), ``locals`` when given."""
    frame = sys._getframe(2)
    return frame.f_globals, frame.f_locals if locals is None else locals


class Cache:
    """Code by (mode, source text), loaded from ``path`` (empty when it is absent, from another
    interpreter or not whole)."""

    def __init__(self, path):
        self.path = path
        self.magic = _magic()
        self.codes = self._load() if self.magic else {}
        self.compiled = {}  # what this process compiled: saved by save()
        self.used = set()

    def _load(self):
        try:
            with open(self.path, "rb") as fh:
                data = fh.read()
        except OSError:
            return {}
        body = codecache.unseal(data, self.magic)
        if body is None:
            return {}
        try:
            codes = marshal.loads(body)
        except (EOFError, ValueError, TypeError):
            return {}
        return codes if type(codes) is dict else {}

    def code(self, source, mode):
        """The code of ``source`` compiled as ``compile(source, "<string>", mode)`` would."""
        key = (mode, source)
        code = self.codes.get(key)
        if code is None:
            code = self.compiled[key] = self.codes[key] = _builtin_compile(source, FILENAME, mode, dont_inherit=True)
        else:
            self.used.add(key)
        return code

    def exec(self, source, globals=None, locals=None):
        """``exec(source, globals, locals)``, a source text's code compiled before (dataclasses)."""
        if globals is None:
            globals, locals = _callers_namespaces(locals)
        return _builtin_exec(self.code(source, "exec") if type(source) is str else source, globals, locals)

    def eval(self, source, globals=None, locals=None):
        """``eval(source, globals, locals)``, a source text's code compiled before (namedtuple)."""
        if globals is None:
            globals, locals = _callers_namespaces(locals)
        return _builtin_eval(self.code(source, "eval") if type(source) is str else source, globals, locals)

    def compile(self, source, filename, mode, flags=0, dont_inherit=False, optimize=-1):
        """``compile(...)``, a source text's code compiled before (typing.ForwardRef's ``eval``)."""
        if type(source) is str and filename == FILENAME and mode == "eval" and not flags and optimize == -1:
            return self.code(source, mode)
        return _builtin_compile(source, filename, mode, flags, dont_inherit, optimize)

    def save(self):
        """Rewrite the file when this process compiled something (nothing when it may not write)."""
        if not self.compiled or not self.magic:
            return
        codes = self.codes
        if len(codes) > MAX_ENTRIES:
            codes = {key: codes[key] for key in self.used.union(self.compiled)}
        body = marshal.dumps(codes)
        codecache.save(self.path, codecache.seal(self.magic, body))


def install(path):
    """Compile dataclasses' methods, typing's forward references and namedtuples' ``__new__``
    through a :class:`Cache` of ``path``; returns it."""
    import collections

    cache = Cache(path)
    collections.eval = cache.eval  # first: importing dataclasses (inspect, dis, tokenize) makes namedtuples
    import dataclasses
    import typing

    dataclasses.exec = cache.exec
    typing.compile = cache.compile
    return cache
