"""How true is a device model?  Step time, per-call error and the frontier's order of plans.

Three parts, each a table:

1. **CPU, leave one model out.**  The calibration profiles measured on this CPU (kept in
   ``benchmarks/data/device-model/cpu/``; ``--profiles DIR`` for others, ``--measure`` to make
   them afresh) are each predicted by a calibration fitted on the *other* profiles only: the
   whole step (Σ forward + backward over the nodes at full shape) predicted vs measured, and the
   distribution of the per-call error.  Then the frontier's order: the frontier of a 2-device
   mesh tracked with the measured costs (a cluster of devices with no kind, i.e. this CPU), every
   plan on it simulated with the measured and with the modelled costs, and the Spearman rank
   correlation of the two sets of times.
2. **GPU, uncalibrated.**  The H100 steps measured in ``docs/measurements.md`` (the unmodified
   model, CUDA events; and the one-device plan simulated from an H100 profile) against the H100
   device model's prediction from the models' work (an untimed profile on this CPU) with
   :data:`~tensoropt.devicemodel.UNCALIBRATED_GPU`.
3. **V100 box, before and after** (``--v100``): the frontier of
   ``zoo:gpt2?layers=2&batch=8&seq_len=128`` on ``preset:v100-8-nvlink`` priced with this CPU's
   times (how it was before device models: the kinds stripped, so the guard lets them through)
   and through the V100 device model; per plan the devices used, the time, and the share of the
   simulated step a device spends computing.

    python benchmarks/device_model.py                 # parts 1 and 2
    python benchmarks/device_model.py --v100          # and part 3
    python benchmarks/device_model.py --measure       # re-profile the CPU set first (~15 min)

It reads profiles and prints; it writes nothing but the profiles ``--measure`` makes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table
from scipy.stats import spearmanr

from tensoropt.cluster import Cluster, load_cluster
from tensoropt.describe import fmt_bytes
from tensoropt.devicemodel import convert, cpu_model, device_model, step_seconds
from tensoropt.devicemodel.calibrate import CPU_MODELS, fit_with_holdout, measure_profiles
from tensoropt.devicemodel.fit import check, fit_calibration
from tensoropt.frontier import track_frontier
from tensoropt.measure import CostModel, profile
from tensoropt.modelspec import load_model
from tensoropt.planmodel.simulate import simulate

HERE = Path(__file__).resolve().parent
CPU_PROFILES = HERE / "data" / "device-model" / "cpu"
#: docs/measurements.md, "On a GPU": NVIDIA H100 80GB HBM3, float32 (cuDNN TF32 on): the
#: unmodified model's step (forward + loss + backward, CUDA events, median of 5 rounds) and the
#: one-device plan simulated from an H100 profile (in sequence), in ms
H100_MEASURED = {
    "zoo:vgg16?batch=32": ("VGG-16 b32", 27.66, 29.52),
    "zoo:gpt2?layers=6&batch=8&seq_len=512": ("GPT-2 6×768 b8 512 tokens", 54.70, 60.15),
    "zoo:wide_resnet?depth=50&batch=32": ("WRN-50-2 b32", 31.94, 44.13),
}
V100_MODEL = "zoo:gpt2?layers=2&batch=8&seq_len=128"


def _pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b


def _rank(costs: CostModel, modelled: CostModel, spec: str, cluster: Cluster) -> tuple[int, float, float]:
    """(plans, Spearman ρ of their simulated times measured vs modelled, worst |error| %)."""
    graph = load_model(spec).capture()
    fr = track_frontier(graph, costs, cluster, max_walks=100)
    measured = [simulate(p.plan, graph, costs, cluster).time_s for p in fr.points]
    predicted = [simulate(p.plan, graph, modelled, cluster).time_s for p in fr.points]
    rho = float(spearmanr(measured, predicted).statistic) if len(measured) > 2 else float("nan")
    worst = max(abs(_pct(p, m)) for p, m in zip(predicted, measured))
    return len(measured), rho, worst


def cpu_holdout(console: Console, profiles: list[CostModel], rank: bool) -> None:
    specs = [str(p.settings.get("model_spec") or p.graph_name) for p in profiles]
    t = Table(title=f"CPU ({profiles[0].device.get('name')}, {profiles[0].device.get('threads')} threads): each model "
                    "predicted by a calibration fitted on the others", title_justify="left")
    for col in ("model", "timed calls", "measured step", "predicted", "error", "in sample", "median |call err|",
                "p90 |call err|", "plans", "Spearman ρ", "worst plan err"):
        t.add_column(col, justify="left" if col == "model" else "right")
    full = fit_with_holdout(profiles, name="all")
    in_sample = dict(full.error.get("step_pct") or {})
    cluster = load_cluster("preset:v100-8-nvlink").subset(["gpu0", "gpu1"]).without_kinds()
    for i, (spec, held) in enumerate(zip(specs, profiles)):
        cal = fit_calibration([p for j, p in enumerate(profiles) if j != i], name=f"without {held.graph_name}")
        model = cpu_model(cal)
        calls = check(cal, [held])   # per-call error of the held-out model's timed calls
        measured, predicted = held.total_fp_s + held.total_bp_s, step_seconds(held, model)
        cells = ["-", "-", "-"]
        if rank:
            n, rho, worst = _rank(held, convert(held, model), spec, cluster)
            cells = [str(n), f"{rho:.3f}", f"{worst:.1f} %"]
        t.add_row(spec.removeprefix("zoo:"), str(calls["ops"]), f"{measured * 1e3:.1f} ms",
                  f"{predicted * 1e3:.1f} ms", f"{_pct(predicted, measured):+.1f} %",
                  f"{in_sample.get(held.graph_name, float('nan')):+.1f} %", f"{calls['median_abs_pct']:.0f} %",
                  f"{calls['p90_abs_pct']:.0f} %", *cells)
    console.print(t)
    classes = Table(title="the calibration fitted on all of them (what tensoropt ships for this CPU)",
                    title_justify="left")
    for col in ("class", "samples", "of peak FLOP/s", "of bandwidth", "fwd floor", "bwd floor"):
        classes.add_column(col, justify="left" if col == "class" else "right")
    for cls, fit in full.classes.items():
        classes.add_row(cls, str(fit.samples), "-" if fit.flops_fraction is None else f"{fit.flops_fraction:.1%}",
                        "-" if fit.bytes_fraction is None else f"{fit.bytes_fraction:.1%}",
                        f"{fit.fp_floor_s * 1e6:.1f} µs", f"{fit.bp_floor_s * 1e6:.1f} µs")
    console.print(classes)


def gpu_uncalibrated(console: Console) -> None:
    model = device_model("NVIDIA H100 80GB HBM3")
    t = Table(title=f"H100 SXM, uncalibrated device model vs measured (docs/measurements.md); {model.describe()}",
              title_justify="left")
    for col in ("model", "measured step (model)", "H100 profile, one-device plan", "device model", "vs measured",
                "vs H100 profile"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for spec, (label, step_ms, profiled_ms) in H100_MEASURED.items():
        costs = profile(load_model(spec).capture(), shard_degrees=(1,), timed=False)
        ms = step_seconds(costs, model) * 1e3
        t.add_row(label, f"{step_ms:.2f} ms", f"{profiled_ms:.2f} ms", f"{ms:.2f} ms", f"{_pct(ms, step_ms):+.1f} %",
                  f"{_pct(ms, profiled_ms):+.1f} %")
    console.print(t)


def v100_before_after(console: Console) -> None:
    cluster = load_cluster("preset:v100-8-nvlink")
    graph = load_model(V100_MODEL).capture()
    measured = profile(graph, shard_degrees=(1, 2, 4, 8), repeats=3)
    modelled = convert(measured, device_model("Tesla V100-SXM2-16GB"))
    for label, costs, where in (("before: this CPU's times", measured, cluster.without_kinds()),
                                ("after: V100 device model", modelled, cluster)):
        fr = track_frontier(graph, costs, where)
        t = Table(title=f"{V100_MODEL} on v100-8-nvlink, {label} ({costs.device.get('name')}): {len(fr.points)} plans",
                  title_justify="left")
        for col in ("plan", "devices", "memory / device", "time", "compute share"):
            t.add_column(col, justify="left" if col == "plan" else "right")
        for p in fr.points:
            res = simulate(p.plan, graph, costs, where)
            share = max(res.compute_s.values()) / res.time_s if res.time_s else 0.0
            t.add_row(p.plan_id, str(p.num_devices), fmt_bytes(p.memory_bytes), f"{p.time_s * 1e3:.2f} ms",
                      f"{share:.0%}")
        console.print(t)
        counts: dict[int, int] = {}
        for p in fr.points:
            counts[p.num_devices] = counts.get(p.num_devices, 0) + 1
        console.print(f"devices used: {counts}; one-device step {step_seconds(costs, device_model('V100')) * 1e3:.1f} "
                      f"ms by the V100 model" if costs is modelled else f"devices used: {counts}", highlight=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", default=str(CPU_PROFILES), help="folder of calibration profiles measured on one CPU")
    ap.add_argument("--measure", action="store_true", help="profile the CPU calibration set into --profiles first")
    ap.add_argument("--no-rank", action="store_true", help="skip the frontier-order columns (faster)")
    ap.add_argument("--no-gpu", action="store_true", help="skip the H100 comparison")
    ap.add_argument("--v100", action="store_true", help="also the v100-8-nvlink before / after frontiers")
    args = ap.parse_args(argv)
    console = Console(width=200)
    t0 = time.perf_counter()
    if args.measure:
        measure_profiles(CPU_MODELS, "cpu", repeats=3, save_to=args.profiles)
    paths = sorted(Path(args.profiles).glob("*.json"))
    if not paths:
        console.print(f"no profiles in {args.profiles}: run with --measure")
        return 2
    cpu_holdout(console, [CostModel.load(p) for p in paths], rank=not args.no_rank)
    if not args.no_gpu:
        gpu_uncalibrated(console)
    if args.v100:
        v100_before_after(console)
    console.print(f"took {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
