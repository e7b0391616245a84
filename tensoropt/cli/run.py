"""``tensoropt run``: train a model for a few steps with a plan (and check it against the model).

It owns the ``run`` command's options only: the run itself — load, check, timed steps, report —
is :func:`tensoropt.execute.runplan.run_plan`, the same for both backends: ``local`` (this
process, :class:`~tensoropt.execute.runplan.LocalBackend`) and ``dist`` (one process per rank
under torchrun, :func:`tensoropt.distributed.backend.run_distributed`).  This module must not
start processes.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from ..distributed.backend import run_distributed
from ..distributed.runtime import DEFAULT_TIMEOUT_S
from ..distributed.transport import COLLECTIVES, COLLECTIVES_HELP
from ..execute import parse_device_map
from ..execute.runplan import LocalBackend, RunOptions, run_plan
from ._common import add_request_options


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    options = RunOptions(steps=args.steps, check=args.check, check_dtype=args.check_dtype, lr=args.lr,
                         batch=args.batch, precision=args.precision)

    def say(text: str) -> None:
        console.print(escape(text), highlight=False, soft_wrap=True)

    if args.backend == "dist":
        return run_distributed(args.model, args.plan, options, say, device_map=args.device_map,
                               master_addr=args.master_addr, master_port=args.master_port, timeout=args.timeout,
                               backend=args.dist_backend, rank=args.rank, world_size=args.world_size,
                               collectives=args.collectives)
    device_map = parse_device_map(args.device_map) if args.device_map else None
    return run_plan(args.model, args.plan, LocalBackend(device_map), options, say)


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
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help="with --backend dist: seconds any rank waits for another before giving up "
                        f"(default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--master-addr", help="with --backend dist, without torchrun: the rendezvous host")
    p.add_argument("--master-port", type=int, help="with --backend dist, without torchrun: the rendezvous port")
    p.add_argument("--rank", type=int, help="with --backend dist, without torchrun: this process's rank")
    p.add_argument("--world-size", type=int, help="with --backend dist, without torchrun: the number of ranks")
    p.add_argument("--batch", type=int, help="batch size (must be the plan's)")
    add_request_options(p, "precision")
    p.add_argument("--lr", type=float, default=1e-3,
                   help="learning rate of the plan's optimizer (its options' `optimizer`, default adamw) "
                        "(default 1e-3)")
    p.set_defaults(func=_cmd_run)
