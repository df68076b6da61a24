"""RDMA checks run INSIDE the test VM (Debian's kernel, rdma_rxe), reported as one JSON document.

Run by vm/shared_boot.py (one boot shared by netns_tests/test_vm_rdma.py, test_vm_vf.py and
test_vm_host_device.py) through harness.run_in_vm with the venv's interpreter: ``python
guest_checks.py [--netdevsim KO] [--netdevsim-error TEXT]`` as root in the guest. Writes
``$RDMANET_VM_RESULTS/checks.json`` (and prints the same JSON on stdout). Every section is
recorded even when an earlier one failed: each is ``{"ok": bool, ..., "error": "<traceback
tail>"}`` with its own facts; the host-side tests assert on them one by one. The guest is thrown
away after the run, so nothing is undone here beyond what a later section needs.

A plugin exec costs seconds under TCG (importing pyroute2 and pydantic), and the guest has two
vCPUs: sections that exec plugins are written as *scenarios* (generators that yield the plugin
calls they need, see ``parallel()``), and independent scenarios run side by side, their execs in
waves. Each scenario still gets its own report entry.

Sections, in order (later ones rely on the objects earlier ones create):
  setup      modprobe rdma_rxe; veth pair rxenet0/rxenet1; rdma link add rxe0 ... netdev rxenet0
  mode       netns_mode() and `rdma system show`
  devices    list_devices(), device_by_name() and `rdma -j dev show`
  sysfs      rdma_devices_for_netdev() for the rxe netdev, its peer and lo; the rxe parent file
  move       move_device() to a new netns: good request (EOPNOTSUPP), bad index, bad fd
  hd_setup   veth hdv0/hdv1 for host-device-rdma; a fake sysfs tree (RDMANET_SYSFS_ROOT) where
             rxe0's parent is hdv0; the kernel fact behind that: an rxe device is unregistered
             when its netdev leaves init_net (rxe9 on hdk0)
  in parallel, shared RDMA netns mode:
    plugin        macvlan-rdma ADD / DEL by raw exec, host-local IPAM, device-info file, GIDs of
                  net1 and the GID index the plugin logged
    hd_required   host-device-rdma ADD of hdv0 with rdma "required": 101, nothing changed
    ipoib         (InfiniBand) the ipoib link kind with ib_ipoib absent (its autoload refused by
                  a modprobe.d rule): errno, library error, ipoib-rdma ADD; then modprobe
                  ib_ipoib: veth/lo/no/unknown parent (errnos), ipoib-rdma ADD; the veth ibk0 is
                  an IPoIB port only in a fake tree (IBSYS); nothing left either time
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
  in parallel (exclusive's preamble switches the mode first):
    exclusive     switch to exclusive mode; netns_mode(); move again; macvlan-rdma ADD with rdma
                  "required" fails 101
    hd_exclusive  host-device-rdma, exclusive mode, hdv0 (fake parent of the real rxe0): rdma
                  "auto" ADD -> the kernel refuses to move rxe0 (EOPNOTSUPP), 101, all rolled
                  back; rdma "off" ADD moves only the netdev, DEL restores it
    hd_vf         host-device-rdma on VF 0 of the netdevsim PF, its "VF netdev" a veth (vfnet0)
                  mapped by the fake sysfs tree: ADD with vlan/qos/spoofchk/trust/mac, CHECK,
                  DEL; vfinfo_list and the veth as before
    hd_ib_vf      VF GUIDs to the netdevsim PF (no ndo_set_vf_guid): the library's requests, and
                  host-device-rdma ADD of VF 3 as an IB VF (IBSYS) with runtimeConfig.infinibandGUID:
                  error 100, vfinfo_list, the veth, state, IPAM, rebind files as before
then, on the same VF 0 and fake tree:
  hd_pf_vfs_in_use  host-device-rdma ADD of the PF's port netdev while its VFs are enabled (a node
               policy allowing it by name): refused, the PF and its VFs as before, nothing recorded
  hd_vf_stale  pod A ADDs VF 0 (vlan 100, mac); a reboot is simulated (the VF netdev comes home
               under its name, the VF settings are reset, A's netns is gone); pod B ADDs VF 0
               (vlan 200, another mac); A's late DEL must leave B's VF settings and netdev alone;
               B's DEL restores the VF as before A
  hd_vf_gone   ADD with a vlan, then sriov_numvfs 0 (the VF and its settings are gone): DEL
               succeeds, nothing left (after the VF sections: it removes the PF's VFs)
  hd_pf_killed host-device-rdma on the PF's port netdev: an ADD killed (tests/crash_steps.py) right
               after the device's move into the pod, then DEL; the pod netns deleted with the device in it,
               then DEL (last: it moves the PF itself)
"""

from __future__ import annotations

import argparse
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
HD_PLUGIN = os.path.join(VENV_BIN, "host-device-rdma")
# the tests' fault injection: a plugin call that dies at a named step (the repository is shared read-only)
CRASH_STEPS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "tests", "crash_steps.py")
HD_STATE = "/tmp/rdmanet-vm-hd"  # one state dir (node policy hostDeviceStateDir) per network below it
FAKESYS = "/tmp/rdmanet-vm-fakesys"  # RDMANET_SYSFS_ROOT of the host-device-rdma scenarios
HD_NETDEV, HD_PEER, HD_MTU = "hdv0", "hdv1", 1400  # rxe0's parent in the fake tree
VF_NETDEV, VF_PEER = "vfnet0", "vfnet1"  # the "VF netdev" of VF 0 in the fake tree
PF_PCI, VF_PCI, HD_VF = "0000:3b:00.0", "0000:3b:00.2", 0

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


