"""``fork_map``: a function over independent tasks in forked copies of this process, results in
task order — how the frontier tracks its meshes side by side.

The meshes of :func:`~tensoropt.frontier.track_frontier` are independent problems (each its own τ
runs, evaluation and polish) and the work is Python-level bookkeeping, so threads would wait on
one another; forked processes inherit the built problems without copying them (copy-on-write)
and send back only their results (pickled).  ``os.fork`` is used directly rather than
:mod:`multiprocessing`, whose pools refuse to start inside a daemonic process (the dashboard's
jobs are ones).

Rules that keep it exact and safe:

- **Same result as one process.**  Every task runs the same code on the same inputs; results
  come back in task order, so the frontier is identical whatever the number of workers.
- **Tasks are handed out by their cost hint**: largest first, each to the first worker free
  (longest-processing-time first, on the workers' real times: a hint that is off costs no idle
  worker).  Which worker ran a task never changes its result.
- **A worker that fails leaves no gap**: an exception in a task is sent back and raised here
  (the first failing task's, itself where it pickles); a worker that dies without a word (killed, out of memory) has its
  tasks run again here, in this process.
- Children end with :func:`os._exit`: no ``atexit`` handler, no buffered file of the parent's is
  flushed twice.

Workers: ``workers`` if given, else the ``TENSOROPT_WORKERS`` environment variable, else the
CPUs this process may run on.  One worker, or one task, runs in this process, unforked.

Example::

    >>> fork_map(lambda x: x * x, [3, 1, 2], workers=2)
    [9, 1, 4]
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: the environment variable that sets the default number of workers (``1``: never fork)
WORKERS_ENV = "TENSOROPT_WORKERS"


def default_workers() -> int:
    """``TENSOROPT_WORKERS`` when set (an integer ≥ 1), else the CPUs this process may use."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{WORKERS_ENV} must be an integer >= 1, got {raw!r}")
        return n
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:      # not on Linux
        return max(1, os.cpu_count() or 1)


def fork_map(fn: Callable[[T], R], tasks: Sequence[T], *, workers: int | None = None,
             hints: Sequence[float] | None = None,
             on_done: Callable[[int], None] | None = None,
             meanwhile: Callable[[], object] | None = None) -> list[R]:
    """``[fn(t) for t in tasks]``, computed in up to ``workers`` forked processes (module
    docstring).  ``hints``: each task's expected cost (default: equal); ``on_done(i)`` is
    called here as task ``i``'s result arrives (in arrival order); ``meanwhile()`` here once,
    after the workers are forked and before their results are read (or before the first task,
    when nothing is forked): work of this process's own that would otherwise wait."""
    n = len(tasks)
    workers = default_workers() if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or n <= 1 or not hasattr(os, "fork"):
        if meanwhile is not None:
            meanwhile()
        results = []
        for i, t in enumerate(tasks):
            results.append(fn(t))
            if on_done is not None:
                on_done(i)
        return results
    cost = list(hints) if hints is not None else [1.0] * n
    todo = deque(sorted(range(n), key=lambda j: (-float(cost[j]), j)))
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}          # result pipe's read end -> pid
    orders: dict[int, int] = {}            # result pipe's read end -> the pipe its worker reads tasks from
    for _ in range(min(workers, n)):
        r, w = os.pipe()                   # results, worker -> here
        tr, tw = os.pipe()                 # task indices, here -> worker (-1: stop)
        pid = os.fork()
        if pid == 0:                                    # the child: run each task it is handed, send each result
            os.close(r)
            os.close(tw)
            code = 0
            try:
                while (i := _read_index(tr)) >= 0:
                    try:
                        payload = pickle.dumps((i, True, fn(tasks[i])), protocol=pickle.HIGHEST_PROTOCOL)
                    except BaseException as e:      # noqa: BLE001 — sent to the parent, raised there
                        payload = _failure(i, e)
                    _write_frame(w, payload)
            except BaseException:                   # noqa: BLE001 — the parent reruns what is missing
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        os.close(tr)
        children[r] = pid
        orders[r] = tw
        _hand_out(orders, r, todo)
    if meanwhile is not None:
        meanwhile()
    got: dict[int, Any] = {}
    failure: tuple[int, BaseException] | None = None
    buffers = {r: bytearray() for r in children}
    open_fds = set(children)
    try:
        while open_fds:
            ready, _, _ = select.select(sorted(open_fds), [], [])
            for fd in ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:                       # the worker is gone (done, or died: its task runs here)
                    open_fds.discard(fd)
                    os.close(fd)
                    if fd in orders:
                        os.close(orders.pop(fd))
                    continue
                buffers[fd] += chunk
                while (frame := _take_frame(buffers, fd)) is not None:
                    i, ok, value = pickle.loads(frame)
                    _hand_out(orders, fd, todo)     # the worker is free: the next task, or stop
                    if ok:
                        got[i] = value
                        if on_done is not None:
                            on_done(i)
                    elif failure is None or i < failure[0]:
                        failure = (i, value)
    finally:
        for tw in orders.values():
            os.close(tw)
        if open_fds:            # stopped early (an exception here, ^C): end the workers, leave no zombie
            for fd in open_fds:
                os.close(fd)
            for pid in children.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in children.values():
            os.waitpid(pid, 0)
    if failure is not None:         # the first failing task's exception, as one process would raise it
        raise failure[1]
    for i in range(n):              # a worker that died without a word: its tasks run here
        if i not in got:
            got[i] = fn(tasks[i])
            if on_done is not None:
                on_done(i)
    return [got[i] for i in range(n)]


def _hand_out(orders: dict[int, int], fd: int, todo: deque[int]) -> None:
    """Send the worker of result pipe ``fd`` the next task (largest hint first), or stop it (-1)
    when none is left; a worker that is gone gives its task back to the queue."""
    if fd not in orders:
        return
    i = todo.popleft() if todo else -1
    try:
        os.write(orders[fd], struct.pack("<q", i))
    except OSError:             # it died: the task waits for another worker (or runs here)
        if i >= 0:
            todo.appendleft(i)
        os.close(orders.pop(fd))
        return
    if i < 0:
        os.close(orders.pop(fd))


def _read_index(fd: int) -> int:
    """The next task index a worker is handed (-1: stop; the parent gone: stop)."""
    data = b""
    while len(data) < 8:
        chunk = os.read(fd, 8 - len(data))
        if not chunk:
            return -1
        data += chunk
    return int(struct.unpack("<q", data)[0])


def _failure(i: int, e: BaseException) -> bytes:
    """Task ``i``'s exception as a frame: itself where it pickles, else a ``RuntimeError`` naming it."""
    try:
        return pickle.dumps((i, False, e), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:   # noqa: BLE001 — an exception holding what cannot be pickled
        return pickle.dumps((i, False, RuntimeError(f"{type(e).__name__}: {e}")))


def _write_frame(fd: int, payload: bytes) -> None:
    data = struct.pack("<Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _take_frame(buffers: dict[int, bytearray], fd: int) -> bytes | None:
    buf = buffers[fd]
    if len(buf) < 8:
        return None
    (size,) = struct.unpack("<Q", buf[:8])
    if len(buf) < 8 + size:
        return None
    frame = bytes(buf[8:8 + size])
    del buf[:8 + size]
    return frame


__all__ = ["WORKERS_ENV", "default_workers", "fork_map"]
