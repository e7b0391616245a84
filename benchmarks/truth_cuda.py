"""How true are the estimates on one GPU?  Single-device plans measured with CUDA timing.

The GPU half of the truth benchmark (``benchmarks/truth.py`` is the multi-process half, on gloo):
on a machine with one CUDA GPU the cluster is what NVML finds (``tensoropt.detect_cluster``), the
operators are profiled on the GPU (CUDA events, in sequence, and alone for the "alone" column),
frontier tracking runs on that one device — where the frontier is the trade of recomputation
(activations dropped and recomputed in backward) against time — and for each model the plans

- ``one device``: every operator on the GPU, nothing recomputed (what m-ETF places on one device);
- ``frontier min-time``, ``frontier mid`` (the point whose memory is nearest the middle of the
  frontier's range), ``frontier min-memory``;
- ``blocks recomputed``: the one-device plan with every operator of a repeated block recomputed
  (one segment per block) — and beside it ``model, blocks checkpointed``: the unmodified model
  with PyTorch's ``apply_activation_checkpointing`` around every block, estimated as that plan;

run through the executor (``apply_plan``, the rewritten ``torch.fx`` graph, every plan device
mapped to ``cuda:0``) and are measured with :func:`tensoropt.measure.step.measure_step`: median over
``--steps`` steps (after ``--warmup``) of forward + loss + backward, timed with CUDA events (the
SGD update apart: no estimate has a cost for it), the median of ``--rounds`` rounds (every plan once
per round, in turn); peak memory from the CUDA caching allocator (``max_memory_allocated`` during
one step, less what the process held before it, plus the step's own parameters, gradients and
inputs).  The unmodified model is measured the same way (the "model" row: what the executor's
rewrite costs beside it).  error = (estimate − measured) / measured.

    python benchmarks/truth_cuda.py [--models SPEC,…] [--steps 20] [--warmup 5] [--rounds 3]
                                    [--json out/truth_cuda.json] [--profiles DIR]
    python benchmarks/truth_cuda.py --device cpu --models "zoo:vgg16?tiny=1"     # a dry run without a GPU

It measures and compares: it must not feed a measurement back into the estimates it checks.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import tempfile
import time

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

import tensoropt
from tensoropt._io import write_json_atomic
from tensoropt.cluster import Cluster, Device
from tensoropt.graph import block_of
from tensoropt.measure.step import measure_step
from tensoropt.plan import NodeConfig, Plan

# steps of tens to hundreds of milliseconds on an H100 in float32: long enough that the GPU, not
# the Python that launches its kernels, sets the pace (the zoo's default sizes, NetSplit's batch)
DEFAULT_MODELS = ("zoo:vgg16?batch=32,"
                  "zoo:gpt2?layers=6&batch=8&seq_len=512,"
                  "zoo:wide_resnet?depth=50&batch=32")
MIB = 2 ** 20


def err(est: float | None, meas: float | None) -> str:
    if est is None or not meas:
        return "—"
    return f"{(est - meas) / meas * 100:+.1f} %"


def one_device_cluster(device: torch.device) -> Cluster:
    """NVML's view of this machine restricted to the GPU ``device`` is (``gpu{index}``), or, for a dry
    run on the CPU, one device with this machine's memory."""
    if device.type == "cuda":
        cluster = tensoropt.detect_cluster()
        return cluster.subset([f"gpu{device.index or 0}"])
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Cluster("cpu", [Device("cpu0", mem, "cpu")], {}, source="this machine")


def middle(points):
    lo, hi = points.min_memory().memory_bytes, points.min_time().memory_bytes
    return min(points, key=lambda p: (abs(p.memory_bytes - (lo + hi) / 2), p.time_s))


def blocks_recomputed(plan, graph):
    """``plan`` with every operator of a repeated block (:func:`tensoropt.graph.block_of`)
    recomputed: one segment per block, what a checkpoint around every block runs."""
    configs = {n: NodeConfig(c.devices, c.layout, block_of(graph.nodes[n].module_path) is not None, c.shard)
               for n, c in plan.configs.items()}
    return Plan(configs, graph_fingerprint=plan.graph_fingerprint, graph_name=plan.graph_name,
                batch_size=plan.batch_size, cluster_name=plan.cluster_name,
                cluster_fingerprint=plan.cluster_fingerprint, algorithm="blocks recomputed", order=plan.order)


