"""Import only the parts of pyroute2 the plugins use.

pyroute2's package ``__init__`` imports every family it has (NDB, IPDB, conntrack, nftables,
wireguard, ...): ~40 ms of a plugin exec's ~100 ms netlink import, for nothing a plugin uses.
:func:`install` registers the package without running its ``__init__``, so ``import
pyroute2.iproute.linux`` loads just that module and what it needs. The package's own names
(``from pyroute2 import IPRoute``) still work: the first such lookup runs the real ``__init__``.

Nothing happens when pyroute2 is already imported (the daemon imports all of it, warm).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading


def install() -> None:
    if "pyroute2" in sys.modules:
        return
    spec = importlib.util.find_spec("pyroute2")
    if spec is None or spec.loader is None:
        return  # not installed: the plugin's own import names the problem
    package = importlib.util.module_from_spec(spec)  # __path__ set, __init__ not run
    lock = threading.RLock()  # the __init__ itself looks names up on the package while it runs
    state = {"loaded": False}

    def __getattr__(name: str):
        if not name.startswith("__") and importlib.util.find_spec(f"pyroute2.{name}") is not None:
            return importlib.import_module(f"pyroute2.{name}")  # a submodule (``from pyroute2 import config``)
        with lock:
            if not state["loaded"]:
                state["loaded"] = True
                spec.loader.exec_module(package)  # the real __init__, into this module
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'pyroute2' has no attribute {name!r}") from None

    package.__getattr__ = __getattr__  # type: ignore[attr-defined]  (PEP 562)
    sys.modules["pyroute2"] = package
