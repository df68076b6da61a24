#!/bin/bash
# Prepare the test VM: Debian's own kernel (the one linux-image-amd64 depends on) booted under
# qemu, to test rdmanet against kernel features this host lacks (rdma_rxe, dummy, ...).
#
# Idempotent; run as root. Steps:
#   1. install the host tools if missing (qemu-system-x86 kmod busybox-static cpio iproute2),
#      running apt-get update first when the package lists are empty;
#   2. resolve linux-image-<ver>-amd64 from linux-image-amd64's dependency, apt-get download it
#      and unpack it with dpkg-deb -x (it is never installed on the host), then depmod it;
#   3. extract the uncompressed vmlinux ELF from its bzImage (PVH boot: no decompression);
#   4. build an uncompressed initramfs: busybox-static, the kernel's virtio-pci / 9p / overlay
#      modules with their dependencies, and init.sh as /init;
#   5. build netdevsim.ko out of tree (Debian's 6.1 kernel has no CONFIG_NETDEVSIM): install
#      linux-headers-<kver> and linux-source-<major.minor> at the kernel package's version (plus
#      make and gcc when missing), unpack only drivers/net/netdevsim/ from the source tarball and
#      run "make -C /usr/src/linux-headers-<kver> M=<dir> CONFIG_NETDEVSIM=m modules"; the .ko is
#      cached in $CACHE/netdevsim/<kernel package>_<version>/, so this runs once per machine;
#   6. write $CACHE/vm.env, which harness.py reads.
#
# Cache dir: $RDMANET_VM_CACHE, default /var/cache/rdmanet-vm. Exit status non-zero with a
# message naming the failed step. A failed netdevsim build is NOT fatal (the rxe tests need none
# of it): prepare.sh warns, writes the reason to $CACHE/netdevsim/error and leaves
# RDMANET_VM_NETDEVSIM empty in vm.env, so that the VF tests fail with that reason instead of
# being skipped. The next run retries the build.
set -euo pipefail

CACHE="${RDMANET_VM_CACHE:-/var/cache/rdmanet-vm}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PACKAGES=(qemu-system-x86 kmod busybox-static cpio iproute2)
INITRD_MODULES=(virtio_pci 9pnet_virtio 9p overlay)

