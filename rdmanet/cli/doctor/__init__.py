"""``rdmanet doctor``: the discovery steps operators run by hand on an RDMA GPU node, automated and
read-only (``lsmod | grep mlx``, ``rdma link``, ``rdma system``, ``lspci -nn | grep 15b3``,
``ibv_devinfo``, ``ls /etc/cni/net.d``, "is the daemon up", "can lease-ipam reach its store").

It never writes, loads modules or changes links: it reads sysfs, /proc and /dev, lists the CNI
dirs, execs the shims with ``CNI_COMMAND=VERSION``, sends the daemon a health request (under
systemd's rdmanet.socket that request starts the daemon, as any call does) and, for a Kubernetes
lease-ipam store, GETs one Lease (and each nv-ipam pool a network names).

Modules: ``host_facts`` (reading the host) and ``host_checks`` (judging it), ``cni_checks`` (bin
dir, conf dir, the networks that use our plugins), ``service_checks`` (daemon, lease-ipam stores),
``policy_checks`` (the node policy's roots: files others may write there; paths networks name),
``node_checks`` (whether the daemon's node GC runs: a Node name the API confirms),
``pool_checks`` (networks written for nv-ipam: their pools' mode and this node's range),
``nic_models`` (PCI ids), ``findings`` (the Finding record and the table / JSON output).
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

from rdmanet.cni.core.errors import CNIError

from .findings import Finding, error, exit_code, ordered, render_json, render_table

DEFAULT_CNI_BIN_DIR = "/opt/cni/bin"
DEFAULT_CNI_CONF_DIR = "/etc/cni/net.d"
DEFAULT_TIMEOUT = 5.0


@dataclass
class Options:
    sysfs_root: str = "/"
    proc_root: str = "/"
    dev_root: str = "/"
    cni_bin_dir: str = DEFAULT_CNI_BIN_DIR
    cni_conf_dir: str = DEFAULT_CNI_CONF_DIR
    socket: str = ""  # "" -> $RDMANET_DAEMON_SOCKET or the default
    network_configs: Sequence[str] = ()
    timeout: float = DEFAULT_TIMEOUT
    netns_mode_reader: Optional[Callable] = None  # () -> host_facts.ModeReading; None: RDMA netlink
    euid: int = field(default_factory=os.geteuid)
    node_policy: str = ""  # a node policy file (rdmanet.cni.linux.roots); "" -> the one a call would use
    systemd_root: str = "/"  # where /etc/systemd/system (rdmanet.socket) and /run/systemd/system are read


@dataclass
class Report:
    findings: list[Finding]
    inventory: dict

    @property
    def exit_code(self) -> int:
        return exit_code(self.findings)


def _guarded(findings: list[Finding], what: str, fn, *args, default=None):
    """Run one gathering/judging step; an unexpected failure becomes an error finding, not a traceback."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the doctor must report, never crash
        findings.append(error("doctor", what, f"the {what} check failed: {type(exc).__name__}: {exc}",
                              "report this as an rdmanet bug, with the doctor's output"))
        return default


