"""The CNI protocol core: env validation, version gating, CNI_ARGS, errors, dispatch."""

import json

import pytest

from rdmanet.cni.core import skel
from rdmanet.cni.core.args import parse_cni_args
from rdmanet.cni.core.errors import CNIError
from rdmanet.cni.core.result import Interface, IPConfig, Result

BASE_ENV = {
    "CNI_COMMAND": "ADD",
    "CNI_CONTAINERID": "ctr-1",
    "CNI_NETNS": "/run/netns/x",
    "CNI_IFNAME": "net1",
    "CNI_PATH": "/opt/cni/bin",
}


class Recorder:
    """A plugin that records the calls it gets and returns a fixed address."""

    def __init__(self):
        self.calls = []

    def add(self, inv):
        self.calls.append(("ADD", inv))
        import ipaddress

        return Result(interfaces=[Interface("net1", "0a:00:00:00:00:01", inv.netns, mtu=1500)],
                      ips=[IPConfig(ipaddress.ip_interface("10.0.0.2/24"), interface=0)])

    def delete(self, inv):
        self.calls.append(("DEL", inv))

    def check(self, inv):
        self.calls.append(("CHECK", inv))

    def gc(self, inv):
        self.calls.append(("GC", inv))

    def status(self, inv):
        self.calls.append(("STATUS", inv))


def conf(version="1.0.0", **extra):
    data = {"cniVersion": version, "name": "net-a", "type": "x", **extra}
    return json.dumps(data).encode()


def call(env_changes=None, stdin=None, plugin=None):
    env = dict(BASE_ENV)
    for key, value in (env_changes or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return skel.handle(plugin or Recorder(), env, conf() if stdin is None else stdin)


def test_version_ignores_stdin_and_reports_latest():
    code, doc = call({"CNI_COMMAND": "VERSION"}, stdin=b"not json")
    assert code == 0
    assert doc == {"cniVersion": "1.1.0", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]}


@pytest.mark.parametrize("missing", [["CNI_NETNS"], ["CNI_NETNS", "CNI_IFNAME"], ["CNI_CONTAINERID", "CNI_PATH"]])
def test_add_names_every_missing_variable(missing):
    code, doc = call({name: None for name in missing})
    assert code == 1 and doc["code"] == 4
    for name in missing:
        assert name in doc["msg"]


def test_del_allows_empty_netns():
    plugin = Recorder()
    code, doc = call({"CNI_COMMAND": "DEL", "CNI_NETNS": ""}, plugin=plugin)
    assert (code, doc) == (0, None)
    assert plugin.calls[0][1].netns == ""


def test_unknown_command():
    code, doc = call({"CNI_COMMAND": "FROB"})
    assert doc["code"] == 4 and "FROB" in doc["msg"]


@pytest.mark.parametrize("cid", ["-abc", "a b", "abc/def", "ctr;x", "ä"])
def test_container_id_regex(cid):
    code, doc = call({"CNI_CONTAINERID": cid})
    assert code == 1 and doc["code"] == 4 and "CNI_CONTAINERID" in doc["msg"]


@pytest.mark.parametrize("ifname", ["a" * 16, "net/1", "net:1", "net 1", ".", ".."])
def test_ifname_rules(ifname):
    code, doc = call({"CNI_IFNAME": ifname})
    assert doc["code"] == 4 and "CNI_IFNAME" in doc["msg"] and doc["details"]


def test_ifname_of_15_chars_is_fine():
    assert call({"CNI_IFNAME": "a" * 15})[0] == 0


def test_invalid_json_is_decoding_failure_in_latest_version():
    code, doc = call(stdin=b"{not json")
    assert code == 1 and doc["code"] == 6 and doc["cniVersion"] == "1.1.0"


@pytest.mark.parametrize("version", ["0.2.0", "0.1.0", "2.0.0", "1.0"])
def test_unsupported_version(version):
    code, doc = call(stdin=conf(version))
    assert doc["code"] == 1 and version in doc["msg"]


