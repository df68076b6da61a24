"""Every recipe of docs/ and every example of deploy/examples/, exactly as written (the fenced
blocks and the files are parsed here, never copied), fed to the plugins the way Multus feeds a
delegate: its CNI_ARGS (IgnoreUnknown, K8S_POD_NAMESPACE/NAME/INFRA_CONTAINER_ID/UID), the
device plugin's ``deviceID``/``pciBusID`` for a NAD with a resourceName, and the ``runtimeConfig``
of the capabilities the config declares (the pod's mac, ips, infiniband-guid; the device-info file).

- The plugin's own config model accepts it (``load_conf`` on the call as the plugin receives it).
- Its IPAM, lease-ipam, exec'd through rdmanet's shims with that same environment and stdin (what
  the plugin does with its ``ipam`` block), in a mount namespace of its own where the kubeconfig
  path the recipe names holds credentials for the fake API server: ADD answers an address of the
  recipe's range and its Lease is in the namespace the recipe names; DEL removes it. A cluster
  recipe without a cluster store fails here with CNI error 7, as it did in a cluster.
- In the daemon run of the suite (RDMANET_TEST_PLUGINS=daemon) a daemon serves the shims, started
  inside that mount namespace.

Not here: the plugins' own ADD with ``"rdma": "required"`` needs an RDMA device and RDMA netlink,
which this kernel does not have (the VM stage and hardware run those paths).
"""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
import yaml

from rdmanet.cni.core.invocation import parse_invocation
from rdmanet.ipam.config import parse_ipam_config

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from kube_api_server import KubeAPIServer, write_kubeconfig  # noqa: E402

CONF_DIR = "/etc/cni/net.d"
NAD = "NetworkAttachmentDefinition"
RESOURCE = "k8s.v1.cni.cncf.io/resourceName"
NETWORKS = "k8s.v1.cni.cncf.io/networks"
DEVICE = "0000:3b:00.2"  # the VF the device plugin allocated
DEVINFO = "/var/run/k8s.cni.cncf.io/devinfo/cni"
# where each kubeconfig a recipe may name puts its Leases (the context's namespace): install.sh's
# for the DaemonSet's ServiceAccount, and whereabouts' (kube-system, its default)
KUBECONFIGS = {f"{CONF_DIR}/rdmanet.d/rdmanet.kubeconfig": "rdmanet-system",
               f"{CONF_DIR}/whereabouts.d/whereabouts.kubeconfig": "kube-system"}
FENCE = re.compile(r"^```(yaml|json)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass
class Recipe:
    where: str
    config: dict  # the network config (a NAD's spec.config, or the block itself)
    namespace: str = "default"
    annotations: dict = field(default_factory=dict)
    selection: dict = field(default_factory=dict)  # the pod's network selection element, when there is a pod


def from_nad(where: str, nad: dict, pods: list[dict]) -> Recipe:
    meta = nad.get("metadata") or {}
    config = nad["spec"]["config"]
    config = json.loads(config) if isinstance(config, str) else config
    recipe = Recipe(where, config, meta.get("namespace") or "default", meta.get("annotations") or {})
    for pod in pods:
        wanted = (pod["metadata"].get("annotations") or {}).get(NETWORKS, "")
        if wanted.startswith("["):
            recipe.selection.update(next((e for e in json.loads(wanted) if e.get("name") == meta["name"]), {}))
    return recipe


def json_block(text: str) -> list[Any]:
    """A JSON block: a whole document, or a fragment of one (``"ipam": {...}``: not a recipe)."""
    try:
        return [json.loads(text)]
    except ValueError:
        json.loads("{" + text + "}")  # a fragment must still be JSON: a broken one fails here
        return []


def doc_recipes() -> list[Recipe]:
    out = []
    for page in sorted((REPO / "docs").glob("*.md")):
        for i, (lang, text) in enumerate(FENCE.findall(page.read_text())):
            where = f"{page.relative_to(REPO)} block {i + 1}"
            docs = [d for d in yaml.safe_load_all(text) if d] if lang == "yaml" else json_block(text)
            for doc in docs:
                if isinstance(doc, dict) and doc.get("kind") == NAD:
                    out.append(from_nad(where, doc, []))
                elif isinstance(doc, dict) and "type" in doc and "kind" not in doc:
                    out.append(Recipe(where, doc))
    return out


def example_recipes() -> list[Recipe]:
    out = []
    for path in sorted((REPO / "deploy" / "examples").glob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        pods = [d for d in docs if d.get("kind") == "Pod"]
        out += [from_nad(str(path.relative_to(REPO)), d, pods) for d in docs if d.get("kind") == NAD]
    return out


RECIPES = doc_recipes() + example_recipes()


def test_every_plugin_page_has_its_recipe_and_every_example_is_fed():
    pages = {r.where.split(" ")[0] for r in RECIPES if r.where.startswith("docs/")}
    assert pages >= {"docs/macvlan-rdma.md", "docs/host-device-rdma.md", "docs/ipoib-rdma.md", "docs/lease-ipam.md"}
    examples = {r.where for r in RECIPES if r.where.startswith("deploy/")}
    assert len(examples) == 5 and all("block-plan" not in e for e in examples)


def multus_call(recipe: Recipe, cid: str) -> tuple[dict, bytes]:
    """(environment, stdin) of the delegate call Multus makes for a pod that names the network."""
    pod = f"pod-{cid[:8]}"
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid,
           "CNI_NETNS": "/var/run/netns/cni-" + cid[:8], "CNI_IFNAME": "net1", "CNI_PATH": "/opt/cni/bin",
           "CNI_ARGS": f"IgnoreUnknown=true;K8S_POD_NAMESPACE={recipe.namespace};K8S_POD_NAME={pod};"
                       f"K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID=7c0d9e2a-{cid[:4]}-4b1e-9f00-0123456789ab"}
    conf = {k: v for k, v in recipe.config.items() if k != "capabilities"}  # libcni hands runtimeConfig instead
    caps = recipe.config.get("capabilities") or {}
    runtime: dict[str, Any] = {}
    if recipe.annotations.get(RESOURCE):
        conf["deviceID"] = conf["pciBusID"] = DEVICE
        if caps.get("deviceID"):
            runtime["deviceID"] = DEVICE
        if caps.get("CNIDeviceInfoFile"):
            runtime["CNIDeviceInfoFile"] = f"{DEVINFO}/{recipe.namespace}-{conf['name']}-{cid}_net1"
    for key, cap in (("mac", "mac"), ("ips", "ips"), ("infiniband-guid", "infinibandGUID")):
        if key in recipe.selection and caps.get(cap):
            runtime[cap] = recipe.selection[key]
    if runtime:
        conf["runtimeConfig"] = runtime
    return env, json.dumps(conf).encode()


def plugin_load_conf(plugin_type: str):
    if plugin_type == "macvlan-rdma":
        from rdmanet.plugins.macvlan_rdma.config import load_conf
    elif plugin_type == "host-device-rdma":
        from rdmanet.plugins.host_device_rdma.config import load_conf
    elif plugin_type == "ipoib-rdma":
        from rdmanet.plugins.ipoib_rdma.config import load_conf
    else:
        raise AssertionError(f"a recipe of an unknown plugin: {plugin_type}")
    return load_conf


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.where)
def test_the_plugins_config_model_accepts_the_recipe_as_multus_passes_it(recipe):
    env, stdin = multus_call(recipe, "3f9a2c7d11e04b5f8a6c0d1e2f3a4b5c")
    conf = plugin_load_conf(recipe.config["type"])(parse_invocation(env, stdin))
    assert conf.rdma == recipe.config.get("rdma", "auto")


