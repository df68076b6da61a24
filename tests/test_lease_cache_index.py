"""The block index of lease-ipam's watch cache (rdmanet/ipam/store/lease_cache.py) against a fold.

A daemon's ADD looks only at the blocks the cache's index calls open (some address no Lease
holds) and reads the used addresses within them, instead of every claim of the node (with
thousands of claims per node, each ADD would cost milliseconds). That is only right while the
index is exactly what folding the cache's entries gives. These tests drive the cache with random
sequences — watch events in and out of order (stale UIDs, deletes of older incarnations), the
store's write-through answers (create, GET, 404, delete, 409), creates in flight, re-Lists after
410 — and, through the informer thread against the fake API server, creates, deletes, bookmarks,
a compaction and broken streams; after each step the index must equal the fold, and the
candidate an ADD picks must be the one a search of all the node's blocks picks.
"""

from __future__ import annotations

import ipaddress
import os
import random
import sys
import time
from bisect import bisect_left, bisect_right

import pytest

from rdmanet.ipam.config import parse_ipam_config
from rdmanet.ipam.store import lease_cache
from rdmanet.ipam.store.candidates import next_candidate
from rdmanet.ipam.store.kube import LEASES_PATH, ApiClientTransport, KubeStore, domain_hash, lease_name, node_selector, parse_lease
from rdmanet.ipam.store.lease_names import block_id

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import InProcessApiClient, KubeAPIServer, parse_label_selector  # noqa: E402

pytestmark = pytest.mark.both_servers  # the fake and a real kube-apiserver (conftest.py)

NS = "ipam"
DOMAIN = "index-test"
DHASH = domain_hash(DOMAIN)
NODE = "node-a"
NET4 = ipaddress.ip_network("10.0.0.0/25")  # 128 addresses: blocks fill and empty often
NET6 = ipaddress.ip_network("fd00::/120")
SIZES = {4: (16, 16, 16, 8, 32), 6: (64, 64, 32)}  # mostly the default size; 8/32 nest (a changed block size)


def claim_obj(ip, uid, rv, holder="c/net1", node=NODE):
    net = NET4 if ip.version == 4 else NET6
    return {"metadata": {"name": lease_name(DHASH, ip), "uid": uid, "resourceVersion": str(rv),
                         "labels": {"rdmanet.io/ipam-domain": DHASH, "rdmanet.io/node": node},
                         "annotations": {"rdmanet.io/range": str(net), "rdmanet.io/ip": str(ip)}},
            "spec": {"holderIdentity": holder, "acquireTime": "2026-11-24T07:00:00.%06dZ" % (rv % 1000000)}}


def record_obj(first, size, offset, uid, rv, held, node=NODE):
    """A block record (the claim Lease of a block's first usable address, carrying the block):
    held by an attachment, or free (no holder)."""
    obj = claim_obj(ipaddress.ip_address(int(first) + offset), uid, rv, holder="c/net1" if held else None, node=node)
    obj["metadata"]["labels"].update({"rdmanet.io/block-owner": node, "rdmanet.io/block": block_id(first, size)})
    obj["metadata"]["annotations"]["rdmanet.io/block-owner"] = node
    if not held:
        del obj["spec"]["holderIdentity"]
    return obj


def parse(obj):
    return parse_lease(obj, DHASH)


def fold(cache):
    """What the index must say, recomputed from the cache's entries alone."""
    with cache._cond:
        entries = list(cache._entries.values())
        pending = set(cache._pending)

    def occupies(e):  # a 409 placeholder, a claim, or a block record that names an attachment
        return e.claim is None or not e.claim.block or e.claim.attachment is not None

    used = {v: sorted(int(e.ip) for e in entries if occupies(e) and e.ip.version == v) for v in (4, 6)}
    blocks = {e.name: e.claim.as_block() for e in entries if e.claim is not None and e.claim.block}
    fill = {n: bisect_right(used[b.ip.version], b.last) - bisect_left(used[b.ip.version], int(b.ip))
            for n, b in blocks.items()}
    return used, blocks, fill, pending


