"""The search's compiled kernels: compiled with numba, and compiled before the search needs them.

The frontier's hot loops are numba kernels — the frontier products and scans
(:mod:`tensoropt.frontier.point_sets`), the polish's additive sums
(:mod:`tensoropt.frontier.polish_kernels`) and the plan evaluator's memory walk and simulator
(:mod:`tensoropt.planmodel.meshkernels`) — cached on disk (``cache=True``: beside the module, or in
numba's user cache when that is read-only).  Compiling them all takes about 25 s of one core on a
2-core machine: more than the dashboard's default needs for everything else.

So they are compiled before any job needs them, at two moments:

- **at install** — ``pip install -e .`` runs :func:`build` (``setup.py``), which fills numba's
  cache beside the sources the installed package imports: the first job finds every kernel
  cached.  The kernels' modules (:data:`MODULES`) import nothing but NumPy, numba and this module,
  so the install compiles them in its build environment without torch;
- **at a job's start**, where the cache still misses a kernel (an install that could not compile,
  an edited kernel, another numba): :func:`start` forks one process per registered part, which
  compile while the job captures and profiles its model, and :func:`ready` (called by
  :func:`~tensoropt.frontier.track_frontier` and by
  :class:`~tensoropt.planmodel.meshplan.MeshEvaluator` before their first kernel call) waits for
  them; every process then loads the kernels from the cache.

Each module declares its kernels with :func:`compiled` and registers, with :func:`ahead`, a
function (a *part*) that calls them on tiny inputs of the types the search passes.  When every
kernel is in the cache already (:func:`cached`: the index numba keeps per function is there and
fresh) nothing is started, and :func:`ready` returns at once.

It owns when the kernels compile, never what they compute; a compiling process that fails or
is killed costs nothing but its time (the kernels then compile on first call, as numba does).

Example::

    >>> import tensoropt
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
from typing import Any, TypeVar, cast

try:  # numba is a dependency, but a broken install should degrade to NumPy, not fail imports
    from numba import njit

    HAVE_NUMBA = True
except Exception:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

#: the modules that declare kernels and register their parts: each imports nothing but NumPy, numba
#: and this module (:func:`build` imports them without torch); a new one is added here
MODULES = ("tensoropt.frontier.point_sets", "tensoropt.frontier.polish_kernels", "tensoropt.planmodel.meshkernels")
#: every kernel :func:`compiled` made, and the functions :func:`ahead` registered, in import order
_DISPATCHERS: list[Any] = []
PARTS: list[Callable[[], None]] = []
#: the processes (ids) :func:`start` began and :func:`ready` has not yet waited for, and the
#: process that began them (only it can wait for them)
_pending: list[int] = []
_owner = 0
#: how long :func:`ready` waits for them (seconds) before it stops them: they take 15 s on two cores;
#: a process forked from a threaded one can deadlock on a lock another thread held
WAIT_LIMIT_S = 120.0

_F = TypeVar("_F", bound=Callable[..., Any])


def compiled(fn: _F) -> _F:
    """``numba.njit(cache=True)`` (the function as it is without numba), typed for mypy (which
    sees the Python function), and known to :func:`cached`."""
    if not HAVE_NUMBA:   # pragma: no cover
        return fn
    kernel = njit(cache=True)(fn)
    _DISPATCHERS.append(kernel)
    return cast(_F, kernel)


def ahead(part: Callable[[], None]) -> Callable[[], None]:
    """Register ``part``, a function that calls some kernels on tiny inputs (so that they compile),
    to run in a process of its own at :func:`start`: a few seconds of compiling each."""
    PARTS.append(part)
    return part


def dispatchers() -> list[Any]:
    """Every kernel :func:`compiled` made (import order)."""
    return list(_DISPATCHERS)


def _cached_signatures(kernel: Any) -> list[Any]:
    """The signatures of ``kernel`` that numba's cache holds for this machine and this source: the
    index numba keeps per function, each entry's key checked as numba checks it (the signature, the
    CPU and its features, the function's bytecode); an index of an edited source or of another
    numba reads as empty."""
    codegen = kernel.targetctx.codegen()
    cache = kernel._cache
    return [key[0] for key in cache._cache_file._load_index() if key == cache._index_key(key[0], codegen)]


def cached() -> bool:
    """Whether every kernel has an entry in numba's cache that this machine can load (not one of
    another CPU, an edited source or another numba).  O(kernels) small file reads."""
    try:
        return all(_cached_signatures(d) for d in _DISPATCHERS)
    except Exception:  # noqa: BLE001 - numba's cache layout is not a public API: when it moves, compile
        return False


def load() -> int:
    """Load every kernel numba's cache holds, each signature it was compiled for, into this process;
    how many.  A process that is about to fork workers calls it once (about 0.4 s on this kind of
    machine): each worker would otherwise load the kernels it calls on its own, side by side, and
    this process again after them.  Nothing is compiled; a kernel missing from the cache is left to
    its first call.  (A thread does not hide it: loading holds the GIL.)"""
    n = 0
    for d in _DISPATCHERS:
        try:
            sigs = _cached_signatures(d)
        except Exception:  # noqa: BLE001 - numba's cache layout is not a public API: leave it to first calls
            return n
        for sig in sigs:
            if sig not in d.overloads:
                d.compile(sig)
                n += 1
    return n


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


def build() -> bool:
    """Compile every kernel of :data:`MODULES` into numba's cache now, its parts in processes of
    their own (two cores: about 15 s), and whether every kernel is cached after.  What a package
    install runs (``setup.py``), in a process where ``tensoropt`` is a bare namespace: only these
    modules load, not the package (which imports torch)."""
    for name in MODULES:
        importlib.import_module(name)
    if hasattr(os, "fork"):
        start()
        ready()
    else:   # pragma: no cover - Windows: one part after another
        for part in PARTS:
            part()
    return cached()