def in_private_conf_dir(conf_dir: pathlib.Path, calls: list[dict]) -> list[dict]:
    """``calls`` through the shims in a mount namespace whose /etc/cni/net.d is ``conf_dir``."""
    mode = os.environ.get("RDMANET_TEST_PLUGINS", "shims")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"mode": "daemon" if mode == "daemon" else "shims", "python": sys.executable, "calls": calls}, f)
    try:
        script = f'mount --bind {conf_dir} {CONF_DIR} && exec {sys.executable} {REPO}/netns_tests/recipe_calls.py {f.name}'
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                              capture_output=True, text=True, timeout=300, cwd=REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout)
    finally:
        os.unlink(f.name)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The fake API server, and a conf dir holding a kubeconfig for it at every path a recipe names."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: the recipes' kubeconfig paths are under /etc/cni/net.d")
    if not os.path.isdir(CONF_DIR):
        pytest.skip(f"{CONF_DIR} does not exist here to bind a private copy over")
    conf_dir = tmp_path_factory.mktemp("net.d")
    conf_dir.chmod(0o755)
    with KubeAPIServer() as server:
        for path, namespace in KUBECONFIGS.items():
            target = conf_dir / os.path.relpath(path, CONF_DIR)
            target.parent.mkdir(mode=0o700)
            write_kubeconfig(target, server.url, namespace=namespace)
            target.chmod(0o600)
        yield server, conf_dir


def leases_of(server, namespace: str) -> list[dict]:
    return [o for o in server.objects("leases", namespace) if (o.get("spec") or {}).get("holderIdentity")]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.where)
def test_lease_ipam_serves_the_recipe_as_multus_calls_it(cluster, recipe):
    server, conf_dir = cluster
    ipam = recipe.config["ipam"]
    assert ipam["type"] == "lease-ipam"
    kube = ipam.get("kubernetes") or {}
    namespace = kube.get("namespace") or KUBECONFIGS.get(kube.get("kubeconfig", ""), "")
    cid = os.urandom(16).hex()
    env, stdin = multus_call(recipe, cid)
    add = in_private_conf_dir(conf_dir, [{"plugin": "lease-ipam", "env": env, "stdin": stdin.decode()}])[0]
    assert add["rc"] == 0, f"{recipe.where}: {add['stdout']} {add['stderr']}"
    [ip] = json.loads(add["stdout"])["ips"]
    address = ipaddress.ip_interface(ip["address"]).ip
    assert any(rs.range_of(address) for rs in parse_ipam_config(json.loads(stdin)).range_sets)
    [lease] = [o for o in leases_of(server, namespace) if o["spec"]["holderIdentity"] == f"{cid}/net1"]
    notes = lease["metadata"]["annotations"]
    assert notes["rdmanet.io/pod-namespace"] == recipe.namespace and notes["rdmanet.io/ip"] == str(address)
    dele = in_private_conf_dir(conf_dir, [{"plugin": "lease-ipam", "env": {**env, "CNI_COMMAND": "DEL"},
                                           "stdin": stdin.decode()}])[0]
    assert dele["rc"] == 0, dele
    assert not [o for o in leases_of(server, namespace) if o["spec"]["holderIdentity"] == f"{cid}/net1"]
