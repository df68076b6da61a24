"""Tests for the fake Kubernetes API server, driven through the real client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

sys.path.insert(0, os.path.dirname(__file__))
from kube_api_server import (
    RESOURCES,
    InProcessApiClient,
    KubeAPIServer,
    parse_field_selector,
    parse_label_selector,
    write_kubeconfig,
)

NS = "rdma"


@pytest.fixture(autouse=True)
def _namespace(request):
    """These tests' namespace (a server refuses objects in one it does not have)."""
    if "server" in request.fixturenames:
        for ns in (NS, "other"):
            request.getfixturevalue("server").add_namespace(ns)


@pytest.fixture
def api_client(server):
    cfg = client.Configuration(host=server.url)
    cfg.retries = False  # see the raw status codes; no urllib3 retries
    with client.ApiClient(cfg) as c:
        yield c


@pytest.fixture
def leases(api_client):
    return client.CoordinationV1Api(api_client)


@pytest.fixture
def core(api_client):
    return client.CoreV1Api(api_client)


def lease(name, labels=None, holder="node-a"):
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=30),
    )


def status_body(exc: ApiException) -> dict:
    return json.loads(exc.body)


# -- create / get ---------------------------------------------------------------


def test_create_fills_metadata(server, leases):
    out = leases.create_namespaced_lease(NS, lease("10-0-0-5", {"pool": "p1"}))
    m = out.metadata
    assert m.name == "10-0-0-5" and m.namespace == NS
    assert len(m.uid) == 36
    assert int(m.resource_version) > 0
    assert m.creation_timestamp is not None
    assert out.spec.holder_identity == "node-a" and out.spec.lease_duration_seconds == 30
    assert server.counts()[("create", "leases")] == 1
    assert server.request_log()[-1]["status"] == 201

    got = leases.read_namespaced_lease("10-0-0-5", NS)
    assert got.metadata.uid == m.uid and got.metadata.resource_version == m.resource_version

    # the global counter increases across objects
    out2 = leases.create_namespaced_lease(NS, lease("10-0-0-6"))
    assert int(out2.metadata.resource_version) > int(m.resource_version)
    assert [o["metadata"]["name"] for o in server.objects("leases")] == ["10-0-0-5", "10-0-0-6"]
    assert server.objects("leases")[0]["kind"] == "Lease"


def test_create_status_201_on_the_wire(leases):
    obj, code, headers = leases.create_namespaced_lease_with_http_info(NS, lease("a"))
    assert code == 201 and obj.kind == "Lease" and obj.api_version == "coordination.k8s.io/v1"
    assert headers["Content-Type"] == "application/json"


def test_spec_times_pass_through(leases):
    body = lease("t")
    body.spec.acquire_time = "2024-05-01T10:00:00.123456Z"
    # (a whole second would go out as "...:01+00:00": the client's datetime drops a zero fraction,
    # and a MicroTime without its 6 digits is refused, by the fake as by a real server)
    body.spec.renew_time = "2024-05-01T10:00:01.000001Z"
    body.spec.lease_transitions = 3
    out = leases.create_namespaced_lease(NS, body)
    assert out.spec.lease_transitions == 3
    assert out.spec.acquire_time.microsecond == 123456
    assert out.spec.renew_time.second == 1


def test_duplicate_create_is_already_exists(leases):
    leases.create_namespaced_lease(NS, lease("dup"))
    with pytest.raises(ApiException) as ei:
        leases.create_namespaced_lease(NS, lease("dup", holder="other"))
    assert ei.value.status == 409
    st = status_body(ei.value)
    assert st["kind"] == "Status" and st["status"] == "Failure"
    assert st["reason"] == "AlreadyExists" and st["code"] == 409
    assert st["details"]["name"] == "dup" and st["details"]["kind"] == "leases"
    # the original holder is untouched; the same name in another namespace is fine
    assert leases.read_namespaced_lease("dup", NS).spec.holder_identity == "node-a"
    leases.create_namespaced_lease("other", lease("dup"))


def test_get_missing_is_not_found(leases):
    with pytest.raises(ApiException) as ei:
        leases.read_namespaced_lease("nope", NS)
    assert ei.value.status == 404
    st = status_body(ei.value)
    assert st["reason"] == "NotFound" and st["details"]["name"] == "nope"


