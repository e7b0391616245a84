"""Capture time of every zoo model at its default size (the README's table).

    python benchmarks/capture_zoo.py [--repeats 3] [--tiny] [--set KEY=VALUE ...] [NAME ...]

Prints, per model: build time (constructing the nn.Module), capture time (torch.export +
OpGraph, median over repeats), op count, parameters, and which door captured it.  Capture runs
on FakeTensors, so it needs no activation memory; building allocates the real weights (not for
the models built on the meta device: llama3-*, mixtral-8x7b, vit-h-14).  ``--set layers=2``
gives every named model that parameter (the shortened variants).

It only times the zoo's builds and captures: it must not profile, place or write anything.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import time

from rich.console import Console
from rich.table import Table

from tensoropt import capture, zoo
from tensoropt.describe import fmt_bytes, fmt_count, summarize


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="zoo names (default: all)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="the tiny variants instead of the defaults")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a zoo parameter for every named model, e.g. layers=2 (repeatable)")
    args = ap.parse_args()
    params = dict(item.split("=", 1) for item in args.set)
    names = args.names or list(zoo.ZOO)
    console = Console(width=160)
    sizes = ("tiny" if args.tiny else "default") + "".join(f", {item}" for item in args.set)
    t = Table(title=f"capture of zoo models ({sizes} sizes), median of {args.repeats}", title_justify="left")
    for col in ("model", "batch", "build s", "capture s", "ops", "parameters", "param bytes", "activations", "door"):
        t.add_column(col, justify="left" if col in ("model", "door") else "right")
    for name in names:
        entry = zoo.get(name)
        if entry.requires and importlib.util.find_spec(entry.requires) is None:
            t.add_row(name, "-", "-", "-", "-", "-", "-", "-", f"needs {entry.requires}")
            continue
        t0 = time.perf_counter()
        model, inputs = zoo.build(name, params, tiny=args.tiny)
        build_s = time.perf_counter() - t0
        times, g = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            g = capture(model, inputs, name=name)
            times.append(time.perf_counter() - t0)
        s = summarize(g)
        t.add_row(name, str(g.batch_size), f"{build_s:.2f}", f"{statistics.median(times):.2f}", str(s.ops),
                  fmt_count(s.params), fmt_bytes(s.param_bytes), fmt_bytes(s.activation_bytes), g.source)
        console.print(f"{name}: {statistics.median(times):.2f} s", style="dim")
        del model, inputs, g
        gc.collect()
    console.print(t)


if __name__ == "__main__":
    main()
