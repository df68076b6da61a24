#!/usr/bin/env bash
# rdmanet installer, two modes (see usage below):
#   host mode (default): a venv with rdmanet from this checkout, the plugins in the CNI bin
#     dir as shims that fall back to running the plugin in-process, `rdmanet` on PATH, and under
#     systemd the daemon as a socket-activated service (rdmanet.socket + rdmanet.service);
#   DaemonSet mode (--daemonset): the DaemonSet container's entry point: daemon-only shims for the
#     node, a kubeconfig from the pod's service account (kept fresh), then `rdmanet daemon`.
set -euo pipefail

PLUGINS="macvlan-rdma host-device-rdma ipoib-rdma lease-ipam"
SHIM_MARK="# rdmanet CNI shim for "  # line 2 of every shim rdmanet/node/launcher.py renders
UNIT_MARK="# Written by rdmanet's install.sh"  # line 1 of the units rdmanet/cli/systemd_units.py renders
UNITS="rdmanet.socket rdmanet.service"

usage() {
    cat <<'USAGE'
Usage: install.sh [--prefix DIR] [--bin-dir DIR] [--socket PATH] [--link-dir DIR] [--no-systemd]
                  [--systemd-root DIR] [--node-name NAME] [--kubeconfig FILE] [--uninstall]
       install.sh --daemonset [--prefix DIR] [--bin-dir DIR] [--conf-dir DIR] [--socket PATH]
                  [--host-python PATH] [--host-root DIR] [--serviceaccount-dir DIR] [--uninstall]

Installs the rdmanet CNI plugins macvlan-rdma, host-device-rdma, ipoib-rdma and lease-ipam. Run as root.
Idempotent: run it again to upgrade or repair. --uninstall removes exactly what the mode installs.

Host mode (default): from this checkout, on Debian 12.
  - A Python venv in --prefix (default /opt/cni/rdmanet) on /usr/bin/python3 with rdmanet in it
    (python3, python3-venv and iproute2 are installed with apt-get when missing).
  - The plugins in --bin-dir as stdlib-only shims: each forwards the call to
    `rdmanet daemon` on --socket when it runs, and otherwise runs the plugin in-process from the
    venv, with the same output. Each is written by write + rename and checked to answer VERSION;
    that first call leaves .<name>.code beside it, the shim's hot path compiled for its
    interpreter (every shim rewrites it when it does not match: rdmanet/node/boot.py); the first call that
    runs in-process (a VERSION excepted) leaves .<name>.texts, code it compiled from text
    (rdmanet/node/compiled_texts.py).
  - The link --link-dir/rdmanet (default /usr/local/bin/rdmanet).
  - When systemd runs the host (/run/systemd/system exists): the daemon as a socket-activated
    service. /etc/systemd/system/rdmanet.socket listens on --socket (mode 0600, root's; its
    directory 0700) and is enabled and started; the first CNI call starts rdmanet.service
    (`rdmanet daemon`, which serves root's calls only), so an idle node runs no daemon. An
    upgrade restarts a running daemon on the new code. Extra environment for the daemon
    (RDMANET_NODE_NAME, RDMANET_NODE_POLICY) goes in /etc/default/rdmanet.
  - The Node name (RDMANET_NODE_NAME in /etc/default/rdmanet, under --systemd-root): --node-name
    NAME, or by default the Node that matches this host (its hostname, lower-cased, its FQDN,
    its short name) confirmed by a GET of the Node with --kubeconfig (default $KUBECONFIG, else
    the kubelet's /etc/kubernetes/kubelet.conf). The daemon's node GC, which frees the claims of
    this node's gone pods, runs only for a Node name the API confirms, never for the hostname:
    when none is confirmed the file is left as it is and install.sh says so (rdmanet doctor too).
    Opt out: --no-systemd (or RDMANET_SYSTEMD=no): no units; start the daemon yourself.
    Without systemd it prints the command that starts the daemon; until one runs, the shims
    run the plugins in-process (slower: every call pays the imports).
  What it wrote is listed in PREFIX/installed-files; --uninstall removes those files (shims only
  while they are rdmanet shims, their .<name>.code and .<name>.texts always, the link only while it points into the venv, the units only
  while they are the ones install.sh writes, disabled and stopped first), then what the plugins
  and `rdmanet demo` left (the demo's store /var/lib/cni/lease-ipam/rdmanet-demo, the lock files
  in /run/rdmanet/locks, an empty DEL journal and /run/rdmanet), the directories it created
  (e.g. an empty --bin-dir; listed in PREFIX/created-dirs), and the venv. It keeps, and says so,
  what is still in use: claims (the demo's, other networks'), DELs not replayed yet,
  host-device-rdma's state, a lock a call holds (rdmanet/cli/leftovers.py).

DaemonSet mode (--daemonset, or RDMANET_INSTALL_MODE=daemonset): the entry point of the rdmanet
DaemonSet's container (privileged, hostPID; the node's --bin-dir, --conf-dir and the directory of
--socket mounted at the same paths). rdmanet is already installed in the image's venv --prefix
(default /opt/rdmanet): nothing is downloaded or installed. In order:
  1. Checks that --host-python runs under --host-root and is Python >= 3.6.
  2. Writes the shims into --bin-dir by write + rename (a temporary ".<name>.*.tmp" in the
     same directory, then a rename: the kubelet never execs a half-written file), with
     --host-python as their interpreter; checks that each is the very file the node has at that
     path (the same inode under --host-root: a --bin-dir whose hostPath is mounted at another path
     is refused, naming both paths) and that it answers VERSION when run the way the node runs it
     (chroot into --host-root, empty environment); that call leaves .<name>.code beside each, the
     shim's hot path compiled by the node's python3 (rdmanet/node/boot.py).
  3. Writes CONF_DIR/rdmanet.d/rdmanet.kubeconfig (mode 0600, directory 0700) for lease-ipam's
     Kubernetes store, from the pod's service account (the token; ca.crt, copied to
     CONF_DIR/rdmanet.d/ca.crt; the namespace, as the context's namespace) and the API server
     https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT. A background loop rewrites it
     (write + rename) whenever the token or CA content changes, as the kubelet rotates the token.
     It never outlives the daemon: it is a child of this process, which becomes the daemon (step
     4), and the kernel signals it when its parent exits (PR_SET_PDEATHSIG; it also checks its
     parent every second). It only refreshes: once the kubeconfig is gone (--uninstall) it
     writes nothing more and exits. No service account mounted: skipped, with a log line.
     A NAD uses it as "kubernetes": {"kubeconfig": "/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig"}.
  4. Execs `rdmanet daemon --socket SOCKET [--node-policy FILE]` in the foreground: the daemon is the container's main
     process and gets its signals itself (SIGTERM: finish the calls in flight, remove the socket,
     exit 0).
  Why the shims have no in-process fallback in this mode: they run on the node, under the node's
  python3, but the plugins and their dependencies (pyroute2, pydantic, kubernetes) exist only in
  the image. When the daemon does not answer, a shim prints CNI error 11 (try again later; for
  STATUS 50, not available) naming the socket and asking
  "is the rdmanet DaemonSet pod running on this node?", and exits 1: nothing was done, and the
  runtime retries the ADD or DEL once the pod is back. VERSION is answered by the shim itself
  when the daemon is down.
  --uninstall (for a cleanup Job, a preStop hook, or `kubectl exec` into the pod): removes the
  shims (only while they are rdmanet shims; their .<name>.code and .<name>.texts always) and the files it writes in CONF_DIR/rdmanet.d
  (then the directory, if empty); nothing else. The pod's refresh loop does not write the
  kubeconfig back (it takes the directory's lock for each round, as --uninstall does). It does not
  stop a running daemon.
  Output: every line is one JSON object ({"ts", "level", "event", "component", "msg", ...}), like
  the daemon's own log lines: the pod's log is JSON lines. Host mode prints "install.sh: ..." text.

Options (an environment variable, where named, sets the same; a flag wins):
  --daemonset                DaemonSet mode                  RDMANET_INSTALL_MODE=host|daemonset
  --uninstall                remove what the mode installs
  --prefix DIR               host mode: the venv to create (default /opt/cni/rdmanet);
                             DaemonSet mode: the image's venv with rdmanet (default /opt/rdmanet)
  --bin-dir DIR              CNI bin dir (default /opt/cni/bin)           RDMANET_CNI_BIN_DIR
  --socket PATH              the daemon's socket, baked into the shims (its directory must be
                             writable by root only; the shims send nothing to a server that
                             is not root) (default /run/rdmanet/daemon.sock)  RDMANET_DAEMON_SOCKET
  --link-dir DIR             host mode: where the rdmanet link goes (default /usr/local/bin)
  --no-systemd               host mode: no systemd units, even when systemd runs
                                                                          RDMANET_SYSTEMD=no
  --node-name NAME           host mode: this host's Kubernetes Node name (default: the Node that
                             matches this host, confirmed through the API)
  --kubeconfig FILE          host mode: credentials that may get nodes, to confirm the Node name
                             (default $KUBECONFIG, else /etc/kubernetes/kubelet.conf)
  --systemd-root DIR         host mode: the root whose systemd gets the units (default /): they
                             go in DIR/etc/systemd/system, systemd counts as running when
                             DIR/run/systemd/system exists, and with a DIR other than / they
                             are enabled with `systemctl --root DIR` (symlinks only: nothing is
                             started; for an image being built, and the tests)
                                                                          RDMANET_SYSTEMD_ROOT
  --conf-dir DIR             DaemonSet mode: CNI conf dir (default /etc/cni/net.d)
                                                                          RDMANET_CNI_CONF_DIR
  --host-python PATH         DaemonSet mode: the node's python3 (>= 3.6), the shims' interpreter,
                             a path on the node (default /usr/bin/python3) RDMANET_HOST_PYTHON
  --host-root DIR            DaemonSet mode: the node's root as the container sees it
                             (default /proc/1/root, the pod has hostPID; / runs without chroot)
                                                                          RDMANET_HOST_ROOT
  --serviceaccount-dir DIR   DaemonSet mode: token, ca.crt, namespace
                             (default /var/run/secrets/kubernetes.io/serviceaccount)
                                                                          RDMANET_SERVICEACCOUNT_DIR
  --node-policy FILE         DaemonSet mode: the daemon's node policy, the only place the roots a
                             NAD's paths may use are widened (docs/security.md; a path in the
                             container, e.g. a mounted ConfigMap; default: the built-in roots)
  -h, --help                 this text
