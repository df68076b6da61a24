"""Property tests (hypothesis) over each plugin's config and CNI environment.

Whatever a runtime passes and a NAD says, a call answers with a result or a CNI error whose code
is the spec's or one rdmanet documents (never 999, the code of a traceback), and no file outside
the node's roots is created or changed. The configs are built from each plugin's own keys with
values drawn from good ones, near misses and junk, plus the paths a tenant would try (outside the
roots, ``..``, a symlink planted under a root pointing outside).

Kernel safety: CNI_NETNS never names an existing namespace, and no master/device names an existing
link, so no verb gets as far as changing a link; sysfs lookups read an empty fake tree.
"""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import (ADDRESS_UNAVAILABLE, CHECK_FAILED, DEVICE_BUSY, IPAM_FAILURE, LINK_FAILURE,
                             POOL_EXHAUSTED, RDMA_MISMATCH)
from rdmanet.plugins.host_device_rdma.plugin import HostDeviceRdma
from rdmanet.plugins.ipoib_rdma.plugin import IpoibRdma
from rdmanet.cni.linux import roots
from rdmanet.plugins.macvlan_rdma.plugin import MacvlanRdma
from policy_file import write_policy
from rdmanet.ipam.plugin import LeaseIPAM

SPEC_CODES = set(range(1, 12)) | {50, 51}
RDMANET_CODES = {LINK_FAILURE, RDMA_MISMATCH, POOL_EXHAUSTED, ADDRESS_UNAVAILABLE, IPAM_FAILURE, CHECK_FAILED, DEVICE_BUSY}
HOST_LINKS = {name for _, name in socket.if_nameindex()}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """root/ (every root of the policy), outside/ (must never change), a symlink planted under root."""
    base = tmp_path_factory.mktemp("fuzz")
    root, outside, empty_sys = base / "root", base / "outside", base / "sys"
    for d in (root, outside, empty_sys, root / "planted-dir"):
        d.mkdir()
    (outside / "victim").write_text("precious")
    os.chmod(outside / "victim", 0o600)
    (root / "planted-link").symlink_to(outside / "victim")
    (root / "planted-dir" / "sub").symlink_to(outside)
    policy = write_policy(base / "policy.json", logRoots=[str(root)], dataRoots=[str(root)], kubeconfigs=[f"{root}/*"],
                          configRoots=[str(root)], deviceInfoDir=str(root), hostDeviceStateDir=str(root / "hd"))
    return {"root": root, "outside": outside, "policy": str(policy), "sys": str(empty_sys)}


def snapshot(directory) -> dict:
    out = {}
    for dirpath, dirs, files in os.walk(directory):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            s = os.lstat(p)
            out[p] = (stat.S_IMODE(s.st_mode), s.st_size, s.st_mtime_ns)
    return out


# --------------------------------------------------------------------------- strategies

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=False), st.text(max_size=20))
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=12)


def paths(tree):
    root, outside = str(tree["root"]), str(tree["outside"])
    return st.one_of(
        st.sampled_from([f"{root}/x.log", f"{root}/store", f"{root}/a/b/c", f"{root}/planted-link",
                         f"{root}/planted-dir/sub/victim", f"{root}/planted-dir/sub/new", f"{root}/../outside/victim",
                         f"{outside}/victim", f"{outside}/new", "/tmp/whereabouts.log", "relative/path", "", root,
                         f"{root}/hd", "/proc/1/root/" + outside.lstrip("/") + "/new"]),
        junk)


def link_names():
    return st.one_of(st.sampled_from(["rdt-fz0", "ens1f0", ""]),
                     st.text(max_size=16).filter(lambda n: n not in HOST_LINKS)).filter(lambda n: n not in HOST_LINKS)


def mostly(good, bad=None):
    """``good`` about four times in five, else ``bad`` (junk): most examples get past parsing."""
    return st.one_of(good, good, good, good, bad if bad is not None else junk)


cidrs = mostly(st.sampled_from(["10.1.0.0/24", "10.1.0.0/30", "fd00::/64", "10.1.0.10-10.1.0.20/24", "10.1.0.0/33",
                                 "::/0", "0.0.0.0/0", "10.1.0.5", "x"]))
ips = mostly(st.sampled_from(["10.1.0.1", "10.1.0.7", "fd00::1", "10.2.0.1", "300.1.1.1"]))


def ipam_blocks(tree):
    return st.fixed_dictionaries({"type": mostly(st.just("lease-ipam")), "range": cidrs}, optional={
        "range_start": ips, "range_end": ips, "gateway": ips,
        "exclude": mostly(st.lists(cidrs, max_size=4)),
        "ipRanges": mostly(st.lists(st.fixed_dictionaries({"range": cidrs}, optional={"exclude": junk}), max_size=3)),
        "ranges": mostly(st.lists(st.lists(st.fixed_dictionaries({"subnet": cidrs}), max_size=2), max_size=2)),
        "routes": mostly(st.lists(st.fixed_dictionaries({"dst": cidrs}, optional={"gw": ips}), max_size=3)),
        "dns": junk, "network_name": mostly(st.sampled_from(["fz", "a/b", ".."])),
        "log_file": paths(tree), "log_level": mostly(st.sampled_from(["debug", "error"])),
        "dataDir": paths(tree),
        "kubernetes": mostly(st.fixed_dictionaries({}, optional={"kubeconfig": paths(tree), "namespace": junk})),
        "configuration_path": paths(tree),
    })


