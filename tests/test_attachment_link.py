"""The names and markers that let a DEL or repeat ADD find what a killed ADD left in a pod netns."""

from __future__ import annotations

import pytest

from rdmanet.cni.linux import attachment_link as al


def test_temporary_name_is_a_valid_interface_name_derived_from_the_attachment():
    name = al.temporary_name("mvr", "4f1c0ffee", "net1")
    assert len(name) == 15 and name.startswith("mvr") and name.isalnum()
    assert name == al.temporary_name("mvr", "4f1c0ffee", "net1")  # a later call finds it
    assert name != al.temporary_name("mvr", "4f1c0ffee", "net2")  # two attachments of one pod
    assert name != al.temporary_name("mvr", "4f1c0ffef", "net1")


def test_temporary_name_prefix_leaves_room_for_the_hash():
    with pytest.raises(ValueError):
        al.temporary_name("toolong", "cid", "net1")


def test_markers_tell_unfinished_finished_and_foreign_links_apart():
    adding, done = al.marker("cid", "net1"), al.marker("cid", "net1", done=True)
    assert adding != done and len(done) <= 128  # IFLA_IFALIAS room
    assert al.is_ours(adding, "cid", "net1") and al.is_ours(done, "cid", "net1")
    assert not al.is_ours(al.marker("other", "net1"), "cid", "net1")
    assert not al.is_ours("", "cid", "net1")
    assert not al.is_ours("uplink to rack 7", "cid", "net1")
