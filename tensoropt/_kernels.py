"""The search's compiled kernels, compiled before the search needs them.

The frontier's hot loops are numba kernels — the frontier products and scans
(:mod:`tensoropt.frontier.point_sets`), the polish's additive sums (:mod:`tensoropt.frontier.track`)
and the plan evaluator's memory walk and simulator (:mod:`tensoropt.planmodel.meshplan`) — compiled
on their first call and cached on disk (``cache=True``: beside the module, or in numba's user cache
when that is read-only).  On a fresh install the first search compiles them all: about 21 s of one
core on a 2-core machine, and every worker process of the search compiled them at once, each on
its own, while a job's capture and profile had left the second core idle.

:func:`start` forks three processes that compile them on tiny inputs (:data:`PARTS`: the
frontier's kernels, the evaluator's walk, its simulator) so that they compile while the job
captures and profiles its model; :func:`ready` (called by :func:`~tensoropt.frontier.track_frontier` and
by :class:`~tensoropt.planmodel.meshplan.MeshEvaluator` before their first kernel call) waits
for them, after which every process loads the kernels from the cache.  When every kernel is in
the cache already (:func:`cached`: the index numba keeps per function is there and fresh) nothing
is started, and :func:`ready` returns at once.

It owns when the kernels compile, never what they compute; a compiling process that fails or
is killed costs nothing but its time (the kernels then compile on first call, as numba does).

Example::

    >>> import tensoropt._kernels as kernels
    >>> kernels.start()          # at a job's start: nothing to do when the cache is warm
    >>> kernels.ready()          # before the first kernel call: waits for what start() began
    >>> kernels.cached()
    True
"""

from __future__ import annotations

import importlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

#: the processes (ids) :func:`start` began and :func:`ready` has not yet waited for, and the
#: process that began them (only it can wait for them)
_pending: list[int] = []
_owner = 0
#: how long :func:`ready` waits for them (seconds) before it stops them: they take 15 s on two cores;
#: a process forked from a threaded one can deadlock on a lock another thread held
WAIT_LIMIT_S = 300.0


def _modules() -> list[Any]:
    # by module path: the package ``tensoropt.frontier`` exports a function named ``track``
    return [importlib.import_module(f"tensoropt.{m}") for m in ("frontier.point_sets", "frontier.track",
                                                                  "planmodel.meshplan")]


def dispatchers() -> list[Any]:
    """Every numba kernel of the search (module order, then name)."""
    try:
        from numba.core.registry import CPUDispatcher
    except ImportError:   # pragma: no cover - numba is a dependency
        return []
    return [obj for mod in _modules() for _, obj in sorted(vars(mod).items()) if isinstance(obj, CPUDispatcher)]


def cached() -> bool:
    """Whether every kernel has a fresh entry in numba's cache (read from the index files numba
    keeps per function: a stale one, of an edited source or another numba, counts as missing).
    O(kernels) small file reads."""
    try:
        return all(d._cache._cache_file._load_index() for d in dispatchers())
    except Exception:  # noqa: BLE001 - numba's cache layout is not a public API: when it moves, compile
        return False


def _frontier_kernels() -> None:
    """The frontier's kernels on a tiny problem: both product kernels, the reduce scan, the
    polish's additive sums (the same argument types the search passes: contiguous int64 / float64)."""
    import numpy as np

    point_sets, track = _modules()[:2]
    m = np.array([1.0, 2.0, 3.0])
    t = np.array([3.0, 2.0, 1.0])
    start = np.array([0, 3], dtype=np.int64)
    one = np.array([0, 1], dtype=np.int64)
    pair = np.zeros(1, dtype=np.int64)
    point_sets.reduce(m, t)
    point_sets.batched_product(m, t, start, m, t, start, one, pair, pair)
    limit = point_sets.PRUNE_MIN_CANDIDATES
    point_sets.PRUNE_MIN_CANDIDATES = 0   # this process only: the pruned kernel on the same product
    try:
        point_sets.batched_product(m, t, start, m, t, start, one, pair, pair)
    finally:
        point_sets.PRUNE_MIN_CANDIDATES = limit
    # two nodes of two configurations, one edge
    vecs = np.zeros((1, 2), dtype=np.int64)
    node = np.ones((2, 2))
    ends = np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64)
    edge = np.ones((1, 2, 2))
    track._additive_many(vecs, node, node, node, *ends, edge, edge)
    track._single_moves(vecs[0], np.full(2, 2, dtype=np.int64), node, node, node, *ends, edge, edge,
                        np.array([0, 1, 2], dtype=np.int64), np.zeros(2, dtype=np.int64))


