"""Every zoo model (tiny) × every kind of plan, executed: the largest relative difference of the
loss, gradients and buffers from the unmodified model (float64, dropout off).

    python benchmarks/executor_check.py [--models vgg16,gpt2] [--cluster preset:titan-rtx-5]

Plans: data parallel, m-TOPO, m-ETF, m-SCT on gpu0,gpu1, and the frontier's min-time and
min-memory points; every plan device runs on the CPU.  A cell "FAILED" is out of the check's
tolerance (tensoropt.execute.check); "fallback n" counts the nodes the
executor ran whole because no shard rule runs them in the plan's layout.

It runs plans and reports the check's figures: it must not tune tolerances or plans to pass.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import tensoropt
from tensoropt.execute import apply_plan, compare_with_model, disable_dropout
from tensoropt.zoo import ZOO


def plans_for(graph, costs, cluster):
    out = {}
    for algo in ("dp", "m-topo", "m-etf", "m-sct"):
        out[algo] = tensoropt.place(graph, costs, cluster, algo, devices=["gpu0", "gpu1"])
    fr = tensoropt.track_frontier(graph, costs, cluster)
    out["min-time"] = fr.min_time().plan
    out["min-memory"] = fr.min_memory().plan
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--cluster", default="preset:titan-rtx-5")
    args = ap.parse_args()
    # every plan is checked against the model, not timed: the topology with this machine's own times
    cluster = tensoropt.load_cluster(args.cluster).without_kinds()
    kinds = ("dp", "m-topo", "m-etf", "m-sct", "min-time", "min-memory")
    print("| model | ops | " + " | ".join(kinds) + " | seconds |")
    print("|---|---:|" + "---:|" * len(kinds) + "---:|")
    for name in args.models.split(","):
        t0 = time.perf_counter()
        torch.manual_seed(0)
        lm = tensoropt.load_model(f"zoo:{name}?tiny=1")
        model = disable_dropout(lm.model.double())
        inputs = tuple(t.double() if t.is_floating_point() else t for t in lm.example_inputs)
        graph = tensoropt.capture(model, inputs, method="export")
        costs = tensoropt.profile(graph, shard_degrees=(1, 2, 4), repeats=1)
        cells = []
        for plan in plans_for(graph, costs, cluster).values():
            try:
                m = copy.deepcopy(model)
                planned = apply_plan(m, inputs, plan, graph=graph)
                cmp = compare_with_model(copy.deepcopy(model), planned, inputs)
                cell = f"{cmp.max_rel_diff:.1e}{'' if cmp.passed else ' FAILED'} ({plan.num_devices} dev)"
                if planned.fallbacks:
                    cell += f", fallback {len(planned.fallbacks)}"
            except Exception as e:  # noqa: BLE001 - the table reports it
                cell = f"ERROR {type(e).__name__}: {str(e)[:60]}"
            cells.append(cell)
        took = time.perf_counter() - t0
        print(f"| {name} | {len(graph.ops)} | " + " | ".join(cells) + f" | {took:.0f} |", flush=True)


if __name__ == "__main__":
    main()
