"""Pieces several commands share: argument types, capturing a model spec, getting its costs."""

from __future__ import annotations

import argparse
from typing import Any, Iterable

from rich.console import Console
from rich.markup import escape


def degrees(text: str) -> tuple[int, ...]:
    """``--degrees 1,2,4`` → ``(1, 2, 4)``; argparse reports a bad value."""
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--degrees must be comma-separated integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError("--degrees must be positive integers")
    return ks


def add_precision_argument(p: argparse.ArgumentParser) -> None:
    """``--precision {fp32,bf16}``: what the model trains in (:mod:`tensoropt.capture.precision`),
    the same on every command; read it with ``capture_spec(…, precision=args.precision)``."""
    from ..graph import PRECISIONS

    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="what the model trains in: fp32 (default; a saved graph.json keeps its own) or bf16 "
                        "(mixed precision: captured, profiled and run under torch.autocast, float32 weights)")


def capture_spec(spec: str, console: Console, *, batch: int | None = None, batch_dim: int = 0,
                 precision: str | None = None) -> Any:
    """Load a model spec (zoo:…, file.py:factory, .onnx, graph.json) and capture it in ``precision``
    (``--precision``; ``None``: fp32, or a saved graph's own), with a status line."""
    from ..modelspec import load_model

    loaded = load_model(spec, batch=batch)
    with console.status(f"capturing {escape(spec)} …"):
        return loaded.capture(batch_dim=batch_dim, precision=precision)


def costs_for(graph: Any, shard_degrees: Iterable[int], args: argparse.Namespace) -> Any:
    """The CostModel: ``--profile`` checked against the graph (its precision first, then its
    fingerprint), else measured at ``shard_degrees`` (with ``--repeats`` / ``--warmup`` where the
    command has them, in the graph's precision) with a progress bar."""
    from ..measure import profile
    from ..workflow import read_profile

    if getattr(args, "profile", None):
        return read_profile(args.profile, graph)
    return profile(graph, shard_degrees=tuple(sorted(set(shard_degrees))), repeats=args.repeats,
                   warmup=getattr(args, "warmup", 1), progress=True)



def add_fit_arguments(p: argparse.ArgumentParser, *, budget: bool = True) -> None:
    """``--budget`` (a uniform cap per device) and ``--reserve`` (what the framework keeps on every
    device): the inputs of :func:`tensoropt.planmodel.fits.fits`, the same on every command."""
    if budget:
        p.add_argument("--budget", metavar="SIZE", help="memory per device, e.g. 16GiB: a plan fits when every device's "
                                                        "peak is within min(its memory, budget) − reserve")
    p.add_argument("--reserve", metavar="SIZE", default="0",
                   help="memory the framework keeps on every device beside the model (CUDA context, allocator "
                        "slack), e.g. 600MiB (default 0)")


def fit_options(args: argparse.Namespace) -> tuple[int | float | None, int]:
    """``(budget, reserve)`` in bytes from :func:`add_fit_arguments`' options (a bad size names its option)."""
    from ..cluster.units import parse_size
    from ..planmodel.fits import check_budget_value

    budget = getattr(args, "budget", None)
    budget = check_budget_value(parse_size(budget, "--budget") if budget is not None else None, "--budget")
    reserve = int(parse_size(args.reserve, "--reserve", allow_zero=True))
    return budget, reserve
