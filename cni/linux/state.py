"""Per-attachment state files: everything a DEL needs to undo an ADD, kept on disk.

One JSON file per (network, containerID, ifname) under a 0700 directory, written 0600 through a
temp file, fsync and rename, so a reader sees the old or the new content, never half of one.
DEL and GC work from this file alone: after a daemon or node restart, with an empty CNI_NETNS,
and twice.
"""

from __future__ import annotations

import json
import os
from typing import Iterator, Optional

from cni.core.errors import IO_FAILURE, CNIError

from .files import atomic_write, remove_partial_writes


class StateDir:
    def __init__(self, root: str) -> None:
        self.root = root

    def key(self, network: str, container_id: str, ifname: str) -> str:
        # network names and container IDs match ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$; ifnames carry no '/'
        return f"{network}-{container_id}-{ifname}.json"

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def load(self, key: str) -> Optional[dict]:
        try:
            with open(self._path(key), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise CNIError(IO_FAILURE, f"cannot read state file {self._path(key)}: {exc}",
                           "inspect the file; remove it only after undoing the attachment by hand") from None

    def save(self, key: str, data: dict) -> None:
        try:
            atomic_write(self._path(key), json.dumps(data, indent=1, sort_keys=True).encode())
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

    def entries(self) -> Iterator[tuple[str, dict]]:
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(".json") and not name.startswith("."):
                data = self.load(name)
                if data is not None:
                    yield name, data
