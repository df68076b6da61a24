"""Node-owned roots (rdmanet.cni.linux.roots): where a network config may steer a path, and how it is opened.

Fake trees in temporary directories; the attacks are the ones a tenant's NAD can try: a path
outside the roots, ``..``, a symlink planted at the file or at a directory on the way, a directory
others may write or another user owns, an existing file whose mode must not change.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from rdmanet.cni.core.errors import INVALID_CONFIG, CNIError
from rdmanet.cni.linux import roots
from policy_file import write_policy


def mode_of(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A root, a victim outside it, and a node policy whose every root is ``root``."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir(mode=0o755)
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("precious\n")
    os.chmod(victim, 0o600)
    policy = write_policy(tmp_path / "policy.json", logRoots=[str(root)], dataRoots=[str(root)],
                          kubeconfigs=[f"{root}/*"], configRoots=[str(root)], deviceInfoDir=str(root),
                          hostDeviceStateDir=str(root / "hd"))
    monkeypatch.setenv(roots.POLICY_ENV, str(policy))
    return root, outside, victim


def refused(fn, *args, **kw) -> CNIError:
    with pytest.raises(CNIError) as err:
        fn(*args, **kw)
    assert err.value.code == INVALID_CONFIG, err.value
    return err.value


# --------------------------------------------------------------------------- placing a path


@pytest.mark.parametrize("path, problem", [
    ("/etc/passwd", "outside the allowed roots"),
    ("relative/file", "not an absolute path"),
    ("/ROOT/../outside/victim", "'..'"),
    ("/ROOT/a/../../outside/victim", "'..'"),
    ("/ROOTx/file", "outside the allowed roots"),  # a prefix of the name is not the directory
    (5, "not an absolute path"),
    ("/ROOT/a\0b", "not an absolute path"),
])
def test_place_refuses_paths_outside_naming_key_path_and_roots(tree, path, problem):
    root, _, _ = tree
    if isinstance(path, str):
        path = path.replace("/ROOT", str(root))
    err = refused(roots.place, "ipam.dataDir", path, (str(root),))
    assert err.msg.startswith("invalid network config: ipam.dataDir: ") and problem in err.msg
    assert str(root) in err.msg and "node owner" in err.details


def test_place_accepts_the_root_and_below_also_through_its_resolved_form(tmp_path):
    real = tmp_path / "run"
    (real / "devinfo").mkdir(parents=True)
    alias = tmp_path / "var-run"
    alias.symlink_to(real)  # like /var/run -> /run
    assert roots.place("k", str(alias / "devinfo" / "f"), (str(alias),)).parts == ("devinfo", "f")
    assert roots.place("k", str(real / "devinfo" / "f"), (str(alias),)).parts == ("devinfo", "f")
    assert roots.place("k", str(real) + "//devinfo/", (str(real),)).parts == ("devinfo",)


# --------------------------------------------------------------------------- opening files


def test_symlink_planted_at_the_file_is_refused_not_followed(tree):
    root, _, victim = tree
    (root / "log").symlink_to(victim)
    err = refused(roots.open_file, "log", "ipam.log_file", str(root / "log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    assert "symlink" in err.msg and str(root / "log") in err.msg
    assert victim.read_text() == "precious\n" and mode_of(victim) == 0o600


def test_symlink_planted_as_a_directory_on_the_way_is_refused(tree):
    root, outside, victim = tree
    (root / "sub").symlink_to(outside)
    for fn, args in ((roots.open_file, ("log", "ipam.log_file", str(root / "sub" / "victim"), os.O_WRONLY | os.O_CREAT)),
                     (roots.read_file, ("kubeconfig", "ipam.kubernetes.kubeconfig", str(root / "sub" / "victim"))),
                     (roots.check_dir, ("data", "ipam.dataDir", str(root / "sub" / "store")))):
        err = refused(fn, *args)
        assert "symlink" in err.msg, err.msg
    assert victim.read_text() == "precious\n"
    assert sorted(os.listdir(outside)) == ["victim"]


def test_directories_others_may_write_or_own_are_refused(tree):
    root, _, _ = tree
    shared = root / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    err = refused(roots.check_dir, "data", "ipam.dataDir", str(shared / "store"))
    assert "mode 1777" in err.msg
    foreign = root / "foreign"
    foreign.mkdir()
    os.chown(foreign, 65534, 65534)
    err = refused(roots.open_file, "log", "ipam.log_file", str(foreign / "x.log"), os.O_WRONLY | os.O_CREAT)
    assert "uid 65534" in err.msg
    assert not (foreign / "x.log").exists()


def test_existing_file_written_must_be_ours_and_private(tree):
    root, _, _ = tree
    log = root / "shared.log"
    log.write_text("")
    os.chmod(log, 0o666)
    refused(roots.open_file, "log", "ipam.log_file", str(log), os.O_WRONLY | os.O_APPEND)
    fd = roots.open_file("log", "ipam.log_file", str(log), os.O_RDONLY)  # reading is fine
    os.close(fd)


def test_created_directories_are_0700_and_files_take_the_mode_given(tree):
    root, _, _ = tree
    old = os.umask(0)
    try:
        fd = roots.open_file("log", "ipam.log_file", str(root / "a" / "b" / "x.log"), os.O_WRONLY | os.O_CREAT,
                             mode=0o600, create_dirs=True)
    finally:
        os.umask(old)
    os.close(fd)
    assert (mode_of(root / "a"), mode_of(root / "a" / "b"), mode_of(root / "a" / "b" / "x.log")) == (0o700, 0o700, 0o600)


def test_check_dir_accepts_a_missing_tail_and_a_file_left_to_the_caller(tree):
    root, _, _ = tree
    assert roots.check_dir("data", "ipam.dataDir", str(root / "not" / "yet")) == str(root / "not" / "yet")
    (root / "file").write_text("")
    assert roots.check_dir("data", "ipam.dataDir", str(root / "file" / "x")) == str(root / "file" / "x")


def test_read_file_is_bounded(tree):
    root, _, _ = tree
    (root / "big").write_bytes(b"x" * 2048)
    err = refused(roots.read_file, "kubeconfig", "ipam.kubernetes.kubeconfig", str(root / "big"), limit=1024)
    assert "larger than 1024 bytes" in err.msg


def test_replace_file_keeps_the_mode_of_an_existing_file_and_refuses_a_symlink(tree):
    root, _, victim = tree
    existing = root / "f"
    existing.write_text("{}")
    os.chmod(existing, 0o600)
    roots.replace_file("k", str(existing), b"new", roots=(str(root),), new_mode=0o644)
    assert existing.read_bytes() == b"new" and mode_of(existing) == 0o600
    (root / "link").symlink_to(victim)
    err = refused(roots.replace_file, "k", str(root / "link"), b"evil", roots=(str(root),))
    assert "symlink" in err.msg
    assert os.path.islink(root / "link") and victim.read_text() == "precious\n"
    assert [n for n in os.listdir(root) if n.endswith(".tmp")] == []


def test_ensure_dir_makes_a_private_directory_and_refuses_a_planted_symlink(tmp_path):
    assert roots.ensure_dir(str(tmp_path / "hd")) == str(tmp_path / "hd")
    assert mode_of(tmp_path / "hd") == 0o700
    (tmp_path / "planted").symlink_to(tmp_path / "hd")
    with pytest.raises(CNIError) as err:
        roots.ensure_dir(str(tmp_path / "planted"))
    assert "symlink" in err.value.msg


# --------------------------------------------------------------------------- the policy


def test_defaults_without_a_policy_file(monkeypatch):
    monkeypatch.delenv(roots.POLICY_ENV)
    monkeypatch.setattr(roots, "DEFAULT_POLICY_FILE", "/nonexistent/node-policy.json")
    policy = roots.current()
    assert policy == roots.NodePolicy()
    assert (policy.log_roots, policy.data_roots, policy.config_roots) == (
        ("/var/log/rdmanet",), ("/var/lib/cni",), ("/etc/cni/net.d",))
    assert policy.kubeconfigs == ("/etc/cni/net.d/rdmanet.d/rdmanet.kubeconfig",
                                  "/etc/cni/net.d/whereabouts.d/whereabouts.kubeconfig")
    assert policy.device_info_dir == "/var/run/k8s.cni.cncf.io/devinfo/cni"
    assert policy.host_device_state_dir == "/var/lib/cni/host-device-rdma"
    assert policy.lease_namespaces == ("rdmanet-system",)
    assert policy.pool_namespaces == ("kube-system", "nvidia-network-operator")  # nv-ipam's, then the Network Operator's
    assert (policy.host_devices, policy.host_devices_from_device_id, policy.masters, policy.rdma_masters) == (
        (), True, (), True)


def test_policy_file_replaces_the_keys_it_names(tmp_path):
    path = write_policy(tmp_path / "p.json", dataRoots=["/srv/cni", "/var/lib/cni/"], leaseNamespaces=["rdmanet-system"])
    policy = roots.load_policy_file(str(path))
    assert policy.data_roots == ("/srv/cni", "/var/lib/cni") and policy.log_roots == ("/var/log/rdmanet",)
    assert policy.lease_namespaces == ("rdmanet-system",)
    assert policy.widened("log", "/srv/log").log_roots == ("/var/log/rdmanet", "/srv/log")


@pytest.mark.parametrize("content, mode, problem", [
    ({"dataRoots": ["relative"]}, 0o600, "absolute"),
    ({"dataRoots": "/var/lib/cni"}, 0o600, "list"),
    ({"logRoot": ["/x"]}, 0o600, "unknown keys"),
    ({"leaseNamespaces": ["Not_A_Namespace"]}, 0o600, "namespace"),
    ({"poolNamespaces": None}, 0o600, "poolNamespaces must be a list"),
    ({"poolNamespaces": ["kube_system"]}, 0o600, "poolNamespaces must be a list"),
    ({"dataRoots": ["/x"]}, 0o666, "writable by nobody else"),
    ("not json", 0o600, "not valid JSON"),
])
def test_unusable_policy_files_are_refused(tmp_path, content, mode, problem):
    path = tmp_path / "p.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    os.chmod(path, mode)
    with pytest.raises(roots.PolicyError) as err:
        roots.load_policy_file(str(path))
    assert problem in str(err.value)


def test_a_policy_file_of_another_user_or_through_a_symlink_is_refused(tmp_path):
    path = write_policy(tmp_path / "p.json", dataRoots=["/"])
    os.chown(path, 65534, 65534)
    with pytest.raises(roots.PolicyError, match="owned by uid"):
        roots.load_policy_file(str(path))
    os.chown(path, 0, 0)
    (tmp_path / "link.json").symlink_to(path)
    with pytest.raises(roots.PolicyError):
        roots.load_policy_file(str(tmp_path / "link.json"))


def test_a_call_reads_the_policy_its_runtime_names_and_a_bad_one_is_a_cni_error(tmp_path, monkeypatch):
    from rdmanet.cni.core import env as request_env

    mine = write_policy(tmp_path / "mine.json", dataRoots=["/srv/mine"])
    with request_env.scoped({roots.POLICY_ENV: str(mine)}):
        assert roots.current().data_roots == ("/srv/mine",)
    (tmp_path / "bad.json").write_text("{")
    os.chmod(tmp_path / "bad.json", 0o600)
    with request_env.scoped({roots.POLICY_ENV: str(tmp_path / "bad.json")}):
        with pytest.raises(CNIError) as err:
            roots.current()
    assert err.value.code == INVALID_CONFIG and "node policy" in err.value.msg


def test_daemon_flags_build_the_policy(tmp_path, monkeypatch):
    import argparse

    from rdmanet.cli.node_policy import from_args, register

    parser = argparse.ArgumentParser()
    register(parser)
    assert from_args(parser.parse_args([])) is None  # no flag: each call reads the file anew
    monkeypatch.delenv(roots.POLICY_ENV)
    monkeypatch.setattr(roots, "DEFAULT_POLICY_FILE", "/nonexistent/node-policy.json")
    policy = from_args(parser.parse_args(["--allow-root", "log=/tmp/wb", "--host-device-state-dir", "/srv/hd",
                                          "--lease-namespace", "rdmanet-system", "--device-info-dir", "/run/devinfo"]))
    assert policy.log_roots == ("/var/log/rdmanet", "/tmp/wb") and policy.host_device_state_dir == "/srv/hd"
    assert policy.lease_namespaces == ("rdmanet-system",) and policy.device_info_dir == "/run/devinfo"
    policy = from_args(parser.parse_args(["--allow-kubeconfig", "/etc/lease/lease.kubeconfig"]))
    assert policy.kubeconfigs == (*roots.NodePolicy().kubeconfigs, "/etc/lease/lease.kubeconfig")
    for bad in (["--allow-root", "log"], ["--allow-root", "secrets=/x"], ["--allow-root", "log=rel"],
                ["--allow-root", "kubeconfig=/etc/cni/net.d"], ["--allow-kubeconfig", "rel.kubeconfig"]):
        with pytest.raises(roots.PolicyError):
            from_args(parser.parse_args(bad))


def test_lease_namespace_limit():
    roots.NodePolicy(lease_namespaces=None).check_lease_namespace("anything")  # null: the credentials' RBAC decides
    limited = roots.NodePolicy()  # default: rdmanet-system only
    limited.check_lease_namespace("rdmanet-system")
    err = refused(limited.check_lease_namespace, "kube-system")
    assert "kube-system" in err.msg and "rdmanet-system" in err.msg and "ipam.kubernetes.namespace" in err.msg


def test_pool_namespaces_from_the_file_and_the_flag_bound_a_nads_pool_namespace(tmp_path, monkeypatch):
    import argparse

    from rdmanet.cli.node_policy import from_args, register

    policy = roots.load_policy_file(str(write_policy(tmp_path / "p.json", poolNamespaces=["nv-ipam", "nv-ipam"])))
    assert policy.pool_namespaces == ("nv-ipam",)
    policy.check_pool_namespace("nv-ipam")
    err = refused(policy.check_pool_namespace, "team-a")
    assert "ipam.poolNamespace" in err.msg and "'team-a'" in err.msg and "(allowed: nv-ipam)" in err.msg
    assert "(poolNamespaces)" in err.details
    parser = argparse.ArgumentParser()
    register(parser)
    monkeypatch.delenv(roots.POLICY_ENV)
    monkeypatch.setattr(roots, "DEFAULT_POLICY_FILE", "/nonexistent/node-policy.json")
    flags = from_args(parser.parse_args(["--pool-namespace", "team-pools", "--pool-namespace", "kube-system"]))
    assert flags.pool_namespaces == ("team-pools", "kube-system")  # in the order given: looked in in that order
    with pytest.raises(roots.PolicyError):
        from_args(parser.parse_args(["--pool-namespace", "Bad_NS"]))