def assert_index_is_the_fold(cache, rng):
    used, blocks, fill, pending = fold(cache)
    assert cache.used(4) == used[4] and cache.used(6) == used[6]
    assert {b.name for b in cache.blocks()} == set(blocks)
    assert sorted(b.name for b in cache.open_blocks()) == sorted(n for n, f in fill.items() if f < blocks[n].size)
    assert sorted(b.name for b in cache.empty_blocks()) == sorted(n for n, f in fill.items() if f == 0)
    for b in blocks.values():
        assert cache.count_used(b.ip.version, int(b.ip), b.last) == fill[b.name]
    for version, net in ((4, NET4), (6, NET6)):
        # the window: open blocks in address order from the one holding (or following) a value,
        # wrapping; flagged when it holds them all
        in_order = sorted((int(b.ip), n) for n, b in blocks.items() if b.ip.version == version and fill[n] < b.size)
        window, every = cache.open_window(version, None, 10**6)
        assert [(int(b.ip), b.name) for b in window] == in_order and every
        value = int(random_ip(rng, version))
        count = rng.randrange(1, 6)
        start = next((i for i, (first, n) in enumerate(in_order) if first + blocks[n].size > value), len(in_order))
        want = [in_order[(start + k) % len(in_order)][1] for k in range(min(count, len(in_order)))]
        window, every = cache.open_window(version, value, count)
        assert [b.name for b in window] == want
        assert every == (len(want) == len(in_order))
    for version, net in ((4, NET4), (6, NET6)):
        lo, hi = int(net.network_address), int(net.broadcast_address)
        for _ in range(5):
            value = rng.randint(lo, hi)
            want = sorted(b.name for b in blocks.values() if b.ip.version == version and int(b.ip) <= value <= b.last)
            assert sorted(b.name for b in cache.blocks_at(version, value)) == want
            a = rng.randint(lo, hi)
            b_ = rng.randint(a, hi)
            spans = [(lo, a - 1), (a + 1, b_)] if a > lo else [(a + 1, b_)]
            inside = [v for v in used[version] if any(s <= v <= e for s, e in spans)]
            mine = [v for fam, v in pending if fam == version and any(s <= v <= e for s, e in spans)]
            assert cache.used_within(version, spans, pending=False) == inside
            assert cache.used_within(version, spans) == sorted(set(inside) | set(mine))


def random_ip(rng, version):
    net = NET4 if version == 4 else NET6
    return net[rng.randrange(net.num_addresses)]


