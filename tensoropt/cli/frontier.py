"""``tensoropt frontier``: the Pareto set of (per-device memory, iteration time) plans of a model
on a cluster, as a table, a CSV and one plan JSON per point.

``tensoropt frontier MODEL --cluster CLUSTER`` captures MODEL (a model spec: ``zoo:NAME?k=v``,
``file.py:factory``, or a saved ``graph.json``) and profiles it (progress bar) at the shard
degrees the meshes need.  ``--profile P`` reuses a saved profile instead: a profile has no graph,
so MODEL is still needed (a ``graph.json`` saved by ``tensoropt graph --json`` avoids capturing
again), and the profile must belong to that graph (same fingerprint: same model and batch size),
else the command stops and says how to re-profile.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..describe import fmt_bytes
from ..frontier import Frontier
from ..planmodel.pipelined import pipeline_text
from ..workflow import Exploration, explore
from ._common import add_request_arguments, print_times_from, print_wrote, workflow_request
from ._progress import ProgressBars


def _rows_to_show(n: int, limit: int) -> list[int]:
    if limit <= 0 or n <= limit:
        return list(range(n))
    if limit == 1:
        return [0]
    step = (n - 1) / (limit - 1)
    return sorted({round(i * step) for i in range(limit)})


def _print_points(console: Console, result: Exploration, frontier: Frontier, optimizer: str, limit: int) -> None:
    """The frontier's points (at most ``limit`` rows, evenly spread; 0: all) as a table."""
    graph, pts = result.graph, frontier.points
    title = (f"{escape(graph.name)} (batch {graph.batch_size}) on {escape(result.cluster.name)}: {len(pts)} "
             f"Pareto-optimal plans over {len(frontier.meshes)} meshes "
             f"({', '.join(str(len(m.mesh)) for m in frontier.meshes)} devices), optimizer {optimizer}, "
             f"{graph.precision}")
    t = Table(title=title, title_justify="left")
    for col in ("plan", "devices", "memory / device", "time", "samples/s", "fits"):
        t.add_column(col, justify="left" if col in ("plan", "devices", "fits") else "right")
    show = _rows_to_show(len(pts), limit)
    for i in show:
        p = pts[i]
        sps = p.samples_per_s(graph.batch_size)
        piped = pipeline_text(p.plan)   # a pipeline's copies are replicas too, not hosts
        where = (f"{p.num_devices} devices: pipeline {piped}" if piped
                 else f"{','.join(p.plan.devices)} × {p.plan.num_replicas} hosts" if p.plan.replicas
                 else ",".join(p.devices))
        if p.plan.microbatches > 1 and not piped:
            where += f", {p.plan.microbatches} micro-batches"
        t.add_row(p.plan_id, escape(where), fmt_bytes(p.memory_bytes), f"{p.time_s * 1e3:.3f} ms",
                  "-" if sps is None else f"{sps:.1f}", "yes" if p.fits_budget else "[red]no[/red]")
    console.print(t)
    if len(show) < len(pts):
        console.print(f"(showing {len(show)} of {len(pts)} points; --rows 0 or --csv for all)")


def _print_summary(console: Console, frontier: Frontier, budget: int | None, took: float) -> None:
    """The fastest plan within the budget, how the tracking went, and the frontier's notes."""
    fits = frontier.under(budget)
    what = f"budget {fmt_bytes(budget)}" if budget is not None else "the devices' memory"
    if fits:
        best = fits[-1]
        console.print(f"fastest plan within {what}: {best.plan_id} — {fmt_bytes(best.memory_bytes)} per device, "
                      f"{best.time_s * 1e3:.3f} ms on {', '.join(best.devices)}", highlight=False)
    else:
        console.print(f"[yellow]no plan fits {what}[/yellow]")
    console.print(f"tracked in {took:.2f} s; resolution {fmt_bytes(frontier.resolution)}, "
                  f"{frontier.merged_by_resolution} plan(s) merged; {'exact' if frontier.exact else 'not exact'}",
                  highlight=False)
    for n in frontier.notes:
        console.print(f"[dim]note: {escape(n)}[/dim]", highlight=False)


def _cmd_frontier(args: argparse.Namespace, console: Console) -> int:
    request = workflow_request(args, frontier=True, algos=())
    with ProgressBars(console) as progress:
        result = explore(request, progress)
    frontier = result.frontier
    assert frontier is not None   # asked for
    print_times_from(console, result.source, result.notes)
    _print_points(console, result, frontier, args.optimizer, args.rows)
    _print_summary(console, frontier, request.budget, result.seconds["frontier"])
    if args.csv:
        frontier.to_csv(args.csv)
        print_wrote(console, args.csv)
    if args.plans:
        paths = frontier.save_plans(args.plans)
        print_wrote(console, args.plans, f"{len(paths)} plan(s) to ")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("frontier", help="the Pareto set of (per-device memory, iteration time) plans",
                       description="Track the whole Pareto frontier of (per-device memory, iteration time) plans "
                                   "of MODEL on CLUSTER; with --profile, reuse a saved profile of MODEL.")
    p.add_argument("model", help="zoo:NAME[?k=v&…], path/to/file.py:factory, or a graph.json "
                                 "(needed with --profile too: a profile has no graph)")
    add_request_arguments(p, "max_walks", "resolution", "degrees", "warmup", "microbatches", "pipelines",
                          "dp_replicate")
    p.add_argument("--csv", metavar="PATH", help="write the frontier as CSV (one row per plan, by memory)")
    p.add_argument("--plans", metavar="DIR", help="write one plan JSON per point, DIR/<plan_id>.json")
    p.add_argument("--rows", type=int, default=40, help="table rows to print, evenly spread (0 = all; default 40)")
    p.set_defaults(func=_cmd_frontier)
