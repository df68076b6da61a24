"""lease-ipam in the setups whereabouts users run: the NAD they already have, several
nodes, one API server (the fake one, over real HTTP). Each "node" is a call with its own node
name and, for the local store, its own data directory, as on separate machines.

- whereabouts' flat file (``configuration_path``, then its default locations) is merged under
  the NAD, so a NAD without a ``kubernetes`` key uses the cluster store like whereabouts does;
- a call from Kubernetes with no cluster store configured is refused (code 7), never served from
  a per-node store; ``"datastore": "local"`` chooses that store explicitly;
- static ``addresses`` are returned, ``node_slice_size`` is refused, and the next address is
  round-robin over the domain, whichever node asks.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import INVALID_CONFIG
from rdmanet.ipam import location
from rdmanet.ipam.plugin import LeaseIPAM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import write_kubeconfig  # noqa: E402
from lease_objects import claim_leases  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

NS = "kube-system"  # whereabouts' default namespace: the kubeconfig context names none


@pytest.fixture
def kubeconfig(server, tmp_path):
    return write_kubeconfig(tmp_path / "whereabouts.kubeconfig", server.url)


@pytest.fixture
def nodes(tmp_path, monkeypatch):
    """whereabouts' flat-file locations and the local store's default directory, moved under
    tmp_path; ``nodes.on(name)`` makes the next calls run "on" that node (its own data dir)."""
    flat = [tmp_path / "etc-kubernetes" / "whereabouts.conf", tmp_path / "etc-cni" / "whereabouts.conf",
            tmp_path / "host-etc-cni" / "whereabouts.conf"]
    monkeypatch.setattr(location, "FLAT_FILES", tuple(str(p) for p in flat), raising=False)

    class Nodes:
        files = flat
        current = "node-a"

        def on(self, name):
            self.current = name
            monkeypatch.setattr(location, "DEFAULT_DATA_DIR", str(tmp_path / "var-lib" / name))

    n = Nodes()
    n.on("node-a")
    return n


def write_flat(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def whereabouts_nad(name="rdma-a", **ipam):
    """A NAD's config as whereabouts' docs write it: no kubernetes key (the flat file has it)."""
    block = {"type": "lease-ipam", "range": "10.20.0.0/24"}
    block.update(ipam)
    return {"cniVersion": "0.3.1", "name": name, "type": "macvlan", "master": "eth1", "ipam": block}


def call(command, conf, nodes, cid, pod=True, ifname="net1"):
    """``pod``: True, a Kubernetes pod (Multus' CNI_ARGS); False, none; "podman": what podman's
    CNI backend sends (pod name and namespace, no UID)."""
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": ifname,
           "CNI_PATH": "/opt/cni/bin", "RDMANET_NODE_NAME": nodes.current}
    if pod == "podman":
        env["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE={cid};K8S_POD_NAME={cid};K8S_POD_INFRA_CONTAINER_ID={cid}"
    elif pod:
        env["CNI_ARGS"] = f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod-{cid};K8S_POD_UID=uid-{cid}"
    return skel.handle(LeaseIPAM(), env, json.dumps(conf).encode())


def add_ip(conf, nodes, cid, **kw):
    code, out = call("ADD", conf, nodes, cid, **kw)
    assert code == 0, out
    return out["ips"][0]["address"].split("/")[0]


def holders(server):
    return {o["metadata"]["annotations"]["rdmanet.io/ip"]: o["spec"]["holderIdentity"] for o in claim_leases(server, NS)}


# -- the flat file, and no silent per-node store in a cluster -------------------------------------

@pytest.mark.parametrize("where", [0, 1, 2])
def test_flat_file_at_any_default_location_makes_two_nodes_share_the_cluster_store(server, kubeconfig, nodes, where):
    write_flat(nodes.files[where], {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(kubeconfig)},
                                    "reconciler_cron_expression": "30 4 * * *"})
    conf = whereabouts_nad()
    got = {}
    for node in ("node-a", "node-b"):
        nodes.on(node)
        got[node] = add_ip(conf, nodes, f"ctr-{node}")
    assert got["node-a"] != got["node-b"], "two nodes handed out the same address"
    assert holders(server) == {got["node-a"]: "ctr-node-a/net1", got["node-b"]: "ctr-node-b/net1"}
    nodes.on("node-a")
    assert call("DEL", conf, nodes, "ctr-node-a") == (0, None)
    assert list(holders(server).values()) == ["ctr-node-b/net1"]


def test_configuration_path_comes_first_and_the_nad_wins_over_the_file(server, kubeconfig, nodes, tmp_path):
    write_flat(nodes.files[1], {"kubernetes": {"kubeconfig": "/nonexistent/default.kubeconfig"}})
    named = tmp_path / "custom" / "whereabouts.conf"
    write_flat(named, {"kubernetes": {"kubeconfig": str(kubeconfig)}, "range": "10.99.0.0/24",
                       "exclude": ["10.20.0.0/28"]})
    conf = whereabouts_nad(configuration_path=str(named), range_start="10.20.0.100")
    got = add_ip(conf, nodes, "c1")  # the NAD's range and range_start, not the file's range
    assert got.startswith("10.20.0.") and int(got.rsplit(".", 1)[1]) >= 100, got
    assert holders(server) == {got: "c1/net1"}
    # keys the NAD leaves zero are filled from the file (mergo's rule): "" kubeconfig here
    conf2 = whereabouts_nad(configuration_path=str(named), kubernetes={"kubeconfig": ""})
    assert add_ip(conf2, nodes, "c2").startswith("10.20.0.")
    assert int(add_ip(conf2, nodes, "c3").rsplit(".", 1)[1]) >= 16  # the file's exclude applies
    # a configuration_path that does not exist: whereabouts goes on to its default locations
    conf3 = whereabouts_nad(configuration_path=str(tmp_path / "missing.conf"))
    code, err = call("ADD", conf3, nodes, "c4")
    assert code == 1 and "/nonexistent/default.kubeconfig" in err["msg"], err


def test_a_kubernetes_call_without_a_cluster_store_is_refused(nodes):
    conf = whereabouts_nad()
    code, err = call("ADD", conf, nodes, "c1")
    assert code == 1 and err["code"] == INVALID_CONFIG, err
    assert "no cluster store" in err["msg"] and "kubeconfig" in err["details"] and "datastore" in err["details"]
    assert not os.path.exists(location.DEFAULT_DATA_DIR), "nothing may be reserved in a per-node store"
    for command in ("CHECK", "STATUS"):
        assert call(command, dict(conf, cniVersion="1.1.0"), nodes, "c1")[1]["code"] == INVALID_CONFIG
    assert call("DEL", conf, nodes, "c1") == (0, None)  # DEL never fails on it


def test_the_local_store_stays_for_non_kubernetes_runtimes_and_when_chosen(nodes):
    conf = whereabouts_nad()
    assert add_ip(conf, nodes, "cnitool-1", pod=False) == "10.20.0.1"  # no K8S_POD_*: cnitool
    assert add_ip(conf, nodes, "podman-1", pod="podman") == "10.20.0.2"  # podman: pod name, no pod UID
    local = whereabouts_nad(datastore="local")
    assert add_ip(local, nodes, "k8s-1") == "10.20.0.3"  # explicitly chosen: served on this node
    assert call("DEL", local, nodes, "k8s-1") == (0, None)
    code, err = call("ADD", whereabouts_nad(datastore="etcd"), nodes, "c9")
    assert err["code"] == INVALID_CONFIG and "ipam.datastore" in err["msg"]


def test_a_broken_flat_file_is_a_config_error_naming_it(nodes):
    nodes.files[1].parent.mkdir(parents=True)
    nodes.files[1].write_text("{not json")
    code, err = call("ADD", whereabouts_nad(), nodes, "c1")
    assert code == 1 and err["code"] == INVALID_CONFIG and str(nodes.files[1]) in err["msg"], err


# -- static addresses, node slices, round-robin ----------------------------------------------------

def test_static_addresses_are_returned_after_the_allocated_one(server, kubeconfig, nodes):
    conf = whereabouts_nad(kubernetes={"kubeconfig": str(kubeconfig)},
                           addresses=[{"address": "10.30.0.5/24", "gateway": "10.30.0.1"}, {"address": "fd30::5/64"}])
    code, out = call("ADD", conf, nodes, "c1")
    assert code == 0, out
    assert [(ip["address"], ip.get("gateway")) for ip in out["ips"]] == [
        ("10.20.0.1/24", None), ("10.30.0.5/24", "10.30.0.1"), ("fd30::5/64", None)]
    assert list(holders(server)) == ["10.20.0.1"]  # static addresses are not reserved (as whereabouts)
    code, err = call("ADD", whereabouts_nad(addresses=[{"address": "10.30.0.5"}]), nodes, "c2", pod=False)
    assert err["code"] == INVALID_CONFIG and "ipam.addresses[0].address" in err["msg"]


def test_node_slice_size_is_refused_not_ignored(server, kubeconfig, nodes):
    conf = whereabouts_nad(kubernetes={"kubeconfig": str(kubeconfig)}, node_slice_size="/28")
    code, err = call("ADD", conf, nodes, "c1")
    assert code == 1 and err["code"] == INVALID_CONFIG and "ipam.node_slice_size" in err["msg"], err
    assert holders(server) == {}


def test_round_robin_across_nodes_never_reuses_a_just_freed_address(server, kubeconfig, nodes):
    conf = whereabouts_nad(kubernetes={"kubeconfig": str(kubeconfig)}, range="10.20.0.0/29")  # .1-.6
    order = []
    for i, node in enumerate(["node-a", "node-b", "node-c"]):
        nodes.on(node)
        order.append(add_ip(conf, nodes, f"c{i}"))
    assert order == ["10.20.0.1", "10.20.0.2", "10.20.0.3"]
    nodes.on("node-a")
    assert call("DEL", conf, nodes, "c1") == (0, None)  # .2 freed
    nodes.on("node-b")
    assert add_ip(conf, nodes, "c3") == "10.20.0.4"  # not .2: round-robin goes on
    assert [add_ip(conf, nodes, f"c{i}") for i in (4, 5)] == ["10.20.0.5", "10.20.0.6"]
    assert add_ip(conf, nodes, "c6") == "10.20.0.2"  # wrapped: the freed one, last


# -- while a cluster migrates NAD by NAD, whereabouts' live allocations are respected ---------------

def whereabouts_object(server, plural, name, spec):
    from kube_api_server import RESOURCES

    code, _ = server.api_create(RESOURCES[plural], NS, {"metadata": {"name": name}, "spec": spec}, False)
    assert code == 201


def test_addresses_whereabouts_still_holds_are_never_claimed(server, kubeconfig, nodes):
    """Pods started under whereabouts keep their addresses (its IPPool of the range, and the
    per-address reservations it makes for overlapping ranges) while the NADs move to lease-ipam;
    whereabouts is still installed on the nodes (its flat file is there)."""
    write_flat(nodes.files[1], {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(kubeconfig)}})
    whereabouts_object(server, "ippools", "10.20.0.0-29", {"range": "10.20.0.0/29", "allocations": {
        "1": {"id": "wb-ctr-1", "podref": "default/old-1", "ifname": "net1"},
        "2": {"id": "wb-ctr-2", "podref": "default/old-2", "ifname": "net1"}}})
    # another NAD (range 10.20.0.0/28) under whereabouts gave out .4: only its reservation says so
    whereabouts_object(server, "overlappingrangeipreservations", "10.20.0.4",
                       {"containerid": "wb-ctr-3", "podref": "default/old-3", "ifname": "net1"})
    conf = whereabouts_nad(range="10.20.0.0/29")  # .1-.6
    got = []
    for i, node in enumerate(["node-a", "node-b", "node-a"]):
        nodes.on(node)
        got.append(add_ip(conf, nodes, f"c{i}"))
    assert got == ["10.20.0.3", "10.20.0.5", "10.20.0.6"]
    code, err = call("ADD", conf, nodes, "c9")
    assert err["code"] == 102, err  # nothing left that whereabouts does not hold
    with_ip = dict(conf, runtimeConfig={"ips": ["10.20.0.1/29"]}, capabilities={"ips": True})
    code, err = call("ADD", with_ip, nodes, "c8")
    assert err["code"] == 103 and "whereabouts IPPool 10.20.0.0-29" in err["msg"], err
    # the old pod goes (whereabouts' DEL drops its allocation): the address is lease-ipam's to give
    pool = server.get_object("ippools", NS, "10.20.0.0-29")
    del pool["spec"]["allocations"]["1"]
    from kube_api_server import RESOURCES
    assert server.api_update(RESOURCES["ippools"], NS, "10.20.0.0-29", pool, False)[0] == 200
    assert add_ip(conf, nodes, "c7") == "10.20.0.1"
    # network_name: whereabouts' objects are named with it as a prefix
    named = whereabouts_nad(range="10.20.0.0/29", network_name="team-b")
    whereabouts_object(server, "ippools", "team-b-10.20.0.0-29", {"range": "10.20.0.0/29", "allocations": {
        "1": {"id": "wb-ctr-9", "podref": "team-b/old-9", "ifname": "net1"}}})
    assert add_ip(named, nodes, "n1") == "10.20.0.2"
    # once whereabouts is gone from the nodes (no flat file), nothing is checked: no extra request
    nodes.files[1].unlink()
    conf_k = whereabouts_nad(range="10.20.0.0/29", network_name="team-c", kubernetes={"kubeconfig": str(kubeconfig)})
    server.reset_counts()
    add_ip(conf_k, nodes, "k1")
    assert server.counts() == {("list", "leases"): 1, ("create", "leases"): 1}  # the claim, which records the node's block of team-c
