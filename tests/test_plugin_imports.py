"""What a plugin exec imports and runs when no daemon answers (the in-process path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from typing import Optional

import pytest

from rdmanet.cni.core import ipam_exec
from rdmanet.cni.core.invocation import parse_invocation

SITE = sysconfig.get_path("purelib")


def _run(code: str, env: Optional[dict] = None) -> str:
    """``code`` in a fresh interpreter started as the shims start it (-I -S, then the venv's site dir)."""
    prelude = f"import site, sys; site.addsitedir({SITE!r}); sys.path.insert(0, {sys.path[0]!r})\n"
    return subprocess.run([sys.executable, "-IS", "-c", prelude + code], capture_output=True, text=True,
                          check=True, timeout=60, env=env).stdout


def test_plugin_modules_import_no_kubernetes_client():
    out = _run(
        "import rdmanet.plugins.macvlan_rdma.plugin, rdmanet.plugins.host_device_rdma.plugin, rdmanet.plugins.ipoib_rdma.plugin, rdmanet.ipam.plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))\n"
    )
    assert out.splitlines() == ["[]"]


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
    distribution) before building a validator. A config validated through rdmanet.cni.core.netconf
    loads none; the same distribution's plugin is loaded by plain pydantic (the control: the
    plugin is real)."""
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
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}  # as a runtime starts a plugin
    ours = _run(
        prelude +
        "from rdmanet.cni.core import netconf\n"
        "print(netconf.load(netconf.NetConf, {'name': 'n', 'type': 't'}).name)\n"
        "print(sorted(m for m in sys.modules if m.startswith('loudplugin')))\n",
        env,
    )
    assert ours.splitlines() == ["n", "[]"]
    control = _run(
        prelude +
        "import pydantic\n"
        "class M(pydantic.BaseModel):\n"
        "    name: str\n"
        "print(M.model_validate({'name': 'n'}).name)\n",
        env,
    )
    assert control.splitlines() == ["plugin used", "n"]
