"""The distributed backend of :func:`tensoropt.execute.runplan.run_plan`: one process per rank.

``tensoropt run MODEL --plan P --backend dist`` (and its alias ``python -m tensoropt.distributed
MODEL --plan P``) runs here, under torchrun::

    torchrun --nproc-per-node K -m tensoropt.cli run MODEL --plan plan.json --backend dist --check

Two hosts (run on each, ``--node-rank`` 0 and 1; HOST0 reachable from both)::

    torchrun --nnodes 2 --nproc-per-node K --node-rank N --rdzv-backend c10d \\
        --rdzv-endpoint HOST0:29500 -m tensoropt.cli run MODEL --plan plan.json --backend dist

Without torchrun, start each rank yourself with ``--rank R --world-size W --master-addr HOST0
--master-port PORT``.  Rank 0 reports; every rank exits 2 with one line naming the cause on bad
input or when a peer fails.

What differs from one process, and only that, is here: every rank builds the model from the
spec and then takes rank 0's weights, buffers and inputs (:func:`.run.same_as_rank0`); the check
and the steps run on a :class:`~.run.DistributedExecutor`; a step starts at a barrier; the
report gives the slowest rank's step times.

Owns: the backend and the process group's life around one run.  Must not: order the run's
stages or word its report (:mod:`tensoropt.execute.runplan`).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..capture import ModelCall
from ..errors import TensorOptError
from ..execute.check import Comparison, first_difference, frozen_clause, prepare_check
from ..execute.replicas import call_for_capture
from ..execute.runplan import RunOptions, Say, run_plan, step_summary
from ..graph import OpGraph
from ..plan import Plan
from .pipelined import run_pipeline_plan
from .run import DistributedExecutor, apply_plan_distributed, same_as_rank0
from .runtime import DEFAULT_TIMEOUT_S, Runtime, init_runtime, parse_rank_map, shutdown
from .verify import compare_distributed


class DistributedBackend:
    """This rank's part of a plan across ``runtime``'s process group (``rank_map``: plan device →
    rank, default the i-th plan device on rank i; ``collectives``: :class:`~.transport.PeerLink`)."""

    def __init__(self, runtime: Runtime, rank_map: Mapping[str, int] | None = None, collectives: str = "auto"):
        self.rt = runtime
        self.rank_map = rank_map
        self.collectives = collectives
        self.reports = runtime.rank == 0
        #: runs plans with replicas (data parallel across groups of ranks)
        self.runs_replicas = True

    def agree(self, model: nn.Module, call: ModelCall) -> None:
        same_as_rank0(model, call, self.rt)

    def check(self, model: nn.Module, call: ModelCall, plan: Plan, graph: OpGraph, check_dtype: str) -> Comparison:
        """An executor of its own over a copy of the model in ``check_dtype``
        (:func:`~tensoropt.execute.check.prepare_check`), against an unmodified copy, random ops
        on and drawn keyed on both sides (:func:`.verify.compare_distributed`)."""
        m, x, p, g = prepare_check(model, call, plan, graph, check_dtype)
        reference = copy.deepcopy(m)
        ex = apply_plan_distributed(m, g.example_inputs, p, self.rt, rank_map=self.rank_map, graph=g,
                                    collectives=self.collectives, loss="check")
        cmp = compare_distributed(ex, reference, x)
        if cmp.passed or not self.reports:
            return cmp
        # where the plan's forward parts from the model's, found in one process on fresh copies:
        # an operator there is wrong on every backend; none means the ranks' exchanges are
        m, x, p, g = prepare_check(model, call, plan, graph, check_dtype)
        where = first_difference(m, call_for_capture(x, p, g.batch_dim), p, g, {d: "cpu" for d in p.devices},
                                 precision=ex.check_precision)
        if where.startswith("every operator"):
            where = ("in one process every operator's forward output agrees with the model's: the difference "
                     "arises across the ranks (their moves, collectives or gradient sums)" + frozen_clause(g))
        return dataclasses.replace(cmp, first_difference=where)

    def apply(self, model: nn.Module, call: ModelCall, plan: Plan, graph: OpGraph) -> RankTrainer:
        assert graph.example_inputs is not None   # a torch.export capture keeps its inputs
        ex = apply_plan_distributed(model, graph.example_inputs, plan, self.rt, rank_map=self.rank_map, graph=graph,
                                    collectives=self.collectives)
        # the graph's inputs, keyword ones included, in its order (with replicas or micro-batches the
        # step's whole batch: each replica takes its slice, each micro-batch its part of it)
        whole = plan.replicas or plan.microbatches > 1
        inputs = tuple(call.tensors_for(model)) if whole else tuple(graph.example_inputs)
        return RankTrainer(ex, self.rt, inputs)


class RankTrainer:
    """One rank's :class:`~tensoropt.execute.runplan.Trainer`."""

    def __init__(self, ex: DistributedExecutor, rt: Runtime, inputs: tuple[Any, ...]):
        self.ex = ex
        self.rt = rt
        self.inputs = inputs

    def describe(self, label: str) -> list[str]:
        ex, plan, rt = self.ex, self.ex.plan, self.rt
        replicas = f" × {plan.num_replicas} replicas (this rank runs replica {ex.replica})" if plan.replicas else ""
        if plan.microbatches > 1:
            replicas += f", each step {plan.microbatches} micro-batches of {plan.batch_size}"
        return [f"plan {label}: {len(plan.configs)} operators on {len(plan.devices)} device(s){replicas} over "
                f"{rt.world_size} rank(s) ({rt.backend}): " + ", ".join(f"{d}→rank {r}" for d, r in ex.rank_of.items())
                + f"; {len(ex.program.moves)} cross-rank moves, {len(ex.program.collectives)} collectives, "
                  f"loss computed on rank(s) {', '.join(map(str, sorted(ex.program.loss_ranks)))}"
                + (f"; {len(ex.sharded)} parameters sharded (ZeRO levels "
                   f"{', '.join(map(str, sorted({lv for lv, _ in ex.sharded.values()})))})" if ex.sharded else "")] + \
            [f"  ran whole: {note}" for note in ex.fallbacks]

    def parameters(self) -> list[nn.Parameter]:
        return list(self.ex.local_parameters.values())

    def before_step(self) -> None:
        self.ex.link.barrier()

    def after_step(self) -> None:
        self.ex.gather_updated()    # sharding levels 1-2: every rank stepped its piece
        if self.rt.device.startswith("cuda"):
            torch.cuda.synchronize(self.rt.device)

    def step(self) -> torch.Tensor:
        return self.ex.step(*self.inputs)

    def report(self, times: Sequence[float], loss: float | None, how: str) -> list[str]:
        """Every rank's step times gathered: the slowest rank's steps and the last loss."""
        every: list[Any] = [None] * self.rt.world_size
        with self.ex.link.guard("gathering step times", None):
            dist.all_gather_object(every, list(times))
        slowest = [max(r[i] for r in every) for i in range(len(times))]
        return [step_summary(slowest, loss, how, whose="of the slowest rank ")]


