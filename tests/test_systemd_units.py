"""The systemd units install.sh writes (rdmanet/cli/systemd_units.py), read back as systemd reads them:
parsed section by section, and checked by ``systemd-analyze verify`` (Debian's ``systemd``
package, installed by scripts/test.sh).
"""

from __future__ import annotations

import configparser
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from rdmanet.cli import systemd_units

RDMANET = str(pathlib.Path(sys.prefix) / "bin" / "rdmanet")  # this venv's: ExecStart= must exist for verify
SOCKET = "/run/rdmanet/daemon.sock"


def parse(text: str) -> dict[str, dict[str, str]]:
    parser = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",), comment_prefixes=("#",))
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(text)
    return {name: dict(parser[name]) for name in parser.sections()}


def test_socket_unit_listens_on_the_daemon_socket_root_only_and_is_wanted_at_boot():
    unit = parse(systemd_units.socket_unit(SOCKET))
    assert unit["Socket"] == {"ListenStream": SOCKET, "SocketUser": "root", "SocketGroup": "root", "SocketMode": "0600",
                              "DirectoryMode": "0700", "Backlog": "4096", "RemoveOnStop": "yes"}
    assert "Accept" not in unit["Socket"]  # Accept=no: one daemon gets the listening socket
    assert unit["Install"] == {"WantedBy": "sockets.target"}


def test_service_unit_runs_the_daemon_on_that_socket_and_is_started_only_by_it():
    unit = parse(systemd_units.service_unit(RDMANET, SOCKET))
    assert unit["Unit"]["Requires"] == unit["Unit"]["After"] == "rdmanet.socket"
    service = unit["Service"]
    assert service["ExecStart"] == f"{RDMANET} daemon --socket {SOCKET}"
    assert service["KillMode"] == "mixed"  # SIGTERM to the daemon only: it finishes its calls, IPAM execs included
    assert int(service["TimeoutStopSec"]) > 50  # the daemon's default --call-timeout
    assert service["EnvironmentFile"] == "-/etc/default/rdmanet"
    assert unit["Install"] == {"Also": "rdmanet.socket"}  # no WantedBy=: an idle node runs no daemon


@pytest.mark.parametrize("path, says", [
    ("run/rdmanet.sock", "give an absolute path"),
    ("/run/rdma net/daemon.sock", "contains ' '"),
    ("/run/rdmanet/%i.sock", "contains '%'"),
    ("/run/rdmanet/a\"b.sock", "contains '\"'"),
    ("/run/" + "x" * 120 + ".sock", "longer than the 107 bytes"),
])
def test_a_socket_path_a_unit_cannot_name_is_refused(path, says):
    with pytest.raises(ValueError, match=says.replace("'", ".").replace('"', ".")):
        systemd_units.socket_unit(path)


def test_write_then_systemd_analyze_verify(tmp_path):
    unit_dir = tmp_path / "etc" / "systemd" / "system"
    proc = subprocess.run([sys.executable, "-I", "-m", "rdmanet.cli.systemd_units", "write", str(unit_dir), "--rdmanet",
                           RDMANET, "--socket", SOCKET], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(unit_dir / "rdmanet.socket"), str(unit_dir / "rdmanet.service")]
    assert sorted(os.listdir(unit_dir)) == ["rdmanet.service", "rdmanet.socket"]  # no temporaries left
    for name in ("rdmanet.socket", "rdmanet.service"):
        path = unit_dir / name
        assert path.stat().st_mode & 0o777 == 0o644
        assert path.read_text().startswith("# Written by rdmanet's install.sh")  # install.sh's "ours" mark
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian package systemd; scripts/test.sh installs it)")
    verify = subprocess.run([analyze, "verify", str(unit_dir / "rdmanet.socket"), str(unit_dir / "rdmanet.service")],
                            capture_output=True, text=True, timeout=60)
    assert (verify.returncode, verify.stdout + verify.stderr) == (0, "")


def test_systemd_analyze_verify_catches_what_this_test_relies_on(tmp_path):
    """The check above can fail: a unit with a key systemd does not know, or an ExecStart= that is
    not there, is reported."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    unit_dir = tmp_path / "system"
    systemd_units.write(str(unit_dir), "/nonexistent/rdmanet", SOCKET)
    path = unit_dir / "rdmanet.socket"
    path.write_text(path.read_text().replace("SocketMode=0600", "SocketMode=0600\nSocketModes=0600"))
    verify = subprocess.run([analyze, "verify", str(path), str(unit_dir / "rdmanet.service")], capture_output=True,
                            text=True, timeout=60)
    assert "Unknown key 'SocketModes'" in verify.stderr and "/nonexistent/rdmanet" in verify.stderr


def test_cli_refuses_a_bad_path_and_writes_nothing(tmp_path):
    proc = subprocess.run([sys.executable, "-I", "-m", "rdmanet.cli.systemd_units", "write", str(tmp_path / "units"),
                           "--rdmanet", RDMANET, "--socket", "/run/my sockets/d.sock"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("cannot write the systemd units: the daemon socket '/run/my sockets/d.sock'")
    assert not (tmp_path / "units").exists()
