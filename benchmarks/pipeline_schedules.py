"""Pipeline schedules for one model, simulated: step time, bubble and each rank's peak memory.

The model is captured at the micro-batch (``--microbatch`` samples; a zoo model's ``batch``) and
priced through the cluster kind's device model, untimed; :func:`tensoropt.planmodel.stages.cut_stages`
cuts it into ``ranks × v`` stages of its blocks (``v`` = 1 for GPipe and 1F1B, 2 for the others);
:func:`tensoropt.planmodel.pipeline.simulate_pipeline` runs each schedule's order as PyTorch's
``torch.distributed.pipelining`` runs it, one stage per GPU of the first ``ranks`` devices (a link's
time per micro-batch's activation between consecutive ranks).  Each rank's memory: its stages'
parameters as the graph holds them, gradients and AdamW state (``--alpha`` × the trainable bytes)
for the trainable ones, plus the activations the schedule keeps in flight at its peak.

    python benchmarks/pipeline_schedules.py [--model zoo:llama3-8b] [--cluster preset:h100-hosts?hosts=1]
                                            [--ranks 8] [--microbatches 8,16,32] [--precision bf16]

It simulates only: nothing here is measured on a GPU (no data parallelism or tensor parallelism
inside a stage, no overlap of the sends with compute, the optimizer step apart).
"""

from __future__ import annotations

import argparse
import time

import tensoropt
from tensoropt.planmodel.pipeline import SCHEDULES, pipeline_order, simulate_pipeline
from tensoropt.planmodel.stages import cut_stages

GIB = 2 ** 30


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:llama3-8b")
    ap.add_argument("--microbatch", type=int, default=1, help="samples per micro-batch (the capture's batch)")
    ap.add_argument("--cluster", default="preset:h100-hosts?hosts=1")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--microbatches", default="8,16,32")
    ap.add_argument("--alpha", type=int, default=2, help="optimizer state × the trainable bytes (AdamW: 2)")
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    a = ap.parse_args()
    t0 = time.perf_counter()
    graph = tensoropt.load_model(a.model, batch=a.microbatch).capture(precision=a.precision)
    cluster = tensoropt.load_cluster(a.cluster)
    costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1,), timed=False), cluster).costs
    devices = cluster.names[:a.ranks]
    print(f"{a.model}, micro-batch {a.microbatch}, {a.precision}, {a.ranks} ranks of {a.cluster} "
          f"({cluster.device(devices[0]).name}); captured and priced in {time.perf_counter() - t0:.1f} s")
    cuts = {}
    print()
    print("| schedule | stages | micro-batches | step ms | bubble | busy ms a rank (max) | peak GiB a rank (max) "
          "| of it in flight GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for schedule in a.schedules.split(","):
        v = 2 if SCHEDULES[schedule][1] else 1
        S = a.ranks * v
        if S not in cuts:
            cuts[S] = cut_stages(graph, costs, S)
        stages = cuts[S]
        for m in (int(x) for x in a.microbatches.split(",")):
            try:
                order = pipeline_order(schedule, ranks=a.ranks, microbatches=m, stages_per_rank=v)
            except tensoropt.TensorOptError as e:
                print(f"| {schedule} | {S} | {m} | — | {e} | | | |")
                continue
            rank = order.rank_of()
            link = max(cluster.link(devices[i], devices[i + 1]).time(max(s.send_bytes for s in stages))
                       for i in range(a.ranks - 1)) if a.ranks > 1 else 0.0
            run = simulate_pipeline(order, forward_s=[s.forward_s for s in stages],
                                    backward_s=[s.backward_s for s in stages], link_s=link,
                                    activation_bytes=[s.activation_bytes for s in stages])
            static = [0.0] * a.ranks
            for i, s in enumerate(stages):
                static[rank[i]] += s.param_bytes + (1 + a.alpha) * s.trainable_bytes
            peak = [static[r] + run.peak_bytes[r] for r in range(a.ranks)]
            worst = max(range(a.ranks), key=lambda r: peak[r])
            print(f"| {schedule} | {S} | {m} | {run.step_s * 1e3:.1f} | {run.bubble_fraction:.1%} | "
                  f"{max(run.busy_s) * 1e3:.1f} | {peak[worst] / GIB:.2f} | {run.peak_bytes[worst] / GIB:.2f} |")
    print()
    print(f"stages of the {a.ranks}-stage cut: " + "; ".join(
        f"{len(s.blocks)} blocks {s.forward_s * 1e3:.1f}+{s.backward_s * 1e3:.1f} ms" for s in cuts.get(a.ranks, [])))
    print(f"total {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