@pytest.mark.parametrize("name", ["Upper", "under_score", "-lead", "trail-", "a" * 254, "a..b", ""])
def test_invalid_names_are_422(leases, name):
    with pytest.raises(ApiException) as ei:
        leases.create_namespaced_lease(NS, lease(name))
    assert ei.value.status == 422
    st = status_body(ei.value)
    assert st["reason"] == "Invalid"
    assert st["details"]["causes"][0]["field"] == "metadata.name"


def test_valid_long_dotted_name(leases):
    name = ".".join(["a" * 63] * 3) + "." + "b" * 61  # 253 chars
    assert len(name) == 253
    leases.create_namespaced_lease(NS, lease(name))


@pytest.mark.parametrize("labels", [{"k": "v" * 64}, {"k": "bad value"}, {"k": "-x"},
                                    {"Bad/k": "v"}, {"k" * 64: "v"}])
def test_invalid_labels_are_422(leases, labels):
    with pytest.raises(ApiException) as ei:
        leases.create_namespaced_lease(NS, lease("x", labels))
    assert ei.value.status == 422
    assert status_body(ei.value)["details"]["causes"][0]["field"] == "metadata.labels"


def test_namespace_mismatch_is_400(leases):
    body = lease("x")
    body.metadata.namespace = "elsewhere"
    with pytest.raises(ApiException) as ei:
        leases.create_namespaced_lease(NS, body)
    assert ei.value.status == 400


# -- update / patch ---------------------------------------------------------------


def test_replace_with_stale_resource_version_conflicts(leases):
    cur = leases.create_namespaced_lease(NS, lease("r"))
    cur.spec.holder_identity = "node-b"
    new = leases.replace_namespaced_lease("r", NS, cur)
    assert new.spec.holder_identity == "node-b"
    assert int(new.metadata.resource_version) > int(cur.metadata.resource_version)
    assert new.metadata.uid == cur.metadata.uid
    cur.spec.holder_identity = "node-c"  # still carries the old resourceVersion
    with pytest.raises(ApiException) as ei:
        leases.replace_namespaced_lease("r", NS, cur)
    assert ei.value.status == 409 and status_body(ei.value)["reason"] == "Conflict"
    assert leases.read_namespaced_lease("r", NS).spec.holder_identity == "node-b"


def test_replace_missing_is_404(leases):
    with pytest.raises(ApiException) as ei:
        leases.replace_namespaced_lease("ghost", NS, lease("ghost"))
    assert ei.value.status == 404


def test_noop_replace_keeps_resource_version(leases):
    cur = leases.create_namespaced_lease(NS, lease("same"))
    again = leases.replace_namespaced_lease("same", NS, cur)
    assert again.metadata.resource_version == cur.metadata.resource_version


def test_patch_merge_and_json_patch(server, leases):
    leases.create_namespaced_lease(NS, lease("p", {"a": "1"}))
    out = leases.patch_namespaced_lease("p", NS, {"spec": {"holderIdentity": "node-z"},
                                                  "metadata": {"labels": {"b": "2"}}})
    assert out.spec.holder_identity == "node-z" and out.metadata.labels == {"a": "1", "b": "2"}
    out = leases.patch_namespaced_lease("p", NS, [{"op": "replace", "path": "/spec/leaseDurationSeconds",
                                                   "value": 7}])
    assert out.spec.lease_duration_seconds == 7
    with pytest.raises(ApiException) as ei:
        leases.patch_namespaced_lease("p", NS, {"metadata": {"resourceVersion": "1"}})
    assert ei.value.status == 409
    assert server.counts()[("patch", "leases")] == 3


# -- delete ---------------------------------------------------------------------


def preconditions(obj, rv=None):
    return client.V1DeleteOptions(preconditions=client.V1Preconditions(
        uid=obj.metadata.uid, resource_version=rv or obj.metadata.resource_version))


def test_delete_with_matching_preconditions(server, leases):
    obj = leases.create_namespaced_lease(NS, lease("d"))
    st = leases.delete_namespaced_lease("d", NS, body=preconditions(obj))
    st = st if isinstance(st, dict) else st.to_dict()
    assert st["status"] == "Success"
    assert st["details"]["uid"] == obj.metadata.uid
    with pytest.raises(ApiException) as ei:
        leases.read_namespaced_lease("d", NS)
    assert ei.value.status == 404
    assert server.objects("leases") == []


