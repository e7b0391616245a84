"""Seed 003's comparison (NetSplit thesis, Table 6-4): every placer and the frontier on the same
models, devices and simulator.

Setting (the NetSplit thesis §6.2.1): three GPUs of ``preset:titan-rtx-5`` — GPU-0 joined by NODE links to
a PIX pair (here ``gpu0`` with ``gpu2, gpu3``); AmoebaNet-D-18 b64, WRN-152 b64, U-Net b128 and
DeepLab-V3 b48.  Each model is captured, profiled (on the machine this runs on: CPU here, a
CUDA device with ``--device cuda``) at shard degrees 1, 2 and 3, and compared with
:func:`tensoropt.compare.compare`: one row per algorithm with the simulated iteration time,
samples/s, the largest per-device peak, whether it fits 24 GiB, and the time to place.

    python benchmarks/compare.py                                  # the README's table (long on a CPU)
    python benchmarks/compare.py --profiles out/profiles          # reuse DIR/<model>.json where present
    python benchmarks/compare.py --models "zoo:unet?tiny=1" --repeats 1 --time-limit 5   # a quick look

Absolute times are those of the profiling device; the comparison between algorithms is the
point (every row uses the same costs and the same simulator).  ``--json`` keeps every row.

It owns the per-model tables and the saved profiles it reuses; the work is
:func:`tensoropt.explore`'s: it must not place, profile or simulate anything on its own.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import tensoropt
from tensoropt._io import write_json_atomic
from tensoropt.describe import fmt_bytes
from tensoropt.placers import PLACERS

SEED_003 = {"amoebanet_d": "zoo:amoebanet_d?num_layers=18&batch=64", "wide_resnet152": "zoo:wide_resnet152?batch=64",
            "unet": "zoo:unet?batch=128", "deeplab_v3": "zoo:deeplab_v3?batch=48"}
DEVICES = ["gpu0", "gpu2", "gpu3"]


def _progress(console: Console, name: str) -> tensoropt.workflow.Progress:
    """The workflow's progress as dim lines naming ``name`` (profiling: its start and end only)."""

    def report(stage: str, done: int, total: int, message: str) -> None:
        if stage != "profile" or done in (0, total):
            console.print(f"[dim]{name}: {stage}: {message}[/dim]")

    return report


def _saved_profile(name: str, graph_spec: str, args, console: Console) -> str | None:
    """The saved profile ``<profiles>/<name>.json`` when it exists and belongs to the model, else ``None``."""
    path = Path(args.profiles) / f"{name}.json" if args.profiles else None
    if path is None or not path.exists():
        return None
    try:
        tensoropt.CostModel.load(path, tensoropt.load_model(graph_spec).capture())
    except tensoropt.TensorOptError as e:
        console.print(f"[yellow]{name}: {path} not usable ({e}); profiling again[/yellow]")
        return None
    console.print(f"{name}: profile {path}")
    return str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(SEED_003.values()),
                    help="model specs (default: the NetSplit thesis's four)")
    ap.add_argument("--cluster", default="preset:titan-rtx-5")
    ap.add_argument("--devices", default=",".join(DEVICES))
    ap.add_argument("--algos", default=",".join(PLACERS), help="placers (default: all)")
    ap.add_argument("--device", default="cpu", help="profile on cpu (default) or cuda[:N]")
    ap.add_argument("--repeats", type=int, default=3, help="profiling repeats per op (median)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads while profiling (default 1: on a shared CPU, multi-threaded tiny ops "
                         "wait for descheduled threads and read milliseconds)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="each MILP's solver time limit (s)")
    ap.add_argument("--profiles", help="folder of saved profiles <name>.json: used when they match, "
                                       "written when profiled")
    ap.add_argument("--json", help="write every row of every model here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=220)
    devices = tuple(d.strip() for d in args.devices.split(","))
    algos = tuple(a.strip() for a in args.algos.split(","))

    everything = []
    for spec in args.models:
        name = tensoropt.load_model(spec).name
        key = next((k for k, v in SEED_003.items() if v == spec), name.replace("/", "_"))
        saved = _saved_profile(key, spec, args, console)
        request = tensoropt.Request(spec, args.cluster, devices=devices, algos=algos, profile=saved, device=args.device,
                                    repeats=args.repeats, time_limit=args.time_limit)
        result = tensoropt.explore(request, _progress(console, name))
        graph, costs, cluster, rows = result.graph, result.costs, result.cluster, result.rows
        prof_s = 0.0 if saved else result.seconds["measure"]
        took = result.seconds["frontier"] + result.seconds["baselines"]
        if args.profiles and not saved:
            Path(args.profiles).mkdir(parents=True, exist_ok=True)
            costs.save(Path(args.profiles) / f"{key}.json")
        load = costs.device.get("load_average")
        t = Table(title=f"{name} (batch {graph.batch_size}, {len(graph.ops)} ops) on {cluster.name} "
                        f"{','.join(devices)}; profiled on {costs.device.get('name', args.device)}"
                        f"{f' in {prof_s:.0f} s' if prof_s else ''}; compared in {took:.1f} s",
                  title_justify="left")
        for col in ("algo", "devices", "iteration time", "samples/s", "vs dp", "max peak / device", "fits",
                    "time to place", "note"):
            t.add_column(col, justify="left" if col in ("algo", "note") else "right")
        dp = next((r.time_s for r in rows if r.algo == "dp" and r.time_s), None)
        for r in rows:
            if r.error is not None:
                t.add_row(r.algo, "-", "-", "-", "-", "-", "no plan", f"{r.place_s:.2f} s", r.error[:80])
                continue
            note = next((n for n in r.notes if "gap" in n or "time limit" in n), "")
            t.add_row(r.algo, str(len(r.devices)), f"{r.time_s:.3f} s", f"{r.samples_per_s:.2f}",
                      f"{dp / r.time_s:.2f}×" if dp else "-", fmt_bytes(r.peak_memory_bytes),
                      "yes" if r.fits else "no", f"{r.place_s:.2f} s", note[:80])
        console.print(t)
        everything.append({"model": spec, "name": name, "batch": graph.batch_size, "ops": len(graph.ops),
                           "profile_s": prof_s, "load_average": load, "rows": [r.to_dict() for r in rows]})
    if args.json:
        write_json_atomic(args.json, {"host": platform.node(), "cpus": os.cpu_count(), "cluster": cluster.name,
                                      "devices": devices, "models": everything})
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
