"""Root tests for the libcni-based cnitool front end (cnitool/main.go).

They prove the front end is a working CNI runtime by driving Debian's Go
reference plugins (``/usr/lib/cni/macvlan`` + ``/usr/lib/cni/host-local``,
package containernetworking-plugins) into network namespaces the tests create
themselves. The macvlan master is always a veth pair created here with unique
``rdt<hex>a``/``rdt<hex>b`` names; it is left administratively down, so no
packet is ever sent, and no pre-existing interface is ever touched. The GC and
STATUS verbs (which libcni 1.1.2 lacks and cnitool implements by raw exec) are
checked with tiny recording shell plugins and need neither root nor a netns.

Every netns, link and temporary directory is removed by its fixture, also when
a test fails.
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

try:
    from netns_tests import cnitool_client as cc
except ImportError:  # netns_tests is not importable as a package
    import cnitool_client as cc

PLUGIN_DIR = pathlib.Path("/usr/lib/cni")
IP = shutil.which("ip", path=cc.BARE_PATH)

_missing = cc.missing_prerequisites()
pytestmark = pytest.mark.skipif(_missing is not None, reason=f"cnitool cannot be built: {_missing}")


def _root_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (creates network namespaces and links)"
    if IP is None:
        return "iproute2 'ip' not found"
    for plugin in ("macvlan", "host-local"):
        if not os.access(PLUGIN_DIR / plugin, os.X_OK):
            return f"{PLUGIN_DIR / plugin} missing (install containernetworking-plugins)"
    return None


_root_missing = _root_skip_reason()
requires_root = pytest.mark.skipif(_root_missing is not None, reason=str(_root_missing))


# --------------------------------------------------------------------------
# helpers and fixtures
# --------------------------------------------------------------------------


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert IP is not None
    proc = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _addrs(netns_name: str, ifname: str) -> list[str] | None:
    """IPv4 addresses (CIDR) on ``ifname`` in ``netns_name``; None if no such link."""
    proc = _ip("-n", netns_name, "-j", "addr", "show", "dev", ifname, check=False)
    if proc.returncode != 0:
        return None
    links = json.loads(proc.stdout or "[]")
    return [
        f"{a['local']}/{a['prefixlen']}"
        for link in links
        for a in link.get("addr_info", [])
        if a.get("family") == "inet"
    ]


def _link_exists(netns_name: str, ifname: str) -> bool:
    return _ip("-n", netns_name, "link", "show", "dev", ifname, check=False).returncode == 0


def _unique() -> str:
    # "rdt" + 8 hex chars: short enough for IFNAMSIZ with a one-letter suffix.
    return f"rdt{secrets.token_hex(4)}"


def _write_json(path: pathlib.Path, obj: dict) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2))
    return path


@pytest.fixture(scope="session")
def cnitool_bin(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    # A build failure with Go and libcni present is a real failure, not a skip.
    return cc.build(tmp_path_factory.mktemp("cnitool-build"))


@pytest.fixture
def workdir() -> Iterator[pathlib.Path]:
    path = pathlib.Path(tempfile.mkdtemp(prefix="rdt-cnitool-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class Netns:
    def __init__(self, name: str) -> None:
        self.name = name
        self.path = pathlib.Path("/run/netns") / name


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns = Netns(_unique())
    try:
        _ip("netns", "add", ns.name)
        yield ns
    finally:
        # Deleting the namespace also destroys any link a plugin moved into it.
        _ip("netns", "del", ns.name, check=False)


@pytest.fixture
def master() -> Iterator[str]:
    """A fresh veth pair in the host netns; returns the end used as macvlan master.

    Both ends stay down: macvlan ADD/CHECK/DEL do not need carrier, and a
    down link cannot emit anything.
    """
    base = _unique()
    end_a, end_b = f"{base}a", f"{base}b"
    try:
        _ip("link", "add", end_a, "type", "veth", "peer", "name", end_b)
        yield end_a
    finally:
        # Removing one end of a veth pair removes its peer too.
        _ip("link", "del", end_a, check=False)
        _ip("link", "del", end_b, check=False)


def _subnet() -> tuple[str, str]:
    """A random /24 from the 198.18.0.0/15 benchmarking block (prefix, cidr)."""
    third = secrets.randbelow(256)
    prefix = f"198.18.{third}"
    return prefix, f"{prefix}.0/24"


def _macvlan(master: str, workdir: pathlib.Path, subnet: str, **extra: object) -> dict:
    conf = {
        "type": "macvlan",
        "master": master,
        "mode": "bridge",
        "ipam": {
            "type": "host-local",
            "dataDir": str(workdir / "ipam"),
            "ranges": [[{"subnet": subnet}]],
        },
    }
    conf.update(extra)
    return conf


def _run(binary: pathlib.Path, verb: str, net: str, ns_path: pathlib.Path | str, workdir: pathlib.Path, **kw):
    kw.setdefault("netconfpath", workdir / "net.d")
    kw.setdefault("cni_path", [str(PLUGIN_DIR)])
    kw.setdefault("cache_dir", workdir / "cache")
    return cc.run(binary, verb, net, ns_path, **kw)


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"rc={proc.returncode}\nstdout={proc.stdout}\nstderr={proc.stderr}"
    return proc


def _cache_file(workdir: pathlib.Path, net: str, ns_path: pathlib.Path, ifname: str) -> pathlib.Path:
    return workdir / "cache" / "results" / f"{net}-{cc.container_id(ns_path)}-{ifname}"


# --------------------------------------------------------------------------
# real plugins in a real netns
# --------------------------------------------------------------------------


@requires_root
def test_conflist_100_add_check_del(cnitool_bin, workdir, netns, master):
    net = f"{netns.name}-net"
    prefix, subnet = _subnet()
    _write_json(
        workdir / "net.d" / "10-test.conflist",
        {"cniVersion": "1.0.0", "name": net, "plugins": [_macvlan(master, workdir, subnet)]},
    )

    add = _ok(_run(cnitool_bin, "add", net, netns.path, workdir))
    result = json.loads(add.stdout)
    assert result["cniVersion"] == "1.0.0"
    ifaces = result["interfaces"]
    [idx] = [i for i, itf in enumerate(ifaces) if itf["name"] == "eth0"]
    assert ifaces[idx]["sandbox"] == str(netns.path)
    assert ifaces[idx]["mac"]
    [ipconf] = result["ips"]
    assert ipconf["interface"] == idx
    assert ipconf["address"].startswith(prefix + ".") and ipconf["address"].endswith("/24")

    # The address really is on eth0 inside the namespace.
    assert _addrs(netns.name, "eth0") == [ipconf["address"]]

    # libcni cached the result under <cache>/results/<net>-<cid>-<ifname>.
    cache = _cache_file(workdir, net, netns.path, "eth0")
    assert cache.is_file()
    cached = json.loads(cache.read_text())
    assert cached["containerId"] == cc.container_id(netns.path)
    assert cached["result"]["ips"][0]["address"] == ipconf["address"]

    check = _ok(_run(cnitool_bin, "check", net, netns.path, workdir))
    assert check.stdout == ""

    delete = _ok(_run(cnitool_bin, "del", net, netns.path, workdir))
    assert delete.stdout == ""
    assert not _link_exists(netns.name, "eth0")
    assert not cache.exists()

    # DEL is idempotent.
    _ok(_run(cnitool_bin, "del", net, netns.path, workdir))


@requires_root
def test_single_conf_040_with_cni_args(cnitool_bin, workdir, netns, master):
    """A lone .conf is wrapped into a list; CNI_ARGS reach host-local (IP=)."""
    net = f"{netns.name}-net"
    prefix, subnet = _subnet()
    # A .conflist with another name must not shadow the .conf we ask for.
    _write_json(
        workdir / "net.d" / "00-other.conflist",
        {"cniVersion": "1.0.0", "name": f"{net}-other", "plugins": [_macvlan(master, workdir, subnet)]},
    )
    _write_json(
        workdir / "net.d" / "20-test.conf",
        {"cniVersion": "0.4.0", "name": net, **_macvlan(master, workdir, subnet)},
    )
    wanted = f"{prefix}.50"
    args = f"IgnoreUnknown=1;IP={wanted}"

    add = _ok(_run(cnitool_bin, "add", net, netns.path, workdir, ifname="net1", cni_args=args))
    result = json.loads(add.stdout)
    assert result["cniVersion"] == "0.4.0"
    [idx] = [i for i, itf in enumerate(result["interfaces"]) if itf["name"] == "net1"]
    assert result["interfaces"][idx]["sandbox"] == str(netns.path)
    [ipconf] = result["ips"]
    assert ipconf["version"] == "4"
    assert ipconf["address"] == f"{wanted}/24"
    assert _addrs(netns.name, "net1") == [f"{wanted}/24"]
    assert not _link_exists(netns.name, "eth0")

    _ok(_run(cnitool_bin, "check", net, netns.path, workdir, ifname="net1", cni_args=args))
    _ok(_run(cnitool_bin, "del", net, netns.path, workdir, ifname="net1", cni_args=args))
    assert not _link_exists(netns.name, "net1")
    _ok(_run(cnitool_bin, "del", net, netns.path, workdir, ifname="net1", cni_args=args))


@requires_root
def test_cap_args_become_runtime_config(cnitool_bin, workdir, netns, master):
    """CAP_ARGS are filtered by capabilities and injected as runtimeConfig."""
    net = f"{netns.name}-net"
    _, conf_subnet = _subnet()
    cap_prefix = "198.19.77"
    _write_json(
        workdir / "net.d" / "10-test.conflist",
        {
            "cniVersion": "1.0.0",
            "name": net,
            "plugins": [_macvlan(master, workdir, conf_subnet, capabilities={"ipRanges": True})],
        },
    )
    cap_args = {"ipRanges": [[{"subnet": f"{cap_prefix}.0/24"}]], "portMappings": []}

    add = _ok(_run(cnitool_bin, "add", net, netns.path, workdir, cap_args=cap_args))
    # host-local puts the runtime's ipRanges in front of the configured ones
    # and allocates one address per range set.
    addresses = [ipconf["address"] for ipconf in json.loads(add.stdout)["ips"]]
    assert addresses[0].startswith(cap_prefix + ".")
    assert sorted(_addrs(netns.name, "eth0") or []) == sorted(addresses)
    _ok(_run(cnitool_bin, "del", net, netns.path, workdir, cap_args=cap_args))
    assert not _link_exists(netns.name, "eth0")


@requires_root
@pytest.mark.parametrize("bad", ["FOO", "A=B=C", "=v", "K=", "A=1;;B=2", "A=1;B"])
def test_bad_cni_args_fail_cleanly(cnitool_bin, workdir, netns, master, bad):
    net = f"{netns.name}-net"
    _, subnet = _subnet()
    _write_json(
        workdir / "net.d" / "10-test.conflist",
        {"cniVersion": "1.0.0", "name": net, "plugins": [_macvlan(master, workdir, subnet)]},
    )
    proc = _run(cnitool_bin, "add", net, netns.path, workdir, cni_args=bad)
    assert proc.returncode == 1
    assert "invalid CNI_ARGS pair" in proc.stderr
    assert proc.stdout == ""  # not a CNI error: no JSON, no result
    assert not _link_exists(netns.name, "eth0")
    assert not _cache_file(workdir, net, netns.path, "eth0").exists()


@requires_root
def test_plugin_error_is_reported_as_json(cnitool_bin, workdir, netns, master):
    net = f"{netns.name}-net"
    _, subnet = _subnet()
    missing_master = f"{master[:-1]}z"  # never created
    assert _ip("link", "show", "dev", missing_master, check=False).returncode != 0
    _write_json(
        workdir / "net.d" / "10-test.conflist",
        {"cniVersion": "1.0.0", "name": net, "plugins": [_macvlan(missing_master, workdir, subnet)]},
    )
    proc = _run(cnitool_bin, "add", net, netns.path, workdir)
    assert proc.returncode == 1
    err = cc.error_of(proc)
    assert err is not None, proc.stdout
    assert isinstance(err["code"], int) and err["code"] > 0
    assert err["msg"]  # macvlan reports the failed master lookup
    assert "details" in err
    assert 'plugin type="macvlan"' in proc.stderr and err["msg"] in proc.stderr
    assert not _link_exists(netns.name, "eth0")


def test_unknown_network_and_usage(cnitool_bin, workdir):
    (workdir / "net.d").mkdir()
    proc = _run(cnitool_bin, "add", "no-such-net", "/run/netns/none", workdir)
    assert proc.returncode == 1
    assert "no net configurations found" in proc.stderr
    _write_json(
        workdir / "net.d" / "10-x.conflist",
        {"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "rdtnone"}]},
    )
    proc = _run(cnitool_bin, "add", "no-such-net", "/run/netns/none", workdir)
    assert proc.returncode == 1
    assert 'no net configuration with name "no-such-net"' in proc.stderr
    assert proc.stdout == ""
    usage = cc.run(cnitool_bin, "frobnicate", "x", "y", netconfpath=workdir, cni_path=[])
    assert usage.returncode == 1
    assert "Usage:" in usage.stderr


def test_container_id_matches_upstream_scheme():
    cid = cc.container_id("/run/netns/example")
    assert cid.startswith("cnitool-") and len(cid) == len("cnitool-") + 20


# --------------------------------------------------------------------------
# GC and STATUS (raw exec) with recording fake plugins
# --------------------------------------------------------------------------

_RECORDER = """#!/bin/sh
# Fake CNI plugin: records how it was called; fails when $0.fail exists.
name=$(basename "$0")
dir=$(dirname "$0")
cat > "$dir/$name.$CNI_COMMAND.stdin"
env > "$dir/$name.$CNI_COMMAND.env"
echo "$name $CNI_COMMAND" >> "$dir/calls.log"
if [ -e "$dir/$name.fail" ]; then
    cat "$dir/$name.fail"
    exit 1
