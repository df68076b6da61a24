"""``--network-config``: one loader (rdmanet.cli.network_config) for doctor, ``ipam ls``,
``ipam reconcile`` and ``ipam plan``, fed the files operators have: the YAML NADs of
deploy/examples/ as they are, the same NAD as JSON, several NADs in one stream, a conflist."""

from __future__ import annotations

import json
import pathlib

import pytest
import yaml

from rdmanet.cli import main as cli
from rdmanet.cli import network_config
from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import CNIError
from rdmanet.ipam.plugin import LeaseIPAM
from kube_api_server import KubeAPIServer, write_kubeconfig
from lease_objects import claim_leases
from test_doctor import cli_run, cx6dx_host, env  # noqa: F401  (the doctor's fixture)

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "deploy" / "examples"
NAD_FILES = sorted(p for p in EXAMPLES.glob("*.yaml") if "NetworkAttachmentDefinition" in p.read_text())


def nad_of(path: pathlib.Path) -> dict:
    [nad] = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "NetworkAttachmentDefinition"]
    return nad


def local_nad(name: str, data_dir: pathlib.Path, subnet: str = "10.9.0.0/29", as_object: bool = False) -> dict:
    config = {"cniVersion": "1.0.0", "name": name, "type": "macvlan-rdma", "master": "eth0",
              "ipam": {"type": "lease-ipam", "range": subnet, "dataDir": str(data_dir)}}
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": {"name": name},
            "spec": {"config": config if as_object else json.dumps(config, indent=2)}}


def add(config: dict, cid: str, **env) -> dict:
    call = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": "/x", "CNI_IFNAME": "net1", "CNI_PATH": "/x", **env}
    code, out = skel.handle(LeaseIPAM(), call, json.dumps(config).encode())
    assert code == 0, out
    return out


@pytest.mark.parametrize("path", NAD_FILES, ids=lambda p: p.name)
def test_every_example_file_loads_as_it_is(path):
    """The file with its Pod beside the NAD: the NAD's network, named as Multus names it."""
    nad = nad_of(path)
    [net] = network_config.load(str(path))
    assert net.config == json.loads(nad["spec"]["config"])
    assert net.name == nad["metadata"]["name"] and nad["metadata"]["name"] in net.source
    assert network_config.one_ipam_config(str(path))["ipam"]["type"] == "lease-ipam"


def test_the_same_nad_as_json_yaml_list_stream_conflist_and_conf(tmp_path):
    nad = local_nad("net-a", tmp_path / "data")
    config = json.loads(nad["spec"]["config"])
    forms = {
        "nad.json": json.dumps(nad),
        "nad.yaml": yaml.safe_dump(nad),
        "object.yaml": yaml.safe_dump(local_nad("net-a", tmp_path / "data", as_object=True)),
        "list.yaml": yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [nad]}),
        "net.conflist": json.dumps({"cniVersion": "1.0.0", "name": "net-a",
                                    "plugins": [{k: v for k, v in config.items() if k not in ("name", "cniVersion")},
                                                {"type": "tuning"}]}),
        "net.conf": json.dumps(config),
    }
    for name, text in forms.items():
        (tmp_path / name).write_text(text)
        assert network_config.one_ipam_config(str(tmp_path / name)) == config, name


def test_several_nads_in_one_stream(tmp_path):
    path = tmp_path / "nads.yaml"
    nads = [local_nad("net-a", tmp_path / "a"), {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                                   "spec": {"containers": []}},
            local_nad("net-b", tmp_path / "b", "10.9.1.0/29")]
    path.write_text(yaml.safe_dump_all(nads))
    assert [n.name for n in network_config.load(str(path))] == ["net-a", "net-b"]
    with pytest.raises(CNIError) as err:
        network_config.one_ipam_config(str(path))
    assert err.value.code == 7 and "net-a, net-b" in err.value.msg and "--network" in err.value.details
    assert network_config.one_ipam_config(str(path), "net-b")["ipam"]["range"] == "10.9.1.0/29"


