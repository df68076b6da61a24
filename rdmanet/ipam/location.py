"""Where a network's reservations live: the ipam block as whereabouts would see it (with its flat
file merged in), which store it selects, the store's directory and its allocation domain.

Read without pydantic so DEL and GC stay cheap and work even when the ranges of a config no
longer validate (DEL must release what ADD reserved).

Facts relied on (whereabouts pkg/config LoadIPAMConfig, pkg/storage/kubernetes):
- whereabouts merges a *flat file* underneath every NAD's ipam block: the first file that exists
  of ``configuration_path`` (when the block names one), then
  ``/etc/kubernetes/cni/net.d/whereabouts.d/whereabouts.conf``,
  ``/etc/cni/net.d/whereabouts.d/whereabouts.conf``,
  ``/host/etc/cni/net.d/whereabouts.d/whereabouts.conf``. The file's top level is ipam keys
  (typically ``datastore``, ``kubernetes.kubeconfig``, ``reconciler_cron_expression``). The merge
  (mergo.Merge without override) fills every key the NAD leaves unset or zero ("", 0, false,
  empty list/object) from the file, recursing into objects; keys the NAD sets win. Its installer
  writes the kubeconfig there, so most whereabouts NADs carry no ``kubernetes`` key at all.
- The store: ``datastore: "local"`` chooses the local file store explicitly; otherwise a
  ``kubernetes`` key (after the merge) or ``datastore: "kubernetes"`` selects the Lease store.
  A call for a Kubernetes pod (``K8S_POD_UID`` in CNI_ARGS) that selects neither is refused (code 7):
  a per-node store in a cluster hands the same address to pods on two nodes.
- The local store directory is ``<dataDir>/<network_name or the network's name>`` (host-local's
  per-network layout); ``dataDir`` defaults to ``/var/lib/cni/lease-ipam``.
- The Lease store's domain follows whereabouts: with ``network_name`` the named domain; without
  it, one cluster-wide domain, so an address is claimed once whatever the NAD (whereabouts'
  overlapping-range reservations, on by default). ``enable_overlapping_ranges: false`` narrows
  the domain to the config's ranges (whereabouts then only keys its IPPool by range): NADs with
  the same ranges still share claims, NADs with other, overlapping ranges do not.

Every path a config names (``dataDir``, ``log_file``, ``kubernetes.kubeconfig``,
``configuration_path``) goes through :func:`config_path`: the one place that decides whether
a config may name it.
"""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Any, Mapping, Optional

from rdmanet.cni.core.errors import INVALID_CONFIG, CNIError
from rdmanet.cni.core.invocation import NAME_RE
from rdmanet.cni.linux import roots

from .pool_ref import names_pools, pool_ref

DEFAULT_DATA_DIR = "/var/lib/cni/lease-ipam"
# whereabouts' flat-file search path, in its order (after configuration_path).
FLAT_FILES = (
    "/etc/kubernetes/cni/net.d/whereabouts.d/whereabouts.conf",
    "/etc/cni/net.d/whereabouts.d/whereabouts.conf",
    "/host/etc/cni/net.d/whereabouts.d/whereabouts.conf",
)
LOCAL, KUBERNETES = "local", "kubernetes"
CLUSTER_DOMAIN = "@cluster"  # the Lease domain without network_name (not a valid network_name)
K8S_POD_UID = "K8S_POD_UID"
FLAT_MAX_BYTES = 1 << 20


def bad(where: str, problem: str, fix: str) -> CNIError:
    """A code-7 error naming the field and the fix."""
    return CNIError(INVALID_CONFIG, f"invalid network config: {where}: {problem}", fix)


# The node policy's kind of root (rdmanet.cni.linux.roots) for each key that names a path.
ROOT_KINDS = {"ipam.dataDir": "data", "ipam.log_file": "log", "ipam.kubernetes.kubeconfig": "kubeconfig",
              "ipam.configuration_path": "config"}


def config_path(value: Any, where: str, example: str) -> str:
    """A file or directory path named by a network config (``where`` is its field).

    The one gate for every such path: it must be absolute, without ``..``, and under the node's
    roots for that key (rdmanet.cni.linux.roots, docs/security.md), else CNI error 7 naming the key, the
    path and the roots. Opening it safely (no symlink below the root) is the caller's, through
    rdmanet.cni.linux.roots."""
    if not isinstance(value, str) or not os.path.isabs(value):
        raise bad(where, f"{value!r} is not an absolute path", f"use an absolute path such as {example!r}")
    roots.place_kind(ROOT_KINDS[where], where, value)
    return value