def base_config(tree, plugin_type, extra):
    return st.fixed_dictionaries({
        "cniVersion": mostly(st.sampled_from(["0.3.1", "0.4.0", "1.0.0", "1.1.0"])),
        "name": mostly(st.just("fznet"), st.text(max_size=10)),
        "type": st.just(plugin_type),
    }, optional={
        "ipam": mostly(ipam_blocks(tree)),
        "runtimeConfig": mostly(st.fixed_dictionaries({}, optional={
            "CNIDeviceInfoFile": paths(tree), "mac": mostly(st.just("0a:58:0a:01:01:05")),
            "ips": junk, "deviceID": mostly(st.just("0000:3b:00.2"))})),
        "dns": junk, "prevResult": junk, "args": junk,
        "cni.dev/valid-attachments": junk,
        **extra,
    })


def macvlan_configs(tree):
    return base_config(tree, "macvlan-rdma", {
        "master": link_names(), "mode": mostly(st.sampled_from(["bridge", "vepa", "passthru"])),
        "mtu": junk, "mac": junk, "rdma": mostly(st.sampled_from(["auto", "required", "off"])),
        "linkInContainer": junk})


def host_device_configs(tree):
    return base_config(tree, "host-device-rdma", {
        "device": link_names(), "hwaddr": junk, "kernelpath": paths(tree),
        "pciBusID": mostly(st.just("0000:3b:00.2")), "deviceID": mostly(st.just("0000:3b:00.2")),
        "stateDir": paths(tree), "vlan": junk, "spoofchk": junk, "rdma": junk, "mtu": junk})


def ipoib_configs(tree):
    return base_config(tree, "ipoib-rdma", {
        "master": link_names(), "pkey": mostly(st.sampled_from(["0x8001", "0x7fff", 32769, "0x0000", "x"])),
        "mode": mostly(st.sampled_from(["datagram", "connected"])), "mtu": junk,
        "rdma": mostly(st.sampled_from(["auto", "required", "off"]))})


def lease_configs(tree):
    return base_config(tree, "lease-ipam", {})


def envs(tree):
    """A runtime's environment: valid ones with any verb (most examples), or one with junk."""
    valid = st.fixed_dictionaries({
        "CNI_COMMAND": st.sampled_from(["ADD", "ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"]),
        "CNI_CONTAINERID": st.sampled_from(["fz-c1", "fz-c2"]),
        "CNI_NETNS": st.sampled_from(["/var/run/netns/rdt-fuzz-none", "/nonexistent/netns"]),
        "CNI_IFNAME": st.sampled_from(["net1", "net2"]),
        "CNI_PATH": st.sampled_from(["/nonexistent/bin", ""]),
    }, optional={"CNI_ARGS": st.sampled_from(["IgnoreUnknown=1;K8S_POD_NAME=p", "IP=10.1.0.7", "MAC=0a:58:0a:01:01:09",
                                              "IP=10.1.0.7,fd00::7", "MAC=zz"])})
    bad = st.fixed_dictionaries({
        "CNI_COMMAND": mostly(st.sampled_from(["ADD", "DEL", "CHECK", "GC", "STATUS", "VERSION"]), st.text(max_size=6)),
        "CNI_CONTAINERID": mostly(st.just("fz-c1"), st.text(max_size=12)),
        "CNI_NETNS": st.sampled_from(["/var/run/netns/rdt-fuzz-none", "", str(tree["outside"])]),
        "CNI_IFNAME": mostly(st.just("net1"), st.text(max_size=17)),
        "CNI_PATH": st.sampled_from(["/nonexistent/bin", ""]),
    }, optional={"CNI_ARGS": st.text(max_size=30)}).map(lambda e: {k: v for k, v in e.items() if "\0" not in v})
    return st.one_of(valid, valid, valid, bad)


def run_one(plugin, tree, env, config):
    env = {**env, roots.POLICY_ENV: tree["policy"], "RDMANET_SYSFS_ROOT": tree["sys"]}
    before = snapshot(tree["outside"])
    stdin = json.dumps(config).encode() if not isinstance(config, bytes) else config
    code, out = skel.handle(plugin, env, stdin)
    if code == 0:
        assert out is None or isinstance(out, dict)
    else:
        assert out["code"] != 999, out
        assert out["code"] in SPEC_CODES | RDMANET_CODES, out
        assert isinstance(out["msg"], str) and out["msg"]
    json.loads(skel.render(out) or "null")  # what would be printed is one JSON document
    assert snapshot(tree["outside"]) == before, "a file outside the roots changed"
    assert (tree["outside"] / "victim").read_text() == "precious"


@FUZZ
@given(data=st.data())
def test_fuzz_macvlan_rdma(tree, data):
    run_one(MacvlanRdma(), tree, data.draw(envs(tree)), data.draw(macvlan_configs(tree)))


@FUZZ
@given(data=st.data())
def test_fuzz_host_device_rdma(tree, data):
    run_one(HostDeviceRdma(), tree, data.draw(envs(tree)), data.draw(host_device_configs(tree)))


@FUZZ
@given(data=st.data())
def test_fuzz_ipoib_rdma(tree, data):
    run_one(IpoibRdma(), tree, data.draw(envs(tree)), data.draw(ipoib_configs(tree)))


@FUZZ
@given(data=st.data())
def test_fuzz_lease_ipam(tree, data):
    run_one(LeaseIPAM(), tree, data.draw(envs(tree)), data.draw(lease_configs(tree)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)),
       plugin=st.sampled_from([MacvlanRdma, HostDeviceRdma, IpoibRdma, LeaseIPAM]),
       command=st.sampled_from(["ADD", "DEL", "CHECK", "GC", "STATUS"]))
def test_fuzz_raw_stdin(tree, raw, plugin, command):
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "fz", "CNI_NETNS": "/nonexistent/netns", "CNI_IFNAME": "net1",
           "CNI_PATH": "/nonexistent"}
    run_one(plugin(), tree, env, raw)