def _tiny_evaluator() -> Any:
    """A plan evaluator (:class:`~tensoropt.planmodel.meshplan.MeshEvaluator`) of a tiny captured
    model — an embedding whose weight the output reuses and a residual block, priced through a
    device model (nothing timed) — on two devices (about 1 s)."""
    import torch

    from .capture import capture
    from .cluster import load_cluster
    from .devicemodel import price
    from .measure import profile
    from .planmodel.meshplan import MeshEvaluator

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(16, 8)
            self.norm = torch.nn.LayerNorm(8)
            self.mlp = torch.nn.Linear(8, 8)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            x = x + torch.relu(self.mlp(self.norm(x)))
            return x @ self.embed.weight.t()

    graph = capture(Tiny(), (torch.zeros(2, 4, dtype=torch.long),))
    cluster = load_cluster("preset:v100-8-nvlink")
    costs = price(profile(graph, shard_degrees=(1, 2), repeats=1, timed=False), cluster, costs_from="model").costs
    return MeshEvaluator(graph, costs, cluster, cluster.names[:2])


def _walk_kernels() -> None:
    """The plan evaluator's memory walk, of one plan and of many (about 7 s to compile)."""
    import numpy as np
    meshplan = _modules()[2]
    ev = _tiny_evaluator()
    tables = ev._tables["walk"]
    vecs = np.zeros((2, len(ev.names)), dtype=np.int64)
    meshplan._walk_many(vecs, *tables)
    meshplan._walk(vecs[0], *tables)


def _simulate_kernels() -> None:
    """The plan evaluator's simulator, of one plan and of many (about 6 s to compile)."""
    import numpy as np
    meshplan = _modules()[2]
    ev = _tiny_evaluator()
    tables = ev._tables["time"]
    vecs = np.zeros((2, len(ev.names)), dtype=np.int64)
    meshplan._simulate_many(vecs, *tables)
    meshplan._simulate(vecs[0], *tables)


#: what each compiling process runs (a third of the compile time each, about 7-9 s on this kind of
#: machine: three, because the two cores also run the job meanwhile, and no part waits alone at the end)
PARTS: tuple[Callable[[], None], ...] = (_frontier_kernels, _walk_kernels, _simulate_kernels)


def _compile(part: Callable[[], None]) -> None:
    """The body of a compiling process: ``part``, silent, then exit (never return into the caller's
    code: this is a fork of it)."""
    code = 1
    try:
        # nothing to say, and holding the job's stdout / stderr would keep a reader of the job's
        # output (a pipe) waiting for this process too
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        part()
        code = 0
    except BaseException:  # noqa: BLE001 - whatever failed compiles on first call instead
        pass
    finally:
        os._exit(code)


def start() -> None:
    """Fork the processes that compile the kernels (:data:`PARTS`), unless every kernel is cached
    or they were started already; returns at once.  Call it where the job starts, before it
    starts threads (a fork copies one)."""
    global _owner
    if (_pending and _owner == os.getpid()) or not hasattr(os, "fork") or cached():
        return   # started already; or no fork (Windows): the kernels compile on first call
    _pending.clear()   # a fork's copy of its parent's: not this process's children
    _owner = os.getpid()
    for part in PARTS:
        pid = os.fork()   # not multiprocessing: its daemonic processes (the dashboard's) may not fork
        if pid == 0:
            _compile(part)
        _pending.append(pid)


def ready(timeout_s: float = WAIT_LIMIT_S) -> None:
    """Wait for the processes :func:`start` began (none: return at once); one still compiling
    after ``timeout_s`` (seconds, all together) is stopped — its kernels then compile on first
    call.  After it, a kernel's first call in this process and in the processes it forks loads it
    from the cache.  In a process forked before they ended, which cannot wait for them, it returns
    at once."""
    if _owner != os.getpid():
        _pending.clear()
    deadline = time.monotonic() + timeout_s
    while _pending:
        pid = _pending[-1]
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if not done and time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            elif not done:
                time.sleep(0.02)
                continue
        except (ChildProcessError, ProcessLookupError):   # reaped already (a SIGCHLD handler of the caller's)
            pass
        _pending.pop()
