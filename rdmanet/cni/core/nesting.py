"""Our interface plugins never serve as an IPAM plugin, whether ``ipam.type`` names one or a
plugin execs one.

An interface plugin holds its attachment's lock for its whole ADD. Run as the IPAM of another
call of the same attachment (``{"type": "macvlan-rdma", "ipam": {"type": "macvlan-rdma"}}``),
the nested call would wait on that lock until the caller's deadline, holding a daemon worker all
along. So:

- ``ipam.type`` naming one of :data:`INTERFACE_PLUGINS` is CNI error 7 on ADD, CHECK and STATUS;
  DEL and GC skip it with a warning (its ADD was refused: nothing was allocated to release);
- every IPAM call (exec'd or in-process) carries :data:`CALLER_ENV` in its environment, and an
  interface plugin that finds it there answers CNI error 7 at once (:func:`rdmanet.cni.core.skel.handle`).
"""

from __future__ import annotations

from .errors import INVALID_CONFIG, CNIError

INTERFACE_PLUGINS = frozenset(("macvlan-rdma", "host-device-rdma", "ipoib-rdma"))
CALLER_ENV = "RDMANET_IPAM_CALLER"  # "<type> <network>/<containerID>/<ifname>" of the plugin calling the IPAM
_FIX = 'set ipam.type to an IPAM plugin, e.g. "ipam": {"type": "lease-ipam", "range": "10.1.1.0/24"} (or host-local, whereabouts)'


def not_an_ipam(ipam_type: str) -> CNIError:
    return CNIError(INVALID_CONFIG, f"invalid network config: ipam.type: {ipam_type} is an interface plugin, not an IPAM plugin",
                    _FIX)


def nested(plugin: str, caller: str) -> CNIError:
    return CNIError(INVALID_CONFIG, f"{plugin} was run as the IPAM plugin of {caller}: an interface plugin is never an IPAM",
                    _FIX)
