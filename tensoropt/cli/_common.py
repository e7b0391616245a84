"""What several ``tensoropt`` commands share: the options more than one command takes (one
``add_*`` helper per option, so a flag means the same everywhere), their argument types and
checks, capturing a model spec, getting its costs, and printing a simulated plan.

It owns no command: nothing here registers a subcommand or reads an option only one command
has; a command module imports these pieces and keeps its own options and output.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from os import PathLike
from typing import Any, Protocol

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..cluster import Cluster
from ..cluster.units import parse_size
from ..describe import fmt_bytes
from ..devicemodel.price import COSTS_FROM, Priced, price, prices_by_model
from ..errors import TensorOptError
from ..graph import PRECISIONS, OpGraph
from ..measure.kept import profiling_on
from ..modelspec import load_model
from ..optimizers import DEFAULT_OPTIMIZER, OPTIMIZER_ALPHA
from ..plan import Plan
from ..planmodel.fits import check_budget_value, over_by, usable_bytes
from ..planmodel.simulate import SimResult
from ..workflow import Request, read_profile
from ._progress import ProgressBars

CLUSTER_HELP = "preset:NAME or a cluster YAML / JSON file"
BATCH_HELP = "batch size (overrides the model's default)"


# ---- argument types ------------------------------------------------------------------------
def degrees(text: str) -> tuple[int, ...]:
    """``--degrees 1,2,4`` → ``(1, 2, 4)``; argparse reports a bad value."""
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--degrees must be comma-separated integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError("--degrees must be positive integers")
    return ks


def device_names(text: str) -> list[str]:
    """``--devices gpu0,gpu1`` → ``["gpu0", "gpu1"]`` (blanks dropped); argparse reports none."""
    names = [d.strip() for d in text.split(",") if d.strip()]
    if not names:
        raise argparse.ArgumentTypeError("--devices must name devices, e.g. gpu0,gpu1")
    return names


# ---- options several commands take ---------------------------------------------------------
def add_cluster_argument(p: argparse.ArgumentParser) -> None:
    """``--cluster`` (required): the cluster plans run on."""
    p.add_argument("--cluster", required=True, help=CLUSTER_HELP)


def add_batch_argument(p: argparse.ArgumentParser, help: str = BATCH_HELP) -> None:
    """``--batch``: the batch size the model is captured at."""
    p.add_argument("--batch", type=int, help=help)


def add_capture_arguments(p: argparse.ArgumentParser, model_help: str) -> None:
    """MODEL and how to capture it (``--batch``, ``--batch-dim``, ``--precision``, ``--no-cache`` /
    ``--cache-dir``): read them with :func:`capture_spec`."""
    p.add_argument("model", help=model_help)
    add_batch_argument(p)
    p.add_argument("--batch-dim", type=int, default=0, help="batch dimension of the inputs (default 0)")
    add_precision_argument(p)
    add_cache_arguments(p)


def add_cache_arguments(p: argparse.ArgumentParser) -> None:
    """``--no-cache`` and ``--cache-dir DIR``: whether captures, untimed profiles and measured calls
    are read from and kept in the cache folder (:mod:`tensoropt._cache`), and which; read them with
    :func:`cache_of`."""
    p.add_argument("--no-cache", action="store_true",
                   help="capture and profile afresh: read nothing from the cache folder and keep nothing there "
                        "(captures, untimed profiles, measured operator calls)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="the cache folder (default $TENSOROPT_CACHE_DIR, else ~/.cache/tensoropt). A model is "
                        "known by its zoo name and parameters, an hf: config's content and query, or a factory "
                        "file's content (not the files it imports: edit those, and pass --no-cache)")


def cache_of(args: argparse.Namespace) -> bool | str:
    """The cache :func:`add_cache_arguments`' options name: ``False`` (``--no-cache``), the
    ``--cache-dir`` folder, or ``True`` (the default folder)."""
    if getattr(args, "no_cache", False):
        return False
    return getattr(args, "cache_dir", None) or True


def add_devices_argument(p: argparse.ArgumentParser, help: str) -> None:
    """``--devices gpu0,gpu1``: the devices plans may use (read as :func:`device_names`)."""
    p.add_argument("--devices", type=device_names, metavar="NAMES", help=help)


def add_optimizer_argument(p: argparse.ArgumentParser, help: str) -> None:
    """``--optimizer``: what sizes the optimizer state (default adamw)."""
    p.add_argument("--optimizer", choices=tuple(OPTIMIZER_ALPHA), default=DEFAULT_OPTIMIZER, help=help)


def add_profile_argument(p: argparse.ArgumentParser, help: str) -> None:
    """``--profile PROFILE_JSON``: a saved profile used instead of measuring."""
    p.add_argument("--profile", metavar="PROFILE_JSON", help=help)


def add_repeats_argument(p: argparse.ArgumentParser, *, default: int = 3) -> None:
    """``--repeats``: profiling's timed calls per operator (checked by :func:`check_repeats`)."""
    p.add_argument("--repeats", type=int, default=default,
                   help=f"profiling: timed repeats per op call (median; default {default})")


def check_repeats(args: argparse.Namespace) -> None:
    """Refuse ``--repeats`` below 1 before any work."""
    if args.repeats < 1:
        raise TensorOptError("--repeats must be ≥ 1")


