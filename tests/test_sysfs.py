"""sysfs lookups against fake trees built with the kernel's own relative symlinks.

The tree mirrors a real host (paths from a ConnectX host and a soft-RoCE VM):

    /sys/devices/pci0000:3a/0000:3a:00.0/            PCI bridge
        0000:3b:00.0/                                mlx5 PF: infiniband/mlx5_0, net/ens1f0np0
            virtfn0 -> ../0000:3b:00.2
            mlx5_core.sf.4/                          SF (auxiliary): infiniband/mlx5_3,
                                                     net/en3f0pf0sf4
        0000:3b:00.2/                                VF: physfn, infiniband/mlx5_2, net/ens1f0v0
    /sys/devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0/  NIC without RDMA: net/eno1
    /sys/devices/virtual/net/veth0                   rxe0's netdev (no device link)
    /sys/devices/virtual/infiniband/rxe0/parent      "veth0"
    /sys/class/net/<if>   -> ../../devices/.../net/<if>
    /sys/class/infiniband/<ibdev> -> ../../devices/.../infiniband/<ibdev>
    /sys/bus/pci/devices/<pci> -> ../../../devices/...
    /sys/bus/auxiliary/devices/<id> -> ../../../devices/...
"""

from __future__ import annotations

import errno
import ipaddress
import os

import pytest

from rdmanet.cni.linux.sysfs import (
    DPDK_DRIVERS,
    device_exists,
    device_id_of_netdev,
    driver_of_device,
    driver_of_pci,
    is_pci_address,
    netdev_of_kernelpath,
    netdevs_of_auxiliary,
    netdevs_of_pci,
    pci_address_of_netdev,
    pf_netdev_of_vf,
    pf_of_vf,
    rdma_devices_for_device_id,
    rdma_devices_for_netdev,
    vf_index,
)

BRIDGE = "sys/devices/pci0000:3a/0000:3a:00.0"
PF = f"{BRIDGE}/0000:3b:00.0"
VF = f"{BRIDGE}/0000:3b:00.2"
SF = f"{PF}/mlx5_core.sf.4"
PLAIN = "sys/devices/pci0000:5d/0000:5d:00.0/0000:5e:00.0"


class Tree:
    def __init__(self, root):
        self.root = str(root)

    def dir(self, path: str) -> None:
        os.makedirs(os.path.join(self.root, path), exist_ok=True)

    def file(self, path: str, text: str) -> None:
        self.dir(os.path.dirname(path))
        with open(os.path.join(self.root, path), "w") as f:
            f.write(text)

    def link(self, path: str, target: str) -> None:
        """Symlink ``path`` -> ``target`` (kept verbatim, relative like the kernel's)."""
        self.dir(os.path.dirname(path))
        os.symlink(target, os.path.join(self.root, path))

    def rel_link(self, path: str, dest: str) -> None:
        """Symlink ``path`` to tree path ``dest`` with a relative target built like the
        kernel's sysfs_get_target_path(): up to the common ancestor of the link and the target's
        *parent*, then down (so ``device`` is ``../../../0000:3b:00.0``, never ``../..``)."""
        up_down = os.path.relpath(os.path.dirname(dest), os.path.dirname(path))
        target = os.path.join(up_down, os.path.basename(dest))
        assert not target.startswith("/")
        self.link(path, target)

    def device(self, devpath: str, subsystem: str) -> None:
        self.dir(devpath)
        self.rel_link(f"{devpath}/subsystem", f"sys/bus/{subsystem}")
        bus_dir = f"sys/bus/{subsystem}/devices/{os.path.basename(devpath)}"
        self.rel_link(bus_dir, devpath)

    def netdev(self, devpath: str | None, ifname: str) -> None:
        """A netdev under device ``devpath`` (None: virtual), with class link and device link."""
        parent = devpath or "sys/devices/virtual"
        node = f"{parent}/net/{ifname}"
        self.dir(node)
        if devpath is not None:
            self.rel_link(f"{node}/device", devpath)
        self.rel_link(f"sys/class/net/{ifname}", node)

    def ibdev(self, parent: str, name: str, parent_ifname: str | None = None) -> None:
        node = f"{parent}/infiniband/{name}"
        self.dir(node)
        if parent_ifname is not None:
            self.file(f"{node}/parent", parent_ifname + "\n")
        self.rel_link(f"sys/class/infiniband/{name}", node)

    def driver(self, devpath: str, bus: str, name: str) -> None:
        """Bind ``devpath`` to driver ``name``: ``driver -> ../../../../bus/<bus>/drivers/<name>``."""
        self.dir(f"sys/bus/{bus}/drivers/{name}")
        self.rel_link(f"{devpath}/driver", f"sys/bus/{bus}/drivers/{name}")

    def vf(self, pf: str, vf: str, index: int) -> None:
        """VF ``vf`` of PF ``pf`` (both PCI device paths): ``physfn`` and ``virtfn<index>``."""
        self.rel_link(f"{vf}/physfn", pf)
        self.rel_link(f"{pf}/virtfn{index}", vf)