def test_delete_with_stale_preconditions_conflicts(leases):
    obj = leases.create_namespaced_lease(NS, lease("d"))
    obj.spec.holder_identity = "node-b"
    newer = leases.replace_namespaced_lease("d", NS, obj)
    with pytest.raises(ApiException) as ei:
        leases.delete_namespaced_lease("d", NS, body=preconditions(obj))  # stale rv
    assert ei.value.status == 409 and status_body(ei.value)["reason"] == "Conflict"
    wrong_uid = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="00000000-0000-0000-0000-000000000000"))
    with pytest.raises(ApiException) as ei:
        leases.delete_namespaced_lease("d", NS, body=wrong_uid)
    assert ei.value.status == 409
    still = leases.read_namespaced_lease("d", NS)
    assert still.metadata.resource_version == newer.metadata.resource_version
    leases.delete_namespaced_lease("d", NS, body=preconditions(newer))


def test_delete_missing_is_404(leases):
    with pytest.raises(ApiException) as ei:
        leases.delete_namespaced_lease("gone", NS)
    assert ei.value.status == 404 and status_body(ei.value)["reason"] == "NotFound"


def test_delete_collection(leases):
    for i in range(3):
        leases.create_namespaced_lease(NS, lease(f"c{i}", {"pool": "a" if i < 2 else "b"}))
    leases.delete_collection_namespaced_lease(NS, label_selector="pool=a")
    assert [l.metadata.name for l in leases.list_namespaced_lease(NS).items] == ["c2"]


# -- list -------------------------------------------------------------------------


@pytest.fixture
def labelled(leases):
    specs = {
        "l1": {"pool": "a", "node": "n1"},
        "l2": {"pool": "a", "node": "n2"},
        "l3": {"pool": "b", "node": "n1"},
        "l4": {"pool": "c"},
        "l5": None,
    }
    for name, labels in specs.items():
        leases.create_namespaced_lease(NS, lease(name, labels))
    leases.create_namespaced_lease("other", lease("x1", {"pool": "a"}))
    return leases


@pytest.mark.parametrize("selector,expected", [
    ("", ["l1", "l2", "l3", "l4", "l5"]),
    ("pool=a", ["l1", "l2"]),
    ("pool==a", ["l1", "l2"]),
    ("pool!=a", ["l3", "l4", "l5"]),
    ("pool in (a,c)", ["l1", "l2", "l4"]),
    ("pool in (a, c)", ["l1", "l2", "l4"]),
    ("pool notin (a,c)", ["l3", "l5"]),
    ("node", ["l1", "l2", "l3"]),
    ("!node", ["l4", "l5"]),
    ("pool=a,node=n2", ["l2"]),
    ("pool in (a,b),node=n1", ["l1", "l3"]),
    ("pool,!node", ["l4"]),
])
def test_list_label_selectors(labelled, selector, expected):
    out = labelled.list_namespaced_lease(NS, label_selector=selector)
    assert [l.metadata.name for l in out.items] == expected


def test_list_bad_selector_is_400(leases):
    with pytest.raises(ApiException) as ei:
        leases.list_namespaced_lease(NS, label_selector="a in (")
    assert ei.value.status == 400


def test_list_resource_version_and_all_namespaces(server, labelled):
    out = labelled.list_namespaced_lease(NS, label_selector="pool=a", resource_version="0")
    assert [l.metadata.name for l in out.items] == ["l1", "l2"]
    assert out.metadata.resource_version == str(server.resource_version)
    every = labelled.list_lease_for_all_namespaces(label_selector="pool=a")
    assert sorted((l.metadata.namespace, l.metadata.name) for l in every.items) == [
        ("other", "x1"), (NS, "l1"), (NS, "l2")]
    assert server.counts()[("list", "leases")] == 2


def test_list_paging(labelled):
    seen, cont, pages = [], None, 0
    first_rv = None
    while True:
        out = labelled.list_namespaced_lease(NS, limit=2, _continue=cont)
        pages += 1
        first_rv = first_rv or out.metadata.resource_version
        assert out.metadata.resource_version == first_rv
        seen += [l.metadata.name for l in out.items]
        cont = out.metadata._continue
        if pages == 1:
            assert out.metadata.remaining_item_count == 3
            labelled.create_namespaced_lease(NS, lease("l9"))  # not in the snapshot
        if not cont:
            break
    assert seen == ["l1", "l2", "l3", "l4", "l5"] and pages == 3


# -- watch -----------------------------------------------------------------------


def collect(w, func, n, **kwargs):
    events = []
    for ev in w.stream(func, **kwargs):
        events.append((ev["type"], ev["object"].metadata.name, ev["object"].metadata.resource_version))
        if len(events) >= n:
            w.stop()
    return events


