"""The shim's compiled hot path beside it, ``.<name>.code`` (rdmanet/node/boot.py): the shim's first exec
writes it, later execs run from it, and a file that was not made by this interpreter from this
shim's source, or is not whole, is never run: the shim answers the same and writes a good one."""

from __future__ import annotations

import ast
import binascii
import importlib.util
import marshal
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from rdmanet.node import boot, codecache, fast, launcher
from rdmanet.node.testing import ScriptedDaemon

PLUGIN = "lease-ipam"
ANSWER = b"3 4 5\nout\nerr!\n"  # the daemon's answer: exit code 3, stdout "out\n", stderr "err!\n"
# what a code file that is run prints instead of asking the daemon
FOREIGN = compile('def run(plugin, site_dir, socket_path, server_uid=0, exit_now=False):\n'
                  '    import sys\n    sys.stdout.write("ran the code file\\n")\n    return 0\n', "foreign", "exec")


@pytest.fixture
def shim():
    """A daemon-only shim in a short temporary directory, a stand-in daemon on its socket."""
    root = pathlib.Path(tempfile.mkdtemp(prefix="rdn-code-"))
    try:
        (root / "bin").mkdir()
        path = root / "bin" / PLUGIN
        launcher.write_shim(str(path), PLUGIN, sys.executable, None, str(root / "run" / "daemon.sock"))
        daemon = ScriptedDaemon(str(root / "run" / "daemon.sock"), ANSWER)
        try:
            yield path
        finally:
            daemon.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def call(path: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(path)], env={"CNI_COMMAND": "VERSION"}, stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=60)


def answered_by_the_daemon(proc: subprocess.CompletedProcess) -> bool:
    return (proc.returncode, proc.stdout, proc.stderr) == (3, b"out\n", b"err!\n")


def head(path: pathlib.Path) -> bytes:
    """The interpreter's magic number and the shim's stamp, as the code file must begin."""
    line = next(x for x in path.read_text().splitlines() if x.startswith("_STAMP = "))
    return importlib.util.MAGIC_NUMBER + ast.literal_eval(line[len("_STAMP = "):])


def code_file(start: bytes, code) -> bytes:
    body = marshal.dumps(code)
    return start + b"%08x" % binascii.crc32(body) + body


def is_the_shims_own(path: pathlib.Path, data: bytes) -> bool:
    """A whole code file for this shim under this interpreter, holding rdmanet/node/fast.py's code."""
    start = head(path)
    body = data[len(start) + 8:]
    return (data.startswith(start) and data[len(start):len(start) + 8] == b"%08x" % binascii.crc32(body)
            and marshal.loads(body).co_filename == "<rdmanet shim: rdmanet/node/fast.py>")


def test_the_first_exec_writes_the_code_file_and_the_next_ones_run_it(shim):
    code = pathlib.Path(launcher.code_path(str(shim)))
    assert code.name == f".{PLUGIN}.code" and not code.exists()
    assert answered_by_the_daemon(call(shim))
    assert is_the_shims_own(shim, code.read_bytes())
    assert sorted(os.listdir(shim.parent)) == [code.name, PLUGIN]  # no temporary left
    assert answered_by_the_daemon(call(shim))
    # the shim really runs the file: one with other code (and a correct head) is what answers
    code.write_bytes(code_file(head(shim), FOREIGN))
    assert call(shim).stdout == b"ran the code file\n"


def _other_magic(start: bytes) -> bytes:
    return code_file(b"\x00\x00\r\n" + start[4:], FOREIGN)


def _other_stamp(start: bytes) -> bytes:
    return code_file(start[:4] + b"0" * (len(start) - 4), FOREIGN)


def _bad_crc(start: bytes) -> bytes:
    """A byte changed that marshal would not notice (in a string the code prints)."""
    return code_file(start, FOREIGN).replace(b"ran the code file", b"ran the code fiXe")


