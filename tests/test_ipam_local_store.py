"""rdmanet.ipam.store.local: layout, modes, idempotency, all-or-nothing, ownership rules, GC, STATUS."""

from __future__ import annotations

import ipaddress
import json
import os
import stat

import pytest

from rdmanet.cni.core.errors import ADDRESS_UNAVAILABLE, NOT_AVAILABLE, POOL_EXHAUSTED, TRY_AGAIN_LATER, CNIError
from rdmanet.ipam.config import parse_ipam_config
from rdmanet.ipam.store.base import Attachment
from rdmanet.ipam.store.local import LocalStore, index_name
from rdmanet.ipam.store.files import GARBAGE, read_json

A = Attachment("ctr-a", "net1")
B = Attachment("ctr-b", "net1")
IP = ipaddress.ip_address


def range_sets(**ipam):
    return parse_ipam_config({"name": "n", "ipam": {"type": "lease-ipam", **ipam}}).range_sets


@pytest.fixture
def store(tmp_path):
    return LocalStore(str(tmp_path), "dom")


def address_files(store):
    return sorted(n for n in os.listdir(store.root) if n[0].isdigit() or ":" in n)


def test_layout_modes_and_content(store):
    sets = range_sets(range="10.0.0.0/24", gateway="10.0.0.1")
    assert store.allocate(A, "net-a", sets, {}) == [IP("10.0.0.2")]
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store.index_dir).st_mode) == 0o700
    for name in ("10.0.0.2", "lock", "last_reserved.0"):
        assert stat.S_IMODE(os.stat(os.path.join(store.root, name)).st_mode) == 0o600
    claim = json.load(open(os.path.join(store.root, "10.0.0.2")))
    assert {k: claim[k] for k in ("containerID", "ifname", "network")} == {"containerID": "ctr-a", "ifname": "net1", "network": "net-a"}
    assert claim["time"].endswith("+00:00")
    index = json.load(open(os.path.join(store.index_dir, "ctr-a:net1")))
    assert index["addresses"] == ["10.0.0.2"]
    assert open(os.path.join(store.root, "last_reserved.0")).read().strip() == "10.0.0.2"


def test_round_robin_does_not_reuse_a_freed_address_at_once(store):
    sets = range_sets(range="10.0.0.0/29")  # .1 - .6
    got = [store.allocate(Attachment(f"c{i}", "net1"), "n", sets, {})[0] for i in range(3)]
    assert got == [IP("10.0.0.1"), IP("10.0.0.2"), IP("10.0.0.3")]
    store.release(Attachment("c0", "net1"))
    assert store.allocate(Attachment("c9", "net1"), "n", sets, {}) == [IP("10.0.0.4")]
    for i in (10, 11):
        store.allocate(Attachment(f"c{i}", "net1"), "n", sets, {})
    assert store.allocate(Attachment("c12", "net1"), "n", sets, {}) == [IP("10.0.0.1")]  # wrapped


def test_repeat_add_returns_same_addresses_without_writing(store):
    sets = range_sets(range="10.0.0.0/24", ipRanges=[{"range": "fd00::/64"}])
    first = store.allocate(A, "n", sets, {})
    index_path = os.path.join(store.index_dir, index_name(A))
    before = os.stat(index_path).st_mtime_ns
    assert store.allocate(A, "n", sets, {}) == first
    assert os.stat(index_path).st_mtime_ns == before
    assert [str(x) for x in first] == ["10.0.0.1", "fd00::1"]


def test_all_or_nothing_when_a_later_range_set_is_exhausted(store):
    sets = range_sets(range="10.0.0.0/24", ipRanges=[{"range": "10.1.0.0/30"}])  # second: .1 .2
    store.allocate(Attachment("x1", "e"), "n", sets, {})
    store.allocate(Attachment("x2", "e"), "n", sets, {})
    with pytest.raises(CNIError) as info:
        store.allocate(A, "n", sets, {})
    assert info.value.code == POOL_EXHAUSTED and "10.1.0.0/30" in info.value.msg
    assert address_files(store) == ["10.0.0.1", "10.0.0.2", "10.1.0.1", "10.1.0.2"]
    assert not os.path.exists(os.path.join(store.index_dir, index_name(A)))