def test_list_then_watch_from_resource_version(server, leases):
    a = leases.create_namespaced_lease(NS, lease("before"))
    lst = leases.list_namespaced_lease(NS, label_selector="pool=w")
    assert lst.items == []

    def mutate():
        time.sleep(0.2)
        leases.create_namespaced_lease(NS, lease("ignored"))  # filtered by selector
        obj = leases.create_namespaced_lease(NS, lease("w1", {"pool": "w"}))
        leases.create_namespaced_lease(NS, lease("w2", {"pool": "w"}))
        leases.delete_namespaced_lease("w1", NS, body=preconditions(obj))

    t = threading.Thread(target=mutate)
    t.start()
    events = collect(watch.Watch(), leases.list_namespaced_lease, 3, namespace=NS,
                     label_selector="pool=w", resource_version=lst.metadata.resource_version,
                     timeout_seconds=10)
    t.join()
    assert [(e[0], e[1]) for e in events] == [("ADDED", "w1"), ("ADDED", "w2"), ("DELETED", "w1")]
    rvs = [int(e[2]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(lst.metadata.resource_version) >= int(a.metadata.resource_version)
    assert server.counts()[("watch", "leases")] == 1


def test_watch_replays_history_after_resource_version(leases):
    lst = leases.list_namespaced_lease(NS)
    leases.create_namespaced_lease(NS, lease("h1"))
    obj = leases.read_namespaced_lease("h1", NS)
    obj.spec.holder_identity = "z"
    leases.replace_namespaced_lease("h1", NS, obj)
    events = collect(watch.Watch(), leases.list_namespaced_lease, 2, namespace=NS,
                     resource_version=lst.metadata.resource_version, timeout_seconds=5)
    assert [e[:2] for e in events] == [("ADDED", "h1"), ("MODIFIED", "h1")]


def test_watch_without_resource_version_sends_initial_state(leases):
    leases.create_namespaced_lease(NS, lease("s1"))
    leases.create_namespaced_lease(NS, lease("s2"))
    events = collect(watch.Watch(), leases.list_namespaced_lease, 2, namespace=NS, timeout_seconds=5)
    assert [e[:2] for e in events] == [("ADDED", "s1"), ("ADDED", "s2")]


def test_watch_label_change_becomes_added_and_deleted(leases):
    obj = leases.create_namespaced_lease(NS, lease("m", {"pool": "x"}))
    rv = obj.metadata.resource_version
    obj.metadata.labels = {"pool": "y"}
    obj = leases.replace_namespaced_lease("m", NS, obj)
    obj.metadata.labels = {"pool": "x"}
    leases.replace_namespaced_lease("m", NS, obj)
    events = collect(watch.Watch(), leases.list_namespaced_lease, 2, namespace=NS,
                     label_selector="pool=x", resource_version=rv, timeout_seconds=5)
    assert [e[:2] for e in events] == [("DELETED", "m"), ("ADDED", "m")]


def test_watch_timeout_ends_stream(leases):
    t0 = time.monotonic()
    events = list(watch.Watch().stream(leases.list_namespaced_lease, namespace=NS,
                                       resource_version="1000", timeout_seconds=1))
    assert events == []
    assert 0.9 <= time.monotonic() - t0 < 5


def test_watch_too_old_resource_version_is_410(server, leases):
    leases.create_namespaced_lease(NS, lease("o"))
    server.compact()
    with pytest.raises(ApiException) as ei:
        list(watch.Watch().stream(leases.list_namespaced_lease, namespace=NS,
                                  resource_version="1000", timeout_seconds=2))
    assert ei.value.status == 410


def test_watch_ends_when_client_stops(server, leases):
    w = watch.Watch()
    done = threading.Event()

    def run():
        for _ in w.stream(leases.list_namespaced_lease, namespace=NS, timeout_seconds=30):
            w.stop()
        done.set()

    t = threading.Thread(target=run)
    t.start()
    leases.create_namespaced_lease(NS, lease("stopper"))
    assert done.wait(5)
    t.join()
    deadline = time.monotonic() + 3
    while server.active_watches and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.active_watches == 0


# -- faults and latency ------------------------------------------------------------


def test_429_with_retry_after(server, leases):
    server.fail_next(1, status=429, retry_after=3)
    with pytest.raises(ApiException) as ei:
        leases.create_namespaced_lease(NS, lease("busy"))
    assert ei.value.status == 429
    assert ei.value.headers["Retry-After"] == "3"
    st = status_body(ei.value)
    assert st["reason"] == "TooManyRequests" and st["details"]["retryAfterSeconds"] == 3
    # only one failure; the request was not applied
    assert server.objects("leases") == []
    leases.create_namespaced_lease(NS, lease("busy"))
    assert server.counts()[("create", "leases")] == 2


def test_429_default_retry_after_and_500(server, leases):
    server.fail_next(1, status=429)
    with pytest.raises(ApiException) as ei:
        leases.list_namespaced_lease(NS)
    assert ei.value.headers["Retry-After"] == "1"
    server.fail_next(2, status=500, verb="get")
    leases.list_namespaced_lease(NS)  # not matched by the verb filter
    for _ in range(2):
        with pytest.raises(ApiException) as ei:
            leases.read_namespaced_lease("x", NS)
        assert ei.value.status == 500 and status_body(ei.value)["reason"] == "InternalError"
    with pytest.raises(ApiException) as ei:
        leases.read_namespaced_lease("x", NS)
    assert ei.value.status == 404
    assert sum(e["injected"] for e in server.request_log()) == 3


def test_a_lost_answer_is_served_but_never_answered(server, leases):
    """``status="lost"``: the create is made, then the connection is cut before the answer."""
    import urllib3

    server.fail_next(1, status="lost", verb="create")
    with pytest.raises((urllib3.exceptions.HTTPError, OSError)):
        leases.create_namespaced_lease(NS, lease("made-anyway"))
    assert [o["metadata"]["name"] for o in server.objects("leases")] == ["made-anyway"]
    with pytest.raises(ApiException) as ei:
        leases.create_namespaced_lease(NS, lease("made-anyway"))
    assert ei.value.status == 409
    server.fail_next(1, status="lost", verb="delete")
    with pytest.raises((urllib3.exceptions.HTTPError, OSError)):
        leases.delete_namespaced_lease("made-anyway", NS)
    assert server.objects("leases") == []


def test_fail_rate(server, leases):
    server.fail_rate(0.5, status=503, seed=1)
    codes = []
    for _ in range(60):
        try:
            leases.list_namespaced_lease(NS)
            codes.append(200)
        except ApiException as e:
            codes.append(e.status)
    assert set(codes) == {200, 503} and 10 < codes.count(503) < 50
    server.fail_rate(0)
    leases.list_namespaced_lease(NS)


def test_latency_injection(server, leases):
    leases.list_namespaced_lease(NS)
    t0 = time.monotonic()
    leases.list_namespaced_lease(NS)
    fast = time.monotonic() - t0
    server.inject_latency(0.2)
    t0 = time.monotonic()
    leases.list_namespaced_lease(NS)
    slow = time.monotonic() - t0
    assert slow >= 0.2 and slow > fast + 0.15
    server.inject_latency(0)


def test_counts_and_reset(server, leases, core):
    leases.list_namespaced_lease(NS)
    core.list_namespaced_pod(NS)
    assert server.counts() == {("list", "leases"): 1, ("list", "pods"): 1}
    assert server.count("list") == 2
    server.reset_counts()
    assert server.counts() == {}


# -- pods ---------------------------------------------------------------------------


def test_pods_by_field_selector(server, core):
    server.add_pod(NS, "p1", node="node-1", uid="uid-1")
    server.add_pod(NS, "p2", node="node-2")
    server.add_pod("kube-system", "p3", node="node-1")
    on1 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1")
    assert sorted(p.metadata.name for p in on1.items) == ["p1", "p3"]
    ns_on1 = core.list_namespaced_pod(NS, field_selector="spec.nodeName=node-1")
    assert [(p.metadata.name, p.metadata.uid) for p in ns_on1.items] == [("p1", "uid-1")]
    by_name = core.list_namespaced_pod(NS, field_selector="metadata.name=p2")
    assert [p.spec.node_name for p in by_name.items] == ["node-2"]
    both = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-1,metadata.name!=p1")
    assert [p.metadata.name for p in both.items] == ["p3"]
    with pytest.raises(ApiException) as ei:
        core.list_namespaced_pod(NS, field_selector="spec.bogus=1")
    assert ei.value.status == 400
    assert server.counts()[("list", "pods")] == 5


def test_pod_crud_via_client(server, core):
    body = client.V1Pod(metadata=client.V1ObjectMeta(name="web", labels={"app": "w"}),
                        spec=client.V1PodSpec(node_name="n1", containers=[client.V1Container(name="c", image="i")]))
    created = core.create_namespaced_pod(NS, body)
    assert created.metadata.uid and created.kind == "Pod"
    assert core.read_namespaced_pod("web", NS).spec.node_name == "n1"
    assert [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector="app=w").items] == ["web"]
    marked = core.delete_namespaced_pod("web", NS)  # bound to a node: terminating until its kubelet confirms
    assert marked.metadata.name == "web" and marked.metadata.deletion_timestamp is not None
    assert core.read_namespaced_pod("web", NS).metadata.deletion_grace_period_seconds == 30
    gone = core.delete_namespaced_pod("web", NS, grace_period_seconds=0)
    assert gone.metadata.name == "web"
    with pytest.raises(ApiException) as ei:
        core.read_namespaced_pod("web", NS)
    assert ei.value.status == 404


def test_add_delete_pod_emit_watch_events(server, core):
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    server.add_pod(NS, "a", uid="u-a", node="n")
    assert server.delete_pod(NS, uid="u-a") is True
    assert server.delete_pod(NS, "a") is False
    events = collect(watch.Watch(), core.list_namespaced_pod, 2, namespace=NS,
                     resource_version=rv, timeout_seconds=5)
    assert [e[:2] for e in events] == [("ADDED", "a"), ("DELETED", "a")]


# -- misc ------------------------------------------------------------------------------


def test_unknown_path_and_method(server):
    import urllib.error
    import urllib.request
    for method, path, code in [("GET", "/apis/nope/v1/things", 404),
                               ("POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/x", 405),
                               ("PATCH", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", 405),
                               ("HEAD", f"/api/v1/namespaces/{NS}/pods", 405)]:
        req = urllib.request.Request(server.url + path, method=method, data=b"{}" if method != "HEAD" else None)
        with pytest.raises(urllib.error.HTTPError) as he:
            urllib.request.urlopen(req, timeout=5)
        assert he.value.code == code
        if method != "HEAD":
            st = json.loads(he.value.read())
            assert st["kind"] == "Status" and st["code"] == code


def test_kubeconfig_roundtrip(server, tmp_path):
    path = write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS, token="s3cret")
    cfg = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=cfg)
    assert cfg.host == server.url
    assert "s3cret" in cfg.api_key.get("authorization", "") or "s3cret" in str(cfg.api_key)
    with client.ApiClient(cfg) as c:
        out = client.CoordinationV1Api(c).create_namespaced_lease(NS, lease("kc"))
    assert out.metadata.name == "kc"
    _contexts, active = config.list_kube_config_contexts(config_file=path)
    assert active["context"]["namespace"] == NS


