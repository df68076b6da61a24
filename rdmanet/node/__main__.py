"""``python -m rdmanet.node BIN_DIR [--socket PATH] [--server-uid UID] [--python PATH] [--site-dir DIR | --daemon-only] [PLUGIN ...]``:
write the launchers into a CNI bin dir (used by install.sh and the tests).

``--server-uid``: the uid the daemon runs as when not root (default 0: install.sh runs it as
root); the shims send a call only to a server of uid 0 or this one (SO_PEERCRED).

``--daemon-only`` writes shims without an in-process fallback, for a node whose interpreter
(``--python``, default /usr/bin/python3, a path on the node) cannot import rdmanet: install.sh's
DaemonSet mode (see :mod:`rdmanet.node.launcher`)."""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig

from .launcher import DEFAULT_SOCKET, PLUGINS, write_shim

HOST_PYTHON = "/usr/bin/python3"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rdmanet.node", description="write rdmanet CNI shims into a bin dir")
    parser.add_argument("bin_dir")
    parser.add_argument("plugins", nargs="*", default=sorted(PLUGINS), help="default: all")
    parser.add_argument("--socket", default=DEFAULT_SOCKET, help="daemon socket baked in (default: %(default)s)")
    parser.add_argument("--server-uid", type=int, default=0,
                        help="besides root, the uid the daemon may run as; the shims send calls to no other (default 0)")
    parser.add_argument("--python", default=None,
                        help=f"interpreter (default: this one; with --daemon-only {HOST_PYTHON})")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--site-dir", default=None, help="site-packages with rdmanet (default: this venv's)")
    where.add_argument("--daemon-only", action="store_true",
                       help="no in-process fallback: the shim only talks to the daemon (DaemonSet mode)")
    args = parser.parse_args(argv)
    unknown = [p for p in args.plugins if p not in PLUGINS]
    if unknown:
        parser.error(f"unknown plugin(s) {', '.join(unknown)}; choose from {', '.join(sorted(PLUGINS))}")
    if args.daemon_only:
        python, site_dir = args.python or HOST_PYTHON, None
        if not os.path.isabs(python):  # a path on the node: never resolved against this cwd
            parser.error(f"--python {python!r}: with --daemon-only give the absolute path of the node's python3")
    else:
        python = os.path.abspath(args.python or sys.executable)
        site_dir = args.site_dir or sysconfig.get_path("purelib")
    os.makedirs(args.bin_dir, exist_ok=True)
    for name in args.plugins:
        path = os.path.join(args.bin_dir, name)
        try:
            write_shim(path, name, python, site_dir, args.socket, args.server_uid)
        except ValueError as exc:
            parser.error(str(exc))
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
