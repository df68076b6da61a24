"""Nodes on the real kube-apiserver as the DaemonSet runs them, and what a test reads of the server.

:class:`Node`: install.sh's daemon-only lease-ipam shim (``rdmanet.node.launcher.write_shim``) and a real
``rdmanet daemon`` behind it, on a kubeconfig with a ServiceAccount token that names the real
server and its CA (no proxy in between). :class:`Objects`: the admin's view of Leases and pods.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import kubernetes

from rdmanet.node.launcher import write_shim
from rdmanet.node.testing import Daemon

from kube_real_server import REPO
from lease_objects import claim_leases

NS = "rdmanet-system"
BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class Objects:
    """What a test reads of the server as the admin (outside the ServiceAccount's requests)."""

    def __init__(self, cluster):
        self.core = kubernetes.client.CoreV1Api(cluster.api_client())
        self.coord = kubernetes.client.CoordinationV1Api(cluster.api_client())

    def objects(self, resource, namespace):
        assert resource == "leases"
        return [self.coord.api_client.sanitize_for_serialization(o)
                for o in self.coord.list_namespaced_lease(namespace).items]

    def holders(self):
        return sorted(o["spec"]["holderIdentity"] for o in claim_leases(self, NS))

    def pod(self, name, node="node-a"):
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "pause"}]}}
        return self.core.create_namespaced_pod("default", body).metadata.uid

    def node(self, name):
        try:
            self.core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise

    def delete_pod(self, name):
        self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)

    def clean(self):
        self.coord.delete_collection_namespaced_lease(NS)
        self.core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
        self.core.delete_collection_node()


class Node:
    """node-a: install.sh's daemon-only lease-ipam shim and ``rdmanet daemon``, on a kubeconfig
    with a ServiceAccount token (the real server's address, its CA: no proxy in between)."""

    def __init__(self, cluster, tmp_path, token, network="rbac-net", subnet="10.60.0.0/24", node="node-a"):
        self.cluster, self.dir, self.name = cluster, tmp_path, node
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = tmp_path / "rdmanet.kubeconfig"
        cluster.write_kubeconfig(self.kubeconfig, namespace=NS, token=token)
        self.sock = str(tmp_path / "run" / "daemon.sock")
        self.shim = str(tmp_path / "bin" / "lease-ipam")
        os.makedirs(os.path.dirname(self.shim), exist_ok=True)
        write_shim(self.shim, "lease-ipam", sys.executable, None, self.sock)
        self.conf = {"cniVersion": "1.1.0", "name": network, "type": "lease-ipam",
                     "ipam": {"type": "lease-ipam", "range": subnet, "gc_grace_seconds": 0,
                              "kubernetes": {"kubeconfig": str(self.kubeconfig), "timeout_seconds": 2}}}
        self.daemons = []

    def daemon(self, **env):
        d = Daemon(self.sock, allow_uids=[os.getuid()],
                   env={"RDMANET_NODE_NAME": self.name, "RDMANET_NODE_GC_SECONDS": "0", **env})
        self.daemons.append(d)
        return d

    def cni(self, command, cid, uid="none", stdin=None):
        """One CNI call through the shim; ``uid`` None: no pod identity (podman, cnitool)."""
        env = {"PATH": BARE_PATH, "CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/proc/self/ns/net",
               "CNI_IFNAME": "net1", "CNI_PATH": os.path.dirname(self.shim)}
        if uid is not None:
            env["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid};K8S_POD_UID={uid}"
        proc = subprocess.run([self.shim], input=json.dumps(stdin or self.conf).encode(), env=env,
                              capture_output=True, timeout=60)
        return proc.returncode, proc.stdout.decode()

    def reconcile(self, token, *args):
        """``rdmanet ipam reconcile`` as deploy/reconciler.yaml runs it: its own process, with its own
        ServiceAccount's ``token``."""
        kubeconfig = self.dir / "reconciler.kubeconfig"
        self.cluster.write_kubeconfig(kubeconfig, namespace=NS, token=token)
        conf = json.loads(json.dumps(self.conf))
        conf["ipam"]["kubernetes"]["kubeconfig"] = str(kubeconfig)
        path = self.dir / "net.json"
        path.write_text(json.dumps(conf))
        rdmanet = os.path.join(os.path.dirname(sys.executable), "rdmanet")
        return subprocess.run([rdmanet, "ipam", "reconcile", "--network-config", str(path),
                               "--grace-seconds", "0", "-o", "json", *args],
                              capture_output=True, text=True, timeout=120, cwd=REPO)

    def stop(self):
        for d in self.daemons:
            d.cleanup()
