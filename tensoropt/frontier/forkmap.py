"""``fork_map``: a function over independent tasks in forked copies of this process, results in
task order — how the frontier builds its meshes' problems side by side; and ``fork_serve``, the
same workers fed by a :class:`TaskSource` that decides each next task as results arrive — how
it shares the meshes' τ runs (:mod:`.meshwork`).

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
  worker).  Which worker ran a task never changes its result.  ``fork_serve`` asks its source
  instead, each time a worker is free; each task is sent pickled, each result comes back with
  the seconds the worker spent on it.
- **A worker that fails leaves no gap**: an exception in a task is sent back and raised here
  (the first failing task's, itself where it pickles); a worker that dies without a word (killed,
  out of memory) has the task it was running run again here, in this process.
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
import gc
import os
import pickle
import select
import signal
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

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


class TaskSource(Protocol):
    """What :func:`fork_serve` asks for work.  Tasks must pickle and are never ``None``."""

    def next(self, worker: int) -> Any:
        """The next task for ``worker`` (0 … workers − 1), or ``None``: nothing for it now (it waits,
        and is asked again when any result arrives)."""

    def done(self, worker: int, task: Any, ok: bool, value: Any, seconds: float) -> None:
        """``task``, run by ``worker`` in ``seconds``, gave ``value`` (``ok``) or raised it."""

    def gone(self, worker: int) -> None:
        """``worker`` died (its running task, if any, was run here and given to :meth:`done` first);
        it is never asked again."""

    @property
    def finished(self) -> bool:
        """True once nothing is left to hand out or wait for: the workers are stopped."""


def fork_serve(fn: Callable[[Any], object], source: TaskSource, *, workers: int | None = None,
               meanwhile: Callable[[], object] | None = None) -> None:
    """Run ``fn`` on every task ``source`` hands out, in up to ``workers`` forked processes
    (module docstring), until ``source.finished``; each result goes to ``source.done`` here, in
    arrival order.  A worker keeps its process between tasks, so what ``fn`` leaves in that
    process (a cache) serves its next task.  One worker, or no ``os.fork``: every task runs here,
    unforked.  ``meanwhile()`` here once, after the workers are forked (or before the first
    task).  A source that hands nothing out while nothing runs and is not finished is a bug:
    ``RuntimeError``."""
    workers = default_workers() if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if workers == 1 or not hasattr(os, "fork"):
        if meanwhile is not None:
            meanwhile()
        _serve_here(fn, source, 0)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    # every object alive now out of the collector's sight until the work is done: a collection in
    # a worker would otherwise write into the header of every object it inherited, copying the
    # whole heap page by page, and one here would walk it all as results arrive (on GPT-2-12L
    # after a search: 0.2 s for each problem pickled in a worker, and its next task 0.2 s late)
    # (the outermost call only: a worker that serves workers of its own keeps its parent's freeze)
    if not _FROZEN[0]:
        gc.freeze()
    _FROZEN[0] += 1
    try:
        _serve_forked(fn, source, workers, meanwhile)
    finally:
        _FROZEN[0] -= 1
        if not _FROZEN[0]:
            gc.unfreeze()


#: how many fork_serve calls in this process (or the parent it was forked from) hold the heap frozen
_FROZEN = [0]


def _serve_forked(fn: Callable[[Any], object], source: TaskSource, workers: int,
                  meanwhile: Callable[[], object] | None) -> None:
    results: dict[int, int] = {}        # worker -> its result pipe's read end
    orders: dict[int, int] = {}         # worker -> the pipe it reads tasks from
    pids: dict[int, int] = {}
    for w in range(workers):
        r, wr = os.pipe()               # results, worker -> here
        tr, tw = os.pipe()              # tasks, here -> worker (None: stop)
        pid = os.fork()
        if pid == 0:                    # the child: run each task it is handed, send each result
            os.close(r)
            os.close(tw)
            code = 0
            try:
                while (frame := _read_frame(tr)) is not None and (task := pickle.loads(frame)) is not None:
                    t0 = time.perf_counter()
                    try:
                        value = fn(task)
                        payload = pickle.dumps((True, value, time.perf_counter() - t0),
                                               protocol=pickle.HIGHEST_PROTOCOL)
                    except BaseException as e:      # noqa: BLE001 — sent to the parent, raised there
                        payload = _failure(e, time.perf_counter() - t0)
                    _write_frame(wr, payload)
            except BaseException:                   # noqa: BLE001 — the parent reruns what is missing
                code = 1
            finally:
                os._exit(code)
        os.close(wr)
        os.close(tr)
        results[w], orders[w], pids[w] = r, tw, pid
    running: dict[int, Any] = {}        # worker -> the task it runs
    waiting: list[int] = []             # workers the source had nothing for

    def offer(w: int) -> None:
        if source.finished:
            _stop(orders, w)
            return
        task = source.next(w)
        if task is None:
            waiting.append(w)
            return
        running[w] = task
        with contextlib.suppress(OSError):     # it died: its result pipe says so next
            _write_frame(orders[w], pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL))

    try:
        for w in range(workers):
            offer(w)
        if meanwhile is not None:
            meanwhile()
        buffers = {results[w]: bytearray() for w in results}
        worker_of = {fd: w for w, fd in results.items()}
        open_fds = set(buffers)
        while not source.finished:
            if not open_fds:            # every worker gone: the rest runs here
                _serve_here(fn, source, 0)
                break
            if not running:
                raise RuntimeError("the task source handed nothing out, and nothing runs, before it finished")
            ready, _, _ = select.select(sorted(open_fds), [], [])
            for fd in ready:
                w = worker_of[fd]
                chunk = os.read(fd, 1 << 20)
                if not chunk:           # the worker is gone: the task it ran runs here
                    open_fds.discard(fd)
                    _stop(orders, w)
                    if w in running:
                        _run_here(fn, source, w, running.pop(w))
                    source.gone(w)
                else:
                    buffers[fd] += chunk
                    while (frame := _take_frame(buffers, fd)) is not None:
                        ok, value, seconds = pickle.loads(frame)
                        source.done(w, running.pop(w), ok, value, seconds)
                        offer(w)
                for v in [v for v in waiting if v in orders]:     # a result may have made work for them
                    waiting.remove(v)
                    offer(v)
    finally:
        for w in list(orders):
            _stop(orders, w)
        for fd in results.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        if running:     # stopped early (an exception here, ^C, a failure that ends the source): end the workers
            for pid in pids.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in pids.values():
            os.waitpid(pid, 0)


def _serve_here(fn: Callable[[Any], object], source: TaskSource, worker: int) -> None:
    """Every task of ``source`` run in this process, as ``worker``."""
    while not source.finished:
        task = source.next(worker)
        if task is None:
            raise RuntimeError("the task source handed nothing out, and nothing runs, before it finished")
        _run_here(fn, source, worker, task)


def _run_here(fn: Callable[[Any], object], source: TaskSource, worker: int, task: Any) -> None:
    """``task`` run in this process as ``worker``'s, its result (or exception) and seconds to ``source``."""
    t0 = time.perf_counter()
    try:
        ok, value = True, fn(task)
    except Exception as e:     # noqa: BLE001 — the source decides what a failure means
        ok, value = False, e
    source.done(worker, task, ok, value, time.perf_counter() - t0)


