"""``tensoropt compare``: every baseline placer and the frontier's extreme points on one model and
cluster, all simulated the same way — one table like the NetSplit thesis's Table 6-4."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import TensorOptError
from .._io import write_json_atomic
from ..compare import rows_json, solver_options
from ..describe import fmt_bytes
from ..placers import PLACERS
from ..workflow import Request, explore
from ._common import add_fit_arguments, add_precision_argument, fit_options
from ._progress import ProgressBars
from .place import _devices
from ..optimizers import DEFAULT_OPTIMIZER, OPTIMIZER_ALPHA


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f} ms"


def _cmd_compare(args: argparse.Namespace, console: Console) -> int:
    algos = None if args.algos is None else tuple(a.strip() for a in args.algos.split(",") if a.strip())
    if algos == ():
        raise TensorOptError("--algos names no placer; leave it out to run them all")
    unknown = [a for a in algos or () if a not in PLACERS]
    if unknown:
        raise TensorOptError(f"--algos names {unknown[0]!r}, which is not a placer; known: {', '.join(PLACERS)}")
    if args.repeats < 1:
        raise TensorOptError("--repeats must be ≥ 1")
    if args.time_limit is not None:
        solver_options(PLACERS, args.time_limit)   # a bad limit names itself before any work
    budget, reserve = fit_options(args)
    request = Request(args.model, args.cluster, batch=args.batch, optimizer=args.optimizer, precision=args.precision,
                      devices=tuple(args.devices) if args.devices is not None else None, budget=budget,
                      reserve=reserve, profile=args.profile, repeats=args.repeats, frontier=not args.no_frontier,
                      algos=tuple(PLACERS) if algos is None else algos, time_limit=args.time_limit)
    with ProgressBars(console) as progress:
        result = explore(request, progress)
    graph, cluster, devices, rows = result.graph, result.cluster, result.devices, result.rows

    t = Table(title=f"{escape(graph.name)} (batch {graph.batch_size}) on {escape(cluster.name)}: "
                    f"{', '.join(devices)}; optimizer {args.optimizer}; every plan simulated",
              title_justify="left")
    for col in ("algo", "devices used", "iteration time", "samples/s", "max peak / device", "fits",
                "time to place", "own estimate"):
        t.add_column(col, justify="left" if col in ("algo", "devices used") else "right")
    for r in rows:
        if r.error is not None:
            t.add_row(escape(r.algo), "-", "-", "-", "-", "[red]no plan[/red]", f"{r.place_s:.3f} s", "-")
            continue
        t.add_row(escape(r.algo), str(len(r.devices)), _ms(r.time_s),
                  "-" if r.samples_per_s is None else f"{r.samples_per_s:.1f}", fmt_bytes(r.peak_memory_bytes),
                  "yes" if r.fits else "[red]no[/red]", f"{r.place_s:.3f} s", _ms(r.own_time_s))
    console.print(t)
    for r in rows:
        if r.error is not None:
            console.print(f"[yellow]{escape(r.algo)}:[/yellow] {escape(r.error)}", highlight=False)
    ok = [r for r in rows if r.error is None and r.fits]
    if ok:
        best = min(ok, key=lambda r: (r.time_s, r.algo))
        console.print(f"fastest plan that fits: {escape(best.algo)} ({_ms(best.time_s)}, "
                      f"{fmt_bytes(best.peak_memory_bytes)} per device at most)", highlight=False)
    else:
        console.print("[yellow]no algorithm's plan fits the devices' memory[/yellow]")
    if args.verbose:
        for r in rows:
            for n in r.notes:
                console.print(f"[dim]{escape(r.algo)}: {escape(n)}[/dim]", highlight=False)
    if args.json:
        data = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
                for d in rows_json(rows)]
        json.dumps(data)  # fails here, not half-way through writing
        write_json_atomic(args.json, data)
        console.print(f"wrote {escape(str(args.json))}")
    if args.plans:
        out = Path(args.plans)
        out.mkdir(parents=True, exist_ok=True)
        n = 0
        for r in rows:
            if r.plan is not None:
                r.plan.save(out / f"{r.algo.replace(' ', '_')}.json")
                n += 1
        console.print(f"wrote {n} plan(s) to {escape(str(out))}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="every baseline placer and the frontier's extreme points, simulated alike",
                       description="Place MODEL with every baseline placer (or --algos), track the frontier, and "
                                   "simulate every plan on CLUSTER: one table of iteration time, samples/s, peak "
                                   "memory per device, whether it fits, and the time each algorithm took.")
    p.add_argument("model", help="zoo:NAME[?k=v&…], path/to/file.py:factory or graph.json (with --profile)")
    p.add_argument("--cluster", required=True, help="preset:NAME or a cluster YAML / JSON file")
    p.add_argument("--batch", type=int, help="batch size (overrides the model's default)")
    p.add_argument("--devices", type=_devices, help="devices every algorithm may use, comma-separated "
                                                    "(default: all of the cluster's)")
    p.add_argument("--algos", metavar="NAMES", help="placers to run, comma-separated (default: all)")
    p.add_argument("--no-frontier", action="store_true", help="leave out the frontier's rows")
    add_fit_arguments(p)
    add_precision_argument(p)
    p.add_argument("--optimizer", choices=tuple(OPTIMIZER_ALPHA), default=DEFAULT_OPTIMIZER,
                   help="sizes the optimizer state in the memory limits and the simulator (default adamw)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="time limit of each MILP placer's solver (default: the placer's own)")
    p.add_argument("--profile", metavar="PROFILE_JSON", help="use this profile instead of measuring "
                                                             "(it must have the shard degrees the devices need)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per op when profiling (default 3)")
    p.add_argument("--json", metavar="PATH", help="write the rows as a JSON list (keys algo, time_s, "
                                                  "peak_memory_bytes, fits, place_s, …)")
    p.add_argument("--plans", metavar="DIR", help="write every algorithm's plan to DIR/<algo>.json")
    p.add_argument("-v", "--verbose", action="store_true", help="print each algorithm's notes")
    p.set_defaults(func=_cmd_compare)