say() { echo "prepare.sh: $*"; }
die() { echo "prepare.sh: error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (installs packages, builds an initramfs with device nodes)"
[ "$(uname -m)" = x86_64 ] || die "only x86_64 hosts are supported (uname -m: $(uname -m))"
command -v apt-get > /dev/null || die "apt-get not found: a Debian host is required"
PYTHON="$(command -v python3 || true)"
[ -n "$PYTHON" ] || die "python3 not found"

export DEBIAN_FRONTEND=noninteractive
UPDATED=0
apt_update() {
    if [ "$UPDATED" = 0 ]; then
        say "apt-get update"
        apt-get update -qq > /dev/null || die "apt-get update failed"
        UPDATED=1
    fi
}
lists_empty() { ! compgen -G '/var/lib/apt/lists/*_Packages*' > /dev/null; }

# --- 1. host tools ---------------------------------------------------------------------------
installed() { dpkg-query -W -f='${Status}' "$1" 2> /dev/null | grep -q 'install ok installed'; }
missing=()
for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
    lists_empty && apt_update
    say "installing ${missing[*]}"
    if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" > /tmp/rdmanet-vm-apt.log 2>&1; then
        apt_update
        apt-get install -y -qq --no-install-recommends "${missing[@]}" > /tmp/rdmanet-vm-apt.log 2>&1 \
            || die "apt-get install ${missing[*]} failed (log: /tmp/rdmanet-vm-apt.log)"
    fi
    rm -f /tmp/rdmanet-vm-apt.log
else
    say "host tools present: ${PACKAGES[*]}"
fi
command -v qemu-system-x86_64 > /dev/null || die "qemu-system-x86_64 missing after install"
BUSYBOX=/bin/busybox
[ -x "$BUSYBOX" ] || die "$BUSYBOX missing (package busybox-static)"

# --- 2. kernel package -----------------------------------------------------------------------
resolve_kernel() {
    apt-cache depends linux-image-amd64 2> /dev/null \
        | sed -n 's/^ *Depends: <\{0,1\}\(linux-image-[0-9][^>]*-amd64\)>\{0,1\}$/\1/p' | head -n1
}
lists_empty && apt_update
KPKG="$(resolve_kernel)"
if [ -z "$KPKG" ]; then
    apt_update
    KPKG="$(resolve_kernel)"
fi
KVERSION=""
[ -n "$KPKG" ] && KVERSION="$(apt-cache show --no-all-versions "$KPKG" 2> /dev/null | sed -n 's/^Version: //p' | head -n1)"
if [ -z "$KPKG" ] || [ -z "$KVERSION" ]; then
    if [ -f "$CACHE/vm.env" ]; then
        say "warning: cannot resolve linux-image-amd64 with apt-cache; using the cached kernel"
        # shellcheck disable=SC1091
        . "$CACHE/vm.env"
        KPKG="$RDMANET_VM_KPKG"
        KVERSION="$RDMANET_VM_KPKG_VERSION"
    else
        die "cannot resolve the kernel package linux-image-amd64 depends on (apt-cache depends linux-image-amd64)"
    fi
fi
KVER="${KPKG#linux-image-}"
KDIR="$CACHE/kernel/${KPKG}_${KVERSION}"
MODDIR="$KDIR/lib/modules/$KVER"
say "kernel package $KPKG $KVERSION (kernel $KVER)"

mkdir -p "$CACHE" || die "cannot create the cache dir $CACHE (set RDMANET_VM_CACHE)"
chmod 0755 "$CACHE"
exec 9> "$CACHE/.lock"
flock 9 || die "cannot lock $CACHE/.lock"   # one prepare at a time per cache dir
if [ ! -f "$KDIR/.unpacked" ]; then
    dl="$(mktemp -d "$CACHE/download.XXXXXX")"
    trap 'rm -rf "$dl"' EXIT
    say "apt-get download $KPKG=$KVERSION"
    download() { (cd "$dl" && apt-get download -qq "$KPKG=$KVERSION" > "$dl/log" 2>&1); }
    download || { apt_update; download; } \
        || die "apt-get download $KPKG=$KVERSION failed: $(grep -E '^(E|Err):' "$dl/log" | tail -n2)"
    deb="$(ls "$dl"/*.deb)"
    rm -rf "$KDIR"
    mkdir -p "$KDIR"
    say "dpkg-deb -x $(basename "$deb") $KDIR"
    dpkg-deb -x "$deb" "$KDIR" || die "dpkg-deb -x failed"
    [ -d "$MODDIR" ] || die "$KPKG has no lib/modules/$KVER"
    depmod -b "$KDIR" "$KVER" || die "depmod failed"
    touch "$KDIR/.unpacked"
    rm -rf "$dl"
    trap - EXIT
    # drop other cached kernels
    for old in "$CACHE"/kernel/*; do
        [ "$old" = "$KDIR" ] || rm -rf "$old"
    done
else
    say "kernel already unpacked in $KDIR"
fi

# --- 3. vmlinux ------------------------------------------------------------------------------
VMLINUX="$KDIR/vmlinux"
if [ ! -s "$VMLINUX" ]; then
    "$PYTHON" "$HERE/extract_vmlinux.py" "$KDIR/boot/vmlinuz-$KVER" "$VMLINUX" \
        || die "cannot extract vmlinux from $KDIR/boot/vmlinuz-$KVER"
else
    say "vmlinux present: $VMLINUX"
fi

# --- 4. initramfs ----------------------------------------------------------------------------
INITRD="$KDIR/initramfs.cpio"
# the initramfs depends on init.sh, the module list, busybox and the cache path
stamp="$( (cat "$HERE/init.sh"; echo "${INITRD_MODULES[*]} $MODDIR"; cat "$BUSYBOX") | sha256sum | cut -d' ' -f1)"
if [ ! -s "$INITRD" ] || [ "$(cat "$INITRD.stamp" 2> /dev/null)" != "$stamp" ]; then
    stage="$(mktemp -d "$CACHE/initramfs.XXXXXX")"
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage"/{bin,dev,etc,modules,proc,sys}
    cp "$BUSYBOX" "$stage/bin/busybox"
    cp "$HERE/init.sh" "$stage/init"
    chmod 0755 "$stage/init" "$stage/bin/busybox"
    mknod -m 600 "$stage/dev/console" c 5 1
    mknod -m 666 "$stage/dev/null" c 1 3
    printf 'KVER=%q\nMODDIR=%q\n' "$KVER" "$MODDIR" > "$stage/etc/rdmanet-vm.conf"
    : > "$stage/modules/order"
    for m in "${INITRD_MODULES[@]}"; do
        lines="$(modprobe -d "$KDIR" -S "$KVER" --show-depends "$m")" || die "modprobe --show-depends $m failed"
        while read -r verb path _; do
            [ "$verb" = insmod ] || continue   # "builtin ..." needs nothing
            base="$(basename "$path")"
            grep -qxF "$base" "$stage/modules/order" && continue
            cp "$path" "$stage/modules/$base"
            echo "$base" >> "$stage/modules/order"
        done <<< "$lines"
    done
    (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet > "$INITRD.tmp") \
        || die "cpio failed"
    mv "$INITRD.tmp" "$INITRD"
    echo "$stamp" > "$INITRD.stamp"
    say "initramfs built: $INITRD ($(du -h "$INITRD" | cut -f1); modules: $(tr '\n' ' ' < "$stage/modules/order"))"
    rm -rf "$stage"
    trap - EXIT
else
    say "initramfs up to date: $INITRD"
fi

# --- 5. netdevsim.ko -------------------------------------------------------------------------
NSIM_ROOT="$CACHE/netdevsim"
NSIM_DIR="$NSIM_ROOT/${KPKG}_${KVERSION}"
NSIM_KO="$NSIM_DIR/netdevsim.ko"
NSIM_ERROR_FILE="$NSIM_ROOT/error"
NSIM_LOG="$NSIM_ROOT/build.log"
NSIM_ERROR=""

# Every step records its failure in NSIM_ERROR and returns 1 (never die: see the header).
nsim_fail() { NSIM_ERROR="$*"; return 1; }
nsim_install() {   # nsim_install pkg[=version]...: apt-get install, updating the lists once on failure
    local log="$NSIM_ROOT/apt.log"
    if ! apt-get install -y -qq --no-install-recommends --allow-downgrades "$@" > "$log" 2>&1; then
        if [ "$UPDATED" = 0 ]; then
            say "apt-get update"
            apt-get update -qq > /dev/null 2>&1 && UPDATED=1
        fi
        apt-get install -y -qq --no-install-recommends --allow-downgrades "$@" > "$log" 2>&1 \
            || nsim_fail "apt-get install $* failed: $(grep -E '^(E|Err):' "$log" | tail -n2 | tr '\n' ' ')" \
            || return 1
    fi
    rm -f "$log"
}
version_of() { dpkg-query -W -f='${Status} ${Version}' "$1" 2> /dev/null | sed -n 's/^install ok installed //p'; }
available() { [ -n "$(apt-cache madison "$1" 2> /dev/null | awk -v v="$2" '$3 == v')" ]; }

build_netdevsim() {
    local series srcpkg hdrpkg want=() tarball hdrdir work src
    series="$(echo "$KVER" | cut -d. -f1,2)"          # 6.1.0-56-amd64 -> 6.1
    srcpkg="linux-source-$series"
    hdrpkg="linux-headers-$KVER"
    hdrdir="/usr/src/linux-headers-$KVER"
    tarball="/usr/src/linux-source-$series.tar.xz"
    mkdir -p "$NSIM_ROOT"
    # headers: exactly the kernel package's version (vermagic and symbol CRCs must match)
    [ "$(version_of "$hdrpkg")" = "$KVERSION" ] || want+=("$hdrpkg=$KVERSION")
    # source: the same version when the archive still has it, else the newest of the series
    if [ "$(version_of "$srcpkg")" != "$KVERSION" ]; then
        if available "$srcpkg" "$KVERSION"; then
            want+=("$srcpkg=$KVERSION")
        elif [ -z "$(version_of "$srcpkg")" ]; then
            say "warning: $srcpkg $KVERSION is not in the archive; using its candidate version"
            want+=("$srcpkg")
        fi
    fi
    for p in make gcc; do installed "$p" || want+=("$p"); done
    if [ "${#want[@]}" -gt 0 ]; then
        say "installing ${want[*]} (to build netdevsim.ko)"
        nsim_install "${want[@]}" || return 1
    fi
    [ -f "$hdrdir/Makefile" ] || nsim_fail "$hdrdir/Makefile missing after installing $hdrpkg" || return 1
    [ -f "$tarball" ] || nsim_fail "$tarball missing after installing $srcpkg" || return 1

    work="$(mktemp -d "$NSIM_ROOT/build.XXXXXX")"
    src="$work/linux-source-$series/drivers/net/netdevsim"
    say "unpacking drivers/net/netdevsim/ from $tarball ($(version_of "$srcpkg"))"
    if ! tar -xJf "$tarball" -C "$work" "linux-source-$series/drivers/net/netdevsim" > "$NSIM_LOG" 2>&1; then
        rm -rf "$work"
        nsim_fail "tar could not unpack drivers/net/netdevsim from $tarball: $(tail -n1 "$NSIM_LOG")"
        return 1
    fi
    say "building netdevsim.ko against $hdrdir"
    if ! make -C "$hdrdir" M="$src" CONFIG_NETDEVSIM=m -j"$(nproc)" modules >> "$NSIM_LOG" 2>&1 \
        || [ ! -s "$src/netdevsim.ko" ]; then
        rm -rf "$work"
        nsim_fail "make M=drivers/net/netdevsim modules failed (log: $NSIM_LOG): $(grep -m1 -E 'error|Error' "$NSIM_LOG")"
        return 1
    fi
    local magic
    magic="$(modinfo -F vermagic "$src/netdevsim.ko" 2> /dev/null)"
    if [ "${magic%% *}" != "$KVER" ]; then
        rm -rf "$work"
        nsim_fail "netdevsim.ko has vermagic '$magic', not $KVER"
        return 1
    fi
    mkdir -p "$NSIM_DIR"
    # without its debug info the module is ~20x smaller: cheaper to read over 9p under TCG
    strip --strip-debug -o "$NSIM_KO.tmp" "$src/netdevsim.ko" 2> /dev/null || cp "$src/netdevsim.ko" "$NSIM_KO.tmp"
    mv "$NSIM_KO.tmp" "$NSIM_KO"
    echo "$(version_of "$srcpkg")" > "$NSIM_DIR/source-version"
    rm -rf "$work"
}

rm -rf "$NSIM_ROOT"/build.*   # left by an interrupted run (we hold the cache lock)
if [ -s "$NSIM_KO" ]; then
    say "netdevsim.ko present: $NSIM_KO"
else
    start=$SECONDS
    if build_netdevsim; then
        say "netdevsim.ko built in $((SECONDS - start)) s: $NSIM_KO (depends: $(modinfo -F depends "$NSIM_KO"))"
    else
        NSIM_KO=""
        say "warning: no netdevsim.ko, the VF tests will fail: $NSIM_ERROR"
    fi
fi
if [ -n "$NSIM_KO" ]; then
    rm -f "$NSIM_ERROR_FILE"
    for old in "$NSIM_ROOT"/*_*; do   # drop the modules of other kernels
        [ "$old" = "$NSIM_DIR" ] || rm -rf "$old"
    done
else
    mkdir -p "$NSIM_ROOT"
    echo "$NSIM_ERROR" > "$NSIM_ERROR_FILE"
fi

# --- 6. what the harness reads ---------------------------------------------------------------
cat > "$CACHE/vm.env.tmp" << EOF
RDMANET_VM_KPKG=$KPKG
RDMANET_VM_KPKG_VERSION=$KVERSION
RDMANET_VM_KVER=$KVER
RDMANET_VM_VMLINUX=$VMLINUX
RDMANET_VM_INITRD=$INITRD
RDMANET_VM_MODULES=$MODDIR
RDMANET_VM_NETDEVSIM=$NSIM_KO
RDMANET_VM_NETDEVSIM_ERROR_FILE=$([ -n "$NSIM_KO" ] || echo "$NSIM_ERROR_FILE")
EOF
mv "$CACHE/vm.env.tmp" "$CACHE/vm.env"
say "ready: $CACHE/vm.env"
