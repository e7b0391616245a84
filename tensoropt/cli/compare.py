"""``tensoropt compare``: every baseline placer and the frontier's extreme points on one model and
cluster, all simulated the same way — one table like the NetSplit thesis's Table 6-4.

It owns the ``compare`` command's options and output (the table, ``--json``, ``--plans``); the
work is :func:`tensoropt.workflow.explore`'s and the rows :mod:`tensoropt.compare`'s: it must
not place, profile or simulate anything itself.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .._io import write_json_atomic
from ..compare import CompareRow, rows_json, solver_options
from ..describe import fmt_bytes
from ..errors import TensorOptError
from ..graph import OpGraph
from ..placers import PLACERS
from ..workflow import Exploration, explore
from ._common import add_request_arguments, check_repeats, print_times_from, print_wrote, workflow_request
from ._progress import ProgressBars


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f} ms"


def _algos(text: str | None) -> tuple[str, ...] | None:
    """``--algos`` as placer names (``None``: all); an empty or unknown name is refused."""
    algos = None if text is None else tuple(a.strip() for a in text.split(",") if a.strip())
    if algos == ():
        raise TensorOptError("--algos names no placer; leave it out to run them all")
    unknown = [a for a in algos or () if a not in PLACERS]
    if unknown:
        raise TensorOptError(f"--algos names {unknown[0]!r}, which is not a placer; known: {', '.join(PLACERS)}")
    return algos


#: what a row's memory and time are priced as, by its plan's runtime (:data:`tensoropt.plan.RUNTIMES`)
PRICED_AS = {"executor": "executor", "fsdp2": "FSDP2", "ddp": "DDP", "zero1": "DDP + ZeRO-1",
             "pipelining": "PyTorch pipelining", "dtensor": "DTensor"}


def _print_table(console: Console, result: Exploration, optimizer: str) -> None:
    """One row per algorithm: devices used, time, samples/s, peak, fits, what it is priced as (what
    runs it: :attr:`Plan.runtime <tensoropt.plan.Plan.runtime>`), time to place, own estimate."""
    graph: OpGraph = result.graph
    t = Table(title=f"{escape(graph.name)} (batch {graph.batch_size}) on {escape(result.cluster.name)}: "
                    f"{', '.join(result.devices)}; optimizer {optimizer}; every plan simulated",
              title_justify="left")
    for col in ("algo", "devices used", "iteration time", "samples/s", "max peak / device", "fits", "priced as",
                "time to place", "own estimate", "frontier"):
        t.add_column(col, justify="left" if col in ("algo", "devices used", "priced as", "frontier") else "right")
    for r in result.rows:
        if r.error is not None or r.peak_memory_bytes is None:
            t.add_row(escape(r.algo), "-", "-", "-", "-", "[red]no plan[/red]", "-", f"{r.place_s:.3f} s", "-", "-")
            continue
        t.add_row(escape(r.algo), str(len(r.devices)), _ms(r.time_s),
                  "-" if r.samples_per_s is None else f"{r.samples_per_s:.1f}", fmt_bytes(r.peak_memory_bytes),
                  "yes" if r.fits else "[red]no[/red]", PRICED_AS.get(r.plan.runtime if r.plan else "", "-"),
                  f"{r.place_s:.3f} s", _ms(r.own_time_s), _frontier_cell(r, result))
    console.print(t)


def _frontier_cell(row: CompareRow, result: Exploration) -> str:
    """Where a row stands beside the frontier: ``dominated by pXXX``, ``on it as pXXX`` (its plan
    joined the frontier, or it is the frontier's own row), or ``-`` without a frontier."""
    if not row.dominated_by:
        return "-"
    fr = result.frontier
    point = fr.point(row.dominated_by) if fr is not None else None
    same = point is not None and (point.source == row.algo or row.algo.startswith("frontier"))
    return f"on it as {row.dominated_by}" if same else f"dominated by {row.dominated_by}"


def _print_verdict(console: Console, rows: Sequence[CompareRow], verbose: bool) -> None:
    """The placers' errors, the fastest plan that fits, and with ``verbose`` every row's notes."""
    for r in rows:
        if r.error is not None:
            console.print(f"[yellow]{escape(r.algo)}:[/yellow] {escape(r.error)}", highlight=False)
    ok = [r for r in rows if r.error is None and r.fits]
    if ok:
        best = min(ok, key=lambda r: (math.inf if r.time_s is None else r.time_s, r.algo))
        console.print(f"fastest plan that fits: {escape(best.algo)} ({_ms(best.time_s)}, "
                      f"{fmt_bytes(best.peak_memory_bytes or 0)} per device at most)", highlight=False)
    else:
        console.print("[yellow]no algorithm's plan fits the devices' memory[/yellow]")
    if verbose:
        for r in rows:
            for n in r.notes:
                console.print(f"[dim]{escape(r.algo)}: {escape(n)}[/dim]", highlight=False)


def _write_outputs(console: Console, rows: Sequence[CompareRow], json_path: str | None, plans: str | None) -> None:
    """``--json``: the rows (non-finite numbers as null); ``--plans``: every plan as DIR/<algo>.json."""
    if json_path:
        data = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
                for d in rows_json(rows)]
        json.dumps(data)  # fails here, not half-way through writing
        write_json_atomic(json_path, data)
        print_wrote(console, json_path)
    if plans:
        out = Path(plans)
        out.mkdir(parents=True, exist_ok=True)
        n = 0
        for r in rows:
            if r.plan is not None:
                r.plan.save(out / f"{r.algo.replace(' ', '_')}.json")
                n += 1
        print_wrote(console, out, f"{n} plan(s) to ")


def _cmd_compare(args: argparse.Namespace, console: Console) -> int:
    algos = _algos(args.algos)
    check_repeats(args)
    if args.time_limit is not None:
        solver_options(PLACERS, args.time_limit)   # a bad limit names itself before any work
    request = workflow_request(args, algos=tuple(PLACERS) if algos is None else algos)
    with ProgressBars(console) as progress:
        result = explore(request, progress)
    print_times_from(console, result.source, result.notes)
    _print_table(console, result, args.optimizer)
    _print_verdict(console, result.rows, args.verbose)
    _write_outputs(console, result.rows, args.json, args.plans)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("compare", help="every baseline placer and the frontier's extreme points, simulated alike",
                       description="Place MODEL with every baseline placer (or --algos), track the frontier, and "
                                   "simulate every plan on CLUSTER: one table of iteration time, samples/s, peak "
                                   "memory per device, whether it fits, and the time each algorithm took.")
    p.add_argument("model", help="zoo:NAME[?k=v&…], path/to/file.py:factory or graph.json (with --profile)")
    p.add_argument("--algos", metavar="NAMES", help="placers to run, comma-separated (default: all)")
    add_request_arguments(p, "frontier", "time_limit", "microbatches", "pipelines", "dp_replicate")
    p.add_argument("--json", metavar="PATH", help="write the rows as a JSON list (keys algo, time_s, "
                                                  "peak_memory_bytes, fits, place_s, …)")
    p.add_argument("--plans", metavar="DIR", help="write every algorithm's plan to DIR/<algo>.json")
    p.add_argument("-v", "--verbose", action="store_true", help="print each algorithm's notes")
    p.set_defaults(func=_cmd_compare)
