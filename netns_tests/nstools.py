"""Helpers for the root netns tests: iproute2 JSON views, raw plugin exec, IPAM stores, configs.

Nothing here creates or removes namespaces or links on its own; the fixtures in ``conftest.py``
own every object and remove it. Addresses come from 198.18.0.0/15 (RFC 2544 benchmarking) and
fd00::/8 (ULA) only, on links the tests create, so no packet can reach a real network.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pathlib
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

try:
    from netns_tests import cnitool_client as cc
except ImportError:  # pragma: no cover - netns_tests not importable as a package
    import cnitool_client as cc  # type: ignore[no-redef]

BARE_PATH = cc.BARE_PATH

# Every namespace and link this test process creates is named PREFIX + something. Derived from
# the pid, so a second import of this module (as netns_tests.nstools and as nstools) agrees, and
# concurrent sessions differ.
PREFIX = f"rdt-{os.getpid() % 0x10000:04x}"
IP = shutil.which("ip", path=BARE_PATH) or "/usr/sbin/ip"
GO_PLUGIN_DIR = pathlib.Path("/usr/lib/cni")
PLUGIN = "macvlan-rdma"

# The CNI versions libcni 1.1.2 (the cnitool front end) can drive end to end.
CNITOOL_VERSIONS = ("0.3.1", "0.4.0", "1.0.0")


# --------------------------------------------------------------------------- iproute2


def ip(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([IP, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _ns_args(ns: Optional[str]) -> list[str]:
    return ["-n", ns] if ns else []


def ip_json(*args: str, ns: Optional[str] = None) -> Any:
    out = ip(*_ns_args(ns), "-j", *args).stdout.strip()
    return json.loads(out) if out else []


def links(ns: Optional[str] = None) -> list[dict]:
    """``ip -d -j link`` in ``ns`` (None: the host netns)."""
    return ip_json("-d", "link", "show", ns=ns)


def link(ns: Optional[str], name: str) -> Optional[dict]:
    """The ``ip -d -j link`` entry of ``name`` in ``ns``, or None when there is no such link."""
    proc = ip(*_ns_args(ns), "-d", "-j", "link", "show", "dev", name, check=False)
    if proc.returncode != 0:
        return None
    [entry] = json.loads(proc.stdout)
    return entry


def link_names(ns: Optional[str] = None) -> set[tuple[int, str]]:
    """(ifindex, name) of the links in ``ns``: a before/after snapshot for "nothing left behind".

    In the host netns, links of *other* test sessions (names starting with "rdt" but not with
    this process's PREFIX: concurrent pytest runs, test_cnitool_client) are left out, so a
    parallel run on the same machine cannot make the comparison fail.
    """
    return {
        (entry["ifindex"], entry["ifname"])
        for entry in ip_json("link", "show", ns=ns)
        if ns is not None or not entry["ifname"].startswith("rdt") or entry["ifname"].startswith(PREFIX)
    }


def addresses(ns: str, name: str, family: str = "inet") -> list[str]:
    """Global addresses (CIDR) of ``name`` in ``ns`` for ``family`` ("inet" or "inet6")."""
    entries = ip_json("addr", "show", "dev", name, ns=ns)
    return [
        f"{a['local']}/{a['prefixlen']}"
        for entry in entries
        for a in entry.get("addr_info", [])
        if a.get("family") == family and a.get("scope") == "global"
    ]


_ROUTE_NOISE = ("protocol", "metric", "flags", "pref", "expires")


def routes(ns: str) -> list[dict]:
    """Main-table IPv4 and IPv6 routes of ``ns``, without the kernel's proto/metric/flags noise,
    sorted so two namespaces set up alike compare equal."""
    out = []
    for family in ("-4", "-6"):
        for route in ip_json(family, "route", "show", "table", "main", ns=ns):
            out.append({k: v for k, v in route.items() if k not in _ROUTE_NOISE})
    return sorted(out, key=lambda r: json.dumps(r, sort_keys=True))


def has_route(ns: str, dst: str, gateway: Optional[str] = None, dev: Optional[str] = None) -> bool:
    net = ipaddress.ip_network(dst)
    want = "default" if net.prefixlen == 0 else str(net)
    for route in routes(ns):
        if route.get("dst") not in (want, str(net)):
            continue
        if gateway is not None and route.get("gateway") != gateway:
            continue
        if dev is not None and route.get("dev") != dev:
            continue
        return True
    return False


def macvlan_mode(entry: dict) -> Optional[str]:
    return entry.get("linkinfo", {}).get("info_data", {}).get("mode")


# --------------------------------------------------------------------------- raw plugin exec


# What the node owner of a test machine allows: the links this session makes (veth pairs named
# PREFIX..., with no RDMA device) as masters and as devices host-device-rdma may move.
TEST_LINKS = [{"name": f"{PREFIX}*"}]


def node_policy_env(root: pathlib.Path, **keys: Any) -> dict[str, str]:
    """Write a node policy (rdmanet.cni.linux.roots) whose every root is ``root``, host-device-rdma's
    state in ``root/hd-state``, that allows this session's links as masters and host devices
    (``keys`` replace any of it); returns the environment a runtime hands the plugins for it."""
    policy = root / "node-policy.json"
    policy.write_text(json.dumps({
        "logRoots": [str(root)], "dataRoots": [str(root)], "kubeconfigs": [f"{root}/*"], "configRoots": [str(root)],
        "deviceInfoDir": str(root), "hostDeviceStateDir": str(root / "hd-state"),
        "masters": TEST_LINKS, "hostDevices": TEST_LINKS, **keys}))
    policy.chmod(0o600)
    return {"RDMANET_NODE_POLICY": str(policy)}


def bare_env(**cni: Optional[str]) -> dict[str, str]:
    env = {"PATH": BARE_PATH}
    env.update({k: v for k, v in cni.items() if v is not None})
    return env


def raw_exec(
    binary: pathlib.Path | str,
    command: str,
    stdin: Mapping[str, Any] | str | bytes,
    *,
    netns: Optional[str] = None,
    ifname: Optional[str] = "net1",
    container_id: Optional[str] = "rdt-container-1",
    cni_path: Sequence[pathlib.Path | str] | str = (),
    cni_args: Optional[str] = None,
    extra_env: Optional[Mapping[str, str]] = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run a plugin once, as a runtime does: a bare env with CNI_* only, the config on stdin.

    ``netns`` is the CNI_NETNS path ("" passes an empty CNI_NETNS; None leaves it unset).
    """
    if isinstance(stdin, Mapping):
        data = json.dumps(stdin).encode()
    elif isinstance(stdin, str):
        data = stdin.encode()
    else:
        data = stdin
    path = cni_path if isinstance(cni_path, str) else ":".join(os.fspath(p) for p in cni_path)
    env = bare_env(
        CNI_COMMAND=command,
        CNI_CONTAINERID=container_id,
        CNI_NETNS=netns,
        CNI_IFNAME=ifname,
        CNI_PATH=path,
        CNI_ARGS=cni_args,
    )
    if extra_env:
        env.update(extra_env)
    proc = subprocess.run([os.fspath(binary)], input=data, env=env, capture_output=True, timeout=timeout, check=False)
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"))


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    return proc


def cni_error(proc: subprocess.CompletedProcess[str]) -> dict:
    """The CNI error a failed raw exec printed: stdout must be exactly one JSON object."""
    assert proc.returncode != 0, f"expected failure, got exit 0\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    try:
        doc = json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"stdout is not a single JSON document:\n{proc.stdout!r}\nstderr: {proc.stderr}") from None
    assert isinstance(doc, dict), doc
    assert isinstance(doc.get("code"), int), doc
    assert isinstance(doc.get("msg"), str) and doc["msg"], doc
    assert "cniVersion" in doc, doc
    return doc


