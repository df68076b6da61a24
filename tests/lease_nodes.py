"""What the node-block tests share: a node's CNI call through the plugin (as its daemon serves
it) and a node's in-process store, in the namespace ``NS`` of their kubeconfig."""

from __future__ import annotations

import json

from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import POOL_EXHAUSTED
from rdmanet.ipam.kube_config import connect, kube_settings
from rdmanet.ipam.location import CLUSTER_DOMAIN
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.ipam.store.kube import ApiClientTransport, KubeStore

NS = "ipam"


def call(command, conf, cid, node, uid=None):
    """``uid``: the pod's UID (a pod the API server holds), else ``uid-<cid>``."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
           "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": node,
           "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME={cid};K8S_POD_UID={uid or 'uid-' + cid}"}
    return skel.handle(LeaseIPAM(), env, json.dumps(conf).encode())


def add(conf, cid, node, uid=None):
    """The address an ADD returned, or None when the pool is exhausted (any other error fails)."""
    code, out = call("ADD", conf, cid, node, uid)
    if code:
        assert out["code"] == POOL_EXHAUSTED, out
        return None
    return out["ips"][0]["address"].split("/")[0]


def store(kubeconfig, node, conf, **kw):
    """A node's in-process store (no watch cache), as the plugin builds it without a daemon."""
    settings = kube_settings(conf)
    conn = connect(settings)
    kw.setdefault("block_size", settings.block_size)
    kw.setdefault("block_release", settings.block_release)
    return KubeStore(ApiClientTransport(conn.api_client, conn.host), NS, CLUSTER_DOMAIN, node=node, **kw)
