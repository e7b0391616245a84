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


def capture_spec(spec: str, console: Console, *, batch: int | None = None, batch_dim: int = 0) -> Any:
    """Load a model spec (zoo:…, file.py:factory, .onnx, graph.json) and capture it, with a status line."""
    from ..modelspec import load_model

    loaded = load_model(spec, batch=batch)
    with console.status(f"capturing {escape(spec)} …"):
        return loaded.capture(batch_dim=batch_dim)


def costs_for(graph: Any, shard_degrees: Iterable[int], args: argparse.Namespace) -> Any:
    """The CostModel: ``--profile`` checked against the graph, else measured at ``shard_degrees``
    (with ``--repeats`` / ``--warmup`` where the command has them) with a progress bar."""
    from ..costs import CostModel, profile

    if getattr(args, "profile", None):
        return CostModel.load(args.profile, graph)
    return profile(graph, shard_degrees=tuple(sorted(set(shard_degrees))), repeats=args.repeats,
                   warmup=getattr(args, "warmup", 1), progress=True)

