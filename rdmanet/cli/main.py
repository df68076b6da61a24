"""The `rdmanet` operator CLI.

Commands: ``demo`` (attach a network namespace with the embedded defaults and show it),
``ipam`` (``ls``: lease-ipam claims and free counts; ``reconcile``: free Kubernetes-store claims
of pods that are gone), ``daemon`` (the node daemon the CNI shims talk to; ``--check``: is it
healthy), ``doctor`` (read-only checks of the node: RDMA NICs, netns mode, modules, CNI dirs,
daemon, lease-ipam stores), ``version``.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rdmanet", description="rdmanet: RDMA-aware CNI plugins for Multus")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="attach a network namespace with macvlan-rdma + lease-ipam and show the result")
    demo.add_argument("--master", help="host interface to put the macvlan on (default: a local veth pair the demo creates)")
    demo.add_argument("--netns", default="rdmanet-demo", help="namespace name under /run/netns (default: %(default)s)")
    demo.add_argument("--cni-path", default="/opt/cni/bin", help="where the plugins are installed (default: %(default)s)")
    demo.add_argument("--keep", action="store_true", help="leave the namespace attached; 'rdmanet demo --down' removes it")
    demo.add_argument("--down", action="store_true", help="detach (CNI DEL) and remove what a --keep run left")

    from .ipam_cli import register as register_ipam

    register_ipam(sub)

    daemon = sub.add_parser("daemon", help="run the node daemon that serves the CNI shims (root)")
    daemon.add_argument("--socket", default=None,
                        help="unix socket (default: $RDMANET_DAEMON_SOCKET or /run/rdmanet/daemon.sock)")
    daemon.add_argument("--check", action="store_true", help="ask a running daemon for its health; exit 0 healthy, 1 not")
    daemon.add_argument("--allow-uid", type=int, action="append", default=None, metavar="UID",
                        help="a peer uid to accept (repeatable; default: only root, uid 0); for tests")
    daemon.add_argument("--workers", type=int, default=None, metavar="N",
                        help="calls served at once (default: 32); more wait in the socket's queue")
    daemon.add_argument("--call-timeout", type=float, default=None, metavar="SECONDS",
                        help="deadline of each call, lock waits and IPAM execs included; keep it below the runtime's "
                             "(default: 50; kubelet gives CRI calls 120)")
    daemon.add_argument("--nice", type=int, default=None, metavar="N",
                        help="serve at this nice value, or at the one it was started with when that is lower "
                             "(default: -10: a burst of pod starts has the shims' processes compete with it)")
    daemon.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics on this port (default: $RDMANET_METRICS_PORT, else none)")
    daemon.add_argument("--metrics-address", default=None, metavar="ADDRESS",
                        help="the address the metrics port binds (default: $RDMANET_METRICS_ADDRESS, else 127.0.0.1: "
                             "nothing is exposed off the host unless asked)")
    daemon.add_argument("--kubeconfig", default=None, metavar="FILE",
                        help="the daemon's own credentials, for the events it writes on pods (default: "
                             "$RDMANET_KUBECONFIG, else install.sh's /etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig, else the "
                             "pod's service account, else no events)")
    from .node_policy import register as register_policy

    register_policy(daemon)

    doctor = sub.add_parser("doctor", help="read-only checks of this node: RDMA NICs and mode, modules, CNI dirs, daemon, IPAM stores")
    doctor.add_argument("-o", "--output", choices=("table", "json"), default="table", help="output format (default: %(default)s)")
    doctor.add_argument("--sysfs-root", metavar="DIR", default=None,
                        help="read /sys under DIR, for a fake tree (default: $RDMANET_SYSFS_ROOT or /)")
    doctor.add_argument("--proc-root", metavar="DIR", default="/", help="read /proc/modules, /proc/net/route under DIR (default: /)")
    doctor.add_argument("--dev-root", metavar="DIR", default="/", help="read /dev/infiniband under DIR (default: /)")
    doctor.add_argument("--cni-bin-dir", metavar="DIR", default="/opt/cni/bin", help="CNI bin dir (default: %(default)s)")
    doctor.add_argument("--cni-conf-dir", metavar="DIR", default="/etc/cni/net.d", help="CNI conf dir (default: %(default)s)")
    doctor.add_argument("--socket", default=None, help="daemon socket (default: $RDMANET_DAEMON_SOCKET or /run/rdmanet/daemon.sock)")
    doctor.add_argument("--systemd-root", metavar="DIR", default="/",
                        help="read /etc/systemd/system/rdmanet.socket and /run/systemd/system under DIR (default: /)")
    doctor.add_argument("--network-config", metavar="FILE", action="append", default=None,
                        help="also check the networks of this file: a NAD (YAML or JSON, one or many documents), a conflist "
                             "or a network config; repeatable")
    doctor.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="for each shim's VERSION, the daemon and the API server (default: %(default)s)")
    doctor.add_argument("--node-policy", metavar="FILE", default=None,
                        help="judge the roots and networks by this node policy file, e.g. the one the daemon's "
                             "--node-policy names (default: $RDMANET_NODE_POLICY, /etc/rdmanet/node-policy.json, built-in)")

    version = sub.add_parser("version", help="print rdmanet's version, the interpreter's and every dependency's")
    version.add_argument("-o", "--output", choices=("text", "json"), default="text")

    args = parser.parse_args(argv)
    if args.command == "ipam":
        from .ipam_cli import run as run_ipam

        return run_ipam(args)
    if args.command == "daemon":
        import os

        from rdmanet.node.launcher import DEFAULT_SOCKET, SOCKET_ENV

        path = args.socket or os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET
        if args.check:
            from rdmanet.node.daemon import check

            return check(path)
        if argv is None:  # this process's own command line: the allocator settings of rdmanet.node.memory
            from rdmanet.node.memory import restart_tuned

            restart_tuned()
        from rdmanet.node.daemon import run as run_daemon

        from rdmanet.cni.core.deadline import DEFAULT_SECONDS
        from rdmanet.cni.linux.roots import PolicyError
        from rdmanet.node.daemon import NICE, WORKERS

        from .node_policy import from_args

        if (args.workers is not None and args.workers < 1) or (args.call_timeout is not None and args.call_timeout <= 0):
            parser.error("--workers and --call-timeout must be positive")
        if args.nice is not None and not -20 <= args.nice <= 19:
            parser.error("--nice must be between -20 and 19")
        from rdmanet.node.metrics import address_and_port
        from rdmanet.node.pod_events import KUBECONFIG_ENV

        try:
            metrics = address_and_port(args.metrics_port, args.metrics_address)
        except ValueError as exc:
            parser.error(str(exc))
        try:
            policy = from_args(args)
        except PolicyError as exc:
            print(f"rdmanet daemon: {exc}", file=sys.stderr)
            return 2
        return run_daemon(path, allowed_uids=args.allow_uid or (0,), workers=args.workers or WORKERS,
                          call_timeout=args.call_timeout or DEFAULT_SECONDS, policy=policy,
                          nice=NICE if args.nice is None else args.nice, metrics_endpoint=metrics,
                          kubeconfig=args.kubeconfig or os.environ.get(KUBECONFIG_ENV) or None)
    if args.command == "doctor":
        from .doctor import run as run_doctor

        return run_doctor(args)
    if args.command == "version":
        from .versions import run as run_version

        return run_version(args.output)
    from .demo import run_demo

    return run_demo(args)


if __name__ == "__main__":
    sys.exit(main())
