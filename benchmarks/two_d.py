"""Two-dimensional plans on multi-host clusters: what data parallelism across hosts (the search's
plan inside each host, :mod:`tensoropt.frontier.replicas`) adds to the frontier, and what it costs
to find.

For each case the whole workflow runs (:func:`tensoropt.workflow.explore`: capture, an untimed
profile priced by the cluster's device model, the frontier, and for the 2-D plans a second capture
and profile at one host's slice of the batch and a frontier on the first host), once with the
2-D plans and once without (``Request.replicas``); the table gives the frontier's points, how
many are 2-D, the fastest and the least-memory plan of each run, and the seconds of each.

    python benchmarks/two_d.py [--cases gpt2-12-16,gpt2-12-64]
"""

from __future__ import annotations

import argparse
import time

from tensoropt.describe import fmt_bytes
from tensoropt.frontier import REPLICAS_SOURCE
from tensoropt.workflow import Request, explore

MODEL = "zoo:gpt2?layers=12&hidden=256&heads=4&batch=64&seq_len=128"
CASES = {"gpt2-12-16": (MODEL, "preset:h100-hosts?hosts=2"), "gpt2-12-64": (MODEL, "preset:h100-hosts?hosts=8"),
         "gpt2-12-2x4eth": ("zoo:gpt2?layers=12&hidden=256&heads=4&batch=32&seq_len=128", "preset:2x4-ethernet")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="gpt2-12-16,gpt2-12-64")
    args = ap.parse_args()
    print("| case | cluster | 2-D plans | workflow s | points (2-D) | fastest: ms, devices, source | "
          "least memory: per device, ms |")
    print("|---|---|---|---:|---:|---|---|")
    for case in args.cases.split(","):
        model, cluster = CASES[case]
        for replicas in (False, True):
            t0 = time.perf_counter()
            fr = explore(Request(model, cluster, algos=(), replicas=replicas)).frontier
            took = time.perf_counter() - t0
            assert fr is not None
            two = sum(1 for p in fr if p.source == REPLICAS_SOURCE)
            fast, least = fr.min_time(), fr.min_memory()
            print(f"| {case} | `{cluster}` | {'yes' if replicas else 'no'} | {took:.1f} | {len(fr)} ({two}) | "
                  f"{fast.time_s * 1e3:.2f}, {fast.num_devices}, {fast.source} | "
                  f"{fmt_bytes(least.memory_bytes)}, {least.time_s * 1e3:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
