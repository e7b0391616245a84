"""Pipeline plans as PyTorch's pipelining runs them, on gloo ranks: each rank's peak against its price.

For each (schedule, ranks): :func:`tensoropt.planmodel.pipelined.price_pipeline` on the model
captured at the micro-batch's size gives each rank's peak; :func:`tensoropt.distributed.pipelined.train_pipeline`
runs the same cut and schedule through :mod:`torch.distributed.pipelining` — in float64 without
dropout, its losses held to the unmodified model's (:func:`~tensoropt.distributed.pipelined.train_one_process`),
then in float32 with AdamW, each rank's peak of tensor storage over one step after three; each
case with its blocks kept and with every block checkpointed.
error = (priced − measured) / measured.

    python benchmarks/truth_pipeline.py [--model SPEC] [--batch 8] [--microbatches 4]

It measures and compares: nothing measured here feeds the price.  Times are not compared: the
price is a device model's (an A100's), the run this CPU's.
"""

from __future__ import annotations

import argparse

import tensoropt
from tensoropt.distributed import launch
from tensoropt.distributed.pipelined import train_one_process, train_pipeline
from tensoropt.planmodel.pipelined import PipelineRecipe, price_pipeline

DEFAULT_MODEL = "zoo:llama3-8b?layers=4&hidden=64&heads=4&kv_heads=2&ffn=128&vocab=512&seq_len=32&meta=False"
CASES = (("gpipe", 2), ("1f1b", 2), ("interleaved-1f1b", 2), ("looped-bfs", 2), ("gpipe", 4), ("1f1b", 4))
#: each case with its blocks kept, then recomputed (checkpoint_wrapper on each)
CHECKPOINT = (False, True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    args = ap.parse_args()
    m = args.microbatches
    graph = tensoropt.load_model(args.model, batch=args.batch // m).capture(method="export")
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")
    costs = tensoropt.price(tensoropt.profile(graph, timed=False), cluster).costs
    alone = train_one_process(args.model, batch=args.batch, steps=2)
    print(f"{args.model}, batch {args.batch} in {m} micro-batches, AdamW, float32: priced / measured peak a rank")
    print("| schedule | stages on ranks | blocks | losses as the model's | rank | priced KiB | measured KiB | error |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for (schedule, ranks), checkpoint in ((c, k) for c in CASES for k in CHECKPOINT):
        recipe = PipelineRecipe(schedule, ranks=ranks, microbatches=m, checkpoint=checkpoint)
        est = price_pipeline(graph, costs, cluster, recipe, optimizer="adamw")
        job = {"model_spec": args.model, "batch": args.batch, "schedule": schedule, "microbatches": m,
               "stages_per_rank": est.recipe.virtual, "split_points": [list(p) for p in est.split_points],
               "checkpoint_blocks": list(est.checkpointed)}
        losses = launch(train_pipeline, ranks, {**job, "steps": 2}, timeout_s=600)[0]["losses"]
        same = max(abs(a - b) for a, b in zip(losses, alone))
        peaks = launch(train_pipeline, ranks, {**job, "steps": 1, "optimizer": "adamw", "float64": False,
                                               "measure": True, "warmup": 2}, timeout_s=600)[0]["peak_bytes"]
        for r, (dev, measured) in enumerate(zip(est.devices, peaks)):
            priced = est.memory_bytes[dev]
            blocks = "recomputed" if checkpoint else "kept"
            head = (f"| {schedule} | {len(est.stages)} on {ranks} | {blocks} | {'yes' if same <= 1e-6 else 'NO'} "
                    f"({same:.1g}) " if r == 0 else "| | | | ")
            print(f"{head}| {r} | {priced / 1024:,.1f} | {measured / 1024:,.1f} | {priced / measured - 1:+.1%} |")


if __name__ == "__main__":
    main()
