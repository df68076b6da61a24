"""The lease-ipam kubeconfig of the DaemonSet pod, from its service account (install.sh --daemonset).

``python -m rdmanet.cli.sa_kubeconfig once|loop SA_DIR KUBE_DIR NAME HOST PORT INTERVAL PARENT_PID``

- ``once``: write ``KUBE_DIR/NAME`` (0600; ``KUBE_DIR`` 0700) and ``KUBE_DIR/ca.crt`` from
  ``SA_DIR/{token,ca.crt,namespace}`` and the API server ``https://HOST:PORT``; exit 3 when no
  service account is mounted (skipped), 1 on failure.
- ``loop``: every INTERVAL seconds, rewrite what differs from the service account (the kubelet
  rotates the token); exits when PARENT_PID is no longer its parent (the daemon is gone), and the
  kernel also signals it then (PR_SET_PDEATHSIG). It only ever *refreshes*: when the kubeconfig
  is gone (``install.sh --daemonset --uninstall`` removed it, or someone deleted it) it writes
  nothing and exits, so an uninstall stays uninstalled. Each round holds an exclusive flock on
  ``KUBE_DIR`` (the uninstall takes the same lock before it removes anything), so a round that
  began before the uninstall cannot write the files back after it.

Files are written by write + rename (:func:`rdmanet.cni.linux.files.atomic_write`), so a reader sees the
old file or the new one. Nothing secret goes into a log line or an exception.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass

from rdmanet.cni.linux.files import atomic_write

CA_NAME = "ca.crt"


def log(event: str, level: str = "info", **fields) -> None:
    """One JSON line on stderr, like the daemon's own logs."""
    doc = {"ts": round(time.time(), 3), "level": level, "event": event, "component": "install.sh", **fields}
    sys.stderr.write(json.dumps(doc) + "\n")
    sys.stderr.flush()


def _read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


