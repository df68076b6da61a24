"""Bad input to macvlan-rdma (and lease-ipam behind it) against the real kernel.

Each case runs the copied ``macvlan-rdma`` from the test's CNI bin dir by raw exec (bare
environment, config on stdin), and again through cnitool where a runtime can express the input
(libcni validates CNI_IFNAME, the container ID and the network name itself, and refuses CHECK
below 0.4.0, so those reach the plugin only by raw exec). For every case:

- the exit status is non-zero and stdout is a single CNI error JSON document;
- its msg or details names the offending field and says how to fix it;
- there is no Python traceback on stdout or stderr;
- nothing is left behind: no new link in the pod netns or the host, no IPAM reservation, no
  state file naming the container.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

try:
    from netns_tests import cnitool_client as cc
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import cnitool_client as cc  # type: ignore[no-redef]
    import nstools as nt  # type: ignore[no-redef]

_LEASE_MISSING = nt.lease_ipam_missing()
requires_lease_ipam = pytest.mark.skipif(_LEASE_MISSING is not None, reason=str(_LEASE_MISSING))

CID = f"{nt.PREFIX}-bad-input"  # unique per test process


@dataclass
class Pod:
    """One test's pod netns, master and CNI environment, with a before-snapshot."""

    cni: Any
    ns: Any
    master: Any
    prefix: str
    host_links: set = field(default_factory=set)
    pod_links: set = field(default_factory=set)
    owners: dict = field(default_factory=dict)

    def snapshot(self) -> None:
        self.host_links = nt.link_names()
        self.pod_links = nt.link_names(self.ns.name)
        self.owners = {**nt.owners(self.cni.host_local_dir), **nt.owners(self.cni.data_dir)}

    def host_local(self, **extra) -> dict:
        return nt.host_local(self.cni.host_local_dir, f"{self.prefix}.0/24", **extra)

    def lease(self, **extra) -> dict:
        extra.setdefault("range", f"{self.prefix}.0/24")
        return {"type": "lease-ipam", "dataDir": str(self.cni.data_dir), **extra}

    def plugin(self, ipam: Optional[dict] = None, **extra) -> dict:
        conf = nt.macvlan(self.master.name, ipam if ipam is not None else self.host_local())
        conf.update(extra)
        return conf

    @property
    def net(self) -> str:
        return f"{self.ns.name}-net"

    def assert_nothing_left(self, container_id: str = CID) -> None:
        assert nt.link_names() == self.host_links, "a host link appeared or vanished"
        assert nt.link_names(self.ns.name) == self.pod_links, "a pod link appeared or vanished"
        now = {**nt.owners(self.cni.host_local_dir), **nt.owners(self.cni.data_dir)}
        assert now == self.owners, f"IPAM reservations changed: {self.owners} -> {now}"
        leftovers = nt.files_mentioning(self.cni.state_roots, container_id)
        assert leftovers == [], f"state files left: {leftovers}"


@pytest.fixture
def pod(cni, netns, master) -> Pod:
    p = Pod(cni, netns(), master(), nt.random_subnet()[0])
    p.snapshot()
    return p


def _text(err: dict) -> str:
    return f"{err.get('msg', '')} || {err.get('details', '')}"


def assert_error(err: dict, code: int, words: tuple[str, ...]) -> None:
    assert err["code"] == code, err
    assert err.get("details"), f"no fix in details: {err}"
    text = _text(err).lower()
    for word in words:
        assert word.lower() in text, f"{word!r} not named in {err}"


def raw_case(pod: Pod, stdin, code: int, words: tuple[str, ...], *, command: str = "ADD",
             container_id: str = CID, **kw) -> dict:
    proc = pod.cni.exec(command, stdin, ns=kw.pop("ns", pod.ns), container_id=container_id, **kw)
    nt.no_traceback(proc)
    err = nt.cni_error(proc)
    assert_error(err, code, words)
    pod.assert_nothing_left(container_id)
    return err