def random_block(rng, version):
    net = NET4 if version == 4 else NET6
    size = rng.choice(SIZES[version])
    first = int(net.network_address) + size * rng.randrange(net.num_addresses // size)
    return ipaddress.ip_address(first), size


@pytest.mark.parametrize("seed", range(12))
def test_the_block_index_is_the_fold_of_the_cache_after_random_events(seed):
    rng = random.Random(seed)
    cache = lease_cache.LeaseCache(None, "/leases", "sel", parse, name="index-test")
    server: dict[str, dict] = {}  # name -> the Lease as the "server" has it now
    uids = iter(range(1, 10**9))
    rv = [1000]

    def next_rv():
        rv[0] += 1
        return rv[0]

    history: list[tuple[str, dict]] = []  # every event ever delivered: replayed out of order (stale)
    for step in range(500):
        op = rng.random()
        version = 4 if rng.random() < 0.8 else 6
        if op < 0.30:  # a claim made (ADDED), or remade under a new UID after a delete
            ip = random_ip(rng, version)
            name = lease_name(DHASH, ip)
            if name in server and rng.random() < 0.5:
                obj = dict(server[name], metadata=dict(server[name]["metadata"], resourceVersion=str(next_rv())))
                kind = "MODIFIED"
            else:
                if name in server:
                    history.append(("DELETED", server.pop(name)))
                    cache._apply("DELETED", history[-1][1])
                obj = claim_obj(ip, f"u{next(uids)}", next_rv())
                kind = "ADDED"
            server[name] = obj
            history.append((kind, obj))
            cache._apply(kind, obj)
        elif op < 0.50:  # a claim or block deleted
            if server:
                name = rng.choice(sorted(server))
                obj = server.pop(name)
                history.append(("DELETED", obj))
                cache._apply("DELETED", obj)
        elif op < 0.60:  # a block acquired: its record (held or free)
            first, size = random_block(rng, version)
            obj = record_obj(first, size, rng.randrange(2), f"u{next(uids)}", next_rv(), rng.random() < 0.6)
            if obj["metadata"]["name"] not in server:
                server[obj["metadata"]["name"]] = obj
                history.append(("ADDED", obj))
                cache._apply("ADDED", obj)
        elif op < 0.68 and history:  # a stale event replayed (older incarnation, lagging stream)
            kind, obj = rng.choice(history)
            cache._apply(kind, obj)
        elif op < 0.80:  # the store's write-through answers
            ip = random_ip(rng, version)
            name = lease_name(DHASH, ip)
            what = rng.randrange(7)
            current = parse(server[name]) if name in server else None
            if what == 0:
                cache.taken(name, ip)  # a 409
            elif what == 1 and current is not None:
                cache.created(current)
            elif what == 2 and current is not None:
                cache.observed(current)
            elif what == 3:
                cache.absent(name, current.uid if current is not None and rng.random() < 0.5 else f"u{rng.randrange(1, 50)}")
            elif what == 6 and current is not None and getattr(current, "block", ""):
                # our update of a block record: claimed, or freed (the watch's MODIFIED comes later)
                held = current.attachment is None
                first, size = current.as_block().ip, current.as_block().size
                obj = record_obj(first, size, int(current.ip) - int(first), current.uid, next_rv(), held)
                server[name] = obj
                history.append(("MODIFIED", obj))
                cache.updated(parse(obj))
            elif what == 4 and current is not None:
                del server[name]
                cache.deleted(current)  # our delete; its DELETED event may come later or never
            elif what == 5:  # our create of a block's record
                first, size = random_block(rng, version)
                obj = record_obj(first, size, rng.randrange(2), f"u{next(uids)}", next_rv(), rng.random() < 0.6)
                got = parse(obj)
                if obj["metadata"]["name"] not in server:
                    server[obj["metadata"]["name"]] = obj
                    cache.created(got)
        elif op < 0.90:  # a create in flight, or finished
            value = int(random_ip(rng, version))
            cache.choose(version, lambda pending: value)
            if rng.random() < 0.7:
                cache.done(version, value)
        elif op < 0.95:  # a re-List after a 410 (or a start): the server's state replaces everything
            cache._replace([parse(o) for o in server.values()], str(next_rv()))
        else:  # a bookmark: only the resourceVersion moves
            with cache._cond:
                cache.resource_version = str(next_rv())
        assert_index_is_the_fold(cache, rng)


@pytest.mark.parametrize("window", [1, 8])
def test_the_candidate_is_the_one_a_search_of_every_block_gives(window, monkeypatch):
    """The ADD's search over the open blocks (plus the cursor's block), and the search of a
    window of them first (``KubeStore._search``, SEARCH_WINDOW open blocks beyond the creates in
    flight), return the address a search over every block of the node (the store before the
    index) returns, for random fills, cursors and creates in flight."""
    from rdmanet.ipam.store import kube

    monkeypatch.setattr(kube, "SEARCH_WINDOW", window)
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "x",
            "ipam": {"type": "lease-ipam", "range": "10.0.0.0/22", "range_start": "10.0.0.5", "range_end": "10.0.3.200",
                     "gateway": "10.0.0.1", "exclude": ["10.0.1.16/30"]}}
    [rs] = parse_ipam_config(conf).range_sets
    store = KubeStore(None, NS, DOMAIN, node=NODE, block_size=16)
    rng = random.Random(7)
    for trial in range(200):
        cache = lease_cache.LeaseCache(None, "/leases", "sel", parse, name="index-test")
        objs, uid = [], 0
        firsts = rng.sample(range(0, 1024, 16), rng.randrange(1, 30))
        for first in firsts:
            start = ipaddress.ip_address(int(NET4.network_address) + first)
            for off in range(16):
                held = rng.random() < (0.97 if rng.random() < 0.7 else 0.5)
                uid += 1
                if off == 0:  # the block's record: its address held or free
                    objs.append(record_obj(start, 16, 0, f"u{uid}", uid, held))
                elif held:
                    objs.append(claim_obj(ipaddress.ip_address(int(start) + off), f"u{uid}", uid))
        cache._replace([parse(o) for o in objs], "1")
        for _ in range(rng.randrange(4)):  # creates in flight
            value = int(NET4.network_address) + rng.choice(firsts) + rng.randrange(16)
            cache.choose(4, lambda pending: value)
        used = cache.used(4)
        cursor = ipaddress.ip_address(rng.choice(used)) if used and rng.random() < 0.9 else None
        everything = store.blocks.own(rs, cache.blocks())
        want = everything.next_free(sorted(set(used) | set(cache.pending(4))), cursor) if everything else None
        own = store.blocks.own(rs, store._searched_blocks(cache, cursor))
        store.leases.cache = cache
        got = next_candidate(cache, own, [], cursor, 0) if own is not None else None
        assert got == want, (trial, cursor, got, want)
        if got is not None:
            cache.done(4, got)
        pending = cache.pending(4)
        got, _ = store._search(rs, [], cursor, [], cache)
        assert got == want, (trial, cursor, got, want)
        if got is not None:
            cache.done(4, got)
        assert cache.pending(4) == pending  # a window's candidate it did not take is no longer pending
        # STATUS counts free addresses of the open blocks only: the same count as over every block
        assert (everything.count_free(used) if everything else 0) == \
            (own_open.count_free(cache.used_within(4, [(r.start, r.end) for r in own_open.ranges], pending=False))
             if (own_open := store.blocks.own(rs, cache.open_blocks())) is not None else 0)


