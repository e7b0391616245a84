"""Tensor parallelism and FSDP × TP as tensoropt prices them and as PyTorch's DTensor runs them, on gloo.

Six recipes of one Llama, each a plan tensoropt's frontier offers and the PyTorch program
``tensoropt export`` writes for it:

- ``tp`` — the tp placer's plan over 2 ranks (Megatron's column / row pairs, the attention on each
  rank's heads), run by ``parallelize_module`` with the ``ColwiseParallel`` / ``RowwiseParallel``
  styles :func:`~tensoropt.export.expressible.tensor_parallel_modules` reads off the plan;
- ``tp+sp`` — the same with sequence parallelism (the blocks' norms and residual adds on each
  rank's batch rows: ``SequenceParallel``, the row layers' output reduce-scattered);
- ``fsdp+tp`` / ``fsdp+tp+ac`` — torchtitan's recipe on 4 ranks, a 2-D ``DeviceMesh`` (dp 2, tp 2):
  :func:`~tensoropt.frontier.replicas.fsdp_tp_recipes`' plans (the tp plan of one host of two,
  replicated over two with runtime ``fsdp2``; blocks kept / checkpointed), run by
  ``parallelize_module`` on tp, (``checkpoint_wrapper`` per block,) ``fully_shard`` per block and on
  the model on dp; ``fsdp+tp+sp`` / ``fsdp+tp+sp+ac`` the same over the ``tp+sp`` host plan.

With ``--microbatches 1,2,4`` the four FSDP × TP recipes are also run stepping each dp row's piece as
that many micro-batches (gradient accumulation: FSDP2 reduce-scatters each micro-batch's gradients into
the sharded ones; the plan captured at one micro-batch) — a recipe whose micro-batch has fewer rows
than tp ranks has no sequence parallelism and is left out.  With ``--hsdp`` the four recipes also run as
HSDP on 8 ranks, torchtitan's 3-D mesh (dp_replicate 2, dp_shard 2, tp 2): four replicas of the same
slice (the batch doubled), ``fully_shard`` on (dp_replicate, dp_shard) — the walk that of FSDP over 2.

Each rank's walked peak (the estimate) beside PyTorch's MemTracker / FSDPMemTracker peak of one step
(:func:`~tensoropt.distributed.jobs.measure_torch_recipe`: forward, loss, the output dropped,
backward, AdamW step), and PyTorch's step time (median over ``--steps``, this machine's gloo: not
what the simulator prices, an H100's).  error = (estimate − measured) / measured.

    python benchmarks/truth_tensor_parallel.py [--model SPEC] [--steps 5] [--warmup 2] [--microbatches 1,2,4] [--hsdp]

It measures and compares: nothing measured here feeds the estimates.
"""

from __future__ import annotations

import argparse
import time

import tensoropt
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import TENSOR_PARALLEL, measure_torch_recipe
from tensoropt.export.expressible import tensor_parallel_modules
from tensoropt.frontier.replicas import fsdp_tp_recipes, host_groups
from tensoropt.planmodel.walk import plan_memory

