"""``tensoropt pipeline``: which pipeline schedule, with how many micro-batches, for a model on a cluster.

Every schedule of ``--schedules`` at every count of ``--microbatches`` over ``--ranks`` devices —
and, with ``--data``, over copies of the pipeline each on its slice of the batch (data parallel ×
pipeline parallel: ``ranks × data`` devices), and with ``--tp``, each pipeline rank ``tp`` devices running its
stages as Megatron's tensor parallelism (``ranks × data × tp``) — priced by
:func:`tensoropt.planmodel.pipelined.price_pipeline` on the model captured at the micro-batch's size
(one capture and profile per count, cached as every command's): the step, the bubble, each rank's
peak, whether it fits and where PyTorch cuts the model.  ``--check`` runs the fastest plan that fits
through :mod:`torch.distributed.pipelining` on gloo ranks (:func:`tensoropt.distributed.pipelined.train_pipeline`)
and holds its losses to the unmodified model's; ``--export DIR`` writes it as a directory torchrun runs
(:func:`tensoropt.export.export_pipeline`).

It owns the command's options and table; it must not price (``planmodel.pipelined``) nor run a
pipeline (``distributed.pipelined``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..describe import fmt_bytes
from ..devicemodel import Priced
from ..errors import TensorOptError
from ..graph import OpGraph
from ..modelspec import load_model
from ..placers.tp import megatron_layouts
from ..planmodel.fits import fits
from ..planmodel.pipeline import SCHEDULES
from ..planmodel.pipeline_fsdp import SHARDED_SCHEDULES
from ..planmodel.pipelined import LOOPED, PipelineEstimate, PipelineRecipe, price_pipeline
from ..workflow import measure, prepare
from ._common import add_request_arguments, check_repeats, fit_options, print_times_from, workflow_request
from ._progress import ProgressBars


@dataclass(frozen=True)
class Row:
    """One priced recipe, and whether it fits every rank's memory."""

    estimate: PipelineEstimate
    fits: bool
    batch: int


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TensorOptError(f"{flag} takes whole numbers separated by commas, e.g. 4,8; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise TensorOptError(f"{flag} takes whole numbers ≥ 1, got {text!r}")
    return values


def _schedules(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in LOOPED]
    if unknown or not names:
        other = [n for n in SCHEDULES if n not in LOOPED]
        raise TensorOptError(f"--schedules names {unknown[0] if unknown else 'none'!r}; priced: {', '.join(LOOPED)} "
                             f"(not yet: {', '.join(other)}: the V schedules' folded stages and the zero-bubble ones' "
                             "deferred weight gradients are not modelled)")
    return names


def _checkpointing(choice: str) -> tuple[bool, ...]:
    return {"no": (False,), "yes": (True,), "both": (False, True)}[choice]


def _batch(args: argparse.Namespace) -> int:
    if args.batch is not None:
        return int(args.batch)
    batch = load_model(args.model, lazy=True).params.get("batch")
    if not isinstance(batch, int):
        raise TensorOptError(f"{args.model} names no batch size: give --batch (the step's, cut into micro-batches)")
    return batch


def _rows(args: argparse.Namespace, console: Console) -> tuple[list[Row], str]:
    budget, reserve = fit_options(args)
    batch = _batch(args)
    counts = _ints(args.microbatches, "--microbatches")
    copies = _ints(args.data, "--data")
    widths = _ints(args.tp, "--tp")
    schedules = _schedules(args.schedules)
    rows: list[Row] = []
    times_from = ""
    pairs = [(d, m) for d in copies for m in counts]
    divides = [(d, m) for d, m in pairs if batch % (m * d) == 0]
    for data, m in (pair for pair in pairs if pair not in divides):
        copies_of = f" × --data {data}" if data > 1 else ""
        why = f"--microbatches {m}{copies_of} does not divide the batch ({batch})"
        if not divides:
            raise TensorOptError(f"{why}: PyTorch's pipelining cuts each copy's batch in equal micro-batches; "
                                 "pick a divisor or set --batch")
        console.print(f"[yellow]{escape(why)}:[/yellow] not priced", highlight=False)
    for data, m in divides:
        # (its own --microbatches are the pipeline's, not the frontier's gradient accumulation)
        request = workflow_request(args, batch=batch // (m * data), frontier=False, algos=(), microbatches=(1,),
                                   degrees=tuple(sorted({1, *widths})))
        with ProgressBars(console) as progress:
            setup = prepare(request, progress)
            graph, priced = measure(request, setup, progress)
        if not times_from:
            print_times_from(console, priced.source, priced.notes)
            times_from = priced.source
        for tp in widths:
            rows += _priced_rows(args, console, graph, priced, list(setup.devices), data, m, tp, batch, schedules,
                                 budget, reserve)
    if not rows:
        raise TensorOptError("no pipeline recipe could be priced (each said why above)")
    return sorted(rows, key=lambda r: (not r.fits, r.estimate.step_s)), times_from


def _priced_rows(args: argparse.Namespace, console: Console, graph: OpGraph, priced: Priced, devices: list[str],
                 data: int, m: int, tp: int, batch: int, schedules: list[str], budget: int | None,
                 reserve: int) -> list[Row]:
    """Every schedule and checkpointing of ``m`` micro-batches over ``data`` copies of a pipeline of
    ``tp``-way tensor-parallel ranks (its stages in Megatron's layouts), priced on ``devices``; a recipe
    that cannot be priced is printed with its reason."""
    ranks = args.ranks or len(devices) // (data * tp)
    devices = devices[:ranks * data * tp]
    if ranks < 2 or len(devices) < ranks * data * tp:
        each = f" of {tp} tensor-parallel devices" if tp > 1 else ""
        console.print(f"[yellow]--data {data} --tp {tp}:[/yellow] the devices hold no pipeline of "
                      f"{max(ranks, 2)} ranks{each} × {data} copies", highlight=False)
        return []
    try:
        layouts = megatron_layouts(graph, priced.costs, tp) if tp > 1 else None
    except TensorOptError as e:
        console.print(f"[yellow]--tp {tp}:[/yellow] {escape(str(e))}", highlight=False)
        return []
    sharding = {"no": (False,), "yes": (True,), "both": (False, True)}[args.shard] if data > 1 else (False,)
    rows = []
    # (both: the other schedules' copies replicated only, FSDP2 on them is not priced)
    for name, checkpoint, shard in ((n, c, f) for n in schedules for c in _checkpointing(args.checkpoint)
                                    for f in sharding
                                    if not (f and args.shard == "both" and n not in SHARDED_SCHEDULES)):
        recipe = PipelineRecipe(name, ranks=ranks, microbatches=m, checkpoint=checkpoint, data=data, shard=shard, tp=tp)
        try:
            est = price_pipeline(graph, priced.costs, priced.cluster, recipe, devices=devices,
                                 optimizer=args.optimizer, layouts=layouts)
        except TensorOptError as e:
            console.print(f"[yellow]{escape(str(recipe))}:[/yellow] {escape(str(e))}", highlight=False)
            continue
        rows.append(Row(est, fits(est.memory_bytes, priced.cluster, budget=budget, reserve=reserve), batch))
    return rows


def _print(console: Console, rows: list[Row], title: str) -> None:
    table = Table(title=title)
    for col in ("schedule", "stages", "micro-batches", "blocks", "step ms", "samples/s", "bubble", "peak / rank (max)",
                "fits"):
        table.add_column(col, justify="left" if col in ("schedule", "blocks") else "right")
    for r in rows:
        e = r.estimate
        copies = f" × {e.recipe.data} {'FSDP2 shards' if e.recipe.shard else 'copies'}" if e.recipe.data > 1 else ""
        copies += f" × tp {e.recipe.tp}" if e.recipe.tp > 1 else ""
        table.add_row(e.recipe.schedule, f"{len(e.stages)} on {e.recipe.ranks}{copies}", str(e.recipe.microbatches),
                      "recomputed" if e.recipe.checkpoint else "kept",
                      f"{e.step_s * 1e3:.3f}", f"{r.batch / e.step_s:,.1f}" if e.step_s > 0 else "-",
                      f"{e.bubble_fraction:.1%}", fmt_bytes(e.max_memory_bytes), "yes" if r.fits else "no")
    console.print(table)


def _check(console: Console, args: argparse.Namespace, row: Row) -> int:
    from ..distributed import launch
    from ..distributed.pipelined import CHECK_ABS, pipeline_job, train_one_process, train_pipeline

    e = row.estimate
    console.print(f"checking {escape(str(e.recipe))} on {e.recipe.world} gloo ranks (float64, dropout off) against "
                  "the unmodified model …", highlight=False)
    ran = launch(train_pipeline, e.recipe.world,
                 {**pipeline_job(e, args.model, batch=row.batch), "steps": args.check_steps}, timeout_s=600)[0]
    alone = train_one_process(args.model, batch=row.batch, steps=args.check_steps)
    worst = max(abs(a - b) for a, b in zip(ran["losses"], alone))
    ok = worst <= CHECK_ABS
    for k, (a, b) in enumerate(zip(ran["losses"], alone)):
        console.print(f"  step {k}: pipeline {a!r}, model {b!r}", highlight=False)
    console.print(("[green]check passed[/green]" if ok else "[red]check failed[/red]")
                  + f": largest loss difference {worst:.3g} (allowed {CHECK_ABS:g})", highlight=False)
    return 0 if ok else 1


def _cmd_pipeline(args: argparse.Namespace, console: Console) -> int:
    check_repeats(args)
    if args.ranks is not None and args.ranks < 2:
        raise TensorOptError("--ranks must be ≥ 2: a pipeline of one rank is the model")
    rows, times_from = _rows(args, console)
    world = max(r.estimate.recipe.world for r in rows)
    _print(console, rows, f"pipelines of {escape(args.model)} (batch {rows[0].batch}) on {world} of "
                          f"{escape(args.cluster)}'s devices")
    cuts = {len(r.estimate.stages): r.estimate for r in reversed(rows)}
    for n, est in sorted(cuts.items()):
        console.print(f"{n} stages cut at (PyTorch's SplitPoint): "
                      f"{', '.join(f'{m} {w}' for m, w in est.split_points)}", highlight=False)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"schedule": r.estimate.recipe.schedule, "ranks": r.estimate.recipe.ranks,
                        "data": r.estimate.recipe.data, "tp": r.estimate.recipe.tp, "sync_s": r.estimate.sync_s,
                        "stages": len(r.estimate.stages), "microbatches": r.estimate.recipe.microbatches,
                        "checkpoint": r.estimate.recipe.checkpoint,
                        "step_s": r.estimate.step_s, "bubble_fraction": r.estimate.bubble_fraction,
                        "memory_bytes": r.estimate.memory_bytes, "fits": r.fits,
                        "split_points": [list(p) for p in r.estimate.split_points]} for r in rows], f, indent=1)
        console.print(f"wrote {escape(args.json)}", highlight=False)
    if not args.check and not args.export:
        return 0
    if load_model(args.model, lazy=True).meta:
        flag = "--check" if args.check else "--export"
        raise TensorOptError(f"{args.model} is built on the meta device (no weights): {flag} needs a model that runs; "
                             "give its spec meta=False (a shortened variant, e.g. layers=2, to check it here)")
    fitting = [r for r in rows if r.fits]
    if not fitting:
        raise TensorOptError(f"{'--check' if args.check else '--export'}: no pipeline plan fits the devices' memory "
                             "(see the table); raise --budget or add micro-batches")
    if args.export:
        from ..export import export_pipeline

        best = fitting[0]
        out = export_pipeline(best.estimate, args.model, args.export, batch=best.batch, steps=args.check_steps,
                              optimizer=args.optimizer, times_from=times_from)
        console.print(f"wrote {escape(str(out))}/ (train.py, README.md): {escape(str(best.estimate.recipe))}; run it: "
                      f"cd {escape(str(out))} && torchrun --standalone --nproc-per-node "
                      f"{best.estimate.recipe.world} train.py", highlight=False, soft_wrap=True)
    return _check(console, args, fitting[0]) if args.check else 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("pipeline", help="price pipeline schedules (GPipe, 1F1B, interleaved 1F1B, looped BFS) and "
                                        "micro-batch counts for a model; --check runs one through PyTorch")
    p.add_argument("model", help="zoo:NAME[?k=v&…] or path/to/file.py:factory")
    add_request_arguments(p)
    p.add_argument("--ranks", type=int, help="pipeline ranks (default: every device --devices / the cluster has)")
    p.add_argument("--data", default="1",
                   help="copies of the pipeline, comma-separated counts (default 1): each on its slice of the batch "
                        "over ranks × copies devices (pipeline rank r of copy d on device r·copies + d), gradients "
                        "averaged over the copies; --ranks then defaults to the devices / copies")
    p.add_argument("--tp", default="1",
                   help="tensor-parallel devices a pipeline rank, comma-separated counts (default 1): each stage's "
                        "blocks as Megatron's column / row pairs over them (PyTorch's ColwiseParallel / "
                        "RowwiseParallel), over ranks × copies × tp devices (torchtitan's (pp, dp, tp) mesh: a rank's "
                        "tp devices neighbours); --ranks then defaults to the devices / (copies × tp)")
    p.add_argument("--shard", choices=("no", "yes", "both"), default="both",
                   help="with copies, run them as FSDP2 (fully_shard per block and stage over a pipeline rank's "
                        "copies: torchtitan's PP × FSDP; GPipe and 1F1B) instead of replicas: no, yes, or price both "
                        "(default)")
    p.add_argument("--microbatches", default="4,8", help="micro-batch counts to price, comma-separated (default 4,8)")
    p.add_argument("--schedules", default="gpipe,1f1b,interleaved-1f1b",
                   help=f"schedules, comma-separated, of {', '.join(LOOPED)} (default gpipe,1f1b,interleaved-1f1b)")
    p.add_argument("--checkpoint", choices=("no", "yes", "both"), default="both",
                   help="recompute every repeated block in its backward (checkpoint_wrapper): no, yes, or price both "
                        "(default)")
    p.add_argument("--check", action="store_true",
                   help="run the fastest plan that fits on gloo ranks and hold its losses to the model's")
    p.add_argument("--check-steps", type=int, default=2, help="steps --check trains, and --export's default (2)")
    p.add_argument("--json", metavar="FILE", help="write every row as JSON")
    p.add_argument("--export", metavar="DIR", help="write the fastest plan that fits as a directory torchrun runs "
                                                   "(train.py through torch.distributed.pipelining, README.md)")
    p.set_defaults(func=_cmd_pipeline)
