"""What the Lease store relies on of the API server, asked of the fake and of a real kube-apiserver
alike (``[fake]``/``[real]``): each assertion is the real server's answer, so the fake is held to it.

Create of an existing name, delete and update preconditions, label selectors (``in``, ``notin``,
``!``), ``limit``/``continue`` paging, watch from a resourceVersion, bookmarks, a too-old
resourceVersion, ``fieldSelector=spec.nodeName`` on pods, server-set metadata, a pod's status on
create, a pod's deletion, objects in a namespace that does not exist, a custom resource's status
subresource (nv-ipam's pools) and two groups' kinds of one plural.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

NS = "ipam"
LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


def request(server, method, path, body=None, content_type="application/json"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=data, method=method,
                                 headers={"Content-Type": content_type, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def lease(name, labels=None, holder="c/net1", **meta):
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, **({"labels": labels} if labels else {}), **meta},
            "spec": {"holderIdentity": holder}}


def test_create_of_an_existing_name_is_409_already_exists(server):
    assert request(server, "POST", LEASES, lease("a"))[0] == 201
    code, status = request(server, "POST", LEASES, lease("a"))
    assert code == 409 and status["kind"] == "Status" and status["reason"] == "AlreadyExists"
    assert status["details"] == {"name": "a", "group": "coordination.k8s.io", "kind": "leases"}


def test_server_sets_uid_resource_version_and_creation_time(server):
    mine = {"uid": "client-uid", "creationTimestamp": "2001-01-01T00:00:00Z"}
    code, made = request(server, "POST", LEASES, lease("a", **mine))
    assert code == 201
    md = made["metadata"]
    assert md["uid"] != "client-uid" and md["creationTimestamp"] != "2001-01-01T00:00:00Z"
    assert md["namespace"] == NS and md["resourceVersion"].isdigit()


def test_delete_preconditions_uid_and_resource_version(server):
    _, made = request(server, "POST", LEASES, lease("a"))
    md = made["metadata"]
    wrong_uid = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": "not-its-uid"}}
    code, status = request(server, "DELETE", f"{LEASES}/a", wrong_uid)
    assert code == 409 and status["reason"] == "Conflict"
    stale_rv = {"kind": "DeleteOptions", "apiVersion": "v1",
                "preconditions": {"uid": md["uid"], "resourceVersion": str(int(md["resourceVersion"]) - 1)}}
    code, status = request(server, "DELETE", f"{LEASES}/a", stale_rv)
    assert code == 409 and status["reason"] == "Conflict"
    exact = {"kind": "DeleteOptions", "apiVersion": "v1",
             "preconditions": {"uid": md["uid"], "resourceVersion": md["resourceVersion"]}}
    code, status = request(server, "DELETE", f"{LEASES}/a", exact)
    assert code == 200 and status["kind"] == "Status" and status["status"] == "Success"
    code, status = request(server, "DELETE", f"{LEASES}/a")
    assert code == 404 and status["reason"] == "NotFound"


def test_update_with_a_stale_resource_version_is_409_conflict(server):
    _, made = request(server, "POST", LEASES, lease("a"))
    made["spec"]["holderIdentity"] = "d/net1"
    code, updated = request(server, "PUT", f"{LEASES}/a", made)
    assert code == 200 and updated["metadata"]["resourceVersion"] != made["metadata"]["resourceVersion"]
    code, status = request(server, "PUT", f"{LEASES}/a", made)  # the old resourceVersion again
    assert code == 409 and status["reason"] == "Conflict"


def test_label_selectors_in_notin_and_absent(server):
    for name, labels in (("a", {"k": "x"}), ("b", {"k": "y"}), ("c", {"k": "z"}), ("d", {"j": "1"})):
        request(server, "POST", LEASES, lease(name, labels))

    def names(selector):
        code, lst = request(server, "GET", f"{LEASES}?labelSelector={urllib.request.quote(selector)}")
        assert code == 200, lst
        return sorted(o["metadata"]["name"] for o in lst["items"])

    assert names("k in (x,y)") == ["a", "b"]
    assert names("k notin (x,y)") == ["c", "d"]  # notin matches objects without the label too
    assert names("!k") == ["d"]
    assert names("k,k!=z") == ["a", "b"]
    assert request(server, "GET", f"{LEASES}?labelSelector={urllib.request.quote('k in x')}")[0] == 400


def test_limit_and_continue_page_a_list(server):
    for i in range(5):
        request(server, "POST", LEASES, lease(f"l{i}"))
    seen, cont, pages = [], "", 0
    while True:
        code, lst = request(server, "GET", f"{LEASES}?limit=2" + (f"&continue={cont}" if cont else ""))
        assert code == 200
        pages += 1
        seen += [o["metadata"]["name"] for o in lst["items"]]
        cont = lst["metadata"].get("continue", "")
        if not cont:
            break
        assert lst["metadata"]["remainingItemCount"] == 5 - len(seen)
    assert pages == 3 and seen == [f"l{i}" for i in range(5)]


def test_a_bad_continue_token_is_400(server):
    code, status = request(server, "GET", f"{LEASES}?limit=2&continue=not-a-token")
    assert code == 400 and status["reason"] == "BadRequest"


def watch_lines(server, query, timeout=3):
    req = urllib.request.Request(f"{server.url}{LEASES}?watch=true&{query}", headers={"Accept": "application/json"})
    out = []
    with urllib.request.urlopen(req, timeout=timeout + 10) as r:
        for line in r:
            out.append(json.loads(line))
    return out


def test_a_watch_from_a_resource_version_sends_later_changes_and_bookmarks(server):
    _, first = request(server, "POST", LEASES, lease("a", {"k": "x"}))
    rv = first["metadata"]["resourceVersion"]
    request(server, "POST", LEASES, lease("b", {"k": "x"}))
    request(server, "DELETE", f"{LEASES}/a")
    request(server, "POST", LEASES, lease("c", {"k": "other"}))
    events = watch_lines(server, f"resourceVersion={rv}&labelSelector=k%3Dx&timeoutSeconds=2&allowWatchBookmarks=true")
    changes = [(e["type"], e["object"]["metadata"]["name"]) for e in events if e["type"] != "BOOKMARK"]
    assert changes == [("ADDED", "b"), ("DELETED", "a")]
    for e in events:
        if e["type"] == "BOOKMARK":  # a bookmark carries only its kind and resourceVersion
            assert set(e["object"]["metadata"]) == {"resourceVersion"}


@pytest.mark.fake_only("a real server keeps at least 75 s of watch history (its watch cache grows to) and "
                       "compacts etcd every 5 minutes: a resourceVersion does not get too old within a test")
def test_a_watch_from_a_too_old_resource_version_is_an_expired_error_event(server):
    # enough changes that resourceVersion 1 is older than any history the server keeps
    for i in range(120):
        request(server, "POST", LEASES, lease(f"h{i}"))
    if hasattr(server, "compact"):
        server.compact()
    events = watch_lines(server, "resourceVersion=1&timeoutSeconds=2")
    assert events and events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert status["code"] == 410 and status["reason"] in ("Expired", "Gone")


def test_pods_by_spec_node_name(server):
    server.add_pod("default", "p1", node="node-1")
    server.add_pod("default", "p2", node="node-2")
    server.add_pod("kube-system", "p3", node="node-1")
    code, lst = request(server, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1")
    assert code == 200
    assert sorted((o["metadata"]["namespace"], o["metadata"]["name"]) for o in lst["items"]) == [
        ("default", "p1"), ("kube-system", "p3")]
    code, status = request(server, "GET", "/api/v1/pods?fieldSelector=spec.unknownField%3Dx")
    assert code == 400 and status["reason"] == "BadRequest"


def test_a_pods_status_is_not_taken_on_create(server):
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "pause"}]}, "status": {"phase": "Running"}}
    code, pod = request(server, "POST", "/api/v1/namespaces/default/pods", body)
    assert code == 201 and pod["status"]["phase"] == "Pending"


def test_a_bound_pod_deleted_with_its_grace_period_stays_until_the_kubelet_confirms(server):
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "pause"}]}}
    assert request(server, "POST", "/api/v1/namespaces/default/pods", body)[0] == 201
    code, pod = request(server, "DELETE", "/api/v1/namespaces/default/pods/p")
    assert code == 200 and pod["kind"] == "Pod" and pod["metadata"]["deletionTimestamp"]
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 30
    assert request(server, "GET", "/api/v1/namespaces/default/pods/p")[0] == 200  # terminating, still there
    now = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
    assert request(server, "DELETE", "/api/v1/namespaces/default/pods/p", now)[0] == 200
    assert request(server, "GET", "/api/v1/namespaces/default/pods/p")[0] == 404
    unbound = {**body, "spec": {"containers": body["spec"]["containers"]}}
    assert request(server, "POST", "/api/v1/namespaces/default/pods", unbound)[0] == 201
    assert request(server, "DELETE", "/api/v1/namespaces/default/pods/p")[0] == 200
    assert request(server, "GET", "/api/v1/namespaces/default/pods/p")[0] == 404  # never scheduled: gone at once


def test_a_lease_in_a_namespace_that_does_not_exist_is_404(server):
    code, status = request(server, "POST", "/apis/coordination.k8s.io/v1/namespaces/no-such-ns/leases", lease("a"))
    assert code == 404 and status["reason"] == "NotFound"
    assert status["details"] == {"name": "no-such-ns", "kind": "namespaces"}


def test_a_merge_patch_changes_only_what_it_names(server):
    request(server, "POST", LEASES, lease("a", {"k": "x", "j": "1"}))
    code, patched = request(server, "PATCH", f"{LEASES}/a", {"metadata": {"labels": {"j": None}}},
                            content_type="application/merge-patch+json")
    assert code == 200 and patched["metadata"]["labels"] == {"k": "x"} and patched["spec"]["holderIdentity"] == "c/net1"


def test_a_lease_with_a_bad_name_is_422_invalid(server):
    code, status = request(server, "POST", LEASES, lease("Not_A_Name"))
    assert code == 422 and status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "metadata.name"


def test_time_fields_are_rfc3339_micro(server):
    body = lease("a")
    body["spec"]["acquireTime"] = "2024-01-02T03:04:05.000000Z"
    code, made = request(server, "POST", LEASES, body)
    assert code == 201 and made["spec"]["acquireTime"] == "2024-01-02T03:04:05.000000Z"
    body = lease("b")
    body["spec"]["acquireTime"] = "2024-01-02T03:04:05Z"  # a MicroTime needs its 6 digits
    code, status = request(server, "POST", LEASES, body)
    assert code == 400 and status["reason"] == "BadRequest"


NV_IPPOOLS = f"/apis/nv-ipam.nvidia.com/v1alpha1/namespaces/{NS}/ippools"
SPEC = {"subnet": "192.168.5.0/24", "perNodeBlockSize": 50}
BLOCKS = {"allocations": [{"nodeName": "node-a", "startIP": "192.168.5.1", "endIP": "192.168.5.50"}]}


def test_a_custom_resources_status_is_written_through_its_subresource_only(server):
    """nv-ipam's controller writes a pool's status.allocations with the status subresource: a create
    or an update of the object keeps the status the server has, an update of ``/status`` changes
    the status alone."""
    pool = {"apiVersion": "nv-ipam.nvidia.com/v1alpha1", "kind": "IPPool", "metadata": {"name": "p"},
            "spec": SPEC, "status": BLOCKS}
    code, made = request(server, "POST", NV_IPPOOLS, pool)
    assert code == 201 and "status" not in made
    changed = {**made, "spec": {**SPEC, "perNodeBlockSize": 10}, "status": BLOCKS}
    code, updated = request(server, "PUT", f"{NV_IPPOOLS}/p/status", changed)
    assert code == 200 and updated["status"] == BLOCKS and updated["spec"] == SPEC
    code, updated = request(server, "PUT", f"{NV_IPPOOLS}/p", {**changed, "metadata": updated["metadata"], "status": {}})
    assert code == 200 and updated["status"] == BLOCKS and updated["spec"]["perNodeBlockSize"] == 10


def test_two_groups_kinds_of_one_plural_are_apart(server):
    """whereabouts' and nv-ipam's IPPool share the plural ``ippools``."""
    whereabouts = f"/apis/whereabouts.cni.cncf.io/v1alpha1/namespaces/{NS}/ippools"
    assert request(server, "POST", whereabouts, {"apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
                                                 "metadata": {"name": "p"},
                                                 "spec": {"range": "10.0.0.0/24", "allocations": {}}})[0] == 201
    assert request(server, "GET", f"{NV_IPPOOLS}/p")[0] == 404
    assert request(server, "POST", NV_IPPOOLS, {"apiVersion": "nv-ipam.nvidia.com/v1alpha1", "kind": "IPPool",
                                                "metadata": {"name": "p"}, "spec": SPEC})[0] == 201
    assert [o["metadata"]["name"] for o in request(server, "GET", NV_IPPOOLS)[1]["items"]] == ["p"]
    assert request(server, "GET", f"{whereabouts}/p")[1]["spec"]["range"] == "10.0.0.0/24"
