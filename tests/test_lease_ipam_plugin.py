"""lease-ipam through rdmanet.cni.core.skel.handle and as a real ``python -m rdmanet.ipam`` exec."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.core.errors import (ADDRESS_UNAVAILABLE, CHECK_FAILED, INVALID_CONFIG, NOT_AVAILABLE, POOL_EXHAUSTED)
from rdmanet.ipam.plugin import LeaseIPAM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def netconf(data_dir, version="1.0.0", name="net-a", **ipam):
    ipam.setdefault("range", "10.0.0.0/24")
    return {"cniVersion": version, "name": name, "type": "macvlan", "ipam": {"type": "lease-ipam", "dataDir": str(data_dir), **ipam}}


def env(command, cid="ctr1", ifname="net1", args=""):
    out = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": ifname, "CNI_PATH": "/opt/cni/bin"}
    if args:
        out["CNI_ARGS"] = args
    return out


def call(command, conf, **kw):
    return skel.handle(LeaseIPAM(), env(command, **kw), json.dumps(conf).encode())


def store_files(data_dir, domain="net-a"):
    root = os.path.join(data_dir, domain)
    if not os.path.isdir(root):
        return [], []
    addrs = sorted(n for n in os.listdir(root) if n[0].isdigit() or ":" in n)
    return addrs, sorted(os.listdir(os.path.join(root, "attachments")))


@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_add_renders_abbreviated_result_per_version(tmp_path, version):
    conf = netconf(tmp_path, version, gateway="10.0.0.1", ipRanges=[{"range": "fd00::/64", "gateway": "fd00::1"}],
                   routes=[{"dst": "0.0.0.0/0"}, {"dst": "fd01::/64", "gw": "fd00::1"}], dns={"nameservers": ["10.0.0.53"]})
    code, out = call("ADD", conf)
    assert code == 0, out
    v4 = {"address": "10.0.0.2/24", "gateway": "10.0.0.1"}
    v6 = {"address": "fd00::2/64", "gateway": "fd00::1"}
    if version < "1.0.0":
        v4, v6 = {"version": "4", **v4}, {"version": "6", **v6}
    assert out == {"cniVersion": version, "ips": [v4, v6],
                   "routes": [{"dst": "0.0.0.0/0"}, {"dst": "fd01::/64", "gw": "fd00::1"}],
                   "dns": {"nameservers": ["10.0.0.53"]}}
    assert "interfaces" not in out


def test_repeat_add_same_addresses_and_del_idempotent(tmp_path):
    conf = netconf(tmp_path)
    _, first = call("ADD", conf)
    _, again = call("ADD", conf)
    assert first == again
    _, other = call("ADD", conf, cid="ctr2")
    assert other["ips"] != first["ips"]
    assert call("DEL", conf) == (0, None)
    assert call("DEL", conf) == (0, None)
    assert call("DEL", conf, cid="never-added") == (0, None)
    assert store_files(tmp_path) == (["10.0.0.2"], ["ctr2:net1"])


def test_del_works_when_ranges_no_longer_validate(tmp_path):
    call("ADD", netconf(tmp_path))
    broken = netconf(tmp_path, range="not-a-cidr")
    assert call("DEL", broken) == (0, None)
    assert store_files(tmp_path) == ([], [])


def test_del_with_empty_netns_releases(tmp_path):
    conf = netconf(tmp_path)
    call("ADD", conf)
    e = env("DEL")
    e["CNI_NETNS"] = ""
    assert skel.handle(LeaseIPAM(), e, json.dumps(conf).encode()) == (0, None)
    assert store_files(tmp_path) == ([], [])


@pytest.mark.parametrize("where", ["runtime", "args", "cni_args", "cni_args_bare"])
def test_requested_address_sources(tmp_path, where):
    conf = netconf(tmp_path, ipRanges=[{"range": "fd00::/64"}])
    kw = {}
    if where == "runtime":
        conf["runtimeConfig"] = {"ips": ["10.0.0.50/24", "fd00::50/64"]}
    elif where == "args":
        conf["args"] = {"cni": {"ips": ["10.0.0.50/24", "fd00::50/64"]}}
    elif where == "cni_args":
        kw["args"] = "IgnoreUnknown=1;IP=10.0.0.50/24,fd00::50/64"
    else:
        kw["args"] = "IP=10.0.0.50"
    code, out = call("ADD", conf, **kw)
    assert code == 0, out
    assert out["ips"][0]["address"] == "10.0.0.50/24"
    if where != "cni_args_bare":
        assert out["ips"][1]["address"] == "fd00::50/64"


def test_runtime_config_and_args_are_unioned_and_cni_args_ignored_then(tmp_path):
    conf = netconf(tmp_path, ipRanges=[{"range": "fd00::/64"}])
    conf["runtimeConfig"] = {"ips": ["10.0.0.50/24"]}
    conf["args"] = {"cni": {"ips": ["fd00::50/64"]}}
    code, out = call("ADD", conf, args="IP=10.0.0.99")
    assert [ip["address"] for ip in out["ips"]] == ["10.0.0.50/24", "fd00::50/64"]


@pytest.mark.parametrize("ips,word", [
    (["10.9.0.5/24"], "outside every range"),
    (["10.0.0.1"], "gateway"),
    (["10.0.0.7"], "excluded"),
    (["10.0.0.5", "10.0.0.6"], "same range set"),
])
def test_requested_address_errors(tmp_path, ips, word):
    conf = netconf(tmp_path, gateway="10.0.0.1", exclude=["10.0.0.7"])
    conf["runtimeConfig"] = {"ips": ips}
    code, out = call("ADD", conf)
    assert code == 1 and out["code"] == ADDRESS_UNAVAILABLE and word in out["msg"], out
    assert ips[0].split("/")[0] in out["msg"] and "runtimeConfig.ips[" in out["msg"]
    assert store_files(tmp_path) == ([], [])


def test_requested_address_taken_by_another(tmp_path):
    conf = netconf(tmp_path)
    conf["runtimeConfig"] = {"ips": ["10.0.0.50/24"]}
    assert call("ADD", conf)[0] == 0
    code, out = call("ADD", conf, cid="ctr2")
    assert code == 1 and out["code"] == ADDRESS_UNAVAILABLE and "ctr1/net1" in out["msg"]


def test_malformed_requested_address_is_config_error(tmp_path):
    conf = netconf(tmp_path)
    conf["args"] = {"cni": {"ips": ["banana"]}}
    code, out = call("ADD", conf)
    assert out["code"] == INVALID_CONFIG and "args.cni.ips[0]" in out["msg"]


def test_exhaustion_error_names_range_and_fix(tmp_path):
    conf = netconf(tmp_path, range="10.0.0.0/30")  # .1 .2
    assert call("ADD", conf, cid="a")[0] == 0
    assert call("ADD", conf, cid="b")[0] == 0
    code, out = call("ADD", conf, cid="c")
    assert code == 1 and out["code"] == POOL_EXHAUSTED
    assert out["msg"] == "no free address in range 10.0.0.0/30 (10.0.0.1-10.0.0.2)"
    assert "widen" in out["details"] and "DEL" in out["details"]
    assert store_files(tmp_path) == (["10.0.0.1", "10.0.0.2"], ["a:net1", "b:net1"])


def test_multi_range_add_is_all_or_nothing(tmp_path):
    conf = netconf(tmp_path, ipRanges=[{"range": "10.1.0.0/30"}])
    call("ADD", conf, cid="a")
    call("ADD", conf, cid="b")
    code, out = call("ADD", conf, cid="c")
    assert out["code"] == POOL_EXHAUSTED and "10.1.0.0/30" in out["msg"]
    assert store_files(tmp_path)[0] == ["10.0.0.1", "10.0.0.2", "10.1.0.1", "10.1.0.2"]


@pytest.mark.parametrize("ipam,field", [
    ({"range": "10.0.0.0/33"}, "ipam.range"),
    ({"exclude": ["10.0.0.0/24", "x.y"]}, "ipam.exclude[1]"),
    ({"range_start": "10.0.1.1"}, "ipam.range_start"),
])
def test_bad_config_answers_cni_error_and_leaves_nothing(tmp_path, ipam, field):
    code, out = call("ADD", netconf(tmp_path, **ipam))
    assert code == 1 and out["code"] == INVALID_CONFIG and field in out["msg"] and out["details"]
    assert not os.path.exists(tmp_path / "net-a")


def test_check(tmp_path):
    conf = netconf(tmp_path, version="1.1.0", ipRanges=[{"range": "fd00::/64"}])
    _, result = call("ADD", conf)
    assert call("CHECK", conf) == (0, None)
    assert call("CHECK", dict(conf, prevResult=result)) == (0, None)
    wrong = json.loads(json.dumps(result))
    wrong["ips"][0]["address"] = "10.0.0.99/24"
    code, out = call("CHECK", dict(conf, prevResult=wrong))
    assert out["code"] == CHECK_FAILED and "10.0.0.1/24" in out["msg"]
    extra = json.loads(json.dumps(result))
    extra["ips"].append({"address": "10.0.0.77/24"})
    assert call("CHECK", dict(conf, prevResult=extra))[1]["code"] == CHECK_FAILED
    code, out = call("CHECK", conf, cid="unknown")
    assert out["code"] == CHECK_FAILED and "unknown/net1" in out["msg"]
    # a config that grew a range set no longer matches the reservation
    grown = netconf(tmp_path, version="1.1.0", ipRanges=[{"range": "fd00::/64"}, {"range": "10.7.0.0/24"}])
    assert call("CHECK", grown)[1]["code"] == CHECK_FAILED
    os.unlink(tmp_path / "net-a" / "fd00::1")
    assert call("CHECK", conf)[1]["code"] == CHECK_FAILED


def test_gc_valid_attachments(tmp_path):
    conf = netconf(tmp_path, version="1.1.0")
    for cid in ("a", "b", "c"):
        call("ADD", conf, cid=cid)
    gc = dict(conf, **{"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "net1"}]})
    assert skel.handle(LeaseIPAM(), {"CNI_COMMAND": "GC", "CNI_PATH": "/x"}, json.dumps(gc).encode()) == (0, None)
    assert store_files(tmp_path) == (["10.0.0.1"], ["a:net1"])


def test_gc_legacy_key_and_missing_key(tmp_path):
    conf = netconf(tmp_path, version="1.1.0")
    for cid in ("a", "b"):
        call("ADD", conf, cid=cid)
    genv = {"CNI_COMMAND": "GC", "CNI_PATH": "/x"}
    assert skel.handle(LeaseIPAM(), genv, json.dumps(conf).encode()) == (0, None)
    assert store_files(tmp_path)[0] == ["10.0.0.1", "10.0.0.2"]  # no key: nothing freed
    legacy = dict(conf, **{"cni.dev/attachments": [{"containerID": "b", "ifname": "net1"}]})
    assert skel.handle(LeaseIPAM(), genv, json.dumps(legacy).encode()) == (0, None)
    assert store_files(tmp_path) == (["10.0.0.2"], ["b:net1"])
    bad = dict(conf, **{"cni.dev/valid-attachments": [{"containerID": 5}]})
    code, out = skel.handle(LeaseIPAM(), genv, json.dumps(bad).encode())
    assert out["code"] == INVALID_CONFIG and "cni.dev/valid-attachments[0]" in out["msg"]
    assert store_files(tmp_path)[0] == ["10.0.0.2"]


def test_status(tmp_path):
    conf = netconf(tmp_path, version="1.1.0", range="10.0.0.0/30")
    senv = {"CNI_COMMAND": "STATUS", "CNI_PATH": "/x"}
    assert skel.handle(LeaseIPAM(), senv, json.dumps(conf).encode()) == (0, None)
    call("ADD", conf, cid="a")
    call("ADD", conf, cid="b")
    code, out = skel.handle(LeaseIPAM(), senv, json.dumps(conf).encode())
    assert code == 1 and out["code"] == NOT_AVAILABLE and "10.0.0.0/30" in out["msg"]
    (tmp_path / "file").write_text("")
    code, out = skel.handle(LeaseIPAM(), senv, json.dumps(netconf(tmp_path / "file", version="1.1.0")).encode())
    assert out["code"] == NOT_AVAILABLE and "unusable" in out["msg"]


def test_network_name_shares_a_domain(tmp_path):
    a = netconf(tmp_path, name="net-a", network_name="shared")
    b = netconf(tmp_path, name="net-b", network_name="shared")
    assert call("ADD", a, cid="x")[1]["ips"][0]["address"] == "10.0.0.1/24"
    assert call("ADD", b, cid="y")[1]["ips"][0]["address"] == "10.0.0.2/24"
    assert sorted(os.listdir(tmp_path)) == ["shared"]


def test_log_file(tmp_path):
    log = tmp_path / "ipam.log"
    call("ADD", netconf(tmp_path, log_file=str(log), log_level="debug"))
    assert "ADD ctr1/net1" in log.read_text()


def test_log_settings_belong_to_their_call(tmp_path):
    """In the node daemon one process serves every network: one network's log_file/log_level
    must not catch another's records, nor outlive its call."""
    import threading

    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = netconf(tmp_path / "a", name="net-a", log_file=str(log_a), log_level="debug")
    b = netconf(tmp_path / "b", name="net-b", log_file=str(log_b), log_level="debug")
    threads = [threading.Thread(target=call, args=("ADD", conf), kwargs={"cid": cid})
               for conf, cid in ((a, "ctr-a"), (b, "ctr-b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    call("ADD", netconf(tmp_path / "c", name="net-c"), cid="ctr-c")  # no log settings
    assert "ctr-a" in log_a.read_text() and "ctr-b" not in log_a.read_text()
    assert "ctr-b" in log_b.read_text() and "ctr-a" not in log_b.read_text()
    assert "ctr-c" not in log_a.read_text() + log_b.read_text()


# -- real exec ------------------------------------------------------------------------------------

def run(command, conf, extra_env=None, **kw):
    e = dict(os.environ, **env(command, **kw), PYTHONPATH=ROOT, **(extra_env or {}))
    proc = subprocess.run([sys.executable, "-m", "rdmanet.ipam"], input=json.dumps(conf).encode(), env=e,
                          capture_output=True, cwd=ROOT, timeout=60)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc.stderr.decode()


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_exec_add_check_del(tmp_path, version):
    conf = netconf(tmp_path, version, gateway="10.0.0.1")
    code, out, err = run("ADD", conf)
    assert code == 0, err
    ip = {"address": "10.0.0.2/24", "gateway": "10.0.0.1"}
    assert out == {"cniVersion": version, "ips": [ip if version >= "1.0.0" else {"version": "4", **ip}], "dns": {}}
    if version >= "0.4.0":
        assert run("CHECK", dict(conf, prevResult=out))[:2] == (0, None)
    assert run("DEL", conf)[:2] == (0, None)
    assert store_files(tmp_path) == ([], [])


def test_exec_error_json_on_stdout(tmp_path):
    code, out, err = run("ADD", netconf(tmp_path, range="10.0.0.0/24", range_start="10.9.9.9"))
    assert code == 1 and out["code"] == INVALID_CONFIG and "ipam.range_start" in out["msg"] and "inside" in out["details"]
    assert not os.path.exists(tmp_path / "net-a")


def test_exec_version():
    e = dict(os.environ, CNI_COMMAND="VERSION", PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "rdmanet.ipam"], env=e, capture_output=True, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0 and "1.1.0" in json.loads(proc.stdout)["supportedVersions"]