fi
exit 0
"""


@pytest.fixture
def recorders(workdir) -> pathlib.Path:
    plugdir = workdir / "plugins"
    plugdir.mkdir()
    for name in ("rdtreca", "rdtrecb"):
        path = plugdir / name
        path.write_text(_RECORDER)
        path.chmod(0o755)
    return plugdir


def _recorder_list(workdir: pathlib.Path, version: str) -> str:
    net = "rdt-gc-net"
    _write_json(
        workdir / "net.d" / "10-gc.conflist",
        {
            "cniVersion": version,
            "name": net,
            "plugins": [
                {"type": "rdtreca", "knob": 1},
                {"type": "rdtrecb", "name": "ignored-name", "cniVersion": "0.3.1"},
            ],
        },
    )
    return net


def _calls(plugdir: pathlib.Path) -> list[str]:
    log = plugdir / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def _env(path: pathlib.Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_gc_runs_every_plugin_with_valid_attachments(cnitool_bin, workdir, recorders):
    net = _recorder_list(workdir, "1.1.0")
    valid = [{"containerID": "c1", "ifname": "eth0"}, {"containerID": "c2", "ifname": "net1"}]
    proc = _ok(
        _run(cnitool_bin, "gc", net, "/run/netns/none", workdir, cni_path=[recorders], valid_attachments=valid)
    )
    assert proc.stdout == ""
    assert _calls(recorders) == ["rdtreca GC", "rdtrecb GC"]

    stdin_a = json.loads((recorders / "rdtreca.GC.stdin").read_text())
    assert stdin_a == {
        "type": "rdtreca",
        "knob": 1,
        "name": net,
        "cniVersion": "1.1.0",
        "cni.dev/valid-attachments": valid,
    }
    stdin_b = json.loads((recorders / "rdtrecb.GC.stdin").read_text())
    assert stdin_b["name"] == net and stdin_b["cniVersion"] == "1.1.0"

    env = _env(recorders / "rdtreca.GC.env")
    assert env["CNI_COMMAND"] == "GC"
    assert env["CNI_PATH"] == str(recorders)
    for unset in ("CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS"):
        assert env.get(unset, "") == ""


def test_gc_without_valid_attachments_omits_key(cnitool_bin, workdir, recorders):
    net = _recorder_list(workdir, "1.1.0")
    _ok(_run(cnitool_bin, "gc", net, "/run/netns/none", workdir, cni_path=[recorders]))
    stdin_a = json.loads((recorders / "rdtreca.GC.stdin").read_text())
    assert "cni.dev/valid-attachments" not in stdin_a

    # An explicit empty list is passed through as such.
    _ok(_run(cnitool_bin, "gc", net, "/run/netns/none", workdir, cni_path=[recorders], valid_attachments=[]))
    stdin_a = json.loads((recorders / "rdtreca.GC.stdin").read_text())
    assert stdin_a["cni.dev/valid-attachments"] == []


def test_status_success_and_first_error_stops(cnitool_bin, workdir, recorders):
    net = _recorder_list(workdir, "1.1.0")
    proc = _ok(_run(cnitool_bin, "status", net, "/run/netns/none", workdir, cni_path=[recorders]))
    assert proc.stdout == ""
    assert _calls(recorders) == ["rdtreca STATUS", "rdtrecb STATUS"]
    stdin_a = json.loads((recorders / "rdtreca.STATUS.stdin").read_text())
    assert stdin_a == {"type": "rdtreca", "knob": 1, "name": net, "cniVersion": "1.1.0"}

    (recorders / "calls.log").unlink()
    (recorders / "rdtreca.fail").write_text(
        json.dumps({"cniVersion": "1.1.0", "code": 50, "msg": "plugin not available", "details": "no lease"})
    )
    proc = _run(cnitool_bin, "status", net, "/run/netns/none", workdir, cni_path=[recorders])
    assert proc.returncode == 1
    assert cc.error_of(proc) == {"code": 50, "msg": "plugin not available", "details": "no lease"}
    assert "plugin not available" in proc.stderr
    assert _calls(recorders) == ["rdtreca STATUS"]


def test_gc_reports_errors_but_runs_all_plugins(cnitool_bin, workdir, recorders):
    net = _recorder_list(workdir, "1.1.0")
    (recorders / "rdtreca.fail").write_text(json.dumps({"cniVersion": "1.1.0", "code": 7, "msg": "bad gc"}))
    proc = _run(cnitool_bin, "gc", net, "/run/netns/none", workdir, cni_path=[recorders])
    assert proc.returncode == 1
    assert cc.error_of(proc) == {"code": 7, "msg": "bad gc", "details": ""}
    assert _calls(recorders) == ["rdtreca GC", "rdtrecb GC"]


@pytest.mark.parametrize("verb", ["gc", "status"])
def test_gc_status_are_noops_before_110(cnitool_bin, workdir, recorders, verb):
    net = _recorder_list(workdir, "1.0.0")
    _ok(_run(cnitool_bin, verb, net, "/run/netns/none", workdir, cni_path=[recorders]))
    assert _calls(recorders) == []


def test_gc_missing_plugin_fails(cnitool_bin, workdir, recorders):
    net = _recorder_list(workdir, "1.1.0")
    (recorders / "rdtrecb").unlink()
    proc = _run(cnitool_bin, "gc", net, "/run/netns/none", workdir, cni_path=[recorders])
    assert proc.returncode == 1
    assert "rdtrecb" in proc.stderr
    assert _calls(recorders) == ["rdtreca GC"]
