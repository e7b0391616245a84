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

``--end-to-end``: the whole command, ``tensoropt frontier MODEL --cluster CLUSTER --precision P
--cache-dir DIR``, each run in a fresh process — first with an empty cache folder (a new one per
run), then with the folder the first run filled (the capture and the untimed profile read back) —
the median of ``--repeats`` runs of each, with the wall seconds of each stage: ``import``
(``tensoropt.cli`` and the command), ``build`` (the model, on the meta device: the zoo's builder,
transformers' import the first time), ``capture`` (torch's import where the command needs torch,
torch.export, expansion, or reading the capture cache: a cached run imports no torch), ``profile``
(untimed, or reading the cache), ``search`` (the rest of the workflow: reading the cluster,
pricing, frontier tracking and the 2-D plans), ``rest`` (the process's wall time less all that:
the interpreter, argument parsing, printing, exit as the console script exits); and the process's
peak resident memory (``ru_maxrss``, the command's own process; the search's forked workers apart).
A run past ``--limit-s`` is stopped: its stages done so far are printed, the search as ``>``.

    python benchmarks/planning_speed.py --end-to-end [--e2e-cases gpt2-12,llama3-8b,llama3-70b,llama3-405b]
                                        [--repeats 3] [--limit-s 600]

``mixtral-8x7b`` (Mixtral 8x7B on 8 hosts of 8 H100s, bf16) is a case too, with no target in the issue:
about a minute (``--e2e-cases mixtral-8x7b --repeats 1``; docs/measurements.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import ModuleType

    import tensoropt

T0 = time.perf_counter()    # the child's import time is counted from here (--child)

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


#: the end-to-end cases (issue 50's targets): model, cluster, precision
E2E: dict[str, tuple[str, str, str]] = {
    "gpt2-12": ("zoo:gpt2?layers=12", "preset:v100-8-nvlink", "fp32"),
    "llama3-8b": ("zoo:llama3-8b", "preset:h100-hosts?hosts=1", "bf16"),
    "llama3-70b": ("zoo:llama3-70b", "preset:h100-hosts?hosts=8", "bf16"),
    "llama3-405b": ("zoo:llama3-405b", "preset:h100-hosts?hosts=64", "bf16"),
    # no target in the issue: 55 s first, 41 s cached (docs/measurements.md)
    "mixtral-8x7b": ("zoo:mixtral-8x7b", "preset:h100-hosts?hosts=8", "bf16"),
}
STAGES = ("import", "build", "capture", "profile", "search", "rest")
#: the runs import the tensoropt of this checkout (not another one installed)
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(Path(__file__).resolve().parents[1]),
                                                                   os.environ.get("PYTHONPATH"))))}


def child(out: str, argv: list[str]) -> int:
    """Run ``tensoropt ARGV`` in this process, timing its stages (module docstring) into the JSON
    file ``out``, rewritten as each stage ends (a run stopped during the search keeps the others)."""
    import resource
    from collections import defaultdict

    import tensoropt.cli
    import tensoropt.cli.frontier  # the command's module (the parser imports it anyway)
    seconds: dict[str, float] = defaultdict(float)
    seconds["import"] = time.perf_counter() - T0
    import tensoropt.modelspec as modelspec
    import tensoropt.workflow as workflow

    def write() -> None:
        rss = {"self_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "children_MiB": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
        tmp = out + ".tmp"
        Path(tmp).write_text(json.dumps({"seconds": dict(seconds), "rss": rss}))
        os.replace(tmp, out)

    def timing(owner: object, name: str, key: str) -> None:
        real = getattr(owner, name)

        def timed(*args: object, **kwargs: object) -> object:
            t = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - t
                write()
        setattr(owner, name, timed)

    # the builders where the command imports them: a cached run never does (nor torch, which they import)
    _after_import("tensoropt.zoo", lambda zoo: timing(zoo, "build", "build"))
    _after_import("tensoropt.zoo.hf", lambda hf: timing(hf, "from_config", "build"))
    timing(modelspec.LoadedModel, "capture", "capture+build")
    timing(workflow, "profile", "profile")
    timing(workflow, "kept_profile", "profile")
    timing(tensoropt.cli.frontier, "explore", "explore")     # as the command imported it
    code = tensoropt.cli.main(argv)
    seconds["capture"] = seconds.pop("capture+build", 0.0) - seconds["build"]
    seconds["search"] = seconds.pop("explore", 0.0) - seconds["build"] - seconds["capture"] - seconds["profile"]
    seconds["python"] = time.perf_counter() - T0
    write()
    tensoropt.cli.exit_now(code)    # as the console script ends
    return code


def _after_import(name: str, then: Callable[[ModuleType], None]) -> None:
    """``then(module)`` once module ``name`` is imported: now if it already is, else right after
    whoever imports it first has (a finder ahead of Python's that hooks the module's loading)."""
    import importlib.abc
    import importlib.machinery

    if name in sys.modules:
        then(sys.modules[name])
        return

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
                      ) -> importlib.machinery.ModuleSpec | None:
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
            if spec is None or spec.loader is None:
                return spec
            load = spec.loader.exec_module

            def exec_module(module: ModuleType) -> None:
                load(module)
                then(module)
            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


