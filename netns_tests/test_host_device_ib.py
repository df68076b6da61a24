"""host-device-rdma on InfiniBand VFs, against the real kernel, driven by cnitool (libcni) the way
Multus drives it.

A fake sysfs tree modelled on a ConnectX-6 node (``ib_trees.py``) makes VF ``0000:3b:00.2`` an IB
VF of PF ``0000:3b:00.0``: the PF's IPoIB netdev is one veth (``/sys/class/net/<pf>/type`` 32 in
the tree), the VF's netdev another. Multus hands over the VF as the ``deviceID`` capability and the
pod's ``infiniband-guid`` as the ``infinibandGUID`` capability: libcni puts both into
``runtimeConfig`` because the plugin config declares them, exactly as for a NAD.

What the real kernel answers: the GUID requests go to the PF (a veth here), which has no
``ndo_set_vf_guid``: EOPNOTSUPP, as for any device that cannot take a VF GUID. The plugin must
name the GUID and where it came from, and leave nothing behind (VF netdev, PF, state file,
allocation record, address, and no driver rebind attempted). A VF whose GUID is already set
needs no request: that ADD runs to the end on the real kernel and DEL restores the VF netdev.
The bytes of the requests an mlx5 PF would accept are checked in tests/test_ib_vf.py.
"""

from __future__ import annotations

import json
import pathlib

import pytest

try:
    from netns_tests import cnitool_client as cc
    from netns_tests import ib_trees
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import cnitool_client as cc  # type: ignore[no-redef]
    import ib_trees  # type: ignore[no-redef]
    import nstools as nt  # type: ignore[no-redef]

from rdmanet.cni.core.infiniband import derive_guid, guid_text

PLUGIN = "host-device-rdma"
PF_PCI, VF_PCI = "0000:3b:00.0", "0000:3b:00.2"
GUID = "02:00:00:00:00:00:00:01"
CAPS = {"deviceID": True, "infinibandGUID": True}


def state_dir(cni) -> pathlib.Path:
    return cni.root / "hd-state"


def hd(cni, ipam=None, **extra) -> dict:
    conf: dict = {"type": PLUGIN, "stateDir": str(state_dir(cni)), "capabilities": CAPS}
    if ipam is not None:
        conf["ipam"] = ipam
    conf.update(extra)
    return conf


def ib_vf_tree(cni, pf_netdev: str, vf_netdev: str, *, node_guid: str = "0000:0000:0000:0000") -> dict:
    root = ib_trees.ib_vf(cni.root / "sysfs", VF_PCI, pf_pci=PF_PCI, vf_index=0, netdev=vf_netdev, ibdev="mlx5_4",
                          node_guid=node_guid, pf_netdev=pf_netdev)
    return {"RDMANET_SYSFS_ROOT": str(root)}


tool_err = nt.tool_err


def nothing_left(cni, ns, vf: str, vf_before: dict, pf: str, pf_before: dict) -> None:
    assert nt.wait_link_equal(None, vf, vf_before) == vf_before, "the VF netdev changed"
    assert nt.wait_link_equal(None, pf, pf_before) == pf_before, "the PF changed"
    assert [e["ifname"] for e in nt.links(ns.name) if e["ifname"] != "lo"] == []
    assert list(state_dir(cni).glob("*.json")) == [], "a state file is left"
    devices = state_dir(cni) / "devices"
    assert not devices.exists() or list(devices.iterdir()) == [], "an allocation record is left"
    assert nt.owners(cni.host_local_dir) == {}
    drivers = cni.root / "sysfs" / "sys" / "bus" / "pci" / "drivers" / "mlx5_core"
    assert not (drivers / "unbind").exists() and not (drivers / "bind").exists(), "a rebind was attempted"


@pytest.fixture
def ports(master):
    """(PF veth, VF veth) with their settled snapshots."""
    pf, vf = master(), master()
    return pf.name, nt.settled_link(None, pf.name), vf.name, nt.settled_link(None, vf.name)


@pytest.mark.parametrize("version", nt.CNITOOL_VERSIONS)
def test_guid_from_multus_reaches_the_pf_and_its_refusal_is_named(cni, netns, ports, version):
    ns = netns()
    pf, pf_before, vf, vf_before = ports
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, version, hd(cni, nt.host_local(cni.host_local_dir, "198.19.80.0/24"))))
    proc = cni.tool("add", net, ns, extra_env=ib_vf_tree(cni, pf, vf),
                    cap_args={"deviceID": VF_PCI, "infinibandGUID": GUID})
    err = tool_err(proc)
    assert err["code"] == 100
    assert err["msg"] == f"set node GUID {GUID} (from runtimeConfig.infinibandGUID) on VF 0 of {pf}: Operation not supported"
    assert "only the IPoIB netdev of an InfiniBand PF" in err["details"] and "(errno 95)" in err["details"]
    nothing_left(cni, ns, vf, vf_before, pf, pf_before)