def test_requested_addresses(store):
    sets = range_sets(range="10.0.0.0/24")
    assert store.allocate(A, "n", sets, {0: IP("10.0.0.77")}) == [IP("10.0.0.77")]
    with pytest.raises(CNIError) as info:
        store.allocate(B, "n", sets, {0: IP("10.0.0.77")})
    assert info.value.code == ADDRESS_UNAVAILABLE and "ctr-a/net1" in info.value.msg
    assert store.allocate(A, "n", sets, {0: IP("10.0.0.77")}) == [IP("10.0.0.77")]  # repeat: same
    with pytest.raises(CNIError) as info:
        store.allocate(A, "n", sets, {0: IP("10.0.0.78")})
    assert info.value.code == ADDRESS_UNAVAILABLE and "already holds" in info.value.msg
    assert address_files(store) == ["10.0.0.77"]


def test_release_is_idempotent_and_only_removes_own_claims(store):
    sets = range_sets(range="10.0.0.0/24")
    assert store.release(A) == []  # store absent: success, nothing created
    assert not os.path.exists(store.root)
    store.allocate(A, "n", sets, {})
    # Someone else's claim listed in A's index (e.g. freed by GC, then re-claimed by B).
    with open(os.path.join(store.root, "10.0.0.9"), "w") as f:
        json.dump({"containerID": "ctr-b", "ifname": "net1"}, f)
    index_path = os.path.join(store.index_dir, index_name(A))
    doc = json.load(open(index_path))
    doc["addresses"].append("10.0.0.9")
    json.dump(doc, open(index_path, "w"))
    assert store.release(A) == [IP("10.0.0.1")]
    assert address_files(store) == ["10.0.0.9"]
    assert store.release(A) == []


def test_find_and_list(store):
    sets = range_sets(range="10.0.0.0/24", ipRanges=[{"range": "fd00::/120"}])
    store.allocate(A, "net-a", sets, {})
    store.allocate(B, "net-b", sets, {})
    found = store.find(A)
    assert found.attachment == A and found.network == "net-a" and [str(x) for x in found.addresses] == ["10.0.0.1", "fd00::1"]
    assert store.find(Attachment("nope", "net1")) is None
    listing = store.list()
    assert [(r.attachment, r.network, [str(x) for x in r.addresses]) for r in listing] == [
        (A, "net-a", ["10.0.0.1", "fd00::1"]), (B, "net-b", ["10.0.0.2", "fd00::2"])]


def test_gc_frees_only_unlisted_attachments_of_its_network(store):
    sets = range_sets(range="10.0.0.0/24")
    c = Attachment("ctr-c", "net1")
    store.allocate(A, "net-a", sets, {})
    store.allocate(B, "net-a", sets, {})
    store.allocate(c, "other-net", sets, {})  # shares the domain via network_name
    # an interrupted claim (empty file) and a stray temp file
    open(os.path.join(store.root, "10.0.0.200"), "w").close()
    open(os.path.join(store.root, ".tmp.x.1"), "w").close()
    freed = store.gc("net-a", {A})
    assert [r.attachment for r in freed] == [B]
    assert address_files(store) == ["10.0.0.1", "10.0.0.3"]
    assert sorted(os.listdir(store.index_dir)) == sorted([index_name(A), index_name(c)])
    assert not [n for n in os.listdir(store.root) if n.startswith(".tmp.")]


def test_gc_frees_orphan_address_files_without_index(store):
    sets = range_sets(range="10.0.0.0/24")
    store.allocate(A, "net-a", sets, {})
    os.unlink(os.path.join(store.index_dir, index_name(A)))
    freed = store.gc("net-a", set())
    assert [(r.attachment, [str(x) for x in r.addresses]) for r in freed] == [(A, ["10.0.0.1"])]
    assert address_files(store) == []


def test_status_counts_and_unusable_dir(store, tmp_path):
    sets = range_sets(range="10.0.0.0/29", gateway="10.0.0.1", ipRanges=[{"range": "fd00::/64"}])
    assert store.status(sets) == [5, 2**64 - 2]
    store.allocate(A, "n", sets, {})
    assert store.status(sets) == [4, 2**64 - 3]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    broken = LocalStore(str(blocker), "dom")  # dataDir is a regular file
    with pytest.raises(CNIError) as info:
        broken.status(sets)
    assert info.value.code == NOT_AVAILABLE and "unusable" in info.value.msg


