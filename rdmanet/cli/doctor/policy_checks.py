"""The node policy (rdmanet.cni.linux.roots) as the doctor sees it: the roots themselves, what lies under
them, and what the networks ask for.

- Under every root and node directory (a root writable by everyone, like /tmp, is a warning
  and is not scanned): a file or directory others may write, or owned by another
  user, is an error (a tenant who can write there could plant what the daemon, as root, then
  uses; the plugins refuse paths through such directories); a symlink is a warning (the plugins
  refuse to follow it). The walk never follows symlinks and stops after :data:`MAX_ENTRIES`.
- For every network using our plugins: ``ipam.log_file`` outside the log roots is a warning
  (ignored: whereabouts NADs say ``/tmp/whereabouts.log``); ``ipam.dataDir``,
  ``ipam.kubernetes.kubeconfig``, ``runtimeConfig.CNIDeviceInfoFile`` outside their roots and a
  host-device-rdma ``stateDir`` other than the node's are errors (the calls fail with CNI error 7);
  so is an ``ipam.type`` naming one of our interface plugins. A top-level key the plugin does not
  read is a warning naming the closest one it does (``"mastr"``: did you mean ``master``?), and so
  is a macvlan-rdma network without ``master`` whose default-route link the policy does not list.
- What the policy lets a network config use: the kubeconfigs, Lease namespaces, the devices
  host-device-rdma may move and the masters of macvlan-rdma and ipoib-rdma (the rules, and the
  links of this node they allow now).
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.linux import device_policy, roots, sysfs

from .findings import Finding, error, info, ok, warn

AREA = "policy"
MAX_ENTRIES = 20000
_WIDEN = "remove it from the network config, or have the node owner widen the roots (docs/security.md)"


@dataclass
class Problem:
    path: str
    what: str  # "writable by others" | "owned by uid N" | "symlink"


@dataclass
class RootFacts:
    what: str
    path: str
    exists: bool = False
    shared: bool = False  # the root itself is writable by others (e.g. /tmp): not scanned
    problems: list[Problem] = field(default_factory=list)
    entries: int = 0
    truncated: bool = False


@dataclass
class PolicyFacts:
    source: str
    error: str = ""
    roots: list[RootFacts] = field(default_factory=list)
    allows: dict = field(default_factory=dict)  # the policy's allowances as a policy file says them
    masters_now: list[str] = field(default_factory=list)  # links of this node the policy takes as masters
    host_devices_now: list[str] = field(default_factory=list)  # links a hostDevices rule matches


def _judge(path: str, st: os.stat_result, euid: int) -> Optional[Problem]:
    if stat.S_ISLNK(st.st_mode):
        return Problem(path, "symlink")
    if st.st_uid not in (0, euid):
        return Problem(path, f"owned by uid {st.st_uid}")
    if st.st_mode & 0o022:
        return Problem(path, f"writable by {'others' if st.st_mode & 0o002 else 'its group'} "
                             f"(mode {stat.S_IMODE(st.st_mode):o})")
    return None


def scan(what: str, top: str, euid: int, max_entries: int = MAX_ENTRIES) -> RootFacts:
    """Everything under ``top`` (not ``top`` itself: the node owner chose it), without following symlinks."""
    facts = RootFacts(what, top, exists=os.path.isdir(top))
    if not facts.exists:
        return facts
    if os.stat(top).st_mode & 0o002:
        facts.shared = True
        return facts
    for directory, dirs, files in os.walk(top, followlinks=False):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            facts.entries += 1
            if facts.entries > max_entries:
                facts.truncated = True
                return facts
            path = os.path.join(directory, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            problem = _judge(path, st, euid)
            if problem is not None:
                facts.problems.append(problem)
    return facts


def load(path: str) -> Optional[roots.NodePolicy]:
    """The policy in ``path`` (``rdmanet doctor --node-policy``); None when unusable (gather says why)."""
    try:
        return roots.load_policy_file(path)
    except roots.PolicyError:
        return None


ALLOWANCES = ("kubeconfigs", "leaseNamespaces", "hostDevicesFromDeviceID", "hostDevices", "rdmaMasters", "masters")


def links_allowed(policy: roots.NodePolicy, sysfs_root: str) -> tuple[list[str], list[str]]:
    """(links the policy takes as masters, links a hostDevices rule matches) among this node's
    netdevs in ``sysfs_root``; the host-use guard is the plugin's, at ADD."""
    masters, host_devices = [], []
    for name in sysfs.list_names("/sys/class/net", sysfs_root):
        if name == "lo":
            continue
        dev = device_policy.device(name, None, sysfs_root)
        by_rule = any(rule.matches(dev) for rule in policy.masters)
        if by_rule or (policy.rdma_masters and sysfs.rdma_devices_for_netdev(name, sysfs_root)):
            masters.append(name)
        if any(rule.matches(dev) for rule in policy.host_devices):
            host_devices.append(name)
    return masters, host_devices