def cnitool_case(pod: Pod, plugin: dict, code: int, words: tuple[str, ...], *, version: str = "1.0.0",
                 ifname: str = "net1", **kw) -> dict:
    pod.cni.write(nt.conflist(pod.net, version, plugin))
    proc = pod.cni.tool("add", pod.net, pod.ns, ifname=ifname, **kw)
    assert proc.returncode != 0
    nt.no_traceback(proc)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"stdout is not one CNI error: {proc.stdout!r}"
    err = cc.error_of(proc)
    assert err is not None, proc.stdout
    assert_error(err, code, words)
    pod.assert_nothing_left(cc.container_id(pod.ns.path))
    return err


# --------------------------------------------------------------------------- stdin


def test_invalid_json(pod):
    err = raw_case(pod, '{"cniVersion": "1.0.0", "name": "x", "type": "macvlan-rdma", ', 6, ("JSON",))
    assert "stdin" in _text(err)


def test_config_not_an_object(pod):
    raw_case(pod, '["cniVersion", "1.0.0"]', 6, ("JSON object",))


def test_invalid_name(pod):
    stdin = {"cniVersion": "1.0.0", "name": "bad name!", **pod.plugin()}
    raw_case(pod, stdin, 7, ("network name", "bad name!", "^[a-zA-Z0-9]"))


def test_missing_name(pod):
    stdin = {"cniVersion": "1.0.0", **pod.plugin()}
    raw_case(pod, stdin, 7, ('"name"',))


# (field, bad value or None to drop the field, words the error must contain).
WRONG_TYPES = {
    "mtu-string": ("mtu", "1500", ("mtu", "master's MTU")),
    "mode-int": ("mode", 5, ("mode", "bridge")),
    "master-int": ("master", 7, ("master", "existing")),
    "linkInContainer-string": ("linkInContainer", "yes", ("linkInContainer", "true")),
    "mac-bad": ("mac", "zz:zz", ("mac", "0a:58:0a:01:01:05")),
    "rdma-unknown": ("rdma", "maybe", ("rdma", '"auto"')),
    "ipam-not-object": ("ipam", "host-local", ("ipam", '"type"')),
    "ipam-without-type": ("ipam", {"subnet": "198.18.0.0/24"}, ("ipam.type", "required", "lease-ipam")),
    "mtu-negative": ("mtu", -1, ("mtu", "master's MTU")),
    "master-too-long": ("master", "rdt-0123456789abcdef", ("master", "existing")),
    "type-missing": ("type", None, ("type", "required")),
    "dns-not-object": ("dns", "8.8.8.8", ("dns", "nameservers")),
    "runtimeConfig-mac-int": ("runtimeConfig", {"mac": 5}, ("runtimeConfig.mac", "0a:58:0a:01:01:05")),
}


# libcni decodes "ipam", "dns" and runtimeConfig into structs itself and needs "type" to find
# the plugin, so those reach the plugin only by raw exec.
RAW_ONLY = {"ipam-not-object", "type-missing", "runtimeConfig-mac-int", "dns-not-object"}


@pytest.mark.parametrize(
    "case, via",
    [(case, via) for case in WRONG_TYPES for via in ("raw", "cnitool") if not (via == "cnitool" and case in RAW_ONLY)],
)
def test_wrong_typed_field(pod, case, via):
    key, value, words = WRONG_TYPES[case]
    plugin = pod.plugin(**{key: value})
    if value is None:
        del plugin[key]
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "1.0.0", plugin), 7, words)
    else:
        cnitool_case(pod, plugin, 7, words)


@pytest.mark.parametrize("via", ["raw", "cnitool"])
def test_unknown_mode(pod, via):
    plugin = pod.plugin(mode="weird")
    words = ("mode", "bridge, private, vepa, passthru")
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "1.0.0", plugin), 7, words)
    else:
        cnitool_case(pod, plugin, 7, words)


@pytest.mark.parametrize("via", ["raw", "cnitool"])
def test_master_does_not_exist(pod, via):
    gone = f"{pod.master.name[:-1]}z"
    plugin = pod.plugin(master=gone)
    words = ("master", gone, "existing interface")
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "1.0.0", plugin), 7, words)
    else:
        cnitool_case(pod, plugin, 7, words)


