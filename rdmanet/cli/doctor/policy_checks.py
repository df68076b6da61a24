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
  host-device-rdma ``stateDir`` other than the node's are errors (the calls fail with CNI error 7).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.linux import roots

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


def gather(euid: int, policy: Optional[roots.NodePolicy] = None, path: str = "") -> PolicyFacts:
    try:
        if policy is None and path:
            roots.load_policy_file(path)  # raises: say why
        policy = policy or roots.current()
    except roots.PolicyError as exc:
        return PolicyFacts(source=path, error=f"node policy: {exc}")
    except CNIError as exc:
        return PolicyFacts(source="", error=exc.msg)
    facts = PolicyFacts(source=policy.source)
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

        def outside(key: str, value: Any, allowed: Sequence[str]) -> Optional[str]:
            if value is None:
                return None
            try:
                roots.place(key, value, allowed)
            except CNIError as exc:
                return exc.msg
            return None

        log_file = _get(ipam, "log_file")
        if log_file and (msg := outside("ipam.log_file", log_file, policy.log_roots)):
            out.append(warn(AREA, subject, f"{msg}: ignored, lease-ipam logs to stderr/the daemon's log instead",
                            f"remove ipam.log_file or put it under {', '.join(policy.log_roots)}"))
        for key, value, allowed in (("ipam.dataDir", _get(ipam, "dataDir"), policy.data_roots),
                                    ("ipam.kubernetes.kubeconfig", _get(ipam, "kubernetes", "kubeconfig"), policy.kubeconfig_roots),
                                    ("runtimeConfig.CNIDeviceInfoFile", _get(config, "runtimeConfig", "CNIDeviceInfoFile"),
                                     (policy.device_info_dir,))):
            if msg := outside(key, value, allowed):
                out.append(error(AREA, subject, f"{msg}: every ADD fails with CNI error 7", _WIDEN))
        state_dir = config.get("stateDir") if use.plugin == "host-device-rdma" else None
        if state_dir is not None and (not isinstance(state_dir, str)
                                      or os.path.normpath(state_dir) != policy.host_device_state_dir):
            out.append(error(AREA, subject, f"stateDir {state_dir!r} is not the node's ({policy.host_device_state_dir}): "
                             "every ADD fails with CNI error 7", "remove stateDir from the network config"))
    return out
