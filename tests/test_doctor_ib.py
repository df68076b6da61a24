"""``rdmanet doctor`` on InfiniBand hosts: fake trees modelled on a ConnectX-6 IB node (the Tree
helper of test_doctor.py), judged for which plugin fits each port, the IPoIB netdevs' pkey and
mode, ib_ipoib, the subnet manager's port state and IB VFs without a GUID; and networks that put
a macvlan on an IPoIB port or an IPoIB child on an Ethernet one.

    ConnectX-6 IB host (CX6)
      0000:3b:00.0  PF 15b3:101b mlx5_core  ibp59s0f0 (type 32, pkey 0xffff, datagram)  mlx5_0 IB ACTIVE
        VF0 0000:3b:00.2 15b3:101c mlx5_core ibp59s0f0v0 mlx5_2 (node GUID 0)
      0000:3b:00.1  PF 15b3:101b mlx5_core  ibp59s0f1 (type 32, pkey 0xffff, connected)  mlx5_1 IB INIT
    plus the ConnectX-6 Dx RoCE host of test_doctor.py on the same tree when asked
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_doctor import BRIDGE, INTEL, PF0, PF1, VFS, Tree, env, intel_nic, one, run, write_conf  # noqa: E402,F401


def ipoib_netdev(t: Tree, devpath: str, name: str, *, mode: str = "datagram", pkey: str = "0xffff", mtu: int = 2044) -> None:
    t.netdev(devpath, name, speed="200000", mtu=mtu)
    node = f"{devpath}/net/{name}"
    for attr, value in (("type", "32"), ("pkey", pkey), ("mode", mode), ("umcast", "0"), ("dev_port", "0")):
        t.file(f"{node}/{attr}", value + "\n")


def cx6_ib_host(root, *, ib_ipoib: bool = True) -> Tree:
    t = Tree(root)
    t.dir(BRIDGE)
    t.pci(PF0, "0x15b3", "0x101b", driver="mlx5_core")
    t.pci(PF1, "0x15b3", "0x101b", driver="mlx5_core")
    t.file(f"{PF0}/sriov_totalvfs", "8\n")
    t.file(f"{PF0}/sriov_numvfs", "1\n")
    t.pci(VFS[0], "0x15b3", "0x101c", driver="mlx5_core")
    t.vf(PF0, VFS[0], 0)
    t.ibdev(PF0, "mlx5_0", layer="InfiniBand", uverbs=0)
    t.ibdev(PF1, "mlx5_1", layer="InfiniBand", state="2: INIT", uverbs=1)
    t.ibdev(VFS[0], "mlx5_2", layer="InfiniBand", state="2: INIT", uverbs=2)
    t.file(f"{PF0}/infiniband/mlx5_0/node_guid", "b859:9f03:00d4:6e2a\n")
    t.file(f"{VFS[0]}/infiniband/mlx5_2/node_guid", "0000:0000:0000:0000\n")
    if ib_ipoib:
        ipoib_netdev(t, PF0, "ibp59s0f0")
        ipoib_netdev(t, PF1, "ibp59s0f1", mode="connected", mtu=65520)
        ipoib_netdev(t, VFS[0], "ibp59s0f0v0")
    mods = ["mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "rdma_ucm"] + (["ib_ipoib"] if ib_ipoib else [])
    t.modules(*mods)
    t.dev("uverbs0", "uverbs1", "uverbs2", "rdma_cm")
    intel_nic(t)
    t.file(f"{INTEL}/net/eno1/type", "1\n")  # ARPHRD_ETHER
    return t


def test_ib_ports_say_which_plugin_fits(env):
    cx6_ib_host(env["root"])
    report = run(env)
    port = one(report, "ib", "mlx5_0/1")
    assert port.severity == "ok"
    assert port.message == ('InfiniBand port, ACTIVE (LinkUp), IPoIB ibp59s0f0 (0xffff, datagram, MTU 2044): shared pods '
                            'take ipoib-rdma ("master": "ibp59s0f0"), exclusive pods its VFs with host-device-rdma; '
                            'macvlan-rdma cannot use an IPoIB port')
    init = one(report, "ib", "mlx5_1/1")
    assert init.severity == "warn" and "ibp59s0f1 (0xffff, connected, MTU 65520)" in init.message
    assert "the port is INIT" in init.message and "subnet manager" in init.fix
    assert one(report, "ib", "ib_ipoib").severity == "ok"


def test_ib_vf_without_a_guid(env):
    cx6_ib_host(env["root"])
    vf = one(run(env), "ib", "0000:3b:00.2")
    assert vf.severity == "info"
    assert vf.message.startswith("IB VF 0000:3b:00.2 (mlx5_2) has node GUID 0000:0000:0000:0000: RDMA in a pod fails")
    assert "host-device-rdma sets one at ADD" in vf.fix


def test_ib_ports_without_ib_ipoib(env):
    cx6_ib_host(env["root"], ib_ipoib=False)
    report = run(env)
    port = one(report, "ib", "mlx5_0/1")
    assert port.severity == "warn"
    assert port.message == "InfiniBand port, ACTIVE (LinkUp), without an IPoIB netdev: ib_ipoib is not loaded: ipoib-rdma has no master here"
    assert port.fix.startswith("modprobe ib_ipoib")
    module = one(report, "ib", "ib_ipoib")
    assert module.severity == "warn" and module.fix == "modprobe ib_ipoib"


def test_roce_ports_point_to_macvlan_rdma(env):
    from test_doctor import cx6dx_host

    cx6dx_host(env["root"])
    report = run(env)
    roce = one(report, "ib", "mlx5_0/1")
    assert roce.severity == "info"
    assert roce.message == ('RoCE port (link layer Ethernet), netdev ens1f0np0: shared pods take macvlan-rdma '
                            '("master": "ens1f0np0"); ipoib-rdma does not apply')
    assert [f for f in report.findings if f.area == "ib" and f.subject == "ib_ipoib"] == []


def test_networks_on_the_wrong_kind_of_port(env, tmp_path):
    cx6_ib_host(env["root"])
    ipam = {"type": "lease-ipam", "range": "10.57.0.0/24", "dataDir": str(tmp_path / "data")}
    write_conf(env["conf"], "20-ib.conf", {"cniVersion": "1.0.0", "name": "ib-shared", "type": "ipoib-rdma",
                                           "master": "ibp59s0f0", "rdma": "required", "ipam": ipam})
    write_conf(env["conf"], "30-mv.conf", {"cniVersion": "1.0.0", "name": "mv-on-ib", "type": "macvlan-rdma",
                                           "master": "ibp59s0f0", "ipam": ipam})
    write_conf(env["conf"], "40-ib-eth.conf", {"cniVersion": "1.0.0", "name": "ib-on-eth", "type": "ipoib-rdma",
                                               "master": "eno1", "ipam": ipam})
    report = run(env)
    good = one(report, "network", "ib-shared")
    assert good.severity == "ok"
    assert good.message.endswith("pods get an IPoIB child on ibp59s0f0 and use its RDMA device mlx5_0 (shared mode)")
    mv = one(report, "network", "mv-on-ib")
    assert mv.severity == "error" and "is an IPoIB (InfiniBand) netdev: a macvlan cannot hang off it" in mv.message
    assert "ipoib-rdma" in mv.fix
    eth = one(report, "network", "ib-on-eth")
    assert eth.severity == "error"
    assert eth.message.endswith("master eno1 is not an IPoIB netdev (link type 1): ADD fails")
    assert "macvlan-rdma" in eth.fix
