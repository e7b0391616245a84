"""What an exported ``train.py`` calls when PyTorch's wrappers cannot express the plan: tensoropt's
distributed executor, one process per rank, printing every step's loss.

:func:`train` is ``tensoropt run MODEL --plan plan.json --backend dist`` without the check and
the timing: the same load (:func:`tensoropt.execute.runplan.load_for_run`: the model built from
its spec on every rank, rank 0's weights and inputs given to all), the same executor
(:class:`tensoropt.distributed.backend.DistributedBackend`), the plan's optimizer; each step
prints ``step K loss X`` on rank 0 (``X``: ``repr`` of the whole loss, summed over the ranks'
parts), the line :data:`tensoropt.export.render.LOSS_LINE` reads.

Owns: that loop.  Must not: rewrite graphs or talk to peers itself (the executor does).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

import torch

from ..distributed.backend import DistributedBackend
from ..distributed.runtime import DEFAULT_TIMEOUT_S, Runtime, init_runtime, shutdown
from ..errors import DistributedError, TensorOptError
from ..execute.runplan import load_for_run, load_plan
from ..measure.step import make_optimizer, plan_optimizer


def train(spec: str, plan_path: str, *, steps: int, lr: float = 1e-3, seed: int = 0, batch: int | None = None,
          precision: str = "fp32", world_size: int | None = None, rank_map: Mapping[str, int] | None = None,
          timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """Train ``steps`` steps of ``plan_path`` on ``spec`` on this rank (under torchrun); returns
    the exit code (0, or the error's after one line on stderr naming the rank and the cause)."""
    rt = None
    try:
        rt = init_runtime(timeout_s=timeout)
        if world_size is not None and rt.world_size != world_size:
            raise DistributedError(f"the plan runs on {world_size} ranks, torchrun started {rt.world_size}: start "
                                   f"it with --nproc-per-node {world_size} (README.md)")
        _steps(rt, spec, plan_path, steps=steps, lr=lr, seed=seed, batch=batch, precision=precision,
               rank_map=rank_map)
        return 0
    except TensorOptError as e:
        where = f"rank {rt.rank}: " if rt is not None and not str(e).startswith("rank ") else ""
        print(f"error: {where}{e}", file=sys.stderr, flush=True)
        return e.exit_code
    finally:
        shutdown()   # after _steps returned: nothing of the run holds the group any more


def _steps(rt: Runtime, spec: str, plan_path: str, *, steps: int, lr: float, seed: int, batch: int | None,
           precision: str, rank_map: Mapping[str, int] | None) -> None:
    torch.manual_seed(seed)
    backend = DistributedBackend(rt, rank_map)
    model, call, graph = load_for_run(spec, backend, batch, precision)
    plan = load_plan(plan_path, graph)
    trainer = backend.apply(model, call, plan, graph)
    params = trainer.parameters()
    opt = make_optimizer(plan_optimizer(plan), params, lr=lr) if params else None
    for step in range(1, steps + 1):
        trainer.before_step()
        loss = trainer.step()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if rt.rank == 0:
            print(f"step {step} loss {float(loss.item())!r}", flush=True)
