"""The node daemon's Lease watch notices a silently dead API server within seconds (TCP keepalive).

A real network path: the fake API server (tests/kube_api_server.py) runs in its own netns behind
a veth pair; the daemon's informer (rdmanet/ipam/store/lease_cache.py over the kubernetes client's
transport, as the daemon builds it) watches from the host. Then the path goes dark without a FIN
or RST (the netns end of the veth is set down: packets are dropped, nothing answers), as in a
partition or when the API server's host dies. Without keepalive the quiet watch would wait for
its read timeout (the watch's timeoutSeconds plus a grace: minutes); with TCP keepalive on the
watch socket it breaks within about 11 s and the informer stops trusting its state.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rdmanet.ipam.store import lease_cache
from rdmanet.ipam.store.kube import LEASES_PATH
from rdmanet.ipam.store.kube_transport import KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES, ApiClientTransport

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover - the test's dir is on sys.path
    import nstools as nt  # type: ignore[no-redef]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.path.join(REPO, "tests", "kube_api_server.py")


def test_a_silently_dead_watch_is_noticed_within_seconds(netns, master):
    from kubernetes import client

    ns = netns()
    link = master(peer_ns=ns)  # link.name on the host, link.peer in ns
    octet = os.getpid() % 250 + 1
    host_ip, server_ip = f"198.18.{octet}.1", f"198.18.{octet}.2"
    nt.ip("addr", "add", f"{host_ip}/30", "dev", link.name)
    ns.ip("addr", "add", f"{server_ip}/30", "dev", link.peer)
    proc = subprocess.Popen([nt.IP, "netns", "exec", ns.name, sys.executable, SERVER, "--host", server_ip],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    inf = None
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://"), url
        cfg = client.Configuration(host=url)
        cfg.retries = False
        api = client.ApiClient(cfg)
        settings = lease_cache.Settings(watch_timeout=240.0, request_timeout=2.0, idle_seconds=600.0)
        inf = lease_cache.LeaseCache(ApiClientTransport(api), LEASES_PATH.format(namespace="ipam"),
                                     "rdmanet.io/ipam-domain=0123456789abcdef", lambda item: None,
                                     name="lease-cache blackhole", settings=settings).start()
        assert inf.wait_synced(20.0), inf.stats
        time.sleep(1.5)  # a watch that has been open and quiet (bookmarks only) for a while
        errors = inf.stats["errors"]
        ns.ip("link", "set", link.peer, "down")  # the path goes dark: no FIN, no RST
        dark = time.monotonic()
        bound = KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_PROBES + 15.0  # keepalive + slack for a loaded host
        while inf.stats["errors"] == errors and time.monotonic() - dark < bound:
            time.sleep(0.1)
        noticed = time.monotonic() - dark
        assert inf.stats["errors"] > errors, (
            f"the watch still looked alive {noticed:.0f} s after the path went dark "
            f"(its read timeout is {settings.watch_timeout:g} s + {lease_cache.READ_GRACE:g} s)")
        assert not inf.usable()  # not trusted past the broken stream
        ns.ip("link", "set", link.peer, "up")  # the path is back: the informer watches again
        end = time.monotonic() + 60
        while not inf.usable() and time.monotonic() < end:
            time.sleep(0.1)
        assert inf.usable(), inf.stats
    finally:
        if inf is not None:
            inf.stop()
            inf.join(5.0)
        proc.kill()
        proc.wait(10)