def measure(model, inputs, device, steps, warmup, memory):
    m = measure_step(model, inputs, device=str(device), repeats=steps, warmup=warmup, memory=memory)
    return m.forward_s + m.backward_s, (m.peak_bytes if memory else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--device", default="cuda", help="cuda (default; cuda:N for another GPU) or cpu for a dry run")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="profile repeats")
    ap.add_argument("--json", default="out/truth_cuda.json")
    ap.add_argument("--profiles", help="also save each model's profile (JSON) in this folder, to explore offline")
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here (torch.cuda.is_available() is False): run on a GPU machine, "
                         "or --device cpu for a dry run")
    t0 = time.time()
    cluster = one_device_cluster(device)
    (name,) = cluster.names
    dmap = {name: str(device)}
    print(f"cluster: {cluster.devices[0]} ({cluster.source}); torch {torch.__version__}", flush=True)

    rows, cases = [], []
    for spec in a.models.split(","):
        torch.manual_seed(0)
        lm = tensoropt.load_model(spec)
        graph = lm.capture()
        with tempfile.TemporaryDirectory() as fresh:      # measured now, not taken from an older cache
            alone = tensoropt.profile(graph, device=str(device), shard_degrees=(1,), repeats=a.repeats,
                                      cache=fresh, in_sequence=False)
            costs = tensoropt.profile(graph, device=str(device), shard_degrees=(1,), repeats=a.repeats, cache=fresh)
        if a.profiles:
            os.makedirs(a.profiles, exist_ok=True)
            costs.save(os.path.join(a.profiles, f"{graph.name}-{len(cases)}.profile.json"))
            graph.save(os.path.join(a.profiles, f"{graph.name}-{len(cases)}.graph.json"))
        fr = tensoropt.track_frontier(graph, costs, cluster)
        one_device = tensoropt.place(graph, costs, cluster, "m-etf")
        plans = {"one device": one_device,
                 "frontier min-time": fr.min_time().plan, "frontier mid": middle(fr).plan,
                 "frontier min-memory": fr.min_memory().plan}
        blocks = sorted({b for n in graph.ops if (b := block_of(n.module_path)) is not None})
        if blocks:
            plans["blocks recomputed"] = blocks_recomputed(one_device, graph)
        print(f"{spec}: {len(graph.ops)} ops, profiled in {costs.profile_s:.0f} s, frontier of {len(fr)} points "
              f"({time.time() - t0:.0f} s)", flush=True)
        case = {"spec": spec, "model": lm.model, "inputs": lm.example_inputs, "graph": graph, "plans": plans}
        cases.append(case)
        seq = costs.settings["in_sequence"]
        for kind, plan in plans.items():
            sim = tensoropt.simulate(plan, graph, costs, cluster)
            front = plan.estimate("frontier")
            rows.append({"model": spec, "plan": kind, "case": len(cases) - 1,
                         "recomputed": sum(c.recompute for c in plan.configs.values()),
                         "simulated_s": sim.time_s,
                         "simulated_alone_s": tensoropt.simulate(plan, graph, alone, cluster).time_s,
                         "frontier_s": front.time_s if front else None,
                         "simulated_peak_bytes": sim.max_memory_bytes,
                         "frontier_peak_bytes": front.max_memory_bytes if front else None,
                         "profile_step_s": seq.get("step_s"), "round_s": []})
        one = rows[-len(plans)]     # the unmodified model is estimated as the one-device plan
        rows.append({**one, "plan": "model", "recomputed": 0, "frontier_s": None, "frontier_peak_bytes": None,
                     "round_s": []})
        case["blocks"] = blocks
        if blocks:   # PyTorch's own recipe: a checkpoint around every block, beside the plan that recomputes them
            ckpt = next(r for r in rows[-len(plans) - 1:] if r["plan"] == "blocks recomputed")
            rows.append({**ckpt, "plan": "model, blocks checkpointed", "frontier_s": None,
                         "frontier_peak_bytes": None, "round_s": []})

    # every plan once per round, in turn: a slow spell spreads over all plans
    for rnd in range(a.rounds):
        for row in rows:
            case = cases[row["case"]]
            model = copy.deepcopy(case["model"])
            if row["plan"] == "model, blocks checkpointed":
                wrap = {model.get_submodule(b) for b in case["blocks"]}
                apply_activation_checkpointing(model, check_fn=lambda m, wrap=wrap: m in wrap)
            elif row["plan"] != "model":
                model = tensoropt.apply_plan(model, case["inputs"], case["plans"][row["plan"]], device_map=dmap,
                                             graph=case["graph"])
            step_s, peak = measure(model, case["inputs"], device, a.steps, a.warmup, memory=rnd == 0)
            row["round_s"].append(step_s)
            if rnd == 0:
                row["measured_peak_bytes"] = peak
            del model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(f"round {rnd + 1}: {row['model']} {row['plan']}: {step_s * 1e3:.2f} ms (simulated "
                  f"{row['simulated_s'] * 1e3:.2f} ms) ({time.time() - t0:.0f} s)", flush=True)

    print()
    print("| model | plan | recomputed | measured ms (rounds) | simulated ms (err) | frontier ms (err) "
          "| alone ms (err) | measured MiB | simulated MiB (err) | frontier MiB (err) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        r["measured_s"] = meas = statistics.median(r["round_s"])
        f_s, f_m, mm = r["frontier_s"], r["frontier_peak_bytes"], r["measured_peak_bytes"]
        lo, hi = min(r["round_s"]), max(r["round_s"])
        print(f"| {r['model']} | {r['plan']} | {r['recomputed']} | {meas * 1e3:.2f} ({lo * 1e3:.2f}–{hi * 1e3:.2f}) | "
              f"{r['simulated_s'] * 1e3:.2f} ({err(r['simulated_s'], meas)}) | "
              + (f"{f_s * 1e3:.2f} ({err(f_s, meas)})" if f_s else "—") + " | "
              f"{r['simulated_alone_s'] * 1e3:.2f} ({err(r['simulated_alone_s'], meas)}) | "
              f"{mm / MIB:.1f} | {r['simulated_peak_bytes'] / MIB:.1f} ({err(r['simulated_peak_bytes'], mm)}) | "
              + (f"{f_m / MIB:.1f} ({err(f_m, mm)})" if f_m else "—") + " |")
    planned = [r for r in rows if r["plan"] != "model"]
    within = sum(abs(r["simulated_s"] - r["measured_s"]) <= 0.1 * r["measured_s"] for r in planned)
    mem = sum(abs(r["simulated_peak_bytes"] - r["measured_peak_bytes"]) <= 0.1 * r["measured_peak_bytes"]
              for r in planned)
    print(f"\nplans: simulated time within ±10 % of the measured median {within} of {len(planned)}; "
          f"simulated memory within ±10 % {mem} of {len(planned)}")
    for r in rows:
        r.pop("case")
    write_json_atomic(a.json, {"device": str(device), "cluster": cluster.to_dict(), "torch": torch.__version__,
                               "rows": rows})
    print(f"wrote {a.json}; {time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