@pytest.mark.parametrize("text, says", [
    ("kind: Pod\nmetadata: {name: p}\nspec: {containers: []}\n", "holds no network config (it holds Pod)"),
    ("key: [unclosed\n", "neither JSON nor YAML (line"),
    ("kind: NetworkAttachmentDefinition\nmetadata: {name: n}\nspec:\n  config: '{\"cniVersion\": '\n",
     "spec.config is not JSON"),
    ("[1, 2]", "holds no network config"),
])
def test_what_is_not_a_network_config_is_error_7_naming_the_file(tmp_path, text, says):
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with pytest.raises(CNIError) as err:
        network_config.load(str(path))
    assert err.value.code == 7 and says in err.value.msg and str(path) in err.value.msg


def test_ipam_ls_reads_a_yaml_stream_of_nads(tmp_path, capsys):
    path = tmp_path / "nads.yaml"
    nads = [local_nad("net-a", tmp_path / "a"), local_nad("net-b", tmp_path / "b", "10.9.1.0/29")]
    path.write_text(yaml.safe_dump_all(nads))
    for nad, cid in zip(nads, ("c-a", "c-b")):
        add(json.loads(nad["spec"]["config"]), cid)
    assert cli.main(["ipam", "ls", "--network-config", str(path), "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["networks"]
    assert [(n["domain"], [c["address"] for c in n["claims"]]) for n in listed] == [
        ("net-a", ["10.9.0.1"]), ("net-b", ["10.9.1.1"])]


def test_ipam_reconcile_and_plan_take_a_yaml_nad(tmp_path, capsys, monkeypatch):
    """The Lease store over the fake API server: a YAML NAD (the kubeconfig the operator's) frees
    a gone pod's claim and plans the nodes' blocks; of two NADs, --network picks one."""
    with KubeAPIServer() as server:
        kubeconfig = str(write_kubeconfig(tmp_path / "kc", server.url, namespace="rdmanet-system"))
        nads = []
        for name, subnet in (("net-a", "10.8.0.0/24"), ("net-b", "10.8.1.0/24")):
            config = {"cniVersion": "1.0.0", "name": name, "type": "macvlan-rdma", "master": "eth0",
                      "ipam": {"type": "lease-ipam", "range": subnet, "network_name": name,
                               "kubernetes": {"kubeconfig": kubeconfig}}}
            nads.append({"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
                         "metadata": {"name": name}, "spec": {"config": json.dumps(config)}})
        path = tmp_path / "nads.yaml"
        path.write_text(yaml.safe_dump_all(nads))
        policy = tmp_path / "policy.json"
        policy.write_text(json.dumps({"kubeconfigs": [f"{tmp_path}/*"]}))
        policy.chmod(0o600)
        monkeypatch.setenv("RDMANET_NODE_POLICY", str(policy))  # the kubeconfig under tmp_path
        pod = {"CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=gone;K8S_POD_UID=u-gone", "RDMANET_NODE_NAME": "n1"}
        add(json.loads(nads[1]["spec"]["config"]), "c-b", **pod)
        assert len(claim_leases(server, "rdmanet-system")) == 1
        assert cli.main(["ipam", "reconcile", "--network-config", str(path), "--grace-seconds", "0",
                         "--misses", "1"]) == 2
        assert "--network" in capsys.readouterr().err
        assert cli.main(["ipam", "reconcile", "--network-config", str(path), "--network", "net-b",
                         "--grace-seconds", "0", "--misses", "1", "-o", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["summary"] == {"freed": 1}
        assert claim_leases(server, "rdmanet-system") == []
        server.add_node("gpu-1")
        assert cli.main(["ipam", "plan", "--network-config", str(path), "--network", "net-a", "-o", "json"]) == 0
        planned = json.loads(capsys.readouterr().out)
        assert planned["created"], planned


def test_doctor_checks_an_example_yaml_as_it_is(env, capsys):  # noqa: F811
    cx6dx_host(env["root"])
    path = EXAMPLES / "sriov-vf.yaml"
    code, cap = cli_run(capsys, env, "--network-config", str(path), "-o", "json")
    findings = json.loads(cap.out)["findings"]
    assert not [f for f in findings if "--network-config" in f["message"]], findings
    [net] = [f for f in findings if f["area"] == "network" and f["subject"] == "sriov-rdma-net"]
    assert str(path) in net["message"] and "host-device-rdma" in net["message"]
