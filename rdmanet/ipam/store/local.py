"""The embedded file store: one file per address, an attachment index, a flock, crash-safe ordering.

Layout under ``<dataDir>/<domain>/`` (directories 0700, files 0600)::

    lock                         flock'ed for the whole of every operation (rdmanet.cni.linux.flock)
    <ip>                         one per reserved address (``10.1.1.5``, ``fd00::5``), created
                                 O_EXCL; JSON {containerID, ifname, network, time}
    last_reserved.<i>            round-robin cursor of range set i: the last address picked
    attachments/<cid>:<ifname>   index per attachment (``sha256-<hex>`` when the name is too
                                 long); JSON {containerID, ifname, network, time, addresses}
    .tmp.*                       temp files of atomic writes; garbage once no one holds the lock

Why no kill (SIGKILL of the plugin or the daemon at any instant) can give an address twice or
leak one (a power loss ends every attachment of the node: files.py says why nothing is fsynced):
1. ADD writes the index first, as an intent listing every address it is about to create.
   Address files are created afterwards with O_EXCL (a name exists at most once), their content
   written before ADD answers.
2. An address file is removed only (a) by DEL/GC of the attachment its content names, or
   (b) when it is empty or a torn write of ours: DEL/GC of an attachment whose index lists it, any GC,
   the repeat ADD of that attachment, or an ADD that requests exactly that address. (b) is
   safe: every writer holds the lock from create to write, so under the lock such a file is
   the claim of a crashed ADD, which never answered: the address was never handed out.
3. So after a crash at any point, every address file the crashed ADD made is listed in its
   index: a later DEL or GC of that attachment removes it, and a repeat ADD adopts a complete
   one and reclaims an empty one.
4. Nothing else under the directory is ever removed: a file in no format of ours (another
   IPAM's, such as host-local's ``<containerID>\r\n<ifname>`` when ``dataDir`` points at its
   directory) is left alone and its address is never handed out (files.FOREIGN).
The cursor is overwritten in place (files.overwrite_padded), without fsync or rename: losing or
tearing it only changes where round-robin resumes.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from bisect import insort
from contextlib import ExitStack, contextmanager
from datetime import datetime, timezone
from typing import Any, Iterator, Mapping, Optional, Sequence

from rdmanet.cni.core.errors import (
    ADDRESS_UNAVAILABLE,
    IO_FAILURE,
    NOT_AVAILABLE,
    POOL_EXHAUSTED,
    TRY_AGAIN_LATER,
    CNIError,
)
from rdmanet.cni.linux.flock import LockTimeout, exclusive

from ..ranges import IPAddress, RangeSet
from .. import telemetry
from .base import Attachment, Reservation, Store, Usage, place_held, refuse_other_request
from .files import (
    FILE_MODE,
    GARBAGE,
    TMP_PREFIX,
    atomic_write,
    create_exclusive,
    encode,
    ensure_dir,
    overwrite_padded,
    sync_dir,
    read_bytes,
    read_json,
    remove,
)
from .layout import (
    CURSOR_PREFIX,
    INDEX_DIR,
    LOCK_NAME,
    address_name,
    index_name,
    listed_addresses,
    owner_of,
    reservations_of,
)

log = logging.getLogger("rdmanet.ipam")

# Seconds to wait for the lock, then TRY_AGAIN_LATER. An operation holds it for a few ms, but on an
# overloaded node (200 concurrent ADD execs on 2 busy cores) waits of 12 s were measured; kubelet
# gives a whole ADD 4 minutes and whereabouts 2.
LOCK_TIMEOUT = 60.0
# Bytes of a cursor file: an IPv6 address (at most 39 characters) and its newline, padded.
CURSOR_WIDTH = 48


class _Raced(Exception):
    """An address that looked free under the lock existed at create time (a writer ignoring the lock)."""

    def __init__(self, ip: IPAddress) -> None:
        super().__init__(str(ip))
        self.ip = ip


class LocalStore(Store):
    def __init__(self, data_dir: str, domain: str, *, lock_timeout: float = LOCK_TIMEOUT) -> None:
        self.root = os.path.join(data_dir, domain)
        self.index_dir = os.path.join(self.root, INDEX_DIR)
        self.lock_timeout = lock_timeout

    # -- plumbing ---------------------------------------------------------------------------

    def _addr_path(self, ip: IPAddress) -> str:
        return os.path.join(self.root, str(ip))

    def _index_path(self, attachment: Attachment) -> str:
        return os.path.join(self.index_dir, index_name(attachment))

    def _io_error(self, exc: OSError) -> CNIError:
        return CNIError(IO_FAILURE, f"lease-ipam store {self.root}: {exc.strerror or exc}",
                        "check that the store directory (ipam.dataDir) is on a writable, non-full local filesystem")

    @contextmanager
    def _locked(self, create: bool) -> Iterator[bool]:
        """Hold the domain's flock; yields False (without locking) when the store is absent and not to be made."""
        if not create and not os.path.isdir(self.root):
            yield False
            return
        with ExitStack() as stack:
            try:
                ensure_dir(self.root)
                ensure_dir(self.index_dir)
                waited = time.monotonic()
                stack.enter_context(exclusive(os.path.join(self.root, LOCK_NAME), self.lock_timeout, FILE_MODE))
                waited = time.monotonic() - waited
                if waited > 1.0:
                    log.info("waited %.1f s for the lock of %s", waited, self.root)
            except LockTimeout:
                raise CNIError(TRY_AGAIN_LATER, f"lease-ipam store {self.root} stayed locked for {self.lock_timeout:.0f} s",
                               "another IPAM operation holds the lock; retry") from None
            except OSError as exc:
                raise self._io_error(exc) from None
            try:
                yield True
            except OSError as exc:
                raise self._io_error(exc) from None

    def _claim(self, attachment: Attachment, network: str, now: str) -> dict:
        return {"containerID": attachment.container_id, "ifname": attachment.ifname, "network": network, "time": now}

    def _read_cursor(self, index: int) -> Optional[IPAddress]:
        try:
            return ipaddress.ip_address(read_bytes(os.path.join(self.root, f"{CURSOR_PREFIX}{index}"), 4096).decode().strip())
        except (OSError, ValueError):  # UnicodeDecodeError is a ValueError: a torn cursor only moves round-robin
            return None

    def _remove_if_ours(self, ip: IPAddress, attachment: Attachment) -> bool:
        """Remove an address file naming ``attachment`` or holding garbage (see rule 2 above)."""
        doc = read_json(self._addr_path(ip))
        if doc is GARBAGE or (doc is not None and owner_of(doc) == attachment):
            return remove(self._addr_path(ip))
        return False

    def _scan(self) -> list[tuple[IPAddress, Any]]:
        """Every address file with its parsed content (GARBAGE for an interrupted claim)."""
        out = []
        for name in os.listdir(self.root):
            ip = address_name(name)
            if ip is not None:
                doc = read_json(os.path.join(self.root, name))
                if doc is not None:
                    out.append((ip, doc))
        return out

    # -- allocate -----------------------------------------------------------------------------

    def allocate(self, attachment: Attachment, network: str, range_sets: Sequence[RangeSet],
                 requested: Mapping[int, IPAddress]) -> list[IPAddress]:
        with self._locked(create=True):
            surprises: set[IPAddress] = set()
            for _ in range(3):
                try:
                    return self._allocate_locked(attachment, network, range_sets, requested, surprises)
                except _Raced as raced:
                    log.warning("address %s appeared under the lock; is another writer ignoring %s?", raced.ip, self.root)
                    surprises.add(raced.ip)
        raise CNIError(TRY_AGAIN_LATER, f"lease-ipam store {self.root}: addresses kept appearing during ADD",
                       "something other than lease-ipam writes to the store directory; retry")

    def _probe(self, rs: RangeSet, avoid: set[IPAddress]) -> Optional[IPAddress]:
        """The next free address of ``rs`` after its cursor, checked against the directory."""
        cursor = self._read_cursor(rs.index)
        used = sorted(int(ip) for ip in avoid if ip.version == rs.family)
        while True:
            candidate = rs.next_free(used, cursor)
            if candidate is None:
                return None
            ip = rs.ranges[0].address(candidate)
            if not os.path.lexists(self._addr_path(ip)):
                return ip
            insort(used, candidate)

    def _held(self, attachment: Attachment, listed: list[IPAddress]) -> tuple[list[IPAddress], list[IPAddress]]:
        """Split the index's addresses into (held: claim names us, leftovers: interrupted claims)."""
        held, leftovers = [], []
        for ip in listed:
            doc = read_json(self._addr_path(ip))
            if doc is GARBAGE:
                leftovers.append(ip)
            elif doc is not None and owner_of(doc) == attachment:
                held.append(ip)
        return held, leftovers

    def _allocate_locked(self, attachment: Attachment, network: str, range_sets: Sequence[RangeSet],
                         requested: Mapping[int, IPAddress], surprises: set[IPAddress]) -> list[IPAddress]:
        index_path = self._index_path(attachment)
        old_index = read_json(index_path)
        listed = listed_addresses(old_index)
        held, leftovers = self._held(attachment, listed)
        if leftovers:  # our own interrupted claims (rule 2b): free them so they can be picked again
            for ip in leftovers:
                remove(self._addr_path(ip))
            sync_dir(self.root)

        plan, spare = place_held(held, range_sets, lambda ip: ip)  # spare: in no range set of this config
        new = self._plan_new(attachment, range_sets, requested, surprises, plan)
        final = [plan[rs.index] for rs in range_sets]
        if not new and not spare and listed == final and isinstance(old_index, dict):
            return final  # repeat ADD: already complete, nothing to write

        intent = self._claim_new(attachment, network, new, final + spare, index_path, old_index)
        if spare:
            for ip in spare:
                self._remove_if_ours(ip, attachment)
            sync_dir(self.root)
            atomic_write(self.index_dir, os.path.basename(index_path),
                         encode(dict(intent, addresses=[str(ip) for ip in final])))
        for rs, ip, picked in new:
            if picked:
                overwrite_padded(os.path.join(self.root, f"{CURSOR_PREFIX}{rs.index}"), f"{ip}\n", CURSOR_WIDTH)
        return final

    def _plan_new(self, attachment: Attachment, range_sets: Sequence[RangeSet], requested: Mapping[int, IPAddress],
                  surprises: set[IPAddress], plan: dict[int, IPAddress]) -> list[tuple[RangeSet, IPAddress, bool]]:
        """The addresses to claim for the range sets ``plan`` (what the attachment holds, filled in
        here) has none for: the requested one, else the next free one of the pool. (range set,
        address, picked from the pool) each."""
        new: list[tuple[RangeSet, IPAddress, bool]] = []
        for rs in range_sets:
            want = requested.get(rs.index)
            if rs.index in plan:
                refuse_other_request(attachment, rs, plan[rs.index], want)
                continue
            if want is not None:
                if self._adopted(attachment, want):
                    plan[rs.index] = want  # ours, though the index lost track of it: adopt
                    continue
                ip = want
            else:
                ip = self._probe(rs, set(plan.values()) | surprises)
                if ip is None:
                    raise CNIError(POOL_EXHAUSTED, f"no free address in range {rs.describe()}",
                                   "free addresses (DEL or GC attachments that are gone) or widen the range "
                                   "(range_start/range_end, or another ipRanges entry)")
            plan[rs.index] = ip
            new.append((rs, ip, want is None))
        return new

    def _adopted(self, attachment: Attachment, want: IPAddress) -> bool:
        """Whether the requested address is the attachment's already (True), or free to claim
        (False: a crashed ADD's claim on it is removed); 103 when another attachment holds it."""
        doc = read_json(self._addr_path(want))
        if doc is not None and owner_of(doc) == attachment:
            return True
        if doc is GARBAGE:  # a crashed ADD's claim, never handed out (rule 2b)
            remove(self._addr_path(want))
        elif doc is not None:
            holder = owner_of(doc) or f"a file lease-ipam did not write ({self._addr_path(want)})"
            raise CNIError(ADDRESS_UNAVAILABLE, f"requested address {want} is already reserved by {holder}",
                           "request a free address, or DEL the attachment that holds it (a store "
                           "directory shared with another IPAM, such as host-local's: give lease-ipam "
                           "a dataDir of its own)")
        return False

    def _claim_new(self, attachment: Attachment, network: str, new: list[tuple[RangeSet, IPAddress, bool]],
                   addresses: list[IPAddress], index_path: str, old_index: Any) -> dict:
        """The intent first (the index naming ``addresses``), then one address file per new
        address, created exclusively (rolled back when one exists or anything fails); the intent."""
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        intent = dict(self._claim(attachment, network, now), addresses=[str(ip) for ip in addresses])
        atomic_write(self.index_dir, os.path.basename(index_path), encode(intent))
        created: list[IPAddress] = []
        try:
            claim = encode(self._claim(attachment, network, now))
            for _, ip, _ in new:
                if not create_exclusive(self._addr_path(ip), claim):
                    raise _Raced(ip)
                created.append(ip)
            sync_dir(self.root)
        except BaseException:
            self._undo(created, index_path, old_index)
            raise
        return intent

    def _undo(self, created: list[IPAddress], index_path: str, old_index: Any) -> None:
        """Roll a failed ADD back: the new address files, then the index as it was."""
        for ip in created:
            remove(self._addr_path(ip))
        sync_dir(self.root)
        if isinstance(old_index, dict):
            atomic_write(self.index_dir, os.path.basename(index_path), encode(old_index))
        else:
            remove(index_path)
            sync_dir(self.index_dir)

    # -- release / find / list ----------------------------------------------------------------

    def release(self, attachment: Attachment) -> list[IPAddress]:
        with self._locked(create=False) as present:
            if not present:
                return []
            index_path = self._index_path(attachment)
            index = read_json(index_path)
            if index is None:
                return []
            if index is GARBAGE:  # only after a power loss: fall back to a scan for this attachment
                listed = [ip for ip, doc in self._scan() if owner_of(doc) == attachment]
            else:
                listed = listed_addresses(index)
            freed = [ip for ip in listed if self._remove_if_ours(ip, attachment)]
            if freed:
                sync_dir(self.root)
            remove(index_path)
            sync_dir(self.index_dir)
            return freed

    def find(self, attachment: Attachment) -> Optional[Reservation]:
        with self._locked(create=False) as present:
            if not present:
                return None
            index = read_json(self._index_path(attachment))
            if not isinstance(index, dict):
                return None
            held, _ = self._held(attachment, listed_addresses(index))
            return Reservation(attachment, str(index.get("network", "")), tuple(held), str(index.get("time", "")))

    def list(self) -> list[Reservation]:
        with self._locked(create=False) as present:
            if not present:
                return []
            return reservations_of(self._scan())

    # -- gc / status ----------------------------------------------------------------------------

    def gc(self, network: str, valid: set[Attachment]) -> list[Reservation]:
        freed: list[Reservation] = []
        with self._locked(create=False) as present:
            if not present:
                return []
            for name in os.listdir(self.index_dir):
                path = os.path.join(self.index_dir, name)
                if name.startswith(TMP_PREFIX):
                    remove(path)
                    continue
                index = read_json(path)
                who = owner_of(index)
                if index is GARBAGE:  # a torn index of ours: its address files are handled by the scan below
                    remove(path)
                    continue
                if who is None:  # not ours: left alone
                    continue
                if index.get("network") != network or who in valid:
                    continue
                ips = [ip for ip in listed_addresses(index) if self._remove_if_ours(ip, who)]
                remove(path)
                freed.append(Reservation(who, network, tuple(ips), str(index.get("time", ""))))
            orphans: dict[Attachment, list[IPAddress]] = {}
            for name in os.listdir(self.root):
                if name.startswith(TMP_PREFIX):
                    remove(os.path.join(self.root, name))
            for ip, doc in self._scan():
                who = owner_of(doc)
                if doc is GARBAGE:
                    remove(self._addr_path(ip))  # an interrupted ADD's claim: never handed out
                elif who is not None and doc.get("network") == network and who not in valid:
                    remove(self._addr_path(ip))
                    orphans.setdefault(who, []).append(ip)
            freed += [Reservation(who, network, tuple(ips)) for who, ips in sorted(orphans.items())]
            sync_dir(self.root)
            sync_dir(self.index_dir)
        for res in freed:
            for ip in res.addresses:
                telemetry.freed(telemetry.Freed(telemetry.CNI_GC, str(ip), network, res.attachment.container_id,
                                                res.attachment.ifname, None, None, None, None,
                                                f"not in {network}'s cni.dev/valid-attachments"))
        return freed

    def usage(self, range_sets: Sequence[RangeSet]) -> Usage:
        """The address files as they are, read without the lock (a count for metrics: an ADD
        running meanwhile may or may not be in it); nothing is created."""
        used: dict[int, list[int]] = {4: [], 6: []}
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            names = []
        for name in names:
            ip = address_name(name)
            if ip is not None:
                used[ip.version].append(int(ip))
        for values in used.values():
            values.sort()
        free = tuple(rs.count_free(used[rs.family]) for rs in range_sets)
        return Usage(tuple(rs.count_free([]) - f for rs, f in zip(range_sets, free)), free)

    def status(self, range_sets: Sequence[RangeSet]) -> list[int]:
        try:
            with self._locked(create=True):
                probe = os.path.join(self.root, f"{TMP_PREFIX}status.{os.getpid()}")
                fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
                try:
                    os.write(fd, b"ok\n")
                finally:
                    os.close(fd)
                    remove(probe)
                used: dict[int, list[int]] = {4: [], 6: []}
                for ip, _ in self._scan():
                    used[ip.version].append(int(ip))
                for values in used.values():
                    values.sort()
                return [rs.count_free(used[rs.family]) for rs in range_sets]
        except CNIError as err:
            raise CNIError(NOT_AVAILABLE, f"lease-ipam store {self.root} is unusable: {err.msg}", err.details) from None
