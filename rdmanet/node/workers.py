"""A fixed pool of worker threads that hands each job to the most recently idle worker.

Why not a shared FIFO queue (``queue.Queue`` + N threads blocked in ``get``): its waiters are
woken in the order they started waiting, so even one call at a time is served by every worker in
turn. Each thread that has run a call keeps memory of its own that outlives the call (glibc's
per-thread malloc cache, up to 7 freed chunks of every size class up to 1 KiB, and the touched
part of its stack): with 32 workers served in turn, the daemon's RSS crept up for thousands of
calls (+0.7 MB per 1 000 sequential ADD/DEL cycles, measured; Python's own allocations stayed
flat under tracemalloc, and the creep vanished with one worker or with glibc's tcache off).

Here idle workers form a stack: a job goes to the worker that finished last, so a node that
serves one call at a time keeps using one warm thread, and a burst of N concurrent calls wakes N
workers and no more. A worker whose caller already has its answer (:meth:`WorkerPool.finishing`:
the daemon then only closes the connection) counts as about to be idle: the caller's next call,
arriving meanwhile, waits for it instead of waking another worker (on a loaded node the window
is long enough for that to happen often, and every worker woken so ends up warm). Jobs no worker is free for wait in a FIFO of at most ``queued`` entries
(first come, first served); past that :meth:`WorkerPool.submit` blocks (the daemon's accept
loop, whose callers then wait in the listen backlog).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Optional

_STOP = object()


class _Worker:
    def __init__(self, pool: "WorkerPool", name: str) -> None:
        self.pool = pool
        self.job: Any = None
        self.finishing = False
        self.wake = threading.Lock()
        self.wake.acquire()  # held while the worker has nothing to do; a dispatcher releases it
        self.thread = threading.Thread(target=self.run, name=name, daemon=True)

    def run(self) -> None:
        pool = self.pool
        pool._local.worker = self
        while True:
            job = pool._next(self)
            if job is None:
                self.wake.acquire()  # until a job is handed over
                job, self.job = self.job, None
            if job is _STOP:
                return
            pool._serve(job)


class WorkerPool:
    """``size`` threads calling ``serve(job)`` for each submitted job; idle workers are reused
    last-in first-out, waiting jobs served first-in first-out."""

    def __init__(self, size: int, serve: Callable[[Any], None], queued: int, name: str = "worker") -> None:
        if size < 1 or queued < 1:
            raise ValueError("a worker pool needs at least one worker and room for one waiting job")
        self._serve = serve
        self._queued = queued
        self._lock = threading.Lock()
        self._not_full = threading.Condition(self._lock)
        self._idle: list[_Worker] = []  # a stack: the last to go idle is the first woken
        self._waiting: collections.deque = collections.deque()
        self._finishing = 0  # workers between finishing() and their next job
        self._local = threading.local()
        self._workers = [_Worker(self, f"{name}-{i}") for i in range(size)]
        for worker in self._workers:
            worker.thread.start()

    @property
    def size(self) -> int:
        return len(self._workers)

    def idle(self) -> int:
        """Workers waiting for a job."""
        return len(self._idle)

    def waiting(self) -> int:
        """Jobs submitted that no worker has taken yet."""
        return len(self._waiting)

    def submit(self, job: Any) -> None:
        """Hand ``job`` to an idle worker, or queue it; blocks while ``queued`` jobs already wait."""
        if job is None:
            raise ValueError("None is not a job")
        self._put(job)

    def finishing(self) -> None:
        """Called by a job in a worker once what is left of it is short and never waits (the answer
        is sent): a job submitted meanwhile goes to this worker rather than waking an idle one."""
        worker = getattr(self._local, "worker", None)
        if worker is None or worker.finishing:
            return
        with self._lock:
            worker.finishing = True
            self._finishing += 1

    def _put(self, job: Any) -> None:
        with self._lock:
            while not self._idle and len(self._waiting) >= self._queued:
                self._not_full.wait()
            if self._idle and (self._finishing <= len(self._waiting) or len(self._waiting) >= self._queued):
                worker = self._idle.pop()
                worker.job = job
                worker.wake.release()
            else:
                self._waiting.append(job)

    def _next(self, worker: _Worker) -> Optional[Any]:
        """The next waiting job for ``worker``, or None after putting it on the idle stack."""
        with self._lock:
            if worker.finishing:
                worker.finishing = False
                self._finishing -= 1
            self._not_full.notify()  # room for one more job either way
            if self._waiting:
                return self._waiting.popleft()
            self._idle.append(worker)
            return None

    def close(self) -> None:
        """Serve every job already submitted, then end the workers and wait for them."""
        for _ in self._workers:
            self._put(_STOP)  # queued behind the waiting jobs: each worker takes one and ends
        for worker in self._workers:
            worker.thread.join()
