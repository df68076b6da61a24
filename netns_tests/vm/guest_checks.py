"""RDMA checks run INSIDE the test VM (Debian's kernel, rdma_rxe), reported as one JSON document.

Run by netns_tests/test_vm_rdma.py through harness.run_in_vm with the venv's interpreter:
``python guest_checks.py`` as root in the guest. Writes ``$RDMANET_VM_RESULTS/checks.json``
(and prints the same JSON on stdout). Every section is recorded even when an earlier one failed:
each is ``{"ok": bool, ..., "error": "<traceback tail>"}`` with its own facts; the host-side tests
assert on them one by one. The guest is thrown away after the run, so nothing is undone here
beyond what a later section needs.

Sections, in order (later ones rely on the objects earlier ones create):
  setup      modprobe rdma_rxe; veth pair rxenet0/rxenet1; rdma link add rxe0 ... netdev rxenet0
  mode       netns_mode() and `rdma system show`
  devices    list_devices(), device_by_name() and `rdma -j dev show`
  sysfs      rdma_devices_for_netdev() for the rxe netdev, its peer and lo; the rxe parent file
  move       move_device() to a new netns: good request (EOPNOTSUPP), bad index, bad fd
  plugin     macvlan-rdma ADD / DEL by raw exec, host-local IPAM, device-info file, GIDs of net1
  exclusive  switch to exclusive mode; netns_mode(); move again; ADD with rdma "required" fails 101
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
import traceback

RESULTS = os.environ.get("RDMANET_VM_RESULTS") or os.getcwd()
VENV_BIN = os.path.dirname(os.path.abspath(sys.executable))
PLUGIN = os.path.join(VENV_BIN, "macvlan-rdma")
CNI_PATH = "/usr/lib/cni"
NETDEV, PEER, RXE = "rxenet0", "rxenet1", "rxe0"
SUBNET = "198.18.5.0/24"
IPAM_DIR = "/tmp/rdmanet-vm-ipam"
DEVINFO = os.path.join(RESULTS, "devinfo", "vmpod1-net1.json")
DEVINFO_EXCL = os.path.join(RESULTS, "devinfo", "vmpod2-net1.json")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

out: dict = {"python": sys.executable, "kernel": os.uname().release}
T0 = time.monotonic()


def sh(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=120, check=False, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def section(name: str):
    """Run the decorated function now; record its dict (+ ok, seconds) or its error under name."""

    def run(fn):
        entry: dict = {}
        start = time.monotonic()
        try:
            entry.update(fn(entry) or {})
            entry["ok"] = True
        except BaseException:
            entry["ok"] = False
            entry["error"] = traceback.format_exc()[-3000:]
        entry["seconds"] = round(time.monotonic() - start, 2)
        out[name] = entry
        return fn

    return run


def errno_of(fn, *args):
    """The errno fn(*args) raised as OSError (an int), "no error", or another exception's repr."""
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    except Exception as e:  # noqa: BLE001 - recorded for the host-side assertion message
        return repr(e)
    return "no error"


def delete_all_netns() -> None:
    for line in sh("ip", "netns", "list").stdout.splitlines():
        if line.strip():
            sh("ip", "netns", "del", line.split()[0], check=False)


def cni(command: str, container: str, netns: str, conf: dict) -> dict:
    env = {
        "PATH": PATH,
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "net1",
        "CNI_PATH": CNI_PATH,
        "RDMANET_LOG_LEVEL": "INFO",
    }
    start = time.monotonic()
    proc = subprocess.run([PLUGIN], input=json.dumps(conf), env=env, capture_output=True, text=True, timeout=120, check=False)
    doc = None
    if proc.stdout.strip():
        try:
            doc = json.loads(proc.stdout)
        except ValueError:
            doc = {"unparsed stdout": proc.stdout[-2000:]}
    return {"rc": proc.returncode, "stdout": doc, "stderr": proc.stderr[-3000:], "seconds": round(time.monotonic() - start, 2)}


