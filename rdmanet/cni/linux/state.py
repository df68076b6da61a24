"""Per-attachment state files: everything a DEL needs to undo an ADD, kept on disk.

One JSON file per (network, containerID, ifname) under a 0700 directory, holding one record of
the caller's type (its ``to_dict`` / ``from_dict``), written 0600 through a temp file and a
rename (rdmanet.cni.linux.files.atomic_write), so a reader sees the old or the new content, never
half of one, and a writer killed at any instant leaves one or the other. DEL and GC work from
this file alone: after a daemon or node restart, with an empty CNI_NETNS, and twice.

A file that holds no record the caller can read (torn, or of another version: ``from_dict``
raises ValueError) is unreadable. ``durable=False`` skips the fsyncs: for a caller none of whose
attachments outlives a reboot (they live in pod netns), so that a power loss, the only way to a
torn file, leaves nothing for the file to describe. Such a directory reads an unreadable file as
no state (DEL then removes it); a durable one answers CNI error 5 (I/O failure), as such a file
there means someone edited it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Generic, Iterator, Optional, Protocol, TypeVar

from rdmanet.cni.core.errors import IO_FAILURE, CNIError

from .files import atomic_write, remove_partial_writes


log = logging.getLogger("rdmanet.state")
UNREADABLE = "inspect the file; remove it only after undoing the attachment by hand"


class Record(Protocol):
    def to_dict(self) -> dict: ...

    @classmethod
    def from_dict(cls, data: dict) -> "Record": ...


R = TypeVar("R", bound=Record)


class StateDir(Generic[R]):
    def __init__(self, root: str, record: type[R], durable: bool = True) -> None:
        self.root = root
        self.record = record
        self.durable = durable

    def key(self, network: str, container_id: str, ifname: str) -> str:
        # network names and container IDs match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$; ifnames carry no '/'
        return f"{network}-{container_id}-{ifname}.json"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def load(self, key: str) -> Optional[R]:
        path = self._path(key)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CNIError(IO_FAILURE, f"cannot read state file {path}: {exc}", UNREADABLE) from None
        except ValueError as exc:
            unreadable = f"cannot read state file {path}: {exc}"
        else:
            if not isinstance(data, dict):
                unreadable = f"state file {path} holds no JSON object"
            else:
                try:
                    return self.record.from_dict(data)
                except ValueError as exc:
                    unreadable = f"cannot read state file {path}: {exc}"
        if self.durable:
            raise CNIError(IO_FAILURE, unreadable, UNREADABLE)
        log.warning("%s: read as no state", unreadable)
        return None

    def save(self, key: str, record: R) -> None:
        try:
            atomic_write(self._path(key), json.dumps(record.to_dict(), indent=1, sort_keys=True).encode(),
                         durable=self.durable)
        except OSError as exc:
            raise CNIError(IO_FAILURE, f"cannot write state file {self._path(key)}: {exc}",
                           f"make {self.root} writable by root (the node policy's hostDeviceStateDir)") from None

    def remove(self, key: str) -> None:
        """Remove the state file, and the temp files of writes a kill cut short (the caller holds
        the attachment's lock)."""
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass
        remove_partial_writes(self._path(key))

    def entries(self) -> Iterator[tuple[str, R]]:
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(".json") and not name.startswith("."):
                data = self.load(name)
                if data is not None:
                    yield name, data