@pytest.fixture
def tree(tmp_path):
    t = Tree(tmp_path)
    for bus in ("pci", "auxiliary", "usb"):
        t.dir(f"sys/bus/{bus}/devices")
    t.dir(BRIDGE)
    # mlx5 PF with its RDMA device and netdev
    t.device(PF, "pci")
    t.ibdev(PF, "mlx5_0")
    t.netdev(PF, "ens1f0np0")
    # a VF of it
    t.device(VF, "pci")
    t.rel_link(f"{VF}/physfn", PF)
    t.rel_link(f"{PF}/virtfn0", VF)
    t.ibdev(VF, "mlx5_2")
    t.netdev(VF, "ens1f0v0")
    # an SF: auxiliary device under the PF
    t.device(SF, "auxiliary")
    t.ibdev(SF, "mlx5_3")
    t.netdev(SF, "en3f0pf0sf4")
    # a PCI NIC without RDMA
    t.device(PLAIN, "pci")
    t.netdev(PLAIN, "eno1")
    # soft-RoCE on a veth
    t.netdev(None, "veth0")
    t.ibdev("sys/devices/virtual", "rxe0", parent_ifname="veth0")
    return t


def test_links_are_relative_like_the_kernel(tree):
    root = tree.root
    assert os.readlink(f"{root}/{PF}/net/ens1f0np0/device") == "../../../0000:3b:00.0"
    assert os.readlink(f"{root}/sys/class/net/ens1f0np0") == (
        "../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/net/ens1f0np0"
    )
    assert os.readlink(f"{root}/sys/bus/pci/devices/0000:3b:00.0") == (
        "../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0"
    )
    assert os.readlink(f"{root}/{VF}/physfn") == "../0000:3b:00.0"
    assert os.readlink(f"{root}/{SF}/subsystem") == "../../../../../bus/auxiliary"


# ------------------------------------------------------------------ rdma_devices_for_netdev


@pytest.mark.parametrize(
    "ifname, expected",
    [
        ("ens1f0np0", ["mlx5_0"]),  # PF
        ("ens1f0v0", ["mlx5_2"]),  # VF
        ("en3f0pf0sf4", ["mlx5_3"]),  # SF (auxiliary parent)
        ("veth0", ["rxe0"]),  # rxe: parent file, no device link
        ("eno1", []),  # PCI NIC without infiniband/
        ("nosuch0", []),  # no such netdev
    ],
)
def test_rdma_devices_for_netdev(tree, ifname, expected):
    assert rdma_devices_for_netdev(ifname, root=tree.root) == expected


def test_two_devices_sorted_from_both_sources(tree):
    tree.ibdev(PF, "mlx5_1")
    tree.ibdev("sys/devices/virtual", "rxe1", parent_ifname="ens1f0np0")
    assert rdma_devices_for_netdev("ens1f0np0", root=tree.root) == ["mlx5_0", "mlx5_1", "rxe1"]


def test_duplicate_from_both_sources_is_listed_once(tree):
    tree.file(f"{PF}/infiniband/mlx5_0/parent", "ens1f0np0\n")
    assert rdma_devices_for_netdev("ens1f0np0", root=tree.root) == ["mlx5_0"]


def test_empty_infiniband_dir(tree):
    tree.dir(f"{PLAIN}/infiniband")
    assert rdma_devices_for_netdev("eno1", root=tree.root) == []


def test_dangling_device_link(tree):
    tree.dir("sys/devices/virtual/net/gone0")
    tree.link("sys/devices/virtual/net/gone0/device", "../../../0000:99:00.0")
    tree.rel_link("sys/class/net/gone0", "sys/devices/virtual/net/gone0")
    assert rdma_devices_for_netdev("gone0", root=tree.root) == []
    assert pci_address_of_netdev("gone0", root=tree.root) is None


def test_no_class_infiniband_at_all(tmp_path):
    t = Tree(tmp_path)
    t.dir(PF)
    t.netdev(PF, "ens1f0np0")
    assert rdma_devices_for_netdev("ens1f0np0", root=str(tmp_path)) == []


def test_rxe_parent_of_another_netdev_is_not_listed(tree):
    tree.netdev(None, "veth1")
    assert rdma_devices_for_netdev("veth1", root=tree.root) == []


