"""A multi-rail pod on the real kernel: eth0 plus four macvlan-rdma interfaces, one per veth "rail",
each rail's far end in a peer namespace of its own (the rail's switch), proven with real packets.

Two address layouts: the four rails in one shared subnet (one lease-ipam pool for the four NADs),
and one subnet per rail with a gateway each (the peer) and the same IPAM route on every rail. For
each: from every rail's peer, an ARP request for each pod address is answered (with the MAC of
that rail's interface) only for the address of that rail; traffic sourced from each pod address
(``ping -I <address>``) reaches only that rail's peer, counted there by an nftables counter per
source; DEL of one rail removes exactly its rules and table and leaves the other three working;
DEL of the rest leaves the pod as it was (eth0's default route, no rule, no table). Also
host-device-rdma (a veth moved into the pod) next to macvlan rails.
"""

from __future__ import annotations

import json
import secrets
import subprocess

import pytest

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]

pytestmark = pytest.mark.skipif(nt.lease_ipam_missing() is not None, reason=str(nt.lease_ipam_missing()))

RAILS = 4
CID = "rdt-multi-rail"
REMOTE = "198.19.250.1"  # an address behind every rail's gateway (on each peer's loopback)
TABLE_BASE = 10_000  # rdmanet.cni.linux.rail_routing: net<k> -> table 10000 + k, rules at priority 10000 + k
HD = "host-device-rdma"


def pod_with_eth0(netns, master):
    """The pod netns with an eth0 (a veth to a "cluster" netns) holding its default route."""
    pod, cluster = netns(), netns()
    m = master(ns=pod, peer_ns=cluster)
    pod.ip("link", "set", m.name, "down")
    pod.ip("link", "set", m.name, "name", "eth0")
    pod.ip("addr", "add", "198.19.200.2/24", "dev", "eth0")
    pod.ip("link", "set", "eth0", "up")
    pod.ip("route", "add", "default", "via", "198.19.200.1")
    cluster.ip("addr", "add", "198.19.200.1/24", "dev", m.peer)
    return pod, cluster


def rail(netns, master, address: str):
    """A rail: the macvlan master in the host, its far end (``address``) in a peer netns."""
    peer = netns()
    m = master(peer_ns=peer)
    peer.ip("addr", "add", address, "dev", m.peer)
    peer.ip("addr", "add", f"{REMOTE}/32", "dev", "lo")
    return m, peer


def _layout(cni, prefix: int, k: int, shared: bool) -> tuple[dict, str]:
    """(IPAM block, the peer's address) of rail ``k`` (1-based)."""
    if shared:
        return (nt.lease_ipam(cni.data_dir, f"198.18.{prefix}.0/24", range_start=f"198.18.{prefix}.10",
                              range_end=f"198.18.{prefix}.99", network_name=f"rails-{prefix}"),
                f"198.18.{prefix}.{200 + k}/24")
    subnet = f"198.18.{prefix + k}"
    return (nt.lease_ipam(cni.data_dir, f"{subnet}.0/24", gateway=f"{subnet}.1", routes=[{"dst": "198.19.250.0/24"}]),
            f"{subnet}.1/24")


