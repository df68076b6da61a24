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
import os

import pytest

from cni.linux.sysfs import (
    is_pci_address,
    pci_address_of_netdev,
    rdma_devices_for_device_id,
    rdma_devices_for_netdev,
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