def test_token_required(tmp_path):
    with KubeAPIServer(token="good") as srv:
        bad = client.Configuration(host=srv.url)
        bad.api_key = {"authorization": "Bearer wrong"}
        with client.ApiClient(bad) as c, pytest.raises(ApiException) as ei:
            client.CoordinationV1Api(c).list_namespaced_lease(NS)
        assert ei.value.status == 401
        cfg = client.Configuration()
        config.load_kube_config(config_file=write_kubeconfig(tmp_path / "kc", srv.url, token="good"),
                                client_configuration=cfg)
        with client.ApiClient(cfg) as c:
            client.CoordinationV1Api(c).list_namespaced_lease(NS)


def test_concurrent_create_race_one_winner(server, leases):
    results = []
    lock = threading.Lock()

    def claim(i):
        try:
            leases.create_namespaced_lease(NS, lease("contended", holder=f"h{i}"))
            r = 201
        except ApiException as e:
            r = e.status
        with lock:
            results.append(r)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [201] + [409] * 15


def test_cross_process_clients_and_control_endpoint(server, tmp_path):
    """Several OS processes claim the same names; counts are kept centrally."""
    kc = write_kubeconfig(tmp_path / "kubeconfig", server.url, namespace=NS)
    script = (
        "import sys\n"
        "from kubernetes import client, config\n"
        "from kubernetes.client.rest import ApiException\n"
        f"config.load_kube_config(config_file={kc!r})\n"
        "api = client.CoordinationV1Api()\n"
        "won = 0\n"
        "for i in range(10):\n"
        "    try:\n"
        "        api.create_namespaced_lease('rdma', client.V1Lease(metadata=client.V1ObjectMeta(name=f'ip-{i}')))\n"
        "        won += 1\n"
        "    except ApiException as e:\n"
        "        assert e.status == 409, e.status\n"
        "print(won)\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    wins = [int(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(wins) == 10
    assert server.counts()[("create", "leases")] == 40
    import urllib.request
    with urllib.request.urlopen(server.url + "/_control/counts", timeout=5) as r:
        remote = {(e["verb"], e["resource"]): e["count"] for e in json.loads(r.read())}
    assert remote == server.counts()


def test_command_line_runs(tmp_path):
    kc = tmp_path / "kubeconfig"
    proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "kube_api_server.py"),
                             "--port", "0", "--kubeconfig", str(kc), "--namespace", NS],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(kc), client_configuration=cfg)
        with client.ApiClient(cfg) as c:
            assert client.CoordinationV1Api(c).list_namespaced_lease(NS).items == []
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_stop_is_idempotent_and_closes_port():
    srv = KubeAPIServer()
    url = srv.url
    srv.stop()
    srv.stop()
    import urllib.request
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/version", timeout=2)