def test_files_in_infiniband_dir_are_not_devices(tree):
    tree.file(f"{PF}/infiniband/README", "not a device")
    assert rdma_devices_for_netdev("ens1f0np0", root=tree.root) == ["mlx5_0"]


# ------------------------------------------------------------------ rdma_devices_for_device_id


@pytest.mark.parametrize(
    "dev_id, expected",
    [
        ("0000:3b:00.0", ["mlx5_0"]),
        ("0000:3b:00.2", ["mlx5_2"]),
        ("0000:3B:00.2", ["mlx5_2"]),  # upper case from a config
        ("mlx5_core.sf.4", ["mlx5_3"]),
        ("0000:5e:00.0", []),
        ("0000:99:00.0", []),
        ("mlx5_core.sf.9", []),
    ],
)
def test_rdma_devices_for_device_id(tree, dev_id, expected):
    assert rdma_devices_for_device_id(dev_id, root=tree.root) == expected


def test_device_id_with_two_rdma_devices(tree):
    tree.ibdev(VF, "mlx5_9")
    assert rdma_devices_for_device_id("0000:3b:00.2", root=tree.root) == ["mlx5_2", "mlx5_9"]


def test_pci_looking_id_is_not_searched_on_auxiliary_bus(tree):
    # an aux device named like a PCI address must not be found through the PCI path
    tree.device("sys/devices/virtual/0000:77:00.0", "auxiliary")
    tree.ibdev("sys/devices/virtual/0000:77:00.0", "fake0")
    assert rdma_devices_for_device_id("0000:77:00.0", root=tree.root) == []


# ------------------------------------------------------------------ pci_address_of_netdev


@pytest.mark.parametrize(
    "ifname, expected",
    [
        ("ens1f0np0", "0000:3b:00.0"),
        ("ens1f0v0", "0000:3b:00.2"),
        ("en3f0pf0sf4", "0000:3b:00.0"),  # SF -> its parent PF
        ("eno1", "0000:5e:00.0"),
        ("veth0", None),
        ("nosuch0", None),
    ],
)
def test_pci_address_of_netdev(tree, ifname, expected):
    assert pci_address_of_netdev(ifname, root=tree.root) == expected


def test_nested_auxiliary_device(tree):
    eth = f"{SF}/mlx5_core.eth.4"
    tree.device(eth, "auxiliary")
    tree.netdev(eth, "sfeth4")
    assert pci_address_of_netdev("sfeth4", root=tree.root) == "0000:3b:00.0"


def test_non_pci_bus_has_no_pci_address(tree):
    usb = "sys/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0"
    tree.device("sys/devices/pci0000:00/0000:00:14.0", "pci")
    tree.device(usb, "usb")
    tree.netdev(usb, "enx001122334455")
    assert pci_address_of_netdev("enx001122334455", root=tree.root) is None


def test_auxiliary_device_without_pci_parent(tree):
    ns = "sys/devices/netdevsim10"
    tree.device(ns, "auxiliary")
    tree.netdev(ns, "eth0")
    assert pci_address_of_netdev("eth0", root=tree.root) is None


# ------------------------------------------------------------------ resolution stays in root


def test_absolute_symlink_resolves_inside_root(tree):
    tree.link("sys/class/net/abs0", f"/{PF}/net/ens1f0np0")
    assert rdma_devices_for_netdev("abs0", root=tree.root) == ["mlx5_0"]
    assert pci_address_of_netdev("abs0", root=tree.root) == "0000:3b:00.0"


def test_dotdot_cannot_escape_root(tree, tmp_path):
    # outside the fake root, a tree that would match if '..' escaped
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    (outside / "infiniband" / "evil0").mkdir(parents=True)
    try:
        tree.dir("sys/devices/virtual/net/esc0")
        # six levels up from .../net/esc0 is the fake root's parent, where `outside` lives
        tree.link("sys/devices/virtual/net/esc0/device", "../" * 6 + outside.name)
        tree.rel_link("sys/class/net/esc0", "sys/devices/virtual/net/esc0")
        naive = os.path.realpath(f"{tree.root}/sys/class/net/esc0/device")
        assert os.listdir(f"{naive}/infiniband") == ["evil0"]  # what a plain realpath would see
        assert rdma_devices_for_netdev("esc0", root=tree.root) == []
    finally:
        (outside / "infiniband" / "evil0").rmdir()
        (outside / "infiniband").rmdir()
        outside.rmdir()


def test_symlink_loop_raises_eloop(tree):
    tree.link("sys/class/net/loop0", "loop0")
    with pytest.raises(OSError) as e:
        rdma_devices_for_netdev("loop0", root=tree.root)
    assert e.value.errno == errno.ELOOP


@pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "../etc", "x\0y"])
def test_invalid_names_rejected(tree, bad):
    for fn in (rdma_devices_for_netdev, pci_address_of_netdev, rdma_devices_for_device_id):
        with pytest.raises(ValueError):
            fn(bad, root=tree.root)


@pytest.mark.parametrize(
    "value, ok",
    [("0000:3b:00.0", True), ("0000:3B:1f.7", True), ("0000:3b:00.8", False), ("3b:00.0", False),
     ("0000:3b:00.0\n", False), ("mlx5_core.sf.4", False)],
)
def test_is_pci_address(value, ok):
    assert is_pci_address(value) is ok


# ================================================================== device selection lookups
#
# A second host, laid out like a ConnectX-6 Dx with SR-IOV and SFs plus a virtio NIC:
#
#   /sys/devices/pci0000:00/0000:00:02.0/            root port
#       0000:03:00.0/   PF, mlx5_core: net/ens2f0np0, infiniband/mlx5_0, sriov_numvfs=3,
#                       virtfn0..2 -> VF0..VF2, stale virtfn3 -> 0000:03:00.5
#           mlx5_core.sf.2/  SF (auxiliary, driver mlx5_core.sf): net/enp3s0f0s2, infiniband/mlx5_3
#       0000:03:00.2/   VF0, mlx5_core: net/ens2f0v0, infiniband/mlx5_2
#       0000:03:00.3/   VF1, vfio-pci: no netdev (DPDK)
#       0000:03:00.4/   VF2, bound to "acme_vf": no netdev
#       0000:03:00.5/   has physfn, but only the stale virtfn3 (>= sriov_numvfs) names it
#   /sys/devices/pci0000:00/0000:00:03.0/            virtio-pci: virtio0/net/eth0
#   /sys/devices/pci0000:00/0000:00:04.0/            no driver, no netdev

ROOT_PORT = "sys/devices/pci0000:00/0000:00:02.0"
H_PF = f"{ROOT_PORT}/0000:03:00.0"
H_VF0 = f"{ROOT_PORT}/0000:03:00.2"
H_VF1 = f"{ROOT_PORT}/0000:03:00.3"
H_VF2 = f"{ROOT_PORT}/0000:03:00.4"
H_VF5 = f"{ROOT_PORT}/0000:03:00.5"
H_SF = f"{H_PF}/mlx5_core.sf.2"
H_VIRTIO = "sys/devices/pci0000:00/0000:00:03.0"
H_BARE = "sys/devices/pci0000:00/0000:00:04.0"


def build_sriov_host(root) -> Tree:
    t = Tree(root)
    for bus in ("pci", "auxiliary", "virtio"):
        t.dir(f"sys/bus/{bus}/devices")
    t.device(H_PF, "pci")
    t.driver(H_PF, "pci", "mlx5_core")
    t.netdev(H_PF, "ens2f0np0")
    t.ibdev(H_PF, "mlx5_0")
    t.file(f"{H_PF}/sriov_numvfs", "3\n")
    for index, vf in enumerate((H_VF0, H_VF1, H_VF2)):
        t.device(vf, "pci")
        t.vf(H_PF, vf, index)
    t.driver(H_VF0, "pci", "mlx5_core")
    t.netdev(H_VF0, "ens2f0v0")
    t.ibdev(H_VF0, "mlx5_2")
    t.driver(H_VF1, "pci", "vfio-pci")
    t.driver(H_VF2, "pci", "acme_vf")
    t.device(H_VF5, "pci")
    t.driver(H_VF5, "pci", "mlx5_core")
    t.netdev(H_VF5, "ens2f0v3")
    t.vf(H_PF, H_VF5, 3)
    t.device(H_SF, "auxiliary")
    t.driver(H_SF, "auxiliary", "mlx5_core.sf")
    t.netdev(H_SF, "enp3s0f0s2")
    t.ibdev(H_SF, "mlx5_3")
    t.device(H_VIRTIO, "pci")
    t.driver(H_VIRTIO, "pci", "virtio-pci")
    t.device(f"{H_VIRTIO}/virtio0", "virtio")
    t.netdev(f"{H_VIRTIO}/virtio0", "eth0")
    t.device(H_BARE, "pci")
    return t


@pytest.fixture
def host(tmp_path):
    return build_sriov_host(tmp_path)