@dataclass(frozen=True)
class Writer:
    sa_dir: str
    kube_dir: str
    name: str
    host: str
    port: str

    @property
    def path(self) -> str:
        return os.path.join(self.kube_dir, self.name)

    @property
    def ca_path(self) -> str:
        return os.path.join(self.kube_dir, CA_NAME)

    def server(self) -> str:
        host = self.host if ":" not in self.host or self.host.startswith("[") else f"[{self.host}]"  # IPv6
        return f"https://{host}:{self.port or '443'}"

    def missing(self) -> str | None:
        """Why there is nothing to write (no service account, no API server), or None."""
        for f in ("token", CA_NAME):
            if not os.path.isfile(os.path.join(self.sa_dir, f)):
                return f"no service account mounted ({self.sa_dir}/{f} missing)"
        return None if self.host else "KUBERNETES_SERVICE_HOST is not set"

    def render(self) -> tuple[bytes, bytes, str]:
        """(CA, kubeconfig, namespace)."""
        token = _read(os.path.join(self.sa_dir, "token")).decode("utf-8", "replace").strip()
        if not token or any(c.isspace() or not c.isprintable() for c in token):
            raise ValueError(f"{self.sa_dir}/token is empty or not a bearer token")
        ca = _read(os.path.join(self.sa_dir, CA_NAME))
        try:
            namespace = _read(os.path.join(self.sa_dir, "namespace")).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            namespace = ""
        q = json.dumps  # a JSON string is a YAML double-quoted scalar
        lines = [
            "# Written by rdmanet install.sh --daemonset from the pod's service account; rewritten when",
            "# the token or the CA changes. Do not edit. ca.crt sha256: " + hashlib.sha256(ca).hexdigest(),
            "apiVersion: v1",
            "kind: Config",
            "clusters:",
            "- name: rdmanet",
            "  cluster:",
            "    server: " + q(self.server()),
            "    certificate-authority: " + q(self.ca_path),
            "users:",
            "- name: rdmanet",
            "  user:",
            "    token: " + q(token),
            "contexts:",
            "- name: rdmanet",
            "  context:",
            "    cluster: rdmanet",
            "    user: rdmanet",
        ]
        if namespace:
            lines.append("    namespace: " + q(namespace))
        lines += ["current-context: rdmanet", ""]
        return ca, "\n".join(lines).encode("utf-8"), namespace

    def sync(self) -> tuple[list[str], str]:
        """Rewrite what differs from the service account: (names rewritten, namespace)."""
        ca, config, namespace = self.render()
        os.makedirs(self.kube_dir, mode=0o700, exist_ok=True)
        os.chmod(self.kube_dir, 0o700)
        changed = []
        for target, data in ((self.ca_path, ca), (self.path, config)):  # the CA first: the kubeconfig names it
            try:
                same = _read(target) == data
            except OSError:
                same = False
            if not same:
                atomic_write(target, data)
                changed.append(os.path.basename(target))
            elif os.stat(target).st_mode & 0o777 != 0o600:
                os.chmod(target, 0o600)
        return changed, namespace

    def refresh(self) -> tuple[list[str], str] | None:
        """:meth:`sync`, only while the kubeconfig exists, under KUBE_DIR's lock; None when it is
        gone (uninstalled): nothing is written then, not even the directory."""
        try:
            fd = os.open(self.kube_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not os.path.isfile(self.path):
                return None
            return self.sync()
        finally:
            os.close(fd)  # releases the lock

    def remove_temporaries(self) -> None:
        """What a writer killed between write and rename left behind."""
        if not os.path.isdir(self.kube_dir):
            return
        for f in os.listdir(self.kube_dir):
            if f.startswith((f".{self.name}.", f".{CA_NAME}.")) and f.endswith(".tmp"):
                os.unlink(os.path.join(self.kube_dir, f))


def once(writer: Writer) -> int:
    why = writer.missing()
    if why:
        log("kubeconfig_skipped", reason=why, hint="lease-ipam's Kubernetes store then needs a kubeconfig of its own")
        return 3
    writer.remove_temporaries()
    try:
        changed, namespace = writer.sync()
    except (OSError, ValueError) as exc:
        log("kubeconfig_failed", "error", path=writer.path, error=str(exc))
        return 1
    log("kubeconfig_written" if changed else "kubeconfig_unchanged", path=writer.path, server=writer.server(),
        namespace=namespace or None, rewritten=changed)
    return 0


def loop(writer: Writer, interval: float, parent: int) -> int:
    """Until the parent (the daemon, after install.sh's exec) is gone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:  # the kernel's SIGTERM the moment the parent exits
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass  # polled below, once a second
    if os.getppid() != parent:
        return 0
    log("kubeconfig_refresh_started", path=writer.path, interval_seconds=interval, pid=os.getpid())
    due = time.monotonic() + interval
    while True:
        time.sleep(min(1.0, interval))
        if os.getppid() != parent:
            return 0
        if time.monotonic() < due:
            continue
        due = time.monotonic() + interval
        try:
            done = writer.refresh()
        except Exception as exc:  # keep going: the next round may succeed (and the old file still works)
            log("kubeconfig_refresh_failed", "error", path=writer.path, error=f"{type(exc).__name__}: {exc}")
            continue
        if done is None:
            log("kubeconfig_refresh_stopped", path=writer.path,
                reason="the kubeconfig was removed (install.sh --daemonset --uninstall?): not writing it back",
                hint="restart the pod to write it again")
            return 0
        changed, _ = done
        if changed:
            log("kubeconfig_rewritten", path=writer.path, rewritten=changed)


def main(argv: list[str]) -> int:
    mode, sa_dir, kube_dir, name, host, port, interval, parent = argv
    writer = Writer(sa_dir, kube_dir, name, host, port)
    return once(writer) if mode == "once" else loop(writer, float(interval), int(parent))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