DEFAULT_MODEL = "zoo:llama3-8b?layers=2&hidden=256&heads=4&kv_heads=2&ffn=512&vocab=2048&seq_len=128&batch=4&meta=False"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL, help="a zoo spec with batch=B (B even: 2 dp rows)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--microbatches", default="1", help="comma-separated counts for the FSDP × TP rows (default 1)")
    ap.add_argument("--hsdp", action="store_true", help="also the HSDP × TP recipes on 8 ranks (2 × 2 × 2)")
    a = ap.parse_args()
    t0 = time.time()
    batch = int(a.model.split("batch=")[1].split("&")[0])
    counts = [int(k) for k in a.microbatches.split(",")]
    rows = []
    # tp, tp+sp: 2 ranks, the whole batch
    graph = tensoropt.load_model(a.model).capture(method="export")
    cluster = tensoropt.load_cluster("preset:h100-hosts?hosts=1&gpus=2")   # memory only: the kind does not matter
    costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False), cluster).costs
    for algo in ("tp", "tp+sp"):
        plan = tensoropt.place(graph, costs, cluster, algo, optimizer="adamw")
        walked = plan_memory(plan, graph, costs, cluster, optimizer="adamw")
        styles = tensor_parallel_modules(graph, plan)
        theirs = launch(measure_torch_recipe, 2, {"model_spec": a.model, "recipe": TENSOR_PARALLEL, "steps": a.steps,
                                                  "warmup": a.warmup, "tensor_parallel": styles}, timeout_s=600)[0]
        rows.append((algo, "2 (tp 2)", max(m.peak for m in walked.values()), max(theirs["peak_bytes"]),
                     theirs["step_s"]))
        print(f"{algo}: done ({time.time() - t0:.0f} s)", flush=True)
    # fsdp+tp, fsdp+tp+ac, fsdp+tp+sp, fsdp+tp+sp+ac: 4 ranks, each dp row half the batch (in k micro-batches)
    cluster = tensoropt.load_cluster("preset:h100-hosts?hosts=2&gpus=2")
    for k in counts:
        part = a.model.replace(f"batch={batch}", f"batch={batch // 2 // k}")   # one replica's micro-batch
        graph = tensoropt.load_model(part).capture(method="export")
        costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False), cluster).costs
        for source, plan, _ in fsdp_tp_recipes(graph, costs, cluster, host_groups(cluster), optimizer="adamw",
                                               workers=1, microbatches=k):
            recipe = "fsdp+ac" if source.endswith("+ac") else "fsdp"
            walked = plan_memory(plan, graph, costs, cluster, optimizer="adamw")
            styles = tensor_parallel_modules(graph, plan)
            theirs = launch(measure_torch_recipe, 4, {"model_spec": a.model, "recipe": recipe, "steps": a.steps,
                                                      "warmup": a.warmup, "tensor_parallel": styles, "tp_size": 2,
                                                      "microbatches": k}, timeout_s=600)[0]
            name = source if k == 1 else f"{source} × {k} micro-batches"
            rows.append((name, "4 (dp 2 × tp 2)", max(m.peak for m in walked.values()), max(theirs["peak_bytes"]),
                         theirs["step_s"]))
            print(f"{name}: done ({time.time() - t0:.0f} s)", flush=True)
    if a.hsdp:   # four replicas of the same slice: the batch doubled, HSDP 2 × 2 over them, tp 2 inside
        cluster = tensoropt.load_cluster("preset:h100-hosts?hosts=4&gpus=2")
        part = a.model.replace(f"batch={batch}", f"batch={batch // 2}")
        doubled = a.model.replace(f"batch={batch}", f"batch={2 * batch}")
        graph = tensoropt.load_model(part).capture(method="export")
        costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False), cluster).costs
        for source, plan, _ in fsdp_tp_recipes(graph, costs, cluster, host_groups(cluster), optimizer="adamw",
                                               workers=1, dp_replicate=2):
            recipe = "fsdp+ac" if source.endswith("+ac") else "fsdp"
            walked = plan_memory(plan, graph, costs, cluster, optimizer="adamw")
            styles = tensor_parallel_modules(graph, plan)
            theirs = launch(measure_torch_recipe, 8, {"model_spec": doubled,
                                                      "recipe": recipe, "steps": a.steps, "warmup": a.warmup,
                                                      "tensor_parallel": styles, "tp_size": 2, "dp_replicate": 2},
                            timeout_s=600)[0]
            rows.append((source, "8 (dp_replicate 2 × dp_shard 2 × tp 2)", max(m.peak for m in walked.values()),
                         max(theirs["peak_bytes"]), theirs["step_s"]))
            print(f"{source}: done ({time.time() - t0:.0f} s)", flush=True)
    print()
    print(f"{a.model}, gloo ranks, AdamW")
    print()
    print("| recipe | ranks | walked B | PyTorch's DTensor / FSDP2 B | error | PyTorch step ms (gloo) |")
    print("|---|---|---:|---:|---:|---:|")
    for name, ranks, ours, measured, step_s in rows:
        print(f"| {name} | {ranks} | {ours:,} | {measured:,} | {(ours - measured) / measured * 100:+.3f} % | "
              f"{step_s * 1e3:.1f} |")
    print(f"\n{time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
