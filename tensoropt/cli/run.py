"""``tensoropt run``: train a model for a few steps with a plan (and check it against the model).

It owns the ``run`` command's options, the timed training loop and its report; rewriting the
model is :func:`tensoropt.execute.apply_plan`'s and checking it
:func:`tensoropt.execute.check.check_plan`'s.  ``--backend dist`` hands over to
:mod:`tensoropt.distributed` (one process per rank): this module must not start processes.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.markup import escape

from .._malloc import steady_malloc
from ..capture import capture
from ..capture.call import ModelCall
from ..describe import fmt_bytes
from ..distributed.cli import run_distributed
from ..distributed.transport import COLLECTIVES, COLLECTIVES_HELP
from ..errors import TensorOptError
from ..execute import PlannedModule, apply_plan, parse_device_map
from ..execute.check import CheckDtypeError, Comparison, check_plan
from ..graph import OpGraph
from ..measure.step import make_optimizer, plan_optimizer, training_loss
from ..modelspec import load_model
from ..plan import Plan, PlanError
from ._common import add_precision_argument


def _run_distributed(args: argparse.Namespace) -> int:
    """``--backend dist``: one process per rank, started by torchrun (:mod:`tensoropt.distributed`)."""
    return run_distributed(args.model, args.plan, steps=args.steps, check=args.check, device_map=args.device_map,
                           master_addr=args.master_addr, master_port=args.master_port, timeout=args.timeout,
                           backend=args.dist_backend, lr=args.lr, batch=args.batch,
                           collectives=args.collectives, check_dtype=args.check_dtype, precision=args.precision)


def _load_plan(path: str, graph: OpGraph) -> Plan:
    """The plan at ``path`` for ``graph``; a fingerprint mismatch says which precision to use."""
    try:
        return Plan.load(path, graph)
    except PlanError as e:
        if "fingerprint" not in str(e):
            raise
        raise PlanError(f"{e} (captured here in {graph.precision}: run a plan with the --precision it was made "
                        "with)") from None


def _timed_steps(planned: PlannedModule, call: ModelCall, opt: torch.optim.Optimizer, steps: int,
                 cuda: list[str]) -> tuple[list[float], float]:
    """Train ``steps`` steps (each synchronised on the CUDA devices): their seconds and the last loss."""
    times: list[float] = []
    loss: torch.Tensor | None = None
    for _ in range(steps):
        for dev in cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        loss = training_loss(planned(*call.args, **call.kwargs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for dev in cuda:
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    return times, float("nan") if loss is None else loss.item()


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    if args.steps < 0:
        raise TensorOptError("--steps must be ≥ 0")
    if args.backend == "dist":
        return _run_distributed(args)
    steady_malloc()   # time the steps in the profile's allocator regime (tensoropt._malloc)
    loaded = load_model(args.model, batch=args.batch)
    if loaded.model is None:
        raise TensorOptError(f"{args.model} is a saved graph or ONNX file: the executor needs the torch model "
                             "(zoo:NAME or file.py:factory)")
    model, call = loaded.model, loaded.call
    # the plan's graph: a bf16 plan was made for the bf16 capture (its fingerprint says so), and
    # the planned module runs its forward under that autocast
    graph = capture(model, call, name=loaded.name, method="export", precision=args.precision or "fp32")
    plan = _load_plan(args.plan, graph)
    device_map = parse_device_map(args.device_map) if args.device_map else None
    # the check runs on copies of the model (in --check-dtype), dropout on, its masks drawn keyed on
    # both sides (tensoropt.execute.check)
    cmp = run_check(model, call, plan, graph, args.check_dtype, device_map, console) if args.check else None
    planned = apply_plan(model, call.args, plan, device_map=device_map, graph=graph)
    console.print(f"plan {escape(plan.plan_id or plan.algorithm or args.plan)}: {len(plan.configs)} operators on "
                  f"{len(plan.devices)} device(s): " + ", ".join(f"{d}→{t}" for d, t in planned.device_map.items()),
                  highlight=False)
    for note in planned.fallbacks:
        console.print(f"  ran whole: {escape(note)}", highlight=False)
    if cmp is not None:
        print_check(cmp, console.print)
        if not cmp.passed:
            console.print("the plan does not train as the model does: not timing it (exit 1)", highlight=False)
            return 1
    cuda = sorted({t for t in planned.device_map.values() if t.startswith("cuda")})
    opt_name = plan_optimizer(plan)
    opt = make_optimizer(opt_name, planned.parameters(), lr=args.lr)
    for dev in cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    times, loss = _timed_steps(planned, call, opt, args.steps, cuda)
    if times:
        console.print(f"{len(times)} training steps ({opt_name}, {graph.precision}, lr {args.lr}): "
                      f"median step {statistics.median(times) * 1e3:.3f} ms "
                      f"(min {min(times) * 1e3:.3f}, max {max(times) * 1e3:.3f}); last loss {loss:.6g}",
                      highlight=False)
        for dev in cuda:
            console.print(f"  peak memory {dev}: {fmt_bytes(torch.cuda.max_memory_allocated(dev))}", highlight=False)
    return 0


def run_check(model: torch.nn.Module, inputs: ModelCall, plan: Plan, graph: OpGraph, check_dtype: str | None,
              device_map: dict[str, str] | None, console: Console) -> Comparison:
    """:func:`tensoropt.execute.check.check_plan` in ``check_dtype``; ``None`` (no
    ``--check-dtype``): float64, or float32 with a note when the model cannot run in float64."""
    try:
        return check_plan(model, inputs, plan, graph, check_dtype or "float64", device_map)
    except CheckDtypeError as e:
        if check_dtype is not None:
            raise
        console.print(f"note: {escape(str(e).split('; check in float32')[0])}: checking in float32", highlight=False)
        return check_plan(model, inputs, plan, graph, "float32", device_map)


def print_check(cmp: Comparison, say: Callable[..., object]) -> None:
    """The check's result: one summary line, then one line per failing tensor (name, max abs
    diff, max rel diff, tolerance)."""
    say(f"check against the unmodified model (dropout on, masks drawn keyed): {escape(cmp.summary())}", highlight=False,
        soft_wrap=True)
    for line in cmp.describe().splitlines()[1:]:
        say(f"  {escape(line.strip())}", highlight=False)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="train a model for a few steps with a plan; --check compares with the model")
    p.add_argument("model", help="zoo:NAME[?k=v&…] or path/to/file.py:factory (the model the plan was made for)")
    p.add_argument("--plan", required=True, metavar="PLAN_JSON", help="a plan written by place / frontier --plans")
    p.add_argument("--steps", type=int, default=5, help="training steps to time (default 5)")
    p.add_argument("--check", action="store_true",
                   help="compare the loss, every gradient and every buffer with the unmodified model (dropout "
                        "on, the same masks on both sides) first; exit 1 when any is out of tolerance")
    p.add_argument("--check-dtype", choices=("float64", "float32"), default=None,
                   help="the dtype --check runs in (default float64, or float32 with a note for a model that "
                        "cannot be captured in float64 and for --precision bf16)")
    p.add_argument("--device-map", metavar="MAP",
                   help="plan device → torch device, e.g. gpu0=cuda:0,gpu1=cuda:1 (default: cuda:i where "
                        "there are enough GPUs, else cpu); with --backend dist plan device → rank, e.g. gpu0=0,gpu1=1 "
                        "(default: the i-th plan device on rank i)")
    p.add_argument("--backend", choices=("local", "dist"), default="local",
                   help="local: one process, every plan device a torch device here (default); dist: one process "
                        "per rank on torch.distributed, under torchrun --nproc-per-node K (tensoropt.distributed)")
    p.add_argument("--dist-backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="with --backend dist: the process group backend (auto: nccl on CUDA, else gloo)")
    p.add_argument("--collectives", choices=COLLECTIVES, default="auto",
                   help=f"with --backend dist: {COLLECTIVES_HELP}")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="with --backend dist: seconds any rank waits for another before giving up (default 60)")
    p.add_argument("--master-addr", help="with --backend dist, without torchrun: the rendezvous host")
    p.add_argument("--master-port", type=int, help="with --backend dist, without torchrun: the rendezvous port")
    p.add_argument("--batch", type=int, help="batch size (must be the plan's)")
    add_precision_argument(p)
    p.add_argument("--lr", type=float, default=1e-3,
                   help="learning rate of the plan's optimizer (its options' `optimizer`, default adamw) "
                        "(default 1e-3)")
    p.set_defaults(func=_cmd_run)
