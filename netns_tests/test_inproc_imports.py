"""What a plugin call imports when it runs in-process (the shim finds no daemon), verb by verb,
against the real kernel: the shim is exec'd under ``python -X importtime`` and the modules it
loaded are read from that report.

A pod start without the daemon pays for every import of its verb: none may bring in what the verb
does not use (pyroute2's IPRoute machinery with asyncio, ssl and unittest.mock; the Kubernetes
client on the local store; pydantic on DEL)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import sysconfig
from typing import Optional

import pytest

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]

from rdmanet.node.launcher import write_shim

# Never on these verbs' in-process paths (see tests/test_plugin_imports.py for the module level).
NEVER = ("pyroute2.iproute", "pyroute2.netlink.nlsocket", "pyroute2.netlink.rtnl.tcmsg", "pyroute2.netlink.rtnl.marshal",
         "asyncio", "ssl", "unittest", "kubernetes", "urllib3", "yaml", "http.client", "subprocess",
         "importlib.metadata")
# DEL validates no config and its netlink requests are all plain (rdmanet.cni.linux.rtnl._plain): neither
# pydantic nor pyroute2's request filters (and the iproute2 rt_* file readers they bring).
NOT_ON_DEL = ("pydantic", "pydantic_core", "annotated_types", "pyroute2.requests", "pyroute2.netlink.rt_files")


@pytest.fixture
def inproc_bin(tmp_path: pathlib.Path) -> pathlib.Path:
    """Shims whose daemon socket leads nowhere: every call runs in-process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for plugin in ("macvlan-rdma", "host-device-rdma", "lease-ipam"):
        write_shim(str(bin_dir / plugin), plugin, sys.executable, sysconfig.get_path("purelib"),
                   str(tmp_path / "nowhere" / "daemon.sock"))
    return bin_dir


def call(bin_dir: pathlib.Path, plugin: str, command: str, conf: dict, netns: str,
         root: pathlib.Path, extra_env: Optional[dict] = None) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """One exec of the shim as a runtime makes it, under -X importtime: (process, modules imported)."""
    shim = bin_dir / plugin
    interpreter = shim.read_text().splitlines()[0][2:].split()  # "#!<python> -IS"
    env = {"PATH": nt.BARE_PATH, "CNI_COMMAND": command, "CNI_CONTAINERID": "rdt-inproc-imports",
           "CNI_NETNS": netns, "CNI_IFNAME": "net1", "CNI_PATH": str(bin_dir), **nt.node_policy_env(root),
           **(extra_env or {})}
    proc = subprocess.run([*interpreter, "-X", "importtime", str(shim)], input=json.dumps(conf), env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
               if line.startswith("import time:") and line.count("|") == 2}
    modules.discard("package")  # the report's header line
    return proc, modules


def unwanted(modules: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == r or m.startswith(r + ".") for r in roots))


@pytest.mark.parametrize("plugin", ["macvlan-rdma", "host-device-rdma"])
def test_add_and_del_import_only_what_they_use(inproc_bin, netns, master, tmp_path, plugin):
    ns, m = netns(), master()
    prefix, cidr = nt.random_subnet()
    ipam = nt.lease_ipam(tmp_path / "data", cidr, datastore="local")
    conf = {"cniVersion": "1.0.0", "name": "rdt-inproc", "type": plugin, "ipam": ipam,
            **({"master": m.name} if plugin == "macvlan-rdma" else {"device": m.name})}

    add, add_modules = call(inproc_bin, plugin, "ADD", conf, ns.path, tmp_path)
    assert add.returncode == 0, add.stdout
    assert json.loads(add.stdout)["ips"][0]["address"].startswith(prefix + ".")
    assert nt.link(ns.name, "net1") is not None
    assert "pydantic" in add_modules  # the report is read: ADD validates the config with pydantic
    assert unwanted(add_modules, NEVER) == []

    delete, del_modules = call(inproc_bin, plugin, "DEL", dict(conf, prevResult=json.loads(add.stdout)), ns.path,
                               tmp_path)
    assert delete.returncode == 0, delete.stdout
    assert nt.link(ns.name, "net1") is None
    assert "rdmanet.cni.core.skel" in del_modules
    assert unwanted(del_modules, NEVER + NOT_ON_DEL) == []
    if plugin == "host-device-rdma":
        assert nt.link(None, m.name) is not None  # back in the host namespace


def test_add_on_a_master_with_an_rdma_device_asks_rdma_netlink_without_asyncio(inproc_bin, netns, master, tmp_path):
    """A master with an RDMA device (fake sysfs): the ADD asks the kernel's RDMA netlink for the
    netns mode (rdmanet.cni.linux.rdma_netlink, a plain socket; refused on this kernel without the RDMA
    core, so "auto" goes on without it) and imports none of pyroute2's socket machinery."""
    ns, m = netns(), master()
    prefix, cidr = nt.random_subnet()
    conf = {"cniVersion": "1.0.0", "name": "rdt-inproc-rdma", "type": "macvlan-rdma", "master": m.name, "rdma": "auto",
            "ipam": nt.lease_ipam(tmp_path / "data", cidr, datastore="local")}
    env = {"RDMANET_SYSFS_ROOT": str(nt.fake_sysfs(tmp_path / "sysfs", m.name))}

    add, add_modules = call(inproc_bin, "macvlan-rdma", "ADD", conf, ns.path, tmp_path, env)
    assert add.returncode == 0, add.stdout
    assert json.loads(add.stdout)["ips"][0]["address"].startswith(prefix + ".")
    assert "rdmanet.cni.linux.rdma_netlink" in add_modules
    assert unwanted(add_modules, NEVER) == []
    delete, _ = call(inproc_bin, "macvlan-rdma", "DEL", dict(conf, prevResult=json.loads(add.stdout)), ns.path,
                     tmp_path, env)
    assert delete.returncode == 0, delete.stdout
    assert nt.link(ns.name, "net1") is None


def test_lease_ipam_local_store_verbs_import_no_api_client(inproc_bin, netns, tmp_path):
    ns = netns()
    prefix, cidr = nt.random_subnet()
    data = tmp_path / "data"
    conf = {"cniVersion": "1.0.0", "name": "rdt-inproc-lease", "type": "macvlan",
            "ipam": nt.lease_ipam(data, cidr, datastore="local")}
    add, add_modules = call(inproc_bin, "lease-ipam", "ADD", conf, ns.path, tmp_path)
    assert add.returncode == 0, add.stdout
    [ip] = json.loads(add.stdout)["ips"]
    assert ip["address"].startswith(prefix + ".")
    assert nt.owners(data) == {nt.bare_ip(ip["address"]): "rdt-inproc-imports"}
    assert unwanted(add_modules, NEVER) == []

    delete, del_modules = call(inproc_bin, "lease-ipam", "DEL", conf, ns.path, tmp_path)
    assert delete.returncode == 0, delete.stdout
    assert nt.owners(data) == {}
    assert "rdmanet.ipam.store.local" in del_modules
    assert unwanted(del_modules, NEVER + NOT_ON_DEL) == []
