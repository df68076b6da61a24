"""Our interface plugins are never an IPAM (rdmanet.cni.core.nesting), and a NAD's keys are checked,
not guessed (rdmanet.cni.core.netconf.unknown_keys)."""

from __future__ import annotations

import json
import logging

import pytest

from rdmanet.cni.core import nesting, skel
from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.core.invocation import parse_invocation
from rdmanet.cni.core.ipam_exec import IPAM
from rdmanet.cni.core.netconf import load
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.plugins.host_device_rdma.plugin import HostDeviceRdma
from rdmanet.plugins.ipoib_rdma.plugin import IpoibRdma
from rdmanet.plugins.macvlan_rdma.config import MacvlanConf
from rdmanet.plugins.macvlan_rdma.plugin import MacvlanRdma

ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
       "CNI_PATH": "/nonexistent"}


def conf(**extra) -> dict:
    return {"cniVersion": "1.0.0", "name": "n", "type": "macvlan-rdma", "master": "ens1f0", **extra}


@pytest.mark.parametrize("plugin", [MacvlanRdma(), HostDeviceRdma(), IpoibRdma()])
@pytest.mark.parametrize("command", ["ADD", "DEL", "CHECK"])
def test_an_interface_plugin_called_as_an_ipam_answers_7_at_once(plugin, command):
    caller = "macvlan-rdma n/c1/net1"
    code, out = skel.handle(plugin, {**ENV, "CNI_COMMAND": command, nesting.CALLER_ENV: caller}, json.dumps(conf()).encode())
    assert code == 1 and out["code"] == 7
    assert out["msg"] == f"{plugin.interface_plugin} was run as the IPAM plugin of {caller}: an interface plugin is never an IPAM"


def test_lease_ipam_is_an_ipam_wherever_it_is_called_from():
    code, out = skel.handle(LeaseIPAM(), {**ENV, "CNI_COMMAND": "VERSION", nesting.CALLER_ENV: "macvlan-rdma n/c1/net1"}, b"")
    assert code == 0 and "supportedVersions" in out
    assert getattr(LeaseIPAM(), "interface_plugin", None) is None


@pytest.mark.parametrize("ipam_type", sorted(nesting.INTERFACE_PLUGINS))
def test_ipam_type_naming_an_interface_plugin(ipam_type, caplog):
    """Refused on ADD/CHECK/STATUS before anything runs; skipped on DEL/GC (its ADD was refused,
    nothing was allocated), so a DEL succeeds and is never journaled for replay."""
    inv = parse_invocation(ENV, json.dumps(conf(ipam={"type": ipam_type})).encode())
    ipam = IPAM(ipam_type, inv)
    for verb in (ipam.add, ipam.check, ipam.status):
        with pytest.raises(CNIError) as err:
            verb()
        assert err.value.code == 7
        assert err.value.msg == f"invalid network config: ipam.type: {ipam_type} is an interface plugin, not an IPAM plugin"
    with caplog.at_level(logging.WARNING, logger="rdmanet.node"):
        ipam.delete()
        ipam.gc()
    assert [r.getMessage().split(":")[1].strip() for r in caplog.records] == ["DEL skipped (its ADD was refused, nothing was allocated)",
                                                                            "GC skipped (its ADD was refused, nothing was allocated)"]


def test_an_unknown_key_is_logged_with_the_closest_known_one(caplog):
    with caplog.at_level(logging.WARNING, logger="rdmanet.node"):
        load(MacvlanConf, {**conf(), "mastr": "ens1f0", "deviceID": "0000:3b:00.2", "cni.dev/attachments": [],
                           "capabilities": {"mac": True}, "bcqueuelen": 100})
    assert [r.getMessage() for r in caplog.records] == [
        "network 'n' (macvlan-rdma): unknown key 'mastr' is ignored; did you mean 'master'?",
        "network 'n' (macvlan-rdma): unknown key 'bcqueuelen' is ignored"]
