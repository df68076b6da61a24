"""The systemd units install.sh's host mode installs: ``rdmanet.socket`` and ``rdmanet.service``.

The socket unit listens on the daemon's socket (the path baked into the shims) from boot on; the
first connection, a shim's call, starts the service, which gets the socket passed
(:mod:`rdmanet.node.socket_activation`). An idle node runs no daemon: only systemd's listening socket.

- ``rdmanet.socket``: ``ListenStream=<socket>``, ``SocketMode=0600`` owned by root, a new
  directory ``0700`` (what ``rdmanet daemon`` does when it binds the socket itself); the daemon
  still serves root peers only (SO_PEERCRED). ``RemoveOnStop=yes``: once the socket is stopped
  the shims find no daemon and run the plugins in-process. Enabled in ``sockets.target``.
- ``rdmanet.service``: ``rdmanet daemon --socket <socket>``, never enabled on its own (its
  ``[Install]`` names the socket: ``Also=``). ``KillMode=mixed``: SIGTERM reaches the daemon
  alone, which finishes the calls in flight, IPAM plugins it runs included, and exits;
  ``TimeoutStopSec`` leaves room for the longest call. ``Restart=on-failure``. Extra environment
  (``RDMANET_NODE_NAME``, ``RDMANET_NODE_POLICY``) from ``/etc/default/rdmanet`` when it exists.

``python -m rdmanet.cli.systemd_units write UNIT_DIR --rdmanet EXE --socket PATH`` writes both (write +
rename) and prints their paths; install.sh enables them with systemctl.
"""

from __future__ import annotations

import argparse
import os
import sys

from rdmanet.cni.linux.files import atomic_write
from rdmanet.ipam.node_identity import ENVIRONMENT_FILE  # install.sh writes RDMANET_NODE_NAME there

SOCKET_UNIT = "rdmanet.socket"
SERVICE_UNIT = "rdmanet.service"
UNITS = (SOCKET_UNIT, SERVICE_UNIT)
UNIT_DIR = "/etc/systemd/system"  # where the node owner's units go (install.sh: under --systemd-root)
STOP_SECONDS = 90  # the daemon's longest call (--call-timeout, 50 s) and its drain
MAX_SOCKET_PATH = 107  # sun_path, without its NUL


def _checked_path(what: str, path: str) -> str:
    """A path systemd takes literally in a unit: absolute, no white space, quotes, backslashes,
    specifiers (%) or control characters."""
    if not os.path.isabs(path):
        raise ValueError(f"{what} {path!r}: give an absolute path")
    bad = sorted({c for c in path if c.isspace() or c in "%\\\"'" or ord(c) < 32 or ord(c) == 127})
    if bad:
        raise ValueError(f"{what} {path!r}: a systemd unit cannot name it as is (it contains {''.join(bad)!r}); "
                         "choose a path without white space, quotes, backslashes or '%'")
    return os.path.normpath(path)


def socket_unit(socket_path: str) -> str:
    socket_path = _checked_path("the daemon socket", socket_path)
    if len(os.fsencode(socket_path)) > MAX_SOCKET_PATH:
        raise ValueError(f"the daemon socket {socket_path!r} is longer than the {MAX_SOCKET_PATH} bytes a unix "
                         "socket path may have")
    return f"""\
# Written by rdmanet's install.sh; re-run it rather than editing (or use a drop-in: systemctl edit rdmanet.socket).
[Unit]
Description=rdmanet CNI daemon socket (the first CNI call starts rdmanet.service)

[Socket]
ListenStream={socket_path}
SocketUser=root
SocketGroup=root
SocketMode=0600
DirectoryMode=0700
Backlog=4096
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
"""


def service_unit(rdmanet: str, socket_path: str) -> str:
    rdmanet = _checked_path("the rdmanet executable", rdmanet)
    socket_path = _checked_path("the daemon socket", socket_path)
    return f"""\
# Written by rdmanet's install.sh; re-run it rather than editing (or use a drop-in: systemctl edit rdmanet.service).
[Unit]
Description=rdmanet CNI daemon (serves the rdmanet CNI shims)
Requires={SOCKET_UNIT}
After={SOCKET_UNIT}

[Service]
Type=simple
ExecStart={rdmanet} daemon --socket {socket_path}
EnvironmentFile=-{ENVIRONMENT_FILE}
KillMode=mixed
TimeoutStopSec={STOP_SECONDS}
Restart=on-failure
RestartSec=1

[Install]
Also={SOCKET_UNIT}
"""


def write(unit_dir: str, rdmanet: str, socket_path: str) -> list[str]:
    """Write both units into ``unit_dir`` (created 0755 when missing); returns their paths."""
    texts = {SOCKET_UNIT: socket_unit(socket_path), SERVICE_UNIT: service_unit(rdmanet, socket_path)}
    os.makedirs(unit_dir, mode=0o755, exist_ok=True)
    paths = []
    for name, text in texts.items():
        path = os.path.join(unit_dir, name)
        atomic_write(path, text.encode(), mode=0o644, dir_mode=0o755)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rdmanet.cli.systemd_units",
                                     description="write rdmanet.socket and rdmanet.service (install.sh's host mode)")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write both units into UNIT_DIR and print their paths")
    w.add_argument("unit_dir")
    w.add_argument("--rdmanet", required=True, help="the rdmanet executable the service runs")
    w.add_argument("--socket", required=True, help="the daemon's socket (the shims' --socket)")
    args = parser.parse_args(argv)
    try:
        paths = write(args.unit_dir, args.rdmanet, args.socket)
    except (ValueError, OSError) as exc:
        print(f"cannot write the systemd units: {exc}", file=sys.stderr)
        return 1
    print("\n".join(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
