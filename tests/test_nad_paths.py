"""A NAD is tenant input: every path and credential it names stays inside the node's roots.

Each test runs a plugin as a runtime would (rdmanet.cni.core.skel.handle with the call's env and stdin)
under a node policy whose roots are ``root/`` of a temporary tree, and tries what a tenant can
write in a NAD: paths outside, symlinks planted inside, another namespace. It checks what a user
sees (the CNI error: code, key, path, allowed root) and that nothing outside the roots changed.
"""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.linux import roots
from policy_file import write_policy
from lease_objects import claim_leases
from rdmanet.ipam.plugin import LeaseIPAM


def mode_of(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def tree(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    victim = outside / "victim.json"
    victim.write_text('{"keep": true}\n')
    os.chmod(victim, 0o600)
    policy = write_policy(tmp_path / "policy.json", logRoots=[str(root / "log")], dataRoots=[str(root / "data")],
                          kubeconfigs=[f"{root / 'kube'}/*"], configRoots=[str(root / "kube")],
                          deviceInfoDir=str(root / "devinfo"), hostDeviceStateDir=str(root / "hd"))
    return root, outside, victim, {roots.POLICY_ENV: str(policy)}


def call(plugin, command, conf, policy_env, cid="c1"):
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
           "CNI_PATH": "/opt/cni/bin", **policy_env}
    return skel.handle(plugin, env, json.dumps(conf).encode())


def ipam_conf(**ipam):
    ipam = {"type": "lease-ipam", "range": "10.9.0.0/29", **ipam}
    return {"cniVersion": "1.0.0", "name": "tenant-net", "type": "macvlan-rdma", "ipam": ipam}


# --------------------------------------------------------------------------- lease-ipam


def test_data_dir_outside_the_roots_is_error_7_naming_key_path_and_root(tree):
    root, outside, _, penv = tree
    code, out = call(LeaseIPAM(), "ADD", ipam_conf(dataDir=str(outside / "store")), penv)
    assert code == 1 and out["code"] == 7
    assert "ipam.dataDir" in out["msg"] and str(outside / "store") in out["msg"] and str(root / "data") in out["msg"]
    assert sorted(os.listdir(outside)) == ["victim.json"]


def test_data_dir_through_a_planted_symlink_is_refused(tree):
    root, outside, _, penv = tree
    (root / "data").mkdir()
    (root / "data" / "tenant").symlink_to(outside)
    code, out = call(LeaseIPAM(), "ADD", ipam_conf(dataDir=str(root / "data" / "tenant")), penv)
    assert out["code"] == 7 and "symlink" in out["msg"] and "ipam.dataDir" in out["msg"]
    assert sorted(os.listdir(outside)) == ["victim.json"]


def test_store_under_the_root_is_private(tree):
    root, _, _, penv = tree
    code, out = call(LeaseIPAM(), "ADD", ipam_conf(dataDir=str(root / "data" / "lease-ipam")), penv)
    assert code == 0, out
    store = root / "data" / "lease-ipam" / "tenant-net"
    assert mode_of(store) == 0o700 and mode_of(store / "10.9.0.1") == 0o600


def test_log_file_outside_the_roots_is_ignored_with_a_warning_and_the_call_works(tree, caplog):
    """whereabouts NADs say /tmp/whereabouts.log: they keep working, the file is never written."""
    root, outside, victim, penv = tree
    target = outside / "whereabouts.log"
    with caplog.at_level(logging.WARNING, logger="rdmanet.node"):
        code, out = call(LeaseIPAM(), "ADD", ipam_conf(dataDir=str(root / "data"), log_file=str(target),
                                                       log_level="debug"), penv)
    assert code == 0, out
    assert not target.exists()
    assert any("ipam.log_file" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)


def test_log_file_planted_symlink_is_not_followed(tree, caplog):
    root, _, victim, penv = tree
    (root / "log").mkdir(mode=0o700)
    (root / "log" / "ipam.log").symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="rdmanet.node"):
        code, out = call(LeaseIPAM(), "ADD", ipam_conf(dataDir=str(root / "data"), log_file=str(root / "log" / "ipam.log"),
                                                       log_level="debug"), penv)
    assert code == 0, out
    assert victim.read_text() == '{"keep": true}\n' and mode_of(victim) == 0o600
    assert any("symlink" in r.getMessage() for r in caplog.records)


def test_log_file_under_the_root_is_created_0600(tree):
    root, _, _, penv = tree
    log = root / "log" / "net" / "ipam.log"
    code, out = call(LeaseIPAM(), "ADD", ipam_conf(dataDir=str(root / "data"), log_file=str(log), log_level="debug"), penv,
                     cid="logged")
    assert code == 0, out
    assert "logged" in log.read_text() and mode_of(log) == 0o600 and mode_of(log.parent) == 0o700


