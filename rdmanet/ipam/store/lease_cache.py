"""A watch cache of one allocation domain's Leases, for the node daemon only.

One :class:`LeaseCache` (an informer) per (API connection, namespace, domain label selector):
a background daemon thread Lists the domain's Leases (paged), then Watches from the List's
resourceVersion with ``allowWatchBookmarks=true`` and applies ADDED / MODIFIED / DELETED /
BOOKMARK events. A 410 (an ``ERROR`` event whose Status has code 410, or an HTTP 410) means the
history it needed is gone: it Lists again. A broken stream or a clean end (``timeoutSeconds``)
re-Watches from the last resourceVersion seen; failures back off exponentially with jitter.

Facts relied on (Kubernetes API concepts: efficient detection of changes, watch bookmarks):
- A watch from resourceVersion N delivers every change after N that the selector matches, in
  resourceVersion order; an object leaving the selection arrives as DELETED. So once the event
  of an object we created has been applied, every earlier change has been applied too.
- The server may end a watch at any time (``timeoutSeconds``, restarts) and may answer a too-old
  resourceVersion with 410 Gone / reason Expired, as an HTTP status or as an ERROR event.
- Bookmarks carry only ``metadata.resourceVersion``; they come at the server's discretion.
- UIDs are never reused: once a UID is known deleted, any later sighting of it is stale.

What the cache never decides alone (the store, :mod:`rdmanet.ipam.store.kube`, keeps correctness):
a create is still the claim (409 = taken), a held claim the cache shows is confirmed by a GET
before it is returned, a delete carries uid/resourceVersion preconditions. The cache only
saves the per-ADD List; whatever it may have missed is checked as described in kube.py.

Knowledge per Lease name (an :class:`Entry`): the parsed claim, its UID, and whether the
List/Watch has *confirmed* it. The store writes its own results through (a create, a delete,
a GET, a 409) as unconfirmed knowledge, so a repeat ADD in the same daemon sees its claim
before the watch delivers it. Ordering rules that keep write-through and a lagging stream from
undoing each other:
- an event or write for a UID known deleted (``dead``) is ignored;
- an unconfirmed entry (our write) ignores events for *other* UIDs of its name: while the name
  holds our UID, another UID's event can only be older (a newer one would need our UID's
  DELETED first, which removes the entry);
- a placeholder (a 409 told us the name is taken, not by whom) yields to any event of its name,
  and lasts until the watch (re)opens at most (a name the node-scoped watch does not select, such
  as another node's block record, has no event to replace it);
- a re-List replaces everything (dropping unconfirmed knowledge it does not contain is the
  safe direction: missing knowledge costs a 409 or a fallback request, never a wrong answer).

Lifecycle: informers start lazily (the store asks for one on ADD/DEL) and only when the process
enabled the cache (:func:`enable`, done by the daemon: the in-process plugin never starts a
thread). An informer unused for ``idle_seconds`` stops (its watch's ``timeoutSeconds`` never
outlasts the idle deadline, so the thread ends on its own); at most ``max_informers`` run (the
least recently used is stopped); an informer whose connection is no longer the one the
kubeconfig yields (token rotation: ``connect()`` returned a new ApiClient) takes the new
client in place (its watch and state stay; its next request carries the new token).

Load on the API server: the List is paginated and parsed page by page; a 410 re-List waits a jittered,
growing delay (:func:`relist_delay`: thousands of daemons meet the same 410 after an API server
restart); a watch whose connection dies silently (no FIN/RST: a partition, a dead host) is
noticed by TCP keepalive within ``KEEPALIVE_*`` seconds (the transport sets it on the watch
socket), not after ``watch_timeout``; and while the watch lags or re-Lists, verbs keep using
the state as a hint (kube.py), so a slow API server does not get a List of the domain per ADD.
"""

from __future__ import annotations

import bisect
import logging
import math
import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Callable, Hashable, Iterable, Optional, Sequence

from .. import telemetry

log = logging.getLogger("rdmanet.ipam.cache")

PAGE_SIZE = 500
READ_GRACE = 15.0  # a watch read times out this long after the watch's own timeoutSeconds
BACKOFF_BASE = 0.2
BACKOFF_CAP = 30.0
RELIST_BASE = 1.0  # the first re-List after a 410 waits 0.5-1 s, each one more in a row twice that
RELIST_CAP = 60.0
DEAD_UIDS = 4096  # deleted UIDs remembered (bounded: only stale writes within the watch lag need them)
LOCK_STRIPES = 64


@dataclass(frozen=True)
class Settings:
    idle_seconds: float = 600.0  # an informer unused this long stops
    max_informers: int = 32  # least recently used beyond this are stopped
    sync_budget: float = 1.0  # how long a verb waits for a starting informer's first sync
    echo_budget: float = 1.0  # how long a verb waits for the watch to deliver its own write
    distrust_seconds: float = 10.0  # after a missed echo the cache is not used for this long
    watch_timeout: float = 300.0  # timeoutSeconds of one watch request (jittered -20 %)
    request_timeout: float = 10.0  # one List page