def _stop(orders: dict[int, int], w: int) -> None:
    """Tell worker ``w`` to stop (it exits once its pipe closes), once."""
    fd = orders.pop(w, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            _write_frame(fd, pickle.dumps(None))
        os.close(fd)


class _InOrder:
    """:func:`fork_map`'s source: task indices, largest hint first, each to the first worker free."""

    def __init__(self, n: int, hints: Sequence[float], on_done: Callable[[int], None] | None):
        self.n = n
        self.todo = deque(sorted(range(n), key=lambda j: (-float(hints[j]), j)))
        self.got: dict[int, Any] = {}
        self.failures: dict[int, BaseException] = {}
        self.on_done = on_done

    def next(self, worker: int) -> int | None:
        return self.todo.popleft() if self.todo else None

    def gone(self, worker: int) -> None:
        pass

    def done(self, worker: int, task: int, ok: bool, value: Any, seconds: float) -> None:
        if ok:
            self.got[task] = value
            if self.on_done is not None:
                self.on_done(task)
        else:
            self.failures[task] = value

    @property
    def finished(self) -> bool:
        return len(self.got) + len(self.failures) == self.n


def fork_map(fn: Callable[[T], R], tasks: Sequence[T], *, workers: int | None = None,
             hints: Sequence[float] | None = None,
             on_done: Callable[[int], None] | None = None,
             meanwhile: Callable[[], object] | None = None) -> list[R]:
    """``[fn(t) for t in tasks]``, computed in up to ``workers`` forked processes (module
    docstring).  ``hints``: each task's expected cost (default: equal); ``on_done(i)`` is
    called here as task ``i``'s result arrives (in arrival order); ``meanwhile()`` here once,
    after the workers are forked and before their results are read (or before the first task,
    when nothing is forked): work of this process's own that would otherwise wait.  The first
    failing task's exception (lowest index) is raised once every task has run."""
    n = len(tasks)
    workers = default_workers() if workers is None else int(workers)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    source = _InOrder(n, list(hints) if hints is not None else [1.0] * n, on_done)
    if workers == 1 or n <= 1:
        if meanwhile is not None:
            meanwhile()
        for i, t in enumerate(tasks):      # in order, and an exception straight through, as a loop
            source.done(0, i, True, fn(t), 0.0)
    else:                   # the tasks are in each forked worker already: only indices are sent
        fork_serve(lambda i: fn(tasks[i]), source, workers=min(workers, n), meanwhile=meanwhile)
    if source.failures:     # the first failing task's exception, as one process would raise it
        raise source.failures[min(source.failures)]
    return [source.got[i] for i in range(n)]


def _read_frame(fd: int) -> bytes | None:
    """One frame from pipe ``fd``, or ``None`` when it closed first (the parent is gone)."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    return _read_exactly(fd, struct.unpack("<Q", head)[0])


def _read_exactly(fd: int, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _failure(e: BaseException, seconds: float) -> bytes:
    """An exception as a result frame: itself where it pickles, else a ``RuntimeError`` naming it."""
    try:
        return pickle.dumps((False, e, seconds), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:   # noqa: BLE001 — an exception holding what cannot be pickled
        return pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}"), seconds))


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


__all__ = ["WORKERS_ENV", "TaskSource", "default_workers", "fork_map", "fork_serve"]
