"""What several ``tensoropt`` commands share: the options more than one command takes (built from
the :class:`~tensoropt.request.Request` field each sets, so a flag means the same everywhere and
its help and default are written once, in :mod:`tensoropt.request`), their checks, capturing a
model spec, getting its costs, and printing a simulated plan.

It owns no command: nothing here registers a subcommand or reads an option only one command
has; a command module imports these pieces and keeps its own options and output.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from os import PathLike
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..cluster import Cluster
from ..describe import fmt_bytes
from ..devicemodel.price import Priced, price, prices_by_model
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.kept import profiling_on
from ..modelspec import load_model
from ..plan import Plan
from ..planmodel.fits import check_budget_value, over_by, usable_bytes
from ..planmodel.simulate import SimResult
from ..request import EXPLORING, Request, default_of, help_of, option_of
from ..workflow import read_profile
from ._progress import ProgressBars

#: ``--batch``'s help where a saved plan gives the default
PLAN_BATCH_HELP = "batch size (default: the plan's, for zoo models)"


# ---- options: a Request field's flag, declared with the field (tensoropt.request) ---------
def add_request_options(p: argparse.ArgumentParser, *names: str, help: Mapping[str, str] | None = None,
                        default: Mapping[str, Any] | None = None) -> None:
    """The options of :class:`~tensoropt.request.Request`'s fields ``names``, as each field declares
    it (:class:`~tensoropt.request.Option`: flag, help, type, choices) with the field's default;
    ``help`` / ``default``: a command's own wording or default where the field means something
    narrower there (``simulate``'s batch defaults to the plan's).  Read them back with
    :func:`request_fields`."""
    for name in names:
        option = option_of(name)
        text = (help or {}).get(name) or help_of(name)
        if option.negated:
            p.add_argument(option.flag, action="store_true", help=text)
            continue
        kwargs: dict[str, Any] = {"help": text}
        if option.required:
            kwargs["required"] = True
        else:
            kwargs["default"] = (default or {}).get(name, default_of(name))
        for key in ("type", "metavar", "choices"):
            if getattr(option, key) is not None:
                kwargs[key] = getattr(option, key)
        p.add_argument(option.flag, **kwargs)


def request_fields(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The :class:`~tensoropt.request.Request` fields ``names`` (default: every field whose option
    the command has) from the parsed options: a negated flag turned back (``--no-cache`` →
    ``cache=False``), a size read in bytes (a bad one names its option)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(Request):
        option = f.metadata.get("option")
        if option is None or (names and f.name not in names) or not hasattr(args, option.dest):
            continue
        value = getattr(args, option.dest)
        if option.negated:
            value = not value
        elif option.read is not None and isinstance(value, str):
            value = option.read(value, option.flag)
        out[f.name] = value
    return out


def add_request_arguments(p: argparse.ArgumentParser, *extra: str) -> None:
    """The options every exploring command has (:data:`~tensoropt.request.EXPLORING`: ``--cluster``,
    ``--batch``, ``--devices``, ``--budget`` / ``--reserve``, ``--precision``, ``--optimizer``,
    ``--profile``, ``--costs-from`` / ``--calibration``, ``--repeats``, ``--no-cache`` /
    ``--cache-dir``) and the command's ``extra`` fields' (``"max_walks"``, …)."""
    add_request_options(p, *EXPLORING, *extra)


def add_capture_arguments(p: argparse.ArgumentParser, model_help: str) -> None:
    """MODEL and how to capture it (``--batch``, ``--batch-dim``, ``--precision``, ``--no-cache`` /
    ``--cache-dir``): read them with :func:`capture_spec` and :func:`cache_of`."""
    p.add_argument("model", help=model_help)
    add_request_options(p, "batch")
    p.add_argument("--batch-dim", type=int, default=0, help="batch dimension of the inputs (default 0)")
    add_request_options(p, "precision", "cache", "cache_dir")


def cache_of(args: argparse.Namespace) -> bool | str:
    """The cache the ``--no-cache`` / ``--cache-dir`` options name: ``False`` (``--no-cache``), the
    ``--cache-dir`` folder, or ``True`` (the default folder)."""
    if getattr(args, "no_cache", False):
        return False
    return getattr(args, "cache_dir", None) or True


def check_repeats(args: argparse.Namespace) -> None:
    """Refuse ``--repeats`` below 1 (and ``--warmup`` below 0, where the command has it) before any work."""
    if args.repeats < 1:
        raise TensorOptError("--repeats must be ≥ 1")
    if getattr(args, "warmup", 0) < 0:
        raise TensorOptError("--warmup must be ≥ 0")


def print_times_from(console: Console, source: str, notes: Iterable[str] = ()) -> None:
    """The header line every exploring command prints: where its times come from, and what
    pricing decided (speeds given, kinds assumed)."""
    console.print(f"times: {escape(source)}", highlight=False)
    for n in notes:
        console.print(f"[dim]  {escape(n)}[/dim]", highlight=False)


def fit_options(args: argparse.Namespace) -> tuple[int | None, int]:
    """``(budget, reserve)`` in bytes from the ``--budget`` / ``--reserve`` options (a bad size
    names its option)."""
    fields = request_fields(args, "budget", "reserve")
    budget = fields.get("budget")
    check_budget_value(budget, "--budget")
    return budget, fields["reserve"]


def workflow_request(args: argparse.Namespace, **rest: Any) -> Request:
    """The workflow's :class:`~tensoropt.request.Request` of MODEL, the options the command has
    (:func:`request_fields`) and the command's own fields ``rest`` (which win)."""
    return Request(args.model, **{**request_fields(args), **rest})