def run_distributed(model_spec: str, plan_path: str, options: RunOptions, say: Say, *,
                    device_map: str | Mapping[str, int] | None = None, master_addr: str | None = None,
                    master_port: int | None = None, timeout: float = DEFAULT_TIMEOUT_S, backend: str = "auto",
                    rank: int | None = None, world_size: int | None = None, collectives: str = "auto") -> int:
    """:func:`~tensoropt.execute.runplan.run_plan` on this rank (rank and world size from the
    torchrun environment unless given), the process group joined first and left last.  Returns
    the exit code: 0, 1 when the check fails (no step is timed), or the error's code after one
    line on stderr naming this rank and the cause (bad input, a failed peer)."""
    rt = None
    try:
        rank_map = parse_rank_map(device_map) if isinstance(device_map, str) else device_map
        rt = init_runtime(rank=rank, world_size=world_size, master_addr=master_addr, master_port=master_port,
                          backend=backend, timeout_s=timeout)
        torch.set_num_threads(max(1, torch.get_num_threads()))
        plan = Plan.load(plan_path)
        if plan.pipeline is not None:   # PyTorch's pipelining runs it, not tensoropt's executor
            return run_pipeline_plan(rt, model_spec, plan, steps=options.steps, lr=options.lr, check=options.check,
                                     batch=options.batch, say=say)
        return run_plan(model_spec, plan_path, DistributedBackend(rt, rank_map, collectives), options, say)
    except TensorOptError as e:
        where = f"rank {rt.rank}: " if rt is not None and not str(e).startswith("rank ") else ""
        print(f"error: {where}{e}", file=sys.stderr, flush=True)
        return e.exit_code
    finally:
        shutdown()