def test_no_master_and_no_default_route(pod):
    """linkInContainer in a pod netns without a default route: nothing to take master from."""
    plugin = pod.plugin(linkInContainer=True)
    del plugin["master"]
    raw_case(pod, nt.single(pod.net, "1.0.0", plugin), 7, ("master", "default route"))


@pytest.mark.parametrize("via", ["raw", "cnitool"])
def test_mtu_above_master(pod, via):
    plugin = pod.plugin(mtu=9000)
    words = ("mtu", "9000", "between 0 and 1500")
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "1.0.0", plugin), 7, words)
    else:
        cnitool_case(pod, plugin, 7, words)


@pytest.mark.parametrize("via", ["raw", "cnitool"])
def test_bad_mac_in_cni_args(pod, via):
    plugin = pod.plugin()
    args = "IgnoreUnknown=true;K8S_POD_NAME=x;MAC=zz"
    words = ("CNI_ARGS MAC", "0a:58:0a:01:01:05")
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "1.0.0", plugin), 7, words, cni_args=args)
    else:
        cnitool_case(pod, plugin, 7, words, cni_args=args)


# --------------------------------------------------------------------------- environment


@pytest.mark.parametrize("ifname", ["net123456789012x", "net/1", "net 1", ""])
def test_bad_ifname(pod, ifname):
    words = ("CNI_IFNAME",) + (("1-15 characters",) if ifname else ())
    raw_case(pod, nt.single(pod.net, "1.0.0", pod.plugin()), 4, words, ifname=ifname)


@pytest.mark.parametrize("via", ["raw", "cnitool"])
def test_ifname_already_in_netns(pod, via):
    pod.ns.ip("link", "add", "net1", "type", "veth", "peer", "name", "net1peer")
    pod.snapshot()
    before = nt.link(pod.ns.name, "net1")
    words = ("CNI_IFNAME", "net1", "already exists", "another interface name")
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "1.0.0", pod.plugin()), 4, words)
    else:
        cnitool_case(pod, pod.plugin(), 4, words)
    after = nt.link(pod.ns.name, "net1")
    assert (after["ifindex"], after["linkinfo"]["info_kind"]) == (before["ifindex"], "veth")


@pytest.mark.parametrize("container_id", ["bad/id", "-leading-dash", "semi;colon", "sp ace"])
def test_bad_container_id(pod, container_id):
    raw_case(pod, nt.single(pod.net, "1.0.0", pod.plugin()), 4, ("CNI_CONTAINERID", "^[a-zA-Z0-9]"),
             container_id=container_id)


def test_missing_netns_env(pod):
    raw_case(pod, nt.single(pod.net, "1.0.0", pod.plugin()), 4, ("CNI_NETNS",), ns=None)


def test_netns_path_is_not_a_netns(pod):
    not_ns = pod.cni.root / "not-a-netns"
    not_ns.write_text("")
    raw_case(pod, nt.single(pod.net, "1.0.0", pod.plugin()), 4, ("CNI_NETNS", str(not_ns), "network namespace"),
             ns=str(not_ns))


def test_netns_is_the_plugins_own(pod):
    """CNI_NETNS naming the host's (the plugin's own) netns: refused before anything is made,
    so no macvlan can appear on the host."""
    own = f"/proc/{__import__('os').getpid()}/ns/net"
    raw_case(pod, nt.single(pod.net, "1.0.0", pod.plugin()), 8, ("CNI_NETNS", own, "pod's network namespace"),
             ns=own)


def test_netns_path_does_not_exist(pod):
    gone = f"/run/netns/{pod.ns.name}-gone"
    raw_case(pod, nt.single(pod.net, "1.0.0", pod.plugin()), 4, ("CNI_NETNS", gone, "existing network namespace"),
             ns=gone)


# --------------------------------------------------------------------------- versions