class Gone(Exception):
    """410: the resourceVersion the watch needs is no longer in the server's history."""


class Failed(Exception):
    """A List or Watch answered with an error status (not 410)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status} {message}".rstrip())
        self.status = status


class Broken(Exception):
    """An open watch stream failed while being read (the state up to its resourceVersion stands)."""

    def __init__(self, lasted: float, cause: str) -> None:
        super().__init__(f"watch stream broke after {lasted:.1f} s: {cause}")
        self.lasted = lasted


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    ip: Any  # ipaddress object
    claim: Any  # the parsed claim; None for a placeholder (a 409: taken, holder unknown)
    uid: str  # "" for a placeholder
    confirmed: bool  # seen in a List or a Watch event (not only written through)


class LeaseCache:
    """One informer: the Leases of one domain in one namespace, kept by List + Watch."""

    def __init__(self, transport: Any, path: str, selector: str, parse: Callable[[Any], Any], *,
                 owner: Any = None, name: str = "lease-cache", settings: Settings = Settings()) -> None:
        self.transport = transport  # request(method, path, query, body, timeout) and watch(path, query, timeout)
        self.path = path
        self.selector = selector
        self.parse = parse  # Lease dict -> claim (name, ip, uid, attachment, ...) or None
        self.owner = owner  # the API client this informer belongs to (token rotation)
        self.name = name
        self.settings = settings
        self._cond = threading.Condition()
        self._entries: dict[str, Entry] = {}
        self._by_attachment: dict[Hashable, set[str]] = {}
        self._used: dict[int, list[int]] = {4: [], 6: []}
        self._latest: dict[str, Any] = {}  # range -> the most recently made claim seen (the round-robin cursor)
        self._blocks: dict[str, Any] = {}  # name -> block (kube.Block): this node's address blocks
        # The block index, kept on every change of ``_used`` or ``_blocks`` so that an ADD looks
        # at the blocks it can use, not at every block and claim of the node (see ``open_blocks``):
        self._spans: dict[int, list[tuple[int, int, str]]] = {4: [], 6: []}  # family -> sorted (first, last, name)
        self._widest: dict[int, int] = {4: 1, 6: 1}  # family -> the largest block size seen (bounds a lookup)
        self._fill: dict[str, int] = {}  # block name -> how many of its addresses ``_used`` holds
        self._open: set[str] = set()  # blocks with an address ``_used`` does not hold
        self._open_order: dict[int, list[tuple[int, str]]] = {4: [], 6: []}  # family -> sorted (first, name) of ``_open``
        self.acquire_lock = threading.Lock()  # one block acquisition (or release) at a time in this process
        self.notes: dict[Any, Any] = {}  # the store's memory across calls (when a block went empty, ...)
        self._pending: set[tuple[int, int]] = set()  # (version, address) of this process's creates in flight
        self._choosing = threading.Lock()
        self._dead: OrderedDict[str, bool] = OrderedDict()  # uid -> the List/Watch confirmed it
        self._placeholders: set[str] = set()  # names a 409 marked taken since the watch last (re)opened
        self.resource_version = ""
        self.synced = False  # a List applied and a watch stream open (or about to re-open)
        self._failing = False  # the last List/Watch attempt failed: do not wait for a sync
        self._distrust_until = 0.0
        self._stop = threading.Event()
        self._stream: Any = None
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self.last_used = time.monotonic()
        self.stats = {"lists": 0, "watches": 0, "events": 0, "relists": 0, "errors": 0, "echo_misses": 0}
        self.thread: Optional[threading.Thread] = None
        self.on_exit: Optional[Callable[["LeaseCache"], None]] = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "LeaseCache":
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self.thread.start()
        return self

    def stop(self) -> None:
        """Ask the thread to end (returns at once; see :meth:`join`)."""
        self._stop.set()
        with self._cond:
            stream = self._stream
            self.synced = False
            self._cond.notify_all()
        if stream is not None:
            stream.abort()

    def join(self, timeout: Optional[float] = None) -> bool:
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive() and not self._stop.is_set()

    def rebind(self, transport: Any, owner: Any) -> None:
        """Credentials were rotated (``connect()`` returned a new API client): take the new
        transport for every request from now on. The open watch stays (it was authenticated when
        it opened); its next re-open, re-List or page uses the new credentials. Nothing restarts."""
        with self._cond:
            self.transport = transport
            self.owner = owner
        self.stats["rebinds"] = self.stats.get("rebinds", 0) + 1

    def has_state(self) -> bool:
        """A List has been applied at least once: the cache can serve as a hint (candidates, the
        attachment's claims to check) even while its watch is lagging, broken or re-Listing."""
        with self._cond:
            return bool(self.resource_version) and not self._stop.is_set()

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def _idle_left(self) -> float:
        return self.last_used + self.settings.idle_seconds - time.monotonic()

    # -- use by the store -----------------------------------------------------------------------

    def usable(self) -> bool:
        with self._cond:
            return self.synced and not self._stop.is_set() and time.monotonic() >= self._distrust_until

    def wait_synced(self, timeout: float) -> bool:
        """True when the cache is usable, waiting up to ``timeout`` only while it is starting
        (a failing informer answers False at once: the verb then Lists, as without a cache)."""
        end = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while True:
                if self._stop.is_set() or time.monotonic() < self._distrust_until:
                    return False
                if self.synced:
                    return True
                left = end - time.monotonic()
                if self._failing or left <= 0:
                    return False
                self._cond.wait(left)

    def attachment_lock(self, attachment: Hashable) -> threading.Lock:
        """Serialises the daemon's ADD/DEL of one attachment (striped: memory stays bounded)."""
        return self._locks[hash(attachment) % LOCK_STRIPES]

    def used(self, version: int) -> list[int]:
        """The sorted addresses (as ints) of ``version`` that some Lease (or a 409) holds."""
        with self._cond:
            return list(self._used[version])

    def used_within(self, version: int, spans: Sequence[tuple[int, int]], pending: bool = True) -> list[int]:
        """The sorted addresses of ``version`` within the sorted, disjoint ``spans`` (inclusive
        ints) that some Lease (or a 409) holds, and (``pending``) that this process is creating
        right now: what a search confined to those spans needs of :meth:`used` and
        :meth:`pending`, read in O(log n + found) per span instead of a copy of every claim."""
        out: list[int] = []
        with self._cond:
            values = self._used.get(version, [])
            for lo, hi in spans:
                out.extend(values[bisect.bisect_left(values, lo):bisect.bisect_right(values, hi)])
            extra = [v for fam, v in self._pending if fam == version
                     and any(lo <= v <= hi for lo, hi in spans)] if pending and self._pending else []
        if extra:
            out = sorted(set(out).union(extra))
        return out

    def count_used(self, version: int, lo: int, hi: int) -> int:
        """How many addresses of ``version`` in ``[lo, hi]`` some Lease (or a 409) holds."""
        with self._cond:
            values = self._used.get(version, [])
            return bisect.bisect_right(values, hi) - bisect.bisect_left(values, lo)

    def open_blocks(self) -> list[Any]:
        """The blocks (:meth:`blocks`) with at least one address no Lease (nor a 409) holds, as far
        as the cache knows: a block left out is full, so a search for a free address of the
        node's blocks may pass it over. Kept incrementally (O(1) per event), read in O(open)."""
        with self._cond:
            return [self._blocks[n] for n in self._open]

    def open_window(self, version: int, value: Optional[int], count: int) -> tuple[list[Any], bool]:
        """``count`` open blocks (:meth:`open_blocks`) of ``version`` in address order, from the
        one holding ``value`` or the next after it (None: from the lowest), going on from the
        lowest past the highest; and whether they are all the open blocks. A search for the
        next free address after ``value`` that finds one after ``value`` in them (or any one,
        from the lowest when ``value`` is None), or none when the flag is set, has the answer a
        search of all the open blocks has: at O(count + log open) per ADD however many blocks
        the node holds (a plan gives a node thousands of empty ones)."""
        with self._cond:
            order = self._open_order.get(version, [])
            if not order:
                return [], True
            i = 0
            if value is not None:
                i = bisect.bisect_left(order, (value - self._widest.get(version, 1) + 1, ""))
                while i < len(order) and order[i][0] + self._blocks[order[i][1]].size <= value:
                    i += 1
            n = min(count, len(order))
            names = [order[(i + k) % len(order)][1] for k in range(n)]
            return [self._blocks[name] for name in names], n == len(order)

    def empty_blocks(self) -> list[Any]:
        """The blocks none of whose addresses a Lease (or a 409) holds, as far as the cache knows."""
        with self._cond:
            return [self._blocks[n] for n in self._open if self._fill[n] == 0]

    def blocks_at(self, version: int, value: int) -> list[Any]:
        """The blocks of ``version`` that contain the address ``value`` (one, unless the block size
        of the domain was changed while blocks of the old size were held)."""
        with self._cond:
            return [self._blocks[name] for name in self._containing(version, value)]

    def latest(self) -> dict[str, Any]:
        """Per range, the most recently made claim seen (it may be gone since: it is a position)."""
        with self._cond:
            return dict(self._latest)

    def choose(self, version: int, pick: Callable[[list[int]], Optional[int]]) -> Optional[int]:
        """``pick(pending)`` under a lock, ``pending`` being the sorted addresses of ``version``
        that this process is creating right now; the address it returns is pending until
        :meth:`done`. ADDs that start from one round-robin cursor at once take distinct candidates."""
        with self._choosing:
            with self._cond:
                pending = sorted(value for fam, value in self._pending if fam == version)
            value = pick(pending)
            if value is not None:
                with self._cond:
                    self._pending.add((version, value))
            return value

    def done(self, version: int, value: int) -> None:
        """The create of ``value`` has an answer (written through): no longer pending."""
        with self._cond:
            self._pending.discard((version, value))

    def blocks(self) -> list[Any]:
        """The block Leases the List/Watch (or our own writes) show."""
        with self._cond:
            return list(self._blocks.values())

    def pending(self, version: int) -> list[int]:
        """The addresses of ``version`` this process is creating right now."""
        with self._cond:
            return sorted(value for fam, value in self._pending if fam == version)

    def claims_of(self, attachment: Hashable) -> list[Any]:
        with self._cond:
            names = self._by_attachment.get(attachment, ())
            return [self._entries[n].claim for n in names]

    def claims(self) -> list[Any]:
        """Every claim the cache holds (placeholders of a 409 left out)."""
        with self._cond:
            return [e.claim for e in self._entries.values() if e.claim is not None]

    def entry(self, name: str) -> Optional[Entry]:
        with self._cond:
            return self._entries.get(name)

    def size(self) -> int:
        with self._cond:
            return len(self._entries)

    def suspect(self) -> None:
        """The watch did not deliver a write in time: stop trusting the cache for a while and
        re-open the watch (a silently stalled stream would otherwise stay open)."""
        self.stats["echo_misses"] += 1
        with self._cond:
            self._distrust_until = time.monotonic() + self.settings.distrust_seconds
            stream = self._stream
        if stream is not None:
            stream.abort()

    def wait_confirmed(self, writes: Iterable[tuple], timeout: float) -> bool:
        """Wait until the List/Watch has confirmed each (name, uid) we wrote, or its deletion;
        (name, uid, resourceVersion): that very version (an update keeps the uid)."""
        writes = list(writes)
        end = time.monotonic() + max(0.0, timeout)

        def done() -> bool:
            for name, uid, *rv in writes:
                e = self._entries.get(name)
                if self._dead.get(uid):
                    continue
                if e is None or e.uid != uid or not e.confirmed:
                    return False
                if rv and rv[0] and getattr(e.claim, "resource_version", "") != rv[0]:
                    return False
            return True

        with self._cond:
            while not done():
                left = end - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._cond.wait(left)
            return True

    def wait_deleted(self, uids: Iterable[str], timeout: float) -> bool:
        """Wait until the List/Watch has confirmed the deletion of each UID."""
        uids = list(uids)
        end = time.monotonic() + max(0.0, timeout)
        with self._cond:
            while not all(self._dead.get(u) for u in uids):
                left = end - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._cond.wait(left)
            return True

    # -- write-through (the store's own answers) -------------------------------------------------

    def created(self, claim: Any) -> None:
        """Our create succeeded."""
        with self._cond:
            if claim.uid in self._dead:
                return
            e = self._entries.get(claim.name)
            if e is not None and e.uid == claim.uid and e.confirmed:
                return
            self._put(Entry(claim.name, claim.ip, claim, claim.uid, False))

    def updated(self, claim: Any) -> None:
        """Our update (a block record claimed or freed) succeeded: this version, until the watch confirms it."""
        with self._cond:
            if claim.uid in self._dead:
                return
            e = self._entries.get(claim.name)
            if e is not None and e.uid == claim.uid and e.confirmed and \
                    getattr(e.claim, "resource_version", None) == claim.resource_version:
                return  # the watch delivered this very version first
            self._put(Entry(claim.name, claim.ip, claim, claim.uid, False))

    def observed(self, claim: Any) -> None:
        """A GET (or a selective List) returned this Lease just now."""
        with self._cond:
            if claim.uid in self._dead:
                return
            e = self._entries.get(claim.name)
            if e is not None and e.uid and e.uid != claim.uid:
                self._kill(e.uid, False)  # the name holds another UID now: the old one is gone
                e = None
            self._put(Entry(claim.name, claim.ip, claim, claim.uid, e is not None and e.confirmed))

    def absent(self, name: str, uid: str = "") -> None:
        """A GET or delete of ``name`` answered 404 just now; ``uid``: the incarnation the request
        was about ("" when it named none). Only that UID is known dead: the name may hold a newer
        claim by now (written through, or delivered by the watch, while the request was in
        flight), and marking that one dead would hide it for good (its events are ignored)."""
        with self._cond:
            e = self._entries.get(name)
            if e is None:
                return
            if uid and e.uid == uid:
                self._kill(uid, False)
                self._drop(name)
            elif not e.uid:
                self._drop(name)  # a placeholder (a 409 told us it was taken): it is not, now

    def deleted(self, claim: Any) -> None:
        """Our delete (with preconditions on this UID) succeeded."""
        with self._cond:
            self._kill(claim.uid, False)
            e = self._entries.get(claim.name)
            if e is not None and e.uid == claim.uid:
                self._drop(claim.name)

    def taken(self, name: str, ip: Any) -> None:
        """A create met 409: the name is held, by whom the watch will tell."""
        with self._cond:
            if name not in self._entries:
                self._put(Entry(name, ip, None, "", False))
                self._placeholders.add(name)

    # -- internals (call with the condition held) ------------------------------------------------

    def _forget_placeholders(self) -> None:
        """Drop what 409s marked taken: a name the watch does not select (another node's claim
        or block record) never has an event to replace its placeholder, which would keep the
        address taken in this view after it is freed. So a placeholder lasts until the watch
        (re)opens; a name the watch selects comes back with its event."""
        for name in self._placeholders:
            e = self._entries.get(name)
            if e is not None and not e.uid:
                self._drop(name)
        self._placeholders.clear()

    def _kill(self, uid: str, confirmed: bool) -> None:
        if not uid:
            return
        self._dead[uid] = confirmed or self._dead.get(uid, False)
        self._dead.move_to_end(uid)
        while len(self._dead) > DEAD_UIDS:
            self._dead.popitem(last=False)

    def _put(self, entry: Entry) -> None:
        old = self._entries.get(entry.name)
        if old is not None:
            self._unindex(old)
        # a block record (a claim labelled with its block owner) is a block as long as it exists,
        # and a used address only while it names an attachment
        block = _record_block(entry.claim)
        if block is not None:
            if entry.name not in self._blocks:
                self._index_block(block)
            self._blocks[entry.name] = block
        else:
            gone = self._blocks.pop(entry.name, None)
            if gone is not None:
                self._unindex_block(gone)
        was, now = old is not None and _occupies(old), _occupies(entry)
        if now and not was:
            values = self._used.setdefault(entry.ip.version, [])
            value = int(entry.ip)
            i = bisect.bisect_left(values, value)
            if i == len(values) or values[i] != value:
                values.insert(i, value)
                self._count(entry.ip.version, value, 1)
        elif was and not now:
            self._unuse(entry.ip)
        self._entries[entry.name] = entry
        who = getattr(entry.claim, "attachment", None)
        if who is not None:
            self._by_attachment.setdefault(who, set()).add(entry.name)
        self._note_latest(entry.claim)
        self._cond.notify_all()

    def _note_latest(self, claim: Any) -> None:
        when, where = getattr(claim, "time", None), getattr(claim, "range", "")
        if when is None or not where:
            return
        best = self._latest.get(where)
        if best is None or (when, int(claim.ip)) > (best.time, int(best.ip)):
            self._latest[where] = claim

    def _unindex(self, entry: Entry) -> None:
        who = getattr(entry.claim, "attachment", None)
        if who is not None:
            names = self._by_attachment.get(who)
            if names is not None:
                names.discard(entry.name)
                if not names:
                    del self._by_attachment[who]

    def _drop(self, name: str) -> None:
        old = self._entries.pop(name, None)
        if old is None:
            return
        block = self._blocks.pop(name, None)
        if block is not None:
            self._unindex_block(block)
        self._unindex(old)
        if _occupies(old):
            self._unuse(old.ip)
        self._cond.notify_all()

    def _unuse(self, ip: Any) -> None:
        values = self._used.get(ip.version, [])
        value = int(ip)
        i = bisect.bisect_left(values, value)
        if i < len(values) and values[i] == value:
            del values[i]
            self._count(ip.version, value, -1)

    # The block index: ``_spans`` finds the blocks containing an address by bisection (blocks are
    # aligned runs of a power-of-two size, so two of them either nest or do not meet; nesting only
    # happens when a domain's block size was changed, and ``_widest`` bounds the look back then);
    # ``_fill`` counts each block's addresses in ``_used``; ``_open`` holds the blocks not full.

    def _containing(self, version: int, value: int) -> Iterable[str]:
        spans = self._spans.get(version, ())
        i = bisect.bisect_right(spans, (value, math.inf)) - 1
        reach = value - self._widest.get(version, 1)
        while i >= 0 and spans[i][0] > reach:
            if spans[i][1] >= value:
                yield spans[i][2]
            i -= 1

    def _count(self, version: int, value: int, delta: int) -> None:
        for name in self._containing(version, value):
            fill = self._fill[name] + delta
            self._fill[name] = fill
            self._set_open(self._blocks[name], fill < self._blocks[name].size)

    def _index_block(self, block: Any) -> None:
        version, first = block.ip.version, int(block.ip)
        last = first + block.size - 1
        bisect.insort(self._spans.setdefault(version, []), (first, last, block.name))
        self._widest[version] = max(self._widest.get(version, 1), block.size)
        values = self._used.get(version, [])
        fill = bisect.bisect_right(values, last) - bisect.bisect_left(values, first)
        self._fill[block.name] = fill
        self._set_open(block, fill < block.size)

    def _unindex_block(self, block: Any) -> None:
        spans = self._spans.get(block.ip.version, [])
        key = (int(block.ip), int(block.ip) + block.size - 1, block.name)
        i = bisect.bisect_left(spans, key)
        if i < len(spans) and spans[i] == key:
            del spans[i]
        self._fill.pop(block.name, None)
        self._set_open(block, False)

    def _set_open(self, block: Any, is_open: bool) -> None:
        """``block`` in ``_open`` (and ``_open_order``) or not."""
        name = block.name
        if is_open == (name in self._open):
            return
        order = self._open_order.setdefault(block.ip.version, [])
        key = (int(block.ip), name)
        if is_open:
            self._open.add(name)
            bisect.insort(order, key)
            return
        self._open.discard(name)
        i = bisect.bisect_left(order, key)
        if i < len(order) and order[i] == key:
            del order[i]

    def _apply(self, kind: str, obj: Any) -> None:
        md = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(md, dict):
            return
        rv = str(md.get("resourceVersion") or "")
        name = str(md.get("name") or "")
        uid = str(md.get("uid") or "")
        claim = self.parse(obj) if kind != "DELETED" else None
        with self._cond:
            if rv:
                self.resource_version = rv
            self.stats["events"] += 1
            if kind == "DELETED":
                self._kill(uid, True)
                e = self._entries.get(name)
                if e is not None and (e.uid == uid or not e.uid):
                    self._drop(name)
                self._cond.notify_all()
                return
            if claim is None or uid in self._dead:
                return
            e = self._entries.get(name)
            if e is not None and not e.confirmed and e.uid and e.uid != uid:
                return  # an older incarnation of a name we have written since
            self._put(Entry(name, claim.ip, claim, uid, True))

    def _replace(self, parsed: list[Any], rv: str) -> None:
        with self._cond:
            listed = {c.uid for c in parsed}
            for uid, confirmed in list(self._dead.items()):
                if not confirmed and uid not in listed:
                    self._dead[uid] = True  # a fresh List without it: its deletion is confirmed
            self._entries.clear()
            self._placeholders.clear()
            self._by_attachment.clear()
            self._blocks.clear()
            self._used = {4: [], 6: []}
            self._spans = {4: [], 6: []}
            self._fill.clear()
            self._open.clear()
            self._open_order = {4: [], 6: []}
            for c in parsed:
                if c.uid in self._dead:
                    continue
                self._entries[c.name] = Entry(c.name, c.ip, c, c.uid, True)
                block = _record_block(c)
                if block is not None:
                    self._blocks[c.name] = block
                if c.attachment is not None:
                    self._by_attachment.setdefault(c.attachment, set()).add(c.name)
                elif block is not None:
                    continue  # a free block record: its address is not used
                self._used.setdefault(c.ip.version, []).append(int(c.ip))
                self._note_latest(c)
            for values in self._used.values():
                values.sort()
            for block in self._blocks.values():
                self._index_block(block)
            self.resource_version = rv
            self._cond.notify_all()

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.0
        need_list = True
        gone_in_row = 0
        try:
            while not self._stop.is_set():
                if self._idle_left() <= 0:
                    log.debug("%s: idle for %g s: stopping", self.name, self.settings.idle_seconds)
                    break
                if backoff and self._stop.wait(backoff):
                    break
                try:
                    if need_list:
                        self._list()
                        need_list = False
                        if self._stop.is_set():
                            break
                    self._watch()
                except Gone as exc:
                    backoff, gone_in_row = self._after_gone(exc, gone_in_row)
                    need_list = True
                except Broken as exc:
                    backoff, gone_in_row = self._after_broken(exc, backoff, gone_in_row)
                except Exception as exc:  # noqa: BLE001 - any failure: back off and try again
                    if self._stop.is_set():
                        break
                    backoff = self._after_error(exc, backoff)
                else:
                    backoff, gone_in_row = 0.0, 0
        finally:
            self._finish()

    def _after_gone(self, exc: Gone, gone_in_row: int) -> tuple[float, int]:
        """The history the watch needed is gone (410): List again, after a delay. Every daemon of
        the cluster meets the 410 at once after an API server restart or compaction: their
        re-Lists are spread (jittered) and back off while 410s keep coming. Meanwhile verbs use
        the state as a hint (kube.py). (backoff, 410s in a row)."""
        gone_in_row += 1
        backoff = relist_delay(gone_in_row)
        self.stats["relists"] += 1
        telemetry.watch_restart("expired")
        self.stats["relist_wait"] = self.stats.get("relist_wait", 0.0) + backoff
        log.info("%s: %s: listing again in %.1f s", self.name, exc, backoff)
        with self._cond:
            self.synced = False
        return backoff, gone_in_row

    def _after_broken(self, exc: Broken, backoff: float, gone_in_row: int) -> tuple[float, int]:
        """The stream broke: the state up to resource_version stands, so watch again from there
        (at once, unless streams keep breaking as soon as they open). (backoff, 410s in a row)."""
        gone_in_row = 0 if exc.lasted >= RELIST_BASE else gone_in_row
        with self._cond:
            self.synced = False  # not trusted until a stream is open again (a hint meanwhile)
        log.debug("%s: %s", self.name, exc)
        self.stats["errors"] += 1
        telemetry.watch_restart("broken")
        quick = exc.lasted < 1.0
        return (min(BACKOFF_CAP, max(BACKOFF_BASE, backoff * 2)) * random.uniform(0.8, 1.2) if quick else 0.0), gone_in_row

    def _after_error(self, exc: Exception, backoff: float) -> float:
        """Any other failure (the API refused, unreachable): not trusted, back off; the next backoff."""
        self.stats["errors"] += 1
        telemetry.watch_restart("error")
        backoff = min(BACKOFF_CAP, max(BACKOFF_BASE, backoff * 2)) * random.uniform(0.8, 1.2)
        level = logging.WARNING if isinstance(exc, Failed) and exc.status in (401, 403) else logging.INFO
        log.log(level, "%s: %s; retrying in %.1f s%s", self.name, exc, backoff,
                " (grant list and watch on leases.coordination.k8s.io)"
                if isinstance(exc, Failed) and exc.status == 403 else "")
        with self._cond:
            self.synced = False
            self._failing = True
            self._cond.notify_all()
        return backoff

    def _finish(self) -> None:
        """The thread ends: nothing is trusted any more, and the registry forgets the informer."""
        with self._cond:
            self.synced = False
            self._stream = None
            self._cond.notify_all()
        self._stop.set()
        if self.on_exit is not None:
            self.on_exit(self)

    def _list(self) -> None:
        """List the domain page by page (only one page's JSON held at once: the parsed claims are
        kept), then replace the cache's state; a continue token that expired (410) starts over."""
        items: list[Any] = []
        cont, rv, restarts = "", "", 0
        while True:
            query = [("labelSelector", self.selector), ("limit", str(PAGE_SIZE))]
            if cont:
                query.append(("continue", cont))
            resp = self.transport.request("GET", self.path, query, None, self.settings.request_timeout)
            self.stats["lists"] += 1
            if resp.status == 410 and cont and restarts < 3:
                items, cont, restarts = [], "", restarts + 1  # the continue token expired: start over
                continue
            if resp.status != 200 or not isinstance(resp.doc, dict):
                raise Failed(resp.status, _message(resp.doc))
            items.extend(c for c in (self.parse(item) for item in resp.doc.get("items") or []) if c is not None)
            md = resp.doc.get("metadata") or {}
            if not cont:
                rv = str(md.get("resourceVersion") or "")
            cont = md.get("continue") or ""
            if not cont:
                break
            if self._stop.is_set():
                return
        if not rv:
            raise Failed(200, "the List carried no resourceVersion to watch from")
        self._replace(items, rv)

    def _watch(self) -> None:
        left = self._idle_left()
        span = min(self.settings.watch_timeout * random.uniform(0.8, 1.0), max(1.0, left + 1.0))
        seconds = max(1, math.ceil(span))
        query = [("labelSelector", self.selector), ("watch", "true"), ("resourceVersion", self.resource_version),
                 ("allowWatchBookmarks", "true"), ("timeoutSeconds", str(seconds))]
        stream = self.transport.watch(self.path, query, seconds + READ_GRACE)
        self.stats["watches"] += 1
        if stream.status == 410:
            stream.close()
            raise Gone(f"HTTP 410 {_message(stream.doc)}".rstrip())
        if stream.status != 200:
            stream.close()
            raise Failed(stream.status, _message(stream.doc))
        opened = time.monotonic()
        with self._cond:
            self._forget_placeholders()
            self._stream = stream
            self.synced = True
            self._failing = False
            self._cond.notify_all()
        try:
            if self._stop.is_set():
                return
            for event in _read(stream, opened, self._stop):
                if not isinstance(event, dict):
                    continue
                kind, obj = event.get("type"), event.get("object")
                if kind == "ERROR":
                    code = obj.get("code") if isinstance(obj, dict) else None
                    if code == 410:
                        raise Gone(_message(obj) or "410 Gone")
                    raise Failed(code if isinstance(code, int) else 0, _message(obj))
                if kind == "BOOKMARK":
                    rv = ((obj or {}).get("metadata") or {}).get("resourceVersion") if isinstance(obj, dict) else None
                    if rv:
                        with self._cond:
                            self.resource_version = str(rv)
                    continue
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._apply(kind, obj)
                if self._stop.is_set():
                    return
        finally:
            with self._cond:
                self._stream = None
            stream.close()


def _record_block(claim: Any) -> Any:
    """The block a claim Lease records (a block record; ``claim.as_block()``), else None."""
    return claim.as_block() if getattr(claim, "block", "") else None


def _occupies(entry: Entry) -> bool:
    """Whether an entry holds its address: a claim or a 409 placeholder does; a block record
    only while it names an attachment."""
    c = entry.claim
    return c is None or not getattr(c, "block", "") or getattr(c, "attachment", None) is not None


def relist_delay(in_row: int) -> float:
    """Seconds before the ``in_row``-th re-List in a row after a 410: half of an exponentially
    growing step (``RELIST_BASE`` doubling up to ``RELIST_CAP``) plus a random part of the other
    half, so that thousands of daemons meeting one 410 spread their Lists."""
    step = min(RELIST_CAP, RELIST_BASE * 2 ** max(0, in_row - 1))
    return step / 2 + random.uniform(0.0, step / 2)


def _read(stream: Any, opened: float, stop: threading.Event) -> Iterable[Any]:
    """The stream's events; a failure while reading becomes :class:`Broken` (none after a stop)."""
    events = iter(stream.events())
    while True:
        try:
            event = next(events)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - transport errors of any kind
            if stop.is_set():
                return
            raise Broken(time.monotonic() - opened, f"{type(exc).__name__}: {exc}") from None
        yield event


def _message(doc: Any) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("message"), str):
        return doc["message"]
    return ""


