"""RDMA checks run INSIDE the test VM (Debian's kernel, rdma_rxe), reported as one JSON document.

Run by vm/shared_boot.py (one boot shared by netns_tests/test_vm_rdma.py and test_vm_vf.py)
through harness.run_in_vm with the venv's interpreter: ``python guest_checks.py [--netdevsim KO]
[--netdevsim-error TEXT]`` as root in the guest. Writes ``$RDMANET_VM_RESULTS/checks.json``
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
SR-IOV VF settings on netdevsim (built by prepare.sh; Debian's kernel has none), vf_settings.py:
  netdevsim  insmod netdevsim.ko (its deps by modprobe); netdevsim10 with one port; 4 VFs; VF 1
             spoofchk on with the ip tool (real NICs start with it on, netdevsim off); vfinfo_list
  vf_apply   read_vf, apply_vf(mac, vlan 100 qos 3, spoofchk off, trust on, link_state disable,
             rates 10/100) on VF 1: snapshot, read back, `ip -d -j link show` vfinfo_list; again
  vf_restore restore_vf(the snapshot after a JSON round trip): vfinfo_list of the PF again
  vf_8021ad  vlan 200 qos 5 proto 802.1ad on VF 2, read back, vfinfo_list, restore; the same
             through pyroute2's own vf={"vlan": [...]} (a 14-byte IFLA_VF_VLAN_INFO)
  vf_errors  VF 4 (of 0-3) by read_vf / apply_vf / the kernel itself; qos 8 refused by the driver;
             rates refused in switchdev mode (EOPNOTSUPP) after a VLAN change, which is undone
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
import time
import traceback

_parser = argparse.ArgumentParser()
_parser.add_argument("--netdevsim", default="", help="path of netdevsim.ko for the VF sections")
_parser.add_argument("--netdevsim-error", default="", help="why there is none (recorded in the report)")
ARGS = _parser.parse_args()

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


# ------------------------------------------------------------------------ SR-IOV VF settings

NSIM_ID = 10
NSIM_DEV = f"/sys/bus/netdevsim/devices/netdevsim{NSIM_ID}"
NUM_VFS = 4
VF, VF_AD = 1, 2
WANTED = {"mac": "02:5a:00:00:00:01", "vlan": 100, "qos": 3, "spoofchk": False, "trust": True,
          "link_state": "disable", "min_tx_rate": 10, "max_tx_rate": 100}
nsim: dict = {}  # pf name and index, for the sections after netdevsim

try:
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    from cni.core.errors import CNIError
    from cni.linux import vf_settings as vfs
except BaseException:  # each VF section then records its NameError
    out["vf_import_error"] = traceback.format_exc()[-3000:]


def vfinfo(pf: str) -> list:
    return json.loads(sh("ip", "-d", "-j", "link", "show", "dev", pf).stdout)[0].get("vfinfo_list")


def nl_errno(fn) -> object:
    """The errno of the NetlinkError fn() raises, "no error", or another exception's repr."""
    try:
        fn()
    except NetlinkError as e:
        return e.code
    except Exception as e:  # noqa: BLE001 - recorded for the host-side assertion message
        return repr(e)
    return "no error"


def pf_of_nsim() -> tuple[str, int]:
    if not nsim:
        raise RuntimeError("no netdevsim PF: the netdevsim section failed (see it)")
    return nsim["pf"], nsim["index"]


def cni_error(fn, *args) -> dict:
    """{"code", "msg", "details"} of the CNIError fn(*args) raises, or {"no error": result}."""
    try:
        result = fn(*args)
    except CNIError as exc:
        return {"code": exc.code, "msg": exc.msg, "details": exc.details}
    return {"no error": repr(result)}


