"""Two pods never get the same device: a per-device lock and an allocation record.

Like sriov-cni: an flock per device (filelock) held across the whole ADD or DEL, and a record
of which attachment and netns hold the device. A record whose netns no longer exists is stale
and is replaced; one whose netns is alive refuses the ADD.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import Iterator

from filelock import FileLock, Timeout

from cni.core.errors import DEVICE_BUSY, TRY_AGAIN_LATER, CNIError
from cni.linux.files import atomic_write

LOCK_TIMEOUT = 60.0


def _safe(key: str) -> str:
    return key.replace("/", "_")


@contextmanager
def held(state_dir: str, key: str) -> Iterator[None]:
    directory = os.path.join(state_dir, "locks")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    lock = FileLock(os.path.join(directory, _safe(key) + ".lock"), timeout=LOCK_TIMEOUT)
    try:
        lock.acquire()
    except Timeout:
        raise CNIError(TRY_AGAIN_LATER, f"device {key} is locked by another CNI operation", "retry the operation") from None
    try:
        yield
    finally:
        lock.release()


def _record_path(state_dir: str, key: str) -> str:
    return os.path.join(state_dir, "devices", _safe(key) + ".json")


def _read(state_dir: str, key: str) -> dict | None:
    try:
        with open(_record_path(state_dir, key), encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return None


def refuse_if_allocated(state_dir: str, key: str, attachment: str) -> None:
    record = _read(state_dir, key)
    if not record or record.get("attachment") == attachment:
        return
    holder_netns = record.get("netns", "")
    if holder_netns and os.path.exists(holder_netns):
        raise CNIError(DEVICE_BUSY, f"device {key} is already allocated to {record.get('attachment')} (netns {holder_netns})",
                       "each device serves one pod: DEL that attachment first, or request another device")


def record_allocation(state_dir: str, key: str, attachment: str, netns_path: str) -> None:
    atomic_write(_record_path(state_dir, key), json.dumps({"attachment": attachment, "netns": netns_path}).encode())


def release_allocation(state_dir: str, key: str, attachment: str) -> None:
    record = _read(state_dir, key)
    if record is not None and record.get("attachment") == attachment:
        try:
            os.unlink(_record_path(state_dir, key))
        except FileNotFoundError:
            pass
