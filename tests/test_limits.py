"""Bounded work per call (rdmanet.cni.core.limits): a NAD cannot make a plugin, or the daemon, hang or grow."""

from __future__ import annotations

import io
import json
import time

import pytest

from rdmanet.cni.core import limits, skel
from rdmanet.ipam.plugin import LeaseIPAM

ENV = {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "net1",
       "CNI_PATH": "/opt/cni/bin"}


def conf(tmp_path, **ipam):
    return {"cniVersion": "1.0.0", "name": "big", "type": "macvlan-rdma",
            "ipam": {"type": "lease-ipam", "range": "10.0.0.0/8", "dataDir": str(tmp_path), **ipam}}


def handle(stdin: bytes, env=ENV):
    started = time.monotonic()
    code, out = skel.handle(LeaseIPAM(), env, stdin)
    return code, out, time.monotonic() - started


@pytest.mark.parametrize("key, entry", [
    ("exclude", lambda i: f"10.{i // 250}.{i % 250}.1/32"),
    ("routes", lambda i: {"dst": f"10.{i // 250}.{i % 250}.0/24"}),
    ("ipRanges", lambda i: {"range": f"fd{i:02x}::/64"}),
])
def test_thousands_of_entries_are_refused_naming_the_list(tmp_path, key, entry):
    code, out, took = handle(json.dumps(conf(tmp_path, **{key: [entry(i) for i in range(5000)]})).encode())
    assert code == 1 and out["code"] == 7
    assert f"ipam.{key} has 5000 entries" in out["msg"] and str(limits.MAX_ITEMS) in out["msg"]
    assert list(tmp_path.iterdir()) == []


def test_thousands_of_dns_entries_are_refused(tmp_path):
    code, out, _ = handle(json.dumps({**conf(tmp_path), "dns": {"nameservers": ["10.0.0.53"] * 3000}}).encode())
    assert out["code"] == 7 and "dns.nameservers has 3000 entries" in out["msg"]


def test_a_list_at_the_limit_is_served(tmp_path):
    excludes = [f"10.{i // 250}.{i % 250}.1/32" for i in range(limits.MAX_ITEMS)]
    code, out, _ = handle(json.dumps(conf(tmp_path, exclude=excludes)).encode())
    assert code == 0, out


@pytest.mark.parametrize("depth", [40, 5000, 100_000])
def test_deeply_nested_json_is_a_cni_error_not_a_crash(tmp_path, depth):
    stdin = json.dumps(conf(tmp_path))[:-1].encode() + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    code, out, _ = handle(stdin)
    assert code == 1 and out["code"] == 7 and "nested deeper than" in out["msg"], out


def test_multi_megabyte_stdin_is_refused_without_parsing(tmp_path):
    stdin = json.dumps({**conf(tmp_path), "pad": "x" * (5 << 20)}).encode()
    code, out, took = handle(stdin)
    assert code == 1 and out["code"] == 7 and "larger than 1048576 bytes" in out["msg"]
    assert out["cniVersion"] == "1.1.0"  # not parsed, so the latest version renders the error


def test_read_stdin_holds_at_most_one_byte_more_than_the_limit():
    class Source(io.BytesIO):
        def __init__(self):
            super().__init__(b"x" * (8 << 20))
            self.asked = 0

        def read(self, n=-1):
            assert n != -1 and n is not None, "read without a bound"
            self.asked += n
            return super().read(n)

    source = Source()
    data = skel.read_stdin({"CNI_COMMAND": "ADD"}, source)
    assert len(data) == limits.MAX_CONFIG_BYTES + 1 and source.asked <= limits.MAX_CONFIG_BYTES + 1
    code, out = skel.handle(LeaseIPAM(), ENV, data)
    assert out["code"] == 7 and "larger than" in out["msg"]


def test_many_keys_in_one_object_are_refused(tmp_path):
    code, out, _ = handle(json.dumps({**conf(tmp_path), "args": {f"k{i}": i for i in range(2000)}}).encode())
    assert out["code"] == 7 and "args has 2000 entries" in out["msg"]
