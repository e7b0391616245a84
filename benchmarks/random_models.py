"""Do plans train right on both backends, for models no suite was tuned to?

Random small models (``examples/random_models.py``: random DAGs of the zoo's and the real-model
suite's operators — shared weights, reductions over the tokens, normalisations, attention,
branches that rejoin — their weights drawn unseeded): for each, ``dp``, ``m-etf`` and the two
ends of the frontier on two devices, each checked against the unmodified model in one process
and on 2 gloo ranks (float64, dropout on with keyed masks; the check ``tensoropt run [--backend
dist] --check`` makes).  Prints one table row per plan kind and every failure in full.

    python benchmarks/random_models.py [--models 200] [--first 0]

The CI subset is ``tests/distributed/test_random_models.py`` (four models covering every step
the generator draws, and issue 37's held-out model).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections import Counter

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "distributed"))

from random_plans import KINDS, check_models, seeds  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=200, help="how many random models (default 200)")
    ap.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    ap.add_argument("--chunk", type=int, default=25, help="models per 2-rank launch (default 25)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = []
    numbers = list(range(args.first, args.first + args.models))
    for i in range(0, len(numbers), args.chunk):
        rows += check_models(seeds(numbers[i:i + args.chunk]), timeout_s=300.0)
        print(f"  {min(i + args.chunk, len(numbers))} of {len(numbers)} models checked "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    print(f"{args.models} random models (seeds {numbers[0]}–{numbers[-1]}), {len(rows)} plans, "
          f"{time.perf_counter() - t0:.0f} s\n")
    print("| plan | models | operators split (median) | on 2 devices | one process: passed | 2 gloo ranks: passed |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in KINDS:
        mine = [r for r in rows if r["kind"] == kind]
        splits = sorted(r["split"] for r in mine)
        print(f"| {kind} | {len(mine)} | {splits[len(splits) // 2]} | {sum(r['devices'] == 2 for r in mine)} | "
              f"{sum(r['local_passed'] for r in mine)} | {sum(r['dist_passed'] for r in mine)} |")
    bad = [r for r in rows if not (r["local_passed"] and r["dist_passed"])]
    steps = Counter(step.split("(")[0] for r in rows if r["kind"] == KINDS[0]
                    for step in r["model"].split(" → ")[1:-1])
    print("\nsteps drawn over the models: " + ", ".join(f"{k} {v}" for k, v in sorted(steps.items())))
    print(f"\n{len(bad)} plan(s) failed")
    for r in bad:
        print(f"- {r['label']} {r['kind']}: {r['model']}\n  one process: {r['local']}\n  2 ranks: {r['dist']}")
        for line in r["failures"][:5]:
            print(f"    {line}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
