"""device-info-spec 1.1.0 file: create, update Multus's read-only copy, errors."""

from __future__ import annotations

import json
import os
import stat

import pytest

from rdmanet.cni.core.errors import INVALID_CONFIG, IO_FAILURE, CNIError
from rdmanet.cni.linux.device_info import read_device_info, write_rdma_device_info

# what the SR-IOV device plugin writes and Multus copies (mode 0444) before calling us
DP_FILE = {
    "type": "pci",
    "version": "1.1.0",
    "pci": {"pci-address": "0000:3b:00.2", "pf-pci-address": "0000:3b:00.0", "vhost-net": ""},
    "x-vendor": {"kept": True},
}


def load(path):
    with open(path) as f:
        return json.load(f)


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def leftovers(directory):
    return [n for n in os.listdir(directory) if n.endswith(".tmp")]


def test_create_new_file_and_directory(tmp_path):
    path = tmp_path / "devinfo" / "cni" / "default-rdma-net-abc123_net1"
    out = write_rdma_device_info(str(path), pci_address="0000:3b:00.2", rdma_device="mlx5_2")
    assert load(path) == out == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": "0000:3b:00.2", "rdma-device": "mlx5_2"},
    }
    assert mode_of(path) == 0o644
    assert leftovers(path.parent) == []


def test_create_with_pf_address(tmp_path):
    path = tmp_path / "f"
    write_rdma_device_info(
        str(path), pci_address="0000:3B:00.2", rdma_device="mlx5_2", pf_pci_address="0000:3b:00.0"
    )
    assert load(path)["pci"] == {
        "pci-address": "0000:3b:00.2",
        "rdma-device": "mlx5_2",
        "pf-pci-address": "0000:3b:00.0",
    }


def test_soft_roce_without_pci_address_creates_no_file(tmp_path):
    # device-info-spec 1.1.0: a "pci" file must carry pci-address, which soft-RoCE lacks
    path = tmp_path / "f"
    assert write_rdma_device_info(str(path), pci_address=None, rdma_device="rxe0") is None
    assert not path.exists()


def test_update_multus_read_only_copy_keeps_fields_and_mode(tmp_path):
    path = tmp_path / "default-sriov-net-cid_net1"
    path.write_text(json.dumps(DP_FILE))
    os.chmod(path, 0o444)
    write_rdma_device_info(str(path), pci_address=None, rdma_device="mlx5_2")
    data = load(path)
    assert data["pci"] == {**DP_FILE["pci"], "rdma-device": "mlx5_2"}
    assert data["x-vendor"] == {"kept": True}
    assert (data["type"], data["version"]) == ("pci", "1.1.0")
    assert mode_of(path) == 0o444
    assert leftovers(tmp_path) == []


def test_update_replaces_given_addresses_only(tmp_path):
    path = tmp_path / "f"
    path.write_text(json.dumps(DP_FILE))
    write_rdma_device_info(str(path), pci_address="0000:3b:00.3", rdma_device="mlx5_3")
    pci = load(path)["pci"]
    assert pci["pci-address"] == "0000:3b:00.3"
    assert pci["pf-pci-address"] == "0000:3b:00.0"  # not given: kept
    assert pci["rdma-device"] == "mlx5_3"
    assert mode_of(path) == 0o644


def test_update_keeps_old_version_and_fills_missing_pci(tmp_path):
    path = tmp_path / "f"
    path.write_text(json.dumps({"type": "pci", "version": "1.0.0"}))
    write_rdma_device_info(str(path), pci_address="0000:3b:00.2", rdma_device="mlx5_2")
    assert load(path) == {
        "type": "pci",
        "version": "1.0.0",
        "pci": {"pci-address": "0000:3b:00.2", "rdma-device": "mlx5_2"},
    }


def test_update_is_idempotent(tmp_path):
    path = tmp_path / "f"
    for _ in range(2):
        write_rdma_device_info(str(path), pci_address="0000:3b:00.2", rdma_device="mlx5_2")
    assert load(path)["pci"] == {"pci-address": "0000:3b:00.2", "rdma-device": "mlx5_2"}


def test_read_device_info(tmp_path):
    assert read_device_info(str(tmp_path / "absent")) is None
    (tmp_path / "f").write_text(json.dumps(DP_FILE))
    assert read_device_info(str(tmp_path / "f")) == DP_FILE


@pytest.mark.parametrize(
    "content", ["{not json", "[1, 2]", '"pci"', '{"type": "pci", "pci": []}', "\xff"]
)
def test_malformed_existing_file_is_io_failure(tmp_path, content):
    path = tmp_path / "f"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(CNIError) as e:
        write_rdma_device_info(str(path), pci_address=None, rdma_device="mlx5_0")
    assert e.value.code == IO_FAILURE
    assert str(path) in e.value.msg
    assert path.read_bytes() == content.encode("latin-1")  # left untouched


def test_path_is_a_directory(tmp_path):
    # the path comes from the config: not a regular file is the config's error (7), named
    path = tmp_path / "d"
    path.mkdir()
    with pytest.raises(CNIError) as e:
        write_rdma_device_info(str(path), pci_address=None, rdma_device="mlx5_0")
    assert e.value.code == INVALID_CONFIG and str(path) in e.value.msg
    assert "CNIDeviceInfoFile" in e.value.msg


def test_directory_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    path = blocker / "sub" / "f"
    with pytest.raises(CNIError) as e:
        write_rdma_device_info(str(path), pci_address=None, rdma_device="mlx5_0")
    assert e.value.code == INVALID_CONFIG and str(path) in e.value.msg and "not a directory" in e.value.msg


def test_failed_rename_leaves_no_temp_file_and_old_content(tmp_path, monkeypatch):
    path = tmp_path / "f"
    path.write_text(json.dumps(DP_FILE))

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "rename", lambda src, dst, **kw: refuse(src, dst))
    with pytest.raises(CNIError) as e:
        write_rdma_device_info(str(path), pci_address=None, rdma_device="mlx5_0")
    assert e.value.code == IO_FAILURE and str(path) in e.value.msg
    assert "No space left" in e.value.msg
    assert leftovers(tmp_path) == []
    assert load(path) == DP_FILE


@pytest.mark.parametrize(
    "kwargs",
    [
        {"pci_address": "3b:00.2", "rdma_device": "mlx5_0"},
        {"pci_address": None, "rdma_device": ""},
        {"pci_address": None, "rdma_device": "mlx5_0", "pf_pci_address": "pf0"},
    ],
)
def test_bad_arguments(tmp_path, kwargs):
    with pytest.raises(ValueError):
        write_rdma_device_info(str(tmp_path / "f"), **kwargs)
    assert not (tmp_path / "f").exists()
