"""deploy/: every manifest validated offline, the example NADs loaded by the plugins' own config
code, and the DaemonSet / RBAC / CronJob checked against the interfaces they rely on.

- Kubernetes objects: the OpenAPI-derived JSON schemas of Kubernetes ``K8S_VERSION`` that the
  pinned ``kubernetes-validate`` package ships (no network), in strict mode (unknown fields are
  errors).
- NetworkAttachmentDefinition is a CRD, absent from those schemas: ``NAD_SCHEMA`` below.
- Example NAD configs go through ``parse_invocation`` (what skel does with a CNI call's env and
  stdin) and the plugins' ``load_conf`` / lease-ipam's ``parse_ipam_config`` and
  ``kube_settings``: no kernel, no API server.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from rdmanet.cni.core.invocation import parse_invocation
from rdmanet.ipam.config import IPAMConf, parse_ipam_config
from rdmanet.ipam.kube_config import kube_settings
from rdmanet.ipam.location import CLUSTER_DOMAIN, uses_kubernetes
from rdmanet.ipam.store.kube import NODE_ENV
from rdmanet.cli import ipam_cli, main as cli
from lease_objects import claim_leases

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30"  # the Kubernetes API the manifests are checked against
NAMESPACE = "rdmanet-system"
SERVICE_ACCOUNT = "rdmanet"
RECONCILER_ACCOUNT = "rdmanet-reconciler"
KUBECONFIG = "/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig"
IMAGE = "rdmanet:latest"

# install.sh --daemonset: its flags and their defaults (the interface the DaemonSet relies on).
INSTALL_COMMAND = ["/usr/src/rdmanet/install.sh", "--daemonset"]
INSTALL_FLAGS = {
    "--bin-dir": "/opt/cni/bin",
    "--conf-dir": "/etc/cni/net.d",
    "--host-python": "/usr/bin/python3",
    "--host-root": "/proc/1/root",
    "--socket": "/run/rdmanet/daemon.sock",
}
# Host paths the node daemon needs at the same path inside its container.
SAME_PATH_MOUNTS = {"/opt/cni/bin", "/etc/cni/net.d", "/var/lib/cni", "/run/rdmanet", "/var/run/netns",
                    "/var/run/k8s.cni.cncf.io/devinfo", "/sys", "/var/log/rdmanet"}

# The NetworkAttachmentDefinition CRD (group k8s.cni.cncf.io, version v1, namespaced). Its shape
# is the CRD's openAPIV3Schema as the Network Plumbing WG publishes it with Multus (and as the
# multi-net-spec defines it): apiVersion/kind strings, metadata an object, spec an object whose
# only property is `config`, a string holding the CNI JSON. The CRD itself marks nothing
# required; Multus needs spec.config (an empty one means "read the config file of that name"),
# so this schema requires it, and refuses other spec keys, to catch a typo.
NAD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "k8s.cni.cncf.io/v1"},
        "kind": {"const": "NetworkAttachmentDefinition"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 253},
                "namespace": {"type": "string"},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["config"],
            "additionalProperties": False,
            "properties": {"config": {"type": "string", "minLength": 2}},
        },
    },
}
KUSTOMIZE_API = "kustomize.config.k8s.io/v1beta1"
RESOURCE_NAME_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"


# --------------------------------------------------------------------------- loading


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def docs_of(path: Path) -> list[dict]:
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def all_docs() -> Iterator[tuple[Path, dict]]:
    for path in yaml_files():
        for doc in docs_of(path):
            yield path, doc


def rel(path: Path) -> str:
    return str(path.relative_to(DEPLOY))


def objects(kind: str, under: Path = DEPLOY) -> list[tuple[Path, dict]]:
    return [(p, d) for p, d in all_docs() if d.get("kind") == kind and under in p.parents]


def the(kind: str, under: Path = DEPLOY) -> dict:
    found = objects(kind, under)
    assert len(found) == 1, f"expected one {kind} under {under}, found {[rel(p) for p, _ in found]}"
    return found[0][1]


def k8s_validate(doc: dict) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def nad_validate(doc: dict) -> None:
    jsonschema.validate(doc, NAD_SCHEMA)


def is_kustomization(doc: dict) -> bool:
    return doc.get("apiVersion") == KUSTOMIZE_API


def validate_any(doc: dict) -> None:
    if doc.get("kind") == "NetworkAttachmentDefinition":
        nad_validate(doc)
    else:
        k8s_validate(doc)


# --------------------------------------------------------------------------- (a) schemas


def test_deploy_has_the_expected_files():
    names = {rel(p) for p in yaml_files()}
    assert {"kustomization.yaml", "namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "daemonset.yaml",
            "reconciler.yaml", "examples/shared-rdma-macvlan.yaml", "examples/sriov-vf.yaml",
            "examples/dedicated-pf.yaml"} <= names
    assert (DEPLOY / "Containerfile").is_file()


def test_the_pinned_kubernetes_version_is_shipped_offline():
    assert K8S_VERSION in {v.rsplit(".", 1)[0] for v in kubernetes_validate.utils.all_versions()}


@pytest.mark.parametrize("path", yaml_files(), ids=rel)
def test_every_manifest_validates(path):
    docs = docs_of(path)
    assert docs, f"{rel(path)} holds no YAML document"
    for doc in docs:
        assert isinstance(doc, dict) and doc.get("apiVersion") and doc.get("kind"), f"{rel(path)}: not an object"
        if is_kustomization(doc):
            assert doc["kind"] == "Kustomization" and isinstance(doc.get("resources"), list)
            continue
        try:
            validate_any(doc)
        except kubernetes_validate.SchemaNotFoundError as exc:  # a kind we have no schema for is a failure
            pytest.fail(f"{rel(path)}: {exc.message}")


def daemonset_doc() -> dict:
    return copy.deepcopy(the("DaemonSet"))


@pytest.mark.parametrize("breakage", [
    pytest.param(lambda d: d["spec"]["template"]["spec"].__setitem__("hostNetwork", "yes"), id="wrong-type-bool"),
    pytest.param(lambda d: d["spec"]["template"]["spec"].__setitem__("hostNetwrk", True), id="unknown-field"),
    pytest.param(lambda d: d["spec"]["template"]["spec"]["containers"][0].__setitem__("command", "install.sh"),
                 id="string-for-list"),
    pytest.param(lambda d: d["spec"]["template"]["spec"]["volumes"][0]["hostPath"].pop("path"), id="missing-required"),
    pytest.param(lambda d: d["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0].__setitem__("mountPath", 7),
                 id="int-for-string"),
])
def test_the_validator_catches_a_broken_manifest(breakage):
    doc = daemonset_doc()
    k8s_validate(doc)  # the unbroken one passes
    breakage(doc)
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(doc)


def test_the_validator_catches_an_unknown_rbac_field():
    role = copy.deepcopy(the("Role"))
    role["rules"][0]["verb"] = ["get"]
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(role)


@pytest.mark.parametrize("breakage", [
    pytest.param(lambda d: d["spec"].__setitem__("config", json.loads(d["spec"]["config"])), id="config-as-object"),
    pytest.param(lambda d: d["spec"].__setitem__("conifg", d["spec"].pop("config")), id="misspelt-config"),
    pytest.param(lambda d: d.__setitem__("apiVersion", "k8s.cni.cncf.io/v1beta1"), id="wrong-version"),
    pytest.param(lambda d: d["metadata"].setdefault("annotations", {}).__setitem__(RESOURCE_NAME_ANNOTATION, 1),
                 id="int-annotation"),
])
def test_the_nad_schema_catches_a_broken_nad(breakage):
    doc = copy.deepcopy(example_nads()[0][1])
    nad_validate(doc)
    breakage(doc)
    with pytest.raises(jsonschema.ValidationError):
        nad_validate(doc)


def test_no_registry_host_is_named():
    for path, doc in all_docs():
        for image in re.findall(r"'image': '([^']+)'", repr(doc)):
            first = image.split("/", 1)[0] if "/" in image else ""
            assert not re.search(r"[.:]", first) and first != "localhost", f"{rel(path)}: image {image} names a registry host"
    text = (DEPLOY / "Containerfile").read_text()
    assert re.findall(r"^ARG BASE_IMAGE=(.*)$", text, re.MULTILINE) == ["debian:bookworm-slim"]
    assert [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")][0] == "${BASE_IMAGE}"


# --------------------------------------------------------------------------- (b) example NADs


def example_nads() -> list[tuple[Path, dict]]:
    return objects("NetworkAttachmentDefinition", DEPLOY / "examples")


def nad_config(nad: dict) -> dict:
    return json.loads(nad["spec"]["config"])


def invocation_of(config: dict, extra: dict | None = None):
    """The config as a plugin receives it on ADD: Multus's JSON on stdin (plus what it injects)."""
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "0123456789abcdef", "CNI_NETNS": "/var/run/netns/cni-test",
           "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=p;K8S_POD_UID=4f5e0a4e-2b1c-4d6e-9f00-1234567890ab"}
    return parse_invocation(env, json.dumps({**config, **(extra or {})}).encode())


