"""``rdmanet doctor`` against fake host trees, real shims, a real daemon and the fake API server.

Fake trees stand for "/" (``sys/``, ``proc/``, ``dev/`` under one tmp dir) and use the kernel's own
relative symlinks, like tests/test_sysfs.py:

    ConnectX-6 Dx host (CX6DX)
      0000:3b:00.0  PF 15b3:101d mlx5_core  ens1f0np0  mlx5_0 (ACTIVE, RoCE)  sriov 4 of 8 VFs
        VF0 0000:3b:00.2 15b3:101e mlx5_core ens1f0v0 mlx5_2
        VF1 0000:3b:00.3 15b3:101e mlx5_core ens1f0v1 mlx5_3
        VF2 0000:3b:00.4 15b3:101e vfio-pci
        VF3 0000:3b:00.5 15b3:101e (no driver)
      0000:3b:00.1  PF 15b3:101d mlx5_core  ens1f1np1  mlx5_1 (DOWN)  sriov 0 of 8
      0000:5e:00.0  Intel 8086:1521 igb eno1 (no RDMA: not shown), the default route
    no-RDMA host: only eno1.  soft-RoCE host: rxe0 on the virtual netdev eth1.

The RDMA netns mode is injected (a reader function): this machine's kernel has no RDMA, which one
test checks through the real RDMA netlink reader.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import sysconfig
import time

import pytest

from rdmanet.cli import main as cli
from rdmanet.cli.doctor import Options, diagnose, nic_models
from rdmanet.cli.doctor.findings import render_table
from rdmanet.cli.doctor.host_facts import ModeReading
from rdmanet.node.launcher import write_shim

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kube_api_server import KubeAPIServer, write_kubeconfig  # noqa: E402

SITE = sysconfig.get_path("purelib")
PLUGINS = ("macvlan-rdma", "host-device-rdma", "ipoib-rdma", "lease-ipam")

BRIDGE = "sys/devices/pci0000:3a/0000:3a:00.0"
PF0 = f"{BRIDGE}/0000:3b:00.0"
PF1 = f"{BRIDGE}/0000:3b:00.1"
VFS = [f"{BRIDGE}/0000:3b:00.{n}" for n in (2, 3, 4, 5)]
INTEL = "sys/devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0"

ROUTE_HEADER = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\tMTU\tWindow\tIRTT\n"


def shared():
    return ModeReading("ok", "shared")


def exclusive():
    return ModeReading("ok", "exclusive")


def absent():
    return ModeReading("absent", None, "this kernel has no RDMA netlink (the RDMA core, ib_core, is not loaded)")


# --------------------------------------------------------------------------- fake trees


class Tree:
    def __init__(self, root) -> None:
        self.root = str(root)
        for bus in ("pci", "auxiliary"):
            self.dir(f"sys/bus/{bus}/devices")
        self.dir("sys/class/net")
        self.dir("sys/module")

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def dir(self, rel: str) -> None:
        os.makedirs(self.path(rel), exist_ok=True)

    def file(self, rel: str, text: str) -> None:
        self.dir(os.path.dirname(rel))
        with open(self.path(rel), "w") as f:
            f.write(text)

    def rel_link(self, rel: str, dest: str) -> None:
        """Symlink ``rel`` -> tree path ``dest``, relative like the kernel's sysfs links."""
        self.dir(os.path.dirname(rel))
        up = os.path.relpath(os.path.dirname(dest), os.path.dirname(rel))
        os.symlink(os.path.join(up, os.path.basename(dest)), self.path(rel))

    def pci(self, devpath: str, vendor: str, device: str, cls: str = "0x020000", driver: str | None = None) -> None:
        self.dir(devpath)
        self.rel_link(f"{devpath}/subsystem", "sys/bus/pci")
        self.rel_link(f"sys/bus/pci/devices/{os.path.basename(devpath)}", devpath)
        for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
            self.file(f"{devpath}/{name}", value + "\n")
        if driver:
            self.dir(f"sys/bus/pci/drivers/{driver}")
            self.rel_link(f"{devpath}/driver", f"sys/bus/pci/drivers/{driver}")

    def netdev(self, devpath: str | None, name: str, operstate: str = "up", carrier: str | None = "1",
               speed: str | None = "100000", mtu: int = 9000) -> None:
        node = f"{devpath or 'sys/devices/virtual'}/net/{name}"
        self.dir(node)
        if devpath:
            self.rel_link(f"{node}/device", devpath)
        self.rel_link(f"sys/class/net/{name}", node)
        self.file(f"{node}/operstate", operstate + "\n")
        self.file(f"{node}/mtu", f"{mtu}\n")
        if carrier is not None:  # absent: the kernel answers EINVAL while the link is down
            self.file(f"{node}/carrier", carrier + "\n")
        if speed is not None:
            self.file(f"{node}/speed", speed + "\n")

    def ibdev(self, parent: str, name: str, state: str = "4: ACTIVE", phys: str = "5: LinkUp",
              layer: str = "Ethernet", parent_ifname: str | None = None, uverbs: int | None = None) -> None:
        node = f"{parent}/infiniband/{name}"
        self.file(f"{node}/ports/1/state", state + "\n")
        self.file(f"{node}/ports/1/phys_state", phys + "\n")
        self.file(f"{node}/ports/1/link_layer", layer + "\n")
        self.file(f"{node}/ports/1/rate", "100 Gb/sec (2X HDR)\n")
        if parent_ifname:
            self.file(f"{node}/parent", parent_ifname + "\n")
        else:
            self.file(f"{node}/fw_ver", "22.36.1010\n")
        self.rel_link(f"sys/class/infiniband/{name}", node)
        if uverbs is not None:
            self.file(f"sys/class/infiniband_verbs/uverbs{uverbs}/ibdev", name + "\n")

    def aux(self, devpath: str) -> None:
        """An auxiliary device (an mlx5 SF) under its PF's directory."""
        self.dir(devpath)
        self.rel_link(f"{devpath}/subsystem", "sys/bus/auxiliary")
        self.rel_link(f"sys/bus/auxiliary/devices/{os.path.basename(devpath)}", devpath)

    def vf(self, pf: str, vf: str, index: int) -> None:
        self.rel_link(f"{vf}/physfn", pf)
        self.rel_link(f"{pf}/virtfn{index}", vf)

    def modules(self, *names: str) -> None:
        self.file("proc/modules", "".join(f"{n} 1 0 - Live 0x0000000000000000\n" for n in names))

    def dev(self, *names: str) -> None:
        self.dir("dev/infiniband")
        for n in names:
            self.file(f"dev/infiniband/{n}", "")

    def default_route(self, ifname: str) -> None:
        self.file("proc/net/route", ROUTE_HEADER +
                  f"{ifname}\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0\n")