@section("netdevsim")
def _netdevsim(entry):
    if not ARGS.netdevsim:
        raise RuntimeError(f"no netdevsim.ko from prepare.sh: {ARGS.netdevsim_error or 'no reason given'}")
    deps = [d for d in sh("modinfo", "-F", "depends", ARGS.netdevsim).stdout.strip().split(",") if d]
    for dep in deps:
        sh("modprobe", dep)
    sh("insmod", ARGS.netdevsim)
    entry["depends"] = deps
    with open("/sys/bus/netdevsim/new_device", "w") as f:
        f.write(f"{NSIM_ID} 1")
    deadline = time.monotonic() + 10
    while not os.path.isdir(f"{NSIM_DEV}/net") or not os.listdir(f"{NSIM_DEV}/net"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no port netdev under {NSIM_DEV}/net")
        time.sleep(0.05)
    with open(f"{NSIM_DEV}/sriov_numvfs", "w") as f:
        f.write(str(NUM_VFS))
    with open(f"{NSIM_DEV}/sriov_numvfs") as f:
        entry["sriov_numvfs"] = int(f.read())
    pf = sorted(os.listdir(f"{NSIM_DEV}/net"))[0]
    with open(f"/sys/class/net/{pf}/ifindex") as f:
        index = int(f.read())
    nsim.update(pf=pf, index=index)
    entry.update(pf=pf, index=index)
    entry["vfinfo_initial"] = vfinfo(pf)
    sh("ip", "link", "set", "dev", pf, "vf", str(VF), "spoofchk", "on")
    entry["vfinfo_before"] = vfinfo(pf)


@section("vf_apply")
def _vf_apply(entry):
    pf, index = pf_of_nsim()
    with IPRoute() as ipr:
        entry["read_before"] = vfs.read_vf(ipr, index, VF).to_dict()
        start = time.monotonic()
        snap = vfs.apply_vf(ipr, index, VF, vfs.VfSettings(**WANTED))
        entry["apply_seconds"] = round(time.monotonic() - start, 3)
        entry["snapshot"] = snap.to_dict()
        entry["read_after"] = vfs.read_vf(ipr, index, VF).to_dict()
        entry["snapshot_again"] = vfs.apply_vf(ipr, index, VF, vfs.VfSettings(**WANTED)).to_dict()
    entry["vfinfo_after"] = vfinfo(pf)


@section("vf_restore")
def _vf_restore(entry):
    pf, index = pf_of_nsim()
    # the plugin keeps the snapshot in a JSON state file between ADD and DEL
    snap = vfs.VfSettings.from_dict(json.loads(json.dumps(out["vf_apply"]["snapshot"])))
    with IPRoute() as ipr:
        vfs.restore_vf(ipr, index, VF, snap)
        entry["read_after"] = vfs.read_vf(ipr, index, VF).to_dict()
    entry["vfinfo_after"] = vfinfo(pf)


@section("vf_8021ad")
def _vf_8021ad(entry):
    pf, index = pf_of_nsim()
    entry["vfinfo_before"] = vfinfo(pf)
    with IPRoute() as ipr:
        snap = vfs.apply_vf(ipr, index, VF_AD, vfs.VfSettings(vlan=200, qos=5, vlan_proto="802.1AD"))
        entry["snapshot"] = snap.to_dict()
        entry["read_after"] = vfs.read_vf(ipr, index, VF_AD).to_dict()
        entry["vfinfo_after"] = vfinfo(pf)
        vfs.restore_vf(ipr, index, VF_AD, vfs.VfSettings.from_dict(json.loads(json.dumps(snap.to_dict()))))
        entry["vfinfo_restored"] = vfinfo(pf)
        # pyroute2's own IFLA_VF_VLAN_INFO is 2 bytes short of struct ifla_vf_vlan_info
        # (vf_settings.VlanListMsg): what the kernel says to it
        entry["pyroute2_vlan_list_errno"] = nl_errno(lambda: ipr.link(
            "set", index=index, vf={"vf": VF_AD, "vlan": [{"vlan": 200, "qos": 5, "proto": 0x88A8}]}))
        entry["vfinfo_after_pyroute2"] = vfinfo(pf)


@section("vf_errors")
def _vf_errors(entry):
    pf, index = pf_of_nsim()
    bad = NUM_VFS  # VFs are 0 .. NUM_VFS-1
    entry["vfinfo_before"] = vfinfo(pf)
    with IPRoute() as ipr:
        entry["read_missing"] = cni_error(vfs.read_vf, ipr, index, bad)
        entry["apply_missing"] = cni_error(vfs.apply_vf, ipr, index, bad, vfs.VfSettings(trust=True))
        # the kernel's own answer for that VF, and how apply_vf reports it when it gets that far
        entry["kernel_missing_errno"] = nl_errno(lambda: ipr.link("set", index=index, vf={"vf": bad, "trust": 1}))
        real_read = vfs._read
        vfs._read = lambda ipr_, idx, vf: (vfs.VfSettings(), pf)  # pretend the VF exists
        try:
            entry["apply_missing_in_kernel"] = cni_error(vfs.apply_vf, ipr, index, bad, vfs.VfSettings(trust=True))
        finally:
            vfs._read = real_read
        # a value the driver refuses (netdevsim: qos > 7); validate() would stop it first
        try:
            vfs._set(ipr, index, pf, VF, "vlan", vfs.VfSettings(vlan=100, qos=8, vlan_proto="802.1q"))
            entry["qos8"] = "no error"
        except vfs._Refused as refused:
            entry["qos8"] = refused.to_cni(VF, pf).msg
        # netdevsim refuses rates in switchdev mode: the VLAN set before is undone
        sh("devlink", "dev", "eswitch", "set", f"netdevsim/netdevsim{NSIM_ID}", "mode", "switchdev")
        try:
            entry["rates_switchdev"] = cni_error(
                vfs.apply_vf, ipr, index, 3, vfs.VfSettings(vlan=300, min_tx_rate=1, max_tx_rate=2))
        finally:
            sh("devlink", "dev", "eswitch", "set", f"netdevsim/netdevsim{NSIM_ID}", "mode", "legacy", check=False)
    entry["vfinfo_after"] = vfinfo(pf)


out["total_seconds"] = round(time.monotonic() - T0, 2)
text = json.dumps(out, indent=1, default=repr)
with open(os.path.join(RESULTS, "checks.json.tmp"), "w") as f:
    f.write(text)
os.replace(os.path.join(RESULTS, "checks.json.tmp"), os.path.join(RESULTS, "checks.json"))
print(text)