@pytest.mark.parametrize("via", ["raw", "cnitool"])
def test_unsupported_cni_version(pod, via):
    words = ("9.9.9", "cniVersion", "1.0.0")
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "9.9.9", pod.plugin()), 1, words)
    else:
        cnitool_case(pod, pod.plugin(), 1, words, version="9.9.9")


def test_check_at_031(pod):
    raw_case(pod, nt.single(pod.net, "0.3.1", pod.plugin()), 1, ("CHECK", "0.4.0"), command="CHECK")


# --------------------------------------------------------------------------- IPAM


@pytest.mark.parametrize("via", ["raw", "cnitool"])
def test_ipam_plugin_not_found_rolls_back_link(pod, via):
    """The macvlan is made before IPAM runs; an IPAM failure must remove it again."""
    plugin = pod.plugin({"type": "rdt-no-such-ipam"})
    words = ("rdt-no-such-ipam", "CNI_PATH")
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "1.0.0", plugin), 7, words)
    else:
        cnitool_case(pod, plugin, 7, words)


LEASE_CASES = {
    "range-malformed": ({"range": "198.18.300.0/24"}, ("ipam.range", "CIDR")),
    "range-not-a-cidr": ({"range": "banana"}, ("ipam.range", "CIDR")),
    "exclude-malformed": ({"exclude": ["not-an-ip"]}, ("exclude", "CIDR")),
    "exclude-not-a-list": ({"exclude": "198.18.0.5"}, ("exclude", "list")),
    "range_start-outside": ({"range_start": "198.19.99.1"}, ("range_start", "inside")),
    "range_end-before-start": ({"range_start": "@.100", "range_end": "@.50"}, ("range_end",)),
}


@requires_lease_ipam
@pytest.mark.parametrize("via", ["raw", "cnitool"])
@pytest.mark.parametrize("case", list(LEASE_CASES))
def test_lease_ipam_bad_config(pod, case, via):
    extra, words = LEASE_CASES[case]
    extra = {k: (pod.prefix + v[1:] if isinstance(v, str) and v.startswith("@") else v) for k, v in extra.items()}
    plugin = pod.plugin(pod.lease(**extra))
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "1.0.0", plugin), 7, words)
    else:
        cnitool_case(pod, plugin, 7, words)


@requires_lease_ipam
@pytest.mark.parametrize("via", ["raw", "cnitool"])
def test_lease_ipam_exhausted_range(pod, netns, via):
    """A /30 has two usable addresses: the third ADD fails and leaves the first two alone."""
    plugin = pod.plugin(pod.lease(range=f"{pod.prefix}.4/30"))
    stdin = nt.single(pod.net, "1.0.0", plugin)
    pod.cni.write(nt.conflist(pod.net, "1.0.0", plugin))
    holders = {}
    for _ in range(2):
        ns = netns()
        if via == "raw":
            proc = pod.cni.exec("ADD", stdin, ns=ns, container_id=f"{ns.name}-cid")
            holders[f"{ns.name}-cid"] = ns
        else:
            proc = pod.cni.tool("add", pod.net, ns)
            holders[cc.container_id(ns.path)] = ns
        nt.ok(proc)
    pod.snapshot()
    assert sorted(pod.owners) == [f"{pod.prefix}.5", f"{pod.prefix}.6"]

    words = ("range", f"{pod.prefix}.4/30")
    if via == "raw":
        err = raw_case(pod, stdin, 102, words)
    else:
        err = cnitool_case(pod, plugin, 102, words)
    assert err["details"]

    for cid, ns in holders.items():
        if via == "raw":
            nt.ok(pod.cni.exec("DEL", stdin, ns=ns, container_id=cid))
        else:
            nt.ok(pod.cni.tool("del", pod.net, ns))
    assert nt.owners(pod.cni.data_dir) == {}


# --------------------------------------------------------------------------- kernel refusals after the link exists