def _count_icmp(peer, sources: list[str]) -> None:
    """An nftables counter of ICMP echo requests per source address, in ``peer``'s ingress."""
    rules = "\n".join(f'ip saddr {src} icmp type echo-request counter comment "{src}"' for src in sources)
    ruleset = f"table ip rdtcount {{\n chain pre {{\n type filter hook prerouting priority -300; policy accept;\n{rules}\n }}\n}}\n"
    proc = subprocess.run([nt.IP, "netns", "exec", peer.name, "nft", "-f", "-"], input=ruleset, text=True,
                          capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr


def _counted(peer) -> dict[str, int]:
    proc = peer.run("nft", "-j", "list", "table", "ip", "rdtcount")
    assert proc.returncode == 0, proc.stderr
    out = {}
    for item in json.loads(proc.stdout)["nftables"]:
        rule = item.get("rule")
        if rule:
            packets = next(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
            out[rule["comment"]] = packets
    return out


def _arping_all(peers: list, peer_ifs: list[str], addresses: list[str]) -> dict[tuple[int, int], str]:
    """{(peer k, address j): the MAC that answered, "" for none}: one ARP request each, all at once."""
    procs = {}
    for k, peer in enumerate(peers):
        for j, address in enumerate(addresses):
            procs[(k, j)] = subprocess.Popen([nt.IP, "netns", "exec", peer.name, "arping", "-c", "1", "-w", "2",
                                              "-I", peer_ifs[k], address], stdout=subprocess.PIPE,
                                             stderr=subprocess.STDOUT, text=True)
    answers = {}
    for key, proc in procs.items():
        out, _ = proc.communicate(timeout=20)
        mac = ""
        for line in out.splitlines():
            if "reply from" in line and "[" in line:
                mac = line.split("[", 1)[1].split("]", 1)[0].lower()
        answers[key] = mac
    return answers


def _ping_from(pod, address: str, target: str, count: int = 3) -> bool:
    proc = pod.run("ping", "-c", str(count), "-i", "0.2", "-W", "1", "-I", address, target)
    return proc.returncode == 0


def _rules(pod) -> list[str]:
    out = []
    for family in ("-4", "-6"):
        for rule in nt.ip_json(family, "rule", "show", ns=pod.name):
            out.append(f"{family} {rule.get('priority')} {rule.get('src', 'all')} {rule.get('oif', '')} {rule.get('table')}")
    return sorted(out)


def _table_routes(pod, table: int) -> list[dict]:
    """IPv4 routes of ``table`` ([] also when the kernel never had that table)."""
    proc = pod.ip("-j", "-4", "route", "show", "table", str(table), check=False)
    return json.loads(proc.stdout or "[]") if proc.returncode == 0 else []


class MultiRailPod:
    """The pod, its rails and the NADs, ADDed through the CNI environment ``cni``."""

    def __init__(self, cni, netns, master, shared: bool, plugins: tuple = (nt.PLUGIN,) * RAILS) -> None:
        self.cni, self.plugins = cni, plugins
        self.pod, self.cluster = pod_with_eth0(netns, master)
        prefix = 10 + secrets.randbelow(200)  # 198.18.<prefix>.0/24 shared, or <prefix + k> per rail
        self.masters, self.peers, self.peer_addresses, self.confs = [], [], [], []
        for k, plugin in enumerate(plugins, start=1):
            ipam, peer_address = _layout(cni, prefix, k, shared)
            m, peer = rail(netns, master, peer_address)
            self.masters.append(m)
            self.peers.append(peer)
            self.peer_addresses.append(peer_address.split("/")[0])
            # host-device-rdma moves the rail's own end into the pod: the veth stands in for a NIC port
            plugin_conf = nt.macvlan(m.name, ipam) if plugin == nt.PLUGIN else {"type": plugin, "device": m.name, "ipam": ipam}
            self.confs.append(nt.single(f"{self.pod.name}-rail{k}", "1.0.0", plugin_conf))
        self.rules_before = _rules(self.pod)
        self.addresses: dict[int, str] = {}
        self.macs: dict[int, str] = {}

    def ifname(self, k: int) -> str:
        return f"net{k}"

    def add(self, k: int) -> dict:
        result = json.loads(nt.ok(self.cni.exec("ADD", self.confs[k - 1], ns=self.pod, ifname=self.ifname(k),
                                                container_id=CID, plugin=self.plugins[k - 1])).stdout)
        self.addresses[k] = nt.bare_ip(result["ips"][0]["address"])
        self.macs[k] = result["interfaces"][0]["mac"].lower()
        return result

    def delete(self, k: int) -> None:
        nt.ok(self.cni.exec("DEL", self.confs[k - 1], ns=self.pod, ifname=self.ifname(k), container_id=CID,
                            plugin=self.plugins[k - 1]))
        self.addresses.pop(k, None)

    def check(self, k: int, result: dict) -> None:
        conf = {**self.confs[k - 1], "prevResult": result}
        nt.ok(self.cni.exec("CHECK", conf, ns=self.pod, ifname=self.ifname(k), container_id=CID, plugin=self.plugins[k - 1]))

    def assert_rails_work(self, rails: list[int], shared: bool) -> None:
        """ARP answered only on the own rail; pings sourced from each address reach only its peer."""
        peers = [self.peers[k - 1] for k in rails]
        answers = _arping_all(peers, [self.masters[k - 1].peer for k in rails], [self.addresses[k] for k in rails])
        for a, k in enumerate(rails):
            for b, j in enumerate(rails):
                expected = self.macs[j] if a == b else ""
                assert answers[(a, b)] == expected, (
                    f"rail {k}'s peer asked for net{j}'s address {self.addresses[j]}: answered by "
                    f"{answers[(a, b)] or 'nobody'}, expected {expected or 'nobody'} (net{j} is {self.macs[j]})")
        sources = [self.addresses[k] for k in rails]
        for peer in peers + [self.cluster]:
            _count_icmp(peer, sources)
        for k in rails:
            target = self.peer_addresses[k - 1] if shared else REMOTE
            assert _ping_from(self.pod, self.addresses[k], target), f"ping -I {self.addresses[k]} {target} (net{k}) failed"
        for a, k in enumerate(rails):
            counted = _counted(peers[a])
            for j in rails:
                want = 3 if j == k else 0
                assert counted[self.addresses[j]] == want, (
                    f"rail {k}'s peer counted {counted[self.addresses[j]]} echo requests from net{j}'s "
                    f"{self.addresses[j]}, expected {want}: {counted}")
        assert set(_counted(self.cluster).values()) == {0}, f"a rail's traffic left by eth0: {_counted(self.cluster)}"
        for peer in peers + [self.cluster]:
            peer.run("nft", "delete", "table", "ip", "rdtcount")

    def assert_default_route_on_eth0(self) -> None:
        assert nt.has_route(self.pod.name, "0.0.0.0/0", gateway="198.19.200.1", dev="eth0"), nt.routes(self.pod.name)
        assert [r for r in nt.routes(self.pod.name) if r.get("dst") == "default"] == [
            {"dst": "default", "gateway": "198.19.200.1", "dev": "eth0"}], nt.routes(self.pod.name)


@pytest.mark.parametrize("shared", [True, False], ids=["one-subnet", "subnet-per-rail"])
def test_four_rails_answer_and_send_on_their_own_rail(cni, netns, master, shared):
    pod = MultiRailPod(cni, netns, master, shared)
    results = {k: pod.add(k) for k in range(1, RAILS + 1)}
    for k in range(1, RAILS + 1):
        pod.check(k, results[k])
        assert _table_routes(pod.pod, TABLE_BASE + k), f"table {TABLE_BASE + k} of net{k} is empty"
        for key, value in (("arp_ignore", "1"), ("arp_announce", "2"), ("rp_filter", "2")):
            proc = pod.pod.run("sysctl", "-n", f"net.ipv4.conf.net{k}.{key}")
            assert proc.stdout.strip() == value, f"net{k} {key}: {proc.stdout.strip()}"
    pod.assert_default_route_on_eth0()
    if not shared:  # the same IPAM route on every rail: in the main table once per rail, by metric
        assert len([r for r in nt.routes(pod.pod.name) if r.get("dst") == "198.19.250.0/24"]) == RAILS
    pod.assert_rails_work(list(range(1, RAILS + 1)), shared)

    pod.delete(2)
    assert not any(f" {TABLE_BASE + 2}" in rule for rule in _rules(pod.pod)), _rules(pod.pod)
    assert _table_routes(pod.pod, TABLE_BASE + 2) == []
    for k in (1, 3, 4):
        pod.check(k, results[k])
    pod.assert_rails_work([1, 3, 4], shared)
    pod.assert_default_route_on_eth0()

    for k in (1, 3, 4):
        pod.delete(k)
    pod.delete(2)  # a second DEL of the same rail
    assert _rules(pod.pod) == pod.rules_before
    for k in range(1, RAILS + 1):
        assert _table_routes(pod.pod, TABLE_BASE + k) == []
    pod.assert_default_route_on_eth0()
    assert nt.owners(cni.data_dir) == {}


@pytest.mark.parametrize("shared", [True, False], ids=["one-subnet", "subnet-per-rail"])
def test_host_device_rail_beside_macvlan_rails(cni, netns, master, shared):
    """host-device-rdma moves a rail's port (a veth end) into the pod: it gets its table, rules and
    ARP settings like the macvlan rails, and DEL returns the device with none of it left in the pod."""
    pod = MultiRailPod(cni, netns, master, shared, plugins=(nt.PLUGIN, HD, nt.PLUGIN))
    results = {k: pod.add(k) for k in (1, 2, 3)}
    for k in (1, 2, 3):
        pod.check(k, results[k])
    pod.assert_rails_work([1, 2, 3], shared)
    pod.delete(2)
    assert nt.link(None, pod.masters[1].name) is not None, "the device is not back in the host"
    assert not any(f" {TABLE_BASE + 2}" in rule for rule in _rules(pod.pod)), _rules(pod.pod)
    pod.assert_rails_work([1, 3], shared)
    pod.add(2)  # the device goes back in: its rail works again
    pod.assert_rails_work([1, 2, 3], shared)
    for k in (1, 2, 3):
        pod.delete(k)
    assert _rules(pod.pod) == pod.rules_before
    pod.assert_default_route_on_eth0()
    assert nt.owners(cni.data_dir) == {}


def test_one_interface_alone_keeps_the_main_table(cni, netns, master):
    """policyRouting "auto": a pod whose only interface this is gets no table and no rule."""
    ns, m = netns(), master()
    prefix, _ = nt.random_subnet()
    conf = nt.single(f"{ns.name}-net", "1.0.0", nt.macvlan(m.name, nt.lease_ipam(cni.data_dir, f"{prefix}.0/24",
                                                                              gateway=f"{prefix}.1",
                                                                              routes=[{"dst": "0.0.0.0/0"}])))
    before = _rules(ns)
    nt.ok(cni.exec("ADD", conf, ns=ns, container_id=CID))
    assert _rules(ns) == before
    assert nt.has_route(ns.name, "0.0.0.0/0", gateway=f"{prefix}.1", dev="net1")
    nt.ok(cni.exec("DEL", conf, ns=ns, container_id=CID))


def test_policy_routing_off_and_default_route(cni, netns, master):
    """"policyRouting": "off" leaves the main table as it was; "defaultRoute": true moves the pod's
    default route to the interface and DEL puts eth0's back."""
    pod, _cluster = pod_with_eth0(netns, master)
    confs = []
    for k, extra in ((1, {"policyRouting": "off"}), (2, {"defaultRoute": True})):
        m, _peer = rail(netns, master, f"198.19.{10 + k}.1/24")
        ipam = nt.lease_ipam(cni.data_dir, f"198.19.{10 + k}.0/24", gateway=f"198.19.{10 + k}.1")
        confs.append(nt.single(f"{pod.name}-r{k}", "1.0.0", nt.macvlan(m.name, ipam, **extra)))
    before = _rules(pod)
    nt.ok(cni.exec("ADD", confs[0], ns=pod, ifname="net1", container_id=CID))
    assert _rules(pod) == before
    result = json.loads(nt.ok(cni.exec("ADD", confs[1], ns=pod, ifname="net2", container_id=CID)).stdout)
    defaults = [r for r in nt.routes(pod.name) if r.get("dst") == "default"]
    assert defaults == [{"dst": "default", "gateway": "198.19.12.1", "dev": "net2"}], defaults
    saved = nt.ip_json("-4", "route", "show", "table", str(TABLE_BASE + 10_000 + 2), ns=pod.name)
    assert [(r["dst"], r.get("gateway"), r["dev"]) for r in saved] == [("default", "198.19.200.1", "eth0")]
    assert f"-4 10002 198.19.200.2  {TABLE_BASE + 10_000 + 2}" in _rules(pod), _rules(pod)
    # eth0's own traffic still leaves by eth0 (its saved table), net2's by net2
    route = nt.ip_json("route", "get", "198.19.99.9", "from", "198.19.200.2", ns=pod.name)
    assert route[0]["dev"] == "eth0", route
    assert nt.ip_json("route", "get", "198.19.99.9", ns=pod.name)[0]["dev"] == "net2"
    nt.ok(cni.exec("CHECK", {**confs[1], "prevResult": result}, ns=pod, ifname="net2", container_id=CID))
    nt.ok(cni.exec("DEL", confs[1], ns=pod, ifname="net2", container_id=CID))
    defaults = [r for r in nt.routes(pod.name) if r.get("dst") == "default"]
    assert defaults == [{"dst": "default", "gateway": "198.19.200.1", "dev": "eth0"}], defaults
    assert _rules(pod) == before
    nt.ok(cni.exec("DEL", confs[0], ns=pod, ifname="net1", container_id=CID))


def test_two_interfaces_with_one_slot_are_refused(cni, netns, master):
    """net1 and rail1 would share table 10001: the second ADD is a CNI error naming both, and
    leaves nothing behind; its DEL leaves net1's rules alone."""
    pod, _cluster = pod_with_eth0(netns, master)
    confs = []
    for k in (1, 2):
        m, _peer = rail(netns, master, f"198.19.{20 + k}.1/24")
        confs.append(nt.single(f"{pod.name}-s{k}", "1.0.0",
                               nt.macvlan(m.name, nt.lease_ipam(cni.data_dir, f"198.19.{20 + k}.0/24"))))
    nt.ok(cni.exec("ADD", confs[0], ns=pod, ifname="net1", container_id=CID))
    rules = _rules(pod)
    err = nt.cni_error(cni.exec("ADD", confs[1], ns=pod, ifname="rail1", container_id=CID))
    assert err["code"] == 4 and "net1" in err["msg"] and "rail1" in err["msg"], err
    assert nt.link(pod.name, "rail1") is None
    assert _rules(pod) == rules
    nt.ok(cni.exec("DEL", confs[1], ns=pod, ifname="rail1", container_id=CID))
    assert _rules(pod) == rules
    nt.ok(cni.exec("DEL", confs[0], ns=pod, ifname="net1", container_id=CID))


def test_del_after_an_add_killed_between_its_rules_and_its_last_step(cni, netns, master):
    """The state a SIGKILL after the rules were added leaves: the link still carries the
    attachment's in-progress marker (attachment_link). DEL removes the link and the rules; so
    does a repeat ADD, which ends with each rule once."""
    from rdmanet.cni.linux import attachment_link

    pod = MultiRailPod(cni, netns, master, shared=True, plugins=(nt.PLUGIN, nt.PLUGIN))
    pod.add(1)
    for then in ("DEL", "ADD"):
        pod.add(2)
        pod.pod.ip("link", "set", "net2", "alias", attachment_link.marker(CID, "net2"))
        if then == "DEL":
            pod.delete(2)
            assert nt.link(pod.pod.name, "net2") is None
            assert not any(f" {TABLE_BASE + 2}" in rule for rule in _rules(pod.pod)), _rules(pod.pod)
        else:
            pod.add(2)
            mine = [rule for rule in _rules(pod.pod) if rule.endswith(f" {TABLE_BASE + 2}")]
            assert len(mine) == 2, mine  # oif net2, from <its address>
            pod.assert_rails_work([1, 2], shared=True)
            pod.delete(2)
    pod.delete(1)
    assert _rules(pod.pod) == pod.rules_before


@pytest.mark.parametrize("version", [4, 6])
def test_address_conflict_and_gateway_probes(cni, netns, master, version):
    """detectAddressConflict: an address another host holds is CNI error 107 naming that host's MAC,
    and nothing is left (link, reservation); checkGateway: a gateway that does not answer is 108,
    one that does lets ADD through. Both off by default."""
    ns = netns()
    m, peer = rail(netns, master, "198.19.30.1/24")
    peer.ip("link", "set", m.peer, "addrgenmode", "eui64", check=False)
    if version == 4:
        subnet, taken, free, gateway, absent = "198.19.30.0/24", "198.19.30.50", "198.19.30.51", "198.19.30.1", "198.19.30.9"
    else:
        peer.sysctl("net.ipv6.conf.all.accept_dad", "0")
        peer.ip("addr", "add", "fd00:30::1/64", "dev", m.peer, "nodad")
        subnet, taken, free, gateway, absent = "fd00:30::/64", "fd00:30::50", "fd00:30::51", "fd00:30::1", "fd00:30::9"
    ns.sysctl("net.ipv6.conf.default.accept_dad", "0")
    peer.ip("addr", "add", f"{taken}/{subnet.split('/')[1]}", "dev", m.peer, *(["nodad"] if version == 6 else []))
    holder_mac = nt.link(peer.name, m.peer)["address"]

    def conf(address: str, gw: str, **keys) -> dict:
        ipam = nt.lease_ipam(cni.data_dir, subnet, range_start=address, range_end=address, gateway=gw)
        return nt.single(f"{ns.name}-p{version}", "1.0.0", nt.macvlan(m.name, ipam, probeTimeoutMs=300, **keys))

    err = nt.cni_error(cni.exec("ADD", conf(taken, gateway, detectAddressConflict=True), ns=ns, container_id=CID))
    assert err["code"] == 107 and taken in err["msg"] and holder_mac in err["msg"], err
    assert nt.link(ns.name, "net1") is None and nt.owners(cni.data_dir) == {}
    nt.ok(cni.exec("DEL", conf(taken, gateway, detectAddressConflict=True), ns=ns, container_id=CID))
    nt.ok(cni.exec("ADD", conf(taken, gateway), ns=ns, container_id=CID))  # off by default: not probed
    nt.ok(cni.exec("DEL", conf(taken, gateway), ns=ns, container_id=CID))

    err = nt.cni_error(cni.exec("ADD", conf(free, absent, checkGateway=True), ns=ns, container_id=CID))
    assert err["code"] == 108 and absent in err["msg"], err
    assert nt.link(ns.name, "net1") is None and nt.owners(cni.data_dir) == {}
    nt.ok(cni.exec("DEL", conf(free, absent, checkGateway=True), ns=ns, container_id=CID))
    both = conf(free, gateway, detectAddressConflict=True, checkGateway=True)
    result = json.loads(nt.ok(cni.exec("ADD", both, ns=ns, container_id=CID)).stdout)
    assert nt.bare_ip(result["ips"][0]["address"]) == free
    nt.ok(cni.exec("DEL", both, ns=ns, container_id=CID))


def test_four_ipv6_rails_send_on_their_own_rail(cni, netns, master):
    """The same with IPv6 rails in one /64 next to an IPv6 eth0: ``from <address>/128`` rules
    send each address's traffic out of its own rail (counted on each rail's far end), and DEL
    of every rail leaves the pod's IPv6 rules as they were."""
    pod, cluster = netns(), netns()
    for ns in (pod, cluster):
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0")
        ns.sysctl("net.ipv6.conf.all.accept_dad", "0")
    m = master(ns=pod, peer_ns=cluster)
    pod.ip("addr", "add", "fd00:200::2/64", "dev", m.name)
    pod.ip("route", "add", "default", "via", "fd00:200::1")
    cluster.ip("addr", "add", "fd00:200::1/64", "dev", m.peer)
    subnet = f"fd00:{secrets.randbelow(0xffff):x}:1"
    before = nt.ip_json("-6", "rule", "show", ns=pod.name)
    peers, addresses = [], {}
    for k in range(1, RAILS + 1):
        peer = netns()
        rail_master = master(peer_ns=peer)
        peer.ip("addr", "add", f"{subnet}::{200 + k}/64", "dev", rail_master.peer, "nodad")
        peers.append(peer)
        ipam = nt.lease_ipam(cni.data_dir, f"{subnet}::/64", range_start=f"{subnet}::10", range_end=f"{subnet}::99",
                             network_name=f"{pod.name}-v6")
        conf = nt.single(f"{pod.name}-v6rail{k}", "1.0.0", nt.macvlan(rail_master.name, ipam))
        result = json.loads(nt.ok(cni.exec("ADD", conf, ns=pod, ifname=f"net{k}", container_id=CID)).stdout)
        nt.ok(cni.exec("CHECK", {**conf, "prevResult": result}, ns=pod, ifname=f"net{k}", container_id=CID))
        addresses[k] = (nt.bare_ip(result["ips"][0]["address"]), conf)
    rules = [(r.get("priority"), r.get("src"), r.get("oif"), r.get("table")) for r in nt.ip_json("-6", "rule", "show", ns=pod.name)]
    for k, (address, _conf) in addresses.items():
        assert (TABLE_BASE + k, address, None, str(TABLE_BASE + k)) in rules, rules
    for peer in peers + [cluster]:
        sources = "\n".join(f'ip6 saddr {a} icmpv6 type echo-request counter comment "{a}"' for a, _ in addresses.values())
        ruleset = f"table ip6 rdtcount {{\n chain pre {{\n type filter hook prerouting priority -300; policy accept;\n{sources}\n }}\n}}\n"
        proc = subprocess.run([nt.IP, "netns", "exec", peer.name, "nft", "-f", "-"], input=ruleset, text=True,
                              capture_output=True, check=False)
        assert proc.returncode == 0, proc.stderr
    for k, (address, _conf) in addresses.items():
        proc = pod.run("ping", "-6", "-c", "3", "-i", "0.2", "-W", "1", "-I", address, f"{subnet}::{200 + k}")
        assert proc.returncode == 0, f"ping -I {address} (net{k}): {proc.stdout} {proc.stderr}"
    for k, peer in enumerate(peers + [cluster], start=1):
        out = json.loads(peer.run("nft", "-j", "list", "table", "ip6", "rdtcount").stdout)
        counted = {r["rule"]["comment"]: next(e["counter"]["packets"] for e in r["rule"]["expr"] if "counter" in e)
                   for r in out["nftables"] if "rule" in r}
        for j, (address, _conf) in addresses.items():
            assert counted[address] == (3 if j == k else 0), f"far end {k} counted {counted} (net{j} is {address})"
    for k, (_address, conf) in addresses.items():
        nt.ok(cni.exec("DEL", conf, ns=pod, ifname=f"net{k}", container_id=CID))
    assert nt.ip_json("-6", "rule", "show", ns=pod.name) == before
    assert nt.owners(cni.data_dir) == {}


def test_check_finds_what_is_missing(cni, netns, master):
    """CHECK (code 105) names a missing source rule, a wrong ARP setting, and an interface whose
    rules are all gone (its arp_ignore says ADD routed it)."""
    pod = MultiRailPod(cni, netns, master, shared=True, plugins=(nt.PLUGIN,))
    result = pod.add(1)
    pod.check(1, result)
    conf = {**pod.confs[0], "prevResult": result}

    def check_error() -> dict:
        return nt.cni_error(cni.exec("CHECK", conf, ns=pod.pod, ifname="net1", container_id=CID))

    pod.pod.ip("rule", "del", "from", pod.addresses[1], "table", str(TABLE_BASE + 1), "pref", str(TABLE_BASE + 1))
    err = check_error()
    assert err["code"] == 105 and f"from {pod.addresses[1]} lookup {TABLE_BASE + 1}" in err["msg"], err
    pod.pod.ip("rule", "add", "from", pod.addresses[1], "table", str(TABLE_BASE + 1), "pref", str(TABLE_BASE + 1))
    pod.check(1, result)
    pod.pod.sysctl("net.ipv4.conf.net1.arp_ignore", "0")
    err = check_error()
    assert err["code"] == 105 and "arp_ignore=1" in err["msg"], err
    pod.pod.sysctl("net.ipv4.conf.net1.arp_ignore", "1")
    for selector in (("oif", "net1"), ("from", pod.addresses[1])):
        pod.pod.ip("rule", "del", *selector, "table", str(TABLE_BASE + 1), "pref", str(TABLE_BASE + 1))
    err = check_error()
    assert err["code"] == 105 and f"oif net1 lookup {TABLE_BASE + 1}" in err["msg"], err
    pod.delete(1)
