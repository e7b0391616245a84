"""``tensoropt run MODEL --plan P --backend dist`` (to be wired into ``tensoropt run``) and
``python -m tensoropt.distributed MODEL --plan P`` — one process per rank, started by torchrun.

Single host, K ranks (plan device ``i`` on rank ``i`` unless ``--device-map`` says otherwise)::

    torchrun --nproc-per-node K -m tensoropt.distributed MODEL --plan plan.json --check

Two hosts (run on each, ``--node-rank`` 0 and 1; HOST0 reachable from both)::

    torchrun --nnodes 2 --nproc-per-node K --node-rank N --rdzv-backend c10d \\
        --rdzv-endpoint HOST0:29500 -m tensoropt.distributed MODEL --plan plan.json

Without torchrun, start each rank yourself with ``--rank R --world-size W --master-addr HOST0
--master-port PORT``.  Rank 0 prints; every rank exits 2 with one line naming the cause on bad
input or when a peer fails.

Owns: the command line of one rank — arguments, loading the model and plan, the optional
check, the timed steps and rank 0's report.  Must not: implement execution or checking (it
calls :mod:`.run` and :func:`tensoropt.execute.check.prepare_check`) nor print from ranks
other than 0 except errors.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import torch
import torch.distributed as dist
from torch import nn

from .._malloc import steady_malloc
from ..capture import ModelCall, capture
from ..cli._common import add_precision_argument
from ..errors import TensorOptError
from ..execute.check import CheckDtypeError, Comparison, prepare_check
from ..graph import OpGraph
from ..measure.step import make_optimizer, plan_optimizer
from ..modelspec import load_model
from ..plan import Plan
from .run import DistributedExecutor, apply_plan_distributed, compare_distributed
from .runtime import DEFAULT_TIMEOUT_S, Runtime, init_runtime, parse_rank_map, shutdown
from .transport import COLLECTIVES, COLLECTIVES_HELP


def run_distributed(model_spec: str, plan_path: str, *, steps: int = 5, check: bool = False,
                    device_map: str | dict[str, int] | None = None, master_addr: str | None = None,
                    master_port: int | None = None, timeout: float = DEFAULT_TIMEOUT_S, backend: str = "auto",
                    rank: int | None = None, world_size: int | None = None, lr: float = 1e-3,
                    batch: int | None = None, collectives: str = "auto", out: TextIO | None = None,
                    check_dtype: str | None = None, precision: str | None = None) -> int:
    """Run ``steps`` SGD steps of ``plan_path`` on this rank (rank / world size from the torchrun
    environment unless given), after ``check`` (loss, every gradient and written buffer against
    the unmodified model, dropout off, in ``check_dtype``: float64 by default, float32 with a
    note for a model that cannot be captured in float64 and for a bf16 graph;
    :func:`.run.compare_distributed`).  ``precision``: ``fp32`` (default) or ``bf16``, what the
    plan's graph was captured in (:func:`tensoropt.capture`).
    Prints on rank 0 to ``out`` (stdout); returns the exit code: 0, 1 when the check fails (no
    step is timed), or 2 with the error's message on bad input or a failed peer."""
    stream = out or sys.stdout
    rt = None
    try:
        if steps < 0:
            raise TensorOptError("--steps must be ≥ 0")
        rank_map = parse_rank_map(device_map) if isinstance(device_map, str) else device_map
        rt = init_runtime(rank=rank, world_size=world_size, master_addr=master_addr, master_port=master_port,
                          backend=backend, timeout_s=timeout)
        torch.set_num_threads(max(1, torch.get_num_threads()))
        steady_malloc()   # the profile's allocator regime (tensoropt._malloc)
        say = (lambda text: print(text, file=stream, flush=True)) if rt.rank == 0 else (lambda text: None)
        model, call, graph, plan = _load(model_spec, plan_path, batch, precision)
        assert graph.example_inputs is not None   # a torch.export capture keeps its inputs
        inputs = tuple(graph.example_inputs)    # the graph's inputs, keyword ones included, in its order
        if check:   # on copies in the check's dtype, before the training executor takes the model
            cmp = _check_distributed(model, call, plan, graph, rt, rank_map, collectives, check_dtype, say)
            # local: tensoropt.cli.run imports this module (a cycle at import time)
            from ..cli.run import print_check

            print_check(cmp, lambda text, **_: say(text))
            if not cmp.passed:
                say("the plan does not train as the model does: not timing it (exit 1)")
                return 1
        ex = apply_plan_distributed(model, inputs, plan, rt, rank_map=rank_map, graph=graph, collectives=collectives)
        say(_describe(ex, plan, plan_path, rt))
        opt_name = plan_optimizer(plan)
        times, loss = _train(ex, inputs, opt_name, lr, steps, rt)
        if times:
            say(_timing(ex, rt, times, loss, f"{opt_name}, {graph.precision}, lr {lr}"))
        return 0
    except TensorOptError as e:
        where = f"rank {rt.rank}: " if rt is not None and not str(e).startswith("rank ") else ""
        print(f"error: {where}{e}", file=sys.stderr, flush=True)
        return e.exit_code
    finally:
        shutdown()


def _load(model_spec: str, plan_path: str, batch: int | None,
          precision: str | None) -> tuple[nn.Module, ModelCall, OpGraph, Plan]:
    """(model, its call, its torch.export capture in ``precision``, the plan loaded for it)."""
    loaded = load_model(model_spec, batch=batch)
    if loaded.model is None:
        raise TensorOptError(f"{model_spec} is a saved graph or ONNX file: the executor needs the torch model "
                             "(zoo:NAME or file.py:factory)")
    model, call = loaded.model, loaded.call
    graph = capture(model, call, name=loaded.name, method="export", precision=precision or "fp32")
    return model, call, graph, Plan.load(plan_path, graph)