# -- selector parsers (unit) ---------------------------------------------------------------


def test_selector_parsers_unit():
    m = parse_label_selector("a in (x, y),b notin (z),!c,d!=1,e")
    assert m({"a": "x", "d": "2", "e": ""})
    assert m({"a": "y", "b": "q", "e": "1"})
    assert not m({"a": "x", "b": "z", "e": ""})
    assert not m({"a": "x", "c": "1", "e": ""})
    assert not m({"a": "x"})
    assert parse_label_selector("n>3")({"n": "4"}) and not parse_label_selector("n<3")({"n": "4"})
    for bad in ["a in ()", "a=b,", "a in (b", "=b"]:
        with pytest.raises(ValueError):
            parse_label_selector(bad)
    f = parse_field_selector("spec.nodeName=n1,status.phase!=Failed", RESOURCES["pods"])
    assert f({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    assert not f({"spec": {"nodeName": "n1"}, "status": {"phase": "Failed"}})


def test_watch_bookmarks_and_initial_events_end(leases):
    leases.create_namespaced_lease(NS, lease("b1"))
    w = watch.Watch()
    types = []
    for ev in w.stream(leases.list_namespaced_lease, namespace=NS, allow_watch_bookmarks=True,
                       send_initial_events=True, resource_version_match="NotOlderThan",
                       resource_version="", timeout_seconds=5):
        types.append(ev["type"])
        if ev["type"] == "BOOKMARK":
            ann = ev["raw_object"]["metadata"].get("annotations") or {}
            if ann.get("k8s.io/initial-events-end") == "true":
                continue
            w.stop()
    assert types[:2] == ["ADDED", "BOOKMARK"] and types[-1] == "BOOKMARK"
    assert int(w.resource_version) >= 1001


# -- in-process access (bench/ipam_scale_sim.py) ------------------------------------------------


LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


def inproc(client, method, path, query=(), body=None):
    resp = client.call_api(*client.param_serialize(method, path, query_params=list(query), body=body))
    if resp.response.watch is not None:
        return resp.status, resp.response.watch
    return resp.status, json.loads(resp.read())


def lease_body(name, node):
    return {"metadata": {"name": name, "labels": {"domain": "d1", "node": node}}, "spec": {"holderIdentity": name}}


def test_inprocess_requests_are_served_and_counted_per_client():
    srv = KubeAPIServer(start=False)
    srv.add_namespace(NS)
    a, b = InProcessApiClient(srv, "node-a"), InProcessApiClient(srv, "node-b")
    status, created = inproc(a, "POST", LEASES, body=lease_body("l1", "node-a"))
    assert status == 201 and created["metadata"]["uid"]
    status, dup = inproc(b, "POST", LEASES, body=lease_body("l1", "node-b"))
    assert status == 409 and dup["reason"] == "AlreadyExists"
    status, listed = inproc(b, "GET", LEASES, [("labelSelector", "domain=d1")])
    assert status == 200 and [i["metadata"]["name"] for i in listed["items"]] == ["l1"]
    stats = srv.client_stats()
    assert stats["node-a"]["req:create"] == 1 and stats["node-a"]["requests"] == 1
    assert stats["node-b"]["req:create"] == 1 and stats["node-b"]["req:list"] == 1
    assert stats["node-b"]["bytes_out"] == len(json.dumps(dup, separators=(",", ":"))) + \
        len(json.dumps(listed, separators=(",", ":")))
    assert srv.counts()[("create", "leases")] == 2


def test_inprocess_watches_get_what_their_selector_matches_and_held_ones_are_counted():
    srv = KubeAPIServer(start=False)
    srv.add_namespace(NS)
    a = InProcessApiClient(srv, "node-a")
    rv = str(srv.resource_version)
    watch_q = [("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", "1")]
    _, wa = inproc(a, "GET", LEASES, [("labelSelector", "domain=d1,node=node-a")] + watch_q)
    _, wb = inproc(InProcessApiClient(srv, "node-b"), "GET", LEASES, [("labelSelector", "domain=d1,node=node-b")] + watch_q)
    for i in range(3):
        srv.hold_watch(f"idle-{i}", LEASES, {"labelSelector": "domain=d1"})
    inproc(a, "POST", LEASES, body=lease_body("l1", "node-a"))
    inproc(a, "POST", LEASES, body=lease_body("l2", "node-a"))
    inproc(a, "DELETE", f"{LEASES}/l1")
    got_a = [json.loads(line) for line in wa.lines()]  # ends at timeoutSeconds
    got_b = list(wb.lines())
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in got_a] == [("ADDED", "l1"), ("ADDED", "l2"), ("DELETED", "l1")]
    assert got_b == []
    stats = srv.client_stats()
    assert stats["node-a"]["watch_events"] == 3
    assert stats["node-a"]["watch_bytes"] == sum(len(json.dumps(e, separators=(",", ":"))) + 1 for e in got_a)
    assert stats["node-b"]["watch_events"] == 0
    for i in range(3):
        assert stats[f"idle-{i}"]["watch_events"] == 3
        assert stats[f"idle-{i}"]["watch_bytes"] == stats["node-a"]["watch_bytes"]
    assert srv.watch_totals()["held"] == 3 and srv.watch_totals()["live"] == 0
    srv.release_held("idle-0")
    inproc(a, "POST", LEASES, body=lease_body("l3", "node-c"))
    stats = srv.client_stats()
    assert stats["idle-0"]["watch_events"] == 3 and stats["idle-1"]["watch_events"] == 4


def test_inprocess_watch_replays_history_and_restart_makes_it_410():
    srv = KubeAPIServer(start=False)
    srv.add_namespace(NS)
    a = InProcessApiClient(srv, "node-a")
    rv = str(srv.resource_version)
    inproc(a, "POST", LEASES, body=lease_body("l1", "node-a"))
    q = [("labelSelector", "domain=d1"), ("watch", "true"), ("resourceVersion", rv), ("timeoutSeconds", "30")]
    _, w = inproc(a, "GET", LEASES, q)
    lines = w.lines()
    assert json.loads(next(lines))["object"]["metadata"]["name"] == "l1"  # from the history
    assert srv.restart_watches() == 1
    with pytest.raises(ConnectionResetError):
        next(lines)
    _, again = inproc(a, "GET", LEASES, q)
    events = [json.loads(line) for line in again.lines()]
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]
    assert srv.watch_totals() == {"groups": 0, "live": 0, "held": 0}