def test_the_informer_keeps_the_index_through_events_bookmarks_and_relists():
    """The informer thread against the fake API server: random creates and deletes of the node's
    claims and blocks (and of another node's, which it never sees), bookmarks, a compaction with
    broken streams (410, re-List) and a restart; once in sync with the server, the index is the
    fold of the server's objects."""
    server = KubeAPIServer(start=False, bookmark_interval=0.05)
    path = LEASES_PATH.format(namespace=NS)
    client = InProcessApiClient(server, "index-test")
    cache = lease_cache.LeaseCache(ApiClientTransport(client, "in-process"), path, node_selector(DHASH, NODE), parse,
                                   name="lease-cache index-test",
                                   settings=lease_cache.Settings(watch_timeout=2.0, request_timeout=5.0))
    rng = random.Random(3)
    selected = parse_label_selector(cache.selector)
    import json

    def call(method, name=None, body=None):
        status, _, data = server.handle(method, path + (f"/{name}" if name else ""), [],
                                        json.dumps(body).encode() if body is not None else None, "index-test")
        return status, (json.loads(data) if data else None)

    def converge():
        end = time.monotonic() + 20.0
        while True:
            want = {o["metadata"]["name"]: o["metadata"]["uid"] for o in server.objects("leases", NS)
                    if selected(o["metadata"].get("labels") or {})}
            with cache._cond:
                have = {n: e.uid for n, e in cache._entries.items() if e.confirmed}
                complete = all(e.confirmed for e in cache._entries.values())
            if have == want and complete and cache.usable():
                return want
            assert time.monotonic() < end, "the informer did not catch up with the server"
            time.sleep(0.02)

    try:
        cache.start()
        assert cache.wait_synced(10.0)
        for round_ in range(6):
            for _ in range(120):
                version = 4 if rng.random() < 0.8 else 6
                node = NODE if rng.random() < 0.8 else "node-b"
                if rng.random() < 0.15:
                    first, size = random_block(rng, version)
                    body = record_obj(first, size, rng.randrange(2), "", 0, rng.random() < 0.6, node=node)
                else:
                    body = claim_obj(random_ip(rng, version), "", 0, node=node)
                for k in ("uid", "resourceVersion"):
                    del body["metadata"][k]
                body["metadata"]["namespace"] = NS
                status, _ = call("POST", body=body)
                if status == 409 or rng.random() < 0.3:
                    call("DELETE", body["metadata"]["name"])
            if round_ == 2:
                server.compact()  # the history is gone: the next re-watch meets 410 and Lists again
                server.drop_watches()
                for w in [w for g in list(server._wgroups.values()) for w in g.live]:
                    w.drop()
            if round_ == 4:
                server.restart_watches(others_changed=True)  # no watcher is current: 410, re-List
            want = converge()
            assert_index_is_the_fold(cache, rng)
            names = {b.name for b in cache.blocks()}
            records = {o["metadata"]["name"] for o in server.objects("leases", NS)
                       if "rdmanet.io/block-owner" in (o["metadata"].get("labels") or {})}
            assert names == {n for n in want if n in records}
    finally:
        cache.stop()
        cache.join(5.0)
        server.stop()
    assert cache.stats["relists"] >= 1  # the 410 path was taken
