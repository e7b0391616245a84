"""Loopback link fit (duplex included) and gloo collectives against tensoropt.cluster.collectives.

    python benchmarks/links.py [--repeats 15] [--coll-repeats 10] [--world-sizes 2,3,4]
                               [--sizes 64KiB,1MiB,16MiB]

(a) Fits the loopback link: gloo between 2 processes on 127.0.0.1, one thread each, every size
    4 KiB … 64 MiB (powers of 4), median of --repeats, half a ping-pong per one-way time; prints
    latency, bandwidth, duplex and R² per ordered pair, and the measured vs fitted time per size.
    duplex comes from a simultaneous exchange (both ranks isend + irecv the same size at once) at
    the three largest sizes: Σ bytes / bandwidth ÷ Σ (exchange time − latency)
    (tensoropt.cluster.linkfit.fit_duplex).  Both directions are pooled into one link.
(b) Times the gloo collectives (all-reduce, all-gather, reduce-scatter, all-to-all, broadcast) on
    2, 3 and 4 processes at a few sizes (median of --coll-repeats, slowest rank) and compares each
    with three predictions on a cluster whose every pair has the pooled loopback link of (a):
      - "full duplex": the generic formulas with duplex = 1 (what they predicted before duplex);
      - "generic": the generic formulas of tensoropt.cluster.collectives with the fitted duplex
        (NCCL-style rings and a pipelined chain broadcast: the model used for GPUs);
      - "gloo algorithm": what gloo really runs where it differs: reduce_scatter_tensor is a full
        all-reduce plus a copy (so: ring all-reduce time), broadcast is a binomial tree
        (ceil(log2 n) rounds of a full-message point-to-point); the rest as "generic".
    error = (predicted − measured) / measured.

This machine has 2 cores and is shared: with n = 3 or 4 processes (each with gloo's I/O threads
besides) the processes oversubscribe the 2 cores, which no formula here models (they assume every
device moves data independently); the n = 2 rows are the ones the link model should match.

It measures and prints: it must not write a cluster file (``tensoropt bench-links -o`` does).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

from rich.console import Console
from rich.table import Table

from tensoropt.cli._progress import ProgressBars
from tensoropt.cluster import Cluster, Device, LinkModel, collectives, fmt_size, parse_size
from tensoropt.cluster.bench import bench_links, measure_collectives
from tensoropt.cluster.linkfit import fit_duplex, fit_link
from tensoropt.describe import fmt_bytes

FORMULAS = {
    "all_reduce": collectives.ring_allreduce_time,
    "all_gather": collectives.allgather_time,
    "reduce_scatter": collectives.reduce_scatter_time,
    "all_to_all": collectives.all_to_all_time,
    "broadcast": collectives.broadcast_time,
}


def _gloo_broadcast(cluster: Cluster, devices: list[str], nbytes: int) -> float:
    """gloo's binomial tree: ceil(log2 n) rounds; in each, every holder sends the whole message to
    one device that has none (one direction per device: no duplex); a round ends with its slowest
    transfer, bounded here by the slowest pair (all pairs are the one loopback link in this script)."""
    n = len(devices)
    if n == 1 or nbytes == 0:
        return 0.0
    slowest = max(cluster.link(a, b).time(nbytes) for a in devices for b in devices if a != b)
    return math.ceil(math.log2(n)) * slowest


# gloo's algorithm where it differs from the generic (NCCL-style) formula
GLOO = {
    **FORMULAS,
    "reduce_scatter": collectives.ring_allreduce_time,   # ProcessGroupGloo: all_reduce of a clone + copy
    "broadcast": _gloo_broadcast,
}
GLOO_NOTES = {
    "reduce_scatter": "gloo: all-reduce + copy",
    "broadcast": "gloo: binomial tree, ceil(log2 n) × p2p",
}


def _err(pred: float, measured: float) -> str:
    return f"{(pred - measured) / measured:+.0%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=15, help="repeats per size of the link sweep (default 15)")
    ap.add_argument("--coll-repeats", type=int, default=10, help="repeats per collective and size (default 10)")
    ap.add_argument("--world-sizes", default="2,3,4", help="process counts for the collectives (default 2,3,4)")
    ap.add_argument("--sizes", default="64KiB,1MiB,16MiB", help="collective sizes (default 64KiB,1MiB,16MiB)")
    args = ap.parse_args()
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    sizes = [parse_size(s.strip(), "--sizes") for s in args.sizes.split(",")]
    console = Console(width=170)
    cores = os.cpu_count()
    load = os.getloadavg()
    console.print(f"{cores} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start")

    # (a) the loopback link ------------------------------------------------------------------
    t0 = time.perf_counter()
    with ProgressBars(Console(stderr=True)) as progress:
        res = bench_links(backend="gloo", world_size=2, repeats=args.repeats, progress=progress)
    t = Table(title=f"(a) loopback link fit: {res.method}; median of {res.repeats}, measured in "
                    f"{time.perf_counter() - t0:.1f} s", title_justify="left")
    for col in ("pair", "latency", "bandwidth", "duplex", "R²", "points", "max error"):
        t.add_column(col, justify="left" if col == "pair" else "right")
    for (src, dst), f in res.fits.items():
        t.add_row(f"{src} → {dst}", f"{f.latency_s * 1e6:.1f} µs", f"{f.bandwidth_Bps / 1e9:.3f} GB/s",
                  f"{f.duplex:.3f}", f"{f.r2:.4f}", str(f.n), f"{res.max_rel_error((src, dst)):.0%}")
    pooled_x = [s for p in res.samples for s in res.samples[p]]
    pooled_y = [res.samples[p][s] for p in res.samples for s in res.samples[p]]
    loop = fit_link(pooled_x, pooled_y, pair="loopback (both directions)")
    exchange = res.exchange[("cpu0", "cpu1")]               # one exchange serves both directions
    duplex = fit_duplex(loop.latency_s, loop.bandwidth_Bps, list(exchange), list(exchange.values()))
    link = LinkModel(loop.latency_s, loop.bandwidth_Bps, duplex)
    t.add_row("pooled (used in b)", f"{loop.latency_s * 1e6:.1f} µs", f"{loop.bandwidth_Bps / 1e9:.3f} GB/s",
              f"{duplex:.3f}", f"{loop.r2:.4f}", str(loop.n), "")
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
    x = Table(title="(a) simultaneous exchange cpu0 ⇄ cpu1 (the same bytes both ways at once, slower rank): "
                    "median \\[min], vs the pooled link one way and both ways", title_justify="left")
    for col in ("size", "exchange", "one way (fit)", "both ways (fit, duplex)", "one way / exchange"):
        x.add_column(col, justify="right")
    raw_x = res.exchange_raw[("cpu0", "cpu1")]
    for size, tx in exchange.items():
        x.add_row(fmt_size(size), f"{tx * 1e3:.3f} [{min(raw_x[size]) * 1e3:.3f}] ms",
                  f"{link.time(size) * 1e3:.3f} ms", f"{link.time_both_ways(size) * 1e3:.3f} ms",
                  f"{link.time(size) / tx:.2f}")
    console.print(x)

    # (b) collectives vs formulas --------------------------------------------------------------
    full_link = LinkModel(link.latency_s, link.bandwidth_Bps)
    c = Table(title=f"(b) gloo collectives on 127.0.0.1 (1 thread per process, {cores} cores) vs "
                    f"tensoropt.cluster.collectives, every pair = the pooled loopback link "
                    f"({link.latency_s * 1e6:.1f} µs + bytes / {link.bandwidth_Bps / 1e9:.3f} GB/s, duplex "
                    f"{link.duplex:.2f}); median of {args.coll_repeats}, slowest rank", title_justify="left")
    for col in ("collective", "n", "bytes", "measured", "full duplex", "err", "generic (duplex)", "err",
                "gloo algorithm", "err", "gloo algorithm is"):
        c.add_column(col, justify="left" if col in ("collective", "gloo algorithm is") else "right")
    notes: dict[str, str] = {}
    apis: dict[str, str] = {}
    for n in world_sizes:
        names = [f"cpu{i}" for i in range(n)]
        devices = [Device(d, 1 << 30, kind="cpu") for d in names]
        cluster = Cluster(f"loopback-{n}", devices, {}, default=link, source="benchmarks/links.py")
        full = Cluster(f"loopback-{n}-full-duplex", devices, {}, default=full_link, source="benchmarks/links.py")
        t0 = time.perf_counter()
        with ProgressBars(Console(stderr=True)) as progress:
            samples = measure_collectives(world_size=n, sizes=sizes, repeats=args.coll_repeats, progress=progress)
        console.print(f"{n} processes: {len(samples)} collective×size points in {time.perf_counter() - t0:.1f} s",
                      style="dim")
        for smp in sorted(samples, key=lambda x: (list(FORMULAS).index(x.collective), x.nbytes)):
            if not smp.supported:
                c.add_row(smp.collective, str(n), fmt_bytes(smp.nbytes), "-", "-", "", "-", "", "-", "", smp.note)
                continue
            if smp.note:
                notes[smp.api] = smp.note
            apis[smp.collective] = smp.api
            m = smp.median_s
            p_full = FORMULAS[smp.collective](full, names, smp.nbytes)
            p_gen = FORMULAS[smp.collective](cluster, names, smp.nbytes)
            p_gloo = GLOO[smp.collective](cluster, names, smp.nbytes)
            c.add_row(smp.collective, str(n), fmt_bytes(smp.nbytes), f"{m * 1e3:.3f} ms",
                      f"{p_full * 1e3:.3f} ms", _err(p_full, m), f"{p_gen * 1e3:.3f} ms", _err(p_gen, m),
                      f"{p_gloo * 1e3:.3f} ms", _err(p_gloo, m),
                      GLOO_NOTES.get(smp.collective, "as generic"))
        c.add_section()
    console.print(c)
    console.print("torch calls: " + "; ".join(f"{k}: {v}" for k, v in apis.items()))
    for api, note in notes.items():
        console.print(f"{api}: {note}")
    over = [n for n in world_sizes if n > (cores or 1)]
    if over:
        console.print(f"n = {', '.join(map(str, over))}: more processes than the {cores} cores (each also runs "
                      "gloo's I/O threads), so they take turns on the CPU; the formulas assume every device moves "
                      "data independently and do not model that — only the n ≤ cores rows test the link model.")
    load = os.getloadavg()
    console.print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")


if __name__ == "__main__":
    main()
