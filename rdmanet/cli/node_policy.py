"""The daemon's node-policy flags (docs/security.md): which roots a network config may name.

``rdmanet daemon --node-policy FILE`` loads a policy file (rdmanet.cni.linux.roots); ``--allow-root
KIND=DIR`` adds a root, ``--allow-kubeconfig FILE`` a kubeconfig, ``--host-device-state-dir``, ``--device-info-dir`` and
``--lease-namespace`` set the node's directories and the allowed Lease namespaces, ``--pool-namespace``
the namespaces nv-ipam pools are read from (in order). A call whose
environment names a policy file (RDMANET_NODE_POLICY, set by the runtime) uses that file instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from typing import Optional

from rdmanet.cni.linux import roots


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-policy", metavar="FILE", default=None,
                        help=f"node policy file (default: {roots.DEFAULT_POLICY_FILE} when it exists, else the "
                             "built-in defaults); see docs/security.md")
    parser.add_argument("--allow-root", metavar="KIND=DIR", action="append", default=[],
                        help=f"also allow paths under DIR for KIND ({', '.join(roots.KINDS)}); repeatable")
    parser.add_argument("--allow-kubeconfig", metavar="FILE", action="append", default=[],
                        help="also let a network config name this kubeconfig file (repeatable)")
    parser.add_argument("--host-device-state-dir", metavar="DIR", default=None,
                        help="host-device-rdma's state, locks and allocation records (default /var/lib/cni/host-device-rdma)")
    parser.add_argument("--device-info-dir", metavar="DIR", default=None,
                        help="where device-info files may be written (default /var/run/k8s.cni.cncf.io/devinfo/cni)")
    parser.add_argument("--lease-namespace", metavar="NS", action="append", default=None,
                        help="a namespace lease-ipam may keep Leases in (repeatable; default: any the credentials allow)")
    parser.add_argument("--pool-namespace", metavar="NS", action="append", default=None,
                        help="a namespace lease-ipam reads nv-ipam pools from, in the order given (repeatable; "
                             "default: kube-system, nvidia-network-operator)")


def from_args(args: argparse.Namespace) -> Optional[roots.NodePolicy]:
    """The policy the flags describe, or None when no flag is given (then each call reads the
    policy file anew, so an edited file applies without a restart). Raises roots.PolicyError."""
    given = (args.node_policy, args.allow_root, args.allow_kubeconfig, args.host_device_state_dir, args.device_info_dir,
             args.lease_namespace, args.pool_namespace)
    if not any(given):
        return None
    path = args.node_policy or os.environ.get(roots.POLICY_ENV)
    if path is None and os.path.lexists(roots.DEFAULT_POLICY_FILE):
        path = roots.DEFAULT_POLICY_FILE
    policy = roots.load_policy_file(path) if path else roots.NodePolicy()
    for entry in args.allow_root:
        kind, sep, directory = entry.partition("=")
        if not sep:
            raise roots.PolicyError(f"--allow-root {entry!r}: expected KIND=DIR")
        try:
            policy = policy.widened(kind, directory)
        except ValueError as exc:
            raise roots.PolicyError(f"--allow-root {entry!r}: {exc}") from None
    changes: dict = {"source": f"{path or 'built-in defaults'} + flags"}
    if args.allow_kubeconfig:
        changes["kubeconfigs"] = policy.kubeconfigs + tuple(roots.absolute_path(f, "--allow-kubeconfig")
                                                            for f in args.allow_kubeconfig)
    if args.host_device_state_dir:
        changes["host_device_state_dir"] = roots.absolute_path(args.host_device_state_dir, "--host-device-state-dir")
    if args.device_info_dir:
        changes["device_info_dir"] = roots.absolute_path(args.device_info_dir, "--device-info-dir")
    if args.lease_namespace is not None:
        changes["lease_namespaces"] = roots.policy_from_dict({"leaseNamespaces": args.lease_namespace},
                                                             "--lease-namespace").lease_namespaces
    if args.pool_namespace is not None:
        changes["pool_namespaces"] = roots.policy_from_dict({"poolNamespaces": args.pool_namespace},
                                                            "--pool-namespace").pool_namespaces
    return dataclasses.replace(policy, **changes)