def test_host_links_are_the_kernels(host):
    r = host.root
    assert os.readlink(f"{r}/sys/bus/pci/devices/0000:03:00.2") == (
        "../../../devices/pci0000:00/0000:00:02.0/0000:03:00.2"
    )
    assert os.readlink(f"{r}/{H_VF0}/physfn") == "../0000:03:00.0"
    assert os.readlink(f"{r}/{H_PF}/virtfn0") == "../0000:03:00.2"
    assert os.readlink(f"{r}/{H_VF0}/driver") == "../../../../bus/pci/drivers/mlx5_core"
    assert os.readlink(f"{r}/{H_SF}/driver") == "../../../../../bus/auxiliary/drivers/mlx5_core.sf"
    assert os.readlink(f"{r}/sys/bus/auxiliary/devices/mlx5_core.sf.2") == (
        "../../../devices/pci0000:00/0000:00:02.0/0000:03:00.0/mlx5_core.sf.2"
    )


@pytest.mark.parametrize(
    "pci, expected",
    [
        ("0000:03:00.0", ["ens2f0np0"]),  # PF (its SF's netdev is not the PF's)
        ("0000:03:00.2", ["ens2f0v0"]),  # VF
        ("0000:03:00.2".upper(), ["ens2f0v0"]),
        ("0000:03:00.3", []),  # vfio-pci VF
        ("0000:00:03.0", ["eth0"]),  # virtio: <pci>/virtio0/net
        ("0000:00:04.0", []),
        ("0000:99:00.0", []),  # no such device
    ],
)
def test_netdevs_of_pci(host, pci, expected):
    assert netdevs_of_pci(pci, root=host.root) == expected


def test_netdevs_of_pci_prefers_net_over_virtio(host):
    host.netdev(H_VIRTIO, "direct0")
    assert netdevs_of_pci("0000:00:03.0", root=host.root) == ["direct0"]


def test_netdevs_of_pci_two_sorted(host):
    host.netdev(H_PF, "ens2f0np0b")
    host.netdev(H_PF, "a0")
    assert netdevs_of_pci("0000:03:00.0", root=host.root) == ["a0", "ens2f0np0", "ens2f0np0b"]


def test_netdevs_of_pci_two_virtio_children(host):
    host.device(f"{H_VIRTIO}/virtio1", "virtio")
    host.netdev(f"{H_VIRTIO}/virtio1", "eth1")
    host.dir(f"{H_VIRTIO}/virtio_other_file_like_dir_without_net")
    assert netdevs_of_pci("0000:00:03.0", root=host.root) == ["eth0", "eth1"]


@pytest.mark.parametrize(
    "dev_id, expected",
    [("mlx5_core.sf.2", ["enp3s0f0s2"]), ("mlx5_core.sf.9", [])],
)
def test_netdevs_of_auxiliary(host, dev_id, expected):
    assert netdevs_of_auxiliary(dev_id, root=host.root) == expected


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.2", ["ens2f0v0"]),
        ("/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.2/", ["ens2f0v0"]),
        ("/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0/mlx5_core.sf.2", ["enp3s0f0s2"]),
        ("/sys/devices/pci0000:00/0000:00:03.0/virtio0", ["eth0"]),
        ("/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.3", []),
        ("/sys/devices/nosuch", []),
    ],
)
def test_netdev_of_kernelpath(host, path, expected):
    assert netdev_of_kernelpath(path, root=host.root) == expected


@pytest.mark.parametrize(
    "path",
    ["sys/devices/x", "/sys/class/net/eth0", "/sys/devices/../class/net", "/sys/devices/a/../../b",
     "/sys/devices/\0", 7],
)
def test_netdev_of_kernelpath_rejects(host, path):
    with pytest.raises(ValueError):
        netdev_of_kernelpath(path, root=host.root)


@pytest.mark.parametrize(
    "pci, expected",
    [
        ("0000:03:00.0", "mlx5_core"),
        ("0000:03:00.3", "vfio-pci"),
        ("0000:03:00.4", "acme_vf"),
        ("0000:00:03.0", "virtio-pci"),
        ("0000:00:04.0", None),  # unbound
        ("0000:99:00.0", None),  # no such device
    ],
)
def test_driver_of_pci(host, pci, expected):
    assert driver_of_pci(pci, root=host.root) == expected


def test_driver_of_auxiliary(host):
    assert driver_of_device("auxiliary", "mlx5_core.sf.2", root=host.root) == "mlx5_core.sf"


def test_dangling_driver_link_is_no_driver(host):
    host.link(f"{H_BARE}/driver", "../../../bus/pci/drivers/gone")
    assert driver_of_pci("0000:00:04.0", root=host.root) is None


def test_dpdk_drivers():
    assert DPDK_DRIVERS == ("vfio-pci", "uio_pci_generic", "igb_uio")


