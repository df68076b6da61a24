"""install.sh's host mode: which Node this host is, written to the daemon's environment file.

``python -m rdmanet.cli.node_name --env-file FILE [--name NAME] [--kubeconfig FILE]``

- ``--name``: the node owner's word (``install.sh --node-name``); asked of the API when it can be
  reached, written either way (the daemon confirms it again before every node GC run).
- without it: the Node that matches this host (its hostname, lower-cased, its FQDN, its short
  name: :func:`rdmanet.ipam.node_identity.candidates`), confirmed by a GET of the Node through
  ``--kubeconfig`` (default: ``$KUBECONFIG``, else the first of :data:`KUBECONFIGS` that exists).
  Written only when confirmed; else the file is left as it is and the reason printed (exit 3).

The file keeps its other lines; ``RDMANET_NODE_NAME=`` is replaced or added (write + rename).
Prints one line saying what it did. Exit: 0 written, 3 no Node confirmed (nothing written), 2 bad
usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

from rdmanet.cni.linux.files import atomic_write
from rdmanet.ipam import node_identity

KUBECONFIGS = ("/etc/kubernetes/kubelet.conf", "/var/lib/kubelet/kubeconfig", "/etc/kubernetes/admin.conf",
               "/root/.kube/config")


def default_kubeconfig(environ=os.environ) -> Optional[str]:
    given = environ.get("KUBECONFIG", "").split(os.pathsep)[0]
    if given:
        return given
    return next((p for p in KUBECONFIGS if os.path.isfile(p)), None)


def _api(kubeconfig: str):
    from rdmanet.ipam.kube_config import connect, kube_settings
    from rdmanet.ipam.reconcile import KubeAPI
    from rdmanet.ipam.store.kube import ApiClientTransport

    conn = connect(kube_settings({"ipam": {"type": "lease-ipam", "kubernetes": {"kubeconfig": kubeconfig}}}))
    return KubeAPI(ApiClientTransport(conn.api_client, conn.host))


def write_name(env_file: str, name: str) -> None:
    """Set ``RDMANET_NODE_NAME=name`` in ``env_file``, its other lines kept."""
    try:
        with open(env_file, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        lines = ["# rdmanet daemon environment (rdmanet.service reads it); install.sh sets RDMANET_NODE_NAME"]
    key = node_identity.NODE_ENV + "="
    kept = [line for line in lines if not line.strip().startswith(key)]
    atomic_write(env_file, ("\n".join(kept + [key + name]) + "\n").encode(), mode=0o644, dir_mode=0o755)


def main(argv: Optional[list[str]] = None, out=None) -> int:
    out = out or sys.stdout
    parser = argparse.ArgumentParser(prog="python -m rdmanet.cli.node_name", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-file", default=node_identity.ENVIRONMENT_FILE)
    parser.add_argument("--name", help="the Node's name (install.sh --node-name)")
    parser.add_argument("--kubeconfig", help="credentials that may get nodes (default: $KUBECONFIG, or the kubelet's)")
    args = parser.parse_args(argv)
    kubeconfig = args.kubeconfig or default_kubeconfig()
    api = None
    why = "no kubeconfig to ask the API with (give install.sh --kubeconfig FILE)"
    if kubeconfig:
        try:
            api = _api(kubeconfig)
        except Exception as exc:  # noqa: BLE001 - a bad kubeconfig is reported, not a traceback
            why = f"kubeconfig {kubeconfig}: {getattr(exc, 'msg', None) or exc}"
    if args.name:
        found = node_identity.confirm(api, args.name) if api is not None else None
        write_name(args.env_file, args.name)
        note = "confirmed through the API" if found is not None and found.name else \
            f"not confirmed ({found.reason if found is not None else why}); the daemon runs no node GC until it is"
        out.write(f"{node_identity.NODE_ENV}={args.name} written to {args.env_file}: {note}\n")
        return 0
    if api is None:
        out.write(f"no Node confirmed for this host: {why}; {args.env_file} left as it is, so the daemon runs no "
                  "node GC; give install.sh --node-name NAME\n")
        return 3
    found = node_identity.match(api)
    if found.name is None:
        out.write(f"no Node confirmed for this host: {found.reason}; {args.env_file} left as it is, so the daemon "
                  f"runs no node GC; {found.fix}\n")
        return 3
    write_name(args.env_file, found.name)
    out.write(f"{node_identity.NODE_ENV}={found.name} written to {args.env_file}: the Node matching this host, "
              "confirmed through the API\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
