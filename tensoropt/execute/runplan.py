"""One way to run a plan, whatever the backend: load, check, train a few timed steps, report.

:func:`run_plan` is the body of ``tensoropt run``: it builds the model from its spec, captures
it, loads the plan for that capture, optionally checks the plan against the unmodified model
(float64 first; a model that cannot be checked in float64 falls back to float32 with a note),
then trains ``steps`` timed steps with the plan's optimizer and reports.  *Where* the steps run
is a :class:`Backend`: :class:`LocalBackend` (this process, every plan device a torch device
here: :func:`tensoropt.execute.apply_plan`) or
:class:`tensoropt.distributed.backend.DistributedBackend` (one process per rank on
torch.distributed).  The backend says how the model is made the same everywhere, how the check
and the planned step run, how a step is fenced and how step times are reported; the order of
the stages, the fallback and the report's words are written once, here.

Example (one process, the model's plan from a placer; both of its devices are this CPU)::

    >>> from tensoropt import load_cluster, load_model, place, price, profile
    >>> from tensoropt.execute.runplan import LocalBackend, RunOptions, run_plan
    >>> graph = load_model("zoo:rnnlm?tiny=1").capture()
    >>> priced = price(profile(graph, timed=False), load_cluster("preset:a100-4-nvlink"))
    >>> place(graph, priced.costs, priced.cluster, "dp", devices=["gpu0", "gpu1"]).save("plan.json")
    >>> run_plan("zoo:rnnlm?tiny=1", "plan.json", LocalBackend({"gpu0": "cpu", "gpu1": "cpu"}),
    ...          RunOptions(steps=2, check=True), say=print)
    note: the plan's estimates are PyTorch's DistributedDataParallel's (runtime ddp: ...)...
    check against the unmodified model (...): PASSED: ...
    plan dp: 6 operators on 2 device(s): gpu0→cpu, gpu1→cpu
    2 training steps (adamw, fp32, lr 0.001): median step ... ms (min ..., max ...); last loss ...
    0

Owns: the order of a plan's run and its report.  Must not: rewrite graphs (:mod:`.rewrite`),
judge numbers (:mod:`.check`), or start processes (torchrun, :mod:`tensoropt.distributed.launch`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from .._malloc import steady_malloc
from ..capture import ModelCall, capture
from ..capture.precision import check_executable
from ..describe import fmt_bytes
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.step import make_optimizer, plan_optimizer, training_loss
from ..modelspec import load_model
from ..plan import Plan, PlanError
from ..planmodel.wrappers import mesh_text
from .check import CheckDtypeError, Comparison, check_plan
from .planned import PlannedModule, apply_plan
from .replicas import call_for_capture

#: prints one line of the run's report
Say = Callable[[str], object]


@dataclass(frozen=True)
class RunOptions:
    """What ``tensoropt run`` was asked: ``steps`` timed training steps (≥ 0) at learning rate
    ``lr``; ``check`` first in ``check_dtype`` (``None``: float64, float32 with a note where
    the model cannot); ``batch`` and ``precision`` as the plan was made with."""

    steps: int = 5
    check: bool = False
    check_dtype: str | None = None
    lr: float = 1e-3
    batch: int | None = None
    precision: str | None = None


class Trainer(Protocol):
    """A plan applied on one backend: what :func:`run_plan` drives step by step."""

    def describe(self, label: str) -> list[str]:
        """Lines saying where the plan (called ``label``) runs: devices, ranks, moves, operators run whole."""

    def parameters(self) -> list[nn.Parameter]:
        """The parameters this process trains (for the optimizer)."""

    def before_step(self) -> None:
        """Before a timed step: wait for the devices (and start with the other ranks)."""

    def after_step(self) -> None:
        """After a timed step: wait for the devices."""

    def step(self) -> torch.Tensor:
        """One forward + training loss + backward (gradients summed where the plan needs it);
        the whole loss, detached."""

    def report(self, times: Sequence[float], loss: float | None, how: str) -> list[str]:
        """The report's lines about the timed steps (``times`` this process's seconds)."""


class Backend(Protocol):
    """Where a plan runs.  ``reports``: this process prints the report (rank 0 of several)."""

    reports: bool

    def agree(self, model: nn.Module, call: ModelCall) -> None:
        """Make the model and its inputs the same wherever the plan runs (before capture)."""

    def check(self, model: nn.Module, call: ModelCall, plan: Plan, graph: OpGraph, check_dtype: str) -> Comparison:
        """The plan against the unmodified model, on copies in ``check_dtype`` (may raise
        :class:`~.check.CheckDtypeError`)."""

    def apply(self, model: nn.Module, call: ModelCall, plan: Plan, graph: OpGraph) -> Trainer:
        """The plan applied to ``model`` for training."""


def load_plan(path: str, graph: OpGraph) -> Plan:
    """The plan at ``path`` for ``graph``; a fingerprint mismatch says which precision to use."""
    try:
        return Plan.load(path, graph)
    except PlanError as e:
        if "fingerprint" not in str(e):
            raise
        raise PlanError(f"{e} (captured here in {graph.precision}: run a plan with the --precision it was made "
                        "with)") from None


def check_lines(cmp: Comparison) -> list[str]:
    """The check's result: one summary line, then one line per failing tensor (name, max abs
    diff, max rel diff, tolerance)."""
    head = f"check against the unmodified model (dropout on, masks drawn keyed): {cmp.summary()}"
    return [head] + [f"  {line.strip()}" for line in cmp.describe().splitlines()[1:]]


def run_plan(model_spec: str, plan_path: str, backend: Backend, options: RunOptions, say: Say) -> int:
    """Run ``plan_path`` on ``model_spec`` (``zoo:NAME?…`` or ``file.py:factory``) on ``backend``
    as ``options`` say; ``say`` prints the report (only where ``backend.reports``).  Returns the
    exit code: 0, or 1 when the check fails (then no step is timed).  Bad input raises a
    :class:`~tensoropt.errors.TensorOptError` naming the cause."""
    if options.steps < 0:
        raise TensorOptError("--steps must be ≥ 0")
    report: Say = say if backend.reports else (lambda _text: None)
    steady_malloc()   # the profile's allocator regime (tensoropt._malloc)
    replicated = Plan.load(plan_path)
    if replicated.pipeline is not None:
        raise TensorOptError(f"the plan is a pipeline ({replicated.pipeline['schedule']} over {replicated.num_devices} "
                             "devices) that PyTorch's pipelining runs, one process per device: tensoropt run --backend "
                             f"dist under torchrun --nproc-per-node {replicated.num_devices}")
    if (replicated.replicas or replicated.microbatches > 1) and not getattr(backend, "runs_replicas", False):
        what = (f"{replicated.num_replicas} replicas on {replicated.num_devices} devices (data parallel across its "
                "groups)" if replicated.replicas else
                f"each step as {replicated.microbatches} micro-batches (gradient accumulation)")
        raise TensorOptError(f"the plan runs {what}: run it on the distributed backend, one process per "
                             f"device (tensoropt run --backend dist, or torchrun --nproc-per-node "
                             f"{replicated.num_devices} -m tensoropt.cli run …)")
    check_executable(options.precision, TensorOptError)
    model, call, graph = load_for_run(model_spec, backend, options.batch, options.precision, replicated)
    check_executable(graph, TensorOptError)   # a saved graph's own precision
    plan = load_plan(plan_path, graph)
    if plan.runtime == "fsdp2" and plan.replicas:
        report(f"note: the plan's estimates are FSDP2's over its replicas ({mesh_text(plan)}: tensoropt export runs "
               "it so); tensoropt's executor keeps each replica's parameters whole and sums the gradients across the "
               "replicas, so its memory and time differ from them (the same losses)")
    elif plan.runtime == "fsdp2":
        report("note: the plan's estimates are FSDP2's (tensoropt export runs it so); tensoropt's executor gathers "
               "and reduces each operator's parameters on its own, so its memory and time differ from them")
    elif plan.runtime == "dtensor":
        report("note: the plan's estimates are PyTorch's tensor parallelism's (DTensor: tensoropt export runs it so); "
               "tensoropt's executor sums the gradients of the parameters every device reads in flat buffers, so "
               "its memory differs from them (the same losses)")
    elif plan.runtime in ("ddp", "zero1"):
        report(f"note: the plan's estimates are PyTorch's DistributedDataParallel's (runtime {plan.runtime}: "
               "tensoropt export runs it so, with its gradient buckets); tensoropt's executor holds other amounts")
    if options.check:   # on copies in the check's dtype, before the training executor takes the model
        cmp = check_on(backend, model, call, plan, graph, options.check_dtype, report)
        for line in check_lines(cmp):
            report(line)
        if not cmp.passed:
            report("the plan does not train as the model does: not timing it (exit 1)")
            return 1
    trainer = backend.apply(model, call, plan, graph)
    for line in trainer.describe(plan.plan_id or plan.algorithm or plan_path):
        report(line)
    opt_name = plan_optimizer(plan)
    params = trainer.parameters()
    opt = make_optimizer(opt_name, params, lr=options.lr) if params else None
    times: list[float] = []
    loss: torch.Tensor | None = None
    for _ in range(options.steps):
        trainer.before_step()
        t0 = time.perf_counter()
        loss = trainer.step()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        trainer.after_step()
        times.append(time.perf_counter() - t0)
    lines = trainer.report(times, None if loss is None else float(loss.item()),
                           f"{opt_name}, {graph.precision}, lr {options.lr}") if times else []
    for line in lines:
        report(line)
    return 0


def load_for_run(model_spec: str, backend: Backend, batch: int | None = None,
                 precision: str | None = None, plan: Plan | None = None) -> tuple[nn.Module, ModelCall, OpGraph]:
    """``(model, call, graph)``: the model built from its spec, made the same wherever the plan
    runs (:meth:`Backend.agree`), and its torch.export capture in ``precision`` (a bf16 plan was
    made for the bf16 capture: its fingerprint says so) — of the first replica's slice of the
    batch for a ``plan`` with replicas (:func:`~.replicas.call_for_capture`)."""
    loaded = load_model(model_spec, batch=batch)
    if loaded.model is None:
        raise TensorOptError(f"{model_spec} is a saved graph or ONNX file: the executor needs the torch model "
                             "(zoo:NAME or file.py:factory)")
    model, call = loaded.model, loaded.call
    backend.agree(model, call)
    captured = call if plan is None else call_for_capture(call, plan)
    graph = capture(model, captured, name=loaded.name, method="export", precision=precision or "fp32")
    return model, call, graph


def check_on(backend: Backend, model: nn.Module, call: ModelCall, plan: Plan, graph: OpGraph,
             check_dtype: str | None = None, report: Say = lambda _text: None) -> Comparison:
    """The backend's check of ``plan`` in ``check_dtype``; ``None``: float64, or float32 with a
    note to ``report`` when the model cannot be checked in float64 (every rank decides the same,
    from the same capture)."""
    try:
        return backend.check(model, call, plan, graph, check_dtype or "float64")
    except CheckDtypeError as e:
        if check_dtype is not None:
            raise
        report(f"note: {e.reason}: checking in float32")
        return backend.check(model, call, plan, graph, "float32")


def step_summary(times: Sequence[float], loss: float | None, how: str, *, whose: str = "") -> str:
    """``N training steps (how): median step … (min …, max …); last loss …`` — the report's line,
    ``whose`` naming whose times they are (e.g. "of the slowest rank ")."""
    last = "nan" if loss is None else f"{loss:.6g}"
    return (f"{len(times)} training steps ({how}): median step {whose}{statistics.median(times) * 1e3:.3f} ms "
            f"(min {min(times) * 1e3:.3f}, max {max(times) * 1e3:.3f}); last loss {last}")


# ---- one process ---------------------------------------------------------------------------


class LocalBackend:
    """Every plan device a torch device of this process (``device_map``: plan device → torch
    device; default ``cuda:i`` where there are enough GPUs, else the CPU)."""

    reports = True

    def __init__(self, device_map: dict[str, str] | None = None):
        self.device_map = device_map

    def agree(self, model: nn.Module, call: ModelCall) -> None:
        """One process: the model is already the same everywhere."""

    def check(self, model: nn.Module, call: ModelCall, plan: Plan, graph: OpGraph, check_dtype: str) -> Comparison:
        return check_plan(model, call, plan, graph, check_dtype, self.device_map)

    def apply(self, model: nn.Module, call: ModelCall, plan: Plan, graph: OpGraph) -> _LocalTrainer:
        return _LocalTrainer(apply_plan(model, call.args, plan, device_map=self.device_map, graph=graph), plan, call)


class _LocalTrainer:
    def __init__(self, planned: PlannedModule, plan: Plan, call: ModelCall):
        self.planned = planned
        self.plan = plan
        self.call = call
        self.cuda = sorted({t for t in planned.device_map.values() if t.startswith("cuda")})
        for dev in self.cuda:
            torch.cuda.reset_peak_memory_stats(dev)

    def describe(self, label: str) -> list[str]:
        plan = self.plan
        return [f"plan {label}: {len(plan.configs)} operators on {len(plan.devices)} "
                "device(s): " + ", ".join(f"{d}→{t}" for d, t in self.planned.device_map.items())] + \
            [f"  ran whole: {note}" for note in self.planned.fallbacks]

    def parameters(self) -> list[nn.Parameter]:
        return list(self.planned.parameters())

    def before_step(self) -> None:
        for dev in self.cuda:
            torch.cuda.synchronize(dev)

    after_step = before_step

    def step(self) -> torch.Tensor:
        loss = training_loss(self.planned(*self.call.args, **self.call.kwargs))
        loss.backward()
        return loss.detach()

    def report(self, times: Sequence[float], loss: float | None, how: str) -> list[str]:
        return [step_summary(times, loss, how)] + \
            [f"  peak memory {dev}: {fmt_bytes(torch.cuda.max_memory_allocated(dev))}" for dev in self.cuda]