@pytest.mark.parametrize(
    "pci, pf, pf_netdev",
    [
        ("0000:03:00.2", "0000:03:00.0", "ens2f0np0"),
        ("0000:03:00.3", "0000:03:00.0", "ens2f0np0"),  # DPDK VF still knows its PF
        ("0000:03:00.0", None, None),  # a PF
        ("0000:00:03.0", None, None),
        ("0000:99:00.0", None, None),
    ],
)
def test_pf_of_vf(host, pci, pf, pf_netdev):
    assert pf_of_vf(pci, root=host.root) == pf
    assert pf_netdev_of_vf(pci, root=host.root) == pf_netdev


def test_pf_netdev_first_of_several(host):
    host.netdev(H_PF, "a_pf_port1")
    assert pf_netdev_of_vf("0000:03:00.2", root=host.root) == "a_pf_port1"


def test_pf_without_netdev(host):
    import shutil

    shutil.rmtree(f"{host.root}/{H_PF}/net")
    assert pf_of_vf("0000:03:00.2", root=host.root) == "0000:03:00.0"
    assert pf_netdev_of_vf("0000:03:00.2", root=host.root) is None


def test_dangling_physfn_is_not_a_vf(host):
    host.link(f"{H_BARE}/physfn", "../0000:00:09.0")
    assert pf_of_vf("0000:00:04.0", root=host.root) is None
    assert pf_netdev_of_vf("0000:00:04.0", root=host.root) is None


@pytest.mark.parametrize(
    "vf, expected",
    [
        ("0000:03:00.2", 0),
        ("0000:03:00.3", 1),
        ("0000:03:00.4", 2),
        ("0000:03:00.4".upper(), 2),
        ("0000:03:00.5", None),  # only virtfn3, and sriov_numvfs is 3
        ("0000:03:00.0", None),  # the PF itself
    ],
)
def test_vf_index(host, vf, expected):
    assert vf_index("0000:03:00.0", vf, root=host.root) == expected


def test_vf_index_without_sriov_numvfs_scans_all_links(host):
    os.unlink(f"{host.root}/{H_PF}/sriov_numvfs")
    assert vf_index("0000:03:00.0", "0000:03:00.5", root=host.root) == 3


def test_vf_index_with_unreadable_numvfs_scans_all_links(host):
    host.file(f"{H_PF}/sriov_numvfs", "garbage\n")
    assert vf_index("0000:03:00.0", "0000:03:00.5", root=host.root) == 3


def test_vf_index_double_digit(host):
    vf = f"{ROOT_PORT}/0000:03:01.6"
    host.file(f"{H_PF}/sriov_numvfs", "16\n")
    host.device(vf, "pci")
    host.vf(H_PF, vf, 12)
    assert vf_index("0000:03:00.0", "0000:03:01.6", root=host.root) == 12


def test_vf_index_missing_pf(host):
    assert vf_index("0000:99:00.0", "0000:03:00.2", root=host.root) is None


def test_vf_index_ignores_non_link_virtfn(host):
    host.dir(f"{H_BARE}/virtfn0/0000:03:00.2")
    assert vf_index("0000:00:04.0", "0000:03:00.2", root=host.root) is None


@pytest.mark.parametrize(
    "kind, dev_id, expected",
    [
        ("pci", "0000:03:00.2", True),
        ("pci", "0000:03:00.2".upper(), True),
        ("pci", "0000:99:00.0", False),
        ("auxiliary", "mlx5_core.sf.2", True),
        ("auxiliary", "mlx5_core.sf.9", False),
        ("auxiliary", "0000:03:00.2", False),  # not searched across buses
    ],
)
def test_device_exists(host, kind, dev_id, expected):
    assert device_exists(kind, dev_id, root=host.root) is expected


@pytest.mark.parametrize(
    "kind, dev_id",
    [("usb", "1-1"), ("pci", "mlx5_core.sf.2"), ("pci", "03:00.2"), ("auxiliary", "a/b"), ("auxiliary", "..")],
)
def test_device_exists_rejects(host, kind, dev_id):
    with pytest.raises(ValueError):
        device_exists(kind, dev_id, root=host.root)


@pytest.mark.parametrize(
    "ifname, expected",
    [
        ("ens2f0np0", ("pci", "0000:03:00.0")),
        ("ens2f0v0", ("pci", "0000:03:00.2")),
        ("enp3s0f0s2", ("auxiliary", "mlx5_core.sf.2")),
        ("eth0", ("pci", "0000:00:03.0")),  # virtio -> its PCI function
        ("nosuch0", None),
    ],
)
def test_device_id_of_netdev(host, ifname, expected):
    assert device_id_of_netdev(ifname, root=host.root) == expected


def test_device_id_of_virtual_and_other_bus(tree):
    assert device_id_of_netdev("veth0", root=tree.root) is None
    usb = "sys/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1:1.0"
    tree.device("sys/devices/pci0000:00/0000:00:14.0", "pci")
    tree.device(usb, "usb")
    tree.netdev(usb, "enx001122334455")
    assert device_id_of_netdev("enx001122334455", root=tree.root) is None


