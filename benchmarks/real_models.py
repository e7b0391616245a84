"""The real-architecture suite end to end: every model of ``examples/real_models.py`` captured,
profiled, tracked (the frontier on 2 and on 4 devices) and every frontier plan run and checked.

    python benchmarks/real_models.py [--models bert,llama] [--devices 2,4] [--ci] [--max-plans K] [--backend dist]
                                     [--check-dtype float64] [--cluster preset:a100-4-nvlink] [--times model] [-v]

Per model: load (``tensoropt.load_model("examples/real_models.py:NAME")`` when the loader keeps
what the factory returns — its keyword inputs and its ``output`` — else the factory called
directly), capture (``tensoropt.capture(..., method="export")``, the inputs and the output choice
as a ``ModelCall``), profile (``shard_degrees`` 1, 2 and 4 when 4 devices are asked for,
``repeats=1``, no profile cache unless ``--cache``), frontier (``tensoropt.track_frontier`` on the
first 2 / 4 devices of ``--cluster``), then every distinct plan of the frontiers (``--max-plans
K``: K evenly spaced along each frontier, both ends included) is run and checked with
``tensoropt.execute.check_plan``: the plan applied (``tensoropt.apply_plan``) on the CPU, one
training step of it against the unmodified model, random ops (dropout, stochastic depth) on and
drawn keyed on both sides.  The check is in float64 by default: the model's float64 twin is
captured once and every plan re-targeted to it (a model whose float64 capture differs is checked
in float32 and a note says so).  When the check raises, the plan is run alone (apply_plan, one
forward + backward): a failure there is the plan's "run" failure, else the check's.

Where the frontier's times come from (``--times``): ``measured`` (default) times the profile on
this CPU and takes the cluster's devices as this CPU (``Cluster.without_kinds``); ``model``
profiles untimed — memory and work, each call once — and prices the times through the device
model of the cluster's GPU kind (``tensoropt.price(..., costs_from="model")``).  The check only
needs plans, not good times: ``model`` is what tests/realmodels runs (faster, and the same
frontiers on a loaded machine).

``--backend dist`` adds a column: ``--dist-plans K`` plans of each model's 2-device frontier (both
ends first) checked on 2 gloo ranks, as ``tensoropt run --backend dist --check`` checks them
(:func:`tensoropt.distributed.jobs.check_as_run`; a model the loader cannot rebuild from its
spec on a rank is noted and not checked there).

An exception in a stage is that stage's failure; one model's failure never stops the others.
Prints a markdown table ("run s" is the plans' run and check together), every distinct failure
grouped by stage (numbers masked to group them, one example message each), notes, and
"N of M models pass every stage".  Exit status 0 when every model passes.

It owns the suite's table and the grouping of failures; the models are
``examples/real_models.py``'s: it must not change a model to make it pass.
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import logging
import re
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import tensoropt
from tensoropt import execute
from tensoropt.execute import check as chk
from tensoropt.measure.step import training_loss

try:
    from tensoropt.capture.call import ModelCall
except ImportError:   # a tensoropt without ModelCall: the inputs are passed as they are (as_call)
    ModelCall = None

ROOT = Path(__file__).resolve().parent.parent
FACTORY_FILE = ROOT / "examples" / "real_models.py"
NUMBER = re.compile(r"[-+]?\d+(\.\d+)?(e[-+]?\d+)?|inf|nan")
STAGES = ("load", "capture", "profile", "frontier", "run", "check", "dist")


def import_factories(path: Path = FACTORY_FILE):
    """``examples/real_models.py`` imported by path (it is not a package module)."""
    spec = importlib.util.spec_from_file_location("_tensoropt_real_models", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def one_line(e: BaseException, width: int = 160) -> str:
    text = " ".join(str(e).split()) or "(no message)"
    text = f"{type(e).__name__}: {text}"
    return text if len(text) <= width else text[:width - 1] + "…"


def call_module(module: torch.nn.Module, inputs: Any) -> Any:
    """``module`` called as the factory's inputs say: keywords, positionals or one tensor."""
    if isinstance(inputs, dict):
        return module(**inputs)
    if isinstance(inputs, (tuple, list)):
        return module(*inputs)
    return module(inputs)