# -- whereabouts' flat file -----------------------------------------------------------------------

_flat_cache: dict[str, tuple[tuple[int, int, int], dict]] = {}


def _read_flat(path: str, named: bool = False) -> Optional[dict]:
    """The flat file's ipam keys; None when it does not exist. Parsed once per content version.

    A path the config ``named`` (configuration_path) is opened under the config roots without
    following a symlink (rdmanet.cni.linux.roots); whereabouts' own locations are the node's."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise bad("ipam.configuration_path", f"cannot read whereabouts' flat file {path}: {exc}",
                  "make the file readable by root, or remove it") from None
    key = (st.st_ino, st.st_size, st.st_mtime_ns)
    cached = _flat_cache.get(path)
    if cached is not None and cached[0] == key and not named:
        return cached[1]
    try:
        if named:
            data = roots.read_file("config", "ipam.configuration_path", path, limit=FLAT_MAX_BYTES)
        else:
            with open(path, "rb") as fh:
                data = fh.read(FLAT_MAX_BYTES + 1)
        doc = json.loads(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise bad("ipam.configuration_path", f"whereabouts' flat file {path} is not readable JSON: {exc}",
                  'fix the file: a JSON object of ipam keys such as {"kubernetes": {"kubeconfig": "..."}}') from None
    if not isinstance(doc, dict):
        raise bad("ipam.configuration_path", f"whereabouts' flat file {path} is not a JSON object",
                  'write a JSON object of ipam keys such as {"kubernetes": {"kubeconfig": "..."}}')
    _flat_cache[path] = (key, doc)
    return doc


def flat_file(raw: Mapping[str, Any]) -> tuple[Optional[str], dict]:
    """(path, keys) of the flat file whereabouts would merge under this ipam block, or (None, {})."""
    paths = list(FLAT_FILES)
    named = raw.get("configuration_path")
    if named not in (None, ""):
        paths.insert(0, config_path(named, "ipam.configuration_path", "/etc/cni/net.d/whereabouts.d/whereabouts.conf"))
    for i, path in enumerate(paths):
        doc = _read_flat(path, named=i == 0 and named not in (None, ""))
        if doc is not None:
            return path, doc
    return None, {}


def _empty(value: Any) -> bool:
    """Go's zero value, as mergo sees it: a key set to it is filled from the flat file."""
    return value is None or value is False or value == "" or value == [] or value == {} or \
        (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0)


def merge_under(nad: Mapping[str, Any], flat: Mapping[str, Any]) -> dict:
    """``nad`` with every unset or zero key filled from ``flat``, recursing into objects."""
    out = dict(nad)
    for key, value in flat.items():
        mine = out.get(key)
        if isinstance(mine, dict) and isinstance(value, dict):
            out[key] = merge_under(mine, value)
        elif _empty(mine):
            out[key] = value
    return out


def ipam_block(config: dict) -> dict:
    """The ipam block with whereabouts' flat file merged underneath (a new dict)."""
    raw = config.get("ipam")
    if not isinstance(raw, dict):
        raise bad("ipam", "missing or not an object", 'add "ipam": {"type": "lease-ipam", "range": "10.1.1.0/24"}')
    _, flat = flat_file(raw)
    return merge_under(raw, flat) if flat else dict(raw)


# -- the store ------------------------------------------------------------------------------------

def store_kind(raw: Mapping[str, Any]) -> Optional[str]:
    """LOCAL or KUBERNETES as the (merged) ipam block chooses, or None when it chooses neither."""
    datastore = raw.get("datastore")
    if datastore not in (None, "", LOCAL, KUBERNETES):
        raise bad("ipam.datastore", f"{datastore!r} is not a store lease-ipam has",
                  '"kubernetes" (one Lease per address, for clusters) or "local" (a file store on this node)')
    if datastore == LOCAL:
        return LOCAL
    if raw.get("kubernetes") is not None or datastore == KUBERNETES or names_pools(raw):
        return KUBERNETES  # nv-ipam's pools are Kubernetes objects
    return None


def uses_kubernetes(config: dict) -> bool:
    """True when the ipam block (flat file merged) selects the Kubernetes Lease store."""
    return store_kind(ipam_block(config)) == KUBERNETES


