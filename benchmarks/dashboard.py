"""How long the dashboard's default takes to show its frontier on a cold machine.

Runs the page's work (:func:`tensoropt.dashboard.pipeline.run_request` for the default request: the README's
model on its preset cluster) ``--runs`` times, each with an empty profile cache and an empty
result store, and prints the median seconds until the frontier is ready (what the page draws
first) and until the baselines are done too.  The server start and the page load add a second
or two on top.

    python benchmarks/dashboard.py [--runs 3] [--repeats 3]

It times the page's work (:func:`~tensoropt.dashboard.pipeline.run_request`) only: it must not
start a server nor touch the user's caches (every run has fresh temporary ones).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from tensoropt.dashboard.pipeline import Request, ResultStore, run_request


def _cold_run(repeats: int) -> tuple[float, float]:
    """Seconds until the default request's frontier is ready and until it is all done, with an
    empty profile cache and an empty result store."""
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as results:
        os.environ["TENSOROPT_CACHE_DIR"] = cache    # cold: nothing measured before
        t0 = time.perf_counter()
        at: list[float] = []
        run_request(Request(repeats=repeats), ResultStore(results),
                    on_frontier=lambda key: at.append(time.perf_counter() - t0))
        return at[0], time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="profiling repeats (the app's default: 3)")
    args = ap.parse_args()
    ready, done = [], []
    for _ in range(args.runs):
        frontier_s, all_s = _cold_run(args.repeats)
        ready.append(frontier_s)
        done.append(all_s)
    req = Request(repeats=args.repeats)
    print(f"{req.model} on {req.cluster}, profiling repeats {args.repeats}, {args.runs} cold runs, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"frontier ready: median {statistics.median(ready):.1f} s (min {min(ready):.1f}, max {max(ready):.1f})")
    print(f"baselines done: median {statistics.median(done):.1f} s (min {min(done):.1f}, max {max(done):.1f})")


if __name__ == "__main__":
    main()