def _truncated(start: bytes) -> bytes:
    data = code_file(start, FOREIGN)
    return data[:len(data) // 2]


@pytest.mark.parametrize("make", [_other_magic, _other_stamp, _bad_crc, _truncated, lambda start: b""],
                         ids=["another-interpreter", "another-source", "bad-crc", "truncated", "empty"])
def test_a_code_file_that_does_not_match_is_never_run_and_is_rewritten(shim, make):
    code = pathlib.Path(launcher.code_path(str(shim)))
    code.write_bytes(make(head(shim)))
    assert answered_by_the_daemon(call(shim))
    assert is_the_shims_own(shim, code.read_bytes())


def test_a_temporary_left_by_a_killed_shim_is_never_run(shim):
    """A shim killed while writing its code file leaves ``.<name>.code.<pid>.<random>.tmp``: never
    read (only the renamed file is), removed by install.sh --uninstall with the shim."""
    code = pathlib.Path(launcher.code_path(str(shim)))
    tmp = code.with_name(code.name + ".1234.abcd1234.tmp")
    tmp.write_bytes(code_file(head(shim), FOREIGN))
    assert answered_by_the_daemon(call(shim))
    assert is_the_shims_own(shim, code.read_bytes())


def test_where_the_shim_cannot_write_it_compiles_every_time(shim):
    """Its code file path taken (here by a directory; a read-only bin dir or a caller who is not
    root likewise): every exec answers, nothing is written, no temporary is left."""
    code = pathlib.Path(launcher.code_path(str(shim)))
    code.mkdir()
    for _ in range(2):
        assert answered_by_the_daemon(call(shim))
    assert sorted(os.listdir(shim.parent)) == [code.name, PLUGIN] and os.listdir(code) == []


def test_a_new_shim_source_rewrites_the_code_file(shim):
    """A reinstall with other shim code (another stamp): the old code file is not run."""
    assert answered_by_the_daemon(call(shim))
    code = pathlib.Path(launcher.code_path(str(shim)))
    code.write_bytes(code_file(head(shim), FOREIGN))
    text = shim.read_text()
    stamp = re.search(r"^_STAMP = b'([0-9a-f]+)'$", text, re.M).group(1)
    shim.write_text(text.replace(stamp, "f" * len(stamp)))
    assert answered_by_the_daemon(call(shim))
    assert is_the_shims_own(shim, code.read_bytes())


def test_the_cold_start_code_parses_as_python_36():
    """rdmanet.node.boot's cold start is a string in the shim, compiled on the node's python3."""
    ast.parse(boot._REBUILD, feature_version=(3, 6))
    text = launcher.render_shim(PLUGIN, "/usr/bin/python3", None, "/run/x.sock")
    assert 'exec(_REBUILD, ' in text and "_REBUILD = " in text


def test_a_shim_with_a_fallback_gets_its_code_file_from_the_installer(tmp_path):
    """write_shim (install.sh host mode, the tests) writes it when the shim's interpreter is this
    one, so no call has to (rdmanet doctor writes nothing); the shim runs it as it is."""
    path = tmp_path / PLUGIN
    launcher.write_shim(str(path), PLUGIN, sys.executable, "/nonexistent/site", str(tmp_path / "daemon.sock"))
    code = pathlib.Path(launcher.code_path(str(path)))
    assert is_the_shims_own(path, code.read_bytes())
    before = code.stat()
    daemon = ScriptedDaemon(str(tmp_path / "daemon.sock"), ANSWER)
    try:
        assert answered_by_the_daemon(call(path))
    finally:
        daemon.close()
    assert (code.stat().st_ino, code.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert sorted(os.listdir(tmp_path)) == [code.name, PLUGIN]


def test_the_shim_ends_once_the_whole_answer_is_in_without_waiting_for_the_close(tmp_path):
    """The daemon closes after its answer, but a pod start need not wait for that close (a busy
    daemon's worker may get to it late): the shim answers as soon as it has every byte the head
    line announces. Here the daemon closes only after the shim has exited."""
    import socket
    import threading

    from rdmanet.node.testing import read_request

    path = tmp_path / PLUGIN
    sock_path = str(tmp_path / "d.sock")
    launcher.write_shim(str(path), PLUGIN, sys.executable, None, sock_path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(1)
    shim_done = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            read_request(conn)
            conn.sendall(ANSWER[:7])  # the head line first, the rest in a second write
            conn.sendall(ANSWER[7:])
            shim_done.wait(60)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert answered_by_the_daemon(call(path))
    finally:
        shim_done.set()
        thread.join()
        server.close()


def test_a_call_the_daemon_does_not_answer_runs_the_launcher_from_the_code_file(tmp_path):
    """The code file holds rdmanet/node/launcher.py's code after rdmanet/node/fast.py's, so a call that runs
    in-process compiles nothing: a file whose launcher part is other code is what answers."""
    import io
    import json
    import sysconfig

    (tmp_path / "bin").mkdir()
    path = tmp_path / "bin" / PLUGIN
    launcher.write_shim(str(path), PLUGIN, sys.executable, sysconfig.get_path("purelib"), str(tmp_path / "none.sock"))
    code = pathlib.Path(launcher.code_path(str(path)))
    start = head(path)
    stream = io.BytesIO(code.read_bytes()[len(start) + 8:])
    fast_code, launcher_code = marshal.load(stream), marshal.load(stream)
    assert (fast_code.co_filename, launcher_code.co_filename) == ("<rdmanet shim: rdmanet/node/fast.py>",
                                                                  "<rdmanet shim: rdmanet/node/launcher.py>")
    assert fast.LAUNCHER_FILENAME == codecache.LAUNCHER_FILENAME  # what rdmanet.node.fast looks for is what was written
    version = call(path)  # no daemon: the plugin answers in-process
    assert version.returncode == 0 and "1.0.0" in json.loads(version.stdout)["supportedVersions"]

    other = compile('def resume(*args):\n    import sys\n    sys.stdout.write("ran the code file\'s launcher\\n")\n'
                    '    return 0\ndef finish(code):\n    return code\n', "<rdmanet shim: rdmanet/node/launcher.py>", "exec")
    body = marshal.dumps(fast_code) + marshal.dumps(other)
    code.write_bytes(start + b"%08x" % binascii.crc32(body) + body)
    assert call(path).stdout == b"ran the code file's launcher\n"