def _describe(ex: DistributedExecutor, plan: Plan, plan_path: str, rt: Runtime) -> str:
    """The line rank 0 prints about the plan it runs: devices → ranks, moves, collectives, loss ranks."""
    return (f"plan {plan.plan_id or plan.algorithm or plan_path}: {len(plan.configs)} operators on "
            f"{len(plan.devices)} device(s) over {rt.world_size} rank(s) ({rt.backend}): "
            + ", ".join(f"{d}→rank {r}" for d, r in ex.rank_of.items())
            + f"; {len(ex.program.moves)} cross-rank moves, {len(ex.program.collectives)} collectives, "
              f"loss computed on rank(s) {', '.join(map(str, sorted(ex.program.loss_ranks)))}")


def _train(ex: DistributedExecutor, inputs: tuple[Any, ...], opt_name: str, lr: float, steps: int,
           rt: Runtime) -> tuple[list[float], torch.Tensor | None]:
    """``steps`` timed training steps (each from a barrier; the optimizer step included): this
    rank's step times and the last loss."""
    params = list(ex.local_parameters.values())
    opt = make_optimizer(opt_name, params, lr=lr) if params else None
    times, loss = [], None
    for _ in range(steps):
        ex.link.barrier()
        t0 = time.perf_counter()
        loss = ex.step(*inputs)
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        if rt.device.startswith("cuda"):
            torch.cuda.synchronize(rt.device)
        times.append(time.perf_counter() - t0)
    return times, loss


def _timing(ex: DistributedExecutor, rt: Runtime, times: list[float], loss: torch.Tensor | None, how: str) -> str:
    """Every rank's step times gathered: the line about the slowest rank's steps and the last loss."""
    every: list[Any] = [None] * rt.world_size
    with ex.link.guard("gathering step times", None):
        dist.all_gather_object(every, (times, None if loss is None else loss.item()))
    slowest = [max(r[0][i] for r in every) for i in range(len(times))]
    last = next(r[1] for r in every if r[1] is not None)
    return (f"{len(times)} training steps ({how}): median step of the slowest "
            f"rank {statistics.median(slowest) * 1e3:.3f} ms (min {min(slowest) * 1e3:.3f}, max "
            f"{max(slowest) * 1e3:.3f}); last loss {last:.6g}")


def _check_distributed(model: nn.Module, inputs: ModelCall, plan: Plan, graph: OpGraph, rt: Runtime,
                       rank_map: Mapping[str, int] | None, collectives: str, check_dtype: str | None,
                       say: Callable[[str], None]) -> Comparison:
    """The check of ``plan`` across the ranks: an executor of its own over a copy of the model in
    ``check_dtype`` (:func:`tensoropt.execute.check.prepare_check`; ``None``: float64, else
    float32 with a note — every rank decides the same, from the same capture), against an
    unmodified copy, random ops on and drawn keyed on both sides (:func:`.run.compare_distributed`)."""
    try:
        m, x, p, g = prepare_check(model, inputs, plan, graph, check_dtype or "float64")
    except CheckDtypeError as e:
        if check_dtype is not None:
            raise
        say(f"note: {str(e).split('; check in float32')[0]}: checking in float32")
        m, x, p, g = prepare_check(model, inputs, plan, graph, "float32")
    reference = copy.deepcopy(m)
    ex = apply_plan_distributed(m, g.example_inputs, p, rt, rank_map=rank_map, graph=g, collectives=collectives,
                                loss="check")
    cmp = compare_distributed(ex, reference, x)
    return cmp


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tensoropt.distributed",
                                description="train a model for a few steps with a plan across processes "
                                            "(start under torchrun; see tensoropt/distributed/cli.py)")
    p.add_argument("model", help="zoo:NAME[?k=v&…] or path/to/file.py:factory (the model the plan was made for)")
    p.add_argument("--plan", required=True, metavar="PLAN_JSON")
    p.add_argument("--steps", type=int, default=5, help="training steps to time (default 5)")
    p.add_argument("--check", action="store_true", help="compare loss, every gradient and buffer with the model "
                                                         "first; exit 1 when any is out of tolerance")
    p.add_argument("--check-dtype", choices=("float64", "float32"), default=None,
                   help="the dtype --check runs in (default float64, or float32 for a model that cannot)")
    p.add_argument("--device-map", metavar="MAP", help="plan device → rank, e.g. gpu0=0,gpu1=1 (default: "
                                                       "the i-th plan device on rank i)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    p.add_argument("--collectives", choices=COLLECTIVES, default="auto",
                   help=COLLECTIVES_HELP)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds any rank waits for another (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--master-addr", help="rendezvous host without torchrun (default MASTER_ADDR or 127.0.0.1)")
    p.add_argument("--master-port", type=int, help="rendezvous port without torchrun (default MASTER_PORT)")
    p.add_argument("--rank", type=int, help="this process's rank without torchrun (default RANK)")
    p.add_argument("--world-size", type=int, help="number of ranks without torchrun (default WORLD_SIZE)")
    p.add_argument("--batch", type=int, help="batch size (must be the plan's)")
    add_precision_argument(p)
    p.add_argument("--lr", type=float, default=1e-3)
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    return run_distributed(a.model, a.plan, steps=a.steps, check=a.check, device_map=a.device_map,
                           master_addr=a.master_addr, master_port=a.master_port, timeout=a.timeout,
                           backend=a.backend, rank=a.rank, world_size=a.world_size, lr=a.lr, batch=a.batch,
                           collectives=a.collectives, check_dtype=a.check_dtype, precision=a.precision)