def test_missing_cni_version_means_0_1_0_which_is_unsupported():
    code, doc = call(stdin=json.dumps({"name": "n", "type": "x"}).encode())
    assert doc["code"] == 1 and "0.1.0" in doc["msg"]


@pytest.mark.parametrize("command,version,ok", [
    ("CHECK", "0.3.1", False), ("CHECK", "0.4.0", True), ("GC", "1.0.0", False), ("GC", "1.1.0", True),
    ("STATUS", "1.0.0", False), ("STATUS", "1.1.0", True), ("DEL", "0.3.0", True),
])
def test_verb_gating(command, version, ok):
    code, doc = call({"CNI_COMMAND": command}, stdin=conf(version))
    if ok:
        assert code == 0
    else:
        assert doc["code"] == 1 and command in doc["msg"] and doc["cniVersion"] == version


def test_gc_needs_only_cni_path():
    env = {"CNI_COMMAND": "GC", "CNI_PATH": "/opt/cni/bin"}
    code, doc = skel.handle(Recorder(), env, conf("1.1.0"))
    assert code == 0
    code, doc = skel.handle(Recorder(), {"CNI_COMMAND": "GC"}, conf("1.1.0"))
    assert doc["code"] == 4 and "CNI_PATH" in doc["msg"]


@pytest.mark.parametrize("name", [None, "", "bad name", "-x"])
def test_network_name_validated(name):
    data = {"cniVersion": "1.0.0", "type": "x"}
    if name is not None:
        data["name"] = name
    code, doc = call(stdin=json.dumps(data).encode())
    assert doc["code"] == 7 and "name" in doc["msg"]


def test_result_rendered_in_requested_version():
    code, doc = call(stdin=conf("0.3.1"))
    assert doc["cniVersion"] == "0.3.1"
    assert doc["ips"][0]["version"] == "4"
    assert "mtu" not in doc["interfaces"][0]
    code, doc = call(stdin=conf("1.0.0"))
    assert "version" not in doc["ips"][0] and "mtu" not in doc["interfaces"][0]
    code, doc = call(stdin=conf("1.1.0"))
    assert doc["interfaces"][0]["mtu"] == 1500


def test_plugin_error_is_json_with_code_and_config_version():
    class Failing(Recorder):
        def add(self, inv):
            raise CNIError(102, "no free address", "free some")

    code, doc = call(stdin=conf("0.4.0"), plugin=Failing())
    assert (code, doc) == (1, {"cniVersion": "0.4.0", "code": 102, "msg": "no free address", "details": "free some"})


def test_bug_becomes_code_999_and_traceback_goes_to_stderr(capsys):
    class Buggy(Recorder):
        def add(self, inv):
            raise KeyError("oops")

    code, doc = call(plugin=Buggy())
    assert code == 1 and doc["code"] == 999 and "KeyError" in doc["msg"]
    assert "Traceback" in capsys.readouterr().err


def test_main_prints_only_json_on_stdout(capsys):
    import io

    out = io.StringIO()
    code = skel.main(Recorder(), dict(BASE_ENV), io.BytesIO(conf()), out)
    assert code == 0
    assert json.loads(out.getvalue())["interfaces"][0]["name"] == "net1"


class TestCniArgs:
    def test_multus_style_duplicates_last_wins_and_equals_in_value(self):
        raw = "IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_NAME=q;X=a=b;;MAC=0a:00:00:00:00:01"
        args = parse_cni_args(raw)
        assert args["K8S_POD_NAME"] == "q"
        assert args["X"] == "a=b"
        assert args["MAC"] == "0a:00:00:00:00:01"

    def test_empty(self):
        assert parse_cni_args("") == {}

    @pytest.mark.parametrize("raw", ["novalue", "=x", "a=1;broken"])
    def test_pair_without_key_or_equals(self, raw):
        with pytest.raises(CNIError) as err:
            parse_cni_args(raw)
        assert err.value.code == 4 and "CNI_ARGS" in err.value.msg

    def test_bad_cni_args_reported_as_json(self):
        code, doc = call({"CNI_ARGS": "garbage"})
        assert doc["code"] == 4