def plugin_model(plugin_type: str):
    if plugin_type == "macvlan-rdma":
        from rdmanet.plugins.macvlan_rdma.config import MacvlanConf, load_conf
        return MacvlanConf, load_conf
    if plugin_type == "host-device-rdma":
        from rdmanet.plugins.host_device_rdma.config import HostDeviceConf, load_conf
        return HostDeviceConf, load_conf
    if plugin_type == "ipoib-rdma":
        from rdmanet.plugins.ipoib_rdma.config import IpoibConf, load_conf
        return IpoibConf, load_conf
    raise AssertionError(f"unexpected plugin type {plugin_type!r}")


# Keys a NAD config may carry besides the model's own fields: the runtime consumes capabilities.
RUNTIME_KEYS = {"capabilities"}
KUBERNETES_KEYS = {"kubeconfig", "k8s_api_root", "namespace", "timeout_seconds", "request_timeout_seconds"}


def test_the_three_deployments_are_there():
    by_type = sorted(nad_config(nad)["type"] for _, nad in example_nads())
    assert by_type == ["host-device-rdma", "host-device-rdma", "host-device-rdma", "ipoib-rdma", "macvlan-rdma"]
    assert len(objects("Pod", DEPLOY / "examples")) == 5


@pytest.mark.parametrize("path, nad", example_nads(), ids=lambda x: rel(x) if isinstance(x, Path) else "")
def test_example_nad_config_loads_in_the_plugin_models(path, nad):
    config = nad_config(nad)
    assert config["name"] == nad["metadata"]["name"], "Multus names the network after the NAD; keep them equal"
    assert config["cniVersion"] in ("0.4.0", "1.0.0", "1.1.0")
    model, load_conf = plugin_model(config["type"])
    unknown = set(config) - set(model.model_fields) - RUNTIME_KEYS
    assert not unknown, f"{rel(path)}: keys the {config['type']} model does not know (a typo?): {sorted(unknown)}"
    inv = invocation_of(config)
    conf = load_conf(inv)
    assert conf.rdma == "required"
    # lease-ipam with the Kubernetes store, on the kubeconfig install.sh --daemonset writes
    ipam = config["ipam"]
    assert ipam["type"] == "lease-ipam"
    assert not set(ipam) - set(IPAMConf.model_fields), f"{rel(path)}: unknown ipam keys"
    assert ipam["kubernetes"] == {"kubeconfig": KUBECONFIG, "namespace": NAMESPACE}
    assert not set(ipam["kubernetes"]) - KUBERNETES_KEYS
    parsed = parse_ipam_config(inv.config)
    assert parsed.range_sets and parsed.domain == config["ipam"].get("network_name", CLUSTER_DOMAIN)
    settings = kube_settings(inv.config)
    assert settings is not None and (settings.kubeconfig, settings.namespace) == (KUBECONFIG, NAMESPACE)