@dataclass
class Run:
    """One end-to-end run: process wall seconds, seconds per stage, peak RSS (MiB), stopped or not."""

    wall: float
    seconds: dict[str, float]
    rss_MiB: float
    stopped: bool


def e2e_run(case: str, cache: Path, limit_s: float) -> Run:
    """One run of ``case``'s command in a fresh process: its stage seconds and memory."""
    spec, cluster, precision = E2E[case]
    argv = ["frontier", spec, "--cluster", cluster, "--precision", precision, "--cache-dir", str(cache),
            "--rows", "3"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "stages.json"
        t = time.perf_counter()
        # a session of its own: a run stopped at the limit is stopped with the search's forked workers
        proc: subprocess.Popen[str] | None = subprocess.Popen(
            [sys.executable, __file__, "--child", str(out), "--", *argv], stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, env=ENV, start_new_session=True)
        assert proc is not None
        try:
            _, stderr = proc.communicate(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            proc = None
        wall = time.perf_counter() - t
        got = json.loads(out.read_text()) if out.exists() else {"seconds": {}, "rss": {}}
    if proc is not None and proc.returncode != 0:
        raise SystemExit(f"{case}: the command failed ({proc.returncode}):\n{stderr[-2000:]}")
    sec = {k: float(v) for k, v in got["seconds"].items()}
    if "capture+build" in sec:    # stopped before the child's own accounting
        sec["capture"] = sec.pop("capture+build") - sec.get("build", 0.0)
    if proc is None:
        sec["search"] = float("inf")
    else:
        sec["rest"] = wall - sum(sec.get(k, 0.0) for k in STAGES[:-1])
    return Run(wall if proc is not None else float("inf"), sec, float(got["rss"].get("self_MiB", 0.0)), proc is None)


def _s(v: float, limit_s: float) -> str:
    return f"> {limit_s:.0f}" if v == float("inf") else f"{v:.2f}"


def end_to_end(cases: list[str], repeats: int, limit_s: float, cached_runs: bool = True) -> None:
    """The table of ``--end-to-end`` (module docstring): per case, first runs and cached runs
    (``cached_runs=False``: first runs only, for a case whose search alone reaches the limit)."""
    print("| case | model | cluster | run | wall s | " + " | ".join(f"{s} s" for s in STAGES) +
          " | peak RSS MiB | runs (wall s) |")
    print("|---|---|---|---|---:|" + "---:|" * len(STAGES) + "---:|---|")
    for case in cases:
        spec, cluster, _ = E2E[case]
        with tempfile.TemporaryDirectory() as tmp:
            firsts = [e2e_run(case, Path(tmp) / f"first-{i}", limit_s) for i in range(repeats)]
            cached = [e2e_run(case, Path(tmp) / "first-0", limit_s) for _ in range(repeats if cached_runs else 0)]
        for label, runs in (("first", firsts), ("cached", cached)):
            if not runs:
                continue
            stages = [_s(statistics.median(r.seconds.get(k, 0.0) for r in runs), limit_s) for k in STAGES]
            walls = ", ".join("stopped" if r.stopped else f"{r.wall:.1f}" for r in runs)
            print(f"| {case} | {spec} | {cluster} | {label} | {_s(statistics.median(r.wall for r in runs), limit_s)} | "
                  + " | ".join(stages) + f" | {max(r.rss_MiB for r in runs):.0f} | {walls} |", flush=True)


def priced_profile(spec: str, cluster: tensoropt.Cluster,
                   cache: Path) -> tuple[tensoropt.OpGraph, tensoropt.CostModel, float]:
    """(graph, costs priced for the cluster, seconds to capture and profile) — profiled once per spec."""
    import tensoropt
    t0 = time.perf_counter()
    graph = tensoropt.load_model(spec).capture(method="export")
    degrees = tuple(sorted({1, *(2 ** i for i in range(1, 9) if 2 ** i <= len(cluster))} | {len(cluster)}))
    costs = tensoropt.profile(graph, shard_degrees=degrees, repeats=1, timed=False, cache=True)
    return graph, tensoropt.price(costs, cluster, costs_from="model").costs, time.perf_counter() - t0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return child(sys.argv[2], sys.argv[4:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--end-to-end", action="store_true", help="the whole command in fresh processes, per stage")
    ap.add_argument("--e2e-cases", default=",".join(E2E))
    ap.add_argument("--first-only", action="store_true", help="--end-to-end: no cached runs")
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
    if args.end_to_end:
        end_to_end(args.e2e_cases.split(","), args.repeats, args.limit_s, cached_runs=not args.first_only)
        return 0
    import tensoropt  # here, not at the top: an --end-to-end run imports it in its own processes
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