def net_conf(name: str, devinfo: str) -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": name,
        "type": "macvlan-rdma",
        "master": NETDEV,
        "mode": "bridge",
        "rdma": "required",
        "runtimeConfig": {"CNIDeviceInfoFile": devinfo},
        "ipam": {"type": "host-local", "dataDir": IPAM_DIR, "ranges": [[{"subnet": SUBNET}]]},
    }


def link_in(ns: str, ifname: str) -> dict | None:
    proc = sh("ip", "-n", ns, "-d", "-j", "addr", "show", "dev", ifname, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    info = json.loads(proc.stdout)[0]
    return {
        "kind": info.get("linkinfo", {}).get("info_kind"),
        "macvlan_mode": info.get("linkinfo", {}).get("info_data", {}).get("mode"),
        "ipv4": [f"{a['local']}/{a['prefixlen']}" for a in info.get("addr_info", []) if a.get("family") == "inet"],
        "operstate": info.get("operstate"),
    }


def gids_for(ndev: str) -> list[dict]:
    """RoCE GID table entries of rxe0 port 1 whose netdev is ndev (kernel-vm.md: a macvlan on the
    rxe netdev gets its own entries, named after it inside the pod)."""
    base = f"/sys/class/infiniband/{RXE}/ports/1"
    found = []
    try:
        indexes = sorted(os.listdir(f"{base}/gid_attrs/ndevs"), key=int)
    except OSError:
        return found
    for i in indexes:
        try:
            with open(f"{base}/gid_attrs/ndevs/{i}") as f:
                name = f.read().strip()
        except OSError:  # unused entries answer EINVAL
            continue
        if name != ndev:
            continue
        with open(f"{base}/gids/{i}") as f:
            gid = f.read().strip()
        with open(f"{base}/gid_attrs/types/{i}") as f:
            kind = f.read().strip()
        found.append({"index": int(i), "gid": gid, "type": kind})
    return found


# ------------------------------------------------------------------------------------ checks

@section("setup")
def _setup(entry):
    sh("modprobe", "rdma_rxe")
    sh("ip", "link", "add", NETDEV, "type", "veth", "peer", "name", PEER)
    sh("ip", "link", "set", NETDEV, "up")
    sh("ip", "link", "set", PEER, "up")
    sh("rdma", "link", "add", RXE, "type", "rxe", "netdev", NETDEV)
    return {"rdma_link": sh("rdma", "link", "show").stdout.strip()}


# Imported after setup: importing pyroute2 costs seconds under TCG, and a failing import must
# still leave the setup facts in the report.
try:
    from cni.linux import rdma_netlink as rn
    from cni.linux import sysfs
except BaseException:  # each section below then records its NameError
    out["import_error"] = traceback.format_exc()[-3000:]


@section("mode")
def _mode(entry):
    entry["lib"] = rn.netns_mode()
    text = sh("rdma", "system", "show").stdout.strip()
    entry["rdma_system_show"] = text
    words = text.split()
    entry["tool"] = words[words.index("netns") + 1] if "netns" in words else None


@section("devices")
def _devices(entry):
    devices = rn.list_devices()
    entry["lib"] = [{"index": d.index, "name": d.name} for d in devices]
    entry["tool"] = [{"index": d["ifindex"], "name": d["ifname"]} for d in json.loads(sh("rdma", "-j", "dev", "show").stdout)]
    by_name = rn.device_by_name(RXE)
    entry["by_name"] = {"index": by_name.index, "name": by_name.name} if by_name else None
    entry["by_name_missing"] = rn.device_by_name("nosuchdev0")
    with rn.RdmaNetlink() as nl:  # the socket API, several requests on one socket
        entry["socket"] = {"mode": nl.netns_mode(), "names": [d.name for d in nl.list_devices()]}


@section("sysfs")
def _sysfs(entry):
    entry["netdev"] = sysfs.rdma_devices_for_netdev(NETDEV)
    entry["peer"] = sysfs.rdma_devices_for_netdev(PEER)
    entry["lo"] = sysfs.rdma_devices_for_netdev("lo")
    with open(f"/sys/class/infiniband/{RXE}/parent") as f:
        entry["parent_file"] = f.read().strip()
    entry["has_device_link"] = os.path.exists(f"/sys/class/infiniband/{RXE}/device")
    entry["pci_address"] = sysfs.pci_address_of_netdev(NETDEV)


@section("move")
def _move(entry):
    dev = rn.device_by_name(RXE)
    sh("ip", "netns", "add", "rdmanet-move")
    fd = os.open("/run/netns/rdmanet-move", os.O_RDONLY | os.O_CLOEXEC)
    null = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
    try:
        entry["index"] = dev.index
        entry["good_request"] = errno_of(rn.move_device, dev.index, fd)
        bad_index = max(d.index for d in rn.list_devices()) + 1000
        entry["bad_index"] = errno_of(rn.move_device, bad_index, fd)
        entry["bad_fd"] = errno_of(rn.move_device, dev.index, null)
        still = rn.device_by_name(RXE)
        entry["still_in_init_netns"] = still is not None and still.index == dev.index
    finally:
        os.close(fd)
        os.close(null)
        sh("ip", "netns", "del", "rdmanet-move", check=False)


@section("plugin")
def _plugin(entry):
    sh("ip", "netns", "add", "rdmanet-pod1")
    netns = "/run/netns/rdmanet-pod1"
    conf = net_conf("vmnet", DEVINFO)
    entry["cni_path_has_host_local"] = os.access(f"{CNI_PATH}/host-local", os.X_OK)
    entry["add"] = add = cni("ADD", "vmpod1", netns, conf)
    try:
        with open(DEVINFO) as f:
            entry["devinfo"] = json.load(f)
    except (OSError, ValueError) as e:
        entry["devinfo"] = repr(e)
    entry["link"] = link_in("rdmanet-pod1", "net1")
    entry["gids"] = gids_for("net1")
    entry["ipam_files"] = sorted(os.listdir(f"{IPAM_DIR}/vmnet")) if os.path.isdir(f"{IPAM_DIR}/vmnet") else []
    if add["rc"] == 0:
        entry["del"] = cni("DEL", "vmpod1", netns, conf)
        entry["link_after_del"] = link_in("rdmanet-pod1", "net1")
        entry["ipam_files_after_del"] = sorted(os.listdir(f"{IPAM_DIR}/vmnet")) if os.path.isdir(f"{IPAM_DIR}/vmnet") else []
    sh("ip", "netns", "del", "rdmanet-pod1", check=False)


@section("exclusive")
def _exclusive(entry):
    delete_all_netns()
    # netns teardown is asynchronous in the kernel (cleanup_net): EBUSY until it has run
    deadline = time.monotonic() + 20
    attempts = 0
    while True:
        attempts += 1
        proc = sh("rdma", "system", "set", "netns", "exclusive", check=False)
        if proc.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    entry["set_attempts"] = attempts
    entry["set_rc"] = proc.returncode
    entry["set_stderr"] = proc.stderr.strip()
    entry["rdma_system_show"] = sh("rdma", "system", "show").stdout.strip()
    entry["lib"] = rn.netns_mode()
    sh("ip", "netns", "add", "rdmanet-pod2")
    netns = "/run/netns/rdmanet-pod2"
    fd = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    try:
        entry["move_good_request"] = errno_of(rn.move_device, rn.device_by_name(RXE).index, fd)
    finally:
        os.close(fd)
    conf = net_conf("vmnet2", DEVINFO_EXCL)
    entry["add"] = cni("ADD", "vmpod2", netns, conf)
    entry["link_after_failed_add"] = link_in("rdmanet-pod2", "net1")
    entry["devinfo_written"] = os.path.exists(DEVINFO_EXCL)
    entry["ipam_files"] = sorted(os.listdir(f"{IPAM_DIR}/vmnet2")) if os.path.isdir(f"{IPAM_DIR}/vmnet2") else []


out["total_seconds"] = round(time.monotonic() - T0, 2)
text = json.dumps(out, indent=1, default=repr)
with open(os.path.join(RESULTS, "checks.json.tmp"), "w") as f:
    f.write(text)
os.replace(os.path.join(RESULTS, "checks.json.tmp"), os.path.join(RESULTS, "checks.json"))
print(text)
