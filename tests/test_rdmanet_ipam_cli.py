"""``rdmanet ipam ls``: stores populated through the real plugin (skel.handle + LeaseIPAM)."""

from __future__ import annotations

import io
import json
import os

import pytest

from rdmanet.cni.core import skel
from rdmanet.ipam.plugin import LeaseIPAM
from rdmanet.cli import ipam_cli
from rdmanet.cli.main import main


def netconf(data_dir, name="net-a", **ipam):
    ipam.setdefault("range", "10.0.0.0/29")
    return {"cniVersion": "1.0.0", "name": name, "type": "macvlan-rdma",
            "ipam": {"type": "lease-ipam", "dataDir": str(data_dir), **ipam}}


def add(conf, cid, ifname="net1"):
    env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": ifname,
           "CNI_PATH": "/opt/cni/bin"}
    code, out = skel.handle(LeaseIPAM(), env, json.dumps(conf).encode())
    assert code == 0, out
    return out


def write_conf(tmp_path, conf, name="net.json"):
    path = tmp_path / name
    path.write_text(json.dumps(conf))
    return str(path)


def run(capsys, *argv):
    code = main(["ipam", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ls_json_with_config_lists_claims_and_range_counts(tmp_path, capsys):
    data = tmp_path / "data"
    conf = netconf(data, ipRanges=[{"range": "fd00::/64"}])
    add(conf, "c" * 64)
    add(conf, "ctr2", "net2")
    code, out, _ = run(capsys, "ls", "--network-config", write_conf(tmp_path, conf), "-o", "json")
    assert code == 0
    doc = json.loads(out)
    [net] = doc["networks"]
    assert net["domain"] == "net-a" and net["store"] == "local"
    assert [(c["address"], c["containerID"], c["ifname"]) for c in net["claims"]] == [
        ("10.0.0.1", "c" * 64, "net1"), ("10.0.0.2", "ctr2", "net2"),
        ("fd00::1", "c" * 64, "net1"), ("fd00::2", "ctr2", "net2")]
    for claim in net["claims"]:
        assert set(claim) == {"address", "network", "containerID", "ifname", "pod", "node", "age_seconds"}
        assert claim["network"] == "net-a" and claim["pod"] is None and claim["node"] is None
        assert isinstance(claim["age_seconds"], int) and 0 <= claim["age_seconds"] < 60
    v4, v6 = net["ranges"]
    # a /29: .1-.6 usable, the whereabouts form has no default gateway
    assert v4 == {"range": "10.0.0.0/29 (10.0.0.1-10.0.0.6)", "size": 6, "used": 2, "free": 4}
    assert v6["size"] == 2 ** 64 - 2 and v6["used"] == 2 and v6["free"] == 2 ** 64 - 4


def test_ls_table_default(tmp_path, capsys):
    data = tmp_path / "data"
    conf = netconf(data)
    add(conf, "0123456789abcdef0123")
    code, out, _ = run(capsys, "ls", "--network-config", write_conf(tmp_path, conf))
    assert code == 0
    assert "net-a  (local store" in out
    assert "ADDRESS" in out and "10.0.0.1" in out and "0123456789ab/net1" in out
    assert "RANGE" in out and "10.0.0.0/29" in out
    row = next(line for line in out.splitlines() if "10.0.0.0/29" in line)
    assert row.split()[-3:] == ["6", "1", "5"]


def test_ls_without_config_lists_every_domain_claims_only(tmp_path, capsys):
    data = tmp_path / "data"
    add(netconf(data, name="net-a"), "ctr1")
    add(netconf(data, name="net-b", range="10.9.0.0/24"), "ctr2")
    add(netconf(data, name="net-c", network_name="shared", range="10.7.0.0/24"), "ctr3")
    add(netconf(data, name="net-d", network_name="shared", range="10.7.0.0/24"), "ctr4")
    code, out, _ = run(capsys, "ls", "--data-dir", str(data), "-o", "json")
    assert code == 0
    nets = json.loads(out)["networks"]
    assert [n["domain"] for n in nets] == ["net-a", "net-b", "shared"]
    assert all(n["ranges"] == [] for n in nets)
    shared = nets[2]["claims"]
    assert [(c["address"], c["network"]) for c in shared] == [("10.7.0.1", "net-c"), ("10.7.0.2", "net-d")]

    # --network: a whole domain by its name, or the claims made for one network of a shared domain
    code, out, _ = run(capsys, "ls", "--data-dir", str(data), "--network", "net-b", "-o", "json")
    assert [n["domain"] for n in json.loads(out)["networks"]] == ["net-b"]
    code, out, _ = run(capsys, "ls", "--data-dir", str(data), "--network", "net-d", "-o", "json")
    [only] = json.loads(out)["networks"]
    assert only["domain"] == "shared" and [c["containerID"] for c in only["claims"]] == ["ctr4"]
    code, out, _ = run(capsys, "ls", "--data-dir", str(data), "--network", "nope", "-o", "json")
    assert json.loads(out) == {"networks": []}


def test_ls_empty_or_missing_data_dir(tmp_path, capsys):
    code, out, _ = run(capsys, "ls", "--data-dir", str(tmp_path / "missing"), "-o", "json")
    assert code == 0 and json.loads(out) == {"networks": []}
    code, out, _ = run(capsys, "ls", "--data-dir", str(tmp_path / "missing"))
    assert code == 0 and "no lease-ipam networks" in out


def test_ls_config_before_any_add_shows_full_ranges(tmp_path, capsys):
    conf = netconf(tmp_path / "data")
    code, out, _ = run(capsys, "ls", "--network-config", write_conf(tmp_path, conf), "-o", "json")
    [net] = json.loads(out)["networks"]
    assert net["claims"] == [] and net["ranges"][0]["free"] == 6 and net["ranges"][0]["used"] == 0


def test_ls_accepts_conflist_and_nad_object(tmp_path, capsys):
    data = tmp_path / "data"
    conf = netconf(data)
    add(conf, "ctr1")
    plugin = {k: v for k, v in conf.items() if k not in ("name", "cniVersion")}
    conflist = {"cniVersion": "1.0.0", "name": "net-a", "plugins": [plugin, {"type": "tuning"}]}
    nad = {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
           "metadata": {"name": "net-a"}, "spec": {"config": json.dumps(conf)}}
    for doc in (conflist, nad):
        code, out, _ = run(capsys, "ls", "--network-config", write_conf(tmp_path, doc), "-o", "json")
        assert code == 0
        assert [c["address"] for c in json.loads(out)["networks"][0]["claims"]] == ["10.0.0.1"]


def test_ls_bad_config_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    code, out, err = run(capsys, "ls", "--network-config", str(path))
    assert code == 2 and out == "" and "neither JSON nor YAML" in err
    path.write_text(json.dumps(netconf(tmp_path, range="10.0.0.0/33")))
    code, out, err = run(capsys, "ls", "--network-config", str(path))
    assert code == 2 and "ipam.range" in err
    code, out, err = run(capsys, "ls", "--network-config", str(tmp_path / "absent.json"))
    assert code == 2 and "cannot read" in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a store the test user cannot lock")
def test_ls_works_without_write_access():
    """A root-owned store, readable by others (lock file 0600): the listing falls back to a lock-free read."""
    import shutil
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(prefix="rdmanet-ls-"))  # pytest's tmp_path parents are 0700
    try:
        _check_ls_as_nobody(tmp_path)
    finally:
        shutil.rmtree(tmp_path)


def _check_ls_as_nobody(tmp_path):
    data = tmp_path / "data"
    conf = netconf(data)
    add(conf, "ctr1")
    for dirpath, dirs, files in os.walk(tmp_path):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    os.chmod(data / "net-a" / "lock", 0o600)
    pid = os.fork()
    if pid == 0:  # child: drop to nobody and list
        try:
            os.setgid(65534)
            os.setuid(65534)
            buf = io.StringIO()
            views = ipam_cli.list_claims(data_dir=str(data))
            buf.write(json.dumps(ipam_cli.report_json(views)))
            ok = [c["address"] for c in json.loads(buf.getvalue())["networks"][0]["claims"]] == ["10.0.0.1"]
            ok = ok and "without the store lock" in ipam_cli.render_table(views)
            os._exit(0 if ok else 1)
        except BaseException as exc:
            os.write(2, f"child: {exc!r}\n".encode())
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_read_local_unlocked_matches_store_list(tmp_path):
    from rdmanet.ipam.store.local import LocalStore

    data = tmp_path / "data"
    conf = netconf(data, ipRanges=[{"range": "fd00::/120"}])
    for i in range(3):
        add(conf, f"ctr{i}")
    assert ipam_cli.read_local_unlocked(str(data / "net-a")) == LocalStore(str(data), "net-a").list()


def test_human_age():
    assert [ipam_cli.human_age(s) for s in (None, 5, 61, 7200, 90000)] == ["-", "5s", "1m", "2h", "1d"]


def test_reconcile_all_takes_the_operators_kubeconfig_and_namespace(tmp_path, capsys, monkeypatch):
    """The node policy bounds what a network config names; ``--kubeconfig`` and ``--namespace`` on
    the operator's command line are allowed for that run (a copied reconciler CronJob for another
    namespace works), and nothing more: the same namespace in a NAD is still refused."""
    from kube_api_server import KubeAPIServer, write_kubeconfig
    from policy_file import write_policy
    from rdmanet.cni.linux import roots

    policy = write_policy(tmp_path / "p.json", leaseNamespaces=["rdmanet-system"])  # lists no kubeconfig of the test's
    monkeypatch.setenv(roots.POLICY_ENV, str(policy))
    with KubeAPIServer() as server:
        kubeconfig = write_kubeconfig(tmp_path / "operator.kubeconfig", server.url, namespace="rdmanet-system")
        code, out, err = run(capsys, "reconcile", "--all", "--kubeconfig", kubeconfig, "--namespace", "team-x",
                             "--dry-run", "-o", "json")
        assert code == 0, err
        assert json.loads(out)["namespace"] == "team-x"
        assert roots.current().lease_namespaces == ("rdmanet-system",)  # the run's allowance is gone
        conf = {"cniVersion": "1.0.0", "name": "n", "type": "macvlan-rdma",
                "ipam": {"type": "lease-ipam", "range": "10.0.0.0/29",
                         "kubernetes": {"kubeconfig": kubeconfig, "namespace": "team-x"}}}
        env = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
               "CNI_PATH": "/opt/cni/bin", roots.POLICY_ENV: str(policy)}
        code, out = skel.handle(LeaseIPAM(), env, json.dumps(conf).encode())
        assert code == 1 and out["code"] == 7 and "ipam.kubernetes.kubeconfig" in out["msg"]
