"""``rdmanet doctor`` and the node policy: files others may write under the roots, and networks
whose paths the plugins will refuse or ignore (rdmanet.cli.doctor.policy_checks)."""

from __future__ import annotations

import os

from rdmanet.cni.linux import roots
from rdmanet.cli.doctor import policy_checks
from rdmanet.cli.doctor.cni_checks import NetworkUse


def policy_in(tmp_path) -> roots.NodePolicy:
    r = tmp_path / "roots"
    return roots.NodePolicy(log_roots=(str(r / "log"),), data_roots=(str(r / "data"),), kubeconfigs=(f"{r / 'kube'}/*",),
                            config_roots=(str(r / "kube"),), device_info_dir=str(r / "devinfo"),
                            host_device_state_dir=str(r / "data" / "hd"))


def test_world_writable_foreign_owned_and_symlinks_under_the_roots_are_reported(tmp_path):
    policy = policy_in(tmp_path)
    data = tmp_path / "roots" / "data"
    (data / "lease-ipam" / "net").mkdir(parents=True)
    (data / "lease-ipam" / "net" / "10.0.0.2").write_text("{}")
    os.chmod(data / "lease-ipam" / "net" / "10.0.0.2", 0o666)
    (data / "tenant").mkdir()
    os.chown(data / "tenant", 1000, 1000)
    (data / "link").symlink_to("/etc")
    (tmp_path / "roots" / "log").mkdir(parents=True)
    (tmp_path / "roots" / "log" / "fine.log").write_text("")
    findings = policy_checks.check(policy_checks.gather(0, policy))
    by_subject = {f.subject: f for f in findings}
    ww = by_subject[str(data / "lease-ipam" / "net" / "10.0.0.2")]
    assert ww.severity == "error" and "writable by others (mode 666)" in ww.message and ww.fix.startswith("chown root:root")
    foreign = by_subject[str(data / "tenant")]
    assert foreign.severity == "error" and "owned by uid 1000" in foreign.message
    assert by_subject[str(data / "link")].severity == "warn"
    assert by_subject[str(tmp_path / "roots" / "log")].severity == "ok"
    assert not any(f.subject.startswith("/etc") for f in findings), "the walk followed a symlink"


