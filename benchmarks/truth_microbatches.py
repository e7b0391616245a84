"""Steps of micro-batches (gradient accumulation) on 2 gloo ranks: each rank's walked peak against
what tensoropt's executor holds.

For each recipe (``dp``, ``zero1``, ``zero2``, ``fsdp``, ``fsdp+ac``) and each micro-batch count, the
placer's plan for the model captured at one micro-batch, run by tensoropt's executor
(``runtime="executor"``) as steps of ``k`` micro-batches of the step's batch: its walk
(:func:`tensoropt.planmodel.walk.plan_memory`, the larger of the first micro-batch and a later one)
beside the peak PyTorch's MemTracker measures over one step after one
(:func:`tensoropt.distributed.jobs.measure_plan`).  error = (walked − measured) / measured.

    python benchmarks/truth_microbatches.py [--model SPEC] [--batch 4] [--microbatches 1,2]

It measures and compares: nothing measured here feeds the estimates.
"""

from __future__ import annotations

import argparse

import tensoropt
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import measure_plan
from tensoropt.planmodel.walk import plan_memory

DEFAULT_MODEL = "zoo:gpt2?layers=2&hidden=128&heads=4&vocab=4096&seq_len=64"
RECIPES = ("dp", "zero1", "zero2", "fsdp", "fsdp+ac")
MESH = ["gpu0", "gpu1"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a zoo spec without its batch (default %(default)s)")
    ap.add_argument("--batch", type=int, default=4, help="the step's batch (default %(default)s)")
    ap.add_argument("--microbatches", default="1,2", help="counts, comma-separated (default %(default)s)")
    ap.add_argument("--recipes", default=",".join(RECIPES), help="default %(default)s")
    args = ap.parse_args()
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")   # memory only: the kind does not matter
    print("| recipe | micro-batches | walked B | measured B (rank 0) | error |\n|---|---:|---:|---:|---:|")
    for k in (int(x) for x in args.microbatches.split(",")):
        graph = tensoropt.load_model(f"{args.model}&batch={args.batch // k}").capture(method="export")
        costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                                cluster).costs
        for recipe in args.recipes.split(","):
            plan = tensoropt.place(graph, costs, cluster, recipe, devices=MESH, optimizer="adamw")
            plan = plan.with_options(runtime="executor").with_microbatches(k)
            walked = plan_memory(plan, graph, costs, cluster, optimizer="adamw")[MESH[0]].peak
            got = launch(measure_plan, 2, {"model_spec": f"{args.model}&batch={args.batch}", "plan": plan.to_dict(),
                                           "steps": 1, "warmup": 1, "optimizer": "adamw"}, timeout_s=300)[0]
            measured = got["peak_bytes"][0]
            print(f"| {recipe} | {k} | {walked:,} | {measured:,} | {(walked - measured) / measured:+.3%} |",
                  flush=True)


if __name__ == "__main__":
    main()
