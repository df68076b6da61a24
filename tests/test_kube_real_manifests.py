"""Every manifest in deploy/ and deploy/examples/ passes a server-side dry run (``kubectl apply
--dry-run=server``, Debian's kubectl) on the real kube-apiserver: the server's own validation,
defaulting and admission, beyond the offline schema check of test_deploy_manifests.py.

The server is Kubernetes 1.20, which serves CronJob as ``batch/v1beta1`` only (``batch/v1`` came
in 1.21, with the same fields): the dry run converts the apiVersion of a CronJob, nothing else.
Multus' NetworkAttachmentDefinition CRD, which the examples need, is installed by the session's
fixture (conftest ``real_apiserver``). A file that names no namespace goes into one of its own, as
the kustomization says to apply the examples (``-n <your namespace>``). The server runs with
``--allow-privileged=true``, as clusters that run privileged DaemonSets do.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
MANIFESTS = sorted(p for p in [*(REPO / "deploy").glob("*.yaml"), *(REPO / "deploy" / "examples").glob("*.yaml")]
                   if p.name != "kustomization.yaml")
EXAMPLES_NS = "rdmanet-examples"


def for_1_20(text: str) -> str:
    docs = [d for d in yaml.safe_load_all(text) if d]
    for d in docs:
        if d["kind"] == "CronJob" and d["apiVersion"] == "batch/v1":
            d["apiVersion"] = "batch/v1beta1"
    return yaml.safe_dump_all(docs)


def test_every_manifest_is_found():
    names = {p.relative_to(REPO / "deploy").as_posix() for p in MANIFESTS}
    assert {"daemonset.yaml", "rbac.yaml", "reconciler.yaml", "namespace.yaml", "serviceaccount.yaml"} <= names
    assert sum(n.startswith("examples/") for n in names) == len(list((REPO / "deploy" / "examples").glob("*.yaml")))


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.relative_to(REPO / "deploy").as_posix())
def test_a_server_side_dry_run_accepts_it(real_apiserver, path):
    text = path.read_text()
    args = ["apply", "--dry-run=server", "-o", "name", "-f", "-"]
    if not any((d.get("metadata") or {}).get("namespace") for d in yaml.safe_load_all(text) if d):
        real_apiserver.kubectl("apply", "-f", "-", input=yaml.safe_dump(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": EXAMPLES_NS}}))
        args[1:1] = ["-n", EXAMPLES_NS]
    r = real_apiserver.kubectl(*args, input=for_1_20(text), check=False)
    assert r.returncode == 0, r.stderr
    # one line per object, each accepted as a dry run
    kinds = [d["kind"] for d in yaml.safe_load_all(text) if d]
    lines = r.stdout.split()
    assert len(lines) == len(kinds), (lines, kinds)