@dataclass
class Row:
    name: str
    ops: int | None = None
    points: dict[int, int | None] = field(default_factory=dict)
    passing: int = 0
    written: int = 0
    dist_passing: int = 0
    dist_checked: int | None = None     # None: not asked (--backend local) or not loadable by spec
    seconds: dict[str, float] = field(default_factory=dict)
    loader: str = ""
    failures: list[tuple[str, str]] = field(default_factory=list)    # (stage, message), in order
    notes: list[str] = field(default_factory=list)

    def fail(self, stage: str, message: str) -> None:
        self.failures.append((stage, message))

    @property
    def ok(self) -> bool:
        return not self.failures and self.written > 0 and self.passing == self.written


def as_call(inputs: Any, output: Any) -> Any:
    """The inputs and output choice as the capture takes them: a ``ModelCall`` where the library
    has one, else the inputs as they are (the output is then passed on its own)."""
    if ModelCall is None:
        return inputs
    return ModelCall.of(inputs, output)


def load(name: str, factories: Any) -> tuple[torch.nn.Module, Any, Any, str]:
    """(model, inputs, output, how it was loaded).  ``tensoropt.load_model`` is used when it
    loads the factory and keeps what it returns (its keyword inputs and its ``output``); else
    the factory's own result."""
    torch.manual_seed(0)
    result = factories.SUITE[name]()
    model, inputs = result[0], result[1]
    output = result[2] if len(result) > 2 else None
    try:
        torch.manual_seed(0)
        lm = tensoropt.load_model(f"{FACTORY_FILE}:{name}")
    except Exception as e:  # noqa: BLE001 - the factory is used as it is
        return model, as_call(inputs, output), output, f"factory (load_model: {one_line(e, 90)})"
    if output is not None and getattr(lm, "output", None) != output:
        return model, as_call(inputs, output), output, "factory (load_model drops `output`)"
    if isinstance(inputs, dict) and set(getattr(lm, "example_kwargs", {}) or {}) != set(inputs):
        return model, as_call(inputs, output), output, "factory (load_model drops the input names)"
    call = lm.call if hasattr(lm, "call") else lm.example_inputs
    return lm.model, call, output, "load_model"


def capture(model: torch.nn.Module, inputs: Any, output: Any, name: str):
    """``tensoropt.capture`` through torch.export (the executor needs that capture)."""
    if hasattr(inputs, "output"):      # a ModelCall carries the output choice
        return tensoropt.capture(model, inputs, name=name, method="export")
    kwargs = {"output": output} if output is not None else {}
    return tensoropt.capture(model, inputs, name=name, method="export", **kwargs)


def plan_key(plan) -> tuple:
    return (tuple(plan.order),
            tuple((n, tuple(c.devices), c.layout, bool(c.recompute)) for n, c in sorted(plan.configs.items())))


class Checker:
    """Runs and checks one plan at a time.  With ``tensoropt.execute.check_plan``: the library's
    check (random ops on, drawn keyed on both sides), in float64 by default — the float64 twin of
    the model is captured once per model and each plan re-targeted to it
    (``check.retarget_plan``); a model whose float64 capture differs or fails is checked in
    float32 (a note says so)."""

    def __init__(self, model: torch.nn.Module, call: Any, graph, dtype: str):
        self.model, self.call, self.graph, self.dtype = model, call, graph, dtype
        self.note = ""
        self._twin = None      # (model, call, graph) in float64

    def _side(self, plan):
        """(model, call, plan, graph) the check runs on."""
        if self.dtype == "float32" or self.note:
            return self.model, self.call, plan, self.graph
        if self._twin is None:
            try:
                m, x, p, g = chk.prepare_check(self.model, self.call, plan, self.graph, self.dtype)
            except getattr(chk, "CheckDtypeError", ()) as e:
                self.note = f"checked in float32: {one_line(e, 200)}"
                return self.model, self.call, plan, self.graph
            self._twin = (m, x, g)
            return m, x, p, g
        m, x, g = self._twin
        return m, x, chk.retarget_plan(plan, self.graph, g), g

    def __call__(self, plan) -> tuple[str, str] | None:
        """None when the plan runs and checks; else (stage, message).  When the check raises,
        the plan is run alone to tell a plan that does not run from a check that does not work."""
        try:
            m, x, p, g = self._side(plan)
            # "float32" = as captured: the twin is float64 already
            cmp = execute.check_plan(m, x, p, graph=g, check_dtype="float32")
        except Exception as e:  # noqa: BLE001 - reported
            ran = run_alone(self.model, self.call, plan, self.graph)
            return ("run", ran) if ran else ("check", one_line(e))
        if not cmp.passed:
            return "check", one_line_text(cmp.summary(), 400)
        return None