def intel_nic(t: Tree) -> None:
    t.dir("sys/devices/pci0000:5d/0000:5d:00.0")
    t.pci(INTEL, "0x8086", "0x1521", driver="igb")
    t.netdev(INTEL, "eno1", speed="1000", mtu=1500)
    t.default_route("eno1")


def cx6dx_host(root, *, mlx5_ib: bool = True, peermem: bool = False) -> Tree:
    t = Tree(root)
    t.dir(BRIDGE)
    t.pci(PF0, "0x15b3", "0x101d", driver="mlx5_core")
    t.netdev(PF0, "ens1f0np0")
    t.file(f"{PF0}/sriov_totalvfs", "8\n")
    t.file(f"{PF0}/sriov_numvfs", "4\n")
    t.pci(PF1, "0x15b3", "0x101d", driver="mlx5_core")
    t.netdev(PF1, "ens1f1np1", operstate="down", carrier=None, speed=None, mtu=1500)
    t.file(f"{PF1}/sriov_totalvfs", "8\n")
    t.file(f"{PF1}/sriov_numvfs", "0\n")
    drivers = ["mlx5_core", "mlx5_core", "vfio-pci", None]
    for n, (vf, drv) in enumerate(zip(VFS, drivers)):
        t.pci(vf, "0x15b3", "0x101e", driver=drv)
        t.vf(PF0, vf, n)
        if drv == "mlx5_core":
            t.netdev(vf, f"ens1f0v{n}", mtu=9000)
    if mlx5_ib:
        t.ibdev(PF0, "mlx5_0", uverbs=0)
        t.ibdev(PF1, "mlx5_1", state="1: DOWN", phys="3: Disabled", uverbs=1)
        t.ibdev(VFS[0], "mlx5_2", uverbs=2)
        t.ibdev(VFS[1], "mlx5_3", uverbs=3)
        mods = ["mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "rdma_ucm", "nvidia"]
        t.dev("uverbs0", "uverbs1", "uverbs2", "uverbs3", "rdma_cm")
    else:
        mods = ["mlx5_core", "nvidia"]
    if peermem:
        mods.append("nvidia_peermem")
    t.modules(*mods)
    intel_nic(t)
    return t


def no_rdma_host(root) -> Tree:
    t = Tree(root)
    intel_nic(t)
    t.modules("igb", "veth")
    return t


def soft_roce_host(root) -> Tree:
    t = Tree(root)
    t.netdev(None, "eth1", speed=None, mtu=1500)
    t.ibdev("sys/devices/virtual", "rxe0", parent_ifname="eth1", uverbs=0)
    t.modules("rdma_rxe", "ib_core", "ib_uverbs", "rdma_ucm")
    t.dev("uverbs0", "rdma_cm")
    t.default_route("eth1")
    return t


# --------------------------------------------------------------------------- CNI dirs


def install_shims(bin_dir, socket_path, site=SITE) -> None:
    os.makedirs(bin_dir, exist_ok=True)
    for name in PLUGINS:
        write_shim(os.path.join(bin_dir, name), name, sys.executable, site, socket_path)


def write_conf(conf_dir, name: str, doc) -> str:
    os.makedirs(conf_dir, exist_ok=True)
    path = os.path.join(conf_dir, name)
    with open(path, "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))
    return path


MULTUS_CONF = {"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus-shim",
               "daemonSocketDir": "/run/multus/"}
FLANNEL = {"cniVersion": "0.3.1", "name": "cbr0", "plugins": [{"type": "flannel"}, {"type": "portmap"}]}


def macvlan_net(name="rdma-shared", master="ens1f0np0", rdma="required", data_dir="/tmp/none", **ipam):
    ipam = {"type": "lease-ipam", "range": "10.56.0.0/24", "dataDir": data_dir, **ipam}
    return {"cniVersion": "1.0.0", "name": name, "type": "macvlan-rdma", "master": master, "rdma": rdma, "ipam": ipam}


@pytest.fixture
def env(tmp_path):
    """Bin dir with real shims, a conf dir with Multus first, no daemon: the CNI side is fine."""
    bin_dir, conf_dir = tmp_path / "bin", tmp_path / "net.d"
    sock = str(tmp_path / "run" / "daemon.sock")
    install_shims(bin_dir, sock)
    for name in ("multus-shim", "macvlan", "host-local", "loopback"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    write_conf(conf_dir, "00-multus.conf", MULTUS_CONF)
    write_conf(conf_dir, "10-flannel.conflist", FLANNEL)
    return {"bin": str(bin_dir), "conf": str(conf_dir), "socket": sock, "root": tmp_path / "host"}


def run(env, mode=shared, **kw):
    kw.setdefault("systemd_root", str(env["root"] / "systemd-root"))  # never this machine's units
    opts = Options(sysfs_root=str(env["root"]), proc_root=str(env["root"]), dev_root=str(env["root"]),
                   cni_bin_dir=env["bin"], cni_conf_dir=env["conf"], socket=env["socket"],
                   netns_mode_reader=mode, **kw)
    return diagnose(opts)


def find(report, area, subject=None):
    hits = [f for f in report.findings if f.area == area and (subject is None or f.subject == subject)]
    assert hits, f"no {area}/{subject} finding in:\n{render_table(report.findings)}"
    return hits


def one(report, area, subject=None):
    hits = find(report, area, subject)
    assert len(hits) == 1, hits
    return hits[0]


def cli_run(capsys, env, *extra):
    argv = ["doctor", "--sysfs-root", str(env["root"]), "--proc-root", str(env["root"]), "--dev-root", str(env["root"]),
            "--cni-bin-dir", env["bin"], "--cni-conf-dir", env["conf"], "--socket", env["socket"],
            "--systemd-root", str(env["root"] / "systemd-root"), *extra]
    code = cli.main(argv)
    return code, capsys.readouterr()


# =========================================================================== host


def test_connectx6dx_host_table(env):
    cx6dx_host(env["root"])
    report = run(env)
    table = render_table(report.findings)
    nic = one(report, "nic", "0000:3b:00.0")
    assert nic.severity == "ok"
    assert nic.message == "ConnectX-6 Dx [15b3:101d], driver mlx5_core, netdev ens1f0np0, RDMA mlx5_0"
    assert "0000:5e:00.0" not in table  # the Intel NIC without RDMA is not an RDMA NIC

    up = one(report, "link", "ens1f0np0")
    assert up.severity == "ok" and up.message == "up, carrier on, 100000 Mb/s, MTU 9000"
    down = [f for f in find(report, "link", "ens1f1np1") if f.severity == "warn"][0]
    assert "the link is down" in down.message and "ip link set dev ens1f1np1 up" in down.fix
    mtu = [f for f in find(report, "link", "ens1f1np1") if f.severity == "info"][0]
    assert "MTU 1500 limits RoCE to a 1024-byte MTU" in mtu.message

    mlx5_0 = one(report, "rdma", "mlx5_0")
    assert mlx5_0.severity == "ok"
    assert mlx5_0.message.startswith("mlx5_0 <-> ens1f0np0 (PCI 0000:3b:00.0), port 1 ACTIVE (LinkUp), RoCE, 100 Gb/sec")
    assert "uverbs0" in mlx5_0.message and "fw 22.36.1010" in mlx5_0.message
    mlx5_1 = one(report, "rdma", "mlx5_1")
    assert mlx5_1.severity == "warn" and "port 1 is not ACTIVE" in mlx5_1.message
    assert "mlx5_2 <-> ens1f0v0 (PCI 0000:3b:00.2)" in one(report, "rdma", "mlx5_2").message

    pf = [f for f in find(report, "sriov", "0000:3b:00.0")][0]
    assert pf.message == "4 of 8 VFs enabled: 2 with RDMA (mlx5_2, mlx5_3), 1 DPDK, 1 without a driver"
    assert "echo N > /sys/bus/pci/devices/0000:3b:00.1/sriov_numvfs" in one(report, "sriov", "0000:3b:00.1").fix
    vf0 = one(report, "sriov", "0000:3b:00.2")
    assert vf0.severity == "ok"
    assert vf0.message == ("VF 0 of 0000:3b:00.0: ConnectX mlx5Gen VF of ConnectX-6 Dx, driver mlx5_core, "
                           "netdev ens1f0v0, RDMA mlx5_2")
    dpdk = one(report, "sriov", "0000:3b:00.4")
    assert dpdk.severity == "info" and "vfio-pci (DPDK" in dpdk.message
    unbound = one(report, "sriov", "0000:3b:00.5")
    assert unbound.severity == "warn" and "no driver bound" in unbound.message
    assert "echo 0000:3b:00.5 > /sys/bus/pci/drivers/mlx5_core/bind" in unbound.fix

    mode = one(report, "rdma-mode")
    assert mode.subject == "shared" and "macvlan-rdma: pods use the master's RDMA device" in mode.message
    for name in ("mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "rdma_ucm"):
        assert one(report, "modules", name).severity == "ok", name
    peermem = one(report, "modules", "nvidia_peermem")
    assert peermem.severity == "warn" and "modprobe nvidia-peermem" in peermem.fix
    dev = one(report, "dev")
    assert dev.severity == "ok" and dev.message == "contents: rdma_cm uverbs0 uverbs1 uverbs2 uverbs3"
    # warnings only: the host serves RDMA pods
    assert report.exit_code == 0, table


def test_sysfs_inventory_lookups(tmp_path):
    from rdmanet.cni.linux import sysfs

    t = cx6dx_host(tmp_path)
    sf = f"{PF0}/mlx5_core.sf.4"
    t.aux(sf)
    t.ibdev(sf, "mlx5_4")
    t.netdev(sf, "en3f0pf0sf4")
    t.netdev(None, "eth1")
    t.ibdev("sys/devices/virtual", "rxe0", parent_ifname="eth1")
    root = str(tmp_path)
    assert sysfs.pci_devices(root) == ["0000:3b:00.0", "0000:3b:00.1", "0000:3b:00.2", "0000:3b:00.3",
                                       "0000:3b:00.4", "0000:3b:00.5", "0000:5e:00.0"]
    assert sysfs.vfs_of_pf("0000:3b:00.0", root) == [(0, "0000:3b:00.2"), (1, "0000:3b:00.3"),
                                                     (2, "0000:3b:00.4"), (3, "0000:3b:00.5")]
    assert sysfs.vfs_of_pf("0000:3b:00.1", root) == [] and sysfs.vfs_of_pf("0000:3b:00.2", root) == []
    assert sysfs.vf_index("0000:3b:00.0", "0000:3b:00.5", root) == 3
    t.file(f"{PF0}/sriov_numvfs", "2\n")  # virtfn2/3 left over above sriov_numvfs do not count
    assert [n for n, _ in sysfs.vfs_of_pf("0000:3b:00.0", root)] == [0, 1]
    assert sysfs.vf_index("0000:3b:00.0", "0000:3b:00.5", root) is None
    assert sysfs.sriov_totalvfs("0000:3b:00.0", root) == 8 and sysfs.sriov_totalvfs("0000:3b:00.2", root) is None
    assert sysfs.rdma_devices(root) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4", "rxe0"]
    assert sysfs.rdma_device_parent("mlx5_0", root) == ("pci", "0000:3b:00.0")
    assert sysfs.rdma_device_parent("mlx5_4", root) == ("auxiliary", "mlx5_core.sf.4")
    assert sysfs.rdma_device_parent("rxe0", root) is None and sysfs.rdma_device_parent("nope", root) is None
    assert sysfs.read_attribute("/sys/class/net/ens1f0np0/mtu", root) == "9000"
    assert sysfs.read_attribute("/sys/class/net/ens1f1np1/carrier", root) is None
    assert sysfs.read_attribute("/sys/class/net/ens1f0np0", root) is None  # a directory
    assert sysfs.list_names("/sys/class/infiniband_verbs", root) == ["uverbs0", "uverbs1", "uverbs2", "uverbs3"]
    assert sysfs.list_names("/sys/nope", root) == []


def test_sub_function_rdma_device(env):
    t = cx6dx_host(env["root"])
    sf = f"{PF0}/mlx5_core.sf.4"
    t.aux(sf)
    t.ibdev(sf, "mlx5_4", uverbs=4)
    t.netdev(sf, "en3f0pf0sf4")
    report = run(env)
    f = one(report, "rdma", "mlx5_4")
    assert f.severity == "ok" and f.message.startswith("mlx5_4 <-> en3f0pf0sf4 (SF mlx5_core.sf.4), port 1 ACTIVE")
    assert one(report, "link", "en3f0pf0sf4").severity == "ok"
    dev = one(report, "dev")
    assert dev.severity == "warn" and "5 RDMA devices but 4 uverbs" in dev.message


def test_table_layout_and_summary(env, capsys):
    cx6dx_host(env["root"], peermem=True)
    code, cap = cli_run(capsys, env)
    lines = cap.out.splitlines()
    assert lines[0].split() == ["SEVERITY", "AREA", "SUBJECT", "FINDING"]
    column = lines[0].index("FINDING")
    nic = next(line for line in lines if line.startswith("ok") and " nic " in line)
    assert nic[column:] == "ConnectX-6 Dx [15b3:101d], driver mlx5_core, netdev ens1f0np0, RDMA mlx5_0"
    fix = lines.index(next(line for line in lines if "the link is down" in line)) + 1
    assert lines[fix].startswith(" " * column + "fix: ip link set dev ens1f1np1 up")
    assert "nvidia_peermem" in cap.out and "GPUDirect RDMA, the NIC reads" in cap.out
    assert lines[-1].endswith(" error: no errors") and lines[-2] == ""
    assert code == 0 and cap.err == ""


def test_exclusive_mode_says_what_each_plugin_does(env):
    cx6dx_host(env["root"])
    mode = one(run(env, exclusive), "rdma-mode")
    assert mode.subject == "exclusive"
    assert "host-device-rdma: moves the device's RDMA device into the pod" in mode.message
    assert "macvlan-rdma: pods see no RDMA device" in mode.message
    assert "rdma system set netns shared" in mode.fix


def test_connectx_without_mlx5_ib_is_an_error(env):
    cx6dx_host(env["root"], mlx5_ib=False)
    report = run(env, absent)
    nic = one(report, "nic", "0000:3b:00.0")
    assert nic.severity == "warn" and "no RDMA device" in nic.message and nic.fix.startswith("modprobe mlx5_ib")
    ib = one(report, "modules", "mlx5_ib")
    assert ib.severity == "error" and "modprobe mlx5_ib" in ib.fix
    assert one(report, "modules", "ib_core").severity == "error"
    mode = one(report, "rdma-mode")
    assert mode.severity == "warn" and "no RDMA netlink" in mode.message
    vf = one(report, "sriov", "0000:3b:00.2")
    assert vf.severity == "warn" and vf.fix == "modprobe mlx5_ib"
    assert report.exit_code == 1


def test_host_without_rdma_uses_the_real_netlink_reader(env, capsys):
    """This machine's kernel has no RDMA: the real RDMA netlink reader degrades to a clear finding."""
    no_rdma_host(env["root"])
    code, cap = cli_run(capsys, env)
    assert "no RDMA on this host: this kernel has no RDMA netlink" in cap.out
    assert "no RDMA-capable PCI NIC" in cap.out
    assert "no RDMA devices: this kernel has no RDMA core loaded" in cap.out
    assert "absent (no RDMA device)" in cap.out
    assert "Traceback" not in cap.out + cap.err
    assert code == 0, cap.out


def test_soft_roce_host(env):
    soft_roce_host(env["root"])
    report = run(env)
    rxe = one(report, "rdma", "rxe0")
    assert rxe.severity == "info"
    assert rxe.message.startswith("rxe0 <-> eth1 (soft-RoCE (rxe), no PCI parent), port 1 ACTIVE (LinkUp), RoCE")
    assert "cannot move into a pod netns" in rxe.fix
    assert find(report, "link", "eth1")[0].message == "up, carrier on, speed ?, MTU 1500"
    assert "soft-RoCE over any Ethernet netdev (devices: rxe0)" in one(report, "modules", "rdma_rxe").message
    assert one(report, "nic").subject == "-"
    assert report.exit_code == 0


def test_missing_uverbs_and_unknown_modules(env):
    t = soft_roce_host(env["root"])
    os.remove(t.path("proc/modules"))
    for name in os.listdir(t.path("dev/infiniband")):
        os.remove(t.path(f"dev/infiniband/{name}"))
    report = run(env)
    dev = one(report, "dev")
    assert dev.severity == "error" and dev.fix == "modprobe ib_uverbs"
    assert one(report, "modules").message.startswith("cannot tell which modules are loaded")
    assert report.exit_code == 1


def test_built_in_modules_without_proc_modules(env):
    t = soft_roce_host(env["root"])
    os.remove(t.path("proc/modules"))
    t.dir("sys/module/ib_core/parameters")  # built in: no initstate
    t.file("sys/module/ib_uverbs/initstate", "live\n")  # loaded
    report = run(env)
    assert one(report, "modules", "ib_core").message.startswith("built in:")
    assert one(report, "modules", "ib_uverbs").message.startswith("loaded:")
    assert one(report, "modules", "rdma_ucm").severity == "warn"


def test_netlink_errors_degrade_to_a_warning(env):
    cx6dx_host(env["root"])
    report = run(env, lambda: ModeReading("error", None, "RDMA netlink SYS_GET failed: Operation not permitted"))
    mode = one(report, "rdma-mode")
    assert mode.severity == "warn" and "Operation not permitted" in mode.message
    old = run(env, lambda: ModeReading("unsupported", None, "the kernel does not report the mode"))
    assert "behaves as shared" in one(old, "rdma-mode").message


def test_nic_models():
    assert nic_models.describe("0x15b3", "0x101d") == "ConnectX-6 Dx"
    assert nic_models.describe("0x15b3", "0x1021") == "ConnectX-7"
    assert nic_models.describe("0x15b3", "0xa2dc") == "BlueField-3 (ConnectX-7)"
    assert nic_models.describe("0x15b3", "0xa2d6") == "BlueField-2 (ConnectX-6 Dx)"
    assert nic_models.describe("0x15b3", "0x101f") == "ConnectX-6 Lx"
    assert nic_models.describe("0x15b3", "0x1017") == "ConnectX-5"
    assert nic_models.describe("0x15b3", "0x1013") == "ConnectX-4"
    assert nic_models.lookup("0x15b3", "0x101c").vf and nic_models.lookup("0x15b3", "0x1018").vf
    bf3 = nic_models.lookup("0x15b3", "0xa2dc")
    assert nic_models.describe("0x15b3", "0x101e", bf3) == "ConnectX mlx5Gen VF of BlueField-3 (ConnectX-7)"
    assert nic_models.describe("0x15b3", "0xffff") == "NVIDIA/Mellanox (unknown model)"
    assert nic_models.pci_id("0x15B3", "0x101D") == "15b3:101d"
    assert nic_models.lookup("0x8086", "0x101d") is None


# =========================================================================== CNI bin dir


def test_real_shims_answer_version(env):
    no_rdma_host(env["root"])
    report = run(env)
    for name in PLUGINS:
        f = one(report, "cni-bin", name)
        assert f.severity == "ok", f
        assert f.message == "shim with in-process fallback, answers VERSION: 0.3.0 0.3.1 0.4.0 1.0.0 1.1.0"
    assert one(report, "cni-bin", "multus").message == "multus-shim present (thick plugin)"
    assert one(report, "cni-bin", "reference").message == "present: macvlan host-local loopback"


def test_broken_shims(env, tmp_path):
    no_rdma_host(env["root"])
    write_shim(os.path.join(env["bin"], "macvlan-rdma"), "macvlan-rdma", "/nonexistent/python3", SITE, env["socket"])
    os.chmod(os.path.join(env["bin"], "host-device-rdma"), 0o644)
    with open(os.path.join(env["bin"], "lease-ipam"), "w") as f:
        f.write("#!/bin/sh\necho '{\"code\": 999, \"msg\": \"plugin exploded\"}'\nexit 1\n")
    report = run(env)
    bad = one(report, "cni-bin", "macvlan-rdma")
    assert bad.severity == "error" and "names the interpreter /nonexistent/python3, which does not exist" in bad.message
    assert "re-run install.sh" in bad.fix
    mode = one(report, "cni-bin", "host-device-rdma")
    assert mode.severity == "error" and "is not executable" in mode.message and mode.fix.startswith("chmod 0755")
    failing = one(report, "cni-bin", "lease-ipam")
    assert failing.severity == "error"
    assert failing.message.endswith("answered CNI_COMMAND=VERSION with exit code 1: plugin exploded")
    assert report.exit_code == 1


def test_hanging_shim_times_out(env):
    no_rdma_host(env["root"])
    with open(os.path.join(env["bin"], "lease-ipam"), "w") as f:
        f.write("#!/bin/sh\nexec sleep 30\n")
    t0 = time.monotonic()
    report = run(env, timeout=1.0)
    assert time.monotonic() - t0 < 10
    assert "did not answer CNI_COMMAND=VERSION within 1 s" in one(report, "cni-bin", "lease-ipam").message


def test_missing_bin_dir_and_shims(env, tmp_path):
    no_rdma_host(env["root"])
    os.remove(os.path.join(env["bin"], "host-device-rdma"))
    report = run(env)
    missing = one(report, "cni-bin", "host-device-rdma")
    assert missing.severity == "error" and "is missing" in missing.message
    env2 = dict(env, bin=str(tmp_path / "nope"))
    gone = one(run(env2), "cni-bin")
    assert gone.severity == "error" and "does not exist" in gone.message


def test_shim_socket_other_than_the_checked_one_is_flagged(env, tmp_path):
    no_rdma_host(env["root"])
    report = run(dict(env, socket=str(tmp_path / "elsewhere.sock")))
    flagged = [f for f in find(report, "cni-bin", "macvlan-rdma") if f.severity == "warn"][0]
    assert f"talks to the daemon at {env['socket']}" in flagged.message
    assert f"--socket {env['socket']}" in flagged.fix


# =========================================================================== CNI conf dir and networks


def test_multus_first(env):
    no_rdma_host(env["root"])
    report = run(env)
    first = find(report, "cni-conf", "00-multus.conf")
    assert first[0].message == ("the runtime uses 00-multus.conf (multus-shim); files in lexical order: "
                                "00-multus.conf 10-flannel.conflist")
    assert first[1].severity == "ok" and first[1].message == "Multus (multus-shim) is the config the runtime uses"


def test_multus_not_first_is_an_error(env):
    no_rdma_host(env["root"])
    os.rename(os.path.join(env["conf"], "00-multus.conf"), os.path.join(env["conf"], "99-multus.conf"))
    report = run(env)
    bad = one(report, "cni-conf", "99-multus.conf")
    assert bad.severity == "error"
    assert "the runtime uses 10-flannel.conflist, so pods get no secondary networks" in bad.message
    assert "00-multus.conf" in bad.fix
    assert report.exit_code == 1


def test_parse_errors_are_reported_and_skipped(env):
    no_rdma_host(env["root"])
    write_conf(env["conf"], "000-broken.conf", "{not json")
    write_conf(env["conf"], "001-list.conf", FLANNEL)
    write_conf(env["conf"], "README", "ignored")
    report = run(env)
    broken = one(report, "cni-conf", "000-broken.conf")
    assert broken.severity == "warn" and "is not valid JSON" in broken.message and "the runtime skips it" in broken.message
    listed = one(report, "cni-conf", "001-list.conf")
    assert "is not named *.conflist" in listed.message
    assert "README" not in render_table(report.findings)
    # the first file that loads is still Multus's
    assert [f for f in find(report, "cni-conf", "00-multus.conf") if f.severity == "ok"]


def test_networks_in_the_conf_dir_are_judged_with_the_plugins_policy(env, tmp_path):
    cx6dx_host(env["root"])
    data = str(tmp_path / "ipam-data")
    write_conf(env["conf"], "20-rdma.conflist", {"cniVersion": "1.0.0", "name": "rdma-shared",
                                                 "plugins": [dict(macvlan_net(data_dir=data), name=None)]})
    write_conf(env["conf"], "30-vf.conf", {"cniVersion": "1.0.0", "name": "sriov-rdma", "type": "host-device-rdma",
                                           "rdma": "required", "ipam": {"type": "host-local", "subnet": "10.9.0.0/24"}})
    write_conf(env["conf"], "40-gone.conf", macvlan_net(name="gone", master="ens9f0np0", rdma="auto", data_dir=data))

    report = run(env)  # shared mode
    good = one(report, "network", "rdma-shared")
    assert good.severity == "ok"
    assert good.message.endswith("pods get a macvlan on ens1f0np0 and use its RDMA device mlx5_0 (shared mode)")
    vf = one(report, "network", "sriov-rdma")
    assert vf.severity == "error" and 'rdma is "required" but the RDMA netns mode is shared' in vf.message
    assert "rdma system set netns exclusive" in vf.fix
    gone = one(report, "network", "gone")
    assert gone.severity == "error" and "master ens9f0np0 does not exist on this host: ADD fails" in gone.message
    stores = {f.subject: f for f in find(report, "ipam")}
    assert set(stores) == {f"local {data}/rdma-shared", f"local {data}/gone"}
    assert all(f.severity == "ok" for f in stores.values())

    report = run(env, exclusive)
    bad = one(report, "network", "rdma-shared")
    assert bad.severity == "error" and "ADD fails" in bad.message and "the RDMA netns mode is exclusive" in bad.message
    assert "rdma system set netns shared" in bad.fix  # the plugin's own fix text
    assert one(report, "network", "sriov-rdma").severity == "ok"


def test_auto_macvlan_in_exclusive_mode_warns(env):
    cx6dx_host(env["root"])
    write_conf(env["conf"], "20-rdma.conf", macvlan_net(rdma="auto"))
    f = one(run(env, exclusive), "network", "rdma-shared")
    assert f.severity == "warn" and "pods attach without RDMA" in f.message and "netns mode is exclusive" in f.message


def test_default_route_master_and_missing_ipam_binary(env):
    cx6dx_host(env["root"])
    conf = macvlan_net(rdma="auto")
    del conf["master"]
    conf["ipam"] = {"type": "whereabouts", "range": "10.1.0.0/24"}
    write_conf(env["conf"], "20-rdma.conf", conf)
    report = run(env)
    plain = [f for f in find(report, "network", "rdma-shared") if "macvlan" in f.message][0]
    assert "master eno1 has no RDMA device: pods get a plain macvlan" in plain.message
    missing = [f for f in find(report, "network", "rdma-shared") if f.severity == "error"][0]
    assert "needs the plugin whereabouts, which is not in" in missing.message


def test_network_config_flag_accepts_a_nad(env, tmp_path, capsys):
    cx6dx_host(env["root"])
    nad = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
           "metadata": {"name": "vf-net"},
           "spec": {"config": json.dumps({"cniVersion": "1.0.0", "type": "host-device-rdma",
                                          "pciBusID": "0000:3b:00.2",
                                          "ipam": {"type": "lease-ipam", "range": "10.2.0.0/24",
                                                   "dataDir": str(tmp_path / "d")}})}}
    path = tmp_path / "nad.json"
    path.write_text(json.dumps(nad))
    code, cap = cli_run(capsys, env, "--network-config", str(path), "-o", "json")
    doc = json.loads(cap.out)
    net = [f for f in doc["findings"] if f["area"] == "network" and f["subject"] == "vf-net"][0]
    assert net["severity"] == "info"
    assert "only the netdev of 0000:3b:00.2 moves; mlx5_2 stays in the host netns (no RDMA netns mode)" in net["message"]
    store = [f for f in doc["findings"] if f["area"] == "ipam"][0]
    assert store["severity"] == "ok" and "not created yet" in store["message"]

    (tmp_path / "junk.json").write_text("[1, 2]")
    code, cap = cli_run(capsys, env, "--network-config", str(tmp_path / "junk.json"))
    assert code == 1 and "holds no network config" in cap.out


# =========================================================================== daemon


def test_daemon_absent_stale_and_daemon_only_shims(env, tmp_path):
    no_rdma_host(env["root"])
    absent_ = one(run(env), "daemon")
    assert absent_.severity == "warn" and "not running (no socket)" in absent_.message

    os.makedirs(os.path.dirname(env["socket"]), exist_ok=True)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(env["socket"])  # bound, never listening: connect() is refused
    try:
        stale = one(run(env), "daemon")
        assert stale.severity == "warn" and "stale socket" in stale.message
    finally:
        s.close()
        os.unlink(env["socket"])

    for name in PLUGINS:  # DaemonSet mode: shims without an in-process fallback
        write_shim(os.path.join(env["bin"], name), name, sys.executable, None, env["socket"])
    report = run(env)
    assert one(report, "cni-bin", "lease-ipam").message.startswith("daemon-only shim, answers VERSION")
    down = one(report, "daemon")
    assert down.severity == "error" and "pods do not start" in down.message
    assert report.exit_code == 1


def test_daemon_health_from_a_real_daemon(env, tmp_path):
    from rdmanet.node.testing import Daemon

    no_rdma_host(env["root"])
    sock = str(tmp_path / "d" / "daemon.sock")
    daemon = Daemon(sock, allow_uids=[os.getuid()])
    try:
        report = run(dict(env, socket=sock))
        f = one(report, "daemon")
        assert f.severity == "ok", f
        assert f.message.startswith(f"healthy: pid {daemon.pid}, up ")
    finally:
        daemon.cleanup()


# =========================================================================== lease-ipam Kubernetes store


def kube_net(kubeconfig, name="kube-net", **kube):
    return {"cniVersion": "1.0.0", "name": name, "type": "macvlan-rdma", "master": "eno1",
            "ipam": {"type": "lease-ipam", "range": "10.3.0.0/24",
                     "kubernetes": {"kubeconfig": str(kubeconfig), **kube}}}


def test_kubernetes_store_reachable(env, server, tmp_path):
    no_rdma_host(env["root"])
    kc = write_kubeconfig(tmp_path / "kc", server.url, namespace="ipam")
    write_conf(env["conf"], "20-a.conf", kube_net(kc, "net-a"))
    write_conf(env["conf"], "21-b.conf", kube_net(kc, "net-b"))
    report = run(env)
    f = one(report, "ipam")
    assert f.severity == "ok"
    assert f.message == f"networks net-a, net-b: API {server.url} answers, leases are listable in namespace ipam"
    lists = [e for e in server.request_log() if e["verb"] == "list"]
    assert len(lists) == 1  # one GET for both networks, limit=1
    assert lists[0]["path"] == "/apis/coordination.k8s.io/v1/namespaces/ipam/leases"
    assert lists[0]["query"] == {"limit": "1"}
    assert not [e for e in server.request_log() if e["verb"] != "list"]  # read-only


def test_kubernetes_store_refused_and_unreachable(env, tmp_path):
    no_rdma_host(env["root"])
    srv = KubeAPIServer(token="right")
    try:
        kc = write_kubeconfig(tmp_path / "kc", srv.url, namespace="ipam", token="wrong")
        write_conf(env["conf"], "20-a.conf", kube_net(kc, "net-a"))
        f = one(run(env), "ipam")
        assert f.severity == "error" and "HTTP 401" in f.message and "renew the token" in f.fix
    finally:
        srv.stop()
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    kc = write_kubeconfig(tmp_path / "kc2", f"http://127.0.0.1:{port}", namespace="ipam")
    write_conf(env["conf"], "20-a.conf", kube_net(kc, "net-a"))
    t0 = time.monotonic()
    report = run(env, timeout=2.0)
    assert time.monotonic() - t0 < 10
    f = one(report, "ipam")
    assert f.severity == "error" and "does not answer" in f.message and report.exit_code == 1


def test_kubernetes_store_bad_settings(env, tmp_path):
    no_rdma_host(env["root"])
    write_conf(env["conf"], "20-a.conf", kube_net(tmp_path / "missing-kubeconfig", "net-a"))
    f = one(run(env), "ipam")
    assert f.severity == "error" and "does not exist" in f.message
    write_conf(env["conf"], "20-a.conf", kube_net(tmp_path / "kc", "net-a", namespace="Not_A_Namespace"))
    f = one(run(env), "ipam")
    assert f.severity == "error" and "ipam.kubernetes.namespace" in f.message


def test_kubernetes_is_imported_only_for_a_kubernetes_store(env, tmp_path):
    no_rdma_host(env["root"])
    write_conf(env["conf"], "20-local.conf", macvlan_net(data_dir=str(tmp_path / "data")))
    code = (
        "import sys\n"
        "from rdmanet.cli.doctor import Options, diagnose\n"
        "from rdmanet.cli.doctor.host_facts import ModeReading\n"
        f"r = diagnose(Options(sysfs_root={str(env['root'])!r}, proc_root={str(env['root'])!r}, "
        f"dev_root={str(env['root'])!r}, cni_bin_dir={env['bin']!r}, cni_conf_dir={env['conf']!r}, "
        f"socket={env['socket']!r}, netns_mode_reader=lambda: ModeReading('ok', 'shared')))\n"
        "assert any(f.area == 'ipam' and f.severity == 'ok' for f in r.findings), r.findings\n"
        "print(any(m == 'kubernetes' or m.startswith('kubernetes.') for m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# =========================================================================== output, exit code, read-only


def test_json_output_and_exit_codes(env, capsys):
    cx6dx_host(env["root"])
    code, cap = cli_run(capsys, env, "-o", "json")
    doc = json.loads(cap.out)
    assert set(doc) == {"ok", "summary", "findings", "inventory"}
    assert doc["ok"] is (code == 0)
    assert sum(doc["summary"].values()) == len(doc["findings"])
    for f in doc["findings"]:
        assert set(f) == {"severity", "area", "subject", "message", "fix"}
        assert f["severity"] in ("ok", "info", "warn", "error")
        if f["severity"] in ("warn", "error"):
            assert f["fix"], f
    assert doc["inventory"]["host"]["rdma"]["mlx5_0"]["netdevs"] == ["ens1f0np0"]
    assert doc["inventory"]["host"]["pci"]["0000:3b:00.0"]["vfs"] == [[0, "0000:3b:00.2"], [1, "0000:3b:00.3"],
                                                                       [2, "0000:3b:00.4"], [3, "0000:3b:00.5"]]
    assert doc["summary"]["error"] == 0 and code == 0

    os.remove(os.path.join(env["bin"], "lease-ipam"))
    code, cap = cli_run(capsys, env, "-o", "json")
    doc = json.loads(cap.out)
    assert code == 1 and doc["ok"] is False and doc["summary"]["error"] == 1


def _snapshot(root) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[p] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out


def test_doctor_writes_nothing(env, tmp_path):
    cx6dx_host(env["root"])
    write_conf(env["conf"], "20-rdma.conf", macvlan_net(data_dir=str(tmp_path / "data")))
    before = _snapshot(tmp_path)
    run(env)
    assert _snapshot(tmp_path) == before


def test_bad_timeout_is_a_usage_error(env, capsys):
    no_rdma_host(env["root"])
    code, cap = cli_run(capsys, env, "--timeout", "0")
    assert code == 2 and cap.out == "" and "--timeout must be a positive number" in cap.err


def test_a_failing_check_is_a_finding_not_a_traceback(env, monkeypatch, capsys):
    from rdmanet.cli.doctor import host_checks

    no_rdma_host(env["root"])

    def boom(facts):
        raise RuntimeError("unexpected sysfs layout")

    monkeypatch.setattr(host_checks, "check_sriov", boom)
    code, cap = cli_run(capsys, env)
    assert "the host check failed: RuntimeError: unexpected sysfs layout" in cap.out
    assert "Traceback" not in cap.out + cap.err and code == 1


# =========================================================================== daemon under systemd (rdmanet.socket)


def systemd_root(tmp_path, socket_path=None, running=True):
    """A root for --systemd-root: systemd running (/run/systemd/system), rdmanet.socket when a socket is given."""
    from rdmanet.cli import systemd_units

    root = tmp_path / "sysroot"
    if running:
        (root / "run" / "systemd" / "system").mkdir(parents=True)
    if socket_path is not None:
        systemd_units.write(str(root / "etc" / "systemd" / "system"), sys.executable, socket_path)
    return str(root)


def test_daemon_socket_activated_is_healthy_and_says_so(env, tmp_path):
    from rdmanet.node.testing import SocketActivation

    no_rdma_host(env["root"])
    activation = SocketActivation(env["socket"], allow_uids=[os.getuid()])
    try:
        f = one(run(env, systemd_root=systemd_root(tmp_path, env["socket"])), "daemon")
        assert f.severity == "ok", f
        (daemon,) = activation.started  # the health request started it, as a shim's call would
        assert f.message.startswith(f"healthy: pid {daemon.pid}, up ")
        assert f.message.endswith(", socket-activated (rdmanet.socket)")
    finally:
        activation.close()


def test_daemon_socket_unit_installed_but_not_listening(env, tmp_path):
    no_rdma_host(env["root"])
    root = systemd_root(tmp_path, env["socket"])
    f = one(run(env, systemd_root=root), "daemon")
    assert f.severity == "warn"
    assert f.message.startswith(f"{root}/etc/systemd/system/rdmanet.socket is installed but nothing listens on the socket")
    assert f.fix.startswith("systemctl enable --now rdmanet.socket")


def test_daemon_socket_unit_on_another_path(env, tmp_path):
    no_rdma_host(env["root"])
    other = str(tmp_path / "elsewhere" / "daemon.sock")
    findings = find(run(env, systemd_root=systemd_root(tmp_path, other)), "daemon")
    assert findings[0].severity == "warn" and f"listens on {other}, but doctor checked {env['socket']}" in findings[0].message
    assert findings[0].fix.startswith(f"run doctor with --socket {other}")


def test_daemon_absent_under_systemd_without_the_unit_says_reinstall(env, tmp_path):
    no_rdma_host(env["root"])
    under_systemd = one(run(env, systemd_root=systemd_root(tmp_path)), "daemon")
    assert under_systemd.severity == "warn" and "not running (no socket)" in under_systemd.message
    assert under_systemd.fix.startswith("re-run install.sh: under systemd it installs rdmanet.socket")
    without = one(run(env, systemd_root=str(tmp_path / "no-systemd")), "daemon")
    assert "rdmanet.socket" not in without.fix and "init system" in without.fix


# =========================================================================== networks written for nv-ipam


def test_nv_ipam_networks_are_recognised_and_their_pools_mode_is_named(env, server, tmp_path, monkeypatch):
    from nv_ipam_objects import IPPOOL, OPERATOR_NS, ippool_blocks, put_pool

    from rdmanet.ipam import nv_ipam_node_store

    no_rdma_host(env["root"])
    monkeypatch.setenv("RDMANET_NODE_NAME", "node-b")
    monkeypatch.setattr(nv_ipam_node_store, "STORE_FILE", str(tmp_path / "no-nv-ipam-store"))
    spec = {"subnet": "192.168.5.0/24", "perNodeBlockSize": 50, "gateway": "192.168.5.1"}
    put_pool(server, IPPOOL, OPERATOR_NS, "ipoib-pool-a", spec, ippool_blocks(spec["subnet"], 50, ["node-a", "node-b"]))
    put_pool(server, IPPOOL, OPERATOR_NS, "pool-free", spec, [], {"rdmanet.io/node-blocks": "lease-ipam"})
    kc = write_kubeconfig(tmp_path / "kc", server.url, namespace="rdmanet-system")

    def net(name, **ipam):
        return {"cniVersion": "1.0.0", "name": name, "type": "macvlan-rdma", "master": "eno1", "ipam": ipam}

    write_conf(env["conf"], "20-a.conf", net("still-nv", type="nv-ipam", poolName="ipoib-pool-a"))
    write_conf(env["conf"], "21-b.conf", net("switched", type="lease-ipam", poolName="ipoib-pool-a",
                                             kubernetes={"kubeconfig": str(kc)}))
    write_conf(env["conf"], "22-c.conf", net("free", type="lease-ipam", poolName="pool-free",
                                             kubernetes={"kubeconfig": str(kc)}))
    write_conf(env["conf"], "23-d.conf", net("missing", type="lease-ipam", poolName="no-such-pool",
                                             kubernetes={"kubeconfig": str(kc)}))
    report = run(env)
    still = one(report, "ipam", "still-nv")
    assert still.severity == "info"
    assert "uses nv-ipam (IPPool ipoib-pool-a): lease-ipam takes this ipam block as written, change ipam.type to " \
           "lease-ipam and nothing else" in still.message
    assert "not read from here" in still.message and "ipam.kubernetes.kubeconfig" in still.fix
    switched = one(report, "ipam", "switched")
    assert switched.severity == "ok"
    assert ("node node-b's nv-ipam block 192.168.5.51-192.168.5.100 of 192.168.5.0/24, never left, no borrowing "
            "(rdmanet.io/node-blocks=nv-ipam)") in switched.message
    free = one(report, "ipam", "free")
    assert free.severity == "ok"
    assert "lease-ipam's node blocks and borrowing (rdmanet.io/node-blocks=lease-ipam)" in free.message
    missing = one(report, "ipam", "missing")
    assert missing.severity == "error" and "IPPool 'no-such-pool' is not in namespace" in missing.message
    assert report.inventory["nv_ipam_pools"][1]["modes"] == ["nv-ipam"]
    assert not [e for e in server.request_log() if e["verb"] not in ("get", "list")]  # read-only
