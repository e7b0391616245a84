"""Does the frontier's own search dominate every baseline placer?

For each case, :func:`tensoropt.explore` runs every baseline placer (``dp``, Baechi's, FastT's,
NetSplit's, Pesto, ``zero1`` … ``fsdp+ac``) and the frontier in one simulator; the frontier a
user sees joins the baselines' plans where no point of its own beats them
(:meth:`~tensoropt.frontier.Frontier.including`), so every baseline is weakly dominated *there*
by construction.  The question here is the search's plan space: each baseline's simulated
(per-device peak, step) is held against the frontier **of the search alone**
(``track_frontier(..., seed_placers=())``, the same graph, costs and cluster).  A row that the
search does not dominate names what the search's plans cannot do (or a search that misses
them), which the docs must then explain.

    python benchmarks/dominance.py [--cases gpt2-12,wrn,wrn-8,default,amoebanet] [--time-limit 10]

Times come from the clusters' device models (an untimed profile: memory and work), as the
planning benchmark's; the MILP placers get ``--time-limit`` seconds each.  One table row per
baseline: its peak and step, the search point that dominates it (or the nearest: the fastest
search point within its memory, and by how much slower), and the dominating point of the
joined frontier with its source.
"""

from __future__ import annotations

import argparse
import sys
import time

import tensoropt

CASES = {
    "gpt2-12": ("zoo:gpt2?layers=12", "preset:v100-8-nvlink", None),
    "wrn": ("zoo:wide_resnet", "preset:titan-rtx-5", ("gpu0", "gpu1", "gpu2")),
    "wrn-8": ("zoo:wide_resnet", "preset:v100-8-nvlink", None),
    "default": ("zoo:gpt2?layers=6&hidden=256&heads=4&vocab=8192&batch=8&seq_len=128", "preset:v100-8-nvlink", None),
    "amoebanet": ("zoo:amoebanet_d", "preset:v100-8-nvlink", None),
    "gpt2-2x256": ("zoo:gpt2?layers=2&hidden=256&heads=4&vocab=8192&batch=4&seq_len=128", "preset:a100-4-nvlink",
                   ("gpu0", "gpu1")),
}


def _point(p: tensoropt.FrontierPoint) -> str:
    return f"{p.plan_id} ({p.memory_bytes / 2**20:.1f}, {p.time_s * 1e3:.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="gpt2-12,wrn,wrn-8,default")
    ap.add_argument("--time-limit", type=float, default=10.0, help="each MILP placer's solver limit (s)")
    args = ap.parse_args(argv)
    print("| case | baseline | devices | peak MiB | step ms | search point dominating (MiB, ms) | nearest search point "
          "(MiB, ms) | joined frontier's point |")
    print("|---|---|---:|---:|---:|---|---|---|")
    totals = {"rows": 0, "by_search": 0}
    for case in args.cases.split(","):
        spec, cl, devices = CASES[case]
        t0 = time.perf_counter()
        result = tensoropt.explore(tensoropt.Request(spec, cl, devices=devices, repeats=1, algos=None,
                                                     time_limit=args.time_limit, costs_from="model"))
        search = tensoropt.track_frontier(result.graph, result.costs, result.cluster,
                                          devices=list(devices) if devices else None, seed_placers=())
        joined = result.frontier
        assert joined is not None
        for row in result.rows:
            if row.algo.startswith("frontier"):
                continue
            if row.error is not None or row.peak_memory_bytes is None or row.time_s is None:
                print(f"| {case} | {row.algo} | – | – | – | no plan: {(row.error or '')[:60]} | | |")
                continue
            totals["rows"] += 1
            mem, step = row.peak_memory_bytes, row.time_s
            dom = search.dominating(mem, step)
            within = [p for p in search.points if p.memory_bytes <= mem]
            near = min(within, key=lambda p: p.time_s) if within else min(search.points, key=lambda p: p.memory_bytes)
            near_s = (f"{near.plan_id}: {near.memory_bytes / 2**20:.1f}, {near.time_s * 1e3:.3f} "
                      f"({(near.time_s / step - 1) * 100:+.1f} % time"
                      f"{'' if within else f', {(near.memory_bytes / mem - 1) * 100:+.1f} % memory'})")
            jp = joined.point(row.dominated_by) if row.dominated_by else None
            joined_s = f"{jp.plan_id} ({jp.source})" if jp is not None else "none"
            totals["by_search"] += dom is not None
            print(f"| {case} | {row.algo} | {len(row.devices)} | {mem / 2**20:.1f} | {step * 1e3:.3f} | "
                  f"{_point(dom) if dom is not None else '**no**'} | {'' if dom is not None else near_s} | "
                  f"{joined_s} |", flush=True)
        print(f"<!-- {case}: {spec} on {cl}{' ' + ','.join(devices) if devices else ''}, "
              f"{len(search)} search points, {time.perf_counter() - t0:.0f} s -->", flush=True)
    print(f"\n{totals['by_search']} of {totals['rows']} baseline plans dominated by a point of the search alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
