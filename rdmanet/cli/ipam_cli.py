"""``rdmanet ipam``: list lease-ipam claims (``ls``), free claims of pods that are gone (``reconcile``)
and give nodes planned blocks (``plan``: :mod:`rdmanet.ipam.block_planner`).

``ls`` reads a store through its :class:`rdmanet.ipam.store.base.Store` interface. With
``--network-config`` (a NetworkAttachmentDefinition in YAML or JSON, one or several in a YAML
stream, a conflist or a plugin config: :mod:`rdmanet.cli.network_config`) it knows the ranges and
the store of each network in the file: the local store under ``ipam.dataDir`` by default, the
Kubernetes Lease store when the ipam block has ``kubernetes``. Without one it lists every domain
directory under ``--data-dir`` (claims only: no ranges). ``reconcile`` and ``plan`` take one
network: ``--network NAME`` picks it in a file that holds several.

The JSON schema of ``-o json`` is stable::

    {"networks": [{"domain", "store", "claims": [{"address", "network", "containerID", "ifname",
                                                 "pod", "node", "age_seconds"}],
                   "ranges": [{"range", "size", "used", "free"}],
                   "blocks": [{"block", "first", "last", "size", "node", "used", "borrowed", "age_seconds"}]}]}

``pod`` is "namespace/name" or null, ``node`` a node name or null (the local store has neither),
``age_seconds`` an int or null; ``ranges`` is empty when no config was given. ``blocks`` (the
Kubernetes store's node blocks; empty for the local store): ``block`` is the block's
label value (first address and size), ``used`` the claims inside it, ``borrowed`` those of them
made by another node than the block's.

A listing works without root on a readable store directory: when the store's lock cannot be
opened (it is a root-owned 0600 file), the files are read without it; a listing then taken while
an ADD runs may miss that ADD's addresses, which is all a lock-free read can cost here.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator, Optional, Sequence

from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, CNIError

from . import network_config

DEFAULT_DATA_DIR = "/var/lib/cni/lease-ipam"


# -- arguments ------------------------------------------------------------------------------------

def register(sub: "argparse._SubParsersAction") -> None:
    """Add ``ipam ls``, ``ipam reconcile`` and ``ipam plan`` to the ``rdmanet`` parser."""
    ipam = sub.add_parser("ipam", help="lease-ipam: list claims, free claims of deleted pods, plan node blocks")
    verbs = ipam.add_subparsers(dest="ipam_command", required=True)

    ls = verbs.add_parser("ls", help="list every claim (address, attachment, pod, node, age) and free/used counts per range")
    src = ls.add_mutually_exclusive_group()
    src.add_argument("--network-config", metavar="FILE",
                     help="a NAD (YAML or JSON, one or many documents), a conflist or a network config: gives ranges and store")
    src.add_argument("--data-dir", metavar="DIR",
                     help=f"without a config: list every domain of the local store under DIR (default: {DEFAULT_DATA_DIR})")
    ls.add_argument("--network", metavar="N", help="only the domain N, or claims made for the network N")
    ls.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format (default: %(default)s)")

    rec = verbs.add_parser("reconcile", help="free Kubernetes-store claims whose pod (by UID) is gone; runs once")
    what = rec.add_mutually_exclusive_group(required=True)
    what.add_argument("--network-config", metavar="FILE",
                      help="one network: a NAD (YAML or JSON), a conflist or a network config whose ipam block "
                           "selects the Lease store")
    rec.add_argument("--network", metavar="NAME", help="with --network-config: the network of the file to reconcile "
                                                         "(when it holds several)")
    what.add_argument("--all", action="store_true",
                      help="every lease-ipam claim in the namespace (the default install's CronJob); "
                           "in-cluster credentials unless --kubeconfig")
    rec.add_argument("--kubeconfig", metavar="FILE", help="with --all: a kubeconfig instead of the pod's service account")
    rec.add_argument("--namespace", metavar="NS",
                     help="with --all: where the Leases live (default: the kubeconfig context's or the service account's)")
    rec.add_argument("--grace-seconds", type=float, default=300.0,
                     help="skip claims younger than this (default: %(default)s)")
    rec.add_argument("--misses", type=int, default=3,
                     help="consecutive runs a claim's pod must be missing before it is freed (default: %(default)s)")
    rec.add_argument("--miss-spacing-seconds", type=float, default=None,
                     help="least API-server time between two counted misses of a claim, whichever cleaner counts "
                          "them (default: grace-seconds / misses)")
    rec.add_argument("--dry-run", action="store_true", help="report what would be done; change nothing")
    rec.add_argument("--deadline-seconds", type=float, default=480.0,
                     help="leave claims not judged by then for the next run (default: %(default)s, under the "
                          "CronJob's activeDeadlineSeconds)")
    rec.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format (default: %(default)s)")

    plan = verbs.add_parser("plan", help="give each node its share of free node blocks (planned records) before the ADDs; "
                                          "take back the free planned blocks of gone nodes")
    plan.add_argument("--network-config", metavar="FILE", required=True,
                      help="a NAD (YAML or JSON), a conflist or a network config whose ipam block selects the Lease store")
    plan.add_argument("--network", metavar="NAME", help="the network of the file to plan (when it holds several)")
    plan.add_argument("--node-selector", metavar="SELECTOR", default="",
                      help="label selector of the nodes to plan for (default: every node); planned blocks of nodes it "
                           "does not select are taken back while free")
    plan.add_argument("--blocks-per-node", metavar="N", type=int,
                      help="blocks each node should hold per range set (default: the range set's blocks / the nodes, rounded down)")
    plan.add_argument("--dry-run", action="store_true", help="report what would be done; change nothing")
    plan.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format (default: %(default)s)")


def run(args: argparse.Namespace, out=None) -> int:
    out = out or sys.stdout
    try:
        if args.ipam_command == "ls":
            views = list_claims(config_file=args.network_config, data_dir=args.data_dir, network=args.network)
            out.write(json.dumps(report_json(views), indent=2) + "\n" if args.output == "json" else render_table(views))
            return 0
        if args.ipam_command == "plan":
            from rdmanet.ipam import block_planner

            if args.blocks_per_node is not None and args.blocks_per_node < 0:
                raise CNIError(INVALID_CONFIG, "--blocks-per-node must not be negative", "e.g. --blocks-per-node 2")
            config = network_config.one_ipam_config(args.network_config, args.network)
            done = block_planner.plan_network(config, node_selector=args.node_selector,
                                              blocks_per_node=args.blocks_per_node, dry_run=args.dry_run)
            out.write(json.dumps(done.to_json(), indent=2) + "\n" if args.output == "json" else block_planner.render_table(done))
            return 1 if done.errors else 0
        from rdmanet.ipam import reconcile

        if args.misses < 1:
            raise CNIError(INVALID_CONFIG, "--misses must be at least 1", "give the number of consecutive misses, e.g. --misses 3")
        if args.deadline_seconds <= 0:
            raise CNIError(INVALID_CONFIG, "--deadline-seconds must be positive", "e.g. --deadline-seconds 480")
        if args.grace_seconds < 0:
            raise CNIError(INVALID_CONFIG, "--grace-seconds must not be negative", "e.g. --grace-seconds 300")
        if args.miss_spacing_seconds is not None and args.miss_spacing_seconds < 0:
            raise CNIError(INVALID_CONFIG, "--miss-spacing-seconds must not be negative", "e.g. --miss-spacing-seconds 100")
        if args.all:
            kube: dict = {"kubeconfig": args.kubeconfig} if args.kubeconfig else {}
            if args.namespace:
                kube["namespace"] = args.namespace
            config = {"ipam": {"type": "lease-ipam", "kubernetes": kube}}
        else:
            config = network_config.one_ipam_config(args.network_config, args.network)
        allowed = operator_allowances(args.kubeconfig, args.namespace) if args.all else contextlib.nullcontext()
        with allowed, freed_events(config, args.dry_run):
            if args.all:
                outcome = reconcile.reconcile_all(config, grace_seconds=args.grace_seconds, misses=args.misses,
                                                  dry_run=args.dry_run, deadline_seconds=args.deadline_seconds,
                                                  spacing_seconds=args.miss_spacing_seconds)
            else:
                outcome = reconcile.reconcile(config, grace_seconds=args.grace_seconds, misses=args.misses,
                                              dry_run=args.dry_run, deadline_seconds=args.deadline_seconds,
                                              spacing_seconds=args.miss_spacing_seconds)
        out.write(json.dumps(outcome.to_json(), indent=2) + "\n" if args.output == "json" else render_reconcile(outcome))
        return 1 if outcome.errors else 0
    except CNIError as err:
        sys.stderr.write(f"rdmanet ipam: {err.msg}\n" + (f"  fix: {err.details}\n" if err.details else ""))
        return 2


@contextmanager
def operator_allowances(kubeconfig: Optional[str], namespace: Optional[str]) -> Iterator[None]:
    """The node policy (docs/security.md) bounds what a network config names; a kubeconfig and a
    Lease namespace on this command line are the operator's own: for this run the policy in
    force is widened by them (rdmanet.cni.linux.roots)."""
    from rdmanet.cni.core import env as request_env
    from rdmanet.cni.linux import roots

    if not kubeconfig and not namespace:
        yield
        return
    policy = roots.current()
    changes: dict = {"source": f"{policy.source} + the command line"}
    if kubeconfig:
        changes["kubeconfigs"] = policy.kubeconfigs + (os.path.abspath(kubeconfig),)
    if namespace and policy.lease_namespaces is not None:
        changes["lease_namespaces"] = policy.lease_namespaces + (namespace,)
    before = roots.process_policy()
    roots.set_process_policy(dataclasses.replace(policy, **changes))
    try:  # the process policy, not a policy file the environment names, answers for this run
        with request_env.scoped({k: v for k, v in os.environ.items() if k != roots.POLICY_ENV}):
            yield
    finally:
        roots.set_process_policy(before)


@contextmanager
def freed_events(config: dict, dry_run: bool, flush_seconds: float = 10.0) -> Iterator[None]:
    """An event on each pod whose address the run frees (rdmanet.node.pod_events), written with the
    credentials the run uses (the CronJob's: its service account), at most ``flush_seconds`` after
    the run; never its failure."""
    if dry_run:
        yield
        return
    from rdmanet.ipam import telemetry
    from rdmanet.ipam.kube_config import kube_settings
    from rdmanet.ipam.node_gc import node_name
    from rdmanet.node.pod_events import Credentials, PodEvents

    try:
        settings = kube_settings(config)
    except CNIError:
        settings = None
    events = PodEvents(Credentials(settings.kubeconfig if settings is not None else None), node_name())
    telemetry.on_freed(events.freed)
    try:
        yield
    finally:
        telemetry.remove_listener(events.freed)
        events.flush(flush_seconds)


# -- listing --------------------------------------------------------------------------------------

@dataclass
class Claim:
    address: str
    network: str
    container_id: str
    ifname: str
    pod: Optional[str] = None
    node: Optional[str] = None
    age_seconds: Optional[int] = None

    def to_json(self) -> dict:
        return {"address": self.address, "network": self.network, "containerID": self.container_id,
                "ifname": self.ifname, "pod": self.pod, "node": self.node, "age_seconds": self.age_seconds}


def claim_row(claim, now: Optional[datetime] = None) -> Claim:
    """The ``rdmanet ipam ls`` row of a Lease-store claim (:class:`rdmanet.ipam.reconcile.LeaseClaim`)."""
    age = claim.age(now or datetime.now(timezone.utc))
    return Claim(claim.address or claim.name, claim.network, claim.container_id, claim.ifname, claim.pod, claim.node,
                 None if age is None else int(age))


@dataclass
class NetworkView:
    domain: str
    store: str  # "local" or "kubernetes"
    claims: list[Claim] = field(default_factory=list)
    ranges: list[dict] = field(default_factory=list)
    where: str = ""  # the store directory or namespace (table only)
    note: str = ""  # e.g. "read without the lock" (table only)
    blocks: list[dict] = field(default_factory=list)  # the Kubernetes store's node blocks

    def to_json(self) -> dict:
        return {"domain": self.domain, "store": self.store, "claims": [c.to_json() for c in self.claims],
                "ranges": self.ranges, "blocks": self.blocks}


def age_of(when: str, now: Optional[datetime] = None) -> Optional[int]:
    """Whole seconds since the ISO 8601 time ``when`` (None when absent or unreadable)."""
    if not when:
        return None
    try:
        t = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    return max(0, int(((now or datetime.now(timezone.utc)) - t).total_seconds()))


def _sort_key(claim: Claim):
    import ipaddress

    ip = ipaddress.ip_address(claim.address)
    return (ip.version, int(ip))


def claims_of(reservations, now: Optional[datetime] = None) -> list[Claim]:
    """One claim per address of each reservation (pod/node when the store's reservation carries them)."""
    out = []
    for res in reservations:
        age = age_of(res.time, now)
        pod, node = getattr(res, "pod", None) or None, getattr(res, "node", None) or None
        for ip in res.addresses:
            out.append(Claim(str(ip), res.network, res.attachment.container_id, res.attachment.ifname, pod, node, age))
    return sorted(out, key=_sort_key)


def range_counts(range_sets, claims: Sequence[Claim]) -> list[dict]:
    """size (allocatable addresses), used and free per range set, from the claimed addresses."""
    import ipaddress

    used: dict[int, list[int]] = {4: [], 6: []}
    for claim in claims:
        ip = ipaddress.ip_address(claim.address)
        used[ip.version].append(int(ip))
    for values in used.values():
        values.sort()
    out = []
    for rs in range_sets:
        size = rs.count_free([])
        free = rs.count_free(used[rs.family])
        out.append({"range": rs.describe(), "size": size, "used": size - free, "free": free})
    return out


def block_fill(blocks, claims: Sequence[Claim], now: Optional[datetime] = None) -> list[dict]:
    """Each node block with the claims inside it (``used``) and those another node made (``borrowed``)."""
    import ipaddress
    from bisect import bisect_left, bisect_right

    spots = sorted((ip.version, int(ip), c.node or "") for c in claims for ip in [ipaddress.ip_address(c.address)])
    keys = [(v, n) for v, n, _ in spots]
    out = []
    for b in blocks:
        lo, hi = bisect_left(keys, (b.ip.version, int(b.ip))), bisect_right(keys, (b.ip.version, b.last))
        inside = spots[lo:hi]
        last = ipaddress.ip_address(b.last) if b.ip.version == 4 else ipaddress.IPv6Address(b.last)
        out.append({"block": b.id, "first": str(b.ip), "last": str(last), "size": b.size, "node": b.node or None,
                    "used": len(inside), "borrowed": sum(1 for _, _, node in inside if node and node != b.node),
                    "age_seconds": age_of(b.time.isoformat(), now) if b.time else None})
    return out


def _local_reservations(data_dir: str, domain: str) -> tuple[list, str]:
    """(reservations, note): through the store, or by a lock-free read when the lock cannot be opened."""
    from rdmanet.ipam.store.local import LocalStore

    root = os.path.join(data_dir, domain)
    if not os.path.isdir(root):
        return [], "no store directory yet"
    try:
        return LocalStore(data_dir, domain, lock_timeout=10.0).list(), ""
    except CNIError as err:
        if err.code != IO_FAILURE:
            raise
    return read_local_unlocked(root), "read without the store lock (not writable by this user)"


def read_local_unlocked(root: str) -> list:
    """The local store's reservations read from its address files alone (read-only, no lock)."""
    from rdmanet.ipam.store.files import read_json
    from rdmanet.ipam.store.layout import address_name, reservations_of

    try:
        names = os.listdir(root)
    except OSError as exc:
        raise CNIError(IO_FAILURE, f"cannot read {root}: {exc.strerror or exc}",
                       "run as a user that can read the store directory (root, or sudo)") from None

    def claims():
        for name in names:
            ip = address_name(name)
            if ip is None:
                continue
            try:
                yield ip, read_json(os.path.join(root, name))
            except OSError as exc:
                raise CNIError(IO_FAILURE, f"cannot read {os.path.join(root, name)}: {exc.strerror or exc}",
                               "run as a user that can read the store's files (root, or sudo)") from None

    return reservations_of(claims())


def _filter(view: NetworkView, network: Optional[str]) -> Optional[NetworkView]:
    if network is None or view.domain == network:
        return view
    view.claims = [c for c in view.claims if c.network == network]
    return view if view.claims else None


def network_view(config: dict, now: Optional[datetime] = None) -> NetworkView:
    """One network's claims, ranges (and node blocks) in the store its ipam block selects."""
    from rdmanet.ipam.config import parse_ipam_config
    from rdmanet.ipam.location import uses_kubernetes

    parsed = parse_ipam_config(config)
    if uses_kubernetes(config):
        from rdmanet.ipam import reconcile

        target = reconcile.KubeTarget.from_config(config)
        claims = [claim_row(c, now) for c in target.list_claims()]
        view = NetworkView(parsed.domain, "kubernetes", sorted(claims, key=_sort_key), where=f"namespace {target.namespace}")
        view.blocks = block_fill(target.list_blocks(), view.claims, now)
    else:
        reservations, note = _local_reservations(parsed.data_dir, parsed.domain)
        view = NetworkView(parsed.domain, "local", claims_of(reservations, now),
                           where=os.path.join(parsed.data_dir, parsed.domain), note=note)
    view.ranges = range_counts(parsed.range_sets, view.claims)
    return view


def list_claims(config_file: Optional[str] = None, data_dir: Optional[str] = None,
                network: Optional[str] = None, now: Optional[datetime] = None) -> list[NetworkView]:
    """What ``ls`` shows, one view per domain (``report_json`` gives the stable JSON schema)."""
    views: list[NetworkView] = []
    if config_file is not None:
        for config in network_config.ipam_configs(config_file):
            kept = _filter(network_view(config, now), network)
            if kept is not None:
                views.append(kept)
    else:
        data_dir = data_dir or DEFAULT_DATA_DIR
        try:
            domains = sorted(name for name in os.listdir(data_dir) if os.path.isdir(os.path.join(data_dir, name)))
        except FileNotFoundError:
            domains = []
        except OSError as exc:
            raise CNIError(IO_FAILURE, f"cannot read {data_dir}: {exc.strerror or exc}",
                           "run as a user that can read the store directory (root, or sudo)") from None
        for domain in domains:
            reservations, note = _local_reservations(data_dir, domain)
            kept = _filter(NetworkView(domain, "local", claims_of(reservations, now),
                                       where=os.path.join(data_dir, domain), note=note), network)
            if kept is not None:
                views.append(kept)
    return views


def report_json(views: Sequence[NetworkView]) -> dict:
    return {"networks": [v.to_json() for v in views]}


# -- table ----------------------------------------------------------------------------------------

def human_age(seconds: Optional[int]) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    lines = [indent + "  ".join(str(x).ljust(w) for x, w in zip(line, widths)).rstrip() for line in [headers, *rows]]
    return "\n".join(lines) + "\n"


def render_reconcile(outcome) -> str:
    """``rdmanet ipam reconcile``'s table of a :class:`rdmanet.ipam.reconcile.Outcome`."""
    head = (f"{outcome.domain} (namespace {outcome.namespace}): {len(outcome.actions)} claim(s), "
            f"grace {int(outcome.grace_seconds)} s, freed after {outcome.misses} miss(es)")
    if outcome.dry_run:
        head += "  [dry run: nothing changed]"
    text = head + "\n"
    if outcome.actions:
        rows = [(a.action, a.claim.address or "-", a.claim.pod or "-", (a.claim.pod_uid or "-")[:8],
                 f"{a.claim.container_id[:12]}/{a.claim.ifname}", a.claim.name, a.reason)
                for a in outcome.actions]
        text += table(("ACTION", "ADDRESS", "POD", "UID", "CONTAINER/IFNAME", "LEASE", "REASON"), rows)
    if outcome.blocks:  # blocks of Nodes that are gone (--all)
        text += table(("ACTION", "BLOCK", "OWNER", "LEASE", "REASON"),
                      [(b.action, b.block, b.owner, b.name, b.reason) for b in outcome.blocks])
    return text


def render_table(views: Sequence[NetworkView]) -> str:
    if not views:
        return "no lease-ipam networks found\n"
    parts = []
    for view in views:
        net = view.to_json()
        head = f"{view.domain}  ({view.store} store" + (f", {view.where})" if view.where else ")")
        if view.note:
            head += f"  [{view.note}]"
        parts.append(head + "\n")
        if net["claims"]:
            rows = [(c["address"], c["network"], f"{c['containerID'][:12]}/{c['ifname']}", c["pod"] or "-",
                     c["node"] or "-", human_age(c["age_seconds"])) for c in net["claims"]]
            parts.append(table(("ADDRESS", "NETWORK", "CONTAINER/IFNAME", "POD", "NODE", "AGE"), rows))
        else:
            parts.append("  no claims\n")
        if net["ranges"]:
            rows = [(r["range"], str(r["size"]), str(r["used"]), str(r["free"])) for r in net["ranges"]]
            parts.append(table(("RANGE", "SIZE", "USED", "FREE"), rows))
        if net["blocks"]:
            rows = [(f"{b['first']}-{b['last']}", b["node"] or "-", f"{b['used']}/{b['size']}", str(b["borrowed"]),
                     human_age(b["age_seconds"])) for b in net["blocks"]]
            parts.append(table(("BLOCK", "NODE", "USED/SIZE", "BORROWED", "AGE"), rows))
    return "\n".join(parts)
