"""whereabouts' live allocations, read (never written) while a cluster migrates NAD by NAD.

A NAD switched from whereabouts to lease-ipam must not hand out an address that a pod started
under whereabouts still holds: those are recorded in whereabouts' own objects, invisible to the
Lease store. So while whereabouts is installed on the node (its flat file exists) or the ipam
block says ``"whereabouts_check": true``, the Lease store asks before it claims a candidate
(``"whereabouts_check": false`` turns it off once no pod uses whereabouts).

Facts relied on (whereabouts pkg/storage/kubernetes/ipam.go and pkg/api/whereabouts.cni.cncf.io/v1alpha1):
- Group ``whereabouts.cni.cncf.io/v1alpha1``, objects in the namespace of whereabouts'
  kubeconfig context, which is the namespace the Lease store resolves from the same kubeconfig.
- ``IPPool``: one per range, named after the range with ':' and '/' replaced by '-' (a range
  ending in ':' gets a '0' first), prefixed by ``<network_name>-`` when that is set.
  ``spec.allocations`` maps the decimal offset of an address from the range's network address
  to {id, podref, ifname}; unparsable offsets are skipped.
- ``OverlappingRangeIPReservation``: one per address allocated with overlapping ranges on (the
  default), named after the address the same way (IPv6 ':' -> '-'), prefixed by
  ``<network_name>-`` when that is set.
- An object that does not exist, or a group that is not served (CRDs removed), answers 404.

Cost, only while the check is on: one IPPool GET per range of an ADD and one reservation GET
per candidate. A 403 is an error naming the grant: checking nothing while whereabouts still
holds addresses would hand them out twice.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from rdmanet.cni.core.errors import IO_FAILURE, CNIError

from ..ranges import IPAddress, Range

GROUP_PATH = "/apis/whereabouts.cni.cncf.io/v1alpha1"
POOLS = GROUP_PATH + "/namespaces/{namespace}/ippools/{name}"
RESERVATIONS = GROUP_PATH + "/namespaces/{namespace}/overlappingrangeipreservations/{name}"

Call = Callable[[str, str], Any]  # (path, what) -> Response(status, doc, headers), retried by the store


def _normalize(text: str) -> str:
    if text.endswith(":"):
        text += "0"
    return text.replace(":", "-").replace("/", "-")


def pool_name(r: Range, network_name: str) -> str:
    name = _normalize(str(r.subnet))
    return f"{network_name}-{name}" if network_name else name


def reservation_name(ip: IPAddress, network_name: str) -> str:
    name = _normalize(str(ip))
    return f"{network_name}-{name}" if network_name else name


class WhereaboutsView:
    """What whereabouts holds, for one ADD (IPPools are read once per range and call)."""

    def __init__(self, namespace: str, network_name: str, call: Call) -> None:
        self.namespace = namespace
        self.network_name = network_name
        self.call = call
        self._pools: dict[str, set[int]] = {}

    def _get(self, path: str, what: str) -> Optional[dict]:
        resp = self.call(path, what)
        if resp.status == 404:
            return None
        if resp.status == 200 and isinstance(resp.doc, dict):
            return resp.doc
        if resp.status == 403:
            raise CNIError(IO_FAILURE, f"Kubernetes API refused to {what} (HTTP 403): whereabouts' objects must be "
                                       "checked while it may still hold addresses",
                           f"grant get on ippools and overlappingrangeipreservations.whereabouts.cni.cncf.io in "
                           f"namespace {self.namespace} (deploy/rbac.yaml), or remove whereabouts' CRDs once no pod "
                           "uses it")
        raise CNIError(IO_FAILURE, f"Kubernetes API answered HTTP {resp.status} to {what}", "see the API server's message")

    def _pool(self, r: Range) -> set[int]:
        name = pool_name(r, self.network_name)
        if name not in self._pools:
            doc = self._get(POOLS.format(namespace=self.namespace, name=name), f"get whereabouts IPPool {name}")
            used: set[int] = set()
            base = int(r.subnet.network_address)
            for offset in ((doc or {}).get("spec") or {}).get("allocations") or {}:
                try:
                    used.add(base + int(offset))
                except (TypeError, ValueError):
                    continue
            self._pools[name] = used
        return self._pools[name]

    def holder(self, ip: IPAddress, r: Range) -> Optional[str]:
        """Which whereabouts object holds ``ip`` (of range ``r``), or None."""
        if int(ip) in self._pool(r):
            return f"whereabouts IPPool {pool_name(r, self.network_name)}"
        name = reservation_name(ip, self.network_name)
        if self._get(RESERVATIONS.format(namespace=self.namespace, name=name),
                     f"get whereabouts OverlappingRangeIPReservation {name}") is not None:
            return f"whereabouts OverlappingRangeIPReservation {name}"
        return None