def test_multus_injected_keys_still_load():
    """What Multus adds for a device-plugin resource (deviceID, pciBusID, runtimeConfig) is accepted."""
    for _, nad in example_nads():
        config = nad_config(nad)
        _, load_conf = plugin_model(config["type"])
        extra = {"runtimeConfig": {"CNIDeviceInfoFile": "/var/run/k8s.cni.cncf.io/devinfo/cni/x-net1.json"}}
        if config["type"] == "host-device-rdma" and "device" not in config:
            extra.update(deviceID="0000:3b:00.2", pciBusID="0000:3b:00.2")
            extra["runtimeConfig"]["deviceID"] = "0000:3b:00.2"
        load_conf(invocation_of(config, extra))


def test_example_nads_and_pods_belong_together():
    resource_of = {}
    for path, nad in example_nads():
        config = nad_config(nad)
        resource = (nad["metadata"].get("annotations") or {}).get(RESOURCE_NAME_ANNOTATION)
        resource_of[nad["metadata"]["name"]] = resource
        if config["type"] == "macvlan-rdma":
            assert resource == "rdma/rdma_shared_device_a" and config["master"]
        elif config["type"] == "ipoib-rdma":  # the Network Operator's IB recipe
            assert resource == "rdma/shared_ib" and config["master"]
        elif "device" in config or "pciBusID" in config:  # the dedicated PF: the NAD names it
            assert resource is None
        elif "pkey" in config:  # the InfiniBand VF: Multus hands over the VF and the pod's GUID
            assert resource == "nvidia.com/mlnx_ib_vf"
            assert config["capabilities"]["infinibandGUID"] is True
        else:  # the SR-IOV VF: Multus hands over the allocated VF
            assert resource == "nvidia.com/mlnx_sriov_rdma"
            assert any(k in config for k in ("vlan", "spoofchk", "trust", "link_state"))
    for path, pod in objects("Pod", DEPLOY / "examples"):
        network = pod["metadata"]["annotations"][NETWORKS_ANNOTATION]
        if network.startswith("["):  # the JSON form (Multus' NetworkSelectionElement list)
            [element] = json.loads(network)
            network = element["name"]
        assert network in resource_of, f"{rel(path)}: pod names {network}, which no example NAD defines"
        nad_file = next(p for p, n in example_nads() if n["metadata"]["name"] == network)
        assert nad_file == path, "a pod and its NAD are applied together: keep them in one file"
        for container in pod["spec"]["containers"]:
            assert "IPC_LOCK" in container["securityContext"]["capabilities"]["add"]
            if resource_of[network]:
                assert container["resources"]["limits"][resource_of[network]] == 1