def add_request_arguments(p: argparse.ArgumentParser, *, devices_help: str, optimizer_help: str, profile_help: str,
                          repeats: int = 3) -> None:
    """The options :func:`workflow_request` reads, the same on every command that explores:
    ``--cluster``, ``--batch``, ``--devices``, ``--budget`` / ``--reserve``, ``--precision``,
    ``--optimizer``, ``--profile``, ``--costs-from`` / ``--calibration``, ``--repeats``
    (default ``repeats``) and ``--no-cache`` / ``--cache-dir``."""
    add_cluster_argument(p)
    add_batch_argument(p)
    add_devices_argument(p, devices_help)
    add_fit_arguments(p)
    add_precision_argument(p)
    add_optimizer_argument(p, optimizer_help)
    add_profile_argument(p, profile_help)
    add_costs_from_arguments(p)
    add_repeats_argument(p, default=repeats)
    add_cache_arguments(p)


def add_costs_from_arguments(p: argparse.ArgumentParser) -> None:
    """``--costs-from`` and ``--calibration``: where operator times come from
    (:func:`tensoropt.devicemodel.price`)."""
    p.add_argument("--costs-from", choices=COSTS_FROM, default="auto",
                   help="operator times: auto (measured where the profile's device is the cluster's kind, else the "
                        "cluster kind's device model), measured (refuse another kind), model (always the device "
                        "model; default auto)")
    p.add_argument("--calibration", metavar="CALIBRATION_JSON",
                   help="the device model's calibration (made by `tensoropt calibrate`; default: the one shipped for "
                        "the kind, else the uncalibrated datasheet model)")


def print_times_from(console: Console, source: str, notes: Iterable[str] = ()) -> None:
    """The header line every exploring command prints: where its times come from, and what
    pricing decided (speeds given, kinds assumed)."""
    console.print(f"times: {escape(source)}", highlight=False)
    for n in notes:
        console.print(f"[dim]  {escape(n)}[/dim]", highlight=False)


def add_precision_argument(p: argparse.ArgumentParser) -> None:
    """``--precision {fp32,bf16,bf16-params}``: what the model trains in
    (:mod:`tensoropt.capture.precision`), the same on every command; read it with
    ``capture_spec(…, precision=args.precision)``."""
    p.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="what the model trains in: fp32 (default; a saved graph.json keeps its own), bf16 "
                        "(mixed precision: captured, profiled and run under torch.autocast, float32 weights) or "
                        "bf16-params (FSDP2's MixedPrecisionPolicy: every operator on bfloat16 copies of float32 "
                        "master weights, gradients reduced in float32; run through tensoropt export)")


def add_fit_arguments(p: argparse.ArgumentParser, *, budget: bool = True) -> None:
    """``--budget`` (a uniform cap per device) and ``--reserve`` (what the framework keeps on every
    device): the inputs of :func:`tensoropt.planmodel.fits.fits`, the same on every command."""
    if budget:
        p.add_argument("--budget", metavar="SIZE",
                       help="memory per device, e.g. 16GiB: a plan fits when every device's peak is within "
                            "min(its memory, budget) − reserve")
    p.add_argument("--reserve", metavar="SIZE", default="0",
                   help="memory the framework keeps on every device beside the model (CUDA context, allocator "
                        "slack), e.g. 600MiB (default 0)")


def fit_options(args: argparse.Namespace) -> tuple[int | None, int]:
    """``(budget, reserve)`` in bytes from :func:`add_fit_arguments`' options (a bad size names its option)."""
    text = getattr(args, "budget", None)
    budget = parse_size(text, "--budget") if text is not None else None
    check_budget_value(budget, "--budget")
    reserve = int(parse_size(args.reserve, "--reserve", allow_zero=True))
    return budget, reserve


def workflow_request(args: argparse.Namespace, **rest: Any) -> Request:
    """The workflow's :class:`~tensoropt.workflow.Request` from the options every exploring
    command has (MODEL, ``--cluster``, ``--batch``, ``--optimizer``, ``--precision``,
    ``--devices``, ``--profile``, ``--repeats``, ``--no-cache`` / ``--cache-dir``) and the
    command's own fields ``rest``."""
    return Request(args.model, args.cluster, batch=args.batch, optimizer=args.optimizer, precision=args.precision,
                   devices=tuple(args.devices) if args.devices is not None else None, profile=args.profile,
                   repeats=args.repeats, costs_from=args.costs_from, calibration=args.calibration,
                   cache=not args.no_cache, cache_dir=args.cache_dir, **rest)


# ---- model and costs -----------------------------------------------------------------------
def capture_spec(spec: str, console: Console, *, batch: int | None = None, batch_dim: int = 0,
                 precision: str | None = None, plan: Plan | None = None, method: str = "auto",
                 cache: bool | str = False) -> OpGraph:
    """Load a model spec (zoo:…, file.py:factory, .onnx, graph.json) and capture it in ``precision``
    (``--precision``; ``None``: fp32, or a saved graph's own), with a status line — for a ``plan``
    with replicas, its first replica's slice of the batch (:func:`~tensoropt.execute.replicas.call_for_capture`).
    ``cache`` (:func:`cache_of`): read the graph from the capture cache where kept (it then has no
    module: not for a timed profile), else keep it there."""
    from ..execute.replicas import call_for_capture

    loaded = load_model(spec, batch=batch, lazy=True)
    with console.status(f"capturing {escape(spec)} …"):
        if plan is not None and plan.replicas and not loaded.is_file:
            return loaded.capture(batch_dim=batch_dim, precision=precision, method=method, cache=cache,
                                  call=lambda call: call_for_capture(call, plan, batch_dim),
                                  call_key=f"plan replica: batch {plan.batch_size} of {plan.global_batch_size}")
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
