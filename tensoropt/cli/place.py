"""``tensoropt place``: place a model with a baseline placer, simulate the plan, write it."""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import TensorOptError
from ..workflow import Request, measure, prepare
from ._common import add_fit_arguments, add_precision_argument, fit_options
from ._progress import ProgressBars
from ..optimizers import DEFAULT_OPTIMIZER, OPTIMIZER_ALPHA


def _devices(text: str) -> list[str]:
    names = [d.strip() for d in text.split(",") if d.strip()]
    if not names:
        raise argparse.ArgumentTypeError("--devices must name devices, e.g. gpu0,gpu1")
    return names


def print_simulation(console: Console, res, plan, graph, cluster, *, title: str, budget: int | float | None = None,
                     reserve: int = 0) -> bool:
    """The per-device table (peak, what holds it, usable memory) and link busy times of a
    simulation; returns whether the plan fits (:func:`tensoropt.planmodel.fits.fits` under ``budget`` and
    ``reserve``)."""
    from ..describe import fmt_bytes
    from ..planmodel.fits import over_by, usable_bytes

    nodes: dict[str, int] = {}
    for cfg in plan.configs.values():
        for d in cfg.devices:
            nodes[d] = nodes.get(d, 0) + 1
    t = Table(title=title, title_justify="left")
    parts = ("parameters", "gradients", "optimizer", "activations", "transient")
    for col in ("device", "nodes", "compute busy", "peak memory", *parts, "usable", "fits"):
        t.add_column(col, justify="left" if col == "device" else "right")
    peaks = {d: res.memory_bytes.get(d, 0) for d in plan.devices}
    over = over_by(peaks, cluster, budget=budget, reserve=reserve)
    for d in plan.devices:
        split = res.memory[d].parts() if d in res.memory else {}
        t.add_row(escape(d), str(nodes.get(d, 0)), f"{res.compute_s.get(d, 0.0) * 1e3:.3f} ms", fmt_bytes(peaks[d]),
                  *(fmt_bytes(split.get(part, 0)) for part in parts),
                  fmt_bytes(int(usable_bytes(cluster, d, budget=budget, reserve=reserve))),
                  "[red]no[/red]" if d in over else "yes")
    console.print(t)
    fits = not over
    busy = {k: v for k, v in sorted(res.link_s.items()) if v > 0}
    if busy:
        console.print("link busy: " + ", ".join(f"{escape(k)} {v * 1e3:.3f} ms" for k, v in busy.items()))
    else:
        console.print("link busy: none (no transfers)")
    return fits


def _cmd_place(args: argparse.Namespace, console: Console) -> int:
    from ..compare import solver_options
    from ..placers import PLACERS, place
    from ..planmodel.simulate import simulate

    if args.algo not in PLACERS:
        raise TensorOptError(f"unknown placer {args.algo!r}; known: {', '.join(PLACERS)}")
    if args.repeats < 1:
        raise TensorOptError("--repeats must be ≥ 1")
    request = Request(args.model, args.cluster, batch=args.batch, optimizer=args.optimizer, precision=args.precision,
                      devices=tuple(args.devices) if args.devices is not None else None, profile=args.profile,
                      repeats=args.repeats, frontier=False, algos=(args.algo,), time_limit=args.time_limit)
    solver = solver_options([args.algo], args.time_limit).get(args.algo, {})
    with ProgressBars(console) as progress:
        setup = prepare(request, progress)
        graph, costs = measure(request, setup, progress)
    cluster, devices = setup.cluster, list(setup.devices)
    budget, reserve = fit_options(args)
    options = {"devices": devices, "optimizer": args.optimizer, **solver}
    if args.algo != "dp":
        options["colocation"] = args.colocation
        if args.heavy_edge_groups is not None:
            options["heavy_edge_groups"] = args.heavy_edge_groups
    t0 = time.perf_counter()
    plan = place(graph, costs, cluster, args.algo, **options)
    took = time.perf_counter() - t0
    res = simulate(plan, graph, costs, cluster, optimizer=args.optimizer)
    plan = res.annotate(plan)

    fits = print_simulation(console, res, plan, graph, cluster,
                            title=f"{escape(args.algo)}: {escape(graph.name)} (batch {graph.batch_size}) on "
                                  f"{escape(cluster.name)}", budget=budget, reserve=reserve)
    from ..describe import fmt_bytes
    own = next((e for e in plan.estimates if e.source == args.algo), None)
    rate = graph.batch_size / res.time_s if graph.batch_size and res.time_s > 0 else float("nan")
    console.print(f"algo {args.algo}; devices used {len(plan.devices)} of {len(devices)} ({', '.join(plan.devices)}); "
                  f"simulated iteration time {res.time_s * 1e3:.3f} ms; {rate:.1f} samples/s; "
                  f"max per-device peak {fmt_bytes(res.max_memory_bytes)}; fits {'yes' if fits else 'no'}; "
                  f"placed in {took:.3f} s"
                  + (f"; {args.algo}'s own estimate {own.time_s * 1e3:.3f} ms" if own is not None else ""),
                  highlight=False)
    for note in plan.notes:
        if not note.startswith("placed in"):
            console.print(f"  {escape(note)}", highlight=False)
    if not fits:
        console.print("[yellow]warning:[/yellow] the simulated peak of some device exceeds its memory "
                      "(the placer's memory model counts resident bytes only: no transient buffers)")
    if args.output:
        plan.save(args.output)
        console.print(f"wrote {args.output}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("place", help="place a model with a baseline placer (dp, m-topo, m-etf, m-sct, dpos, os-dpos, netsplit, pesto) and simulate it")
    p.add_argument("model", help="zoo:NAME[?k=v&…], path/to/file.py:factory or graph.json (with --profile)")
    p.add_argument("--cluster", required=True, help="preset:NAME or a cluster YAML / JSON file")
    p.add_argument("--algo", required=True, help="dp, m-topo, m-etf, m-sct, dpos, os-dpos, netsplit or pesto")
    p.add_argument("--batch", type=int, help="batch size (overrides the model's default)")
    p.add_argument("--devices", type=_devices, help="devices to use, comma-separated (default: all of the cluster's)")
    add_fit_arguments(p)
    add_precision_argument(p)
    p.add_argument("--optimizer", choices=tuple(OPTIMIZER_ALPHA), default=DEFAULT_OPTIMIZER,
                   help="sizes the optimizer state in the memory model (default adamw)")
    p.add_argument("--colocation", default="ABC",
                   help="TF Placer colocation rules for m-topo / m-etf / m-sct: any of A, B, C, or none (default ABC)")
    p.add_argument("--heavy-edge-groups", type=int, metavar="K",
                   help="also merge groups along the heaviest edges down to K groups (NetSplit Alg. 3)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="solver time limit of the MILP placers (netsplit, pesto; default: the placer's own)")
    p.add_argument("--profile", metavar="PROFILE_JSON", help="use this profile instead of measuring")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per op when profiling (default 3)")
    p.add_argument("-o", "--output", metavar="PLAN_JSON", help="write the plan (with the simulator's estimate)")
    p.set_defaults(func=_cmd_place)
