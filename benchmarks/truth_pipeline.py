"""Pipeline plans as PyTorch's pipelining runs them, on gloo ranks: each rank's peak against its price.

For each (schedule, ranks): :func:`tensoropt.planmodel.pipelined.price_pipeline` on the model
captured at the micro-batch's size gives each rank's peak; :func:`tensoropt.distributed.pipelined.train_pipeline`
runs the same cut and schedule through :mod:`torch.distributed.pipelining` — in float64 without
dropout, its losses held to the unmodified model's (:func:`~tensoropt.distributed.pipelined.train_one_process`),
then in float32 with AdamW and the model's dropout, each rank's peak of tensor storage over one step after three; each
case with its blocks kept and with every block checkpointed; the last four cases are two copies of a
two-rank pipeline (data parallel × pipeline parallel on 4 ranks, each copy on half the batch), replicated
and then as FSDP2 shards (torchtitan's PP × FSDP).  With ``--tp 2`` each pipeline rank is two ranks running
its stages as Megatron's pairs (PyTorch's ColwiseParallel / RowwiseParallel; torchtitan's ``(pp, dp, tp)``
mesh), priced in the tp placer's layouts over an 8-GPU host's devices: the :data:`TP_CASES`, up to
pp 2 × FSDP2 2 × tp 2 on 8 ranks.
error = (priced − measured) / measured.

    python benchmarks/truth_pipeline.py [--model SPEC] [--batch 8] [--microbatches 4] [--tp 2]
    python benchmarks/truth_pipeline.py --time      # step times instead, on a wider model

It measures and compares: nothing measured here feeds the price.  Memory is priced through an
A100's device model (memory does not depend on it).  With ``--time`` the price is this CPU's: the
micro-batch's operators timed here (one thread, as each rank runs), the links between two gloo
processes measured and fitted (``bench_links``, as ``benchmarks/truth.py``), SGD; each rank's
median of 7 steps (schedule and optimizer) after two warm-up steps beside the priced step.
"""

from __future__ import annotations

import argparse
import tempfile

import tensoropt
from tensoropt.distributed import launch
from tensoropt.distributed.pipelined import pipeline_job, train_one_process, train_pipeline
from tensoropt.placers.tp import megatron_layouts
from tensoropt.planmodel.pipeline import PipelineError
from tensoropt.planmodel.pipelined import SPLIT_BACKWARD, PipelineRecipe, price_pipeline

DEFAULT_MODEL = "zoo:llama3-8b?layers=4&hidden=64&heads=4&kv_heads=2&ffn=128&vocab=512&seq_len=32&meta=False"
#: (schedule, pipeline ranks, copies of the pipeline: data parallel × pipeline parallel, the copies as FSDP2)
CASES = (("gpipe", 2, 1, False), ("1f1b", 2, 1, False), ("interleaved-1f1b", 2, 1, False), ("looped-bfs", 2, 1, False),
         ("interleaved-zb", 2, 1, False), ("gpipe", 4, 1, False), ("1f1b", 4, 1, False), ("gpipe", 2, 2, False),
         ("1f1b", 2, 2, False), ("gpipe", 2, 2, True), ("1f1b", 2, 2, True), ("interleaved-1f1b", 2, 2, True))
#: --tp: the cases run with tensor-parallel pipeline ranks (up to 8 gloo ranks)
TP_CASES = (("gpipe", 2, 1, False), ("1f1b", 2, 1, False), ("interleaved-1f1b", 2, 1, False),
            ("looped-bfs", 2, 1, False), ("interleaved-zb", 2, 1, False), ("1f1b", 2, 2, False), ("1f1b", 2, 2, True))
#: each case with its blocks kept, then recomputed (checkpoint_wrapper on each)
CHECKPOINT = (False, True)
#: --time: a model wide enough that its operators, not Python, take the step
TIME_MODEL = "zoo:llama3-8b?layers=4&hidden=256&heads=4&kv_heads=2&ffn=512&vocab=2048&seq_len=128&meta=False"


