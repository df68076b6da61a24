"""What a plugin exec imports and runs when no daemon answers (the in-process path)."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig

import pytest

from rdmanet.cni.core import ipam_exec
from rdmanet.cni.core.invocation import parse_invocation

SITE = sysconfig.get_path("purelib")


def _run(code: str) -> str:
    """``code`` in a fresh interpreter started as the shims start it (-I -S, then the venv's site dir)."""
    prelude = f"import site, sys; site.addsitedir({SITE!r}); sys.path.insert(0, {sys.path[0]!r})\n"
    return subprocess.run([sys.executable, "-IS", "-c", prelude + code], capture_output=True, text=True,
                          check=True, timeout=60).stdout


# What pyroute2's IPRoute brings along (its asyncio core, ssl, multiprocessing's pickling, the
# unittest.mock of its ipmock, every tc plugin): rdmanet.cni.linux.rtnl uses pyroute2's message classes and
# request filters without it. A plugin's verbs open an IPRoute only for requests Rtnl does not serve.
IPROUTE_MACHINERY = ("pyroute2.iproute", "pyroute2.netlink.nlsocket", "pyroute2.netlink.rtnl.tcmsg",
                     "pyroute2.netlink.rtnl.marshal", "asyncio", "ssl", "unittest")


def test_plugins_import_only_the_pyroute2_parts_they_use():
    out = _run(
        "import rdmanet.plugins.macvlan_rdma.plugin, rdmanet.plugins.host_device_rdma.plugin, rdmanet.plugins.ipoib_rdma.plugin, rdmanet.ipam.plugin\n"
        "heavy = ('ndb', 'ipdb', 'conntrack', 'nftables', 'ipset', 'ipvs', 'nslink', 'plan9')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyroute2' and m.split('.')[1:2] and m.split('.')[1] in heavy))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))\n"
        f"print(sorted(m for m in sys.modules if any(m == p or m.startswith(p + '.') for p in {IPROUTE_MACHINERY!r})))\n"
    )
    assert out.splitlines() == ["[]", "[]", "[]"]


def test_rdma_netlink_imports_and_asks_without_the_socket_machinery():
    """Asking the RDMA netns mode (on a node with an RDMA device, every macvlan-rdma and
    host-device-rdma ADD does) loads no asyncio nor pyroute2's socket classes: the answer is
    whatever this kernel says (None without the RDMA core)."""
    out = _run(
        "from rdmanet.cni.linux import rdma_netlink\n"
        "print(rdma_netlink.netns_mode() in (None, 'shared', 'exclusive'))\n"
        f"print(sorted(m for m in sys.modules if any(m == p or m.startswith(p + '.') for p in {IPROUTE_MACHINERY!r})))\n"
    )
    assert out.splitlines() == ["True", "[]"]


def test_pyroute2_package_names_still_work_after_the_partial_import():
    out = _run(
        "import rdmanet.cni.linux.links\n"
        "from pyroute2 import IPRoute, NDB\n"
        "import pyroute2\n"
        "print(IPRoute.__module__, NDB.__module__, pyroute2.__version__ != 'unknown')\n"
        "try:\n"
        "    pyroute2.no_such_name\n"
        "except AttributeError as exc:\n"
        "    print('AttributeError', exc)\n"
    )
    assert out.splitlines() == [
        "pyroute2.iproute.linux pyroute2.ndb.main True",
        "AttributeError module 'pyroute2' has no attribute 'no_such_name'",
    ]


def _lease_invocation(tmp_path, command: str, **extra: str):
    (tmp_path / "bin").mkdir(exist_ok=True)
    (tmp_path / "bin" / "lease-ipam").write_text("")  # found on CNI_PATH, but not executable
    stdin = json.dumps({"cniVersion": "1.0.0", "name": "inproc", "type": "macvlan-rdma",
                        "ipam": {"type": "lease-ipam", "range": "198.18.90.0/29",
                                 "dataDir": str(tmp_path / "data")}}).encode()
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x", "CNI_IFNAME": "net1",
           "CNI_PATH": str(tmp_path / "bin"), **extra}
    return parse_invocation(env, stdin)


def test_lease_ipam_runs_in_the_plugins_own_process(tmp_path):
    """The bin-dir file is empty: an exec would fail, the in-process call answers."""
    add = ipam_exec.exec_plugin("lease-ipam", _lease_invocation(tmp_path, "ADD"), "ADD")
    assert add["ips"][0]["address"] == "198.18.90.1/29"
    again = ipam_exec.exec_plugin("lease-ipam", _lease_invocation(tmp_path, "ADD"), "ADD")
    assert again["ips"] == add["ips"]  # the same store, the same reservation
    assert ipam_exec.exec_plugin("lease-ipam", _lease_invocation(tmp_path, "DEL"), "DEL") is None


def test_crash_hook_calls_are_execed(tmp_path):
    inv = _lease_invocation(tmp_path, "ADD", LEASE_IPAM_TEST_CRASH_AT="no-such-step")
    try:
        ipam_exec.exec_plugin("lease-ipam", inv, "ADD")
    except Exception as exc:  # the empty file cannot be exec'd: proof the call was not in-process
        assert getattr(exc, "code", None) == 104 and "cannot run IPAM plugin" in exc.msg
    else:
        raise AssertionError("a call carrying a crash hook ran in-process")


