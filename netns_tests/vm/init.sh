#!/bin/busybox sh
# PID 1 of the rdmanet test VM (copied into the initramfs by prepare.sh as /init).
#
# 1. loads the virtio / 9p / overlay modules of the guest kernel (list in /modules/order);
# 2. mounts the host's / (9p tag "hostroot", read-only) under a tmpfs overlay at /newroot,
#    with fresh proc, sys, dev and /run, and bind-mounts the unpacked kernel's modules over
#    /lib/modules/<ver> (so modprobe finds the guest kernel's modules);
# 3. mounts the read-write results share (9p tag "results") at the host path given by
#    rdmanet.results= on the kernel command line, so paths are the same in guest and host;
# 4. runs <results>/run.sh with /bin/sh (or the program named by rdmanet.cmd=) chrooted into
#    /newroot, as a child of PID 1, with stdout, stderr and the exit code written to
#    <results>/stdout, <results>/stderr and <results>/rc;
# 5. powers the machine off (sysrq o; qemu runs with -no-reboot and panic=-1 as a backstop).

/bin/busybox mkdir -p /proc /sys /dev /bin /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/sbin:/bin:/usr/sbin:/usr/bin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

say() { echo "rdmanet-vm: $*" > /dev/console; }
off() {
    sync
    echo o > /proc/sysrq-trigger
    sleep 10
    poweroff -f
}
fail() {
    say "init failed: $*"
    off
}

. /etc/rdmanet-vm.conf || fail "no /etc/rdmanet-vm.conf"   # KVER, MODDIR

while read -r mod; do
    [ -n "$mod" ] || continue
    insmod "/modules/$mod" || fail "insmod $mod"
done < /modules/order

RESULTS=
CMD=
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        rdmanet.results=*) RESULTS="${arg#rdmanet.results=}" ;;
        rdmanet.cmd=*) CMD="${arg#rdmanet.cmd=}" ;;
    esac
done
[ -n "$RESULTS" ] || fail "no rdmanet.results= on the kernel command line"

mkdir -p /host /rw /newroot
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose hostroot /host \
    || fail "cannot mount the host root (9p tag hostroot)"
mount -t tmpfs -o mode=0755 rw /rw || fail "tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
    || fail "cannot mount the overlay over the host root"

R=/newroot
mount -t proc proc $R/proc
mount -t sysfs sysfs $R/sys
mount -t devtmpfs devtmpfs $R/dev
mkdir -p $R/dev/pts $R/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $R/dev/pts
mount -t tmpfs -o mode=1777 shm $R/dev/shm
mkdir -p "$R/lib/modules/$KVER"
mount --bind "$R$MODDIR" "$R/lib/modules/$KVER" || fail "cannot bind $MODDIR over /lib/modules/$KVER"
# a clean /run (no host /run/netns entries); /tmp stays the overlay's, writable and holding the
# host's files, in case the checkout or the results dir lives there
mount -t tmpfs -o mode=0755 run $R/run

mkdir -p "$R$RESULTS"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 results "$R$RESULTS" \
    || fail "cannot mount the results share at $RESULTS"

# The kernel's module autoloading (request_module, e.g. for "ip link add ... type veth") runs
# kernel.modprobe in PID 1's root, the initramfs: hand it to the host's modprobe in /newroot.
printf '#!/bin/busybox sh\nexec /bin/busybox chroot /newroot /sbin/modprobe "$@"\n' > /sbin/modprobe-newroot
chmod 0755 /sbin/modprobe-newroot
echo /sbin/modprobe-newroot > /proc/sys/kernel/modprobe

ip link set lo up 2>/dev/null
hostname rdmanet-vm

if [ -f "$R$RESULTS/run.sh" ]; then
    set -- /bin/sh "$RESULTS/run.sh"
elif [ -n "$CMD" ]; then
    set -- "$CMD"
else
    fail "nothing to run: no $RESULTS/run.sh and no rdmanet.cmd="
fi

cut -d' ' -f1 /proc/uptime > "$R$RESULTS/uptime.start"
chroot $R /usr/bin/env -i \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb RDMANET_VM=1 RDMANET_VM_RESULTS="$RESULTS" \
    "$@" < /dev/null > "$R$RESULTS/stdout" 2> "$R$RESULTS/stderr"
rc=$?
cut -d' ' -f1 /proc/uptime > "$R$RESULTS/uptime.end"
echo "$rc" > "$R$RESULTS/rc.tmp" && mv "$R$RESULTS/rc.tmp" "$R$RESULTS/rc"
off
