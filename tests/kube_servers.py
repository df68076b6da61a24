"""The ``server`` a Lease-store test gets: the fake API server, or the real one behind its proxy
(conftest.py parametrizes it; a module with options of its own for the fake makes its own
``server`` fixture with :func:`api_server`)."""

from __future__ import annotations

import contextlib

from kube_api_server import KubeAPIServer
from kube_real_server import RealServer


@contextlib.contextmanager
def api_server(request, **fake_options):
    """The API server of the test's ``server`` parameter: the fake (made with ``fake_options``), or
    the real one (``[real]``) with the fake's controls and nothing left from an earlier test. For
    a module's own ``server`` fixture: ``with api_server(request, bookmark_interval=0.2) as srv``."""
    if getattr(request, "param", "fake") == "real":
        srv = RealServer(request.getfixturevalue("real_apiserver"))
        try:
            yield srv
        finally:
            srv.close()
        return
    with KubeAPIServer(**fake_options) as srv:
        yield srv