def gather(euid: int, policy: Optional[roots.NodePolicy] = None, path: str = "", sysfs_root: str = "/") -> PolicyFacts:
    try:
        if policy is None and path:
            roots.load_policy_file(path)  # raises: say why
        policy = policy or roots.current()
    except roots.PolicyError as exc:
        return PolicyFacts(source=path, error=f"node policy: {exc}")
    except CNIError as exc:
        return PolicyFacts(source="", error=exc.msg)
    doc = policy.to_json()
    facts = PolicyFacts(source=policy.source, allows={key: doc[key] for key in ALLOWANCES})
    facts.masters_now, facts.host_devices_now = links_allowed(policy, sysfs_root)
    seen: set[str] = set()
    for what, top in roots.roots_of(policy):
        if top in seen:
            continue
        seen.add(top)
        facts.roots.append(scan(what, top, euid))
    return facts


def check(facts: PolicyFacts) -> list[Finding]:
    if facts.error:
        return [error(AREA, "node policy", facts.error, "fix or remove the node policy file (docs/security.md)")]
    out = [info(AREA, "node policy", f"roots from {facts.source}", "widen them in the node policy, never in a NAD")]
    out += allowances(facts)
    for root in facts.roots:
        if not root.exists:
            continue
        if root.shared:
            out.append(warn(AREA, root.path, f"the {root.what} is writable by everyone: only private directories "
                            "below it are usable, and it is not scanned", "choose a root only root may write"))
            continue
        for p in root.problems:
            if p.what == "symlink":
                out.append(warn(AREA, p.path, f"a symlink under the {root.what} {root.path}: the plugins refuse paths through it",
                                "replace it with the directory or file itself"))
            else:
                out.append(error(AREA, p.path, f"under the {root.what} {root.path} and {p.what}: "
                                 "whoever can write it can steer what the root daemon does",
                                 f"chown root:root {p.path} && chmod go-w {p.path}"))
        if root.truncated:
            out.append(info(AREA, root.path, f"only the first {MAX_ENTRIES} entries were checked", ""))
        if not root.problems:
            out.append(ok(AREA, root.path, f"{root.what}: {root.entries} entries, none writable by others or foreign-owned"))
    return out


def allowances(facts: PolicyFacts) -> list[Finding]:
    """What a network config may use on this node, as info findings."""
    a = facts.allows
    if not a:
        return []
    fix = "change it in the node policy (docs/security.md), never in a NAD"
    rules = lambda key: ", ".join(json.dumps(r) for r in a[key]) or "none"  # noqa: E731
    namespaces = "any the credentials allow" if a["leaseNamespaces"] is None else ", ".join(a["leaseNamespaces"]) or "none"
    return [
        info(AREA, "kubeconfigs", f"a NAD may name the kubeconfigs {', '.join(a['kubeconfigs']) or 'none'}; "
             f"ipam.kubernetes.namespace may be {namespaces}", fix),
        info(AREA, "host devices", "host-device-rdma moves "
             + ("the device a deviceID names (the device plugin's) and " if a["hostDevicesFromDeviceID"] else "")
             + f"what hostDevices matches: {rules('hostDevices')}"
             + (f" (here: {', '.join(facts.host_devices_now)})" if facts.host_devices_now else "")
             + "; never a link the host uses unless its rule says hostInUse", fix),
        info(AREA, "masters", "macvlan-rdma and ipoib-rdma take as master "
             + ("links with an RDMA device and " if a["rdmaMasters"] else "")
             + f"what masters matches: {rules('masters')}; here: {', '.join(facts.masters_now) or 'none'}", fix),
    ]


