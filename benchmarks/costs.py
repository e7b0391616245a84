"""How true is the cost model?  Profiling time (cold / cached), sum of parts, memory-model error.

For each model: capture; profile with an empty cache (cold), then again (cached); measure real
training steps of the unmodified model (median of repeats) and compare

- Σ over nodes of the profiled forward / backward times (in sequence: each node timed inside
  whole training steps, :mod:`tensoropt.measure.sequence`) with the measured forward / backward
  and their sum ("sum of parts"; the optimizer's update, which no node's cost holds, apart), and
  the same Σ of the operators timed alone ("Σ alone");
- the memory model's whole-step peak (:func:`tensoropt.planmodel.memory.step_memory`) with the peak
  MemTracker measures, for SGD and Adam.

    python benchmarks/costs.py                                   # the README's table
    python benchmarks/costs.py --models "zoo:gpt2?layers=12" --degrees 1

It compares the cost model with measurements and prints: it must not change a profile or the
profile cache's entries (it profiles afresh where it times profiling).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from rich.console import Console
from rich.table import Table

import tensoropt
from tensoropt.cli._progress import ProgressBars
from tensoropt.describe import fmt_bytes
from tensoropt.measure import profile
from tensoropt.measure.step import measure_step
from tensoropt.planmodel import step_memory

DEFAULT_MODELS = ["zoo:wide_resnet?batch=8&image_size=112", "zoo:gpt2?layers=2&batch=2&seq_len=128",
                  "zoo:vgg16?batch=4", "zoo:unet?batch=2&image_size=128", "zoo:transformer?batch=8&seq_len=64"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--degrees", default="1,2,4,8", help="shard degrees profiled (default 1,2,4,8)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5, help="timed training steps (median)")
    ap.add_argument("--cache", help="reuse this profile cache folder (cold profiling is then not timed)")
    args = ap.parse_args(argv)
    degrees = tuple(int(k) for k in args.degrees.split(","))
    console = Console(width=200)
    times = Table(title=f"profiling and sum of parts on {torch.get_num_threads()} CPU threads "
                        f"(degrees {args.degrees}, repeats {args.repeats})", title_justify="left")
    for col in ("model", "ops", "profile cold", "profile cached", "Σ fp", "step fp", "fp err", "Σ bp", "step bp",
                "bp err", "Σ fp+bp", "step fp+bp", "err", "optimizer", "Σ alone", "alone err"):
        times.add_column(col, justify="left" if col == "model" else "right")
    mem = Table(title="memory model vs MemTracker (whole-step peak, one device)", title_justify="left")
    for col in ("model", "optimizer", "estimated", "measured", "error", "estimated peak at"):
        mem.add_column(col, justify="left" if col in ("model", "optimizer", "estimated peak at") else "right")

    for spec in args.models:
        loaded = tensoropt.load_model(spec)
        graph = loaded.capture()
        with tempfile.TemporaryDirectory() as tmp:
            cache = args.cache or tmp
            t0 = time.perf_counter()
            with ProgressBars(console) as progress:
                costs = profile(graph, shard_degrees=degrees, repeats=args.repeats, cache=cache, progress=progress)
            cold = time.perf_counter() - t0 if not args.cache else float("nan")
            t0 = time.perf_counter()
            profile(graph, shard_degrees=degrees, repeats=args.repeats, cache=cache)
            cached = time.perf_counter() - t0
        step = measure_step(loaded.model, loaded.example_inputs, optimizer="sgd", repeats=args.steps, warmup=1,
                            memory=True)
        fp, bp = costs.total_fp_s, costs.total_bp_s
        alone = costs.settings["in_sequence"].get("isolated_sum_s", fp + bp)
        # the profile has forward and backward only: the optimizer's update (and zero_grad) apart
        passes = step.forward_s + step.backward_s
        times.add_row(spec, str(len(graph.ops)), f"{cold:.1f} s", f"{cached:.1f} s",
                      _ms(fp), _ms(step.forward_s), _err(fp, step.forward_s),
                      _ms(bp), _ms(step.backward_s), _err(bp, step.backward_s),
                      _ms(fp + bp), _ms(passes), _err(fp + bp, passes), _ms(step.time_s - passes),
                      _ms(alone), _err(alone, passes))
        for optimizer in ("sgd", "adam"):
            real = step if optimizer == "sgd" else measure_step(loaded.model, loaded.example_inputs,
                                                                optimizer=optimizer, repeats=1, warmup=1)
            est = step_memory(graph, costs, optimizer=optimizer)["dev0"]
            mem.add_row(spec, optimizer, fmt_bytes(est.peak), fmt_bytes(real.peak_bytes),
                        _err(est.peak, real.peak_bytes), f"{est.peak_phase} ({est.peak_at})")
        del loaded, graph, costs
    console.print(times)
    console.print(mem)
    console.print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


def _err(est: float, real: float) -> str:
    return f"{(est - real) / real:+.1%}" if real else "-"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