def tool_err(proc: subprocess.CompletedProcess[str]) -> dict:
    """The CNI error a failed cnitool run printed (``cc.error_of``), with no traceback on stderr."""
    err = cc.error_of(proc)
    assert err is not None, f"no CNI error JSON on stdout: {proc.stdout!r} / {proc.stderr!r}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return err


def no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    for stream, text in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        assert "Traceback" not in text, f"traceback on {stream}:\n{text}"


# --------------------------------------------------------------------------- IPAM stores


def _as_ip(name: str) -> Optional[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    for candidate in (name, name.replace("_", ":")):
        for suffix in ("", ".json", ".lease", ".ip"):
            if suffix and not candidate.endswith(suffix):
                continue
            try:
                return ipaddress.ip_address(candidate[: len(candidate) - len(suffix)] if suffix else candidate)
            except ValueError:
                continue
    return None


def address_files(data_dir: pathlib.Path | str) -> dict[str, str]:
    """Every reservation file under an IPAM dataDir: {ip: content}.

    host-local writes ``<dataDir>/<net>/<ip>`` holding ``<containerID>\\r\\n<ifname>``;
    lease-ipam's local store is also one file per IP. A file counts when its name (minus a
    .json/.lease/.ip suffix, ``_`` read as ``:``) is an IP address.
    """
    found = {}
    root = pathlib.Path(data_dir)
    if not root.exists():
        return found
    for path in root.rglob("*"):
        if path.is_file():
            addr = _as_ip(path.name)
            if addr is not None:
                found[str(addr)] = path.read_text(errors="replace")
    return found


def owners(data_dir: pathlib.Path | str) -> dict[str, str]:
    """{ip: containerID} of every reservation under an IPAM dataDir (host-local's
    ``cid\\r\\nifname`` files, lease-ipam's JSON ``{"containerID": ...}`` files)."""
    out = {}
    for addr, content in address_files(data_dir).items():
        try:
            doc = json.loads(content)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "containerID" in doc:
            out[addr] = str(doc["containerID"])
        else:
            out[addr] = content.splitlines()[0].strip() if content else ""
    return out


def files_mentioning(roots: Iterable[pathlib.Path | str], needle: str) -> list[str]:
    """Files under ``roots`` whose path contains ``needle`` (a unique container ID or net name)."""
    hits = []
    for root in roots:
        root = pathlib.Path(root)
        if not root.exists():
            continue
        for path in root.rglob("*"):
            if needle in str(path) and path.is_file():
                hits.append(str(path))
    return hits


# --------------------------------------------------------------------------- configs


def random_subnet() -> tuple[str, str]:
    """(prefix, cidr) of a random /24 in 198.18.0.0/16 (198.19.0.0/16 is left for route targets)."""
    prefix = f"198.18.{secrets.randbelow(256)}"
    return prefix, f"{prefix}.0/24"


def host_local(data_dir: pathlib.Path | str, subnet: str, *, gateway: Optional[str] = None,
               routes: Optional[list[dict]] = None, **extra: Any) -> dict:
    rng: dict[str, Any] = {"subnet": subnet}
    if gateway:
        rng["gateway"] = gateway
    conf: dict[str, Any] = {"type": "host-local", "dataDir": os.fspath(data_dir), "ranges": [[rng]]}
    if routes is not None:
        conf["routes"] = routes
    conf.update(extra)
    return conf


def lease_ipam(data_dir: pathlib.Path | str, range_: str, *, gateway: Optional[str] = None,
               routes: Optional[list[dict]] = None, **extra: Any) -> dict:
    conf: dict[str, Any] = {"type": "lease-ipam", "range": range_, "dataDir": os.fspath(data_dir)}
    if gateway:
        conf["gateway"] = gateway
    if routes is not None:
        conf["routes"] = routes
    conf.update(extra)
    return conf


def macvlan(master: Optional[str], ipam: Optional[dict] = None, *, type_: str = PLUGIN, **extra: Any) -> dict:
    conf: dict[str, Any] = {"type": type_}
    if master is not None:
        conf["master"] = master
    if ipam is not None:
        conf["ipam"] = ipam
    conf.update(extra)
    return conf


def conflist(name: str, version: str, *plugins: dict) -> dict:
    return {"cniVersion": version, "name": name, "plugins": list(plugins)}


def single(name: str, version: str, plugin: dict) -> dict:
    """A plugin's stdin for raw exec: the plugin config with name and cniVersion injected."""
    return {"cniVersion": version, "name": name, **plugin}


def iface_index(result: dict, ifname: str) -> int:
    [idx] = [i for i, itf in enumerate(result["interfaces"]) if itf["name"] == ifname]
    return idx


# --------------------------------------------------------------------------- fake sysfs


def fake_sysfs(root: pathlib.Path, netdev: str, pci: str = "0000:3b:00.0", ibdev: str = "mlx5_0") -> pathlib.Path:
    """A sysfs tree (for ``RDMANET_SYSFS_ROOT``) where ``netdev`` is a port of PCI function
    ``pci`` with RDMA device ``ibdev``, laid out with the kernel's relative links:
    ``sys/class/net/<netdev>/device -> ../../../devices/pci0000:00/<pci>`` and
    ``sys/devices/pci0000:00/<pci>/infiniband/<ibdev>/``."""
    device = root / "sys" / "devices" / "pci0000:00" / pci
    (device / "infiniband" / ibdev).mkdir(parents=True)
    (device / "net" / netdev).mkdir(parents=True)
    netdir = root / "sys" / "class" / "net" / netdev
    netdir.mkdir(parents=True)
    (netdir / "device").symlink_to(f"../../../devices/pci0000:00/{pci}")
    return root


def fake_soft_roce(root: pathlib.Path, netdev: str, ibdev: str = "rxe0") -> pathlib.Path:
    """A sysfs tree where soft-RoCE device ``ibdev`` sits on ``netdev`` (no PCI parent):
    ``sys/class/infiniband/<ibdev>/parent`` holds the netdev name."""
    ib = root / "sys" / "devices" / "virtual" / "infiniband" / ibdev
    ib.mkdir(parents=True)
    (ib / "parent").write_text(netdev + "\n")
    (root / "sys" / "class" / "infiniband").mkdir(parents=True)
    (root / "sys" / "class" / "infiniband" / ibdev).symlink_to(f"../../devices/virtual/infiniband/{ibdev}")
    (root / "sys" / "class" / "net" / netdev).mkdir(parents=True)
    return root


# --------------------------------------------------------------------------- lease-ipam availability


def lease_ipam_missing() -> Optional[str]:
    """Why lease-ipam cannot run yet (its module is still being written), else None."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("rdmanet.ipam.__main__")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return "lease-ipam is not available yet: module rdmanet.ipam.__main__ (console script lease-ipam) does not exist"
    return None


# --------------------------------------------------------------------------- fake PCI functions (host-device-rdma)


def fake_pci_function(root: pathlib.Path, pci: str, *, netdev: Optional[str] = None, driver: Optional[str] = "mlx5_core",
                      pf: Optional[str] = None, vf_index: int = 0, ibdev: Optional[str] = None) -> pathlib.Path:
    """Add PCI function ``pci`` to a fake sysfs tree at ``root`` (for ``RDMANET_SYSFS_ROOT``), in
    the kernel's layout with its relative links, and return ``root``:

    - ``sys/devices/pci<dddd:bb>/<pci>/`` with ``subsystem -> ../../../bus/pci`` and, when
      ``driver`` is given, ``driver -> ../../../bus/pci/drivers/<driver>``;
    - ``sys/bus/pci/devices/<pci> -> ../../../devices/pci<dddd:bb>/<pci>``;
    - with ``netdev``: ``<pci>/net/<netdev>/device -> ../../../<pci>`` and
      ``sys/class/net/<netdev> -> ../../devices/pci<dddd:bb>/<pci>/net/<netdev>``;
    - with ``ibdev``: ``<pci>/infiniband/<ibdev>/``;
    - with ``pf`` (a VF): ``physfn -> ../<pf>`` and, on the PF (created bare with the same
      driver if absent), ``virtfn<vf_index> -> ../<pci>`` and ``sriov_numvfs``.

    Several functions may be added to one tree.
    """
    bridge = f"pci{pci[:7]}"
    dev = root / "sys" / "devices" / bridge / pci
    dev.mkdir(parents=True, exist_ok=True)
    bus = root / "sys" / "bus" / "pci"
    (bus / "devices").mkdir(parents=True, exist_ok=True)
    if not (bus / "devices" / pci).is_symlink():
        (bus / "devices" / pci).symlink_to(f"../../../devices/{bridge}/{pci}")
    if not (dev / "subsystem").is_symlink():
        (dev / "subsystem").symlink_to("../../../bus/pci")
    if driver and not (dev / "driver").is_symlink():
        (bus / "drivers" / driver).mkdir(parents=True, exist_ok=True)
        (dev / "driver").symlink_to(f"../../../bus/pci/drivers/{driver}")
    if netdev:
        (dev / "net" / netdev).mkdir(parents=True)
        (dev / "net" / netdev / "device").symlink_to(f"../../../{pci}")
        (root / "sys" / "class" / "net").mkdir(parents=True, exist_ok=True)
        (root / "sys" / "class" / "net" / netdev).symlink_to(f"../../devices/{bridge}/{pci}/net/{netdev}")
    if ibdev:
        (dev / "infiniband" / ibdev).mkdir(parents=True)
    if pf:
        pf_dir = root / "sys" / "devices" / f"pci{pf[:7]}" / pf
        if not pf_dir.is_dir():
            fake_pci_function(root, pf, driver=driver)
        (dev / "physfn").symlink_to(f"../{pf}" if pf[:7] == pci[:7] else f"../../pci{pf[:7]}/{pf}")
        (pf_dir / f"virtfn{vf_index}").symlink_to(f"../{pci}" if pf[:7] == pci[:7] else f"../../{bridge}/{pci}")
        numvfs = pf_dir / "sriov_numvfs"
        current = int(numvfs.read_text()) if numvfs.exists() else 0
        numvfs.write_text(f"{max(current, vf_index + 1)}\n")
    return root


# --------------------------------------------------------------------------- link snapshots


# Link fields a netns round trip legitimately changes: the kernel rebuilds a device's per-netns
# IPv6 config (addrgenmode back to the namespace default) on every move, and the peer of a veth
# is named by index only from another netns.
VOLATILE_LINK_FIELDS = ("stats", "stats64", "inet6_addr_gen_mode", "link_index", "link_netnsid")


def link_snapshot(ns: Optional[str], name: str) -> Optional[dict]:
    """``ip -d -j link show <name>`` in ``ns`` minus :data:`VOLATILE_LINK_FIELDS`, None if absent.

    The ``qdisc`` of a *down* device is left out too: a move re-registers the device, which drops
    its root qdisc ("noop") until the next up attaches the default one again ("noqueue" for veth).
    """
    entry = link(ns, name)
    if entry is None:
        return None
    volatile = VOLATILE_LINK_FIELDS + (() if "UP" in entry.get("flags", []) else ("qdisc",))
    return {k: v for k, v in entry.items() if k not in volatile}


def settled_link(ns: Optional[str], name: str, timeout: float = 3.0) -> Optional[dict]:
    """:func:`link_snapshot` once the kernel's link watch has settled (operstate no longer
    UNKNOWN and two reads 50 ms apart agree): carrier events reach operstate asynchronously."""
    deadline = time.monotonic() + timeout
    last = link_snapshot(ns, name)
    while True:
        time.sleep(0.05)
        now = link_snapshot(ns, name)
        if now == last and (now is None or now.get("operstate") != "UNKNOWN"):
            return now
        if time.monotonic() > deadline:
            return now
        last = now


def wait_link_equal(ns: Optional[str], name: str, expected: Optional[dict], timeout: float = 3.0) -> Optional[dict]:
    """Poll :func:`link_snapshot` until it equals ``expected`` (or time runs out); returns the last."""
    deadline = time.monotonic() + timeout
    while True:
        now = link_snapshot(ns, name)
        if now == expected or time.monotonic() > deadline:
            return now
        time.sleep(0.05)


def wait_link_gone(ns: Optional[str], name: str, timeout: float = 5.0) -> bool:
    """True once ``name`` no longer exists in ``ns`` (a dying netns destroys its veths asynchronously)."""
    deadline = time.monotonic() + timeout
    while link(ns, name) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --------------------------------------------------------------------------- shared by the plugin suites


def store_of(cni, kind: str) -> pathlib.Path:
    """The IPAM store directory of ``kind`` ("host-local" or "lease-ipam") in a test's CniEnv."""
    return cni.host_local_dir if kind == "host-local" else cni.data_dir


def bare_ip(cidr: str) -> str:
    return cidr.split("/")[0]


def add_ok(cni, net, ns, **kw) -> dict:
    """cnitool add that must succeed; its result."""
    return json.loads(ok(cni.tool("add", net, ns, **kw)).stdout)
