"""RDMA netlink client against the real kernel, in the host netns and in a fresh netns.

Documented behaviour on a kernel without the RDMA core (this CI kernel: no ib_core, so
``socket(AF_NETLINK, SOCK_DGRAM, NETLINK_RDMA)`` fails with EPROTONOSUPPORT):
``netns_mode()`` is None, ``list_devices()`` is [] (no RDMA core, no RDMA device),
``device_by_name()`` is None, and ``move_device()`` / ``RdmaNetlink()`` raise
``RdmaNetlinkUnavailable`` (an OSError with errno EPROTONOSUPPORT). None of them leaks the
asyncio loop pyroute2 creates before the socket. On a kernel with the RDMA core the tests check
the answers' shape and the netns semantics instead.

The fresh-netns checks run in a dedicated thread that setns(2)s into the namespace (setns moves
only the calling thread), so the test process never changes netns even if restoring fails.
"""

from __future__ import annotations

import errno
import gc
import os
import secrets
import socket
import subprocess
import threading
import warnings

import pytest

from rdmanet.cni.linux import rdma_netlink as rn
from rdmanet.cni.linux.sysfs import pci_address_of_netdev, rdma_devices_for_netdev

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: creates a network namespace and calls setns(2)"
)


def kernel_has_rdma_netlink() -> bool:
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, rn.NETLINK_RDMA)
    except OSError as e:
        if e.errno == errno.EPROTONOSUPPORT:
            return False
        raise
    s.close()
    return True


HAS_RDMA = kernel_has_rdma_netlink()


def answers() -> dict:
    """Everything the client reports in the calling thread's netns."""
    out = {"mode": rn.netns_mode(), "devices": rn.list_devices()}
    out["by_name"] = rn.device_by_name(out["devices"][0].name if out["devices"] else "mlx5_0")
    try:
        with rn.RdmaNetlink() as nl:
            out["socket"] = ("open", nl.netns_mode())
    except rn.RdmaNetlinkUnavailable as e:
        out["socket"] = ("unavailable", e.errno)
    return out


def check_answers(got: dict, *, fresh_netns: bool) -> None:
    if not HAS_RDMA:
        assert got == {
            "mode": None,
            "devices": [],
            "by_name": None,
            "socket": ("unavailable", errno.EPROTONOSUPPORT),
        }
        return
    assert got["mode"] in ("shared", "exclusive", None)
    assert all(isinstance(d, rn.RdmaDevice) for d in got["devices"])
    assert got["socket"] == ("open", got["mode"])
    if fresh_netns and got["mode"] == "exclusive":
        assert got["devices"] == []  # a new netns owns no RDMA device in exclusive mode
    if got["devices"]:
        assert got["by_name"] == got["devices"][0]
    else:
        assert got["by_name"] is None


def run_in_netns(netns_path: str, fn):
    """Run ``fn`` in a new thread that has entered ``netns_path``; return its result."""
    from pyroute2.netns import setns

    box: dict = {}

    def body():
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(netns_path, os.O_RDONLY)
        try:
            setns(target, flags=0)  # flags=0: never create; an fd argument is used as is
            try:
                here = os.stat("/proc/thread-self/ns/net").st_ino
                box["entered"] = here == os.fstat(target).st_ino
                box["result"] = fn()
            finally:
                setns(home, flags=0)
                back = os.stat("/proc/thread-self/ns/net").st_ino
                box["restored"] = back == os.fstat(home).st_ino
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = e
        finally:
            os.close(target)
            os.close(home)

    t = threading.Thread(target=body)
    t.start()
    t.join(60)
    assert not t.is_alive(), "netns worker thread hung"
    if "error" in box:
        raise box["error"]
    assert box["entered"] and box["restored"]
    return box["result"]


@pytest.fixture
def fresh_netns():
    name = f"rdmanet-test-{os.getpid()}-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield f"/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert name not in listed.split(), f"netns {name} left behind"


def test_host_netns_answers():
    check_answers(answers(), fresh_netns=False)


def test_fresh_netns_answers(fresh_netns):
    host = answers()
    inside = run_in_netns(fresh_netns, answers)
    check_answers(inside, fresh_netns=True)
    assert inside["mode"] == host["mode"]  # the mode is system-wide
    if host["mode"] == "shared":
        assert inside["devices"] == host["devices"]


def test_no_resource_leak_when_unavailable():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            rn.netns_mode()
            rn.list_devices()
        gc.collect()
    leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert leaks == []


@pytest.mark.skipif(HAS_RDMA, reason="kernel has RDMA netlink")
def test_move_without_rdma_core(fresh_netns):
    fd = os.open(fresh_netns, os.O_RDONLY)
    try:
        with pytest.raises(rn.RdmaNetlinkUnavailable) as e:
            rn.move_device(0, fd)
        assert e.value.errno == errno.EPROTONOSUPPORT
        assert "RDMA" in str(e.value)
        with pytest.raises(rn.RdmaNetlinkUnavailable):
            run_in_netns(fresh_netns, lambda: rn.move_device(0, fd))
    finally:
        os.close(fd)


@pytest.mark.skipif(not HAS_RDMA, reason="kernel has no RDMA netlink")
def test_move_bad_index_is_kernel_error(fresh_netns):
    """A well-formed SET for an index that does not exist: the kernel answers an errno."""
    fd = os.open(fresh_netns, os.O_RDONLY)
    try:
        used = {d.index for d in rn.list_devices()}
        with pytest.raises(OSError) as e:
            rn.move_device(max(used, default=0) + 1000, fd)
        assert e.value.errno in (errno.ENODEV, errno.EINVAL, errno.EOPNOTSUPP)
    finally:
        os.close(fd)


def test_real_sysfs_loopback():
    assert rdma_devices_for_netdev("lo") == [] or HAS_RDMA  # rxe on lo is possible, not here
    assert pci_address_of_netdev("lo") is None