def _lease_ipam_modules(tmp_path, verbs: tuple[str, ...], roots: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(answers, modules of ``roots`` imported) after lease-ipam ``verbs`` in-process, local store,
    in a fresh interpreter started as the shims start it."""
    conf = json.dumps({"cniVersion": "1.0.0", "name": "imp", "type": "macvlan",
                       "ipam": {"type": "lease-ipam", "range": "198.18.91.0/29", "datastore": "local",
                                "dataDir": str(tmp_path / "data")}})
    out = _run(
        "import json\n"
        "from rdmanet.cni.core import skel\n"
        "from rdmanet.ipam.plugin import LeaseIPAM\n"
        f"env = {{'CNI_CONTAINERID': 'c1', 'CNI_NETNS': '/run/netns/x', 'CNI_IFNAME': 'net1', 'CNI_PATH': '/nowhere'}}\n"
        f"for verb in {verbs!r}:\n"
        "    env['CNI_COMMAND'] = verb\n"
        f"    print(json.dumps(skel.handle(LeaseIPAM(), env, {conf!r}.encode())))\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {roots!r} or m in {roots!r})))\n"
    ).splitlines()
    return out[:-1], json.loads(out[-1])


# Imported by none of the local store's verbs: the Lease store's clients (the official one, and
# http.client/ssl, which only the in-process Kubernetes store needs), YAML, and the exec machinery.
NOT_FOR_THE_LOCAL_STORE = ("kubernetes", "urllib3", "yaml", "requests", "oauthlib", "google", "websocket",
                           "http.client", "ssl", "subprocess", "asyncio")


def test_local_store_verbs_import_no_api_client(tmp_path):
    answers, modules = _lease_ipam_modules(tmp_path, ("ADD", "CHECK", "DEL"), NOT_FOR_THE_LOCAL_STORE)
    assert json.loads(answers[0])[1]["ips"] == [{"address": "198.18.91.1/29"}]
    assert [json.loads(a)[0] for a in answers] == [0, 0, 0]
    assert modules == []


def test_local_store_del_imports_no_config_models(tmp_path):
    """DEL reads the ipam block without pydantic (rdmanet.ipam.location): a DEL pays no model building."""
    answers, modules = _lease_ipam_modules(tmp_path, ("DEL",), ("pydantic", "pydantic_core", "netaddr",
                                                                 *NOT_FOR_THE_LOCAL_STORE))
    assert answers == ["[0, null]"] and modules == []


@pytest.mark.parametrize("plugin", ["rdmanet.plugins.macvlan_rdma.plugin:MacvlanRdma", "rdmanet.plugins.host_device_rdma.plugin:HostDeviceRdma"])
def test_plugin_del_builds_no_config_models(tmp_path, plugin):
    """DEL needs the IPAM's type and what ADD recorded, not the config's models: no pydantic."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "lease-ipam").write_text("")  # found on CNI_PATH; runs in-process
    module, cls = plugin.split(":")
    conf = json.dumps({"cniVersion": "1.0.0", "name": "imp", "type": "x", "device": "nodev0", "master": "nomaster0",
                       "ipam": {"type": "lease-ipam", "range": "198.18.92.0/29", "datastore": "local",
                                "dataDir": str(tmp_path / "data")}})
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_NETNS": "", "CNI_IFNAME": "net1",
           "CNI_PATH": str(tmp_path / "bin")}
    out = _run(
        "import json\n"
        "from rdmanet.cni.core import skel\n"
        f"from {module} import {cls}\n"
        f"print(json.dumps(skel.handle({cls}(), {env!r}, {conf!r}.encode())))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))\n"
    ).splitlines()
    assert out == ["[0, null]", "[]"]


def test_config_validation_loads_no_pydantic_plugins(tmp_path):
    """pydantic looks up plugins (entry points of group ``pydantic`` of every installed
    distribution) before building a validator, through importlib.metadata (~10-15 ms of CPU per
    exec'd call). A config validated through rdmanet.cni.core.netconf runs none and imports neither; the
    same distribution's plugin is loaded by plain pydantic (the control: the plugin is real)."""
    site = tmp_path / "site"
    (site / "loudplugin-1.0.dist-info").mkdir(parents=True)
    (site / "loudplugin-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: loudplugin\nVersion: 1.0\n")
    (site / "loudplugin-1.0.dist-info" / "entry_points.txt").write_text("[pydantic]\nloud = loudplugin:plugin\n")
    (site / "loudplugin.py").write_text(
        "class Plugin:\n"
        "    def new_schema_validator(self, *args, **kwargs):\n"
        "        print('plugin used')\n"
        "        return None, None, None\n"
        "plugin = Plugin()\n")
    prelude = f"sys.path.insert(0, {str(site)!r})\n"
    ours = _run(
        prelude +
        "from rdmanet.cni.core import netconf\n"
        "print(netconf.load(netconf.NetConf, {'name': 'n', 'type': 't'}).name)\n"
        "print(sorted(m for m in sys.modules if m.startswith(('importlib.metadata', 'email', 'zipfile', 'loudplugin'))))\n"
    )
    assert ours.splitlines() == ["n", "[]"]
    control = _run(
        prelude +
        "import pydantic\n"
        "class M(pydantic.BaseModel):\n"
        "    name: str\n"
        "print(M.model_validate({'name': 'n'}).name)\n"
    )
    assert control.splitlines() == ["plugin used", "n"]
