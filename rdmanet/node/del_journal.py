"""The daemon's replay of the DELs the shims journaled (:func:`rdmanet.node.launcher.journal_del`).

Why: Multus' thick plugin logs a failed delegate DEL and reports success, and CNI GC reaches
only the cluster network's delegate, so a DEL that failed while the daemon restarted (every
DaemonSet rollout) or while the API server was out would never be retried and its addresses
would stay claimed. The shim writes each failed DEL to ``<socket dir>/del-journal/``; this
module replays them: once when the daemon starts, then every ``interval`` seconds.

Rules:
- Only DELs are replayed, only of the plugins the daemon serves, only from a directory that is
  the daemon's own (owned by its user, not writable by group or others) and from regular files
  owned by its user: whoever could write there could already call the daemon.
- An entry is removed when its replay succeeds (DEL is idempotent: a DEL of something already
  gone succeeds), when it fails with an error no retry mends (an invalid config: code 1-4, 6,
  7), or when it is older than ``max_age`` (both logged: the node GC and the reconciler free
  what is left). A replay that fails otherwise (11: the API server is still out) keeps the entry
  for the next round.
- An ADD of the same attachment removes the entry before it runs (the shim does it), so a
  container re-added under the same ID (podman restart, cnitool) does not lose its addresses to
  an old DEL. The replay holds the entry's journal lock (:func:`rdmanet.node.launcher.journal_lock`,
  per plugin, container ID and interface) from its re-check of the entry (still there, still the
  one read) to the entry's removal after the DEL; the ADD removes the entry under the same lock.
  So an ADD either ran before the re-check (no DEL) or waits until the DEL is done.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from typing import Any, Callable, Mapping, Optional

from rdmanet.cni.core.ipam_exec import CRASH_HOOKS

from .launcher import JOURNAL_DIR, MAX_LINE, journal_lock

INTERVAL = 60.0
MAX_AGE = 24 * 3600.0
# CNI errors a retry cannot mend (incompatible version, unsupported field, unknown container,
# invalid config, decoding failure): dropped at once, logged
PERMANENT = {1, 2, 3, 4, 6, 7}

Serve = Callable[[str, dict, bytes], tuple]  # (plugin, env, stdin) -> (code, stdout, stderr)
Log = Callable[..., None]


def directory_of(socket_path: str) -> str:
    return os.path.join(os.path.dirname(socket_path), JOURNAL_DIR)


def _trusted_dir(directory: str, log: Log) -> bool:
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        log("del_journal_refused", "warning", directory=directory,
            why="not a directory of the daemon's own user, or writable by group/others")
        return False
    return True


def _read(path: str, log: Log) -> Optional[tuple[bytes, os.stat_result]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # gone meanwhile (an ADD removed it), or a symlink
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > MAX_LINE:
            log("del_journal_entry_refused", "warning", entry=path, why="not a regular file of the daemon's user, or too big")
            os.unlink(path)
            return None
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read(), st
    finally:
        if fd >= 0:
            os.close(fd)


def _same_entry(path: str, read: os.stat_result) -> bool:
    """Whether ``path`` is still the entry that was read (not removed by an ADD, nor re-written
    by a later DEL that failed: that one is replayed in its own round)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return (st.st_ino, st.st_mtime_ns, st.st_size) == (read.st_ino, read.st_mtime_ns, read.st_size)


def replay_once(directory: str, plugins: Mapping[str, Any], serve: Serve, parse: Callable, log: Log,
                now: Optional[float] = None, max_age: float = MAX_AGE) -> dict[str, int]:
    """Replay every entry once; returns counts of what happened."""
    import io

    counts = {"freed": 0, "failed": 0, "dropped": 0}
    if not _trusted_dir(directory, log):
        return counts
    now = time.time() if now is None else now
    for name in sorted(os.listdir(directory)):
        if name.startswith(".") or not name.endswith(".del"):
            continue  # a shim's temporary file
        path = os.path.join(directory, name)
        read = _read(path, log)
        if read is None:
            continue
        data, read_stat = read
        try:
            line, _, rest = data.partition(b"\n")
            _, plugin, env, stdin = parse(line, io.BytesIO(rest))
        except ValueError as exc:
            log("del_journal_entry_refused", "warning", entry=path, why=f"unreadable: {exc}")
            os.unlink(path)
            continue
        if plugin not in plugins or env.get("CNI_COMMAND") != "DEL" or any(h in env for h in CRASH_HOOKS):
            log("del_journal_entry_refused", "warning", entry=path, why="not a DEL of a plugin this daemon serves")
            os.unlink(path)
            continue
        lock = journal_lock(path)  # an ADD of the attachment now waits for this DEL, or ran before it
        try:
            if not _same_entry(path, read_stat):
                continue  # an ADD of the attachment removed it (or a newer DEL replaced it): not this DEL
            _replay(path, now - read_stat.st_mtime, plugin, env, stdin, serve, log, counts, max_age)
        finally:
            os.close(lock)
    return counts


def _replay(path: str, age: float, plugin: str, env: dict, stdin: bytes, serve: Serve, log: Log,
            counts: dict[str, int], max_age: float) -> None:
    """Serve one entry's DEL and remove the entry when it succeeded or can never succeed; the
    caller holds the entry's journal lock."""
    who = {"plugin": plugin, "container": env.get("CNI_CONTAINERID"), "ifname": env.get("CNI_IFNAME")}
    try:
        code, out, _ = serve(plugin, env, stdin)
    except Exception as exc:  # noqa: BLE001 - one entry must not stop the others; kept for the next round
        counts["failed"] += 1
        log("del_replay_error", "error", error=f"{type(exc).__name__}: {exc}", **who)
        return
    if code == 0:
        counts["freed"] += 1
        log("del_replayed", **who)
        _unlink(path)
    elif age > max_age or _error_code(out) in PERMANENT:
        counts["dropped"] += 1
        log("del_journal_entry_dropped", "warning", age_s=round(age), answer=out.decode("utf-8", "replace")[:300], **who)
        _unlink(path)
    else:
        counts["failed"] += 1
        log("del_replay_failed", "warning", answer=out.decode("utf-8", "replace")[:300], **who)


def _error_code(out: bytes) -> Optional[int]:
    try:
        code = json.loads(out).get("code")
    except (ValueError, AttributeError):
        return None
    return code if isinstance(code, int) else None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def start(socket_path: str, plugins: Mapping[str, Any], stop: threading.Event,
          interval: Optional[float] = None) -> threading.Thread:
    """In the daemon: replay now, then every ``interval`` seconds (``$RDMANET_DEL_REPLAY_SECONDS``,
    default 60) until ``stop`` is set; each DEL is served as a shim's call would be."""
    from .daemon import call_env, log_event, parse_binary, serve_call

    if interval is None:
        interval = float(os.environ.get("RDMANET_DEL_REPLAY_SECONDS", INTERVAL))
    directory = directory_of(socket_path)

    def serve(plugin: str, env: dict, stdin: bytes) -> tuple:
        return serve_call(plugins, plugin, call_env(env, os.environ), stdin)

    parse, log = parse_binary, log_event

    def loop() -> None:
        while True:
            try:
                replay_once(directory, plugins, serve, parse, log)
            except Exception as exc:  # noqa: BLE001 - the daemon goes on serving; the next round retries
                log("del_replay_error", "error", error=f"{type(exc).__name__}: {exc}")
            if stop.wait(interval):
                return

    thread = threading.Thread(target=loop, name="del-journal", daemon=True)
    thread.start()
    return thread
