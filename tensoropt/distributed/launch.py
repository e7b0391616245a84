"""Start ``world_size`` local processes that each join a gloo (or NCCL) group and run one job:
what the tests and ``benchmarks/truth.py`` use instead of ``torchrun`` on one machine.

:func:`launch` starts its workers from a fork server (``forkserver``: a script that calls it needs
``if __name__ == "__main__":``, as with ``spawn``) that has imported torch and this module once, so
a launch after the first starts its workers in a tenth of a second instead of each importing torch
anew (2.4 s a launch of two ranks on this 2-core VM); each worker takes the parent's environment
as it is at the launch (a fork server's children would otherwise see the environment it was
started with), one OpenMP thread each; the parent hosts the rendezvous store on
a port the OS picks (no race for a free port), like ``tensoropt bench-links``
(:mod:`tensoropt.cluster.bench`).  A job is a module-level function ``job(runtime, **kwargs)``
whose return value is pickled back; results come back by rank.  A worker that raises, dies or
says nothing past the timeout ends the launch with a :class:`~tensoropt.errors.DistributedError`
naming the rank (every worker is ended either way).

Owns: local worker processes and their results.  Must not: know what a job does, nor leave a
worker running when it returns or raises.
"""

from __future__ import annotations

import datetime
import importlib
import multiprocessing as mp
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .._malloc import steady_malloc
from .._procs import WorkerDied, next_message, single_threaded_env, stop_workers
from ..errors import DistributedError, TensorOptError
from .runtime import DEFAULT_TIMEOUT_S, init_runtime, shutdown


def _entry(rank: int, world_size: int, port: int, q: Any, job: str, kwargs: dict, timeout_s: float,
           backend: str, environ: dict[str, str]) -> None:
    """Body of one worker: take the parent's ``environ``, join the group, run ``job``
    (``module:function``), report to ``q``."""
    try:
        os.environ.clear()
        os.environ.update(environ)
        steady_malloc()   # the profile's allocator regime (tensoropt._malloc)
        torch.set_num_threads(1)
        module, _, name = job.partition(":")
        fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
        rt = init_runtime(rank=rank, world_size=world_size, master_addr="127.0.0.1", master_port=port,
                          backend=backend, timeout_s=timeout_s, host_store=False, local_rank=rank)
        result = fn(rt, **kwargs)
        shutdown()
        q.put(("done", rank, result))
    except TensorOptError as e:
        q.put(("error", rank, str(e)))
        raise SystemExit(1) from None
    except BaseException:  # noqa: BLE001 - everything goes to the parent, which raises it
        q.put(("error", rank, traceback.format_exc()))
        raise SystemExit(1) from None


def launch(job: str | Callable[..., Any], world_size: int, kwargs: dict | None = None, *,
           timeout_s: float = DEFAULT_TIMEOUT_S, backend: str = "gloo", startup_s: float = 90.0) -> list[Any]:
    """Run ``job(runtime, **kwargs)`` on ranks ``0 … world_size − 1``; return the results by rank.

    ``job``: a module-level function or ``"module:function"``.  ``timeout_s``: the group's timeout
    (every wait inside the job); the parent gives up after ``1.25 × timeout_s + 5`` s without a
    result once the workers are up (``startup_s`` to import torch and build the model).
    """
    if callable(job):
        job = f"{job.__module__}:{job.__name__}"
    if world_size < 1:
        raise DistributedError(f"world size must be at least 1, got {world_size}")
    # torch.distributed re-exports TCPStore from its C extension without listing it as public
    store = dist.TCPStore("127.0.0.1", 0, None, True,  # type: ignore[attr-defined, unused-ignore]
                          timeout=datetime.timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])   # torch and this module imported once, in the server
    q = ctx.Queue()
    results: dict[int, Any] = {}
    start = time.monotonic()
    procs: list[Any] = []
    try:
        with single_threaded_env():
            environ = dict(os.environ)
            procs = [ctx.Process(target=_entry, name=f"tensoropt-dist-{r}", daemon=True,
                                 args=(r, world_size, store.port, q, job, kwargs or {}, timeout_s, backend, environ))
                     for r in range(world_size)]
            for p in procs:
                p.start()
        while len(results) < world_size:
            try:
                msg = next_message(procs, q, results, grace_s=1.0 + min(timeout_s, 5.0))
            except WorkerDied as e:
                raise DistributedError(f"rank {e.rank} of {world_size} died with exit code {e.exitcode} without a "
                                       "message (killed? out of memory?)") from None
            if msg is None:
                if time.monotonic() - start > startup_s + 1.25 * timeout_s + 5.0:
                    stuck = [r for r in range(world_size) if r not in results]
                    raise DistributedError(f"rank(s) {stuck} of {world_size} did not finish within "
                                           f"{startup_s + 1.25 * timeout_s + 5.0:.0f} s; raise the timeout")
                continue
            kind, rank, payload = msg
            if kind == "done":
                results[rank] = payload
            else:
                # a peer's death is usually why this rank failed: give its exit code a moment to show
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline and not any(
                        p.exitcode not in (None, 0) for r, p in enumerate(procs) if r != rank):
                    time.sleep(0.05)
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r != rank]
                died = "; ".join(f"rank {r} exited with code {procs[r].exitcode}" for r in dead)
                raise DistributedError(f"rank {rank} of {world_size} failed: {payload.strip()}"
                                       + (f" ({died})" if died else ""))
    finally:
        stop_workers(procs, q)
        del store
    return [results[r] for r in range(world_size)]
