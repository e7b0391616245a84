"""``tensoropt calibrate`` and ``tensoropt kinds``: device models' calibrations and catalogue.

``tensoropt calibrate [--device cuda] -o calibration.json`` profiles the calibration models on a
device (or fits saved profiles: ``--from-profile P …``), fits the device model's per-class
fractions and floors (:mod:`tensoropt.devicemodel.calibrate`), prints them with the error — in
sample and leave one model out — and writes a calibration file to share and to pass back
(``--calibration``).  ``tensoropt kinds`` lists the device kinds a device model knows, with
their datasheet figures.

It owns these commands' options and output; it must not fit or price anything itself.
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..describe import fmt_bytes
from ..devicemodel.calibrate import calibrate, calibration_models
from ..devicemodel.calibration import Calibration
from ..devicemodel.kinds import load_kinds
from ..devicemodel.opclass import OP_CLASSES
from ..errors import TensorOptError
from ..measure import CostModel
from ..request import shard_degrees
from ._common import check_repeats, print_wrote
from ._progress import ProgressBars


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f} %"


def print_calibration(console: Console, cal: Calibration) -> None:
    """Per class the achieved fractions and floors; per model the step error, in sample and held out."""
    t = Table(title=f"calibration {escape(cal.name)}: {escape(cal.source)}", title_justify="left")
    for col in ("class", "samples", "of peak FLOP/s", "of bandwidth", "forward floor", "backward floor"):
        t.add_column(col, justify="left" if col == "class" else "right")
    for cls in (*OP_CLASSES, "all"):
        fit = cal.classes.get(cls)
        if fit is None:
            t.add_row(cls, "-", "(as all)", "", "", "")
            continue
        t.add_row(cls, str(fit.samples), "-" if fit.flops_fraction is None else f"{fit.flops_fraction:.1%}",
                  "-" if fit.bytes_fraction is None else f"{fit.bytes_fraction:.1%}",
                  f"{fit.fp_floor_s * 1e6:.1f} µs", f"{fit.bp_floor_s * 1e6:.1f} µs")
    console.print(t)
    steps = dict(cal.error.get("step_pct") or {})
    held = dict(cal.error.get("holdout_step_pct") or {})
    m = Table(title="whole-step time, device model vs measured", title_justify="left")
    for col in ("model", "in sample", "held out"):
        m.add_column(col, justify="left" if col == "model" else "right")
    for name in steps:
        m.add_row(escape(name), _pct(steps.get(name)), _pct(held.get(name)))
    console.print(m)
    console.print(f"per call: median |error| {cal.error.get('median_abs_pct', 0):.1f} %, 90th percentile "
                  f"{cal.error.get('p90_abs_pct', 0):.1f} % over {cal.error.get('ops', 0)} timed calls "
                  "(in sample)", highlight=False)


def _cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    check_repeats(args)
    if not args.output:
        raise TensorOptError("tensoropt calibrate needs -o CALIBRATION_JSON (where to write the calibration)")
    if args.threads is not None:
        if args.threads < 1:
            raise TensorOptError("--threads must be ≥ 1")
        torch.set_num_threads(args.threads)   # this process only: the calibration is of the CPU at N threads
    profiles = [CostModel.load(p) for p in args.from_profile or ()]
    models = args.models or (() if profiles else calibration_models(args.device))
    if not profiles:
        console.print(f"profiling {len(models)} model(s) on {escape(args.device)}: {escape(', '.join(models))}",
                      highlight=False)
    with ProgressBars(console) as progress:
        cal, _ = calibrate(args.device, models, profiles=profiles, repeats=args.repeats, shard_degrees=args.degrees,
                           name=args.name, save_profiles=args.save_profiles, progress=progress)
    print_calibration(console, cal)
    cal.save(args.output)
    print_wrote(console, args.output)
    return 0


def _cmd_kinds(args: argparse.Namespace, console: Console) -> int:
    t = Table(title="device kinds a device model knows (datasheet figures; sources: --sources)", title_justify="left")
    for col in ("key", "name", "fp32", "tf32", "bf16", "bandwidth", "memory", "framework", "links"):
        t.add_column(col, justify="left" if col in ("key", "name", "links") else "right")
    kinds = load_kinds()
    for k in kinds.values():
        links = k.links
        link = (f"NVLink {links['nvlink_generation']} ×{links['nvlink_links']}" if "nvlink_links" in links
                else f"xGMI ×{links['xgmi_links']}" if "xgmi_links" in links else f"PCIe {links.get('pcie', '?')}")
        t.add_row(k.key, escape(k.name), *(f"{k.peak(d) / 1e12:.1f} T" for d in ("fp32", "tf32", "bf16")),
                  f"{k.memory_Bps / 1e9:.0f} GB/s", fmt_bytes(k.memory_bytes), fmt_bytes(k.framework_bytes), link)
    console.print(t)
    if args.sources:
        for k in kinds.values():
            console.print(f"[bold]{escape(k.key)}[/bold]")
            for field, src in k.sources.items():
                console.print(f"  {field}: {escape(str(src))}", highlight=False, soft_wrap=True)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("calibrate", help="measure a device and fit its device model (a calibration file)",
                       description="Profile the calibration models on a device (or fit saved profiles), fit the "
                                   "device model's per-class achieved fractions and per-call floors, print them "
                                   "with the error (in sample and leave one model out), and write the calibration.")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--models", nargs="+", metavar="MODEL",
                   help="model specs to profile (default: the calibration set for the device)")
    p.add_argument("--from-profile", nargs="+", metavar="PROFILE_JSON",
                   help="fit these saved profiles (measured on one device, with timing on) instead of profiling")
    p.add_argument("--repeats", type=int, default=3, help="profiling: timed repeats per op call (default 3)")
    p.add_argument("--degrees", type=shard_degrees, default=(1, 2),
                   help="shard degrees to profile: more shapes per op (default 1,2)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="CPU: profile with N threads (the shipped CPU calibration used 1: on a busy machine a second "
                        "thread's preemption inflates every call)")
    p.add_argument("--name", help="the calibration's name (default: the device's)")
    p.add_argument("--save-profiles", metavar="DIR", help="also keep the measured profiles in DIR")
    p.add_argument("-o", "--output", metavar="CALIBRATION_JSON", help="where to write the calibration (required)")
    p.set_defaults(func=_cmd_calibrate)

    k = sub.add_parser("kinds", help="the device kinds a device model knows, with datasheet figures")
    k.add_argument("--sources", action="store_true", help="also print where every figure comes from")
    k.set_defaults(func=_cmd_kinds)
