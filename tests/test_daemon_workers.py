"""The daemon's worker pool (rdmanet.node.workers) and allocator settings (rdmanet.node.memory): calls one at a
time stay on one warm thread, a burst gets as many workers as it needs and no more, the waiting
room is bounded, a stop serves what was accepted; ``rdmanet daemon`` runs without glibc's
per-thread malloc cache, as the same process."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from rdmanet.node.testing import Daemon, health, shim_env
from rdmanet.node.workers import WorkerPool


def wait_for(predicate, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


@pytest.fixture
def pools():
    made: list[WorkerPool] = []
    yield made
    for pool in made:
        pool.close()


def test_calls_one_at_a_time_are_served_by_one_worker(pools):
    """A FIFO of waiting workers would hand 40 sequential calls to all 8 workers in turn, each
    warming a malloc cache and a stack of its own; the pool keeps using the one that went idle last."""
    served: list[str] = []
    pool = WorkerPool(8, lambda job: served.append(threading.current_thread().name), queued=4)
    pools.append(pool)
    for i in range(40):
        wait_for(lambda: pool.idle() == 8, "every worker idle")
        pool.submit(i)
        wait_for(lambda: len(served) == i + 1, f"job {i}")
    assert len(served) == 40 and len(set(served)) == 1, sorted(set(served))


def test_the_next_call_waits_for_the_worker_that_just_answered(pools):
    """The caller has its answer while the worker still closes the connection: its next call,
    submitted meanwhile, goes to that worker, not to another idle one."""
    served: list[str] = []
    answered = [threading.Event() for _ in range(20)]
    closed = [threading.Event() for _ in range(20)]

    def serve(job):
        served.append(threading.current_thread().name)
        pool.finishing()  # the answer is out
        answered[job].set()
        closed[job].wait(10)  # closing the connection takes a while

    pool = WorkerPool(8, serve, queued=4)
    pools.append(pool)
    for i in range(20):
        pool.submit(i)  # while job i - 1's worker is still closing
        if i:
            closed[i - 1].set()
        assert answered[i].wait(10)
    closed[-1].set()
    wait_for(lambda: pool.idle() == 8, "the jobs")
    assert len(served) == 20 and len(set(served)) == 1, sorted(set(served))


def test_a_burst_gets_as_many_workers_as_it_needs(pools):
    barrier = threading.Barrier(5, timeout=10)
    names: set[str] = set()

    def serve(job):
        names.add(threading.current_thread().name)
        barrier.wait()  # only returns when 5 jobs run at once

    pool = WorkerPool(8, serve, queued=4)
    pools.append(pool)
    for i in range(5):
        pool.submit(i)
    wait_for(lambda: pool.idle() == 8, "the burst to finish")
    assert len(names) == 5


def test_waiting_jobs_are_bounded_and_served_in_order(pools):
    release = threading.Event()
    order: list[int] = []

    def serve(job):
        if job == "block":
            release.wait(10)
        else:
            order.append(job)

    pool = WorkerPool(1, serve, queued=3)
    pools.append(pool)
    pool.submit("block")
    wait_for(lambda: pool.idle() == 0 and pool.waiting() == 0, "the worker to take the blocking job")
    for i in range(3):
        pool.submit(i)
    fourth = threading.Thread(target=pool.submit, args=(3,))
    fourth.start()
    time.sleep(0.2)
    assert fourth.is_alive() and pool.waiting() == 3  # the submitter (the accept loop) waits for room
    release.set()
    fourth.join(10)
    wait_for(lambda: order == [0, 1, 2, 3], "the waiting jobs")


def test_close_serves_what_was_submitted_then_ends_the_workers():
    done: list[int] = []
    pool = WorkerPool(2, lambda job: (time.sleep(0.01), done.append(job)), queued=16)
    threads_before = threading.active_count()
    for i in range(10):
        pool.submit(i)
    pool.close()
    assert sorted(done) == list(range(10))
    assert threading.active_count() == threads_before - 2


def _started(d: Daemon) -> dict:
    wait_for(lambda: '"event": "started"' in d.log(), "the started line")
    [line] = [l for l in d.log().splitlines() if '"event": "started"' in l]
    return json.loads(line)


def test_the_daemon_runs_without_glibcs_per_thread_malloc_cache():
    """``rdmanet daemon`` restarts its interpreter once with glibc.malloc.tcache_count=0 (tunables
    are read at exec): same pid (a supervisor's, or systemd's LISTEN_PID, stays right)."""
    if not os.confstr("CS_GNU_LIBC_VERSION") or "GLIBC_TUNABLES" in os.environ:
        pytest.skip("not glibc, or GLIBC_TUNABLES set around the tests")
    with shim_env() as root:
        d = Daemon(str(root / "run" / "daemon.sock"), allow_uids=[os.getuid()])
        try:
            assert health(d.socket)["pid"] == d.pid
            assert _started(d)["malloc_tcache"] == "off"
            environ = open(f"/proc/{d.pid}/environ", "rb").read().split(b"\0")
            assert b"GLIBC_TUNABLES=glibc.malloc.tcache_count=0" in environ
        finally:
            d.cleanup()


def test_the_node_owners_glibc_tunables_stand():
    if not os.confstr("CS_GNU_LIBC_VERSION"):
        pytest.skip("not glibc")
    with shim_env() as root:
        d = Daemon(str(root / "run" / "daemon.sock"), allow_uids=[os.getuid()],
                   env={"GLIBC_TUNABLES": "glibc.malloc.arena_max=4"})
        try:
            assert _started(d)["malloc_tcache"] == "on"
            environ = open(f"/proc/{d.pid}/environ", "rb").read().split(b"\0")
            assert b"GLIBC_TUNABLES=glibc.malloc.arena_max=4" in environ
        finally:
            d.cleanup()
