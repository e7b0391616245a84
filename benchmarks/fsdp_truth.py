"""tensoropt's ``fsdp`` and ``fsdp+ac`` rows against PyTorch's own FSDPMemTracker, on the whole Llama-3-8B.

The recipe (issue 50, "true at this scale, with no GPU"): Llama-3-8B, 8 ranks (one H100 host),
FSDP2 with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, AdamW, batch 2 × 8,192
tokens per rank (16 in all), ``fully_shard`` on every decoder layer (the last kept gathered after
forward) and on the model, with or without ``checkpoint_wrapper`` around every layer.

- **PyTorch's side**: :func:`benchmarks.fsdp_reference.fsdp_reference` (``layout="blocks"``):
  the model on the meta device, FSDP2 in a fake process group of 8 ranks, two training steps on
  fake tensors under ``FSDPMemTracker``; the second step's peak and its categories.  Each case in a
  fresh process (its own fake group, its own ``ru_maxrss``).
- **tensoropt's side**: ``zoo:llama3-8b`` captured in ``bf16-params`` on fake tensors, profiled
  untimed, priced by the H100's device model (``preset:h100-hosts?hosts=1``), the ``fsdp`` /
  ``fsdp+ac`` placers' plans (priced as FSDP2 runs them) simulated: the walked peak of the
  busiest device, its parts, and the simulated step.  The no-AC plan does not fit an 80 GB H100
  (135.6 GiB): it is placed on a twin of the cluster whose devices have 1 TiB, so that its peak is
  reported instead of refused (the devices' kind, links and speed are the H100's).

Nothing measured here feeds tensoropt's figures.  The step time is set beside torchtitan's
published run of the same recipe (Llama 3.1 8B, 8 × H100, FSDP, local batch 2 × 8,192, selective
op-level AC, eager: 5,762 tokens/s per GPU, 2.84 s a step).

    python benchmarks/fsdp_truth.py                              # Llama-3-8B (about 4 minutes here)
    python benchmarks/fsdp_truth.py --layers 2 --json out/t.json # shortened (seconds)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:   # run as a script: the repository root, for benchmarks.fsdp_reference
    sys.path.insert(0, str(ROOT))

from benchmarks.fsdp_reference import LLAMA3_8B  # noqa: E402

GIB = 2 ** 30
#: torchtitan's published Llama 3.1 8B run on 8 H100s (FSDP, local batch 2 x 8,192, selective AC)
TORCHTITAN = {"tokens_per_s_per_gpu": 5762, "step_s": 2.84, "memory_gib": 82.4}
#: (tensoropt's recipe, the reference's ``checkpoint``)
RECIPES = (("fsdp", False), ("fsdp+ac", True))
#: FSDPMemTracker's categories, grouped as tensoropt's StepMemory.parts() splits the peak
GROUPS = {"parameters": ("Sharded Param", "Unsharded Param", "Buffer"),
          "gradients": ("Sharded Grad", "Unsharded Grad"),
          "optimizer": ("OptState",),
          "activations": ("Activation", "Inputs"),
          "transient": ("Temp", "All Gather", "Reduce Scatter")}


def reference(layers: int, ranks: int, batch: int, seq_len: int, checkpoint: bool) -> dict[str, Any]:
    """PyTorch's count, in a fresh interpreter: ``fsdp_reference`` of Llama-3-8B with ``layers``
    decoder layers, the ``blocks`` units, bf16 / fp32 mixed precision."""
    code = (f"import json; from benchmarks.fsdp_reference import LLAMA3_8B, fsdp_reference, llama_config; "
            f"r = fsdp_reference(llama_config(**{{**LLAMA3_8B, 'num_hidden_layers': {layers}}}), ranks={ranks}, "
            f"batch={batch}, seq_len={seq_len}, checkpoint={checkpoint}, layout='blocks'); "
            f"print(json.dumps({{k: r[k] for k in ('peak_bytes', 'breakdown', 'wall_s', 'max_rss_bytes')}}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode != 0:
        raise RuntimeError(f"the reference failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def roomy(cluster: Any) -> Any:
    """``cluster`` with 1 TiB on every device (kind, host, speed and links the same): a plan that
    does not fit 80 GB is walked, not refused."""
    import dataclasses

    from tensoropt.cluster import Cluster

    devices = [dataclasses.replace(d, memory_bytes=2 ** 40) for d in cluster.devices]
    links = {(a, b): cluster.link(a, b) for a in cluster.names for b in cluster.names if a != b}
    return Cluster(cluster.name + "-1TiB", devices, links, source=cluster.source)


def tensoropt_side(layers: int, ranks: int, batch: int, seq_len: int) -> dict[str, Any]:
    """tensoropt's rows: capture, untimed profile, the H100's device model, the two placers'
    plans simulated (busiest device's walked peak and parts, the simulated step)."""
    import tensoropt
    from tensoropt.devicemodel import costs_source

    t0 = time.perf_counter()
    spec = f"zoo:llama3-8b?layers={layers}&batch={batch * ranks}&seq_len={seq_len}"
    graph = tensoropt.load_model(spec).capture(precision="bf16-params")
    priced = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, ranks), timed=False),
                             tensoropt.load_cluster(f"preset:h100-hosts?hosts=1&gpus={ranks}"))
    costs, cluster = priced.costs, roomy(priced.cluster)
    out: dict[str, Any] = {"spec": spec, "operators": len(graph.ops), "times_from": costs_source(costs)}
    for algo, _ in RECIPES:
        plan = tensoropt.place(graph, costs, cluster, algo)
        sim = tensoropt.simulate(plan, graph, costs, cluster)
        device = max(sim.memory, key=lambda d: sim.memory[d].peak)
        m = sim.memory[device]
        out[algo] = {"peak_bytes": m.peak, "parts": m.parts(), "peak_at": m.peak_at, "peak_phase": m.peak_phase,
                     "runtime": plan.runtime, "time_s": sim.time_s, "compute_s": sim.compute_s[device],
                     "link_busy_s": max(sim.link_s.values(), default=0.0)}
    out["wall_s"] = time.perf_counter() - t0
    return out


