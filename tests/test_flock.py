"""rdmanet.cni.linux.flock: exclusive flocks whose waiters sleep in the kernel (main thread) or
poll after queueing in-process (other threads), bounded by a timeout."""

from __future__ import annotations

import pytest

from rdmanet.cni.linux.flock import LockTimeout, exclusive

from flock_holder import held_elsewhere


def test_flock_threads_exclude_each_other_and_time_out(tmp_path):
    import signal
    import threading
    import time

    path = str(tmp_path / "lock")
    inside, overlap = [0], []

    def worker():
        for _ in range(20):
            with exclusive(path, 10):
                inside[0] += 1
                overlap.append(inside[0])
                time.sleep(0.0005)
                inside[0] -= 1

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(overlap) == 80 and max(overlap) == 1

    with held_elsewhere(path):
        errors = []

        def in_thread():  # not the main thread: polls
            try:
                with exclusive(path, 0.2):
                    pass
            except LockTimeout:
                errors.append("timeout")

        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
        assert errors == ["timeout"]
        start = time.monotonic()
        with pytest.raises(LockTimeout):  # main thread: sleeps in flock, woken by the alarm
            with exclusive(path, 0.2):
                pass
        assert time.monotonic() - start < 2
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    with exclusive(path, 1):  # free again once the holder is gone
        pass