@pytest.mark.parametrize("how", ["runtime-over-config", "config", "derived"])
def test_where_the_guid_comes_from(cni, netns, ports, how):
    """runtimeConfig.infinibandGUID wins over the config's guid; without either, a VF whose GUID is
    all-zero gets one derived from the attachment (stable: the same for a repeated ADD)."""
    ns = netns()
    pf, pf_before, vf, vf_before = ports
    net = f"{ns.name}-net"
    conf_guid = "02:00:00:00:00:00:00:22"
    extra = {"guid": conf_guid} if how != "derived" else {}
    cni.write(nt.conflist(net, "1.0.0", hd(cni, **extra)))
    cap = {"deviceID": VF_PCI, **({"infinibandGUID": GUID} if how == "runtime-over-config" else {})}
    expected = {"runtime-over-config": f"{GUID} (from runtimeConfig.infinibandGUID)",
                "config": f"{conf_guid} (from guid)",
                "derived": f"{guid_text(derive_guid(f'{net}/{cc.container_id(ns.path)}/net1'))} (derived from the attachment)"}[how]
    for _ in range(2):  # a repeated ADD asks for the same GUID
        err = tool_err(cni.tool("add", net, ns, extra_env=ib_vf_tree(cni, pf, vf) if _ == 0 else {
            "RDMANET_SYSFS_ROOT": str(cni.root / "sysfs")}, cap_args=cap))
        assert err["code"] == 100 and err["msg"].startswith(f"set node GUID {expected} on VF 0 of {pf}: "), err
    nothing_left(cni, ns, vf, vf_before, pf, pf_before)


@pytest.mark.parametrize("where, value, field", [
    ("runtime", "00:00:00:00:00:00:00:00", "runtimeConfig.infinibandGUID"),
    ("runtime", "ff:ff:ff:ff:ff:ff:ff:ff", "runtimeConfig.infinibandGUID"),
    ("runtime", "02:00:00:00:00:01", "runtimeConfig.infinibandGUID"),  # Multus lets 6 octets through
    ("config", "11:22:33", "guid"),
    ("config", "00:00:00:00:00:00:00:00", "guid"),
])
def test_bad_guids_are_refused_before_anything_changes(cni, netns, ports, where, value, field):
    ns = netns()
    pf, pf_before, vf, vf_before = ports
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, **({"guid": value} if where == "config" else {}))))
    cap = {"deviceID": VF_PCI, **({"infinibandGUID": value} if where == "runtime" else {})}
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_vf_tree(cni, pf, vf), cap_args=cap))
    assert err["code"] == 7
    assert err["msg"].startswith(f"invalid network config: {field}: "), err
    assert "02:00:00:00:00:00:00:01" in err["details"]
    nothing_left(cni, ns, vf, vf_before, pf, pf_before)


def test_guid_on_a_vf_that_is_not_infiniband(cni, netns, master):
    ns, vf = netns(), master()
    vf_before = nt.settled_link(None, vf.name)
    root = nt.fake_pci_function(cni.root / "sysfs", VF_PCI, netdev=vf.name, pf=PF_PCI, vf_index=0)
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, pkey="0x8001")))
    err = tool_err(cni.tool("add", net, ns, extra_env={"RDMANET_SYSFS_ROOT": str(root)},
                            cap_args={"deviceID": VF_PCI, "infinibandGUID": GUID}))
    assert err["code"] == 7
    assert err["msg"] == f"pkey and runtimeConfig.infinibandGUID given but VF 0 ({VF_PCI}) of {PF_PCI} is not an InfiniBand VF"
    assert nt.wait_link_equal(None, vf.name, vf_before) == vf_before


def test_bad_pkey(cni, netns, ports):
    ns = netns()
    pf, _, vf, _ = ports
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, pkey="0x8000")))
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_vf_tree(cni, pf, vf), cap_args={"deviceID": VF_PCI}))
    assert err["code"] == 7 and err["msg"].startswith("invalid network config: pkey: ")