def step_times(batch: int = 16) -> None:
    """Priced against measured step times of 2-rank GPipe and 1F1B (module docstring)."""
    import torch
    from truth import calibrate_links, message_cost  # benchmarks/truth.py: the gloo links, fitted

    from tensoropt.cluster.bench import bench_links

    torch.set_num_threads(1)
    links = bench_links(backend="gloo", world_size=2, repeats=5)
    cluster = calibrate_links(links.cluster("loopback-2", memory_bytes=8 * 2**30), message_cost())
    print(f"{TIME_MODEL}, batch {batch}, SGD, float32, 2 gloo ranks; priced with this CPU's operator times")
    print("| schedule | micro-batches | priced step ms | measured ms (rank 0, rank 1) | error (slowest rank) |")
    print("|---|---:|---:|---:|---:|")
    for m in (4, 8):
        graph = tensoropt.load_model(TIME_MODEL, batch=batch // m).capture(method="export")
        with tempfile.TemporaryDirectory() as fresh:     # measured now, not an older cache's
            costs = tensoropt.profile(graph, shard_degrees=(1,), repeats=5, cache=fresh)
        for schedule in ("gpipe", "1f1b"):
            est = price_pipeline(graph, costs, cluster, PipelineRecipe(schedule, 2, m), optimizer="sgd")
            out = launch(train_pipeline, 2, {**pipeline_job(est, TIME_MODEL, batch=batch), "steps": 1,
                                             "optimizer": "sgd", "float64": False, "measure": True, "warmup": 2,
                                             "rounds": 7}, timeout_s=600)[0]
            measured = out["step_s"]
            print(f"| {schedule} | {m} | {est.step_s * 1e3:.1f} | {measured[0] * 1e3:.1f}, {measured[1] * 1e3:.1f} | "
                  f"{est.step_s / max(measured) - 1:+.1%} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--schedules", default="", help="only these schedules, comma-separated (default: every case)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--time", action="store_true", help="step times (module docstring) instead of memory")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks a pipeline rank (TP_CASES; default 1)")
    args = ap.parse_args()
    if args.time:
        step_times()
        return
    m, tp = args.microbatches, args.tp
    all_cases = TP_CASES if tp > 1 else CASES
    cluster = tensoropt.load_cluster("preset:v100-8-nvlink" if tp > 1 else "preset:a100-4-nvlink")
    graphs = {}   # copies → the graph at a copy's micro-batch, its costs and (tp) Megatron's layouts
    for data in sorted({c[2] for c in all_cases}):
        graph = tensoropt.load_model(args.model, batch=args.batch // (m * data)).capture(method="export")
        costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=sorted({1, tp}), timed=False), cluster).costs
        graphs[data] = graph, costs, megatron_layouts(graph, costs, tp) if tp > 1 else None
    alone = train_one_process(args.model, batch=args.batch, steps=2)
    each = f", each pipeline rank {tp} tensor-parallel ranks" if tp > 1 else ""
    print(f"{args.model}, batch {args.batch} in {m} micro-batches (a copy's batch in {m} with copies){each}, AdamW, "
          "float32: priced / measured peak a rank")
    print("| schedule | stages on ranks | blocks | losses as the model's | rank | priced KiB | measured KiB | error |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    only = [x for x in args.schedules.split(",") if x]
    cases = [(c, k) for c in all_cases for k in CHECKPOINT
             if (not only or c[0] in only) and not (k and c[0] in SPLIT_BACKWARD)]   # (PyTorch cannot run those)
    for (schedule, ranks, data, shard), checkpoint in cases:
        recipe = PipelineRecipe(schedule, ranks=ranks, microbatches=m, checkpoint=checkpoint, data=data, shard=shard,
                                tp=tp)
        graph, costs, layouts = graphs[data]
        try:
            est = price_pipeline(graph, costs, cluster, recipe, optimizer="adamw", layouts=layouts)
        except PipelineError as e:   # a recipe the model cannot take: said
            print(f"| {schedule} | on {ranks} × {data} {'FSDP2 shards' if shard else 'copies'} | refused: {e} |")
            continue
        job = pipeline_job(est, args.model, batch=args.batch)
        losses = launch(train_pipeline, recipe.world, {**job, "steps": 2}, timeout_s=600)[0]["losses"]
        same = max(abs(a - b) for a, b in zip(losses, alone))
        # as a user trains: float32, dropout on (the model's own)
        measure = {**job, "steps": 1, "optimizer": "adamw", "float64": False, "dropout": True, "measure": True,
                   "warmup": 2}
        peaks = launch(train_pipeline, recipe.world, measure, timeout_s=600)[0]["peak_bytes"]
        for r, (dev, measured) in enumerate(zip(est.devices, peaks)):
            priced = est.memory_bytes[dev]
            blocks = "recomputed" if checkpoint else "kept"
            copies = f" × {data} {'FSDP2 shards' if shard else 'copies'}" if data > 1 else ""
            copies += f" × tp {tp}" if tp > 1 else ""
            agrees = "yes" if same <= 1e-6 else "NO"
            head = (f"| {schedule} | {len(est.stages)} on {ranks}{copies} | {blocks} | {agrees} ({same:.1g}) "
                    if r == 0 else "| | | | ")
            print(f"{head}| {r} | {priced / 1024:,.1f} | {measured / 1024:,.1f} | {priced / measured - 1:+.1%} |")


if __name__ == "__main__":
    main()
