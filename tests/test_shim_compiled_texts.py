"""The code an in-process call compiles from text (dataclass methods, forward references), kept
beside the shim (``.<name>.texts``, rdmanet/node/compiled_texts.py): the first in-process call writes the
file, the next ones compile none of what it holds and answer the same, and a file that is not
whole or not made by this interpreter is never run."""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import typing

import pytest

from rdmanet.node import compiled_texts, launcher
from rdmanet.node.testing import plain_site_dir
from policy_file import write_policy

SOURCE = '''
import collections
import dataclasses
import typing

@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: tuple = dataclasses.field(default_factory=tuple)

Later = typing.Optional["Point"]
Pair = collections.namedtuple("Pair", "left right")
'''


@pytest.fixture
def installed():
    """``install`` on the real dataclasses and typing modules, undone after the test."""
    caches = []

    def install(path: pathlib.Path) -> compiled_texts.Cache:
        cache = compiled_texts.install(str(path))
        caches.append(cache)
        return cache

    yield install
    if caches:
        del dataclasses.exec, typing.compile, collections.eval  # the builtins again


def point_class(cache: compiled_texts.Cache):
    sys.modules["points"] = namespace_module = type(sys)("points")
    try:
        exec(SOURCE, namespace_module.__dict__)
    finally:
        del sys.modules["points"]
    namespace_module.Point.Later = namespace_module.Later
    namespace_module.Point.Pair = namespace_module.Pair
    return namespace_module.Point


def behaviour(Point) -> tuple:
    p = Point(1, tags=("a",))
    try:
        p.x = 2
        frozen = False
    except dataclasses.FrozenInstanceError:
        frozen = True
    return (repr(p), p == Point(1, 0, ("a",)), p != Point(2), hash(p) == hash(Point(1, 0, ("a",))), frozen,
            [f.name for f in dataclasses.fields(Point)], repr(Point(3)),
            repr(typing.get_type_hints(type("Holder", (), {"__annotations__": {"p": Point.Later}}), {"Point": Point})),
            repr(Point.Pair(1, right=2)))


def test_saved_methods_are_run_instead_of_compiled_and_behave_the_same(tmp_path, installed):
    path = tmp_path / ".plugin.texts"
    first = installed(path)
    made = behaviour(point_class(first))
    assert first.compiled  # nothing beside the shim yet: compiled here
    first.save()
    data = path.read_bytes()
    assert data.startswith(importlib.util.MAGIC_NUMBER)

    second = installed(path)
    again = behaviour(point_class(second))
    assert second.compiled == {}  # every method came from the file
    assert again == made == ("Point(x=1, y=0, tags=('a',))", True, True, True, True, ["x", "y", "tags"],
                             "Point(x=3, y=0, tags=())", "{'p': typing.Optional[points.Point]}", "Pair(left=1, right=2)")
    second.save()  # nothing new: the file is not rewritten
    assert path.read_bytes() == data


@pytest.mark.parametrize("damage", ["cut", "flipped", "other interpreter"])
def test_a_file_that_is_not_whole_or_not_this_interpreters_is_never_run(tmp_path, installed, damage):
    path = tmp_path / ".plugin.texts"
    cache = installed(path)
    point_class(cache)
    cache.save()
    data = bytearray(path.read_bytes())
    if damage == "cut":
        data = data[:-100]
    elif damage == "flipped":
        data[-50] ^= 0xFF
    else:
        data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = installed(path)
    assert fresh.codes == {}
    assert behaviour(point_class(fresh))[0] == "Point(x=1, y=0, tags=('a',))"
    assert fresh.compiled  # compiled here, as without a file
    fresh.save()
    assert installed(path).codes.keys() == fresh.codes.keys()  # rewritten whole


@pytest.fixture
def shim_bin():
    root = pathlib.Path(tempfile.mkdtemp(prefix="rdn-texts-"))
    try:
        (root / "bin").mkdir()
        site = plain_site_dir(root / "site")
        launcher.write_shim(str(root / "bin" / "lease-ipam"), "lease-ipam", sys.executable, site,
                            str(root / "nowhere" / "daemon.sock"))
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_in_process_calls_write_the_file_once_and_answer_the_same_from_it(shim_bin):
    root = shim_bin
    shim = root / "bin" / "lease-ipam"
    classes = pathlib.Path(launcher.texts_path(str(shim)))
    env = {"CNI_CONTAINERID": "c1", "CNI_NETNS": "/run/netns/x", "CNI_IFNAME": "net1", "CNI_PATH": str(root / "bin"),
           "RDMANET_NODE_POLICY": str(write_policy(root / "policy.json", dataRoots=[str(root)]))}
    conf = json.dumps({"cniVersion": "1.0.0", "name": "classes", "type": "macvlan",
                       "ipam": {"type": "lease-ipam", "range": "198.18.93.0/29", "datastore": "local",
                                "dataDir": str(root / "data")}}).encode()

    def call(verb: str, cid: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(shim)], input=conf, env={**env, "CNI_COMMAND": verb, "CNI_CONTAINERID": cid},
                              capture_output=True, timeout=60)

    assert not classes.exists()
    first = call("ADD", "c1")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["ips"] == [{"address": "198.18.93.1/29"}]
    written = classes.stat()
    second = call("ADD", "c2")
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["ips"] == [{"address": "198.18.93.2/29"}]
    assert call("ADD", "c2").stdout == second.stdout  # a repeat ADD: the same answer
    after = classes.stat()
    assert (after.st_ino, after.st_mtime_ns) == (written.st_ino, written.st_mtime_ns)  # not rewritten
    assert call("DEL", "c1").returncode == 0
    # broken: ignored, the call answers, the file is made again
    classes.write_bytes(b"not a classes file")
    third = call("ADD", "c3")
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["ips"][0]["address"].startswith("198.18.93.")
    assert classes.read_bytes().startswith(importlib.util.MAGIC_NUMBER)
    assert not [p for p in os.listdir(root / "bin") if p.endswith(".tmp")]
