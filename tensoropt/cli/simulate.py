"""``tensoropt simulate``: one training step of a saved plan, event by event."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from ..errors import TensorOptError
from ..optimizers import DEFAULT_OPTIMIZER, OPTIMIZER_ALPHA
from ._common import add_fit_arguments, add_precision_argument


def _cmd_simulate(args: argparse.Namespace, console: Console) -> int:
    from ..cluster import load_cluster
    from ..describe import fmt_bytes
    from ..plan import Plan
    from ..planmodel.simulate import simulate
    from ._common import capture_spec, costs_for, fit_options
    from .place import print_simulation

    if args.repeats < 1:
        raise TensorOptError("--repeats must be ≥ 1")
    budget, reserve = fit_options(args)
    cluster = load_cluster(args.cluster)
    plan = Plan.load(args.plan)
    batch = args.batch
    if batch is None and args.model.startswith("zoo:") and plan.batch_size:
        batch = plan.batch_size  # capture the model at the batch size the plan was made for
    graph = capture_spec(args.model, console, batch=batch, precision=args.precision)
    plan = Plan.load(args.plan, graph, cluster)   # refuses another graph's plan, or unknown devices
    if plan.cluster_fingerprint and plan.cluster_fingerprint != cluster.fingerprint:
        console.print(f"[yellow]warning:[/yellow] the plan was made for cluster {escape(plan.cluster_name)!s} "
                      f"(fingerprint {plan.cluster_fingerprint[:12]}…), not this one ({cluster.fingerprint[:12]}…)")
    degrees = {1} | {cfg.degree for cfg in plan.configs.values()}
    costs = costs_for(graph, degrees, args)
    res = simulate(plan, graph, costs, cluster, optimizer=args.optimizer, overlap=not args.no_overlap)
    fits = print_simulation(console, res, plan, graph, cluster,
                            title=f"plan {escape(plan.plan_id or plan.algorithm)} for {escape(graph.name)} "
                                  f"(batch {graph.batch_size}) on {escape(cluster.name)}", budget=budget,
                            reserve=reserve)
    rate = graph.batch_size / res.time_s if graph.batch_size and res.time_s > 0 else float("nan")
    console.print(f"simulated iteration time {res.time_s * 1e3:.3f} ms; {rate:.1f} samples/s; "
                  f"max per-device peak {fmt_bytes(res.max_memory_bytes)}; fits {'yes' if fits else 'no'}",
                  highlight=False)
    for e in plan.estimates:
        if e.source != "simulator":
            console.print(f"  plan's {escape(e.source)} estimate: {e.time_s * 1e3:.3f} ms", highlight=False)
    if args.output:
        res.annotate(plan).save(args.output)
        console.print(f"wrote {args.output}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate one training step of a saved plan (time, memory per device)")
    p.add_argument("plan", help="a plan JSON (tensoropt place -o, frontier)")
    p.add_argument("model", help="the model the plan was made for: zoo:NAME[?k=v&…], file.py:factory or graph.json "
                                 "(a graph.json needs --profile)")
    p.add_argument("--cluster", required=True, help="preset:NAME or a cluster YAML / JSON file")
    p.add_argument("--batch", type=int, help="batch size (default: the plan's, for zoo models)")
    p.add_argument("--profile", metavar="PROFILE_JSON", help="use this profile (checked against the graph) "
                                                             "instead of measuring")
    add_fit_arguments(p)
    add_precision_argument(p)
    p.add_argument("--optimizer", choices=tuple(OPTIMIZER_ALPHA), default=DEFAULT_OPTIMIZER,
                   help="sizes the optimizer state and temporaries (default adamw)")
    p.add_argument("--no-overlap", action="store_true",
                   help="all-reduce parameter gradients after the whole backward, not as each node's ends")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per op when profiling (default 3)")
    p.add_argument("-o", "--output", metavar="PLAN_JSON", help="write the plan with the simulator's estimate")
    p.set_defaults(func=_cmd_simulate)
