"""Local worker processes shared by the link benchmark and the distributed launcher.

It owns reading the workers' result queue while noticing a worker that died, and stopping them;
it must not know what the workers compute (the benchmark and the launcher say that).

Example::

    >>> import multiprocessing
    >>> ctx = multiprocessing.get_context("fork")
    >>> results = ctx.Queue()
    >>> procs = [ctx.Process(target=results.put, args=({"rank": 0, "ok": True},)),   # reports, exits 0
    ...          ctx.Process(target=os._exit, args=(3,))]                            # dies saying nothing
    >>> for p in procs:
    ...     p.start()
    >>> next_message(procs, results, finished=set(), poll_s=10)
    {'rank': 0, 'ok': True}
    >>> for p in procs:
    ...     p.join()
    >>> next_message(procs, results, finished={0}, poll_s=0.1, grace_s=0.1)
    Traceback (most recent call last):
    tensoropt._procs.WorkerDied: rank 1 exited with code 3
"""

from __future__ import annotations

import contextlib
import os
import queue as queue_mod
from collections.abc import Collection, Iterator, Sequence
from typing import Any


class WorkerDied(Exception):
    """Worker ``rank`` exited with ``exitcode`` (non-zero) and nothing came from the workers."""

    def __init__(self, rank: int, exitcode: int | None):
        super().__init__(f"rank {rank} exited with code {exitcode}")
        self.rank, self.exitcode = rank, exitcode


def next_message(procs: Sequence[Any], queue: Any, finished: Collection[int], *, poll_s: float = 0.2,
                 grace_s: float = 1.0) -> Any:
    """The next message the workers put on ``queue``, or ``None`` after ``poll_s`` of silence.
    When a worker not in ``finished`` has exited with a non-zero code, its own message (or a
    peer's) may still be on the way: wait ``grace_s`` more for it, then raise :class:`WorkerDied`
    naming the first such worker."""
    try:
        return queue.get(timeout=poll_s)
    except queue_mod.Empty:
        pass
    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in finished]
    if not dead:
        return None
    try:
        return queue.get(timeout=grace_s)
    except queue_mod.Empty:
        raise WorkerDied(dead[0], procs[dead[0]].exitcode) from None


@contextlib.contextmanager
def single_threaded_env() -> Iterator[None]:
    """Spawned workers inherit the environment at start: one OpenMP / MKL thread each."""
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    old = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: "1" for k in keys})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stop_workers(procs: Sequence[Any], queue: Any, *, grace_s: float = 5.0) -> None:
    """End ``procs`` (``multiprocessing`` processes) and close their result ``queue``: terminate
    the live ones, wait up to ``grace_s`` each, kill what still runs; never blocks on the queue's
    feeder thread.  Safe to call on processes that never started or already exited."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is not None:
            p.join(timeout=grace_s)
            if p.is_alive():
                p.kill()
                p.join(timeout=grace_s)
    queue.close()
    queue.cancel_join_thread()
