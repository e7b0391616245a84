"""How far the frontier at the default walk budget is from the frontier a much longer search finds.

The polish (``tensoropt/frontier/polish.py``) is a local search bounded by ``max_walks`` plans
walked per mesh; on large graphs it stops before it converges, and the notes say so with what its
last round still found (a plan so much faster at the same memory). This measures what is missing:
the same command at several ``--max-walks``, each frontier against the reference — the Pareto set of
every plan all the runs found together (the longest run's, in practice) — by the time it needs at
each reference plan's memory::

    python benchmarks/polish_reach.py [--cases gpt2-12,llama3-8b] [--walks 500,2000,20000]
        [--cache-dir DIR] [--keep DIR] [--reference CSV ...]

Per run: points, seconds of tracking (the command's own "tracked in"), and over the reference's
points (memory ``m``, time ``t``): the run's fastest plan within ``m`` against ``t`` — the median,
mean and largest excess — and the least memory the run reached against the reference's.  Each run
is a fresh ``tensoropt frontier`` process; the capture and profile are read back from a cache
folder that the first run fills (``--cache-dir``: one kept between invocations, so that two versions of
the code search the same profile), so only the search differs.  ``--keep DIR`` keeps each run's CSV
(``DIR/CASE-WALKS.csv``); ``--reference`` adds other frontiers' CSVs (another version's runs) to the
reference.
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CASES = {
    "gpt2-12": ("zoo:gpt2?layers=12", "preset:v100-8-nvlink", None),
    "llama3-8b": ("zoo:llama3-8b", "preset:h100-hosts?hosts=1", "bf16"),
}


def run(case: str, walks: int, cache: Path, out: Path) -> float:
    """One ``tensoropt frontier`` at ``walks``; its CSV to ``out``; returns its tracking seconds."""
    spec, cluster, precision = CASES[case]
    argv = [sys.executable, "-m", "tensoropt.cli", "frontier", spec, "--cluster", cluster, "--cache-dir", str(cache),
            "--rows", "1", "--max-walks", str(walks), "--csv", str(out)]
    if precision:
        argv += ["--precision", precision]
    proc = subprocess.run(argv, capture_output=True, text=True, check=True)
    found = re.search(r"tracked in ([0-9.]+) s", proc.stdout)
    if found is None:
        raise SystemExit(f"{case} at {walks} walks: no 'tracked in' line in its output:\n{proc.stdout[-2000:]}")
    return float(found.group(1))


def load(path: Path) -> np.ndarray:
    """(memory bytes, seconds) of every point of a frontier CSV, memory ascending."""
    with open(path) as f:
        rows = [(float(r["memory_bytes"]), float(r["time_s"])) for r in csv.DictReader(f)]
    return np.array(sorted(rows)).reshape(-1, 2)


def pareto(points: np.ndarray) -> np.ndarray:
    """The Pareto set of (memory, time) points (both minimised), memory ascending."""
    order = np.lexsort((points[:, 1], points[:, 0]))
    keep, best = [], np.inf
    for i in order:
        if points[i, 1] < best:
            keep.append(i)
            best = points[i, 1]
    return points[keep]


def excess(front: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """For each reference point the run's fastest plan within its memory, as a fraction over the
    reference's time (reference points below the run's least memory are left out)."""
    out = []
    for m, t in ref:
        within = front[front[:, 0] <= m, 1]
        if within.size:
            out.append(within.min() / t - 1.0)
    return np.array(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="gpt2-12", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--walks", default="500,2000,20000", help="max_walks of each run (comma-separated)")
    ap.add_argument("--cache-dir", help="the runs' capture and profile cache (default: a fresh one per case)")
    ap.add_argument("--keep", help="a folder for each run's frontier CSV")
    ap.add_argument("--reference", nargs="*", default=[], help="more frontier CSVs joining the reference")
    args = ap.parse_args()
    walks = [int(w) for w in args.walks.split(",")]
    print("| case | max_walks | points | tracked s | time over the reference: median | mean | largest "
          "| least memory GiB (reference) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for case in args.cases.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            cache = Path(args.cache_dir) / case if args.cache_dir else Path(tmp) / "cache"
            keep = Path(args.keep) if args.keep else Path(tmp)
            keep.mkdir(parents=True, exist_ok=True)
            fronts, secs = {}, {}
            for w in walks:
                path = keep / f"{case}-{w}.csv"
                secs[w] = run(case, w, cache, path)
                fronts[w] = load(path)
            others = [load(Path(p)) for p in args.reference if Path(p).name.startswith(f"{case}-")]
            ref = pareto(np.concatenate(list(fronts.values()) + others))
            for w in walks:
                ex = excess(fronts[w], ref)
                print(f"| {case} | {w} | {len(fronts[w])} | {secs[w]:.2f} | {np.median(ex) * 100:.1f} % "
                      f"| {ex.mean() * 100:.1f} % | {ex.max() * 100:.1f} % "
                      f"| {fronts[w][0, 0] / 2**30:.3f} ({ref[0, 0] / 2**30:.3f}) |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
