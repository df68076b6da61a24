"""`rdmanet demo`: what a container runtime does for a pod, done once by hand.

It execs the installed ``macvlan-rdma`` exactly as a runtime would (CNI env + stdin), with the
embedded default network below: a macvlan in bridge mode and an address from lease-ipam's
embedded file store. This machine may have no RDMA NIC, so unless ``--master`` names a real
port, the demo creates a veth pair (``rdmademo0``/``rdmademo1``) to stand in for one, and no
frame leaves the host.

A veth has no RDMA device, so the node policy would not take it as a master (docs/security.md).
The demo is the runtime here, and a runtime's environment is the node owner's: for the stand-in
only, it hands the plugin a node policy of its own (``RDMANET_NODE_POLICY``), the policy that
applies on this node plus ``rdmademo0`` in ``masters``, in a private temporary directory. The
node's policy, and what every other call may use, stay as they are.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from rdmanet.cni.core.errors import CNIError

STANDIN_MASTER, STANDIN_PEER = "rdmademo0", "rdmademo1"
NETWORK = "rdmanet-demo"  # its lease-ipam store: /var/lib/cni/lease-ipam/rdmanet-demo (install.sh --uninstall clears it)
CONTAINER_ID = "rdmanet-demo"
IFNAME = "net1"


def demo_config(master: str) -> dict:
    """The embedded default network: the NAD config a user would write, minus the device plugin."""
    return {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "type": "macvlan-rdma",
        "master": master,
        "mode": "bridge",
        "rdma": "auto",
        "ipam": {
            "type": "lease-ipam",
            "range": "198.18.100.0/24",
            "gateway": "198.18.100.1",
            "routes": [{"dst": "198.19.0.0/16"}],
        },
    }


def _plugin_dir(cni_path: str) -> str:
    """The runtime's CNI bin dir, or this installation's own scripts when nothing is installed there."""
    if os.path.isfile(os.path.join(cni_path, "macvlan-rdma")):
        return cni_path
    return str(Path(sys.executable).parent)


def standin_policy(directory: str) -> dict[str, str]:
    """The runtime environment that lets the stand-in be a master: the node policy in force
    (rdmanet.cni.linux.roots) plus ``rdmademo0`` in ``masters``, written to ``directory``."""
    from rdmanet.cni.linux import roots

    doc = roots.current().to_json()
    doc["masters"] = [*doc["masters"], {"name": STANDIN_MASTER}]
    path = os.path.join(directory, "node-policy.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    return {roots.POLICY_ENV: path}


def _cni(command: str, config: dict, netns_path: str, cni_path: str,
         extra_env: Optional[dict] = None) -> subprocess.CompletedProcess:
    env = {
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": CONTAINER_ID,
        "CNI_NETNS": netns_path,
        "CNI_IFNAME": IFNAME,
        "CNI_PATH": cni_path,
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        **(extra_env or {}),
    }
    plugin = os.path.join(cni_path, "macvlan-rdma")
    return subprocess.run([plugin], input=json.dumps(config).encode(), env=env, capture_output=True)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _held() -> list[str]:
    """The addresses the demo's attachment holds in lease-ipam's store (read, nothing created)."""
    from rdmanet.ipam.location import DEFAULT_DATA_DIR

    from .ipam_cli import read_local_unlocked

    root = os.path.join(DEFAULT_DATA_DIR, NETWORK)
    if not os.path.isdir(root):
        return []
    return [str(ip) for res in read_local_unlocked(root)
            if (res.attachment.container_id, res.attachment.ifname) == (CONTAINER_ID, IFNAME) for ip in res.addresses]


def _down(args, netns_path: str, cni_path: str) -> tuple[list[str], subprocess.CompletedProcess]:
    """CNI DEL, then the namespace and the stand-in link: (what was there and is gone, the DEL)."""
    master = args.master or STANDIN_MASTER
    gone = []
    held = _held()
    attached = os.path.exists(netns_path)
    dele = _cni("DEL", demo_config(master), netns_path if attached else "", cni_path)
    if dele.returncode == 0 and held:
        gone.append(f"the address {', '.join(held)} (CNI DEL)")
    if attached and _ip("netns", "del", args.netns, check=False).returncode == 0:
        gone.append(f"the namespace {args.netns}")
    if not args.master and _ip("link", "del", STANDIN_MASTER, check=False).returncode == 0:
        gone.append(f"the stand-in link {STANDIN_MASTER}")
    return gone, dele


def run_demo(args) -> int:
    if os.geteuid() != 0:
        print("rdmanet demo: run as root (it creates a network namespace and links)", file=sys.stderr)
        return 1
    if not shutil.which("ip"):
        print("rdmanet demo: the 'ip' command (iproute2) is needed", file=sys.stderr)
        return 1
    cni_path = _plugin_dir(args.cni_path)
    netns_path = f"/run/netns/{args.netns}"
    if args.down:
        gone, dele = _down(args, netns_path, cni_path)
        if dele.returncode != 0:
            print(f"rdmanet demo --down: CNI DEL failed: {dele.stdout.decode(errors='replace').strip()}", file=sys.stderr)
        if gone:
            print("removed " + "; ".join(gone))
        elif dele.returncode == 0:
            print(f"nothing to remove: no namespace {args.netns}"
                  + ("" if args.master else f", no stand-in link {STANDIN_MASTER}") + ", no address held by the demo")
        return 0 if dele.returncode == 0 else 1
    master = args.master or STANDIN_MASTER
    if not args.master and _ip("link", "show", STANDIN_MASTER, check=False).returncode != 0:
        _ip("link", "add", STANDIN_MASTER, "type", "veth", "peer", "name", STANDIN_PEER)
        _ip("link", "set", STANDIN_MASTER, "up")
        _ip("link", "set", STANDIN_PEER, "up")
    if not os.path.exists(netns_path):
        _ip("netns", "add", args.netns)
    config = demo_config(master)
    print(f"# CNI ADD: {cni_path}/macvlan-rdma, netns {netns_path}, ifname {IFNAME}, master {master}")
    print(json.dumps(config, indent=2))
    private = tempfile.mkdtemp(prefix="rdmanet-demo-")  # 0700, root's
    try:
        try:
            env = None if args.master else standin_policy(private)
        except CNIError as exc:  # the node's policy file is unusable: say so, as a call would
            print(f"rdmanet demo: {exc.msg}\n  fix: {exc.details}", file=sys.stderr)
            return 1
        if env:
            print(f"# the stand-in {STANDIN_MASTER} has no RDMA device: this call's node policy also lists it in masters")
        proc = _cni("ADD", config, netns_path, cni_path, env)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    sys.stderr.write(proc.stderr.decode(errors="replace"))
    print("# result:")
    print(proc.stdout.decode(errors="replace").strip())
    if proc.returncode == 0:
        print(f"# ip -n {args.netns} addr show {IFNAME}")
        print(_ip("-n", args.netns, "addr", "show", IFNAME, check=False).stdout.rstrip())
        print(f"# ip -n {args.netns} route")
        print(_ip("-n", args.netns, "route", check=False).stdout.rstrip())
    if args.keep and proc.returncode == 0:
        print(f"# left attached; remove with: rdmanet demo --down{' --master ' + args.master if args.master else ''}")
    else:
        gone, _ = _down(args, netns_path, cni_path)
        print(f"# CNI DEL done; removed {'; '.join(gone) or 'nothing'} (use --keep to inspect)")
    return proc.returncode