# -- the process-wide registry ----------------------------------------------------------------------

_settings = Settings()
_enabled = False
_informers: "OrderedDict[tuple, LeaseCache]" = OrderedDict()
_lock = threading.Lock()
_owners: dict[Hashable, Any] = {}  # connection key -> the API client its last verb got from connect()
_swept = [0.0]  # when the registry was last swept for stopped or idle informers
SWEEP_SECONDS = 1.0


def enable(on: bool = True, **settings: Any) -> None:
    """Turn the cache on (the daemon) or off (stops every informer). ``settings`` override
    :class:`Settings` fields for informers started from now on (tests use short ones)."""
    global _enabled, _settings
    with _lock:
        _enabled = on
        _settings = replace(Settings(), **settings) if settings else Settings()
        stopped = list(_informers.values()) if not on else []
        if not on:
            _informers.clear()
            _owners.clear()
    for inf in stopped:
        inf.stop()
    for inf in stopped:
        inf.join(2.0)


def enabled() -> bool:
    return _enabled


def settings() -> Settings:
    return _settings


def informers() -> list[LeaseCache]:
    with _lock:
        return list(_informers.values())


def peek(connection_key: Hashable, domain_key: Hashable) -> Optional[LeaseCache]:
    """The running informer for (connection, domain), or None; unlike :func:`informer` it does
    not count as a use (a reader such as a metrics scrape must not keep an idle watch alive)."""
    with _lock:
        inf = _informers.get((connection_key, domain_key))
    return inf if inf is not None and inf.alive else None