def plugin_env(command: str, container: str, netns: str, extra: dict | None = None) -> dict:
    return {
        "PATH": PATH,
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "net1",
        "CNI_PATH": CNI_PATH,
        "RDMANET_LOG_LEVEL": "INFO",
        **(extra or {}),
    }


def hd_state(conf: dict) -> str:
    """host-device-rdma's state dir of a scenario: the node policy's, one per network name."""
    return f"{HD_STATE}/{conf['name']}"


def node_policy(conf: dict) -> dict:
    """The node policy (rdmanet.cni.linux.roots) the runtime's environment names for a call of ``conf``:
    stores in /tmp, device-info files in RESULTS/devinfo, host-device state in hd_state(conf)."""
    path = f"/tmp/rdmanet-vm-policy-{conf['name']}.json"
    with open(path, "w") as f:
        # the guest's node owner lets a config name any link (veths stand in for NIC ports and VFs);
        # host-device-rdma still never takes one the host uses (hd_pf_vfs_in_use)
        json.dump({"dataRoots": ["/tmp"], "logRoots": ["/tmp"], "deviceInfoDir": os.path.join(RESULTS, "devinfo"),
                   "hostDeviceStateDir": hd_state(conf), "hostDevices": [{"name": "*"}], "masters": [{"name": "*"}]}, f)
    os.chmod(path, 0o600)
    return {"RDMANET_NODE_POLICY": path}


class Exec:
    """One plugin call, started and finished separately so that several run at once."""

    def __init__(self, command: str, container: str, netns: str, conf: dict, *, plugin: str = PLUGIN,
                 env: dict | None = None) -> None:
        self.argv = [plugin]
        self.env = plugin_env(command, container, netns, {**node_policy(conf), **(env or {})})
        self.stdin = json.dumps(conf)
        self.proc: subprocess.Popen | None = None

    def start(self) -> Exec:
        self.begin = time.monotonic()
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.proc.stdin.write(self.stdin)  # a few hundred bytes: never blocks on the pipe
        self.proc.stdin.close()
        self.proc.stdin = None  # or communicate() flushes the closed pipe
        return self

    def finish(self) -> dict:
        try:
            stdout, stderr = self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            stdout, stderr = self.proc.communicate()
        doc = None
        if stdout.strip():
            try:
                doc = json.loads(stdout)
            except ValueError:
                doc = {"unparsed stdout": stdout[-2000:]}
        return {"rc": self.proc.returncode, "stdout": doc, "stderr": stderr[-3000:],
                "seconds": round(time.monotonic() - self.begin, 2)}


def parallel(*scenarios) -> None:
    """Run scenarios side by side, each recorded like a section under its name.

    A scenario is ``(name, fn)``; ``fn(entry)`` is a generator that does its own checks and
    yields the plugin calls it needs (an ``Exec``), receiving each call's result. The scenarios
    are primed in order (so an earlier one's preamble, e.g. a netns mode switch, runs before a
    later one's), then every wave starts the pending calls of all scenarios together and hands
    back the results when all have finished. A scenario that raises is recorded as failed; the
    others go on. ``seconds`` is each scenario's wall time, waves shared with the others included.
    """
    live: dict = {}

    def step(name: str, value) -> None:
        gen, entry, start = live[name]
        try:
            call = gen.send(value)
        except StopIteration:
            entry["ok"] = True
        except BaseException:  # noqa: BLE001 - recorded like a section's failure
            entry["ok"] = False
            entry["error"] = traceback.format_exc()[-3000:]
        else:
            live[name] = (gen, entry, start, call)
            return
        entry["seconds"] = round(time.monotonic() - start, 2)
        out[name] = entry
        del live[name]

    for name, fn in scenarios:
        entry: dict = {}
        out[name] = entry
        live[name] = (fn(entry), entry, time.monotonic())
        step(name, None)
    wave = 0
    while live:
        wave += 1
        calls, results = {}, {}
        for name, item in live.items():
            try:
                calls[name] = item[3].start()
            except Exception:  # noqa: BLE001 - handed to the scenario as the call's result
                results[name] = {"rc": None, "stdout": None, "stderr": traceback.format_exc()[-3000:], "seconds": 0}
        for name, call in calls.items():
            try:
                results[name] = call.finish()
            except Exception:  # noqa: BLE001
                results[name] = {"rc": None, "stdout": None, "stderr": traceback.format_exc()[-3000:], "seconds": 0}
        for name, result in results.items():
            result["wave"] = wave
            live[name] = live[name][:3]
            step(name, result)


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
    """RoCE GID table entries of rxe0 port 1 whose netdev is ndev (seen on Debian's 6.1 kernel: a
    macvlan on the rxe netdev, moved into a pod and renamed, gets entries of its own, their ndev
    named as in the pod; drivers/infiniband/core/roce_gid_mgmt.c adds the GIDs of upper devices)."""
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
    from rdmanet.cni.linux import rdma_netlink as rn
    from rdmanet.cni.linux import sysfs
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


