"""rdmanet.cni.linux.link_delete against the real kernel: a deletion the daemon answers at the link's
RTM_DELLINK notification leaves what links.delete leaves (the link gone from its namespace, its
name free at once) and raises what links.delete raises."""

from __future__ import annotations

import errno
import os
import threading

import pytest

pytest.importorskip("pyroute2")

from rdmanet.cni.core.errors import CNIError  # noqa: E402
from rdmanet.cni.linux import link_delete, links  # noqa: E402

try:
    from netns_tests import nstools as nt
except ImportError:  # pragma: no cover
    import nstools as nt  # type: ignore[no-redef]


@pytest.fixture
def in_background():
    link_delete.finish_in_background(True)
    try:
        yield
    finally:
        link_delete.finish_in_background(False)


def _macvlan(ns, master, name: str) -> None:
    nt.ip("link", "add", "link", master.name, "name", name, "netns", ns.name, "type", "macvlan", "mode", "bridge")
    nt.ip("-n", ns.name, "addr", "add", "198.18.40.2/24", "dev", name)
    nt.ip("-n", ns.name, "link", "set", name, "up")


def _deleting_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("link-delete-")]


@pytest.mark.parametrize("background", [True, False], ids=["daemon", "in-process"])
def test_the_link_is_gone_and_its_name_free_when_it_returns(netns, master, request, background):
    if background:
        request.getfixturevalue("in_background")
    ns, m = netns(), master()
    for round_ in range(3):  # the same name again at once: the kernel may still be freeing the last one
        _macvlan(ns, m, "net1")
        with links.rtnl_in(ns.path) as pod:
            link_delete.delete_until_unlisted(pod, links.find_link(pod, "net1").index)
        with links.rtnl_in(ns.path) as pod:  # at once (ip would take a few ms to look)
            assert links.find_link(pod, "net1") is None, round_
        assert nt.link(ns.name, "net1") is None, round_
    for thread in _deleting_threads():
        thread.join(timeout=30)
    assert _deleting_threads() == []


@pytest.mark.parametrize("background", [True, False], ids=["daemon", "in-process"])
def test_refusals_are_raised_as_links_delete_raises_them(netns, request, background):
    if background:
        request.getfixturevalue("in_background")
    ns = netns()
    outcomes = []
    for delete in (links.delete, link_delete.delete_until_unlisted):
        with links.rtnl_in(ns.path) as pod:
            lo = links.find_link(pod, "lo").index
            with pytest.raises(CNIError) as refused:  # the kernel refuses to delete a loopback device
                delete(pod, lo)
        with links.rtnl_in(ns.path) as pod:
            delete(pod, 4242)  # no such link (ENODEV): nothing to delete, no error
        outcomes.append((refused.value.code, refused.value.msg, refused.value.details))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] == 100 and outcomes[0][1].startswith("delete link #1: ")
    assert nt.link(ns.name, "lo") is not None


def test_past_its_bound_a_deletion_waits_for_the_kernel(netns, master, in_background):
    ns, m = netns(), master()
    taken = 0
    try:
        while link_delete._slots.acquire(blocking=False):
            taken += 1
        assert taken == link_delete.BACKGROUND
        _macvlan(ns, m, "net1")
        with links.rtnl_in(ns.path) as pod:
            link_delete.delete_until_unlisted(pod, links.find_link(pod, "net1").index)
        assert nt.link(ns.name, "net1") is None
        assert _deleting_threads() == []  # done in the caller's thread
    finally:
        for _ in range(taken):
            link_delete._slots.release()


def test_a_refused_duplicate_of_the_socket_leaves_no_descriptor_and_no_slot_taken(netns, master, in_background,
                                                                                 monkeypatch):
    ns, m = netns(), master()
    _macvlan(ns, m, "net1")

    def refused(self):
        raise OSError(errno.EMFILE, "Too many open files")

    with links.rtnl_in(ns.path) as pod:
        index = links.find_link(pod, "net1").index
        monkeypatch.setattr(type(pod), "detached", refused)
        before = sorted(os.listdir("/proc/self/fd"))
        with pytest.raises(OSError):
            link_delete.delete_until_unlisted(pod, index)
        assert sorted(os.listdir("/proc/self/fd")) == before
    assert nt.link(ns.name, "net1") is not None  # nothing was asked of the kernel
    taken = 0
    try:
        while link_delete._slots.acquire(blocking=False):
            taken += 1
        assert taken == link_delete.BACKGROUND
    finally:
        for _ in range(taken):
            link_delete._slots.release()