def informer(connection_key: Hashable, domain_key: Hashable, owner: Any, make: Callable[[Settings], LeaseCache],
             start: bool = True, transport: Optional[Callable[[], Any]] = None) -> Optional[LeaseCache]:
    """The informer for (connection, domain); started with ``make`` when ``start`` and none runs.

    ``owner`` is the API client the caller got from ``connect()`` for ``connection_key`` (the
    kubeconfig path, API root and namespace setting): an informer of that key built on another
    client belongs to a rotated-away credential. With ``transport`` (a transport over ``owner``)
    it is rebound in place (:meth:`LeaseCache.rebind`: its watch and state stay); without, it
    is stopped.
    """
    if not _enabled:
        return None
    stopped = []
    rebound = None
    with _lock:
        now = time.monotonic()
        # Every informer is looked at (O(informers): once per verb that would be O(nodes) per verb
        # in the scale simulation, which runs 5,000 nodes' informers in one process) when the
        # connection's client changed (a rotation: rebind that connection's informers) and at most
        # every SWEEP_SECONDS (stopped or idle ones); otherwise only the one asked for.
        key = (connection_key, domain_key)
        rotated = _owners.get(connection_key, owner) is not owner
        _owners[connection_key] = owner
        if rotated or now - _swept[0] >= SWEEP_SECONDS:
            _swept[0] = now
            looked = list(_informers.items())
        else:
            looked = [(key, _informers[key])] if key in _informers else []
        for key_, inf in looked:
            stale = key_[0] == connection_key and inf.owner is not owner
            if stale and transport is not None and inf.alive:
                if rebound is None:
                    rebound = transport()
                inf.rebind(rebound, owner)
                stale = False
            if stale or not inf.alive or now - inf.last_used >= inf.settings.idle_seconds:
                del _informers[key_]
                stopped.append(inf)
        inf = _informers.get(key)
        if inf is None and start:
            inf = make(_settings)
            inf.on_exit = _forget
            _informers[key] = inf
            inf.start()
            while len(_informers) > max(1, _settings.max_informers):
                _, old = _informers.popitem(last=False)
                stopped.append(old)
        if inf is not None:
            _informers.move_to_end(key)
            inf.touch()
    for old in stopped:
        old.stop()
    return inf


def _forget(inf: LeaseCache) -> None:
    with _lock:
        for key, other in list(_informers.items()):
            if other is inf:
                del _informers[key]