def table(ours: dict[str, Any], refs: dict[str, dict[str, Any]]) -> str:
    """Markdown: per recipe, each group of the peak on both sides, then the peaks and the error."""
    lines = ["| at the peak (GiB) | " + " | ".join(f"`{a}` FSDPMemTracker | `{a}` tensoropt" for a, _ in RECIPES)
             + " |", "|---|" + "---:|---:|" * len(RECIPES)]
    for group, cats in GROUPS.items():
        cells = []
        for algo, _ in RECIPES:
            theirs = sum(refs[algo]["breakdown"][c] for c in cats)
            cells += [f"{theirs / GIB:.3f}", f"{ours[algo]['parts'][group] / GIB:.3f}"]
        lines.append(f"| {group} ({' + '.join(cats)}) | " + " | ".join(cells) + " |")
    cells = []
    for algo, _ in RECIPES:
        cells += [f"**{refs[algo]['peak_bytes']:,}**", f"**{ours[algo]['peak_bytes']:,}**"]
    lines.append("| **peak, bytes** | " + " | ".join(cells) + " |")
    cells = []
    for algo, _ in RECIPES:
        err = ours[algo]["peak_bytes"] / refs[algo]["peak_bytes"] - 1
        cells += ["", f"{err * 100:+.3f} %"]
    lines.append("| error | " + " | ".join(cells) + " |")
    cells = []
    for algo, _ in RECIPES:
        cells += ["", f"{ours[algo]['peak_phase']} `{ours[algo]['peak_at']}`"]
    lines.append("| tensoropt's peak at | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def time_table(ours: dict[str, Any], ranks: int, batch: int, seq_len: int) -> str:
    """Markdown: tensoropt's simulated step of each recipe beside torchtitan's published one."""
    tokens = batch * seq_len
    lines = ["| | step (s) | tokens/s per GPU | compute per GPU (s) | busiest link (s) |", "|---|---:|---:|---:|---:|",
             f"| torchtitan, published (selective AC, 96 GB H100 at 500 W) | {TORCHTITAN['step_s']:.2f} | "
             f"{TORCHTITAN['tokens_per_s_per_gpu']:,} | | |"]
    for algo, _ in RECIPES:
        r = ours[algo]
        lines.append(f"| tensoropt `{algo}` (simulated, H100 device model) | {r['time_s']:.3f} | "
                     f"{tokens / r['time_s']:,.0f} | {r['compute_s']:.3f} | {r['link_busy_s']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=LLAMA3_8B["num_hidden_layers"],
                    help="decoder layers (default 32: the whole model)")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2, help="sequences per rank (default 2)")
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--json", help="also write both sides' figures here")
    a = ap.parse_args()
    t0 = time.perf_counter()
    ours = tensoropt_side(a.layers, a.ranks, a.batch, a.seq_len)
    print(f"tensoropt: {ours['wall_s']:.1f} s ({ours['operators']} operators; times: {ours['times_from']})",
          flush=True)
    refs = {}
    for algo, checkpoint in RECIPES:
        refs[algo] = reference(a.layers, a.ranks, a.batch, a.seq_len, checkpoint)
        print(f"FSDPMemTracker, {algo}: {refs[algo]['wall_s']:.1f} s", flush=True)
    print()
    print(f"Llama-3-8B with {a.layers} layers, {a.ranks} ranks, {a.batch} x {a.seq_len} tokens per rank, "
          "bf16 parameters / fp32 reduction, AdamW")
    print()
    print(table(ours, refs))
    print()
    print(time_table(ours, a.ranks, a.batch, a.seq_len))
    print(f"\n{time.perf_counter() - t0:.0f} s in all")
    if a.json:
        pathlib.Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(a.json).write_text(json.dumps({"tensoropt": ours, "reference": refs, "settings": vars(a)},
                                                   indent=1))


if __name__ == "__main__":
    main()
