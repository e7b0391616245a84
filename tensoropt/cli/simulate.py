"""``tensoropt simulate``: one training step of a saved plan, event by event.

It owns the ``simulate`` command's options and output; the shared options, the capture, the
costs and the simulation table come from :mod:`._common`.  It must not change the plan beyond
adding the simulator's estimate (``-o``).
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from ..cluster import load_cluster
from ..plan import Plan
from ..planmodel.simulate import simulate
from ._common import (
    PLAN_BATCH_HELP,
    add_request_options,
    capture_spec,
    check_repeats,
    costs_for,
    fit_options,
    print_simulation,
    print_times_from,
    save_output,
    simulation_line,
)


def _cmd_simulate(args: argparse.Namespace, console: Console) -> int:
    check_repeats(args)
    budget, reserve = fit_options(args)
    cluster = load_cluster(args.cluster)
    plan = Plan.load(args.plan)
    batch = args.batch
    if batch is None and args.model.startswith("zoo:") and plan.batch_size:
        batch = plan.global_batch_size  # the step's batch the plan was made for (a replica's slice is captured)
    graph = capture_spec(args.model, console, batch=batch, precision=args.precision, plan=plan)
    plan = Plan.load(args.plan, graph, cluster)   # refuses another graph's plan, or unknown devices
    if plan.cluster_fingerprint and plan.cluster_fingerprint != cluster.fingerprint:
        console.print(f"[yellow]warning:[/yellow] the plan was made for cluster {escape(plan.cluster_name)!s} "
                      f"(fingerprint {plan.cluster_fingerprint[:12]}…), not this one ({cluster.fingerprint[:12]}…)")
    degrees = {1} | {cfg.degree for cfg in plan.configs.values()}
    priced = costs_for(graph, degrees, args, cluster, plan.devices, console)
    cluster = priced.cluster
    print_times_from(console, priced.source, priced.notes)
    res = simulate(plan, graph, priced.costs, cluster, optimizer=args.optimizer, overlap=not args.no_overlap)
    fits = print_simulation(console, res, plan, cluster,
                            title=f"plan {escape(plan.plan_id or plan.algorithm)} for {escape(graph.name)} "
                                  f"(batch {graph.batch_size}) on {escape(cluster.name)}", budget=budget,
                            reserve=reserve)
    console.print(simulation_line(res, graph, fits, plan.num_replicas), highlight=False)
    for e in plan.estimates:
        if e.source != "simulator":
            console.print(f"  plan's {escape(e.source)} estimate: {e.time_s * 1e3:.3f} ms", highlight=False)
    if args.output:
        save_output(console, res.annotate(plan), args.output)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="simulate one training step of a saved plan (time, memory per device)")
    p.add_argument("plan", help="a plan JSON (tensoropt place -o, frontier)")
    p.add_argument("model", help="the model the plan was made for: zoo:NAME[?k=v&…], file.py:factory or graph.json "
                                 "(a graph.json needs --profile)")
    add_request_options(p, "cluster", "batch", "profile", "costs_from", "calibration", "budget", "reserve",
                        "precision", "optimizer", help={"batch": PLAN_BATCH_HELP})
    p.add_argument("--no-overlap", action="store_true",
                   help="all-reduce parameter gradients after the whole backward, not as each node's ends")
    add_request_options(p, "repeats", "cache", "cache_dir")
    p.add_argument("-o", "--output", metavar="PLAN_JSON", help="write the plan with the simulator's estimate")
    p.set_defaults(func=_cmd_simulate)
