"""``tensoropt bench-links``: time real transfers between devices, fit a link per pair, print the
fits and write a cluster.

It owns the command's options and tables; the measuring and fitting are
:func:`tensoropt.cluster.bench.bench_links`' (it must not time or fit anything itself).
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..cluster.bench import BenchError, BenchResult, bench_links
from ..cluster.units import fmt_size, parse_size
from ..errors import ClusterSpecError
from ._common import save_output
from ._progress import ProgressBars


def _size(text: str) -> int:
    try:
        return parse_size(text, "size")
    except ClusterSpecError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("size: ")) from None


def _sizes(min_size: int, max_size: int) -> list[int]:
    """``min_size``, ×4, ×4 … up to ``max_size`` (included even when it is not on the ladder)."""
    out, s = [], min_size
    while s < max_size:
        out.append(s)
        s *= 4
    out.append(max_size)
    return out


def _measure(args: argparse.Namespace, sizes: list[int], console: Console) -> BenchResult:
    """:func:`bench_links` with a live bar (drawn only on a terminal)."""
    with ProgressBars(console) as progress:
        return bench_links(backend=args.backend, sizes=sizes, repeats=args.repeats, warmup=args.warmup,
                           world_size=args.world_size, devices=args.gpus, timeout_s=args.timeout,
                           busy_s=args.busy_ms / 1e3, progress=progress)


def _print_fits(result: BenchResult, sizes: list[int], repeats: int, console: Console) -> None:
    """One row per ordered pair: latency, bandwidth, duplex, R², points, max error."""
    t = Table(title=f"links measured on {escape(result.host)} ({result.backend}, {len(sizes)} sizes "
                    f"{fmt_size(sizes[0])} … {fmt_size(sizes[-1])}, median of {repeats})",
              title_justify="left")
    for col in ("src", "dst", "latency", "bandwidth", "duplex", "R²", "points", "max error"):
        t.add_column(col, justify="left" if col in ("src", "dst") else "right")
    for (src, dst), f in result.fits.items():
        t.add_row(src, dst, f"{f.latency_s * 1e6:.1f} µs", f"{f.bandwidth_Bps / 1e9:.3f} GB/s",
                  f"{f.duplex:.2f}" if result.exchange else "1 (not measured)", f"{f.r2:.4f}",
                  str(f.n), f"{result.max_rel_error((src, dst)):.0%}")
    console.print(t)


def _print_samples(result: BenchResult, console: Console) -> None:
    """``--samples``: the median one-way time per size and pair, the fit in brackets."""
    s = Table(title="median one-way time per size (fit in brackets)", title_justify="left")
    s.add_column("size", justify="right")
    for src, dst in result.fits:
        s.add_column(f"{src} → {dst}", justify="right")
    for size in result.sizes:
        s.add_row(fmt_size(size), *(f"{result.samples[p][size] * 1e3:.3f} ms "
                                    f"({result.fits[p].time(size) * 1e3:.3f})" for p in result.fits))
    console.print(s)


def _print_exchange(result: BenchResult, console: Console) -> None:
    """``--samples`` with an exchange: one column per exchanged pair (both orders share one
    exchange), brackets: the src → dst fit one way / both ways."""
    order = {d: i for i, d in enumerate(result.devices)}
    xpairs = [p for p in result.exchange if order[p[0]] < order[p[1]]]
    x = Table(title="median simultaneous-exchange time per size, the same bytes both ways at once "
                    "\\[fit one way / fit both ways (with duplex)]", title_justify="left")
    x.add_column("size", justify="right")
    for src, dst in xpairs:
        x.add_column(f"{src} ⇄ {dst}", justify="right")
    for size in result.exchange_sizes:
        x.add_row(fmt_size(size), *(f"{result.exchange[p][size] * 1e3:.3f} ms "
                                    f"\\[{result.fits[p].time(size) * 1e3:.3f} / "
                                    f"{result.fits[p].time_both_ways(size) * 1e3:.3f}]" for p in xpairs))
    console.print(x)


def _print_notes(result: BenchResult, console: Console) -> None:
    """What duplex and max error mean, and how the links were measured."""
    if result.exchange:
        console.print("duplex: the fraction of the one-way bandwidth each direction keeps when both ranks send "
                      "at once, from a simultaneous exchange at "
                      f"{', '.join(fmt_size(s) for s in result.exchange_sizes)}: Σ bytes / bandwidth ÷ "
                      "Σ (exchange time − latency), clamped to ≤ 1 (1 = full duplex)")
    else:
        console.print("duplex: not measured on the CUDA backend (GPU copy engines are full duplex); written as 1")
    console.print(f"{escape(result.method)}; {len(result.fits)} ordered pairs measured in {result.elapsed_s:.1f} s "
                  f"(torch {result.extra.get('torch', '?')}).  max error: the largest |fit − median| / median "
                  "over the sizes")


def _cmd_bench_links(args: argparse.Namespace, console: Console) -> int:
    if args.min_size > args.max_size:
        raise BenchError(f"--min-size {fmt_size(args.min_size)} is larger than --max-size {fmt_size(args.max_size)}")
    if args.min_size == args.max_size:
        raise BenchError("a line needs at least two sizes: make --min-size smaller than --max-size")
    sizes = _sizes(args.min_size, args.max_size)
    result = _measure(args, sizes, console)
    _print_fits(result, sizes, args.repeats, console)
    if args.samples:
        _print_samples(result, console)
        if result.exchange:
            _print_exchange(result, console)
    _print_notes(result, console)
    if args.output:
        save_output(console, result.cluster(name=args.name), args.output)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench-links", help="measure the links between devices and write a cluster YAML",
                       description="Time point-to-point transfers for every ordered pair of devices over a "
                                   "sweep of sizes (powers of 4 from --min-size to --max-size), fit "
                                   "time = latency + bytes / bandwidth per pair by least squares, and "
                                   "print / save the result.  With two or more GPUs: CUDA device-to-device "
                                   "copies; otherwise --world-size gloo processes on 127.0.0.1, which also "
                                   "time a simultaneous exchange per pair at the three largest sizes to "
                                   "measure the link's duplex (the fraction of the one-way bandwidth each "
                                   "direction keeps when both carry traffic).")
    p.add_argument("-o", "--output", metavar="CLUSTER_YAML", help="write the measured cluster as YAML")
    p.add_argument("--name", help="cluster name in the YAML (default bench-BACKEND-HOST)")
    p.add_argument("--backend", choices=("auto", "gloo", "cuda"), default="auto",
                   help="cuda: copies between GPUs; gloo: processes on this host; auto (default): cuda when "
                        "torch sees ≥ 2 GPUs")
    p.add_argument("--world-size", type=int, default=2, help="gloo processes (default 2)")
    p.add_argument("--gpus", nargs="+", metavar="GPU", help="CUDA only: which GPUs (indices; default all)")
    p.add_argument("--min-size", type=_size, default=4 << 10, metavar="SIZE", help="smallest transfer (default 4KiB)")
    p.add_argument("--max-size", type=_size, default=64 << 20, metavar="SIZE",
                   help="largest transfer (default 64MiB)")
    p.add_argument("--repeats", type=int, default=10, help="timed transfers per size (median; default 10)")
    p.add_argument("--busy-ms", type=float, default=0.0, metavar="MS",
                   help="gloo: both ranks compute MS ms before each round trip, as in a training step (the "
                        "latency then includes waking a busy rank; default 0: idle ranks)")
    p.add_argument("--warmup", type=int, default=2, help="untimed transfers first (default 2)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="gloo's timeout for one transfer; a worker silent for longer is an error (default 120)")
    p.add_argument("--samples", action="store_true", help="also print the median time per size and pair")
    p.set_defaults(func=_cmd_bench_links)
