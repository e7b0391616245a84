"""``tensoropt export``: a plan as a directory torchrun runs (:mod:`tensoropt.export`).

It owns the ``export`` command's options and what it prints; the decision (PyTorch's wrappers
or tensoropt's executor) and the files are :func:`tensoropt.export.export_plan`'s.  It must not
start processes.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from ..export import TARGETS, export_pipeline_plan, export_plan
from ..export.expressible import PATH_TITLES
from ..plan import Plan
from ._common import PLAN_BATCH_HELP, add_request_options


def _cmd_export(args: argparse.Namespace, console: Console) -> int:
    if Plan.load(args.plan).pipeline is not None:   # PyTorch's pipelining runs it
        with console.status(f"capturing {escape(args.model)} …"):
            directory, est = export_pipeline_plan(args.plan, args.model, args.output, steps=args.steps, lr=args.lr,
                                                  cluster=args.cluster, precision=args.precision)
        console.print(f"wrote {escape(str(directory))}/ (train.py, README.md): {escape(str(est.recipe))}, run by "
                      "torch.distributed.pipelining", highlight=False, soft_wrap=True)
        console.print(f"run it: cd {escape(str(directory))} && torchrun --standalone --nproc-per-node "
                      f"{est.recipe.world} train.py", highlight=False, soft_wrap=True)
        return 0
    with console.status(f"capturing {escape(args.model)} …"):
        done = export_plan(args.plan, args.model, args.output, to=args.to, steps=args.steps, lr=args.lr,
                           seed=args.seed, batch=args.batch, precision=args.precision, cluster=args.cluster)
    expr = done.expression
    console.print(f"wrote {escape(str(done.directory))}/ (train.py, plan.json, README.md): "
                  f"{escape(PATH_TITLES[expr.path])}", highlight=False, soft_wrap=True)
    for reason in expr.reasons:
        console.print(f"  {escape(reason)}", highlight=False, soft_wrap=True)
    if expr.executor_ops:
        console.print(f"  operators that need the executor: {len(expr.executor_ops)} (README.md lists them)",
                      highlight=False)
    console.print(f"run it: cd {escape(str(done.directory))} && {escape(done.shape.torchrun('train.py'))}",
                  highlight=False, soft_wrap=True)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write a plan as a directory torchrun runs (PyTorch's DDP / FSDP2 where they "
                                      "express it, else tensoropt's executor)")
    p.add_argument("plan", help="a plan JSON (place -o, frontier --plans)")
    p.add_argument("model", help="the model the plan was made for: zoo:NAME[?k=v&…] or path/to/file.py:factory")
    p.add_argument("--to", choices=TARGETS, default="torchrun", help="what launches it (default torchrun)")
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="the directory to write (new, or empty): train.py, plan.json, README.md")
    p.add_argument("--steps", type=int, default=10, help="training steps train.py runs by default (default 10)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of the plan's optimizer (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed set before the factory builds the model (default 0)")
    p.add_argument("--cluster", help="the cluster the plan was made for (preset:NAME or YAML): its hosts give "
                                     "torchrun's --nnodes (default: the preset the plan names, else one host)")
    add_request_options(p, "batch", "precision", help={"batch": PLAN_BATCH_HELP})
    p.set_defaults(func=_cmd_export)
