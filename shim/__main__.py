"""``python -m shim BIN_DIR [--socket PATH] [--python PATH] [--site-dir DIR] [PLUGIN ...]``:
write the launchers into a CNI bin dir (used by install.sh and the tests)."""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig

from .launcher import DEFAULT_SOCKET, PLUGINS, write_shim


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shim", description="write rdmanet CNI shims into a bin dir")
    parser.add_argument("bin_dir")
    parser.add_argument("plugins", nargs="*", default=sorted(PLUGINS), help="default: all")
    parser.add_argument("--socket", default=DEFAULT_SOCKET, help="daemon socket baked in (default: %(default)s)")
    parser.add_argument("--python", default=sys.executable, help="interpreter (default: this one)")
    parser.add_argument("--site-dir", default=sysconfig.get_path("purelib"), help="site-packages with rdmanet (default: this venv's)")
    args = parser.parse_args(argv)
    os.makedirs(args.bin_dir, exist_ok=True)
    for name in args.plugins:
        path = os.path.join(args.bin_dir, name)
        write_shim(path, name, os.path.abspath(args.python), args.site_dir, args.socket)
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