def test_a_root_everyone_may_write_is_a_warning_and_not_scanned(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    (shared / "x").write_text("")
    os.chmod(shared / "x", 0o666)
    findings = policy_checks.check(policy_checks.gather(0, roots.NodePolicy(log_roots=(str(shared),))))
    (f,) = [f for f in findings if f.subject == str(shared)]
    assert f.severity == "warn" and "writable by everyone" in f.message
    assert not any(f.subject == str(shared / "x") for f in findings)


def use(config, plugin="macvlan-rdma"):
    return NetworkUse(source="nad.conf", network=config["name"], plugin=plugin,
                      ipam=(config.get("ipam") or {}).get("type", "lease-ipam"), config=config)


def test_networks_paths_outside_the_roots(tmp_path):
    policy = policy_in(tmp_path)
    whereabouts = use({"name": "wb", "type": "macvlan-rdma", "master": "ens1f0",
                       "ipam": {"type": "lease-ipam", "log_file": "/tmp/whereabouts.log", "dataDir": "/etc/x",
                                "kubernetes": {"kubeconfig": "/etc/kubernetes/admin.conf"}},
                       "runtimeConfig": {"CNIDeviceInfoFile": "/etc/passwd"}})
    hd = use({"name": "hd", "type": "host-device-rdma", "stateDir": "/tmp/tenant"}, plugin="host-device-rdma")
    fine = use({"name": "ok", "type": "macvlan-rdma", "master": "ens1f0",
                "ipam": {"type": "lease-ipam", "log_file": str(tmp_path / "roots" / "log" / "a.log")}})
    findings = policy_checks.check_networks([whereabouts, hd, fine], policy)
    wb = [f for f in findings if f.subject == "nad.conf: wb"]
    assert [f.severity for f in wb] == ["warn", "error", "error", "error"]
    assert "ipam.log_file" in wb[0].message and "ignored" in wb[0].message
    assert "ipam.dataDir" in wb[1].message and "ipam.kubernetes.kubeconfig" in wb[2].message
    assert "CNIDeviceInfoFile" in wb[3].message
    (h,) = [f for f in findings if f.subject == "nad.conf: hd"]
    assert h.severity == "error" and "stateDir" in h.message
    assert not [f for f in findings if f.subject == "nad.conf: ok"]


def test_mistyped_keys_an_interface_plugin_as_ipam_and_no_master_are_flagged():
    typo = use({"name": "typo", "type": "macvlan-rdma", "mastr": "ens1f0", "deviceID": "0000:3b:00.2",
                "cni.dev/attachments": [], "ipam": {"type": "macvlan-rdma"}})
    findings = policy_checks.check_networks([typo], roots.NodePolicy())
    by_message = {f.message: f for f in findings}
    key = by_message["macvlan-rdma does not read the key 'mastr': it is ignored (did you mean 'master'?)"]
    assert key.severity == "warn" and key.fix == "rename it to 'master'"
    ipam = next(f for f in findings if f.message.startswith("ipam.type macvlan-rdma is an interface plugin"))
    assert ipam.severity == "error"
    nomaster = next(f for f in findings if f.message.startswith("master is not set"))
    assert nomaster.severity == "warn"  # no masters rule could list the default-route link
    assert len(findings) == 3  # deviceID (Multus') and cni.dev/* are a runtime's keys, not typos
    listed = roots.NodePolicy(masters=policy_checks.device_policy.rules_from_json([{"name": "eth0"}], "masters",
                                                                                   host_in_use=False))
    assert next(f for f in policy_checks.check_networks([typo], listed)
                if f.message.startswith("master is not set")).severity == "info"


def test_the_doctor_shows_what_the_policy_allows(tmp_path):
    """The allowances, and which of this node's links they allow now (a sysfs tree: a port with an
    RDMA device, a link a rule names, and one neither)."""
    sysroot = tmp_path / "sys-root"
    for name in ("ens1f0", "eth9", "veth1"):
        (sysroot / "sys" / "class" / "net" / name).mkdir(parents=True)
    (sysroot / "sys" / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    (sysroot / "sys" / "class" / "infiniband" / "mlx5_0" / "parent").write_text("ens1f0\n")
    path = tmp_path / "p.json"
    path.write_text('{"hostDevices": [{"name": "eth*", "hostInUse": true}], "masters": [{"name": "eth9"}], '
                    '"leaseNamespaces": ["rdmanet-system", "team-a"]}')
    os.chmod(path, 0o600)
    facts = policy_checks.gather(0, roots.load_policy_file(str(path)), str(path), str(sysroot))
    assert facts.masters_now == ["ens1f0", "eth9"] and facts.host_devices_now == ["eth9"]
    shown = {f.subject: f.message for f in policy_checks.check(facts) if f.severity == "info"}
    assert "ipam.kubernetes.namespace may be rdmanet-system, team-a" in shown["kubeconfigs"]
    assert shown["host devices"] == ('host-device-rdma moves the device a deviceID names (the device plugin\'s) and what '
                                     'hostDevices matches: {"name": "eth*", "hostInUse": true} (here: eth9); never a link '
                                     "the host uses unless its rule says hostInUse")
    assert shown["masters"] == ('macvlan-rdma and ipoib-rdma take as master links with an RDMA device and what masters '
                                'matches: {"name": "eth9"}; here: ens1f0, eth9')


def test_doctor_cli_judges_by_the_node_policy_it_is_given(tmp_path, capsys):
    import json

    from rdmanet.cli.main import main

    root = tmp_path / "roots" / "data"
    (root / "store").mkdir(parents=True)
    os.chmod(root / "store", 0o777)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"dataRoots": [str(root)], "logRoots": [], "kubeconfigs": [], "configRoots": [],
                                  "deviceInfoDir": str(tmp_path / "devinfo"), "hostDeviceStateDir": str(root / "hd")}))
    os.chmod(policy, 0o600)
    argv = ["doctor", "-o", "json", "--sysfs-root", str(tmp_path / "host"), "--proc-root", str(tmp_path / "host"),
            "--dev-root", str(tmp_path / "host"), "--cni-bin-dir", str(tmp_path / "bin"), "--cni-conf-dir",
            str(tmp_path / "net.d"), "--socket", str(tmp_path / "sock"), "--timeout", "1", "--node-policy", str(policy)]
    main(argv)
    doc = json.loads(capsys.readouterr().out)
    policy_findings = {f["subject"]: f for f in doc["findings"] if f["area"] == "policy"}
    assert policy_findings["node policy"]["message"] == f"roots from {policy}"
    assert policy_findings[str(root / "store")]["severity"] == "error"
    os.chmod(policy, 0o666)  # a policy others may write is refused, and said so
    main(argv)
    doc = json.loads(capsys.readouterr().out)
    (bad,) = [f for f in doc["findings"] if f["area"] == "policy"]
    assert bad["severity"] == "error" and "writable by nobody else" in bad["message"]
