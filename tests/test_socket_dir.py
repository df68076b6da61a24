"""Where the daemon's socket may live: a directory only root may write (rdmanet.node.socket_dir)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rdmanet.node.socket_dir import unsafe_socket_dir


def test_private_and_missing_directories_are_fine(tmp_path):
    (tmp_path / "run").mkdir(mode=0o700)
    assert unsafe_socket_dir(str(tmp_path / "run" / "daemon.sock")) is None
    assert unsafe_socket_dir(str(tmp_path / "absent" / "daemon.sock")) is None  # the daemon makes it 0700


@pytest.mark.parametrize("mode, problem", [(0o1777, "writable by others"), (0o777, "writable by others"),
                                           (0o770, "writable by its group")])
def test_a_directory_others_may_write_is_refused(tmp_path, mode, problem):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    why = unsafe_socket_dir(str(shared / "daemon.sock"))
    assert why is not None and problem in why and str(shared) in why


def test_someone_elses_directory_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    why = unsafe_socket_dir(str(theirs / "daemon.sock"), uid=os.geteuid() + 4242 if os.geteuid() else 4242)
    if os.geteuid() == 0:  # root's directory: fine for any daemon uid
        assert why is None
        os.chown(theirs, 4242, 4242)
        why = unsafe_socket_dir(str(theirs / "daemon.sock"))
    assert why is not None and "owned by uid" in why


def test_a_directory_above_that_others_may_rename_is_refused(tmp_path):
    (tmp_path / "open" / "run").mkdir(parents=True, mode=0o700)
    os.chmod(tmp_path / "open", 0o777)
    why = unsafe_socket_dir(str(tmp_path / "open" / "run" / "daemon.sock"))
    assert why is not None and "without the sticky bit" in why
    os.chmod(tmp_path / "open", 0o1777)  # like /tmp: others cannot rename root's entries
    assert unsafe_socket_dir(str(tmp_path / "open" / "run" / "daemon.sock")) is None


def test_install_sh_check(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    proc = subprocess.run([sys.executable, "-I", "-m", "rdmanet.node.socket_dir", str(shared / "d.sock")],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "writable by others" in proc.stderr and "/run/rdmanet" in proc.stderr
    proc = subprocess.run([sys.executable, "-I", "-m", "rdmanet.node.socket_dir", str(tmp_path / "run" / "d.sock")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
