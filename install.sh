#!/usr/bin/env bash
# rdmanet installer (host mode): a venv with rdmanet, its plugins in the CNI bin dir, `rdmanet` on PATH.
set -euo pipefail

usage() {
    cat <<USAGE
Usage: ./install.sh [--prefix DIR] [--bin-dir DIR] [--uninstall]

Installs rdmanet from this checkout, as root, on Debian 12:
  - a Python venv in --prefix (default /opt/cni/rdmanet) on Debian's /usr/bin/python3,
  - the plugins macvlan-rdma, host-device-rdma and lease-ipam into --bin-dir (default
    /opt/cni/bin) as stdlib-only shims that use \`rdmanet daemon\` when it runs, each checked to
    answer CNI VERSION,
  - /usr/local/bin/rdmanet.
Idempotent: run it again to upgrade. --uninstall removes exactly what it installed.
USAGE
}

PREFIX=/opt/cni/rdmanet
BIN_DIR=/opt/cni/bin
UNINSTALL=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX=$2; shift 2 ;;
        --bin-dir) BIN_DIR=$2; shift 2 ;;
        --uninstall) UNINSTALL=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "install.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

[ "$(id -u)" -eq 0 ] || { echo "install.sh: run as root" >&2; exit 1; }
SRC=$(cd "$(dirname "$0")" && pwd)
PLUGINS="macvlan-rdma host-device-rdma lease-ipam"
MANIFEST="$PREFIX/installed-files"

if [ "$UNINSTALL" -eq 1 ]; then
    if [ -f "$MANIFEST" ]; then
        while read -r f; do rm -f "$f"; done < "$MANIFEST"
    fi
    rm -rf "$PREFIX"
    echo "rdmanet uninstalled"
    exit 0
fi

missing=""
for p in python3 python3-venv iproute2; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

[ -x "$PREFIX/bin/python" ] || /usr/bin/python3 -m venv "$PREFIX"
"$PREFIX/bin/pip" install -q --disable-pip-version-check --upgrade "$SRC"

mkdir -p "$BIN_DIR"
: > "$MANIFEST.new"
for exe in $PLUGINS; do
    # a stdlib-only shim (shim/launcher.py): forwards to `rdmanet daemon` when it runs, else runs
    # the plugin in-process from this venv; written by write + rename, so a runtime never execs
    # a half-written plugin
    "$PREFIX/bin/python" -m shim "$BIN_DIR" "$exe" >/dev/null
    echo "$BIN_DIR/$exe" >> "$MANIFEST.new"
    answer=$(env -i CNI_COMMAND=VERSION "$BIN_DIR/$exe" </dev/null)
    case "$answer" in
        *supportedVersions*) echo "installed $BIN_DIR/$exe: $answer" ;;
        *) echo "install.sh: $BIN_DIR/$exe does not answer VERSION: $answer" >&2; exit 1 ;;
    esac
done
ln -sfn "$PREFIX/bin/rdmanet" /usr/local/bin/rdmanet
echo /usr/local/bin/rdmanet >> "$MANIFEST.new"
mv -f "$MANIFEST.new" "$MANIFEST"
echo "rdmanet installed in $PREFIX; try: rdmanet demo"
