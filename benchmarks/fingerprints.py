"""One model, one graph, in every process: every zoo model (tiny) and every model of the
real-model suite captured in fresh processes under different hash seeds, their fingerprints
compared (the full run of tests/capture/test_canonical.py's covering subset).

    python benchmarks/fingerprints.py [--seeds 0,1] [--ci] [--nodes]

Each seed runs ``tests/capture/fingerprints.py --all`` (``--ci``: its covering subset) in its own
process with ``PYTHONHASHSEED`` set, all at once.  Prints one row per model: its capture seconds
in each process and whether the fingerprints (``--nodes``: also every node's name and op) agree;
then the models that differ or failed.  Exit status 1 when any model differs or fails.  With
torchvision's model definitions installed (see examples/real_models.py) the torchvision models
are captured too.

It compares what the helper prints: it must not capture anything itself.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HELPER = Path(__file__).resolve().parents[1] / "tests" / "capture" / "fingerprints.py"


def run(seeds: list[int], which: str, nodes: bool) -> dict[int, dict[str, dict]]:
    """``{seed: {model name: row}}`` of the helper run once per seed, in parallel."""
    args = [sys.executable, str(HELPER), which] + (["--nodes"] if nodes else [])
    procs = {s: subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, PYTHONHASHSEED=str(s))) for s in seeds}
    out = {}
    for s, p in procs.items():
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            sys.exit(f"the helper failed under PYTHONHASHSEED={s}:\n{stderr[-3000:]}")
        out[s] = {row["name"]: row for row in map(json.loads, stdout.splitlines())}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0,1", help="comma-separated hash seeds, one process each (default 0,1)")
    ap.add_argument("--ci", action="store_true", help="only the covering subset tests/capture runs")
    ap.add_argument("--nodes", action="store_true", help="compare every node's name and op too")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    if len(seeds) < 2:
        ap.error("--seeds needs at least two hash seeds to compare")
    t0 = time.perf_counter()
    runs = run(seeds, "--ci" if a.ci else "--all", a.nodes)
    first = runs[seeds[0]]
    bad: list[str] = []
    print("| model | " + " | ".join(f"seed {s} s" for s in seeds) + " | same |")
    print("|---|" + "---:|" * len(seeds) + "---|")
    for name, row in first.items():
        rows = [runs[s].get(name, {"error": "not captured in this process"}) for s in seeds]
        errors = [r["error"].splitlines()[-1] for r in rows if "error" in r]
        keys = ("fingerprint", "nodes") if a.nodes else ("fingerprint",)
        same = not errors and all(all(r.get(k) == row.get(k) for k in keys) for r in rows)
        verdict = "yes" if same else (f"error: {errors[0]}" if errors else "**no**")
        if not same:
            bad.append(f"{name}: {verdict}")
        print(f"| {name} | " + " | ".join(f"{r.get('seconds', 0):.1f}" for r in rows) + f" | {verdict} |")
    print(f"\n{len(first) - len(bad)} of {len(first)} models give one fingerprint under hash seeds "
          f"{', '.join(map(str, seeds))} ({time.perf_counter() - t0:.0f} s)")
    for line in bad:
        print(f"- {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