def one_line_text(text: str, width: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[:width - 1] + "…"


def run_alone(model: torch.nn.Module, call: Any, plan, graph) -> str | None:
    """The plan applied to a copy and one training step's forward + backward of it (random ops
    as they train): None, or why it failed."""
    try:
        planned = tensoropt.apply_plan(copy.deepcopy(model), call, plan, graph=graph)
        out = planned(*call.args, **call.kwargs) if hasattr(call, "kwargs") else call_module(planned, call)
        loss = training_loss(out)
        loss.backward()
    except Exception as e:  # noqa: BLE001 - reported
        return one_line(e)
    if not torch.isfinite(loss.detach()).all():
        return f"the planned loss is {loss.item()}"
    return None


def spread(points: list, k: int | None) -> list:
    """``k`` points evenly spaced along the frontier (both ends included); all when k is None."""
    if k is None or len(points) <= k:
        return points
    if k == 1:
        return [points[0]]
    return [points[round(i * (len(points) - 1) / (k - 1))] for i in range(k)]


def profiled(graph, degrees: tuple[int, ...], cache: bool, cluster, times: str):
    """(costs, cluster) for the frontier: ``times="measured"``, the graph timed on this CPU and
    ``cluster`` as given (its devices taken as this CPU: ``without_kinds``); ``"model"``, an
    untimed profile (memory and work, each call once) priced through the device model of the
    cluster's kind, with the cluster the pricing returns."""
    if times == "measured":
        return tensoropt.profile(graph, shard_degrees=degrees, repeats=1, cache=cache), cluster
    if times != "model":
        raise ValueError(f"times must be 'measured' or 'model', not {times!r}")
    costs = tensoropt.profile(graph, shard_degrees=degrees, repeats=1, cache=cache, timed=False)
    priced = tensoropt.price(costs, cluster, costs_from="model")
    return priced.costs, priced.cluster


def bench_model(name: str, factories: Any, cluster, device_counts: list[int], cache: bool,
                max_plans: int | None, verbose: bool, check_dtype: str = "float64", dist_plans: int = 0,
                times: str = "measured") -> Row:
    """One model through every stage (module docstring).  ``cluster``: as-is for ``times="model"``
    (the device model of its kind prices the untimed profile), already ``without_kinds`` for
    ``"measured"`` (:func:`profiled`)."""
    row = Row(name)
    say = (lambda msg: print(f"[{name}] {msg}", file=sys.stderr, flush=True)) if verbose else (lambda msg: None)

    def stage(label: str, fn):
        t0 = time.perf_counter()
        try:
            return True, fn()
        except Exception as e:  # noqa: BLE001 - reported in the table
            row.fail(label, one_line(e))
            if verbose:
                traceback.print_exc(limit=-4, file=sys.stderr)
            return False, None
        finally:
            row.seconds[label] = row.seconds.get(label, 0.0) + time.perf_counter() - t0

    ok, loaded = stage("load", lambda: load(name, factories))
    if not ok:
        return row
    model, inputs, output, row.loader = loaded
    say(f"loaded ({row.loader})")
    ok, graph = stage("capture", lambda: capture(model, inputs, output, name))
    if not ok:
        return row
    row.ops = len(graph.ops)
    say(f"captured: {row.ops} ops")
    degrees = tuple(sorted({1, 2, *(k for k in (4,) if max(device_counts) >= 4)}))
    ok, got = stage("profile", lambda: profiled(graph, degrees, cache, cluster, times))
    if not ok:
        return row
    costs, cluster = got
    say("profiled")
    plans: dict[tuple, Any] = {}
    two_rank: list[Any] = []       # both ends of the 2-device frontier (then evenly between): for --backend dist
    for n in device_counts:
        ok, fr = stage("frontier", functools.partial(tensoropt.track_frontier, graph, costs, cluster,
                                                     devices=cluster.names[:n]))
        row.points[n] = len(fr) if ok else None
        if ok:
            for point in spread(list(fr), max_plans):
                plans.setdefault(plan_key(point.plan), point.plan)
            if n == 2:
                two_rank = [p.plan for p in spread(list(fr), dist_plans)] if dist_plans else []
    say(f"frontier: {row.points}; {len(plans)} distinct plans")
    todo = list(plans.values())
    row.written = len(todo)
    t0 = time.perf_counter()
    checker = Checker(model, inputs, graph, check_dtype)
    for plan in todo:
        bad = checker(plan)
        if bad is None:
            row.passing += 1
        else:
            stage_name, msg = bad
            row.fail(stage_name, f"{msg} [plan {plan.plan_id or '?'}, {plan.num_devices} dev]")
    row.seconds["run"] = time.perf_counter() - t0
    if checker.note:
        row.notes.append(checker.note)
    say(f"run: {row.passing} of {row.written} plans pass")
    if two_rank and row.loader == "load_model":
        stage("dist", lambda: check_on_two_ranks(row, name, two_rank))
        say(f"2 gloo ranks: {row.dist_passing} of {row.dist_checked} plans pass")
    elif two_rank:
        row.notes.append(f"not checked on ranks: loaded by {row.loader}, which a rank cannot repeat from a spec")
    return row


def check_on_two_ranks(row: Row, name: str, plans: list) -> None:
    """``plans`` (2-device) checked on 2 gloo ranks as ``tensoropt run --backend dist --check``
    checks them (:func:`tensoropt.distributed.jobs.check_as_run`: float64 where the model allows,
    dropout on with keyed masks, rank 0's weights everywhere)."""
    from tensoropt.distributed import launch
    from tensoropt.distributed.jobs import check_as_run

    cases = [{"model": f"{FACTORY_FILE}:{name}", "plan": plan.to_dict()} for plan in plans]
    results = launch(check_as_run, 2, {"cases": cases}, timeout_s=max(300.0, 60.0 * len(cases)))[0]
    row.dist_checked = len(results)
    for plan, r in zip(plans, results):
        if r["passed"]:
            row.dist_passing += 1
        else:
            worst = r["failures"][0] if r["failures"] else r["summary"]
            row.fail("dist", f"{worst} [plan {plan.plan_id or '?'}, 2 ranks]")


def fmt_points(row: Row, device_counts: list[int]) -> str:
    return " / ".join("–" if row.points.get(n) is None else str(row.points[n]) for n in device_counts)


def fmt_seconds(row: Row, key: str) -> str:
    return f"{row.seconds[key]:.1f}" if key in row.seconds else "–"


def first_failure(row: Row) -> str:
    if not row.failures:
        return "" if row.written else "no plan"
    stage, msg = row.failures[0]
    plan = msg[msg.index(" [plan "):] if " [plan " in msg else ""
    msg = msg[:len(msg) - len(plan)]
    msg = (msg if len(msg) <= 150 else msg[:149] + "…") + plan
    more = len(row.failures) - 1
    return (f"{stage}: {msg}" + (f" (+{more} more)" if more else "")).replace("|", "\\|")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="comma-separated names from SUITE (default: all)")
    ap.add_argument("--devices", default="2,4", help="device counts to track the frontier on (default 2,4)")
    ap.add_argument("--ci", action="store_true", help="only the models of CI_SUBSET")
    ap.add_argument("--cluster", default="preset:a100-4-nvlink", help="cluster spec (default preset:a100-4-nvlink)")
    ap.add_argument("--check-dtype", choices=("float64", "float32"), default="float64",
                    help="the dtype of tensoropt.execute.check_plan's check (default float64)")
    ap.add_argument("--max-plans", type=int, default=None,
                    help="run at most this many plans of each frontier, evenly spaced along it (default: all)")
    ap.add_argument("--cache", action="store_true", help="use the profile cache (default: profile afresh)")
    ap.add_argument("--times", choices=("measured", "model"), default="measured",
                    help="measured (default): the profile timed on this CPU, the cluster's devices taken as this "
                         "CPU; model: an untimed profile priced through the device model of the cluster's kind "
                         "(what tests/realmodels runs)")
    ap.add_argument("--backend", choices=("local", "dist"), default="local",
                    help="dist: also check K plans of each 2-device frontier (--dist-plans, both ends first) on 2 "
                         "gloo ranks, as tensoropt run --backend dist --check does (default local)")
    ap.add_argument("--dist-plans", type=int, default=2, help="with --backend dist: plans per model (default 2)")
    ap.add_argument("-v", "--verbose", action="store_true", help="progress and tracebacks on stderr")
    args = ap.parse_args(argv)

    warnings.filterwarnings("ignore")
    try:
        import transformers  # optional (pip install -e .[zoo]): only its logging is quietened here

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass
    logging.getLogger("torch").setLevel(logging.ERROR)

    factories = import_factories()
    names = list(factories.CI_SUBSET) if args.ci else list(factories.SUITE)
    if args.models:
        asked = [m.strip() for m in args.models.split(",") if m.strip()]
        unknown = [m for m in asked if m not in factories.SUITE]
        if unknown:
            ap.error(f"unknown model(s) {', '.join(unknown)}; SUITE has {', '.join(factories.SUITE)}")
        names = [m for m in asked if m in names] if args.ci else asked
    device_counts = sorted({int(x) for x in args.devices.split(",") if x.strip()})
    # the plans are checked for correctness, not timed: the topology with this machine's own times,
    # or (--times model) with the times of its devices' kind, from an untimed profile
    cluster = tensoropt.load_cluster(args.cluster)
    if args.times == "measured":
        cluster = cluster.without_kinds()
    if not device_counts or device_counts[0] < 1 or device_counts[-1] > len(cluster):
        ap.error(f"--devices must be between 1 and {len(cluster)} (the devices of {args.cluster})")

    dev_label = " / ".join(f"{n} dev" for n in device_counts)
    source = "this CPU's, timed" if args.times == "measured" else "its device model's, from an untimed profile"
    print(f"cluster {cluster.name} (times: {source}); frontiers on {dev_label}; check: tensoropt.execute.check_plan "
          f"in {args.check_dtype}, dropout on; torch {torch.__version__}\n")
    dist = args.backend == "dist"
    print(f"| model | ops | frontier points ({dev_label}) | plans passing / written |"
          + (" 2 gloo ranks: passing / checked |" if dist else "")
          + " capture s | profile s | frontier s | run s | first failure |")
    print("|---|---:|---:|---:|" + ("---:|" if dist else "") + "---:|---:|---:|---:|---|", flush=True)
    rows = []
    t_all = time.perf_counter()
    for name in names:
        try:
            row = bench_model(name, factories, cluster, device_counts, args.cache, args.max_plans,
                              args.verbose, args.check_dtype,
                              dist_plans=args.dist_plans if args.backend == "dist" and 2 in device_counts else 0,
                              times=args.times)
        except Exception as e:  # noqa: BLE001 - never stop the others
            row = Row(name)
            row.fail("benchmark", one_line(e))
        rows.append(row)
        ops = "–" if row.ops is None else str(row.ops)
        ranks = ("–" if row.dist_checked is None else f"{row.dist_passing} / {row.dist_checked}") + " | "
        times = " | ".join(fmt_seconds(row, k) for k in ("capture", "profile", "frontier", "run"))
        print(f"| {name} | {ops} | {fmt_points(row, device_counts)} | {row.passing} / {row.written} | "
              + (ranks if dist else "") + f"{times} | {first_failure(row)} |", flush=True)

    # every distinct failure, grouped by stage
    grouped: dict[str, dict[str, list[str]]] = {}
    for row in rows:
        for stage, msg in row.failures:
            text = msg.split(" [plan ")[0]
            key = NUMBER.sub("#", text)
            example, models = grouped.setdefault(stage, {}).setdefault(key, [text, {}])
            models[row.name] = models.get(row.name, 0) + 1
    if grouped:
        print("\n### failures by stage (numbers vary between plans; one example message each)\n")
        for stage in [*STAGES, "benchmark"]:
            for example, models in grouped.get(stage, {}).values():
                who = ", ".join(f"{m} ×{n}" if n > 1 else m for m, n in models.items())
                print(f"- **{stage}** ({who}): {example}")
    notes = [(row.name, n) for row in rows for n in row.notes]
    if notes:
        print("\n### notes\n")
        for name, n in notes:
            print(f"- {name}: {n}")
    loaders = {row.name: row.loader for row in rows if row.loader and row.loader != "load_model"}
    if loaders:
        kinds: dict[str, list[str]] = {}
        for n, how in loaders.items():
            kinds.setdefault(how, []).append(n)
        print("\n### loaded without tensoropt.load_model\n")
        for how, ns in kinds.items():
            print(f"- {how}: {', '.join(ns)}")
    passed = sum(row.ok for row in rows)
    print(f"\n{passed} of {len(rows)} models pass every stage ({time.perf_counter() - t_all:.0f} s)")
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