def diagnose(options: Options) -> Report:
    from rdmanet.node.launcher import DEFAULT_SOCKET, SOCKET_ENV

    from . import cni_checks, host_checks, host_facts, node_checks, policy_checks, pool_checks, service_checks

    socket_path = options.socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
    out: list[Finding] = []
    inventory: dict = {}

    # the CNI install first: the networks it configures name devices the host check reads
    bin_facts = _guarded(out, "cni-bin", cni_checks.gather_bin_dir, options.cni_bin_dir, options.timeout)
    conf_facts = _guarded(out, "cni-conf", cni_checks.gather_conf_dir, options.cni_conf_dir)
    uses: list = []
    if conf_facts is not None:
        for f in conf_facts.files:
            uses += f.networks
    for path in options.network_configs:
        try:
            found = cni_checks.given_network_uses(path)
        except CNIError as err:
            out.append(error("network", path, f"--network-config {err.msg}", err.details))
            continue
        if not found:
            out.append(error("network", path, f"--network-config {path} uses none of macvlan-rdma, host-device-rdma, ipoib-rdma, lease-ipam",
                             "give a network config that uses an rdmanet plugin"))
        uses += found

    mode_reader = options.netns_mode_reader or host_facts.read_netns_mode
    host = _guarded(out, "host", host_facts.gather, options.sysfs_root, options.proc_root, options.dev_root,
                    mode_reader, cni_checks.masters_of(uses))
    if host is not None:
        out += _guarded(out, "host", host_checks.check_host, host, default=[])
        inventory["host"] = asdict(host)

    if bin_facts is not None:
        out += _guarded(out, "cni-bin", cni_checks.check_bin_dir, bin_facts, socket_path, default=[])
        inventory["cni_bin"] = asdict(bin_facts)
    bin_names = bin_facts.names if bin_facts is not None else []
    if conf_facts is not None:
        out += _guarded(out, "cni-conf", cni_checks.check_conf_dir, conf_facts, bin_names, default=[])
        inventory["cni_conf"] = {"path": conf_facts.path, "exists": conf_facts.exists,
                                 "files": [{"name": f.name, "types": f.types, "error": f.error} for f in conf_facts.files]}
    if host is not None and uses:
        net_facts = [_guarded(out, "network", cni_checks.gather_network, u, host, options.sysfs_root,
                              default=cni_checks.NetworkFacts()) for u in uses]
        out += _guarded(out, "network", cni_checks.check_networks, uses, net_facts, host, bin_names,
                        options.cni_bin_dir, default=[])
    inventory["networks"] = [{"source": u.source, "network": u.network, "plugin": u.plugin, "ipam": u.ipam} for u in uses]
    node_policy = policy_checks.load(options.node_policy) if options.node_policy else None
    out += _guarded(out, "network", policy_checks.check_networks, uses, node_policy, default=[])
    policy = _guarded(out, "policy", policy_checks.gather, options.euid, node_policy, options.node_policy,
                      options.sysfs_root)
    if policy is not None:
        out += _guarded(out, "policy", policy_checks.check, policy, default=[])
        inventory["policy"] = asdict(policy)

    daemon = _guarded(out, "daemon", service_checks.gather_daemon, socket_path, options.timeout, options.systemd_root)
    if daemon is not None:
        kinds = {s.kind for s in bin_facts.shims.values() if s.exists} if bin_facts is not None else set()
        out += _guarded(out, "daemon", service_checks.check_daemon, daemon, kinds, options.euid, default=[])
        inventory["daemon"] = asdict(daemon)
    pools = _guarded(out, "ipam", pool_checks.gather, uses, options.timeout)
    if pools is not None:
        out += pool_checks.check(pools)
        inventory["nv_ipam_pools"] = [asdict(p) for p in pools]
    stores = _guarded(out, "ipam", service_checks.gather_stores, uses, options.timeout)
    if stores is not None:
        out += _guarded(out, "ipam", service_checks.check_stores, stores, default=[])
        inventory["ipam"] = asdict(stores)
    node = _guarded(out, "node", node_checks.gather, uses, options.timeout)
    if node is not None:
        out += _guarded(out, "node", node_checks.check, node, default=[])
        inventory["node"] = asdict(node)
    return Report(ordered(out), inventory)


def run(args, out=None) -> int:
    """``rdmanet doctor`` from parsed arguments (see ``rdmanet/cli/main.py``): print, return the exit code."""
    from rdmanet.cni.linux import sysfs

    out = out or sys.stdout
    if not args.timeout > 0:
        sys.stderr.write(f"rdmanet doctor: --timeout must be a positive number of seconds, not {args.timeout}\n"
                         "  fix: e.g. --timeout 5\n")
        return 2
    options = Options(
        sysfs_root=args.sysfs_root or sysfs.default_root(),
        proc_root=args.proc_root,
        dev_root=args.dev_root,
        cni_bin_dir=args.cni_bin_dir,
        cni_conf_dir=args.cni_conf_dir,
        socket=args.socket or "",
        network_configs=args.network_config or (),
        timeout=args.timeout,
        node_policy=getattr(args, "node_policy", None) or "",
        systemd_root=getattr(args, "systemd_root", None) or "/",
    )
    report = diagnose(options)
    out.write(render_json(report.findings, report.inventory) if args.output == "json" else render_table(report.findings))
    out.flush()
    return report.exit_code
