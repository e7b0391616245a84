"""The data-parallel recipes as tensoropt plans and as PyTorch's own wrappers, on 2 gloo ranks.

For each recipe — ``ddp`` (DistributedDataParallel), ``zero1`` (+ ZeroRedundancyOptimizer),
``fsdp`` (FSDP2's ``fully_shard`` per block, then the model), ``fsdp+ac`` (the same with a
checkpoint around every block) — the placer of the same name gives tensoropt's plan, priced as the
wrapper ``tensoropt export`` writes for it runs it (its runtime: ``ddp``, ``zero1``, ``fsdp2``).
Its walked per-rank peak (the estimate) is set beside what PyTorch's wrappers hold running the recipe
(MemTracker / FSDPMemTracker, one step of the exported ``train.py``'s: the output dropped before the
backward; what exists before the step registered as held, DDP's buckets included), and the same plan
priced as tensoropt's own executor runs it beside what that executor holds; with each side's step
time (forward + loss + backward, median over ``--steps``; the optimizer step apart).
error = (estimate − measured) / measured; peaks are the largest over the ranks.

    python benchmarks/truth_wrappers.py [--model SPEC] [--steps 5] [--warmup 2]
    python benchmarks/truth_wrappers.py --time [--rounds 3]    # step times: simulated against measured

With ``--time`` each plan's step is simulated (:func:`tensoropt.simulate`, its runtime the wrapper's)
on this CPU's costs — the operators profiled here with one thread, as each rank runs, the links
between two gloo processes measured and calibrated (``bench_links``, as ``benchmarks/truth.py``) — up
to the optimizer step (ZeRO's gathers of the updated parameters run inside PyTorch's, timed apart),
against the wrappers' step (forward + loss + backward with their collectives: the median over 15
steps of the slowest rank, the median of ``--rounds`` launches, their range in brackets).

It measures and compares: nothing measured here feeds the estimates.
"""

from __future__ import annotations

import argparse
import time

import tensoropt
from tensoropt.distributed import launch
from tensoropt.distributed.jobs import TORCH_RECIPES, measure_plan, measure_torch_recipe
from tensoropt.plan import Plan
from tensoropt.planmodel.walk import plan_memory

DEFAULT_MODEL = "zoo:gpt2?layers=2&hidden=256&heads=4&vocab=8192&batch=4&seq_len=128"
MIB = 2 ** 20


def err(est: float, meas: float) -> str:
    return f"{(est - meas) / meas * 100:+.1f} %"


def step_times(model: str, rounds: int, optimizer: str) -> None:
    """Simulated against measured step times of the wrappers (module docstring)."""
    import statistics
    import tempfile

    import torch

    from tensoropt.cluster.bench import bench_links
    from tensoropt.distributed.calibrate import calibrate_links, message_cost

    torch.set_num_threads(1)
    links = bench_links(backend="gloo", world_size=2, repeats=5)
    cluster = calibrate_links(links.cluster("loopback-2", memory_bytes=8 * 2**30), message_cost())
    devices = [d.name for d in cluster.devices]
    graph = tensoropt.load_model(model).capture(method="export")
    with tempfile.TemporaryDirectory() as fresh:     # measured now, not an older cache's
        costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=5, cache=fresh)
    print(f"{model}, 2 gloo ranks, {optimizer}; simulated on this CPU's operator times and gloo links")
    print("| recipe | priced as | simulated ms | PyTorch's wrappers ms (rounds) | error |")
    print("|---|---|---:|---:|---:|")
    for recipe, placer in TORCH_RECIPES.items():
        plan = tensoropt.place(graph, costs, cluster, placer, devices=devices)
        sim = tensoropt.simulate(plan, graph, costs, cluster, memory=False)
        # up to the optimizer step: its gathers of the updated parameters run inside PyTorch's, timed apart
        simulated = max((e.end for e in sim.timeline if e.phase != "update"), default=0.0)
        measured = [launch(measure_torch_recipe, 2, {"model_spec": model, "recipe": recipe, "steps": 15, "warmup": 3,
                                                      "optimizer": optimizer}, timeout_s=600)[0]["step_s"]
                    for _ in range(rounds)]
        mid = statistics.median(measured)
        print(f"| {recipe} | {plan.runtime} | {simulated * 1e3:.1f} | {mid * 1e3:.1f} ({min(measured) * 1e3:.1f} – "
              f"{max(measured) * 1e3:.1f}) | {err(simulated, mid)} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--time", action="store_true", help="step times (module docstring) instead of memory")
    ap.add_argument("--rounds", type=int, default=3, help="--time: launches of each recipe (median)")
    a = ap.parse_args()
    if a.time:
        step_times(a.model, a.rounds, a.optimizer)
        return
    t0 = time.time()
    graph = tensoropt.load_model(a.model).capture(method="export")
    cluster = tensoropt.load_cluster("preset:a100-4-nvlink")    # memory only: the devices' kind does not matter
    costs = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False), cluster).costs
    rows = []
    for recipe, placer in TORCH_RECIPES.items():
        plan = tensoropt.place(graph, costs, cluster, placer, devices=["gpu0", "gpu1"])
        walked = max(m.peak for m in plan_memory(plan, graph, costs, cluster, optimizer=a.optimizer).values())
        on_executor = Plan.from_dict({**plan.to_dict(), "options": {**plan.options, "runtime": "executor"}})
        walked_executor = max(m.peak for m in plan_memory(on_executor, graph, costs, cluster,
                                                          optimizer=a.optimizer).values())
        ours = launch(measure_plan, 2, {"model_spec": a.model, "plan": on_executor.to_dict(), "steps": a.steps,
                                        "warmup": a.warmup, "optimizer": a.optimizer}, timeout_s=600)[0]
        torch_side = launch(measure_torch_recipe, 2, {"model_spec": a.model, "recipe": recipe, "steps": a.steps,
                                                      "warmup": a.warmup, "optimizer": a.optimizer},
                            timeout_s=600)[0]
        rows.append((recipe, plan.runtime, walked, max(torch_side["peak_bytes"]), walked_executor,
                     max(ours["peak_bytes"]), torch_side["step_s"], ours["step_s"]))
        print(f"{recipe}: done ({time.time() - t0:.0f} s)", flush=True)
    print()
    print(f"{a.model}, 2 gloo ranks, {a.optimizer}")
    print()
    print("| recipe | priced as | walked MiB | PyTorch's wrappers MiB (err) | walked as tensoropt's executor MiB "
          "| tensoropt's executor MiB (err) | PyTorch ms | tensoropt's executor ms |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for recipe, runtime, walked, theirs, walked_executor, ours, theirs_s, ours_s in rows:
        print(f"| {recipe} | {runtime} | {walked / MIB:.2f} | {theirs / MIB:.2f} ({err(walked, theirs)}) | "
              f"{walked_executor / MIB:.2f} | {ours / MIB:.2f} ({err(walked_executor, ours)}) | "
              f"{theirs_s * 1e3:.1f} | {ours_s * 1e3:.1f} |")
    print(f"\n{time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