# ---- model and costs -----------------------------------------------------------------------
def capture_spec(spec: str, console: Console, *, batch: int | None = None, batch_dim: int = 0,
                 precision: str | None = None, plan: Plan | None = None, method: str = "auto",
                 cache: bool | str = False) -> OpGraph:
    """Load a model spec (zoo:…, file.py:factory, .onnx, graph.json) and capture it in ``precision``
    (``--precision``; ``None``: fp32, or a saved graph's own), with a status line — for a ``plan``
    with replicas or micro-batches, its first slice of the batch (:func:`~tensoropt.execute.replicas.call_for_capture`).
    ``cache`` (:func:`cache_of`): read the graph from the capture cache where kept (it then has no
    module: not for a timed profile), else keep it there."""
    from ..execute.replicas import call_for_capture

    loaded = load_model(spec, batch=batch, lazy=True)
    with console.status(f"capturing {escape(spec)} …"):
        if plan is not None and (plan.replicas or plan.microbatches > 1) and not loaded.is_file:
            return loaded.capture(batch_dim=batch_dim, precision=precision, method=method, cache=cache,
                                  call=lambda call: call_for_capture(call, plan, batch_dim),
                                  call_key=f"plan slice: batch {plan.batch_size} of {plan.global_batch_size}")
        return loaded.capture(batch_dim=batch_dim, precision=precision, method=method, cache=cache)


def costs_for(graph: OpGraph, shard_degrees: Iterable[int], args: argparse.Namespace, cluster: Cluster,
              devices: Sequence[str], console: Console | None = None) -> Priced:
    """The costs priced for ``cluster``'s ``devices`` (:func:`tensoropt.devicemodel.price`, with
    ``--costs-from`` / ``--calibration``): ``--profile`` checked against the graph (its precision
    first, then its fingerprint), else measured at ``shard_degrees`` (with ``--repeats`` /
    ``--warmup`` where the command has them, in the graph's precision) with a progress bar —
    untimed where a device model will price the times."""
    costs_from, calibration = getattr(args, "costs_from", "auto"), getattr(args, "calibration", None)
    if getattr(args, "profile", None):
        costs = read_profile(args.profile, graph)
    else:
        from ..measure.profiler import profile

        kind, name = profiling_on("cpu")
        timed = not prices_by_model(costs_from, cluster, devices, name, kind)
        with ProgressBars(console or Console(stderr=True)) as progress:
            costs = profile(graph, shard_degrees=tuple(sorted(set(shard_degrees))), repeats=args.repeats,
                            warmup=getattr(args, "warmup", 1), progress=progress, timed=timed, cache=cache_of(args))
    return price(costs, cluster, devices, costs_from=costs_from, calibration=calibration)


# ---- output --------------------------------------------------------------------------------
class Saves(Protocol):
    """What ``-o`` writes: a graph, a profile, a plan, a cluster."""

    def save(self, path: str, /) -> object: ...


def save_output(console: Console, thing: Saves, path: str | None) -> None:
    """``thing.save(path)`` then ``wrote PATH``, when the command was given a ``path`` (``-o``)."""
    if path:
        thing.save(path)
        print_wrote(console, path)


def print_wrote(console: Console, path: str | PathLike[str], what: str = "") -> None:
    """``wrote PATH`` (``what``: e.g. ``"3 plan(s) to "``, said before the path)."""
    console.print(f"wrote {what}{escape(str(path))}", highlight=False)


def print_simulation(console: Console, res: SimResult, plan: Plan, cluster: Cluster, *, title: str,
                     budget: int | float | None = None, reserve: int = 0) -> bool:
    """The per-device table (peak, what holds it, usable memory) and link busy times of a
    simulation; returns whether the plan fits (:func:`tensoropt.planmodel.fits.fits` under ``budget`` and
    ``reserve``)."""
    nodes: dict[str, int] = {}
    for cfg in plan.configs.values():
        for d in cfg.devices:
            nodes[d] = nodes.get(d, 0) + 1
    t = Table(title=title, title_justify="left")
    parts = ("parameters", "gradients", "optimizer", "activations", "transient")
    for col in ("device", "nodes", "compute busy", "peak memory", *parts, "usable", "fits"):
        t.add_column(col, justify="left" if col == "device" else "right")
    peaks = {d: res.memory_bytes.get(d, 0) for d in plan.devices}
    over = over_by(peaks, cluster, budget=budget, reserve=reserve)
    for d in plan.devices:
        split = res.memory[d].parts() if d in res.memory else {}
        t.add_row(escape(d), str(nodes.get(d, 0)), f"{res.compute_s.get(d, 0.0) * 1e3:.3f} ms", fmt_bytes(peaks[d]),
                  *(fmt_bytes(split.get(part, 0)) for part in parts),
                  fmt_bytes(int(usable_bytes(cluster, d, budget=budget, reserve=reserve))),
                  "[red]no[/red]" if d in over else "yes")
    console.print(t)
    busy = {k: v for k, v in sorted(res.link_s.items()) if v > 0}
    if busy:
        console.print("link busy: " + ", ".join(f"{escape(k)} {v * 1e3:.3f} ms" for k, v in busy.items()))
    else:
        console.print("link busy: none (no transfers)")
    return not over


def simulation_line(res: SimResult, graph: OpGraph, fits: bool, replicas: int = 1) -> str:
    """``simulated iteration time … ms; … samples/s; max per-device peak …; fits yes|no`` (the
    samples of every one of ``replicas``)."""
    rate = graph.batch_size * replicas / res.time_s if graph.batch_size and res.time_s > 0 else float("nan")
    return (f"simulated iteration time {res.time_s * 1e3:.3f} ms; {rate:.1f} samples/s; "
            f"max per-device peak {fmt_bytes(res.max_memory_bytes)}; fits {'yes' if fits else 'no'}")