# -- core/v1 events ---------------------------------------------------------------


def pod_event(namespace: str, involved_namespace: str, **extra) -> client.CoreV1Event:
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="p."),
        involved_object=client.V1ObjectReference(api_version="v1", kind="Pod", namespace=involved_namespace,
                                                 name="p", uid="u-1"),
        reason="AddFailed", message="m", **{"type": "Warning", **extra})


def test_events_are_created_in_the_namespace_of_their_object(server, core):
    made = core.create_namespaced_event(NS, pod_event(NS, NS))
    assert made.metadata.name.startswith("p.") and made.metadata.namespace == NS and made.involved_object.uid == "u-1"
    listed = core.list_namespaced_event(NS, field_selector="involvedObject.name=p,reason=AddFailed").items
    assert [e.metadata.name for e in listed] == [made.metadata.name]
    assert server.count("create", "events") == 1


@pytest.mark.parametrize("involved, extra, field", [
    ("other", {}, "involvedObject.namespace"),  # an event about a pod of another namespace
    (NS, {"type": "Fatal"}, "type"),
    (NS, {"event_time": "2024-01-01T00:00:00.000000Z"}, "reportingComponent"),  # the new form needs its fields
])
def test_events_the_apiserver_refuses_are_422(core, involved, extra, field):
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_event(NS, pod_event(NS, involved, **extra))
    assert exc.value.status == 422
    assert field in json.dumps(status_body(exc.value)["details"]["causes"])
