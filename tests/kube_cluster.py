"""What a test does to a cluster, through its API only: Nodes and pods made and deleted, Leases
read, the server's clock waited for. So a test written with it runs against the fake API server
(tests/kube_api_server.py) or a real kube-apiserver alike: only :meth:`Cluster.wait` differs (the
fake's clock is moved ahead; a real server's is waited for)."""

from __future__ import annotations

import time
from typing import Optional
from urllib.parse import quote

from rdmanet.ipam.kube_config import connect, kube_settings
from rdmanet.ipam.reconcile import ApiError, KubeAPI
from rdmanet.ipam.store.kube import LEASES_PATH, ApiClientTransport

NAMESPACE = "ipam-live"  # where the ``cluster`` fixture's Leases live (tests/conftest.py)


class Cluster:
    def __init__(self, server, kubeconfig: str, namespace: str) -> None:
        self.server = server
        self.kubeconfig = str(kubeconfig)
        self.namespace = namespace
        conn = connect(kube_settings({"ipam": {"type": "lease-ipam", "kubernetes": {"kubeconfig": self.kubeconfig}}}))
        self.api = KubeAPI(ApiClientTransport(conn.api_client, conn.host))
        self.namespaces: set[str] = set()
        self.ensure_namespace(namespace)

    def ensure_namespace(self, name: str) -> None:
        """A real server needs the namespace to exist (the fake serves any, and has no namespaces)."""
        if name in self.namespaces:
            return
        try:
            self.api.request("POST", "/api/v1/namespaces",
                             body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        except ApiError as err:
            if err.status not in (404, 405, 409):
                raise
        self.namespaces.add(name)

    def node(self, name: str) -> str:
        """Create the Node ``name``; its UID."""
        doc = self.api.request("POST", "/api/v1/nodes", body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})
        return doc["metadata"]["uid"]

    def delete_node(self, name: str) -> None:
        self.api.request("DELETE", f"/api/v1/nodes/{quote(name, safe='')}")

    def pod(self, namespace: str, name: str, node: Optional[str] = None) -> str:
        """Create a pod bound to ``node`` (as the scheduler leaves it); its UID."""
        self.ensure_namespace(namespace)
        spec: dict = {"containers": [{"name": "main", "image": "pause"}]}
        if node:
            spec["nodeName"] = node
        doc = self.api.request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods",
                               body={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
        return doc["metadata"]["uid"]

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod at once (no kubelet waits for it here)."""
        try:
            self.api.request("DELETE", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}",
                             body={"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
        except ApiError as err:
            if err.status != 404:
                raise

    def leases(self) -> list[dict]:
        return self.api.request("GET", LEASES_PATH.format(namespace=self.namespace)).get("items") or []

    def lease(self, name: str) -> Optional[dict]:
        try:
            return self.api.request("GET", f"{LEASES_PATH.format(namespace=self.namespace)}/{name}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def holders(self) -> dict[str, str]:
        """address -> holderIdentity of every claim (a free block record holds none)."""
        out = {}
        for o in self.leases():
            holder = (o.get("spec") or {}).get("holderIdentity")
            ip = ((o.get("metadata") or {}).get("annotations") or {}).get("rdmanet.io/ip")
            if holder and ip:
                out[ip] = holder
        return out

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` of the API server's time pass."""
        advance = getattr(self.server, "advance_clock", None)
        if advance is not None:
            advance(seconds)
        else:
            time.sleep(seconds)
