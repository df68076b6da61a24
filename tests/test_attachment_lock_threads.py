"""Attachment locks between the daemon's threads (rdmanet.cni.linux.attachment_lock): a second call on the
same lock file waits for the first and no longer; a wait ends with CNI error 11 at the deadline."""

from __future__ import annotations

import threading
import time

import pytest

from rdmanet.cni.core import deadline as call_deadline
from rdmanet.cni.core.errors import TRY_AGAIN_LATER, CNIError
from rdmanet.cni.linux import attachment_lock


def test_a_thread_waits_for_the_holder_and_gets_the_lock_when_it_lets_go(tmp_path):
    path = str(tmp_path / "locks" / "attachment-001.lock")
    order = []
    first_in = threading.Event()
    release = threading.Event()

    def first():
        with call_deadline.scoped(call_deadline.Deadline.after(10)):
            with attachment_lock.locked(path, "a"):
                order.append("first in")
                first_in.set()
                release.wait(10)
                order.append("first out")

    def second():
        first_in.wait(10)
        with call_deadline.scoped(call_deadline.Deadline.after(10)):
            with attachment_lock.locked(path, "b"):
                order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    first_in.wait(10)
    time.sleep(0.2)
    assert order == ["first in"]  # the second one waits
    release.set()
    for t in threads:
        t.join(10)
    assert order == ["first in", "first out", "second in"]


def test_a_wait_past_the_deadline_is_try_again_later(tmp_path):
    path = str(tmp_path / "locks" / "attachment-002.lock")
    holding = threading.Event()
    done = threading.Event()

    def holder():
        with call_deadline.scoped(call_deadline.Deadline.after(10)):
            with attachment_lock.locked(path, "a"):
                holding.set()
                done.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        holding.wait(10)
        with call_deadline.scoped(call_deadline.Deadline.after(0.3)):
            with pytest.raises(CNIError) as caught:
                with attachment_lock.locked(path, "attachment n/c/net1"):
                    pass
        assert caught.value.code == TRY_AGAIN_LATER and "attachment n/c/net1" in caught.value.msg
    finally:
        done.set()
        t.join(10)
