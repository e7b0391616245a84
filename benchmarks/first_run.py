"""How long a fresh install's first ``tensoropt frontier`` takes, against a run with numba's
kernels already compiled.

Each run is the README's terminal command — the dashboard's default model on ``preset:v100-8-nvlink``
— in a process of its own, with an empty profile cache.  ``fresh``: an empty numba cache
(``NUMBA_CACHE_DIR``), as on a freshly installed machine, where the search's kernels compile on
the first run (:mod:`tensoropt._kernels`); ``warm``: the cache that fresh run filled.  Prints the
median wall seconds of each over ``--runs`` pairs, run in turn.

    python benchmarks/first_run.py [--runs 3] [--repo PATH]

``--repo``: the checkout to run (default this one; another commit's worktree to compare).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "zoo:gpt2?layers=6&hidden=256&heads=4&vocab=8192&batch=8&seq_len=128"
CLUSTER = "preset:v100-8-nvlink"


def run_once(repo: Path, numba_cache: str) -> float:
    """Wall seconds of one ``tensoropt frontier`` of the default, with this numba cache folder."""
    with tempfile.TemporaryDirectory() as profiles:
        env = {**os.environ, "NUMBA_CACHE_DIR": numba_cache, "TENSOROPT_CACHE_DIR": profiles,
               "PYTHONPATH": str(repo)}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tensoropt.cli", "frontier", MODEL, "--cluster", CLUSTER], env=env,
                       check=True, capture_output=True, cwd=repo)
        return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args()
    fresh, warm = [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as numba_cache:
            fresh.append(run_once(args.repo, numba_cache))
            warm.append(run_once(args.repo, numba_cache))
    print("| run | runs | median s | each s |")
    print("|---|---:|---:|---|")
    for name, xs in (("fresh install (empty numba cache)", fresh), ("warm (kernels cached)", warm)):
        print(f"| {name} | {len(xs)} | {statistics.median(xs):.2f} | {', '.join(f'{x:.2f}' for x in xs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