def _get(config: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(config, dict):
            return None
        config = config.get(key)
    return config


def check_networks(uses: Sequence[Any], policy: Optional[roots.NodePolicy] = None) -> list[Finding]:
    """What each network config asks of the roots (NetworkUse from cni_checks)."""
    try:
        policy = policy or roots.current()
    except CNIError:
        return []
    out: list[Finding] = []
    for use in uses:
        subject = f"{use.source}: {use.network}"
        config = use.config
        ipam = config.get("ipam")

        def outside(key: str, value: Any, allowed: Optional[Sequence[str]]) -> Optional[str]:
            if value is None:
                return None
            try:
                if allowed is None:
                    roots.place_kubeconfig(key, value, policy.kubeconfigs)
                else:
                    roots.place(key, value, allowed)
            except CNIError as exc:
                return exc.msg
            return None

        log_file = _get(ipam, "log_file")
        if log_file and (msg := outside("ipam.log_file", log_file, policy.log_roots)):
            out.append(warn(AREA, subject, f"{msg}: ignored, lease-ipam logs to stderr/the daemon's log instead",
                            f"remove ipam.log_file or put it under {', '.join(policy.log_roots)}"))
        for key, value, allowed in (("ipam.dataDir", _get(ipam, "dataDir"), policy.data_roots),
                                    ("ipam.kubernetes.kubeconfig", _get(ipam, "kubernetes", "kubeconfig"), None),
                                    ("runtimeConfig.CNIDeviceInfoFile", _get(config, "runtimeConfig", "CNIDeviceInfoFile"),
                                     (policy.device_info_dir,))):
            if msg := outside(key, value, allowed):
                out.append(error(AREA, subject, f"{msg}: every ADD fails with CNI error 7", _WIDEN))
        out += _keys_findings(use, subject, policy)
        state_dir = config.get("stateDir") if use.plugin == "host-device-rdma" else None
        if state_dir is not None and (not isinstance(state_dir, str)
                                      or os.path.normpath(state_dir) != policy.host_device_state_dir):
            out.append(error(AREA, subject, f"stateDir {state_dir!r} is not the node's ({policy.host_device_state_dir}): "
                             "every ADD fails with CNI error 7", "remove stateDir from the network config"))
    return out


def _conf_models() -> dict:
    from rdmanet.plugins.host_device_rdma.config import HostDeviceConf
    from rdmanet.plugins.ipoib_rdma.config import IpoibConf
    from rdmanet.plugins.macvlan_rdma.config import MacvlanConf

    return {"macvlan-rdma": MacvlanConf, "host-device-rdma": HostDeviceConf, "ipoib-rdma": IpoibConf}


def _keys_findings(use: Any, subject: str, policy: roots.NodePolicy) -> list[Finding]:
    """Keys an interface plugin would not read (typos), ipam.type naming an interface plugin, a
    macvlan-rdma network that would fall back to a default-route link the policy does not list."""
    from rdmanet.cni.core.netconf import unknown_keys
    from rdmanet.cni.core.nesting import INTERFACE_PLUGINS

    model = _conf_models().get(use.plugin)
    if model is None:
        return []
    out = []
    for key, close in unknown_keys(model, use.config):
        out.append(warn("network", subject, f"{use.plugin} does not read the key {key!r}: it is ignored"
                        + (f" (did you mean {close!r}?)" if close else ""),
                        f"rename it to {close!r}" if close else f"remove {key!r} from the network config"))
    if use.ipam in INTERFACE_PLUGINS:
        out.append(error("network", subject, f"ipam.type {use.ipam} is an interface plugin, not an IPAM plugin: "
                         "every ADD fails with CNI error 7", 'set ipam.type to an IPAM plugin such as "lease-ipam"'))
    if use.plugin == "macvlan-rdma" and not use.config.get("master") and not use.config.get("linkInContainer"):
        judge = info if policy.masters else warn  # a masters rule may list the default-route link
        out.append(judge("network", subject, "master is not set: the default-route link is taken only when the node "
                         "policy lists it in masters, else every ADD fails with CNI error 7",
                         'set "master" to a port of an RDMA NIC'))
    return out
