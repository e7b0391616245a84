"""How fast is the frontier, and how does it grow with devices and depth?

Each case: the model captured and profiled once (untimed: memory and work), priced through the
cluster's device model and saved; then :func:`tensoropt.track_frontier` timed alone, the
median of ``--repeats`` runs, with its points, meshes and the evaluations it made.  The models
and clusters of the engine's targets (issue 38):

- ``gpt2-12 / v100-8``: GPT-2, 12 layers, batch 8 × 512 tokens, on ``preset:v100-8-nvlink``;
- ``wrn / 3 dev``: WRN-152-2 on three TITAN RTX of ``preset:titan-rtx-5``;
- ``amoebanet``: AmoebaNet-D-18 on ``preset:v100-8-nvlink``;
- ``scale``: GPT-2 at small widths (hidden 256, batch 64 × 128 tokens) on 8 … 256 H100s,
  8 per host (``preset:h100-hosts?hosts=N``), 12 / 24 / 48 layers.

    python benchmarks/planning_speed.py [--cases gpt2-12,wrn,amoebanet,scale] [--repeats 3]
                                        [--shard-min-fraction F] [--workers 1,2]

It measures the search only (capture and profile are printed apart, once per model): its wall
time and the process's CPU time (user + system, every thread, this process only: the forked
workers' time is not in it), which other work on a shared machine moves far less than the wall
time.  ``--workers``: the frontier's worker processes, each a row, run in turn within each repeat
(default: the library's default, the CPUs this process may use).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import tensoropt

CASES: dict[str, list[tuple[str, str, str | None]]] = {
    "gpt2-12": [("zoo:gpt2?layers=12", "preset:v100-8-nvlink", None)],
    "wrn": [("zoo:wide_resnet", "preset:titan-rtx-5", "gpu0,gpu1,gpu2")],
    "amoebanet": [("zoo:amoebanet_d", "preset:v100-8-nvlink", None)],
    "scale": [(f"zoo:gpt2?layers={layers}&hidden=256&heads=4&batch=64&seq_len=128",
               f"preset:h100-hosts?hosts={hosts}", None)
              for layers in (12, 24, 48) for hosts in (1, 2, 4, 8, 32)],
    "gpt2-12-64": [("zoo:gpt2?layers=12&hidden=256&heads=4&batch=64&seq_len=128", "preset:h100-hosts?hosts=8",
                    None)],
}


def priced_profile(spec: str, cluster: tensoropt.Cluster,
                   cache: Path) -> tuple[tensoropt.OpGraph, tensoropt.CostModel, float]:
    """(graph, costs priced for the cluster, seconds to capture and profile) — profiled once per spec."""
    t0 = time.perf_counter()
    graph = tensoropt.load_model(spec).capture(method="export")
    degrees = tuple(sorted({1, *(2 ** i for i in range(1, 9) if 2 ** i <= len(cluster))} | {len(cluster)}))
    costs = tensoropt.profile(graph, shard_degrees=degrees, repeats=1, timed=False, cache=True)
    return graph, tensoropt.price(costs, cluster, costs_from="model").costs, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="gpt2-12,wrn,amoebanet,scale")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--limit-s", type=float, default=600.0, help="skip repeats of a case slower than this")
    ap.add_argument("--max-walks", type=int, default=None, help="plans evaluated per mesh (default: the library's)")
    ap.add_argument("--shard-min-fraction", type=float, default=None,
                    help="offer sharding levels to nodes holding at least this fraction of the model's parameters "
                         "(default: the library's SHARD_MIN_FRACTION; 0: every node reading a parameter)")
    ap.add_argument("--workers", default=None,
                    help="comma-separated worker counts, each a row (default: the library's default)")
    args = ap.parse_args()
    worker_counts: list[int | None] = ([int(w) for w in args.workers.split(",")] if args.workers else [None])
    if args.shard_min_fraction is not None:
        from tensoropt.frontier import graph_problem
        graph_problem.SHARD_MIN_FRACTION = args.shard_min_fraction
    print("| case | model | cluster | devices | ops | profile s | workers | frontier s (median) | CPU s (median) | "
          "runs | points | meshes | min memory | min time |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            for spec, cl_spec, devices in CASES[case]:
                cluster = tensoropt.load_cluster(cl_spec)
                devs = devices.split(",") if devices else None
                graph, costs, prof_s = priced_profile(spec, cluster, Path(tmp))
                runs: dict[int | None, list[float]] = {w: [] for w in worker_counts}
                cpu: dict[int | None, list[float]] = {w: [] for w in worker_counts}
                fronts: dict[int | None, tensoropt.Frontier] = {}
                for _ in range(args.repeats):
                    for w in worker_counts:
                        t0, c0 = time.perf_counter(), time.process_time()
                        kw = {} if args.max_walks is None else {"max_walks": args.max_walks}
                        fronts[w] = tensoropt.track_frontier(graph, costs, cluster, devices=devs, workers=w, **kw)
                        runs[w].append(time.perf_counter() - t0)
                        cpu[w].append(time.process_time() - c0)
                    if max(r[-1] for r in runs.values()) > args.limit_s:
                        break
                rows = {w: fr.rows() for w, fr in fronts.items()}
                same = all(r == rows[worker_counts[0]] for r in rows.values())
                n = len(devs) if devs else len(cluster)
                for w in worker_counts:
                    fr = fronts[w]
                    print(f"| {case} | {spec} | {cl_spec} | {n} | {len(graph.ops)} | {prof_s:.1f} | "
                          f"{w if w is not None else 'default'} | {statistics.median(runs[w]):.2f} | "
                          f"{statistics.median(cpu[w]):.2f} | {', '.join(f'{r:.2f}' for r in runs[w])} | {len(fr)} | "
                          f"{len(fr.meshes)} | {fr.min_memory().memory_bytes / 2**30:.3f} GiB | "
                          f"{fr.min_time().time_s * 1e3:.2f} ms |", flush=True)
                if not same:
                    print(f"<!-- {case}: the frontiers differ between worker counts -->", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