def test_kubeconfig_outside_the_roots_is_refused_before_it_is_read(tree):
    root, outside, _, penv = tree
    kubeconfig = outside / "admin.conf"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    code, out = call(LeaseIPAM(), "ADD", ipam_conf(kubernetes={"kubeconfig": str(kubeconfig)}), penv)
    assert out["code"] == 7 and "ipam.kubernetes.kubeconfig" in out["msg"] and str(root / "kube") in out["msg"]
    for bad in ("/etc/kubernetes/kubelet.conf", str(root / "kube" / ".." / "outside" / "admin.conf")):
        code, out = call(LeaseIPAM(), "ADD", ipam_conf(kubernetes={"kubeconfig": bad}), penv)
        assert out["code"] == 7 and "ipam.kubernetes.kubeconfig" in out["msg"], out


def test_kubeconfig_symlink_under_the_root_is_refused(tree):
    root, outside, _, penv = tree
    (root / "kube").mkdir()
    (outside / "admin.conf").write_text("apiVersion: v1\n")
    (root / "kube" / "whereabouts.kubeconfig").symlink_to(outside / "admin.conf")
    code, out = call(LeaseIPAM(), "ADD", ipam_conf(kubernetes={"kubeconfig": str(root / "kube" / "whereabouts.kubeconfig")}),
                     penv)
    assert out["code"] == 7 and "symlink" in out["msg"]


def test_lease_namespace_is_limited_by_the_node_owner(tree, tmp_path):
    from kube_api_server import KubeAPIServer, write_kubeconfig

    root, _, _, _ = tree
    (root / "kube").mkdir()
    policy = write_policy(tmp_path / "ns-policy.json", kubeconfigs=[f"{root / 'kube'}/*"],
                          leaseNamespaces=["rdmanet-system"])
    penv = {roots.POLICY_ENV: str(policy)}
    with KubeAPIServer() as server:
        kubeconfig = write_kubeconfig(root / "kube" / "rdmanet.kubeconfig", server.url, namespace="rdmanet-system")
        code, out = call(LeaseIPAM(), "ADD", ipam_conf(kubernetes={"kubeconfig": str(kubeconfig), "namespace": "kube-system"}),
                         penv)
        assert out["code"] == 7 and "kube-system" in out["msg"] and "rdmanet-system" in out["msg"]
        assert claim_leases(server, "kube-system") == []
        code, out = call(LeaseIPAM(), "ADD", ipam_conf(kubernetes={"kubeconfig": str(kubeconfig)}), penv)  # context's ns
        assert code == 0, out
        assert len(claim_leases(server, "rdmanet-system")) == 1


# --------------------------------------------------------------------------- device-info file


def test_device_info_file_only_under_the_device_info_dir(tree):
    from rdmanet.cni.core import env as request_env
    from rdmanet.cni.linux.device_info import check_path, write_rdma_device_info

    root, outside, victim, penv = tree
    with request_env.scoped(penv):
        for bad in (str(victim), str(root / "data" / "x"), str(root / "devinfo" / ".." / "outside")):
            with pytest.raises(roots.CNIError) as err:
                check_path(bad)
            assert err.value.code == 7 and "runtimeConfig.CNIDeviceInfoFile" in err.value.msg
        with pytest.raises(roots.CNIError):
            write_rdma_device_info(str(victim), pci_address="0000:3b:00.2", rdma_device="mlx5_0")
        (root / "devinfo").mkdir()
        (root / "devinfo" / "net-c1_net1").symlink_to(victim)
        with pytest.raises(roots.CNIError) as err:
            write_rdma_device_info(str(root / "devinfo" / "net-c1_net1"), pci_address="0000:3b:00.2", rdma_device="mlx5_0")
        assert err.value.code == 7 and "symlink" in err.value.msg
        # an existing file keeps its mode (a 0600 file is not made 0644)
        private = root / "devinfo" / "private"
        private.write_text(json.dumps({"type": "pci", "version": "1.1.0", "pci": {"pci-address": "0000:3b:00.2"}}))
        os.chmod(private, 0o600)
        write_rdma_device_info(str(private), pci_address=None, rdma_device="mlx5_0")
        assert mode_of(private) == 0o600 and json.loads(private.read_text())["pci"]["rdma-device"] == "mlx5_0"
    assert victim.read_text() == '{"keep": true}\n' and mode_of(victim) == 0o600


def test_macvlan_add_refuses_a_device_info_path_outside_before_touching_anything(tree):
    from rdmanet.plugins.macvlan_rdma.plugin import MacvlanRdma

    _, outside, _, penv = tree
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "macvlan-rdma", "master": "rdt-nonexist0",
            "runtimeConfig": {"CNIDeviceInfoFile": str(outside / "devinfo")}}
    code, out = call(MacvlanRdma(), "ADD", conf, penv)
    assert out["code"] == 7 and "CNIDeviceInfoFile" in out["msg"]
    assert sorted(os.listdir(outside)) == ["victim.json"]


