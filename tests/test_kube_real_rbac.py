"""The DaemonSet's identity on a real kube-apiserver: the ``rdmanet`` ServiceAccount's token with
exactly the RBAC of ``deploy/rbac.yaml`` (applied as an operator applies it), and the reconciler's.

A node daemon (a real ``rdmanet daemon`` behind install.sh's daemon-only shim) serves ADD, CHECK,
DEL, the CNI GC verb and its node GC with that token, and ``rdmanet ipam reconcile`` runs with the
``rdmanet-reconciler`` ServiceAccount's, as ``deploy/reconciler.yaml`` runs it. The server's audit log says which requests the ServiceAccount
made: none may be refused. Each verb of the Lease Role, taken away in turn, must make the same
run fail or be refused, so a verb the code needs and the manifest lacks is a test failure here,
not a node's in production. A rotated token (the old one revoked) is taken without a restart.

Real server only (the fake has no RBAC); the server is the session's (conftest ``real_apiserver``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import kubernetes
import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_real_nodes import NS, Node  # noqa: E402
from kube_real_server import REPO  # noqa: E402

SA, RECONCILER_SA = "rdmanet", "rdmanet-reconciler"  # deploy/daemonset.yaml's and deploy/reconciler.yaml's
SA_USER = f"system:serviceaccount:{NS}:{SA}"
RECONCILER_USER = f"system:serviceaccount:{NS}:{RECONCILER_SA}"
LEASE_VERBS = ("get", "list", "watch", "create", "update", "delete")


class _Failed(Exception):
    pass


def lifecycle(node, real_objects, reconciler_token) -> list[str]:
    """A node's day through its daemon, then the reconciler with its own token: what went wrong
    first (empty: nothing)."""
    wrong: list[str] = []
    try:
        _lifecycle(node, real_objects, reconciler_token, wrong)
    except _Failed:
        pass
    finally:
        node.stop()
    return wrong


def _lifecycle(node, real_objects, reconciler_token, wrong) -> None:
    def fail(what):
        wrong.append(what)
        raise _Failed(what)

    def expect(what, got, want=0):
        if got[0] != want:
            fail(f"{what}: exit {got[0]} {got[1][:300]}")

    real_objects.node("node-a")  # the daemon confirms its Node before its node GC runs
    uids = {name: real_objects.pod(name) for name in ("live", "gone", "short")}
    live = uids["live"]
    node.daemon(RDMANET_NODE_GC_SECONDS="0.3", RDMANET_NODE_GC_GRACE_SECONDS="0", RDMANET_NODE_GC_MISSES="2")
    for name, uid in uids.items():
        expect(f"ADD {name}", node.cni("ADD", name, uid))
    expect("ADD bare", node.cni("ADD", "bare", None))  # no pod (podman, cnitool): the runtime's word decides
    again = node.cni("ADD", "live", live)  # a repeat ADD returns the result, as the runtime hands it to CHECK
    expect("repeat ADD live", again)
    expect("CHECK live", node.cni("CHECK", "live", live, {**node.conf, "prevResult": json.loads(again[1])}))
    expect("DEL short", node.cni("DEL", "short", uids["short"]))
    # the runtime's GC: bare's attachment is not in its keep-list (claims of pods are judged by their pods)
    keep = [{"containerID": c, "ifname": "net1"} for c in ("live", "gone")]
    expect("GC", node.cni("GC", "", stdin={**node.conf, "cni.dev/valid-attachments": keep}))
    if real_objects.holders() != ["gone/net1", "live/net1"]:
        fail(f"GC: claims {real_objects.holders()}")
    # gone's pod is deleted and its DEL never comes: the node GC frees it
    real_objects.delete_pod("gone")
    deadline = time.monotonic() + 10  # (a GC round every 0.3 s, two misses)
    while real_objects.holders() != ["live/net1"] and time.monotonic() < deadline:
        time.sleep(0.1)
    if real_objects.holders() != ["live/net1"]:
        fail(f"node GC: claims {real_objects.holders()}")
    node.stop()
    # the reconciler, with a claim whose pod is gone (the node is down: its GC cannot run)
    orphan = real_objects.pod("orphan")
    node.daemon()
    expect("ADD orphan", node.cni("ADD", "orphan", orphan))
    node.stop()
    real_objects.delete_pod("orphan")
    for run in range(2):  # a miss recorded (GET + PUT), then freed
        r = node.reconcile(reconciler_token, "--misses", "2")
        expect(f"reconcile {run}", (r.returncode, r.stdout + r.stderr))
    if real_objects.holders() != ["live/net1"]:
        fail(f"reconcile: claims {real_objects.holders()}")
    node.daemon()
    expect("DEL live", node.cni("DEL", "live", live))


def refused(cluster, since, users=(SA_USER, RECONCILER_USER)):
    """The requests the server refused since ``since``, from the audit log: the users' 403s and
    every 401 (a token the server does not take names no user)."""
    out = set()
    for e in cluster.audit_events(since, stage="ResponseComplete"):
        code = (e.get("responseStatus") or {}).get("code")
        if code == 401 or (code == 403 and (e.get("user") or {}).get("username") in users):
            out.add(f"{e['verb']} {(e.get('objectRef') or {}).get('resource')}: {code}")
    return sorted(out)


def used(cluster, since, user):
    return sorted({(e["verb"], (e.get("objectRef") or {}).get("resource"))
                   for e in cluster.audit_events(since) if e["user"]["username"] == user})


def granted(user_sa: str, docs: list[dict]) -> set[tuple[str, str]]:
    """(verb, resource) the RBAC documents grant a ServiceAccount of rdmanet-system."""
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out = set()
    for b in docs:
        if b["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(
                s["kind"] == "ServiceAccount" and s["name"] == user_sa for s in b["subjects"]):
            for rule in roles[(b["roleRef"]["kind"], b["roleRef"]["name"])]["rules"]:
                out |= {(v, r) for v in rule["verbs"] for r in rule["resources"]}
    return out


def rbac_docs() -> list[dict]:
    return [d for d in yaml.safe_load_all((REPO / "deploy" / "rbac.yaml").read_text()) if d]


def test_the_daemonset_identity_serves_add_del_gc_and_the_reconciler(real_apiserver, real_objects, tmp_path):
    since = real_apiserver.audit_offset()
    node = Node(real_apiserver, tmp_path, real_apiserver.token(SA))
    assert lifecycle(node, real_objects, real_apiserver.token(RECONCILER_SA)) == []
    assert refused(real_apiserver, since, (RECONCILER_USER,)) == []
    # deploy/rbac.yaml lets the daemon get pods but not list them: its node GC tries a List of its
    # node's pods first, is refused, and GETs each claim's pod (rdmanet/ipam/reconcile.py). That
    # refusal, once per GC round, is the only one.
    assert refused(real_apiserver, since, (SA_USER,)) == ["list pods: 403"]
    # what each identity used is what deploy/rbac.yaml grants it, and every Lease verb is used
    daemon, reconciler = used(real_apiserver, since, SA_USER), used(real_apiserver, since, RECONCILER_USER)
    docs = rbac_docs()
    assert set(daemon) - {("list", "pods")} <= granted(SA, docs) and set(reconciler) <= granted(RECONCILER_SA, docs)
    assert {v for v, r in daemon + reconciler if r == "leases"} == set(LEASE_VERBS)
    assert ("create", "leases") not in reconciler  # the reconciler only reads, records misses and frees


def _without(docs: list[dict], verb: str, suffix: str) -> list[dict]:
    """deploy/rbac.yaml for ServiceAccounts of their own (``<name><suffix>``), with ``verb`` taken
    out of the Lease Role."""
    out = []
    for d in docs:
        d = json.loads(json.dumps(d))
        d["metadata"]["name"] += suffix
        if d["kind"] == "Role":
            for rule in d["rules"]:
                if "leases" in rule["resources"]:
                    rule["verbs"] = [v for v in rule["verbs"] if v != verb]
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            d["roleRef"]["name"] += suffix
            for sub in d["subjects"]:
                sub["name"] += suffix
        out.append(d)
    for sa in (SA, RECONCILER_SA):
        out.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa + suffix, "namespace": NS}})
    return out


@pytest.mark.parametrize("verb", LEASE_VERBS)
def test_a_lease_verb_missing_from_the_role_fails_the_run(real_apiserver, real_objects, tmp_path, verb):
    """deploy/rbac.yaml with one verb taken out of the Lease Role, bound to ServiceAccounts of its
    own: the same run fails, or the server refuses one of them that verb on Leases (and nothing else)."""
    suffix = f"-minus-{verb}"
    manifest = yaml.safe_dump_all(_without(rbac_docs(), verb, suffix))
    real_apiserver.kubectl("apply", "-f", "-", input=manifest)
    since = real_apiserver.audit_offset()
    node = Node(real_apiserver, tmp_path, real_apiserver.token(SA + suffix))
    try:
        wrong = lifecycle(node, real_objects, real_apiserver.token(RECONCILER_SA + suffix))
    finally:
        real_apiserver.kubectl("delete", "-f", "-", input=manifest)
    denied = refused(real_apiserver, since, (f"system:serviceaccount:{NS}:{SA}{suffix}",
                                             f"system:serviceaccount:{NS}:{RECONCILER_SA}{suffix}"))
    assert wrong or denied, f"without {verb!r} on leases nothing failed and nothing was refused"
    assert all(d.startswith(f"{verb} leases") or d == "list pods: 403" for d in denied), denied


def test_a_rotated_token_is_taken_and_the_revoked_one_never_used_again(real_apiserver, real_objects, tmp_path):
    """The kubelet rotates a projected ServiceAccount token in place; here the old token is bound to
    a Secret that is then deleted, so the server refuses it from that moment on. The daemon keeps
    serving (its watch re-opens with the new token after the server breaks it)."""
    core = kubernetes.client.CoreV1Api(real_apiserver.api_client())
    tokens = {}
    for n in ("old", "new"):
        secret = core.create_namespaced_secret(NS, {"metadata": {"name": f"rdmanet-token-{n}"}})
        req = {"spec": {"audiences": ["https://kubernetes.default.svc"], "expirationSeconds": 3600,
                        "boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": secret.metadata.name,
                                           "uid": secret.metadata.uid}}}
        tokens[n] = core.create_namespaced_service_account_token("rdmanet", NS, req).status.token
    node = Node(real_apiserver, tmp_path, tokens["old"])
    try:
        live = real_objects.pod("live")
        node.daemon()
        assert node.cni("ADD", "a", live)[0] == 0
        real_apiserver.write_kubeconfig(node.kubeconfig, namespace=NS, token=tokens["new"])
        core.delete_namespaced_secret("rdmanet-token-old", NS)
        since = real_apiserver.audit_offset()
        assert node.cni("ADD", "b", live)[0] == 0
        assert node.cni("DEL", "a", live)[0] == 0
        real_apiserver.restart_apiserver()  # every connection and watch breaks
        assert node.cni("ADD", "c", live)[0] == 0
        assert real_objects.holders() == ["b/net1", "c/net1"]
        # the revoked token was never sent again: a refused token is a 401 (a kube-apiserver that
        # is starting answers 403 to anyone until its RBAC cache is filled: a watch re-opened
        # that early is refused and retried, whichever token it carries)
        assert [r for r in refused(real_apiserver, since) if r.endswith(": 401")] == []
        assert ("watch", "leases") in used(real_apiserver, since, SA_USER)  # the watch re-opened, with the new token
    finally:
        node.stop()
        for n in ("old", "new"):
            try:
                core.delete_namespaced_secret(f"rdmanet-token-{n}", NS)
            except kubernetes.client.ApiException:
                pass