def from_kubernetes(args: Mapping[str, str]) -> bool:
    """The call is for a Kubernetes pod: ``K8S_POD_UID`` in CNI_ARGS (Multus gives it to every
    delegate: multus-cni pkg/types/conf.go). Not K8S_POD_NAME/NAMESPACE: podman's CNI backend sets
    those for every container of one host."""
    return bool(args.get(K8S_POD_UID))


def no_cluster_store(network: str) -> CNIError:
    return bad("ipam", f"network {network!r} is used by a Kubernetes pod but selects no cluster store: a store on "
                       "each node would give pods on two nodes the same address",
               'add "kubernetes": {"kubeconfig": "/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig"} to the ipam block '
               "(or keep whereabouts' flat file /etc/cni/net.d/whereabouts.d/whereabouts.conf, which names one); "
               'set "datastore": "local" only if every pod of this network runs on one node')


def whereabouts_check(nad_ipam: Mapping[str, Any]) -> bool:
    """Whether ADD checks whereabouts' live allocations before claiming (rdmanet/ipam/store/whereabouts.py):
    ``whereabouts_check`` when the block sets it, else while whereabouts' flat file exists on this
    node (whereabouts is installed, so pods may still hold its addresses)."""
    explicit = nad_ipam.get("whereabouts_check")
    if explicit is not None:
        if not isinstance(explicit, bool):
            raise bad("ipam.whereabouts_check", f"{explicit!r} is not a boolean",
                      "true (check whereabouts' IPPools and reservations before claiming) or false")
        return explicit
    return flat_file(nad_ipam)[0] is not None


def lease_domain(raw: Mapping[str, Any], config: Mapping[str, Any]) -> str:
    """The Lease store's allocation domain (see the module docstring)."""
    name = raw.get("network_name")
    if name is not None and (not isinstance(name, str) or not NAME_RE.match(name)):
        raise bad("ipam.network_name", f"{name!r} is not a valid name", "use letters, digits, '_', '.', '-'")
    overlapping = raw.get("enable_overlapping_ranges", True)
    if not isinstance(overlapping, bool):
        raise bad("ipam.enable_overlapping_ranges", f"{overlapping!r} is not a boolean", "use true (the default) or false")
    domain = name or CLUSTER_DOMAIN
    if not overlapping:
        domain += "@ranges:" + ",".join(range_keys(raw, config.get("name", "")))
    return domain


def range_keys(raw: Mapping[str, Any], network: str = "") -> list[str]:
    """The subnets of the block's ranges, normalised and sorted, and the nv-ipam pools it names
    (``poolName`` defaults to the network's name); lenient: DEL must not fail on them."""
    texts = []
    if isinstance(raw.get("range"), str):
        texts.append(raw["range"])
    for entry in raw.get("ipRanges") or []:
        if isinstance(entry, dict) and isinstance(entry.get("range"), str):
            texts.append(entry["range"])
    for rset in raw.get("ranges") or []:
        for entry in rset if isinstance(rset, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("subnet"), str):
                texts.append(entry["subnet"])
    out = set()
    for text in texts:
        text = text.rsplit("-", 1)[-1].strip()  # "first-last/prefix" -> "last/prefix"
        try:
            out.add(str(ipaddress.ip_network(text, strict=False)))
        except ValueError:
            out.add(text)
    try:
        pools = pool_ref(raw, network if isinstance(network, str) else "")
    except CNIError:
        pools = None
    return sorted(out | set(pools.keys() if pools is not None else ()))


def store_location(config: dict) -> tuple[str, str]:
    """(dataDir, domain) of the network config, for the store it selects."""
    raw = ipam_block(config)
    if store_kind(raw) == KUBERNETES:
        return DEFAULT_DATA_DIR, lease_domain(raw, config)
    domain = raw.get("network_name")
    if domain is None:
        domain = config.get("name", "")
    if not isinstance(domain, str) or not NAME_RE.match(domain):
        raise bad("ipam.network_name", f"{domain!r} is not a valid name", "use letters, digits, '_', '.', '-' (it names a directory)")
    data_dir = raw.get("dataDir")
    data_dir = DEFAULT_DATA_DIR if data_dir is None else config_path(data_dir, "ipam.dataDir", DEFAULT_DATA_DIR)
    return data_dir, domain