# --------------------------------------------------------------------------- (c) kustomize


def kustomization(directory: Path) -> dict:
    return docs_of(directory / "kustomization.yaml")[0]


@pytest.mark.parametrize("directory", [DEPLOY], ids=rel)
def test_kustomization_lists_every_file_beside_it(directory):
    doc = kustomization(directory)
    files = {p.name for p in directory.iterdir() if p.suffix in (".yaml", ".yml")} - {"kustomization.yaml"}
    assert sorted(doc["resources"]) == sorted(files)
    assert doc["images"] == [{"name": "rdmanet", "newTag": "latest"}]


def test_kustomization_comments_name_every_example_and_the_released_tag():
    """What the base's comments tell an operator: every file of deploy/examples/ (none left out,
    none counted wrong) and the image tag as README and the package spell it."""
    text = (DEPLOY / "kustomization.yaml").read_text()
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    for example in sorted((DEPLOY / "examples").glob("*.yaml")):
        assert example.name in comments, f"kustomization.yaml does not name {example.name}"
    assert not re.search(r"\b(two|three|four|six) deployments\b", comments)
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    readme_tags = set(re.findall(r"rdmanet:(v?[0-9][0-9.]*)\b", (ROOT / "README.md").read_text()))
    tags = set(re.findall(r"rdmanet:(v?[0-9][0-9.]*)\b", comments)) | set(re.findall(r'newTag: "?(v?[0-9][0-9.]*)', comments))
    assert readme_tags == {version} and tags == {version}, (readme_tags, tags)


def test_examples_are_not_in_the_base_and_the_reconciler_is():
    for resource in kustomization(DEPLOY)["resources"]:
        assert "/" not in resource
    base_kinds = {d["kind"] for r in kustomization(DEPLOY)["resources"] for d in docs_of(DEPLOY / r)}
    assert base_kinds == {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
                          "DaemonSet", "CronJob"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) is not installed")
@pytest.mark.parametrize("directory", [DEPLOY], ids=rel)
def test_kustomize_renders_and_the_output_validates(directory):
    out = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    expected = [d for r in kustomization(directory)["resources"] for d in docs_of(directory / r)]
    assert len(rendered) == len(expected)
    for doc in rendered:
        validate_any(doc)
    for doc in rendered:
        for image in re.findall(r"'image': '([^']+)'", repr(doc)):
            assert image == IMAGE


# --------------------------------------------------------------------------- (c) the DaemonSet


def pod_spec() -> dict:
    return the("DaemonSet")["spec"]["template"]["spec"]


def container() -> dict:
    (c,) = pod_spec()["containers"]
    return c


def install_args() -> dict[str, str]:
    args = container().get("args", [])
    assert len(args) % 2 == 0, f"install.sh arguments come in flag/value pairs: {args}"
    pairs = dict(zip(args[::2], args[1::2]))
    assert set(pairs) <= set(INSTALL_FLAGS), f"install.sh --daemonset has no flag {set(pairs) - set(INSTALL_FLAGS)}"
    return {**INSTALL_FLAGS, **pairs}


def mounts() -> dict[str, dict]:
    return {m["mountPath"]: m for m in container()["volumeMounts"]}


def host_paths() -> dict[str, dict]:
    return {v["name"]: v["hostPath"] for v in pod_spec()["volumes"] if "hostPath" in v}


def test_daemonset_identity_and_scheduling():
    ds = the("DaemonSet")
    spec = pod_spec()
    assert (ds["metadata"]["name"], ds["metadata"]["namespace"]) == ("rdmanet", NAMESPACE)
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert spec["serviceAccountName"] == SERVICE_ACCOUNT
    assert spec["hostNetwork"] is True and spec["hostPID"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    from rdmanet.cni.core.deadline import DEFAULT_SECONDS

    # a call in flight at SIGTERM finishes before the kubelet's SIGKILL: the grace outlasts the call deadline
    assert spec["terminationGracePeriodSeconds"] > DEFAULT_SECONDS + 10
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    tolerations = spec["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert {"operator": "Exists", "effect": "NoExecute"} in tolerations


def test_daemonset_container():
    c = container()
    assert c["image"] == IMAGE
    assert c["command"] == INSTALL_COMMAND
    assert c["securityContext"] == {"privileged": True}
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "100Mi"}, "limits": {"memory": "256Mi"}}
    env = {e["name"]: e for e in c["env"]}
    assert NODE_ENV == "RDMANET_NODE_NAME"
    assert env[NODE_ENV]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert not {"KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"} & set(env), "Kubernetes sets these itself"