def test_ipoib_add_refuses_a_device_info_path_outside_before_touching_anything(tree):
    from rdmanet.plugins.ipoib_rdma.plugin import IpoibRdma

    _, outside, _, penv = tree
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "ipoib-rdma", "master": "rdt-nonexist0",
            "runtimeConfig": {"CNIDeviceInfoFile": str(outside / "devinfo")}}
    code, out = call(IpoibRdma(), "ADD", conf, penv)
    assert out["code"] == 7 and "CNIDeviceInfoFile" in out["msg"], out
    assert sorted(os.listdir(outside)) == ["victim.json"]


def test_host_device_add_refuses_a_state_dir_and_device_info_path_from_the_nad(tree):
    from rdmanet.plugins.host_device_rdma.plugin import HostDeviceRdma

    root, outside, _, penv = tree
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "host-device-rdma", "device": "rdt-nonexist0",
            "stateDir": str(outside / "state")}
    code, out = call(HostDeviceRdma(), "ADD", conf, penv)
    assert out["code"] == 7 and "stateDir" in out["msg"] and str(root / "hd") in out["msg"]
    conf = {"cniVersion": "1.0.0", "name": "n", "type": "host-device-rdma", "device": "rdt-nonexist0",
            "runtimeConfig": {"CNIDeviceInfoFile": str(outside / "devinfo")}}
    code, out = call(HostDeviceRdma(), "ADD", conf, penv)
    assert out["code"] == 7 and "CNIDeviceInfoFile" in out["msg"]
    assert sorted(os.listdir(outside)) == ["victim.json"]


# --------------------------------------------------------------------------- what keeps working


def test_example_nads_and_a_whereabouts_nad_pass_the_default_roots():
    """deploy/examples' NADs need no change; a whereabouts NAD switched to lease-ipam by its
    ``type`` only keeps its kubeconfig and gets one warning: its /tmp log file is ignored."""
    import glob

    import yaml

    from rdmanet.cli.doctor import policy_checks
    from rdmanet.cli.doctor.cni_checks import network_uses

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    nads = 0
    for path in sorted(glob.glob(os.path.join(repo, "deploy", "examples", "*.yaml"))):
        for doc in yaml.safe_load_all(open(path)):
            if isinstance(doc, dict) and doc.get("kind") == "NetworkAttachmentDefinition":
                _, uses = network_uses(json.loads(doc["spec"]["config"]), path)
                assert uses and policy_checks.check_networks(uses, roots.NodePolicy()) == [], path
                for use in uses:  # the default policy moves a device a device ID names, nothing a NAD names
                    if use.plugin == "host-device-rdma":
                        assert not {"device", "hwaddr", "kernelpath"} & use.config.keys(), path
                nads += 1
    assert nads >= 3
    whereabouts = {"cniVersion": "0.3.1", "name": "whereabouts-conf", "type": "macvlan-rdma", "master": "ens1f0",
                   "ipam": {"type": "lease-ipam", "range": "192.168.2.225/28", "log_file": "/tmp/whereabouts.log",
                            "log_level": "debug", "configuration_path": "/etc/cni/net.d/whereabouts.d/whereabouts.conf",
                            "kubernetes": {"kubeconfig": "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig"}}}
    _, uses = network_uses(whereabouts, "whereabouts.conf")
    (only,) = policy_checks.check_networks(uses, roots.NodePolicy())
    assert only.severity == "warn" and "ipam.log_file" in only.message
    roots.place_kubeconfig("ipam.kubernetes.kubeconfig", whereabouts["ipam"]["kubernetes"]["kubeconfig"],
                           roots.NodePolicy().kubeconfigs)
    roots.place("ipam.configuration_path", whereabouts["ipam"]["configuration_path"], roots.NodePolicy().config_roots)


def test_daemon_logs_an_ignored_log_file_on_its_own_log(tree, tmp_path):
    """In the daemon the warning reaches the node owner: the daemon's own log (JSON events),
    whatever log level the call asked for."""
    from rdmanet.node.launcher import call as daemon_call
    from rdmanet.node.testing import Daemon

    root, outside, _, penv = tree
    d = Daemon(str(tmp_path / "run" / "daemon.sock"), allow_uids=[os.getuid()])
    try:
        conf = ipam_conf(dataDir=str(root / "data"), log_file=str(outside / "whereabouts.log"))
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
               "CNI_PATH": "/opt/cni/bin", "RDMANET_LOG_LEVEL": "ERROR", **penv}
        code, out, _ = daemon_call(d.socket, "lease-ipam", {k.encode(): v.encode() for k, v in env.items()},
                                   json.dumps(conf).encode(), timeout=30)
        assert code == 0, out
        events = [json.loads(line) for line in d.log().splitlines() if line.startswith("{")]
        ignored = [e for e in events if e.get("event") == "node_policy"]
        assert ignored and "ipam.log_file" in ignored[0]["message"] and str(outside) in ignored[0]["message"]
        assert ignored[0]["level"] == "warning"
        assert not (outside / "whereabouts.log").exists()
    finally:
        d.cleanup()