Environment read in DaemonSet mode besides the above:
  KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT (default 443)  the API server (the kubelet
                             sets them); an IPv6 address is written in brackets
  RDMANET_KUBECONFIG_REFRESH_SECONDS   how often the token and CA are compared (default 60)
Exit status: 0 done (DaemonSet mode: the daemon's own), 1 failed, 2 bad usage.
USAGE
}

# Output. Host mode: "install.sh: <message>" lines for a person at a terminal. DaemonSet mode: every
# line is one JSON object, like the daemon's and the kubeconfig writer's (the pod's log is JSON
# lines): {"ts", "level", "event", "component": "install.sh", "msg", ...}. Progress goes to stdout,
# errors to stderr, as in host mode.
JSON_LOG=0
case "${RDMANET_INSTALL_MODE:-}" in daemonset) JSON_LOG=1 ;; esac
for arg in "$@"; do
    [ "$arg" != --daemonset ] || JSON_LOG=1
done

json_str() {  # json_str TEXT: sets REPLY to TEXT as a JSON string literal
    local s=$1 out="" c i
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\r'/\\r}
    s=${s//$'\t'/\\t}
    if [[ $s == *[[:cntrl:]]* ]]; then  # any other control character: \u00XX
        for ((i = 0; i < ${#s}; i++)); do
            c=${s:i:1}
            [[ $c != [[:cntrl:]] ]] || printf -v c '\\u%04x' "'$c"
            out+=$c
        done
        s=$out
    fi
    REPLY="\"$s\""
}

emit() {  # emit FD LEVEL EVENT MESSAGE [KEY VALUE]...: one line on FD (1 or 2)
    local fd=$1 level=$2 event=$3 msg=$4 line ts
    shift 4
    if [ "$JSON_LOG" -eq 1 ]; then
        ts=${EPOCHREALTIME/,/.}
        json_str "$msg"
        line="{\"ts\": ${ts%???}, \"level\": \"$level\", \"event\": \"$event\", \"component\": \"install.sh\", \"msg\": $REPLY"
        while [ $# -ge 2 ]; do
            json_str "$2"
            line+=", \"$1\": $REPLY"
            shift 2
        done
        line+="}"
    else
        line="install.sh: $msg"
    fi
    if [ "$fd" = 2 ]; then echo "$line" >&2; else echo "$line"; fi
}

usage_error() {
    if [ "$JSON_LOG" -eq 1 ]; then
        emit 2 error usage_error "$* (try 'install.sh --help')"
    else
        echo "install.sh: $*" >&2
        echo "Try 'install.sh --help'." >&2
    fi
    exit 2
}

die() {  # die [--event NAME] MESSAGE...
    local event=install_failed
    if [ "$1" = --event ]; then event=$2; shift 2; fi
    emit 2 error "$event" "$*"
    exit 1
}

say() {  # say [--event NAME] MESSAGE [KEY VALUE]...
    local event=install_step
    if [ "$1" = --event ]; then event=$2; shift 2; fi
    emit 1 info "$event" "$@"
}

# ------------------------------------------------------------------------------------ arguments

MODE=${RDMANET_INSTALL_MODE:-host}
BIN_DIR=${RDMANET_CNI_BIN_DIR:-/opt/cni/bin}
SOCKET=${RDMANET_DAEMON_SOCKET:-/run/rdmanet/daemon.sock}
CONF_DIR=${RDMANET_CNI_CONF_DIR:-/etc/cni/net.d}
HOST_PYTHON=${RDMANET_HOST_PYTHON:-/usr/bin/python3}
HOST_ROOT=${RDMANET_HOST_ROOT:-/proc/1/root}
SA_DIR=${RDMANET_SERVICEACCOUNT_DIR:-/var/run/secrets/kubernetes.io/serviceaccount}
REFRESH=${RDMANET_KUBECONFIG_REFRESH_SECONDS:-60}
PREFIX=
NODE_POLICY=
LINK_DIR=/usr/local/bin
SYSTEMD=${RDMANET_SYSTEMD:-auto}
SYSTEMD_ROOT=${RDMANET_SYSTEMD_ROOT:-/}
NODE_NAME=
NODE_KUBECONFIG=
UNINSTALL=0
HOST_ONLY=     # flags given that only host mode takes
DS_ONLY=       # flags given that only DaemonSet mode takes

while [ $# -gt 0 ]; do
    opt=$1
    val=
    inline=0
    case "$opt" in
        --*=*) val=${opt#*=}; opt=${opt%%=*}; inline=1 ;;
    esac
    case "$opt" in
        --daemonset|--uninstall|--no-systemd|-h|--help)
            [ "$inline" -eq 0 ] || usage_error "$opt takes no value" ;;
        --node-name)
            if [ "$inline" -eq 0 ]; then
                [ $# -ge 2 ] || usage_error "$opt needs a value"
                val=$2
                shift
            fi
            [[ $val =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] \
                || usage_error "$opt '$val': give the Node's name as 'kubectl get nodes' shows it (lower case)" ;;
        --prefix|--bin-dir|--socket|--link-dir|--systemd-root|--conf-dir|--host-python|--host-root|--serviceaccount-dir|--node-policy|--kubeconfig)
            if [ "$inline" -eq 0 ]; then
                [ $# -ge 2 ] || usage_error "$opt needs a value"
                val=$2
                shift
            fi
            case "$val" in
                /*) ;;
                *) usage_error "$opt '$val': give an absolute path" ;;
            esac ;;
    esac
    case "$opt" in
        --daemonset) MODE=daemonset ;;
        --uninstall) UNINSTALL=1 ;;
        -h|--help) usage; exit 0 ;;
        --prefix) PREFIX=$val ;;
        --bin-dir) BIN_DIR=$val ;;
        --socket) SOCKET=$val ;;
        --link-dir) LINK_DIR=$val; HOST_ONLY="$HOST_ONLY $opt" ;;
        --no-systemd) SYSTEMD=no; HOST_ONLY="$HOST_ONLY $opt" ;;
        --systemd-root) SYSTEMD_ROOT=$val; HOST_ONLY="$HOST_ONLY $opt" ;;
        --node-name) NODE_NAME=$val; HOST_ONLY="$HOST_ONLY $opt" ;;
        --kubeconfig) NODE_KUBECONFIG=$val; HOST_ONLY="$HOST_ONLY $opt" ;;
        --conf-dir) CONF_DIR=$val; DS_ONLY="$DS_ONLY $opt" ;;
        --host-python) HOST_PYTHON=$val; DS_ONLY="$DS_ONLY $opt" ;;
        --host-root) HOST_ROOT=$val; DS_ONLY="$DS_ONLY $opt" ;;
        --serviceaccount-dir) SA_DIR=$val; DS_ONLY="$DS_ONLY $opt" ;;
        --node-policy) NODE_POLICY=$val; DS_ONLY="$DS_ONLY $opt" ;;
        *) usage_error "unknown argument '$opt'" ;;
    esac
    shift
done

case "$MODE" in
    host) [ -z "$DS_ONLY" ] || usage_error "${DS_ONLY# } only apply to DaemonSet mode (--daemonset)"
          PREFIX=${PREFIX:-/opt/cni/rdmanet} ;;
    daemonset) [ -z "$HOST_ONLY" ] || usage_error "${HOST_ONLY# } only apply to host mode"
          PREFIX=${PREFIX:-/opt/rdmanet} ;;
    *) usage_error "RDMANET_INSTALL_MODE='$MODE': use host or daemonset" ;;
esac
for pair in "--bin-dir/RDMANET_CNI_BIN_DIR:$BIN_DIR" "--socket/RDMANET_DAEMON_SOCKET:$SOCKET" \
            "--conf-dir/RDMANET_CNI_CONF_DIR:$CONF_DIR" "--host-python/RDMANET_HOST_PYTHON:$HOST_PYTHON" \
            "--host-root/RDMANET_HOST_ROOT:$HOST_ROOT" "--serviceaccount-dir/RDMANET_SERVICEACCOUNT_DIR:$SA_DIR" \
            "--systemd-root/RDMANET_SYSTEMD_ROOT:$SYSTEMD_ROOT"; do
    case "${pair#*:}" in
        /*) ;;
        *) usage_error "${pair%%:*} '${pair#*:}': give an absolute path" ;;
    esac
done
case "$SYSTEMD" in
    auto|no) ;;
    *) usage_error "RDMANET_SYSTEMD='$SYSTEMD': use auto (the default: units when systemd runs) or no" ;;
esac
if ! [[ $REFRESH =~ ^[0-9]+([.][0-9]+)?$ && $REFRESH =~ [1-9] ]]; then
    usage_error "RDMANET_KUBECONFIG_REFRESH_SECONDS='$REFRESH': give a positive number of seconds"
fi

[ "$(id -u)" -eq 0 ] || die "run as root"

# ------------------------------------------------------------------------------------ helpers

is_rdmanet_shim() {  # is_rdmanet_shim PATH: a regular file rendered by rdmanet/node/launcher.py
    [ -f "$1" ] && [ ! -L "$1" ] && [ "$(sed -n 2p "$1" 2>/dev/null | cut -c1-${#SHIM_MARK})" = "$SHIM_MARK" ]
}

remove_beside_shim() {  # remove_beside_shim PATH: what is ours beside a shim, whoever owns PATH now:
    # temporaries a crash left, .<name>.code (the hot path the shim compiled: rdmanet/node/boot.py) and
    # .<name>.texts (code its in-process calls compiled from text: rdmanet/node/compiled_texts.py)
    rm -f "$(dirname "$1")/.$(basename "$1")".*.tmp "$(dirname "$1")/.$(basename "$1").code" "$(dirname "$1")/.$(basename "$1").texts"
}

remove_shim() {  # remove_shim PATH: the shim (only while it is ours) and what is ours beside it
    local f=$1
    remove_beside_shim "$f"
    if is_rdmanet_shim "$f"; then
        rm -f "$f"
        say --event removed "removed $f" path "$f"
    elif [ -e "$f" ] || [ -L "$f" ]; then
        say --event left "left $f: not an rdmanet shim" path "$f"
    fi
}

check_socket_dir() {  # the directory of --socket: only root may bind a socket there (rdmanet/node/socket_dir.py)
    local out
    out=$("$PREFIX/bin/python" -I -m rdmanet.node.socket_dir "$SOCKET" 2>&1) \
        || die --event unsafe_socket_dir "--socket $SOCKET: $out"
}

# ------------------------------------------------------------------------------------ host mode: systemd

is_unit_path() {  # is_unit_path PATH: where install.sh puts one of its units (under some root)
    case "$1" in
        */etc/systemd/system/rdmanet.socket|*/etc/systemd/system/rdmanet.service) return 0 ;;
        *) return 1 ;;
    esac
}

is_rdmanet_unit() {  # is_rdmanet_unit PATH: a unit file rdmanet/cli/systemd_units.py wrote
    is_unit_path "$1" && [ -f "$1" ] && [ ! -L "$1" ] && [ "$(head -n 1 "$1" 2>/dev/null | cut -c1-${#UNIT_MARK})" = "$UNIT_MARK" ]
}

systemd_runs() {  # systemd_runs ROOT: systemd is the init of ROOT's system (sd_booted(3))
    [ -d "${1%/}/run/systemd/system" ]
}

host_systemd() {  # host_systemd MANIFEST: the socket-activated daemon (units listed in MANIFEST), or how to start one
    local manifest=$1 root=$SYSTEMD_ROOT out listened="" start="$PREFIX/bin/rdmanet daemon --socket $SOCKET"
    local fallback="the shims run the plugins in-process (every call pays the imports) until a daemon answers; start it as root, e.g. from your init system: "
    if [ "$SYSTEMD" = no ]; then
        say "no systemd units (--no-systemd / RDMANET_SYSTEMD=no); $fallback$start"
        if is_rdmanet_unit "${root%/}/etc/systemd/system/rdmanet.socket"; then
            say "rdmanet.socket from an earlier install is still there; 'install.sh --uninstall' or 'systemctl disable --now rdmanet.socket' removes it"
        fi
        return
    fi
    if ! systemd_runs "$root"; then
        say "systemd does not run this host (no ${root%/}/run/systemd/system): no units installed; $fallback$start"
        return
    fi
    command -v systemctl >/dev/null || die "systemd runs this host but systemctl is not on PATH; install it, or use --no-systemd"
    if is_rdmanet_unit "${root%/}/etc/systemd/system/rdmanet.socket"; then  # an earlier install's socket path
        listened=$(sed -n 's/^ListenStream=//p' "${root%/}/etc/systemd/system/rdmanet.socket")
    fi
    out=$("$PREFIX/bin/python" -I -m rdmanet.cli.systemd_units write "${root%/}/etc/systemd/system" \
            --rdmanet "$PREFIX/bin/rdmanet" --socket "$SOCKET" 2>&1) || die "$out"
    echo "$out" >> "$manifest"
    if [ "$root" != / ]; then
        systemctl --root="$root" --quiet enable rdmanet.socket || die "systemctl --root $root enable rdmanet.socket failed"
        say "installed and enabled rdmanet.socket and rdmanet.service under $root (systemctl --root: nothing started)"
        return
    fi
    if ! systemctl --quiet is-active rdmanet.socket && [ -S "$SOCKET" ] \
            && "$PREFIX/bin/rdmanet" daemon --check --socket "$SOCKET" >/dev/null 2>&1; then
        say "a daemon that systemd did not start answers on $SOCKET: rdmanet.socket takes the path over; stop that daemon"
    fi
    systemctl daemon-reload
    systemctl --quiet enable --now rdmanet.socket \
        || die "systemctl enable --now rdmanet.socket failed: see 'systemctl status rdmanet.socket'; or use --no-systemd"
    if [ -n "$listened" ] && [ "$listened" != "$SOCKET" ]; then  # a listening socket keeps its path until restarted
        systemctl restart rdmanet.socket
        say "rdmanet.socket moved from $listened to $SOCKET"
    fi
    systemctl try-restart rdmanet.service  # a daemon of an earlier install: on the new code now
    say "enabled rdmanet.socket: systemd listens on $SOCKET and the first CNI call starts rdmanet.service ('rdmanet daemon'; 'rdmanet daemon --check' starts and asks it now). Opt out: --no-systemd"
}

remove_unit() {  # remove_unit PATH: disabled (and stopped) first; removed only while it is the one install.sh writes
    local f=$1 name root
    name=$(basename "$f")
    root=${f%/etc/systemd/system/*}
    root=${root:-/}
    rm -f "$(dirname "$f")/.$name".*.tmp
    if ! is_rdmanet_unit "$f"; then
        if [ -e "$f" ] || [ -L "$f" ]; then say "left $f: not the unit install.sh writes"; fi
        return 0
    fi
    if [ "$root" = / ] && systemd_runs /; then
        systemctl --quiet disable --now "$name" || say "systemctl disable --now $name failed; removing $f anyway"
        RELOAD=1
    else
        systemctl --root="$root" --quiet disable "$name" || say "systemctl --root $root disable $name failed; removing $f anyway"
    fi
    rm -f "$f"
    say "removed $f"
}

# ------------------------------------------------------------------------------------ host mode

host_leftovers() {  # what the plugins and `rdmanet demo` left, and the directories install created (rdmanet/cli/leftovers.py)
    local args=(--run-dir "$(dirname "$SOCKET")") d line
    if [ -f "$PREFIX/created-dirs" ]; then
        while IFS= read -r d; do
            [ -n "$d" ] && args+=(--created-dir "$d")
        done < "$PREFIX/created-dirs"
    fi
    if [ ! -x "$PREFIX/bin/python" ]; then
        say "left what the plugins and the demo made (lease-ipam's /var/lib/cni/lease-ipam/rdmanet-demo, $(dirname "$SOCKET")/locks): no venv in $PREFIX to clear them with"
        return
    fi
    while IFS= read -r line; do
        say "$line"
    done < <("$PREFIX/bin/python" -I -m rdmanet.cli.leftovers "${args[@]}" 2>&1)
}

host_uninstall() {
    local manifest f
    RELOAD=0
    for manifest in "$PREFIX/installed-files" "$PREFIX/installed-files.new"; do  # .new: a run that failed
        [ -f "$manifest" ] || continue
        while IFS= read -r f; do
            [ -n "$f" ] || continue
            if [ -L "$f" ]; then  # the rdmanet link, only while it points into this venv
                if [ "$(readlink "$f")" = "$PREFIX/bin/rdmanet" ]; then
                    rm -f "$f"
                    say "removed $f"
                else
                    say "left $f: it points elsewhere now"
                fi
            elif is_unit_path "$f"; then
                remove_unit "$f"
            else
                remove_shim "$f"
            fi
        done < "$manifest"
    done
    [ "$RELOAD" -eq 0 ] || systemctl daemon-reload
    host_leftovers
    if [ -f "$PREFIX/pyvenv.cfg" ]; then  # only ever a venv: never a directory we did not make
        rm -rf "$PREFIX"
        say "removed $PREFIX"
    elif [ -e "$PREFIX" ]; then
        say "left $PREFIX: not a venv"
    fi
    echo "rdmanet uninstalled"
}

host_node_name() {  # RDMANET_NODE_NAME in the daemon's environment file: given, or the Node matching this host
    local args=(--env-file "${SYSTEMD_ROOT%/}/etc/default/rdmanet") out rc=0
    [ -z "$NODE_NAME" ] || args+=(--name "$NODE_NAME")
    [ -z "$NODE_KUBECONFIG" ] || args+=(--kubeconfig "$NODE_KUBECONFIG")
    out=$("$PREFIX/bin/python" -I -m rdmanet.cli.node_name "${args[@]}" 2>&1) || rc=$?
    case "$rc" in
        0|3) say "$out" ;;  # 3: no Node confirmed, nothing written (the daemon runs no node GC)
        *) die "could not set the Node name: $out" ;;
    esac
}

host_install() {
    local src manifest exe answer missing="" p f d
    src=$(cd "$(dirname "$0")" && pwd)
    manifest=$PREFIX/installed-files
    [ "$PREFIX" != / ] || die "--prefix /: give a directory of its own"
    if [ -d "$PREFIX" ] && [ ! -f "$PREFIX/pyvenv.cfg" ] && [ -n "$(ls -A "$PREFIX")" ]; then
        die "--prefix $PREFIX exists and is not a venv: not installing into it"
    fi

    for p in python3 python3-venv iproute2; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        apt-get update -qq
        # shellcheck disable=SC2086  # one word per package
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    fi

    [ -x "$PREFIX/bin/python" ] || /usr/bin/python3 -m venv "$PREFIX"
    "$PREFIX/bin/pip" install -q --disable-pip-version-check --upgrade "$src"
    check_socket_dir

    for d in "$BIN_DIR" "$LINK_DIR"; do  # a directory install makes goes with --uninstall (when empty by then)
        if [ ! -e "$d" ]; then
            mkdir -p "$d"
            grep -qxF "$d" "$PREFIX/created-dirs" 2>/dev/null || echo "$d" >> "$PREFIX/created-dirs"
        fi
    done
    : > "$manifest.new"
    if [ -f "$manifest" ]; then  # keep what an earlier run wrote elsewhere (another --bin-dir)
        while IFS= read -r f; do
            if [ -L "$f" ] && [ "$(readlink "$f")" = "$PREFIX/bin/rdmanet" ]; then
                echo "$f" >> "$manifest.new"
            elif is_rdmanet_shim "$f" || is_rdmanet_unit "$f"; then
                echo "$f" >> "$manifest.new"
            elif [ ! -L "$f" ] && ! is_unit_path "$f"; then
                remove_beside_shim "$f"  # a shim replaced or removed since: forgotten, ours beside it removed
            fi
        done < "$manifest"
    fi
    for exe in $PLUGINS; do
        # a stdlib-only shim (rdmanet/node/launcher.py): forwards to `rdmanet daemon` when it runs, else runs
        # the plugin in-process from this venv; written by write + rename
        "$PREFIX/bin/python" -I -m rdmanet.node "$BIN_DIR" "$exe" --socket "$SOCKET" >/dev/null
        echo "$BIN_DIR/$exe" >> "$manifest.new"
        answer=$(env -i CNI_COMMAND=VERSION "$BIN_DIR/$exe" </dev/null) || true
        case "$answer" in
            *supportedVersions*) say "installed $BIN_DIR/$exe: $answer" ;;
            *) die "$BIN_DIR/$exe does not answer VERSION: $answer" ;;
        esac
    done
    ln -sfn "$PREFIX/bin/rdmanet" "$LINK_DIR/rdmanet"
    echo "$LINK_DIR/rdmanet" >> "$manifest.new"
    host_node_name
    host_systemd "$manifest.new"
    awk '!seen[$0]++' "$manifest.new" > "$manifest.tmp"
    rm -f "$manifest.new"
    mv -f "$manifest.tmp" "$manifest"
    echo "rdmanet installed in $PREFIX; try: rdmanet demo"
}

# ------------------------------------------------------------------------------------ DaemonSet mode

KUBE_DIR=$CONF_DIR/rdmanet.d
KUBECONFIG_NAME=rdmanet.kubeconfig

host_run() {  # host_run [NAME=VALUE ...] -- COMMAND [ARG ...]: as the node runs it (its root, only that env)
    local assigns=()
    while [ "$1" != -- ]; do
        assigns+=("$1")
        shift
    done
    shift
    if [ "$HOST_ROOT" = / ]; then
        env -i "${assigns[@]}" "$@"
    else
        env -i "${assigns[@]}" "$CHROOT" "$HOST_ROOT" "$@"
    fi
}

kubeconfig() {  # kubeconfig once|loop (loop: in the background, a direct child of this process)
    local args=("$SA_DIR" "$KUBE_DIR" "$KUBECONFIG_NAME" "${KUBERNETES_SERVICE_HOST:-}" \
                "${KUBERNETES_SERVICE_PORT:-}" "$REFRESH" "$$")
    if [ "$1" = loop ]; then
        # a simple command in the background: one fork, then python, whose parent is this process
        "$PREFIX/bin/python" -I -m rdmanet.cli.sa_kubeconfig loop "${args[@]}" &
    else
        "$PREFIX/bin/python" -I -m rdmanet.cli.sa_kubeconfig "$1" "${args[@]}"
    fi
}

daemonset_uninstall() {
    local exe f lock
    for exe in $PLUGINS; do
        remove_shim "$BIN_DIR/$exe"
    done
    if [ -d "$KUBE_DIR" ]; then
        # The pod's refresh loop takes this lock for each round and writes nothing once the
        # kubeconfig is gone (rdmanet/cli/sa_kubeconfig.py): holding it here, no round that began
        # before this removal can put the files back after it.
        exec {lock}<"$KUBE_DIR"
        flock -x "$lock"
        for f in "$KUBE_DIR/$KUBECONFIG_NAME" "$KUBE_DIR/ca.crt" "$KUBE_DIR/.$KUBECONFIG_NAME".*.tmp "$KUBE_DIR"/.ca.crt.*.tmp; do
            if [ -f "$f" ]; then
                rm -f "$f"
                say --event removed "removed $f" path "$f"
            fi
        done
        if rmdir "$KUBE_DIR" 2>/dev/null; then
            say --event removed "removed $KUBE_DIR" path "$KUBE_DIR"
        else
            say --event left "left $KUBE_DIR: it holds files rdmanet did not write" path "$KUBE_DIR"
        fi
        exec {lock}<&-
    fi
    say --event uninstalled "rdmanet shims and kubeconfig removed; the daemon keeps running until the pod is deleted"
}

daemonset_install() {
    local exe answer version rc out
    if [ ! -x "$PREFIX/bin/python" ] || [ ! -x "$PREFIX/bin/rdmanet" ]; then
        die "no rdmanet in --prefix $PREFIX ($PREFIX/bin/rdmanet is missing): give the image's venv"
    fi
    [ -d "$HOST_ROOT" ] || die "--host-root $HOST_ROOT (RDMANET_HOST_ROOT) is not a directory: the node's root, /proc/1/root with hostPID"
    check_socket_dir
    if [ "$HOST_ROOT" != / ]; then
        CHROOT=$(command -v chroot) || die "chroot is not in the image; it is needed for --host-root $HOST_ROOT"
    fi

    # 1. the node's interpreter
    version=$(host_run -- "$HOST_PYTHON" -I -S -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>&1 </dev/null) \
        || die "--host-python $HOST_PYTHON (RDMANET_HOST_PYTHON) does not run under --host-root $HOST_ROOT: $version." \
               "The shims run on the node under it: install python3 (>= 3.6) on the node or point --host-python at the node's python3."
    case "$version" in
        3.[6-9]|3.[1-9][0-9]) ;;
        *) die "--host-python $HOST_PYTHON (RDMANET_HOST_PYTHON) under --host-root $HOST_ROOT is Python $version; the shims need Python >= 3.6 on the node" ;;
    esac
    say --event host_python "the node's $HOST_PYTHON is Python $version" python "$HOST_PYTHON" version "$version"

    # 2. the shims, by write + rename, each checked to be the very file the node runs (same inode
    #    as HOST_ROOT/BIN_DIR/<shim>: rdmanet/cli/node_view.py) and asked VERSION the way the node runs it
    out=$(mkdir -p "$BIN_DIR" 2>&1 && "$PREFIX/bin/python" -I -m rdmanet.node "$BIN_DIR" --daemon-only \
            --python "$HOST_PYTHON" --socket "$SOCKET" 2>&1 >/dev/null) \
        || die "cannot write the shims into --bin-dir $BIN_DIR: $out"
    for exe in $PLUGINS; do
        out=$("$PREFIX/bin/python" -I -m rdmanet.cli.node_view same-file "$BIN_DIR/$exe" "$HOST_ROOT" 2>&1) \
            || die --event shim_not_on_node "$out"
        answer=$(host_run CNI_COMMAND=VERSION -- "$BIN_DIR/$exe" </dev/null) || true
        case "$answer" in
            *supportedVersions*) say --event installed "installed $BIN_DIR/$exe (daemon only, $HOST_PYTHON)" \
                                     path "$BIN_DIR/$exe" version "$answer" ;;
            *) die "$BIN_DIR/$exe does not answer VERSION on the node (under --host-root $HOST_ROOT): '$answer';" \
                   "is --bin-dir mounted at the same path as on the node?" ;;
        esac
    done

    # 3. the kubeconfig, and the loop that keeps it fresh (it exits when its parent does: after
    #    the exec below that is the daemon; the kernel signals it (PR_SET_PDEATHSIG), and it also
    #    checks its parent every second)
    rc=0
    kubeconfig once || rc=$?
    case "$rc" in
        0) kubeconfig loop ;;
        3) ;;  # skipped, logged
        *) die "cannot write the kubeconfig in $KUBE_DIR" ;;
    esac

    # 4. the daemon, in the foreground, as this very process
    say --event daemon_starting "starting rdmanet daemon on $SOCKET${NODE_POLICY:+ with node policy $NODE_POLICY}" \
        socket "$SOCKET" node_policy "${NODE_POLICY:-}"
    exec "$PREFIX/bin/rdmanet" daemon --socket "$SOCKET" ${NODE_POLICY:+--node-policy "$NODE_POLICY"}
}

# ------------------------------------------------------------------------------------ main

if [ "$MODE" = daemonset ]; then
    if [ "$UNINSTALL" -eq 1 ]; then daemonset_uninstall; else daemonset_install; fi
else
    if [ "$UNINSTALL" -eq 1 ]; then host_uninstall; else host_install; fi
fi