def test_the_daemonset_exposes_the_daemons_metrics_port():
    """The port the daemon serves /metrics on (its environment, read as the daemon reads it) is the
    port the pod declares and its scrape annotation names, bound to the pod's IP (hostNetwork:
    the node's), so Prometheus reaches it; a host install has none unless asked."""
    from rdmanet.node.metrics import DAEMONSET_PORT, DEFAULT_ADDRESS, address_and_port

    c = container()
    env = {e["name"]: e for e in c["env"]}
    assert env["RDMANET_METRICS_ADDRESS"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    pod_ip = "10.0.0.7"
    address, port = address_and_port(None, None, {"RDMANET_METRICS_PORT": env["RDMANET_METRICS_PORT"]["value"],
                                                   "RDMANET_METRICS_ADDRESS": pod_ip})
    assert (address, port) == (pod_ip, DAEMONSET_PORT)
    assert c["ports"] == [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    notes = the("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert notes == {"prometheus.io/scrape": "true", "prometheus.io/port": str(port)}
    assert address_and_port(None, None, {}) == (DEFAULT_ADDRESS, 0) and DEFAULT_ADDRESS == "127.0.0.1"


def test_install_arguments_are_the_interface():
    from rdmanet.node.launcher import DEFAULT_SOCKET, SOCKET_ENV

    args = install_args()
    assert args == INSTALL_FLAGS  # the shipped manifest spells out the defaults
    assert args["--socket"] == DEFAULT_SOCKET
    env = {e["name"]: e.get("value") for e in container()["env"]}
    assert env[SOCKET_ENV] == args["--socket"], "the probes must ask the socket the daemon listens on"
    m = mounts()
    for flag in ("--bin-dir", "--conf-dir"):
        assert args[flag] in m, f"{flag} {args[flag]} is not mounted"
    assert os.path.dirname(args["--socket"]) in m
    assert args["--host-root"].startswith("/proc/1/") and pod_spec()["hostPID"] is True
    assert os.path.isabs(args["--host-python"])
    # the kubeconfig install.sh writes is the one every example NAD names
    assert os.path.join(args["--conf-dir"], "rdmanet.d", "rdmanet.kubeconfig") == KUBECONFIG


def test_host_paths_are_mounted_at_the_same_path():
    m, hp = mounts(), host_paths()
    assert set(m) == SAME_PATH_MOUNTS
    for path, mount in m.items():
        assert hp[mount["name"]]["path"].rstrip("/") == path, f"{path} must be the host's {path}"
        assert not mount.get("subPath")
    assert m["/var/run/netns"]["mountPropagation"] == "HostToContainer"
    assert hp[m["/var/run/k8s.cni.cncf.io/devinfo"]["name"]]["type"] == "DirectoryOrCreate"
    names = [v["name"] for v in pod_spec()["volumes"]]
    assert len(names) == len(set(names)) and set(names) == {mount["name"] for mount in m.values()}


def test_the_default_node_policy_roots_are_the_hosts():
    """What the daemon writes under its built-in policy's roots lands on the node, not in the
    container's filesystem (a log_file of lease-ipam, state, the device-info files)."""
    from rdmanet.cni.linux.roots import NodePolicy

    policy, m = NodePolicy(), mounts()

    def mounted(path: str) -> bool:
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in m)

    for kind in ("log", "data", "kubeconfig", "config"):
        for root in policy.roots(kind):
            assert mounted(root), f"the node policy's {kind} root {root} is not a host mount"
    assert mounted(policy.device_info_dir) and mounted(policy.host_device_state_dir)


def test_probes_run_the_daemon_health_check(monkeypatch):
    import rdmanet.node.daemon

    asked = []
    monkeypatch.setattr(rdmanet.node.daemon, "check", lambda path: asked.append(path) or 0)
    monkeypatch.setenv("RDMANET_DAEMON_SOCKET", install_args()["--socket"])
    for probe in ("livenessProbe", "readinessProbe"):
        p = container()[probe]
        assert p["exec"]["command"] == ["rdmanet", "daemon", "--check"]
        argv = p["exec"]["command"][1:]
        assert cli.main(argv) == 0
        # `--check` waits up to 5 s for the daemon: the probe must wait longer
        assert p["timeoutSeconds"] > 5
    assert asked == [install_args()["--socket"]] * 2


# --------------------------------------------------------------------------- (c) RBAC


LEASE_VERBS_USED = {"get", "list", "create", "update", "delete"}  # rdmanet/ipam/store/kube.py, rdmanet/ipam/reconcile.py


NV_IPAM_POOLS = {"apiGroups": ["nv-ipam.nvidia.com"], "resources": ["ippools", "cidrpools"], "verbs": ["get"]}


def test_rbac_grants_leases_in_our_namespace_pod_reads_and_node_lists_only():
    """The node daemon's token is on every node: it may get pods, never list them; only the
    reconciler's identity lists pods. Of nv-ipam's pools the daemon may only get the two kinds
    (a NAD's poolName), never list, watch or write them."""
    for path, role in objects("Role"):
        assert role["metadata"]["namespace"] == NAMESPACE, f"{rel(path)}: a Role outside {NAMESPACE}"
        for rule in role["rules"]:
            assert rule == {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": rule["verbs"]}
            assert set(rule["verbs"]) == LEASE_VERBS_USED | {"watch"}
            assert not rule.get("resourceNames")
    granted = set()
    for path, role in objects("ClusterRole"):
        for rule in role["rules"]:
            assert set(rule) == {"apiGroups", "resources", "verbs"}
            if rule["apiGroups"] != [""]:
                assert rule == NV_IPAM_POOLS, f"{rel(path)}: {rule}"
                granted.add(("nv-ipam pools", "get"))
                continue
            assert rule["apiGroups"] == [""] and rule["resources"] in (["pods"], ["nodes"], ["events"]), f"{rel(path)}: {rule}"
            if rule["resources"] == ["pods"]:
                assert set(rule["verbs"]) <= {"get", "list"} and "get" in rule["verbs"]
            elif rule["resources"] == ["events"]:  # events on pods (rdmanet/node/pod_events.py): created, never read
                assert rule["verbs"] == ["create"]
            else:  # a daemon GETs its own Node (rdmanet/ipam/node_identity.py); the plan and the release of gone
                # Nodes' blocks List them: nothing more
                assert rule["verbs"] == ["get", "list"]
            granted.add((rule["resources"][0], *sorted(rule["verbs"])))
    assert objects("Role") and granted == {("pods", "get"), ("pods", "get", "list"), ("nodes", "get", "list"),
                                           ("events", "create"), ("nv-ipam pools", "get")}
    assert cluster_grants(SERVICE_ACCOUNT) == {("pods", "get"), ("nodes", "get", "list"), ("events", "create"),
                                               ("ippools", "get")}
    assert cluster_grants(RECONCILER_ACCOUNT) == {("pods", "get", "list"), ("nodes", "get", "list"), ("events", "create")}


def cluster_grants(account: str) -> set:
    """(resource, verbs...) the ClusterRoles bound to ``account`` grant."""
    roles = {r["metadata"]["name"]: r for _, r in objects("ClusterRole")}
    out = set()
    for _, binding in objects("ClusterRoleBinding"):
        if {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE} in binding["subjects"]:
            for rule in roles[binding["roleRef"]["name"]]["rules"]:
                out.add((rule["resources"][0], *sorted(rule["verbs"])))
    return out


def test_bindings_bind_our_service_account_to_our_roles():
    roles = {("Role", r["metadata"]["name"]) for _, r in objects("Role")}
    roles |= {("ClusterRole", r["metadata"]["name"]) for _, r in objects("ClusterRole")}
    bound = set()
    for kind in ("RoleBinding", "ClusterRoleBinding"):
        for path, binding in objects(kind):
            ref = binding["roleRef"]
            assert (ref["kind"], ref["name"]) in roles, f"{rel(path)}: binds {ref}, which deploy/ does not define"
            for subject in binding["subjects"]:
                assert subject in [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}
                                   for name in (SERVICE_ACCOUNT, RECONCILER_ACCOUNT)]
            if kind == "RoleBinding":
                assert binding["metadata"]["namespace"] == NAMESPACE and ref["kind"] == "Role"
            bound.add((ref["kind"], ref["name"]))
    assert bound == roles
    accounts = {(sa["metadata"]["name"], sa["metadata"]["namespace"]) for _, sa in objects("ServiceAccount")}
    assert accounts == {(SERVICE_ACCOUNT, NAMESPACE), (RECONCILER_ACCOUNT, NAMESPACE)}
    assert the("Namespace")["metadata"]["name"] == NAMESPACE


# --------------------------------------------------------------------------- (c) the reconciler


RECONCILER = DEPLOY


def cronjob() -> dict:
    [found] = [d for p, d in objects("CronJob", RECONCILER) if p == RECONCILER / "reconciler.yaml"]
    return found


def test_cronjob_schedule_and_identity():
    cj = cronjob()
    assert cj["metadata"]["namespace"] == NAMESPACE
    assert cj["spec"]["schedule"] == "*/10 * * * *"
    assert cj["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == RECONCILER_ACCOUNT
    (c,) = pod["containers"]
    assert c["image"] == IMAGE
    assert not c["securityContext"].get("privileged")


def reconciler_command() -> list[str]:
    (c,) = cronjob()["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return c["command"]


def test_cronjob_command_parses_with_rdmanet_cli(monkeypatch):
    seen = []
    monkeypatch.setattr(ipam_cli, "run", lambda args: seen.append(args) or 0)
    command = reconciler_command()
    assert command[0] == "rdmanet"
    assert cli.main(command[1:]) == 0
    (args,) = seen
    assert (args.command, args.ipam_command) == ("ipam", "reconcile")
    # every network, with the pod's ServiceAccount in its own namespace: no per-network config to keep
    assert args.all and args.network_config is None and args.kubeconfig is None and args.namespace is None


def test_cronjob_reconciles_every_network_of_its_namespace(tmp_path, monkeypatch):
    """What --all reaches: the claims of every domain in the namespace the ServiceAccount is in
    (the namespace install.sh's node kubeconfig names), here over the fake API server."""
    sys.path.insert(0, str(ROOT / "tests"))
    from kube_api_server import KubeAPIServer, write_kubeconfig
    from rdmanet.cni.core import skel
    from rdmanet.ipam.plugin import LeaseIPAM

    with KubeAPIServer() as server:
        kubeconfig = write_kubeconfig(tmp_path / "kc", server.url, namespace=NAMESPACE)
        for path, nad in example_nads():
            name = nad["metadata"]["name"]
            config = dict(nad_config(nad))
            if not uses_kubernetes(config):
                continue
            config["ipam"] = dict(config["ipam"], kubernetes={"kubeconfig": str(kubeconfig)})
            env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": f"c-{name}", "CNI_NETNS": "/x", "CNI_IFNAME": "net1",
                   "CNI_PATH": "/x", "RDMANET_NODE_NAME": "n1",
                   "CNI_ARGS": f"K8S_POD_NAMESPACE=default;K8S_POD_NAME=p-{name};K8S_POD_UID=u-{name}"}
            code, out = skel.handle(LeaseIPAM(), env, json.dumps(config).encode())
            assert code == 0, out
        claims = len(claim_leases(server, NAMESPACE))
        assert claims >= 2
        code = cli.main(["ipam", "reconcile", "--all", "--kubeconfig", str(kubeconfig), "--grace-seconds", "0",
                         "--misses", "1", "-o", "json"])
        assert code == 0
        assert claim_leases(server, NAMESPACE) == []  # no pod exists: every network's claim went


# --------------------------------------------------------------------------- the block plan example

PLAN_EXAMPLE = DEPLOY / "examples" / "block-plan.yaml"


def plan_example() -> tuple[dict, dict]:
    docs = docs_of(PLAN_EXAMPLE)
    [cm] = [d for d in docs if d["kind"] == "ConfigMap"]
    [cj] = [d for d in docs if d["kind"] == "CronJob"]
    return cm, cj


def test_the_block_plan_example_plans_the_network_its_nad_defines(monkeypatch):
    """The plan's config is the NAD's (same ranges, block size, domain, namespace) without the
    node's kubeconfig file; the CronJob reads it where its ConfigMap is mounted, as the rdmanet
    ServiceAccount in the namespace the nodes' Leases are in."""
    cm, cj = plan_example()
    [nad] = [n for p, n in example_nads() if p.name == "shared-rdma-macvlan.yaml"]
    want = copy.deepcopy(nad_config(nad))
    del want["ipam"]["kubernetes"]["kubeconfig"]
    planned = json.loads(cm["data"]["nad.json"])
    assert planned == want
    settings = kube_settings(planned)
    assert settings is not None and settings.kubeconfig is None and settings.namespace == NAMESPACE  # in-cluster
    assert cm["metadata"]["namespace"] == cj["metadata"]["namespace"] == NAMESPACE
    assert cj["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    (c,) = pod["containers"]
    assert c["image"] == IMAGE and not c["securityContext"].get("privileged")
    seen = []
    monkeypatch.setattr(ipam_cli, "run", lambda args: seen.append(args) or 0)
    assert c["command"][0] == "rdmanet" and cli.main(c["command"][1:]) == 0
    (args,) = seen
    assert (args.ipam_command, args.dry_run) == ("plan", False)
    path = Path(args.network_config)
    [mount] = [m for m in c["volumeMounts"] if path.parent == Path(m["mountPath"])]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == cm["metadata"]["name"] and path.name in cm["data"]


def test_the_block_plan_examples_config_plans_every_node(tmp_path):
    """Its config, run by `rdmanet ipam plan` against the fake API server (a kubeconfig standing
    in for the pod's ServiceAccount): every node gets its share of the /24's blocks."""
    sys.path.insert(0, str(ROOT / "tests"))
    from kube_api_server import KubeAPIServer, write_kubeconfig

    cm, _ = plan_example()
    config = json.loads(cm["data"]["nad.json"])
    with KubeAPIServer() as server:
        for n in ("gpu-1", "gpu-2", "gpu-3"):
            server.add_node(n)
        config["ipam"]["kubernetes"]["kubeconfig"] = str(write_kubeconfig(tmp_path / "kc", server.url, namespace=NAMESPACE))
        (tmp_path / "nad.json").write_text(json.dumps(config))
        assert cli.main(["ipam", "plan", "--network-config", str(tmp_path / "nad.json")]) == 0
        owners = sorted((o["metadata"]["labels"] or {}).get("rdmanet.io/block-owner")
                        for o in server.objects("leases", NAMESPACE))
    # 192.168.100.16-255: 15 blocks of 16 (the default block size), 5 per node
    assert owners == ["gpu-1"] * 5 + ["gpu-2"] * 5 + ["gpu-3"] * 5


# --------------------------------------------------------------------------- the image


def containerfile_stages() -> list[tuple[str, list[str]]]:
    """[(the FROM line, the instructions after it)], continuation lines joined, comments dropped."""
    text = (DEPLOY / "Containerfile").read_text()
    lines = [line.strip() for line in re.sub(r"\\\n", " ", text).splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    stages: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith("FROM "):
            stages.append((line, []))
        elif stages:
            stages[-1][1].append(line)
    return stages


def test_containerfile_final_stage_is_the_venv_and_install_sh_only():
    """The build happens in a builder stage; the image gets the venv and install.sh, and the
    daemonset's command. (That it builds and runs: netns_tests/test_daemonset_image.py.)"""
    stages = containerfile_stages()
    assert [f.split()[-1] for f, _ in stages] == ["runtime", "build", "runtime"]
    _, runtime = stages[0]
    _, final = stages[-1]
    assert re.search(r"apt-get install -y --no-install-recommends python3 iproute2 ", " ".join(runtime))
    assert "pip" not in " ".join(runtime + final) and "venv" not in " ".join(runtime)
    copies = [line for line in final if line.startswith("COPY ")]
    assert copies == ["COPY --from=build /opt/rdmanet /opt/rdmanet", "COPY install.sh /usr/src/rdmanet/install.sh"]
    (entry,) = [line for line in final if line.startswith("ENTRYPOINT ")]
    assert json.loads(entry[len("ENTRYPOINT "):]) == INSTALL_COMMAND == container()["command"]
    assert (ROOT / "install.sh").is_file()


def test_containerfile_installs_the_lock_with_hashes_and_takes_secrets_not_args():
    _, build = containerfile_stages()[1]
    run = " ".join(line for line in build if line.startswith("RUN "))
    for lock in ("build-requirements.lock", "requirements.lock"):
        assert re.search(rf"install\s+--require-hashes --no-deps --only-binary :all: -r /usr/src/lock/{lock}", run), lock
    assert "--mount=type=secret,id=pip_ca" in run and "--mount=type=secret,id=pip_index_url" in run
    # nothing that could carry a credential is an ARG (build args stay in the image's history)
    assert [line.split()[1].split("=")[0] for stage in containerfile_stages() for line in stage[1]
            if line.startswith("ARG ")] == []


def lock_pins(path: Path) -> dict[str, tuple[str, list[str]]]:
    """{name: (version, [sha256 hashes])} of a pip-compile --generate-hashes file."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z0-9._-]+)==([^ ;\\]+)", line)
        if m:
            current = re.sub(r"[-_.]+", "-", m.group(1)).lower()
            pins[current] = (m.group(2), [])
            continue
        m = re.match(r"^--hash=sha256:([0-9a-f]{64})", line)
        assert m and current, f"{path.name}: unexpected line {line!r}"
        pins[current][1].append(m.group(1))
    return pins


def test_lock_pins_every_dependency_with_hashes():
    from packaging.requirements import Requirement

    pins = lock_pins(DEPLOY / "requirements.lock")
    project = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"]:
        req = Requirement(spec)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req.name} is a dependency in pyproject.toml but not pinned in deploy/requirements.lock"
        assert req.specifier.contains(pins[name][0]), f"{name}=={pins[name][0]} in the lock does not satisfy {spec}"
    for name, (version, hashes) in pins.items():
        assert hashes, f"{name}=={version} has no --hash: pip install --require-hashes would refuse the lock"
    build = lock_pins(DEPLOY / "build-requirements.lock")
    assert set(build) == {"setuptools"} and build["setuptools"][1]
    for path in (DEPLOY / "requirements.lock", DEPLOY / "build-requirements.lock"):
        assert "://" not in path.read_text(), f"{path.name} names an index"


def test_build_context_ignores_local_state():
    patterns = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "build", "**/__pycache__"} <= patterns
    assert not {"README.md", "pyproject.toml", "install.sh", "deploy"} & patterns  # pip and install.sh need them
