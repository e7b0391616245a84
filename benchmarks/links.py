"""Loopback link fit and gloo collectives against the formulas of tensoropt.cluster.collectives.

    python benchmarks/links.py [--repeats 15] [--coll-repeats 10] [--world-sizes 2,3,4]
                               [--sizes 64KiB,1MiB,16MiB]

(a) Fits the loopback link: gloo between 2 processes on 127.0.0.1, one thread each, every size
    4 KiB … 64 MiB (powers of 4), median of --repeats, half a ping-pong per one-way time; prints
    latency, bandwidth and R² per ordered pair, and the measured vs fitted time per size.
(b) Times the gloo collectives (all-reduce, all-gather, reduce-scatter, all-to-all, broadcast) on
    2, 3 and 4 processes at a few sizes (median of --coll-repeats, slowest rank) and compares each
    with the formula of tensoropt.cluster.collectives on a cluster whose every pair has the one
    loopback link fitted in (a) (both directions pooled).  error % = (predicted − measured) / measured.

This machine is shared and has 2 cores: with 3 or 4 processes they share the cores, which the
formulas (independent full-duplex links) do not model; the table says how far off that is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from rich.console import Console
from rich.table import Table

from tensoropt.cluster import Cluster, Device, collectives, fmt_size, parse_size
from tensoropt.cluster.bench import bench_links, fit_link, measure_collectives
from tensoropt.describe import fmt_bytes

FORMULAS = {
    "all_reduce": collectives.ring_allreduce_time,
    "all_gather": collectives.allgather_time,
    "reduce_scatter": collectives.reduce_scatter_time,
    "all_to_all": collectives.all_to_all_time,
    "broadcast": collectives.broadcast_time,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15, help="repeats per size of the link sweep (default 15)")
    ap.add_argument("--coll-repeats", type=int, default=10, help="repeats per collective and size (default 10)")
    ap.add_argument("--world-sizes", default="2,3,4", help="process counts for the collectives (default 2,3,4)")
    ap.add_argument("--sizes", default="64KiB,1MiB,16MiB", help="collective sizes (default 64KiB,1MiB,16MiB)")
    args = ap.parse_args()
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    sizes = [parse_size(s.strip(), "--sizes") for s in args.sizes.split(",")]
    console = Console(width=160)
    load = os.getloadavg()
    console.print(f"{os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start")

    # (a) the loopback link ------------------------------------------------------------------
    t0 = time.perf_counter()
    res = bench_links(backend="gloo", world_size=2, repeats=args.repeats, progress=True)
    t = Table(title=f"(a) loopback link fit: {res.method}; median of {res.repeats}, measured in "
                    f"{time.perf_counter() - t0:.1f} s", title_justify="left")
    for col in ("pair", "latency", "bandwidth", "R²", "points", "max error"):
        t.add_column(col, justify="left" if col == "pair" else "right")
    for (src, dst), f in res.fits.items():
        t.add_row(f"{src} → {dst}", f"{f.latency_s * 1e6:.1f} µs", f"{f.bandwidth_Bps / 1e9:.3f} GB/s",
                  f"{f.r2:.4f}", str(f.n), f"{res.max_rel_error((src, dst)):.0%}")
    pooled_x = [s for p in res.samples for s in res.samples[p]]
    pooled_y = [res.samples[p][s] for p in res.samples for s in res.samples[p]]
    loop = fit_link(pooled_x, pooled_y, pair="loopback (both directions)")
    t.add_row("pooled (used in b)", f"{loop.latency_s * 1e6:.1f} µs", f"{loop.bandwidth_Bps / 1e9:.3f} GB/s",
              f"{loop.r2:.4f}", str(loop.n), "")
    console.print(t)
    s = Table(title="(a) one-way time per size: median \\[min] of the repeats, and the pooled fit",
              title_justify="left")
    s.add_column("size", justify="right")
    for src, dst in res.samples:
        s.add_column(f"{src} → {dst}", justify="right")
    s.add_column("pooled fit", justify="right")
    s.add_column("bytes / time", justify="right")
    for size in res.sizes:
        med = statistics.median(res.samples[p][size] for p in res.samples)
        s.add_row(fmt_size(size), *(f"{res.samples[p][size] * 1e3:.3f} [{min(res.raw[p][size]) * 1e3:.3f}] ms"
                                    for p in res.samples),
                  f"{loop.time(size) * 1e3:.3f} ms", f"{size / med / 1e9:.2f} GB/s")
    console.print(s)

    # (b) collectives vs formulas --------------------------------------------------------------
    link = loop.link
    c = Table(title=f"(b) gloo collectives on 127.0.0.1 (1 thread per process, {os.cpu_count()} cores) vs "
                    f"tensoropt.cluster.collectives with every pair = the pooled loopback link; "
                    f"median of {args.coll_repeats}, slowest rank", title_justify="left")
    for col in ("collective", "n", "bytes", "torch call", "measured", "predicted", "error %", "measured / p2p"):
        c.add_column(col, justify="left" if col in ("collective", "torch call") else "right")
    notes: dict[str, str] = {}
    for n in world_sizes:
        names = [f"cpu{i}" for i in range(n)]
        cluster = Cluster(f"loopback-{n}", [Device(d, 1 << 30, kind="cpu") for d in names],
                          {(a, b): link for a in names for b in names if a != b}, source="benchmarks/links.py")
        t0 = time.perf_counter()
        samples = measure_collectives(world_size=n, sizes=sizes, repeats=args.coll_repeats, progress=True)
        console.print(f"{n} processes: {len(samples)} collective×size points in {time.perf_counter() - t0:.1f} s",
                      style="dim")
        for smp in sorted(samples, key=lambda x: (list(FORMULAS).index(x.collective), x.nbytes)):
            if not smp.supported:
                c.add_row(smp.collective, str(n), fmt_bytes(smp.nbytes), smp.api or "-", "-", "-", "-", smp.note)
                continue
            if smp.note:
                notes[smp.api] = smp.note
            pred = FORMULAS[smp.collective](cluster, names, smp.nbytes)
            c.add_row(smp.collective, str(n), fmt_bytes(smp.nbytes), smp.api, f"{smp.median_s * 1e3:.3f} ms",
                      f"{pred * 1e3:.3f} ms", f"{(pred - smp.median_s) / smp.median_s:+.0%}",
                      f"{smp.median_s / link.time(smp.nbytes):.2f}")
        c.add_section()
    console.print(c)
    for api, note in notes.items():
        console.print(f"{api}: {note}")
    load = os.getloadavg()
    console.print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")


if __name__ == "__main__":
    main()