def test_lock_timeout_is_try_again_later(tmp_path):
    from filelock import FileLock

    store = LocalStore(str(tmp_path), "dom", lock_timeout=0.2)
    sets = range_sets(range="10.0.0.0/24")
    store.allocate(A, "n", sets, {})
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()

    def hold():
        with FileLock(os.path.join(store.root, "lock")):
            ready.set()
            done.wait(10)

    p = ctx.Process(target=hold)
    p.start()
    try:
        assert ready.wait(10)
        with pytest.raises(CNIError) as info:
            store.allocate(B, "n", sets, {})
        assert info.value.code == TRY_AGAIN_LATER
    finally:
        done.set()
        p.join(10)


def test_garbage_claim_blocks_the_address_and_repeat_add_recovers(store):
    """An empty address file listed in an index (crash after O_EXCL) is never handed out; the
    repeat ADD of the same attachment drops it and allocates afresh."""
    sets = range_sets(range="10.0.0.0/29")
    index = {"containerID": A.container_id, "ifname": A.ifname, "network": "n", "addresses": ["10.0.0.1"]}
    os.makedirs(store.index_dir)
    json.dump(index, open(os.path.join(store.index_dir, index_name(A)), "w"))
    open(os.path.join(store.root, "10.0.0.1"), "w").close()
    assert read_json(os.path.join(store.root, "10.0.0.1")) is GARBAGE
    assert store.allocate(B, "n", sets, {}) == [IP("10.0.0.2")]
    assert store.allocate(A, "n", sets, {}) == [IP("10.0.0.3")]
    assert address_files(store) == ["10.0.0.2", "10.0.0.3"]
    assert json.load(open(os.path.join(store.index_dir, index_name(A))))["addresses"] == ["10.0.0.3"]


def test_long_attachment_names_are_hashed(store):
    long = Attachment("c" * 250, "net1")
    name = index_name(long)
    assert name.startswith("sha256-") and len(name) < 100
    sets = range_sets(range="10.0.0.0/24")
    store.allocate(long, "n", sets, {})
    assert store.find(long).addresses == (IP("10.0.0.1"),)
    assert store.release(long) == [IP("10.0.0.1")]


def test_config_change_keeps_held_addresses_and_fills_new_range_sets(store):
    v4 = range_sets(range="10.0.0.0/24")
    both = range_sets(range="10.0.0.0/24", ipRanges=[{"range": "fd00::/64"}])
    assert store.allocate(A, "n", v4, {}) == [IP("10.0.0.1")]
    assert [str(x) for x in store.allocate(A, "n", both, {})] == ["10.0.0.1", "fd00::1"]
    moved = range_sets(range="10.5.0.0/24")
    assert store.allocate(A, "n", moved, {}) == [IP("10.5.0.1")]
    assert address_files(store) == ["10.5.0.1"]  # the addresses outside the new config were released


def test_requested_address_with_an_interrupted_claim_is_reclaimed(store):
    sets = range_sets(range="10.0.0.0/29")
    os.makedirs(store.index_dir)
    open(os.path.join(store.root, "10.0.0.5"), "w").close()  # empty: a crashed ADD's claim
    assert store.allocate(A, "n", sets, {0: IP("10.0.0.5")}) == [IP("10.0.0.5")]
    assert json.load(open(os.path.join(store.root, "10.0.0.5")))["containerID"] == "ctr-a"


def test_flock_threads_exclude_each_other_and_time_out(tmp_path):
    import signal
    import threading
    import time

    from rdmanet.ipam.store.flock import LockTimeout, exclusive

    path = str(tmp_path / "lock")
    inside, overlap = [0], []

    def worker():
        for _ in range(20):
            with exclusive(path, 10):
                inside[0] += 1
                overlap.append(inside[0])
                time.sleep(0.0005)
                inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlap) == 80 and max(overlap) == 1

    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()

    def hold():
        with exclusive(path, 10):
            ready.set()
            done.wait(10)

    p = ctx.Process(target=hold)
    p.start()
    try:
        assert ready.wait(10)
        errors = []

        def in_thread():  # not the main thread: polls
            try:
                with exclusive(path, 0.2):
                    pass
            except LockTimeout:
                errors.append("timeout")

        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        assert errors == ["timeout"]
        start = time.monotonic()
        with pytest.raises(LockTimeout):  # main thread: sleeps in flock, woken by the alarm
            with exclusive(path, 0.2):
                pass
        assert time.monotonic() - start < 2
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    finally:
        done.set()
        p.join(10)
    with exclusive(path, 1):  # free again once the holder is gone
        pass