def test_device_id_without_subsystem_link_uses_the_name(tmp_path):
    t = Tree(tmp_path)
    t.dir(PF)
    t.netdev(PF, "ens1f0np0")
    assert device_id_of_netdev("ens1f0np0", root=str(tmp_path)) == ("pci", "0000:3b:00.0")


def test_rdma_devices_of_the_host_ids(host):
    assert rdma_devices_for_device_id("0000:03:00.2", root=host.root) == ["mlx5_2"]
    assert rdma_devices_for_device_id("mlx5_core.sf.2", root=host.root) == ["mlx5_3"]
    assert rdma_devices_for_device_id("0000:03:00.3", root=host.root) == []  # vfio VF: zero
    host.ibdev(H_SF, "mlx5_4")
    assert rdma_devices_for_device_id("mlx5_core.sf.2", root=host.root) == ["mlx5_3", "mlx5_4"]


@pytest.mark.parametrize("bad", ["", "..", "a/b", "03:00.2", "0000:03:00.8"])
def test_pci_functions_reject_bad_addresses(host, bad):
    for fn in (netdevs_of_pci, driver_of_pci, pf_of_vf, pf_netdev_of_vf):
        with pytest.raises(ValueError):
            fn(bad, root=host.root)
    with pytest.raises(ValueError):
        vf_index("0000:03:00.0", bad, root=host.root)
    with pytest.raises(ValueError):
        vf_index(bad, "0000:03:00.2", root=host.root)


def test_new_lookups_stay_in_root(host, tmp_path):
    # an absolute physfn resolves inside root, not on the host's /sys
    host.link(f"{H_BARE}/physfn", f"/{H_PF}")
    assert pf_of_vf("0000:00:04.0", root=host.root) == "0000:03:00.0"
    host.link(f"{H_BARE}/net", "../" * 8 + "etc")
    assert netdevs_of_pci("0000:00:04.0", root=host.root) == []


# ---------------------------------------------------------------------------------------------
# RoCE GID table (roce_gid_index): rxe0's ports/1 as the kernel shows it after a macvlan on its
# netdev moved into a pod as net1 with 198.18.5.2 and 2001:db8::5.
# ---------------------------------------------------------------------------------------------

from rdmanet.cni.linux.sysfs import roce_gid_index

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
MAPPED = "0000:0000:0000:0000:0000:ffff:c612:0502"  # 198.18.5.2
RXE_DIR = "sys/devices/virtual/infiniband/rxe0"


def gid_entry(t: Tree, port: int, index: int, gid: str, ndev: str | None, gid_type: str | None,
              ibdev_dir: str = RXE_DIR) -> None:
    """One slot; ndev/type None = an empty slot, whose attributes cannot be read (the kernel
    answers EINVAL; here a directory, whose read fails with EISDIR)."""
    base = f"{ibdev_dir}/ports/{port}"
    for rel in (f"gids/{index}", f"gid_attrs/ndevs/{index}", f"gid_attrs/types/{index}"):  # replace a slot
        path = os.path.join(t.root, base, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)
    t.file(f"{base}/gids/{index}", gid + "\n")
    for sub, value in (("ndevs", ndev), ("types", gid_type)):
        if value is None:
            t.dir(f"{base}/gid_attrs/{sub}/{index}")
        else:
            t.file(f"{base}/gid_attrs/{sub}/{index}", value + "\n")


@pytest.fixture
def gids(tree):
    rows = [
        ("fe80:0000:0000:0000:28bb:ebff:fe7f:6b07", "rxenet0", "IB/RoCE v1"),
        ("fe80:0000:0000:0000:28bb:ebff:fe7f:6b07", "rxenet0", "RoCE v2"),
        (MAPPED, "net1", "IB/RoCE v1"),
        (MAPPED, "net1", "RoCE v2"),
        (ZERO_GID, None, None),
        ("2001:0db8:0000:0000:0000:0000:0000:0005", "net1", "RoCE v2"),
        (MAPPED, "net2", "RoCE v2"),  # the same address on another pod's interface name
        (ZERO_GID, None, None),
    ]
    for i, (gid, ndev, gid_type) in enumerate(rows):
        gid_entry(tree, 1, i, gid, ndev, gid_type)
    return tree


@pytest.mark.parametrize("address", [
    "198.18.5.2", "198.18.5.2/24", ipaddress.ip_address("198.18.5.2"), ipaddress.ip_interface("198.18.5.2/24"),
])
def test_roce_gid_index_ipv4_prefers_roce_v2(gids, address):
    assert roce_gid_index("rxe0", address, "net1", root=gids.root) == (1, 3, "RoCE v2")