@pytest.mark.parametrize("via", ["raw", "cnitool"])
def test_route_gateway_not_on_link_rolls_back(pod, via):
    """The kernel refuses the route after the link is up and addressed: link and lease go."""
    plugin = pod.plugin(pod.host_local(routes=[{"dst": "198.19.9.0/24", "gw": "198.19.200.1"}]))
    words = ("route", "198.19.9.0/24")
    if via == "raw":
        raw_case(pod, nt.single(pod.net, "1.0.0", plugin), 100, words)
    else:
        cnitool_case(pod, plugin, 100, words)


def test_mac_in_use_on_master_rolls_back(pod, netns):
    """A second pod asking for a MAC another macvlan of the same master has: the kernel refuses
    to bring it up (EADDRINUSE) after it was created and given an address."""
    mac = "0a:58:c6:12:aa:01"
    first = netns()
    stdin = nt.single(pod.net, "1.0.0", pod.plugin(mac=mac))
    nt.ok(pod.cni.exec("ADD", stdin, ns=first, container_id="rdt-first-cid"))
    pod.snapshot()
    raw_case(pod, stdin, 100, ("net1", "MAC address", "choose another mac"))
    nt.ok(pod.cni.exec("DEL", stdin, ns=first, container_id="rdt-first-cid"))


def test_second_passthru_on_master_fails_cleanly(pod, netns):
    first = netns()
    stdin = nt.single(pod.net, "1.0.0", pod.plugin(mode="passthru"))
    nt.ok(pod.cni.exec("ADD", stdin, ns=first, container_id="rdt-first-cid"))
    pod.snapshot()
    raw_case(pod, stdin, 100, (f"master {pod.master.name}", "passthru", "exactly one macvlan"))
    nt.ok(pod.cni.exec("DEL", stdin, ns=first, container_id="rdt-first-cid"))


def test_ipv6_duplicate_address_rolls_back(pod, netns):
    """Another pod on the same master already has the IPv6 address IPAM hands out (separate
    IPAM stores): DAD fails, the plugin reports it and removes link and reservation."""
    net6 = ipaddress.ip_network(f"fd00:198:18:{pod.prefix.rsplit('.', 1)[1]}::/64")
    v6 = str(net6)
    other = pod.cni.fork("other")
    first = netns()
    first.sysctl("net.ipv6.conf.default.accept_dad", "0")  # the first pod need not wait for DAD
    first_conf = nt.single(pod.net, "1.0.0", pod.plugin({"type": "host-local", "dataDir": str(other.host_local_dir),
                                                          "ranges": [[{"subnet": v6}]]}))
    nt.ok(other.exec("ADD", first_conf, ns=first, container_id="rdt-first-cid"))
    pod.snapshot()
    stdin = nt.single(pod.net, "1.0.0", pod.plugin({"type": "host-local", "dataDir": str(pod.cni.host_local_dir),
                                                    "ranges": [[{"subnet": v6}]]}))
    raw_case(pod, stdin, 100, ("duplicate address", str(net6[2]), "net1"))
    nt.ok(other.exec("DEL", first_conf, ns=first, container_id="rdt-first-cid"))


# --------------------------------------------------------------------------- RDMA / device-info


def test_unreadable_device_info_file_rolls_back(pod):
    """The master has an RDMA device (fake sysfs) and Multus's device-info file is garbage: the
    write fails after the link and the lease exist, and both are undone; the file is untouched."""
    sysroot = nt.fake_sysfs(pod.cni.root / "sysfs", pod.master.name)
    devinfo = pod.cni.root / "devinfo" / "cni" / "garbage"
    devinfo.parent.mkdir(parents=True)
    devinfo.write_text("{not json")
    plugin = pod.plugin(capabilities={"CNIDeviceInfoFile": True})
    stdin = nt.single(pod.net, "1.0.0", {**plugin, "runtimeConfig": {"CNIDeviceInfoFile": str(devinfo)}})
    # The fix must say what the file should hold (a device-info JSON object).
    raw_case(pod, stdin, 5, ("device-info", str(devinfo), "JSON object"), extra_env={"RDMANET_SYSFS_ROOT": str(sysroot)})
    assert devinfo.read_text() == "{not json"
