"""Two calls never work on one attachment or one device at once, and two pods never get the same
device: per-attachment and per-device locks, and an allocation record per device.

- **Locks** (flocks under ``<root>/locks``, rdmanet.cni.linux.attachment_lock): ADD, DEL and GC of one
  attachment hold its attachment lock for their whole run, so a DEL that arrives while its ADD is still running waits
  for that ADD to finish or give up (and undo). Whoever touches a device (ADD, DEL, GC, the undo of
  an interrupted ADD) holds its device lock. Order: attachment, then device, one of each at a
  time: no deadlock. Attachment locks are 256 stripes (files) chosen by a hash of the attachment,
  so that lock files do not pile up with every pod. Every wait is bounded by the call's deadline
  (:mod:`rdmanet.cni.core.deadline`): CNI error 11 when it passes.
- **Allocation record** (``<root>/devices/<device>.json``): which attachment holds the device,
  its netns path and that netns' identity (device and inode of the nsfs file), and a token
  unique to the ADD. ADD writes it *before* its first change to the device (intent) and removes
  it only when everything was undone, so a DEL or GC may touch the device only while the record
  carries its own state's token: a stale DEL (after a reboot, the pod that had the device is long
  gone and another holds it now) cleans up its own state and IPAM and leaves the device alone.
- A record is **stale** when its netns is no longer the one recorded (the path is gone, is a
  plain file left behind, or is a different, newer netns): a new ADD may take the device over.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from rdmanet.cni.core.errors import DEVICE_BUSY, IO_FAILURE, CNIError
from rdmanet.cni.linux import attachment_lock, netns
from rdmanet.cni.linux.files import atomic_write, remove_partial_writes

def _safe(key: str) -> str:
    return key.replace("/", "_")


@contextmanager
def held(root: str, key: str) -> Iterator[None]:
    """The device lock of ``key`` (DeviceRef.lock_key)."""
    with attachment_lock.locked(os.path.join(root, "locks", _safe(key) + ".lock"), f"device {key}"):
        yield


def attachment_held(root: str, attachment: str):
    """The attachment lock of ``attachment`` ("<network>/<containerID>/<ifname>")."""
    return attachment_lock.held(os.path.join(root, "locks"), attachment)


def _record_path(root: str, key: str) -> str:
    return os.path.join(root, "devices", _safe(key) + ".json")


def read_record(root: str, key: str) -> Optional[dict]:
    try:
        with open(_record_path(root, key), encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError:  # torn by a power loss (a kill cannot tear it): its holder died with the reboot
        return None
    return record if isinstance(record, dict) else None


def is_stale(record: dict) -> bool:
    """The holder's netns is no longer the one recorded at its ADD (gone, a leftover file, reused)."""
    return not netns.is_alive(record.get("netns", ""), record.get("netns_id"))


def refuse_if_allocated(root: str, key: str, attachment: str) -> Optional[dict]:
    """106 when another attachment with a live netns holds the device; returns a stale record
    of another attachment (None when the device is free or ours)."""
    record = read_record(root, key)
    if not record or record.get("attachment") == attachment:
        return None
    if not is_stale(record):
        raise CNIError(DEVICE_BUSY, f"device {key} is already allocated to {record.get('attachment')} (netns {record.get('netns')})",
                       "each device serves one pod: DEL that attachment first, or request another device")
    return record


def record_allocation(root: str, key: str, attachment: str, netns_path: str, netns_id: Optional[dict], token: str) -> None:
    """Claim the device for ``attachment`` (intent: before the first change to the device)."""
    doc = {"attachment": attachment, "netns": netns_path, "netns_id": netns_id, "token": token, "since": round(time.time(), 3)}
    try:
        atomic_write(_record_path(root, key), json.dumps(doc).encode(), durable=False)  # plugin.py: why no fsync
    except OSError as exc:
        raise CNIError(IO_FAILURE, f"cannot write the allocation record of device {key}: {exc}",
                       f"make {root} writable by root") from None


def owns(record: Optional[dict], token: str) -> bool:
    """Whether the attachment whose ADD had ``token`` may touch the device: the record carries it
    (an ADD claims before it acts: no record, nothing done)."""
    return record is not None and record.get("token") == token


def release_allocation(root: str, key: str, token: str) -> None:
    """Drop the record if it is still the one of the ADD that had ``token``."""
    if owns(read_record(root, key), token):
        try:
            os.unlink(_record_path(root, key))
        except FileNotFoundError:
            pass


def remove_partial_writes_of_record(root: str, key: str) -> None:
    """The temp files of record writes a kill cut short (the caller holds the device lock)."""
    remove_partial_writes(_record_path(root, key))