@pytest.mark.parametrize("address", ["2001:db8::5", "2001:db8::5/64", ipaddress.ip_address("2001:db8::5")])
def test_roce_gid_index_ipv6(gids, address):
    assert roce_gid_index("rxe0", address, "net1", root=gids.root) == (1, 5, "RoCE v2")


def test_roce_gid_index_v1_when_there_is_no_v2(gids):
    gid_entry(gids, 1, 3, ZERO_GID, None, None)  # the v2 entry went away
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) == (1, 2, "IB/RoCE v1")


def test_roce_gid_index_matches_the_netdev_name(gids):
    assert roce_gid_index("rxe0", "198.18.5.2", "net2", root=gids.root) == (1, 6, "RoCE v2")
    assert roce_gid_index("rxe0", "198.18.5.2", "net3", root=gids.root) is None
    assert roce_gid_index("rxe0", "fe80::28bb:ebff:fe7f:6b07", "rxenet0", root=gids.root) == (1, 1, "RoCE v2")


def test_roce_gid_index_unknown_address_or_device(gids, tmp_path):
    assert roce_gid_index("rxe0", "198.18.5.3", "net1", root=gids.root) is None
    assert roce_gid_index("rxe0", "::", "net1", root=gids.root) is None  # empty slots never match
    assert roce_gid_index("rxe1", "198.18.5.2", "net1", root=gids.root) is None
    assert roce_gid_index("mlx5_0", "198.18.5.2", "net1", root=gids.root) is None  # no ports/
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=str(tmp_path / "nothing")) is None


def test_roce_gid_index_skips_unreadable_entries(gids):
    # the GID reads but its attributes do not (a slot being replaced): skipped, the next found
    gid_entry(gids, 1, 2, MAPPED, None, None)
    gid_entry(gids, 1, 3, MAPPED, "net1", None)
    gid_entry(gids, 1, 8, MAPPED, "net1", "RoCE v2")
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) == (1, 8, "RoCE v2")
    # an unreadable GID itself
    os.unlink(os.path.join(gids.root, RXE_DIR, "ports/1/gids/8"))
    gids.dir(f"{RXE_DIR}/ports/1/gids/8")
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) is None


def test_roce_gid_index_numeric_order_and_ports(gids):
    # slot 10 sorts after 9 (not after 1); port 2's v2 loses to port 1's v2, beats port 1's v1
    gid_entry(gids, 1, 3, ZERO_GID, None, None)
    gid_entry(gids, 1, 10, MAPPED, "net1", "RoCE v2")
    gid_entry(gids, 1, 9, MAPPED, "net1", "RoCE v2")
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) == (1, 9, "RoCE v2")
    for i in (9, 10):
        gid_entry(gids, 1, i, ZERO_GID, None, None)
    gid_entry(gids, 2, 0, MAPPED, "net1", "RoCE v2")
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) == (2, 0, "RoCE v2")


def test_roce_gid_index_other_spellings(gids):
    gid_entry(gids, 1, 3, "0000:0000:0000:0000:0000:FFFF:C612:0502", "net1", "RoCE v2")
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) == (1, 3, "RoCE v2")
    gid_entry(gids, 1, 3, "::ffff:198.18.5.2", "net1", "RoCE v2")
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) == (1, 3, "RoCE v2")
    gid_entry(gids, 1, 3, "garbage", "net1", "RoCE v2")
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) == (1, 2, "IB/RoCE v1")
    gid_entry(gids, 1, 2, MAPPED, "net1", "iWARP")  # an unknown type still counts, last
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) == (1, 2, "iWARP")


def test_roce_gid_index_stays_in_root(gids, tmp_path):
    outside = tmp_path / "outside"
    outside.write_text(MAPPED + "\n")
    base = os.path.join(gids.root, RXE_DIR, "ports/1")
    for i in (2, 3):
        os.unlink(os.path.join(base, f"gids/{i}"))
        os.symlink(str(outside), os.path.join(base, f"gids/{i}"))
    assert roce_gid_index("rxe0", "198.18.5.2", "net1", root=gids.root) is None


@pytest.mark.parametrize("args", [
    ("", "198.18.5.2", "net1"), ("a/b", "198.18.5.2", "net1"), ("rxe0", "198.18.5.2", ""),
    ("rxe0", "198.18.5.2", "../x"), ("rxe0", "not-an-ip", "net1"), ("rxe0", "198.18.5.256", "net1"),
])
def test_roce_gid_index_rejects(gids, args):
    with pytest.raises(ValueError):
        roce_gid_index(*args, root=gids.root)