# ------------------------------------------------------------------- host-device-rdma helpers

def link_json(name: str, ns: str | None = None) -> dict | None:
    """``ip -d -j link show dev <name>`` (in ``ns``), or None when there is no such link."""
    proc = sh("ip", *(["-n", ns] if ns else []), "-d", "-j", "link", "show", "dev", name, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return json.loads(proc.stdout)[0]


# Counters are left out of before/after comparisons (the host-side test does the same). Nothing
# else needs to be: on this kernel a netns round trip restores every other field exactly.
COUNTERS = ("stats", "stats64")


def comparable(link: dict | None) -> dict | None:
    return None if link is None else {k: v for k, v in link.items() if k not in COUNTERS}


def settled(name: str, before: dict | None, timeout: float = 3.0) -> tuple[dict | None, int]:
    """The link once it compares equal to ``before`` (carrier reaches operstate asynchronously,
    through the kernel's link watch), or the last read after ``timeout``; and the reads made."""
    deadline = time.monotonic() + timeout
    reads = 0
    while True:
        reads += 1
        now = link_json(name)
        if comparable(now) == comparable(before) or time.monotonic() > deadline:
            return now, reads
        time.sleep(0.1)


def files_under(path: str) -> list[str]:
    """Every file below ``path`` (relative paths, sorted); [] when it does not exist."""
    found = []
    for top, _dirs, names in os.walk(path):
        found += [os.path.relpath(os.path.join(top, n), path) for n in names]
    return sorted(found)


def ipam_ips(network: str) -> list[str]:
    """host-local's reservations of ``network`` (its files named by an address)."""
    d = f"{IPAM_DIR}/{network}"
    return sorted(f for f in os.listdir(d) if f[0].isdigit() or ":" in f) if os.path.isdir(d) else []


def rdma_devs(ns: str | None = None) -> list[str]:
    """RDMA device names by the rdma tool, in the host or inside ``ns``."""
    prefix = ["ip", "netns", "exec", ns] if ns else []
    return [d["ifname"] for d in json.loads(sh(*prefix, "rdma", "-j", "dev", "show").stdout or "[]")]


def hd_conf(name: str, **fields) -> dict:
    subnet = {"hdreq": "198.18.6.0/24", "hdexcl": "198.18.7.0/24", "hdvf": "198.18.8.0/24", "hdpf": "198.18.9.0/24",
              "hdpfvfs": "198.18.11.0/24"}[name]
    return {
        "cniVersion": "1.0.0",
        "name": name,
        "type": "host-device-rdma",
        "ipam": {"type": "host-local", "dataDir": IPAM_DIR, "ranges": [[{"subnet": subnet}]]},
        **fields,
    }


def hd_exec(command: str, container: str, netns: str, conf: dict) -> Exec:
    return Exec(command, container, netns, conf, plugin=HD_PLUGIN, env={"RDMANET_SYSFS_ROOT": FAKESYS})


def fake_file(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(f"{FAKESYS}/{path}"), exist_ok=True)
    with open(f"{FAKESYS}/{path}", "w") as f:
        f.write(text)


def fake_link(path: str, target: str) -> None:
    os.makedirs(os.path.dirname(f"{FAKESYS}/{path}"), exist_ok=True)
    os.symlink(target, f"{FAKESYS}/{path}")


@section("hd_setup")
def _hd_setup(entry):
    # the kernel fact that rules out rxe0's own netdev for these tests: rxe (like siw) listens to
    # its netdev's NETDEV_UNREGISTER, which a netns move sends, and unregisters itself
    sh("ip", "link", "add", "hdk0", "type", "veth", "peer", "name", "hdk1")
    sh("rdma", "link", "add", "rxe9", "type", "rxe", "netdev", "hdk0")
    entry["rxe9_before_move"] = rn.device_by_name("rxe9") is not None
    sh("ip", "netns", "add", "hd-k")
    sh("ip", "link", "set", "hdk0", "netns", "hd-k")
    deadline = time.monotonic() + 3  # ib_unregister_device_queued: a workqueue, usually done at once
    while "rxe9" in (names := [d.name for d in rn.list_devices()]) and time.monotonic() < deadline:
        time.sleep(0.05)
    entry["rxe9_after_move"] = names
    sh("ip", "netns", "del", "hd-k")
    # hdv0: rxe0's parent as the plugins will read it (the real rxe0 stays on rxenet0)
    sh("ip", "link", "add", HD_NETDEV, "mtu", str(HD_MTU), "type", "veth", "peer", "name", HD_PEER)
    sh("ip", "link", "set", HD_PEER, "up")
    sh("ip", "link", "set", HD_NETDEV, "up")
    fake_file(f"sys/class/infiniband/{RXE}/parent", HD_NETDEV + "\n")
    entry["fake_rdma_devices"] = sysfs.rdma_devices_for_netdev(HD_NETDEV, root=FAKESYS)
    entry["real_rdma_devices"] = sysfs.rdma_devices_for_netdev(HD_NETDEV)


def hd_required_scenario(entry):
    """Shared mode, rdma "required": refused before anything is touched."""
    entry["mode"] = rn.netns_mode()
    sh("ip", "netns", "add", "hd-pod-shared")
    entry["before"] = before = link_json(HD_NETDEV)
    conf = hd_conf("hdreq", device=HD_NETDEV, rdma="required")
    entry["add"] = yield hd_exec("ADD", "hdreq", "/run/netns/hd-pod-shared", conf)
    entry["after"], entry["reads"] = settled(HD_NETDEV, before)
    entry["state_files"] = files_under(hd_state(conf))
    entry["pod_links"] = [l["ifname"] for l in json.loads(sh("ip", "-n", "hd-pod-shared", "-j", "link", "show").stdout)]
    entry["ipam"] = ipam_ips("hdreq")
    entry["rdma_devs"] = rdma_devs()


def plugin_scenario(entry):
    sh("ip", "netns", "add", "rdmanet-pod1")
    netns = "/run/netns/rdmanet-pod1"
    conf = net_conf("vmnet", DEVINFO)
    entry["cni_path_has_host_local"] = os.access(f"{CNI_PATH}/host-local", os.X_OK)
    entry["add"] = add = yield Exec("ADD", "vmpod1", netns, conf)
    try:
        with open(DEVINFO) as f:
            entry["devinfo"] = json.load(f)
    except (OSError, ValueError) as e:
        entry["devinfo"] = repr(e)
    entry["link"] = link_in("rdmanet-pod1", "net1")
    entry["gids"] = gids_for("net1")
    if add["rc"] == 0 and add["stdout"].get("ips"):
        address = add["stdout"]["ips"][0]["address"]
        entry["gid_index_lib"] = sysfs.roce_gid_index(RXE, address, "net1")
    entry["ipam_files"] = sorted(os.listdir(f"{IPAM_DIR}/vmnet")) if os.path.isdir(f"{IPAM_DIR}/vmnet") else []
    if add["rc"] == 0:
        entry["del"] = yield Exec("DEL", "vmpod1", netns, conf)
        entry["link_after_del"] = link_in("rdmanet-pod1", "net1")
        entry["ipam_files_after_del"] = sorted(os.listdir(f"{IPAM_DIR}/vmnet")) if os.path.isdir(f"{IPAM_DIR}/vmnet") else []
    sh("ip", "netns", "del", "rdmanet-pod1", check=False)


def exclusive_scenario(entry):
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
    entry["add"] = yield Exec("ADD", "vmpod2", netns, conf)
    entry["link_after_failed_add"] = link_in("rdmanet-pod2", "net1")
    entry["devinfo_written"] = os.path.exists(DEVINFO_EXCL)
    entry["ipam_files"] = sorted(os.listdir(f"{IPAM_DIR}/vmnet2")) if os.path.isdir(f"{IPAM_DIR}/vmnet2") else []


# ------------------------------------------------------------------------------------ InfiniBand

IPOIB_PLUGIN = os.path.join(VENV_BIN, "ipoib-rdma")
IB_NETDEV, IB_PEER = "ibk0", "ibk1"  # a veth the fake tree calls the IPoIB netdev of a ConnectX-6 port
IBSYS = "/tmp/rdmanet-vm-ibsys"  # RDMANET_SYSFS_ROOT of the InfiniBand scenarios (not FAKESYS: hd_vf's VF is no IB VF)

try:
    sys.path.insert(0, os.getcwd())  # the checkout: netns_tests.ib_trees builds the fake IB trees
    import pathlib

    from pyroute2 import IPRoute as _IPRoute
    from pyroute2.netlink.exceptions import NetlinkError as _NetlinkError
    from pyroute2.netlink.rtnl import RTM_NEWLINK

    from rdmanet.cni.core.errors import CNIError as _CNIError
    from rdmanet.cni.linux import ipoib, vf_guid
    from rdmanet.cni.linux.netlink_request import send as nl_send
    from netns_tests import ib_trees
except BaseException:  # each InfiniBand section then records its NameError
    out["ib_import_error"] = traceback.format_exc()[-3000:]


def ib_errno(ipr, msg) -> object:
    """The errno the kernel answers to a hand-built RTM_NEWLINK (create flags), or "no error"."""
    try:
        nl_send(ipr, msg, RTM_NEWLINK, ipoib.REQUEST_FLAGS)
    except _NetlinkError as e:
        return e.code
    return "no error"


def ib_cni_error(fn, *args) -> dict:
    try:
        fn(*args)
    except _CNIError as exc:
        return {"code": exc.code, "msg": exc.msg, "details": exc.details}
    return {"no error": True}


def host_link_names() -> list[str]:
    return sorted(l["ifname"] for l in json.loads(sh("ip", "-j", "link", "show").stdout))


def ipoib_conf() -> dict:
    return {"cniVersion": "1.0.0", "name": "vmib", "type": "ipoib-rdma", "master": IB_NETDEV, "pkey": "0x8001",
            "ipam": {"type": "host-local", "dataDir": IPAM_DIR, "ranges": [[{"subnet": "198.18.9.0/24"}]]}}


NO_IPOIB_CONF = "/etc/modprobe.d/rdmanet-no-ib_ipoib.conf"  # the guest's /etc is a tmpfs overlay


def ipoib_scenario(entry):
    """The ipoib link kind on Debian's kernel: without ib_ipoib (its autoload refused by an
    ``install ib_ipoib /bin/false`` rule, as on a node without the module) and with it loaded,
    for a non-IPoIB parent; the library's request and errno mapping, and ipoib-rdma ADD by raw
    exec with a fake tree that calls the veth an IPoIB port, each leaving nothing behind."""
    sh("ip", "link", "add", IB_NETDEV, "type", "veth", "peer", "name", IB_PEER)
    sh("ip", "link", "set", IB_NETDEV, "up")
    ib_trees.ipoib_port(pathlib.Path(IBSYS), IB_NETDEV)
    sh("ip", "netns", "add", "ib-pod")
    netns = "/run/netns/ib-pod"
    env = {"RDMANET_SYSFS_ROOT": IBSYS}
    entry["links_before"] = before = host_link_names()
    entry["module_before"] = os.path.isdir("/sys/module/ib_ipoib")
    os.makedirs(os.path.dirname(NO_IPOIB_CONF), exist_ok=True)
    with open(NO_IPOIB_CONF, "w") as f:
        f.write("install ib_ipoib /bin/false\n")  # rtnl's request_module("rtnl-link-ipoib") then fails
    try:
        with _IPRoute() as ipr:
            parent = ipr.link_lookup(ifname=IB_NETDEV)[0]
            entry["errno_no_module"] = ib_errno(ipr, ipoib.child_request("ibtmp0", parent, 1, "datagram"))
            entry["lib_no_module"] = ib_cni_error(ipoib.create_child, ipr, "ibtmp0", parent, IB_NETDEV, 1, "datagram")
        entry["add_no_module"] = yield Exec("ADD", "ibpod1", netns, ipoib_conf(), plugin=IPOIB_PLUGIN, env=env)
    finally:
        os.unlink(NO_IPOIB_CONF)
    entry["module_still_absent"] = not os.path.isdir("/sys/module/ib_ipoib")
    entry["left_no_module"] = {"host": sorted(set(host_link_names()) - set(before)), "ipam": ipam_ips("vmib"),
                               "pod": [l["ifname"] for l in json.loads(sh("ip", "-n", "ib-pod", "-j", "link", "show").stdout)]}
    sh("modprobe", "ib_ipoib")
    entry["module_after"] = os.path.isdir("/sys/module/ib_ipoib")
    with _IPRoute() as ipr:
        parent = ipr.link_lookup(ifname=IB_NETDEV)[0]
        lo = ipr.link_lookup(ifname="lo")[0]
        no_link = ipoib.child_request("ibtmp1", parent, 1, "datagram")
        no_link["attrs"] = [a for a in no_link["attrs"] if a[0] != "IFLA_LINK"]
        entry["errno_with_module"] = {
            "veth_parent": ib_errno(ipr, ipoib.child_request("ibtmp1", parent, 1, "datagram")),
            "veth_parent_connected": ib_errno(ipr, ipoib.child_request("ibtmp1", parent, 0x7FFF, "connected")),
            "lo_parent": ib_errno(ipr, ipoib.child_request("ibtmp1", lo, 1, "datagram")),
            "no_parent": ib_errno(ipr, no_link),
            "parent_9999": ib_errno(ipr, ipoib.child_request("ibtmp1", 9999, 1, "datagram")),
        }
        entry["lib_with_module"] = ib_cni_error(ipoib.create_child, ipr, "ibtmp1", parent, IB_NETDEV, 1, "datagram")
    entry["add_with_module"] = yield Exec("ADD", "ibpod1", netns, ipoib_conf(), plugin=IPOIB_PLUGIN, env=env)
    entry["left_with_module"] = {"host": sorted(set(host_link_names()) - set(before)), "ipam": ipam_ips("vmib"),
                                 "pod": [l["ifname"] for l in json.loads(sh("ip", "-n", "ib-pod", "-j", "link", "show").stdout)]}
    sh("ip", "netns", "del", "ib-pod", check=False)


parallel(("plugin", plugin_scenario), ("hd_required", hd_required_scenario), ("ipoib", ipoib_scenario))


def hd_exclusive_scenario(entry):
    """Exclusive mode: rdma "auto" fails on rxe0 (it cannot change netns) and rolls back;
    rdma "off" moves only the netdev and DEL restores it."""
    entry["mode"] = rn.netns_mode()
    if entry["mode"] != "exclusive":
        raise RuntimeError(f"the RDMA netns mode is {entry['mode']}, not exclusive (see the exclusive section)")
    sh("ip", "netns", "add", "hd-pod-excl")
    netns = "/run/netns/hd-pod-excl"
    entry["before"] = before = link_json(HD_NETDEV)
    rxe = rn.device_by_name(RXE)
    entry["rxe_before"] = {"index": rxe.index, "name": rxe.name}
    common = {"device": HD_NETDEV, "mtu": 1300, "mac": "02:00:00:00:00:24"}
    auto = hd_conf("hdexcl", rdma="auto", **common)
    entry["auto_add"] = yield hd_exec("ADD", "hdauto", netns, auto)
    entry["auto_after"], entry["auto_reads"] = settled(HD_NETDEV, before)
    entry["auto_state_files"] = files_under(hd_state(auto))
    entry["auto_ipam"] = ipam_ips("hdexcl")
    entry["auto_pod_links"] = [l["ifname"] for l in json.loads(sh("ip", "-n", "hd-pod-excl", "-j", "link", "show").stdout)]
    rxe = rn.device_by_name(RXE)
    entry["rxe_after_auto"] = {"index": rxe.index, "name": rxe.name} if rxe else None
    # rxe0's own netdev, found through the real sysfs: the RDMA move is asked for before the
    # netdev leaves (rxe dies with its netdev's move), so rxe0 must survive the refusal
    real = hd_conf("hdexcl", rdma="auto", device=NETDEV)
    entry["real_before"] = real_before = link_json(NETDEV)
    entry["real_add"] = yield Exec("ADD", "hdreal", netns, real, plugin=HD_PLUGIN)
    entry["real_after"], _ = settled(NETDEV, real_before)
    rxe = rn.device_by_name(RXE)
    entry["rxe_after_real"] = {"index": rxe.index, "name": rxe.name} if rxe else None

    off = hd_conf("hdexcl", rdma="off", **common)
    entry["off_add"] = add = yield hd_exec("ADD", "hdoff", netns, off)
    entry["off_host_link"] = link_json(HD_NETDEV)
    entry["off_pod_link"] = link_json("net1", "hd-pod-excl")
    entry["off_pod_addrs"] = link_in("hd-pod-excl", "net1")
    entry["off_state_files"] = files_under(hd_state(off))
    entry["off_ipam"] = ipam_ips("hdexcl")
    entry["off_rdma_host"] = rdma_devs()
    entry["off_rdma_pod"] = rdma_devs("hd-pod-excl")
    if add["rc"] != 0:
        return
    entry["off_del"] = yield hd_exec("DEL", "hdoff", netns, off)
    entry["del_after"], entry["del_reads"] = settled(HD_NETDEV, before)
    entry["del_state_files"] = files_under(hd_state(off))
    entry["del_ipam"] = ipam_ips("hdexcl")
    entry["del_pod_links"] = [l["ifname"] for l in json.loads(sh("ip", "-n", "hd-pod-excl", "-j", "link", "show").stdout)]
    entry["del_rdma_host"] = rdma_devs()


def hd_vf_scenario(entry):
    """VF 0 of the real netdevsim PF, its "VF netdev" a veth mapped by the fake sysfs tree."""
    pf, _ = pf_of_nsim()
    entry["pf"] = pf
    sh("ip", "link", "add", VF_NETDEV, "type", "veth", "peer", "name", VF_PEER)
    sh("ip", "link", "set", VF_PEER, "up")  # vfnet0 stays down, like an unused VF netdev
    # /sys/bus/pci/devices/<vf>/{net/vfnet0, physfn}, <pf>/{virtfn0, sriov_numvfs, net/<pf>}
    dev = "sys/bus/pci/devices"
    os.makedirs(f"{FAKESYS}/{dev}/{VF_PCI}/net/{VF_NETDEV}")
    os.makedirs(f"{FAKESYS}/{dev}/{PF_PCI}/net/{pf}")
    os.makedirs(f"{FAKESYS}/sys/bus/pci/drivers/mlx5_core")
    fake_link(f"{dev}/{VF_PCI}/physfn", f"../{PF_PCI}")
    fake_link(f"{dev}/{VF_PCI}/driver", "../../drivers/mlx5_core")
    fake_link(f"{dev}/{PF_PCI}/virtfn{HD_VF}", f"../{VF_PCI}")
    fake_file(f"{dev}/{PF_PCI}/sriov_numvfs", f"{NUM_VFS}\n")
    # real NICs start VFs with spoofchk on (netdevsim off): make ADD change it and DEL restore it
    sh("ip", "link", "set", "dev", pf, "vf", str(HD_VF), "spoofchk", "on")
    entry["vfinfo_before"] = vfinfo(pf)
    entry["before"] = before = link_json(VF_NETDEV)
    sh("ip", "netns", "add", "hd-pod-vf")
    netns = "/run/netns/hd-pod-vf"
    conf = hd_conf("hdvf", deviceID=VF_PCI, vlan=100, vlanQoS=2, spoofchk="off", trust="on", mac="02:00:00:00:00:42")
    entry["add"] = add = yield hd_exec("ADD", "hdvf", netns, conf)
    entry["vfinfo_after_add"] = vfinfo(pf)
    entry["pod_link"] = link_json("net1", "hd-pod-vf")
    entry["pod_addrs"] = link_in("hd-pod-vf", "net1")
    entry["host_link_after_add"] = link_json(VF_NETDEV)
    entry["state_files"] = files_under(hd_state(conf))
    entry["ipam"] = ipam_ips("hdvf")
    if add["rc"] != 0:
        return
    entry["check"] = yield hd_exec("CHECK", "hdvf", netns, {**conf, "prevResult": add["stdout"]})
    entry["del"] = yield hd_exec("DEL", "hdvf", netns, conf)
    entry["vfinfo_after_del"] = vfinfo(pf)
    entry["del_after"], entry["del_reads"] = settled(VF_NETDEV, before)
    entry["del_state_files"] = files_under(hd_state(conf))
    entry["del_ipam"] = ipam_ips("hdvf")
    entry["del_pod_links"] = [l["ifname"] for l in json.loads(sh("ip", "-n", "hd-pod-vf", "-j", "link", "show").stdout)]


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

    from rdmanet.cni.core.errors import CNIError
    from rdmanet.cni.linux import vf_settings as vfs
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


def hd_ib_vf_scenario(entry):
    """A VF GUID request to a device that cannot take one: VF 3 of the real netdevsim PF, which a
    fake tree (IBSYS) calls the IPoIB netdev of an IB PF, its "VF netdev" a veth. The library's
    request, then host-device-rdma ADD with runtimeConfig.infinibandGUID: error 100, nothing changed."""
    pf, index = pf_of_nsim()
    vf, vf_pci, pf_pci = 3, "0000:3c:00.3", "0000:3c:00.0"
    sh("ip", "link", "add", "ibvf0", "type", "veth", "peer", "name", "ibvf1")
    ib_trees.ib_vf(pathlib.Path(IBSYS), vf_pci, pf_pci=pf_pci, vf_index=vf, netdev="ibvf0", ibdev="mlx5_9", pf_netdev=pf)
    entry["vfinfo_before"] = vfinfo(pf)
    entry["veth_before"] = before = link_json("ibvf0")
    with _IPRoute() as ipr:
        entry["lib"] = ib_cni_error(vf_guid.set_guids, ipr, index, pf, vf, 0x0200000000000003, "from guid")
        entry["read_back"] = list(vf_guid.read_guids(ipr, index, vf))
    sh("ip", "netns", "add", "hd-pod-ibvf")
    conf = {"cniVersion": "1.0.0", "name": "hdibvf", "type": "host-device-rdma",
            "deviceID": vf_pci, "rdma": "off", "runtimeConfig": {"infinibandGUID": "02:00:00:00:00:00:00:03"},
            "ipam": {"type": "host-local", "dataDir": IPAM_DIR, "ranges": [[{"subnet": "198.18.10.0/24"}]]}}
    entry["add"] = yield Exec("ADD", "hdibvf", "/run/netns/hd-pod-ibvf", conf, plugin=HD_PLUGIN, env={"RDMANET_SYSFS_ROOT": IBSYS})
    entry["vfinfo_after"] = vfinfo(pf)
    entry["veth_after"], _ = settled("ibvf0", before)
    entry["state_files"] = files_under(hd_state(conf))
    entry["ipam"] = ipam_ips("hdibvf")
    entry["rebind_files"] = files_under(f"{IBSYS}/sys/bus/pci/drivers")
    entry["pod_links"] = [l["ifname"] for l in json.loads(sh("ip", "-n", "hd-pod-ibvf", "-j", "link", "show").stdout)]


parallel(("exclusive", exclusive_scenario), ("hd_exclusive", hd_exclusive_scenario), ("hd_vf", hd_vf_scenario),
         ("hd_ib_vf", hd_ib_vf_scenario))


def hd_call(command: str, container: str, netns: str, conf: dict) -> dict:
    return hd_exec(command, container, netns, conf).start().finish()


def vf_mac_vlan(pf: str, vf: int) -> dict:
    entry = vfinfo(pf)[vf]
    return {"mac": entry["address"], "vlan": entry["vlan_list"][0].get("vlan", 0)}


@section("hd_pf_vfs_in_use")
def _hd_pf_vfs_in_use(entry):
    """host-device-rdma asked for the netdevsim PF's port netdev while its 4 VFs are enabled (a
    node policy that allows every link by name, none with hostInUse): refused, nothing moves."""
    pf, _ = pf_of_nsim()
    entry["pf"] = pf
    with open(f"{NSIM_DEV}/sriov_numvfs") as f:
        entry["sriov_numvfs"] = int(f.read())
    entry["before"] = before = link_json(pf)
    entry["vfinfo_before"] = vfinfo(pf)
    sh("ip", "netns", "add", "hd-pf-vfs")
    conf = hd_conf("hdpfvfs", device=pf)
    # the real sysfs (no fake tree): the PF's sriov_numvfs is the kernel's
    entry["add"] = Exec("ADD", "pfvfs", "/run/netns/hd-pf-vfs", conf, plugin=HD_PLUGIN).start().finish()
    entry["after"], _ = settled(pf, before)
    entry["vfinfo_after"] = vfinfo(pf)
    entry["pod_links"] = [l["ifname"] for l in json.loads(sh("ip", "-n", "hd-pf-vfs", "-j", "link", "show").stdout)]
    entry["state_files"] = files_under(hd_state(conf))
    entry["ipam"] = ipam_ips("hdpfvfs")
    sh("ip", "netns", "del", "hd-pf-vfs")


@section("hd_vf_stale")
def _hd_vf_stale(entry):
    pf, _ = pf_of_nsim()
    entry["vfinfo_before"] = before = vfinfo(pf)
    entry["host_before"] = host_before = link_json(VF_NETDEV)
    conf_a = hd_conf("hdvf", deviceID=VF_PCI, vlan=100, mac="02:00:00:00:00:0a")
    conf_b = hd_conf("hdvf", deviceID=VF_PCI, vlan=200, mac="02:00:00:00:00:0b")
    sh("ip", "netns", "add", "hd-stale-a")
    entry["add_a"] = hd_call("ADD", "stale-a", "/run/netns/hd-stale-a", conf_a)
    # a reboot: A's netns is gone, the VF netdev is back under its name, the VF settings reset
    sh("ip", "-n", "hd-stale-a", "link", "set", "net1", "netns", "1")
    sh("ip", "link", "set", "net1", "down")
    sh("ip", "link", "set", "net1", "name", VF_NETDEV)
    sh("ip", "link", "set", VF_NETDEV, "alias", "")
    sh("ip", "link", "set", VF_NETDEV, "address", host_before["address"])
    sh("ip", "netns", "del", "hd-stale-a")
    sh("ip", "link", "set", "dev", pf, "vf", str(HD_VF), "vlan", "0", "mac", before[HD_VF]["address"])
    entry["vfinfo_after_reboot"] = vfinfo(pf)
    sh("ip", "netns", "add", "hd-stale-b")
    entry["add_b"] = hd_call("ADD", "stale-b", "/run/netns/hd-stale-b", conf_b)
    entry["vf_after_add_b"] = vf_mac_vlan(pf, HD_VF)
    entry["pod_b_after_add_b"] = link_json("net1", "hd-stale-b")
    entry["del_a"] = hd_call("DEL", "stale-a", "/run/netns/hd-stale-a", conf_a)
    entry["vf_after_stale_del"] = vf_mac_vlan(pf, HD_VF)
    entry["pod_b_after_stale_del"] = link_json("net1", "hd-stale-b")
    entry["state_files_after_stale_del"] = files_under(hd_state(conf_a))
    entry["del_b"] = hd_call("DEL", "stale-b", "/run/netns/hd-stale-b", conf_b)
    entry["vfinfo_after_del_b"] = vfinfo(pf)
    entry["host_after"], _ = settled(VF_NETDEV, host_before)
    entry["state_files_after"] = files_under(hd_state(conf_a))
    entry["ipam_after"] = ipam_ips("hdvf")
    sh("ip", "netns", "del", "hd-stale-b")


@section("hd_vf_gone")
def _hd_vf_gone(entry):
    pf, _ = pf_of_nsim()
    conf = hd_conf("hdvf", deviceID=VF_PCI, vlan=300)
    sh("ip", "netns", "add", "hd-gone")
    entry["add"] = hd_call("ADD", "gone", "/run/netns/hd-gone", conf)
    entry["vf_after_add"] = vf_mac_vlan(pf, HD_VF)
    with open(f"{NSIM_DEV}/sriov_numvfs", "w") as f:
        f.write("0")
    entry["vfinfo_after_numvfs_0"] = vfinfo(pf)
    entry["del"] = hd_call("DEL", "gone", "/run/netns/hd-gone", conf)
    entry["host_after"] = link_json(VF_NETDEV)
    entry["state_files_after"] = files_under(hd_state(conf))
    entry["ipam_after"] = ipam_ips("hdvf")


@section("hd_pf_killed")
def _hd_pf_killed(entry):
    """host-device-rdma on the netdevsim PF's port netdev (a bus device, unlike a veth); last, as
    it takes the PF away from the VF sections. 1: an ADD killed (os._exit, tests/crash_steps.py)
    right after the request that moved and renamed the device, before MTU, MAC and up; then DEL. 2: the
    pod netns deleted with the device in it (what a kernel does with such a device); then DEL with
    the netns gone."""
    pf, _ = pf_of_nsim()
    conf = hd_conf("hdpf", device=pf)
    entry["before"] = before = link_json(pf)
    sh("ip", "netns", "add", "hd-pf-pod")
    netns = "/run/netns/hd-pf-pod"
    killed = hd_exec("ADD", "pf-killed", netns, conf)
    killed.argv = [sys.executable, "-B", CRASH_STEPS, "host-device-rdma", "add:moved"]
    entry["add_killed"] = killed.start().finish()
    entry["host_after_kill"] = link_json(pf)
    entry["pod_links_after_kill"] = [l["ifname"] for l in json.loads(sh("ip", "-n", "hd-pf-pod", "-j", "link", "show").stdout)]
    moved = link_json("net1", "hd-pf-pod")
    entry["pod_link_after_kill"] = moved and {"ifalias": moved.get("ifalias"), "address": moved.get("address"),
                                              "parentdev": moved.get("parentdev")}
    entry["del"] = hd_call("DEL", "pf-killed", netns, conf)
    entry["after_del"], _ = settled(pf, before)
    entry["files_after_del"] = files_under(hd_state(conf))
    entry["add"] = hd_call("ADD", "pf-gone", netns, conf)
    entry["pod_link"] = link_json("net1", "hd-pf-pod")
    sh("ip", "netns", "del", "hd-pf-pod")
    deadline = time.monotonic() + 5
    while link_json("net1") is None and time.monotonic() < deadline:  # the netns is cleaned up asynchronously
        time.sleep(0.1)
    entry["host_after_netns_del"] = link_json("net1")
    entry["del_gone"] = hd_call("DEL", "pf-gone", netns, conf)
    entry["after_del_gone"], _ = settled(pf, before)
    entry["files_after"] = files_under(hd_state(conf))
    entry["ipam_after"] = ipam_ips("hdpf")


out["total_seconds"] = round(time.monotonic() - T0, 2)
text = json.dumps(out, indent=1, default=repr)
with open(os.path.join(RESULTS, "checks.json.tmp"), "w") as f:
    f.write(text)
os.replace(os.path.join(RESULTS, "checks.json.tmp"), os.path.join(RESULTS, "checks.json"))
print(text)
