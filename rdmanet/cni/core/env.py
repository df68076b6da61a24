"""Request-scoped environment.

Inside the node daemon one process serves many CNI calls at once, so per-request values
(RDMANET_SYSFS_ROOT, RDMANET_NODE_NAME, test hooks, ...) must come from the call's own
environment, never from ``os.environ``. :func:`rdmanet.cni.core.skel.handle` sets the call's environment
here for the duration of the call (a contextvar: per thread, and restored on exit); code that
needs an environment value and has no :class:`Invocation` at hand reads it with :func:`get`.
Outside a call (a plain exec, the CLI) :func:`get` falls back to ``os.environ``.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, Mapping, Optional

_current: ContextVar[Optional[Mapping[str, str]]] = ContextVar("rdmanet_request_env", default=None)


def current() -> Mapping[str, str]:
    """The environment of the CNI call being served (os.environ outside a call)."""
    env = _current.get()
    return os.environ if env is None else env


def get(name: str, default: Optional[str] = None) -> Optional[str]:
    return current().get(name, default)


@contextmanager
def scoped(environ: Mapping[str, str]) -> Iterator[None]:
    """Make ``environ`` the current environment for the body (nests; always restored)."""
    token = _current.set(environ)
    try:
        yield
    finally:
        _current.reset(token)
