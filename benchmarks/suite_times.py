"""Where the test suite's time goes: a pytest JUnit XML's test times summed per group.

    python -m pytest -q -p no:cacheprovider --durations=0 --junitxml=times.xml
    python benchmarks/suite_times.py times.xml [--by dir|file] [--top 15] [--before old.xml]

Prints a markdown table, one row per test directory (``--by file``: per test file; top-level
test files are the row ``tests/*.py``): tests, seconds summed over them (setup, call and
teardown, as JUnit counts them), the largest test; with ``--before``, the same sums of another
run beside them.  Then the ``--top`` slowest tests and the run's wall time (the XML's own).
docs/testing.md's table is made with it.

It reads the XML: it must not run anything.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import PurePosixPath


def cases(path: str) -> tuple[list[tuple[str, str, float]], float]:
    """((file, test id, seconds) of every test case, the suite's wall seconds) of a JUnit XML."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    wall = sum(float(s.get("time", 0)) for s in suites)
    out = []
    for c in root.iter("testcase"):
        parts = (c.get("classname") or "").split(".")
        # classname: tests.pkg.test_mod[.Class]; the file is the part up to the test module
        mod = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        file = "/".join(parts[:mod + 1]) + ".py"
        out.append((file, f"{file}::{c.get('name')}", float(c.get("time", 0))))
    return out, wall


def group_of(file: str, by: str) -> str:
    if by == "file":
        return file
    parent = str(PurePosixPath(file).parent)
    return f"{parent}/*.py" if parent == "tests" else parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("xml", help="pytest --junitxml output")
    ap.add_argument("--by", choices=("dir", "file"), default="dir")
    ap.add_argument("--top", type=int, default=15, help="the slowest tests listed (default 15)")
    ap.add_argument("--before", help="another run's JUnit XML, summed beside")
    a = ap.parse_args(argv)
    now, wall = cases(a.xml)
    before = cases(a.before)[0] if a.before else []
    sums: dict[str, list] = defaultdict(lambda: [0, 0.0, ("", 0.0)])
    for file, test, s in now:
        row = sums[group_of(file, a.by)]
        row[0] += 1
        row[1] += s
        if s > row[2][1]:
            row[2] = (test.split("::", 1)[1], s)
    old: dict[str, float] = defaultdict(float)
    for file, _, s in before:
        old[group_of(file, a.by)] += s
    head = "| group | tests | s | " + ("s before | " if before else "") + "largest test (s) |"
    print(head + "\n" + "|---|---:|---:|" + ("---:|" if before else "") + "---|")
    for g, (n, s, (big, bs)) in sorted(sums.items(), key=lambda kv: -kv[1][1]):
        was = f"{old[g]:.0f} | " if before else ""
        print(f"| {g} | {n} | {s:.0f} | {was}{big} ({bs:.0f}) |")
    total = sum(s for _, _, s in now)
    print(f"| **all** | {len(now)} | {total:.0f} | " + (f"{sum(old.values()):.0f} | " if before else "")
          + f"wall {wall:.0f} s |")
    print(f"\nslowest {a.top}:")
    for _, test, s in sorted(now, key=lambda t: -t[2])[:a.top]:
        print(f"- {s:6.1f} s  {test}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
