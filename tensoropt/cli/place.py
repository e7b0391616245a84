"""``tensoropt place``: place a model with one baseline placer, simulate the plan, print and write it.

It owns the ``place`` command's own options (``--algo``, ``--colocation``, …) and output; the
shared options and the simulation table come from :mod:`._common`, the capture and profile
from :mod:`tensoropt.workflow` (it must not measure or price anything itself).
"""

from __future__ import annotations

import argparse
import inspect
import time
from typing import Any

from rich.console import Console
from rich.markup import escape

from ..compare import solver_options
from ..errors import TensorOptError
from ..placers import PLACERS, place
from ..planmodel.simulate import simulate
from ..workflow import measure, prepare
from ._common import (
    add_request_arguments,
    check_repeats,
    fit_options,
    print_simulation,
    print_times_from,
    save_output,
    simulation_line,
    workflow_request,
)
from ._progress import ProgressBars


def _placer_options(args: argparse.Namespace, devices: list[str]) -> dict[str, Any]:
    """What :func:`tensoropt.placers.place` gets: the devices, the optimizer, the solver's time
    limit, and for the grouping placers (those that take ``colocation``: all but dp, the ZeRO / FSDP
    recipes and tp) the colocation rules."""
    options: dict[str, Any] = {"devices": devices, "optimizer": args.optimizer,
                               **solver_options([args.algo], args.time_limit).get(args.algo, {})}
    if "colocation" in inspect.signature(PLACERS[args.algo]).parameters:
        options["colocation"] = args.colocation
        if args.heavy_edge_groups is not None:
            options["heavy_edge_groups"] = args.heavy_edge_groups
    return options


def _cmd_place(args: argparse.Namespace, console: Console) -> int:
    if args.algo not in PLACERS:
        raise TensorOptError(f"unknown placer {args.algo!r}; known: {', '.join(PLACERS)}")
    check_repeats(args)
    budget, reserve = fit_options(args)   # a bad size names itself before any work
    request = workflow_request(args, frontier=False, algos=(args.algo,), time_limit=args.time_limit)
    with ProgressBars(console) as progress:
        setup = prepare(request, progress)
        graph, priced = measure(request, setup, progress)
    costs, cluster, devices = priced.costs, priced.cluster, list(setup.devices)
    print_times_from(console, priced.source, priced.notes)
    options = _placer_options(args, devices)
    t0 = time.perf_counter()
    plan = place(graph, costs, cluster, args.algo, **options)
    took = time.perf_counter() - t0
    res = simulate(plan, graph, costs, cluster, optimizer=args.optimizer)
    plan = res.annotate(plan)

    fits = print_simulation(console, res, plan, cluster,
                            title=f"{escape(args.algo)}: {escape(graph.name)} (batch {graph.batch_size}) on "
                                  f"{escape(cluster.name)}", budget=budget, reserve=reserve)
    own = next((e for e in plan.estimates if e.source == args.algo), None)
    console.print(f"algo {args.algo}; devices used {len(plan.devices)} of {len(devices)} ({', '.join(plan.devices)}); "
                  f"{simulation_line(res, graph, fits)}; placed in {took:.3f} s"
                  + (f"; {args.algo}'s own estimate {own.time_s * 1e3:.3f} ms" if own is not None else ""),
                  highlight=False)
    for note in plan.notes:
        if not note.startswith("placed in"):
            console.print(f"  {escape(note)}", highlight=False)
    if not fits:
        console.print("[yellow]warning:[/yellow] the simulated peak of some device exceeds its memory "
                      "(the placer's memory model counts resident bytes only: no transient buffers)")
    save_output(console, plan, args.output)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("place", help="place a model with a baseline placer (dp, zero1, zero2, fsdp, fsdp+ac, tp, "
                                     "m-topo, m-etf, m-sct, dpos, os-dpos, netsplit, pesto) and simulate it")
    p.add_argument("model", help="zoo:NAME[?k=v&…], path/to/file.py:factory or graph.json (with --profile)")
    p.add_argument("--algo", required=True,
                   help="dp, zero1, zero2, fsdp, fsdp+ac, tp, m-topo, m-etf, m-sct, dpos, os-dpos, netsplit or pesto")
    add_request_arguments(p, "time_limit")
    p.add_argument("--colocation", default="ABC",
                   help="TF Placer colocation rules for m-topo / m-etf / m-sct: any of A, B, C, or none (default ABC)")
    p.add_argument("--heavy-edge-groups", type=int, metavar="K",
                   help="also merge groups along the heaviest edges down to K groups (NetSplit Alg. 3)")
    p.add_argument("-o", "--output", metavar="PLAN_JSON", help="write the plan (with the simulator's estimate)")
    p.set_defaults(func=_cmd_place)
