"""``tensoropt run``: train a model for a few steps with a plan (and check it against the model)."""

from __future__ import annotations

import argparse
import copy
import statistics
import time

from rich.console import Console
from rich.markup import escape

from .._malloc import steady_malloc
from ..errors import TensorOptError


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    import torch

    from ..capture import capture
    from ..costs.step import training_loss
    from ..describe import fmt_bytes
    from ..execute import apply_plan, compare_with_model, disable_dropout, parse_device_map
    from ..modelspec import load_model
    from ..plan import Plan

    if args.steps < 0:
        raise TensorOptError("--steps must be ≥ 0")
    if args.backend == "dist":   # one process per rank, started by torchrun (tensoropt.distributed)
        from ..distributed.cli import run_distributed

        return run_distributed(args.model, args.plan, steps=args.steps, check=args.check, device_map=args.device_map,
                               master_addr=args.master_addr, master_port=args.master_port, timeout=args.timeout,
                               backend=args.dist_backend, lr=args.lr, batch=args.batch,
                               collectives=args.collectives)
    steady_malloc()   # time the steps in the profile's allocator regime (tensoropt._malloc)
    loaded = load_model(args.model, batch=args.batch)
    if loaded.model is None:
        raise TensorOptError(f"{args.model} is a saved graph or ONNX file: the executor needs the torch model "
                             "(zoo:NAME or file.py:factory)")
    model, inputs = loaded.model, loaded.example_inputs
    graph = capture(model, inputs, name=loaded.name, method="export")
    plan = Plan.load(args.plan, graph)
    device_map = parse_device_map(args.device_map) if args.device_map else None
    # random masks cannot match between a split plan and the model: the check compares both
    # with dropout off (the plan's own graph keeps its dropout for training)
    reference = disable_dropout(copy.deepcopy(model)) if args.check else None
    planned = apply_plan(model, inputs, plan, device_map=device_map, graph=graph)
    console.print(f"plan {escape(plan.plan_id or plan.algorithm or args.plan)}: {len(plan.configs)} operators on "
                  f"{len(plan.devices)} device(s): " + ", ".join(f"{d}→{t}" for d, t in planned.device_map.items()),
                  highlight=False)
    for note in planned.fallbacks:
        console.print(f"  ran whole: {escape(note)}", highlight=False)
    if args.check:
        cmp = compare_with_model(reference, planned.without_dropout(), inputs)
        console.print(f"check against the unmodified model (dropout off): loss rel. diff {cmp.loss:.3g}; largest "
                      f"relative difference {cmp.max_rel_diff:.3g} ({escape(cmp.worst)}) over the loss, "
                      f"{len(cmp.grads)} gradients and {len(cmp.buffers)} buffers", highlight=False)
    cuda = sorted({t for t in planned.device_map.values() if t.startswith("cuda")})
    opt = torch.optim.SGD(planned.parameters(), lr=args.lr)
    for dev in cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(args.steps):
        for dev in cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        loss = training_loss(planned(*inputs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        for dev in cuda:
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
    if times:
        console.print(f"{len(times)} training steps (SGD, lr {args.lr}): median step {statistics.median(times) * 1e3:.3f} ms "
                      f"(min {min(times) * 1e3:.3f}, max {max(times) * 1e3:.3f}); last loss {loss.item():.6g}",
                      highlight=False)
        for dev in cuda:
            console.print(f"  peak memory {dev}: {fmt_bytes(torch.cuda.max_memory_allocated(dev))}", highlight=False)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from ..distributed.transport import COLLECTIVES, COLLECTIVES_HELP   # loads torch.distributed: not at start-up

    p = sub.add_parser("run", help="train a model for a few steps with a plan; --check compares with the model")
    p.add_argument("model", help="zoo:NAME[?k=v&…] or path/to/file.py:factory (the model the plan was made for)")
    p.add_argument("--plan", required=True, metavar="PLAN_JSON", help="a plan written by place / frontier --plans")
    p.add_argument("--steps", type=int, default=5, help="training steps to time (default 5)")
    p.add_argument("--check", action="store_true",
                   help="compare loss and every gradient with the unmodified model (dropout off) first")
    p.add_argument("--device-map", metavar="MAP",
                   help="plan device → torch device, e.g. gpu0=cuda:0,gpu1=cuda:1 (default: cuda:i where "
                        "there are enough GPUs, else cpu); with --backend dist plan device → rank, e.g. gpu0=0,gpu1=1 "
                        "(default: the i-th plan device on rank i)")
    p.add_argument("--backend", choices=("local", "dist"), default="local",
                   help="local: one process, every plan device a torch device here (default); dist: one process "
                        "per rank on torch.distributed, under torchrun --nproc-per-node K (tensoropt.distributed)")
    p.add_argument("--dist-backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="with --backend dist: the process group backend (auto: nccl on CUDA, else gloo)")
    p.add_argument("--collectives", choices=COLLECTIVES, default="auto", help=f"with --backend dist: {COLLECTIVES_HELP}")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="with --backend dist: seconds any rank waits for another before giving up (default 60)")
    p.add_argument("--master-addr", help="with --backend dist, without torchrun: the rendezvous host")
    p.add_argument("--master-port", type=int, help="with --backend dist, without torchrun: the rendezvous port")
    p.add_argument("--batch", type=int, help="batch size (must be the plan's)")
    p.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (default 1e-3)")
    p.set_defaults(func=_cmd_run)