def test_vf_with_a_guid_keeps_it_and_moves(cni, netns, ports):
    """The VF already has a GUID (node_guid in sysfs, port GUID in its IPoIB address) and none is
    asked for: no GUID request, no rebind; the VF netdev goes into the pod and DEL brings it back.
    The state file records the GUID in use and where it came from."""
    ns = netns()
    pf, pf_before, vf, vf_before = ports
    net = f"{ns.name}-net"
    env = ib_vf_tree(cni, pf, vf, node_guid="0200:0000:0000:00aa")
    address = cni.root / "sysfs" / "sys" / "devices" / "pci0000:3b" / VF_PCI / "net" / vf / "address"
    address.write_text("00:00:0b:a8:fe:80:00:00:00:00:00:00:02:00:00:00:00:00:00:aa\n")
    cni.write(nt.conflist(net, "1.0.0", hd(cni, nt.host_local(cni.host_local_dir, "198.19.81.0/24"), pkey="0x8001")))
    result = nt.add_ok(cni, net, ns, extra_env=env, cap_args={"deviceID": VF_PCI})
    assert result["interfaces"][0]["name"] == "net1"
    [state] = [json.loads(p.read_text()) for p in state_dir(cni).glob("*.json")]
    assert state["original"]["mac"] == ""  # an IPoIB address follows the GUID: DEL never sets it
    assert state["ib"] == {"pf": pf, "vf": 0, "guid": "02:00:00:00:00:00:00:aa", "source": "the VF's own", "set": False,
                           "previous": {"node": "02:00:00:00:00:00:00:aa", "port": "02:00:00:00:00:00:00:aa"}}
    nt.ok(cni.tool("check", net, ns, extra_env=env, cap_args={"deviceID": VF_PCI}))
    nt.ok(cni.tool("del", net, ns, extra_env=env, cap_args={"deviceID": VF_PCI}))
    assert nt.wait_link_equal(None, vf, vf_before) == vf_before
    assert list(state_dir(cni).glob("*.json")) == []
    assert nt.owners(cni.host_local_dir) == {}


def test_a_mac_for_an_ib_vf_is_refused(cni, netns, ports):
    ns = netns()
    pf, pf_before, vf, vf_before = ports
    net = f"{ns.name}-net"
    cni.write(nt.conflist(net, "1.0.0", hd(cni, mac="02:00:00:00:00:42")))
    err = tool_err(cni.tool("add", net, ns, extra_env=ib_vf_tree(cni, pf, vf), cap_args={"deviceID": VF_PCI}))
    assert err["code"] == 7
    assert err["msg"] == (f"a MAC address (02:00:00:00:00:42) does not apply to VF 0 ({VF_PCI}) of {pf}, an InfiniBand VF: "
                          "its IPoIB address follows the port GUID")
    nothing_left(cni, ns, vf, vf_before, pf, pf_before)


@pytest.mark.parametrize("taken, guid, user", [
    ("node", "b8:59:9f:03:00:d4:6e:2a", "the node GUID of RDMA device mlx5_0"),
    ("port", "b8:59:9f:03:00:d4:6e:2b", "the port GUID of mlx5_0 port 1"),
])
def test_a_guid_another_port_of_the_node_has_is_refused(cni, netns, ports, taken, guid, user):
    """The pod asks for a GUID the node's IB PF already has (its node GUID, or its port's: the
    interface ID of GID 0): given to the VF it would take that port's partition membership. CNI
    error 7 names the key, the GUID and who has it, before any GUID request; nothing changes."""
    ns = netns()
    pf, pf_before, vf, vf_before = ports
    net = f"{ns.name}-net"
    env = ib_vf_tree(cni, pf, vf)
    gid0 = cni.root / "sysfs" / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "gids" / "0"
    gid0.parent.mkdir(parents=True, exist_ok=True)
    gid0.write_text("fe80:0000:0000:0000:b859:9f03:00d4:6e2b\n")
    cni.write(nt.conflist(net, "1.0.0", hd(cni)))
    err = tool_err(cni.tool("add", net, ns, extra_env=env, cap_args={"deviceID": VF_PCI, "infinibandGUID": guid}))
    assert err["code"] == 7, err
    assert err["msg"] == (f"invalid network config: runtimeConfig.infinibandGUID: GUID {guid} is already {user} on this "
                          f"node; given to VF 0 ({VF_PCI}) of {pf} it would take that port's partition membership"), err
    nothing_left(cni, ns, vf, vf_before, pf, pf_before)
