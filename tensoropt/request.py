"""What to explore — :class:`Request` — with each field's command-line option declared beside it.

A field that a person sets carries an :class:`Option` in its metadata: its flag, its help and
how its text becomes the field's value.  The CLI builds its options from these
(:func:`tensoropt.cli._common.add_request_options`, the way torchtitan builds its command line
from its config dataclass) and reads them back into a request; the dashboard's controls start
at the same defaults (:func:`default_of`).  A field's flag, help text and default are written
here and nowhere else.

Example::

    >>> from tensoropt.request import Request, default_of, option_of
    >>> option_of("max_walks").flag, default_of("repeats"), default_of("warmup")
    ('--max-walks', 5, 1)
    >>> Request("zoo:gpt2?layers=2", "preset:v100-8-nvlink", budget="16GiB").budget
    17179869184

It owns the request's fields, their defaults, their checks and their options; it must not parse
a command line (the CLI does) nor run anything (:mod:`tensoropt.workflow` does).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from .cluster.units import parse_size
from .compare import solver_options
from .devicemodel.price import COSTS_FROM
from .errors import TensorOptError
from .frontier.track import DEFAULT_MAX_WALKS
from .graph import PRECISIONS
from .graph import check_precision as check_precision_name
from .optimizers import DEFAULT_OPTIMIZER, OPTIMIZER_ALPHA, optimizer_alpha
from .placers import PLACERS
from .planmodel.fits import check_budget_value
from .planmodel.pipelined import LOOPED

#: a :class:`Request` or a subclass of it (the dashboard's): what :meth:`Request.from_dict` returns
#: (``typing.Self`` needs Python 3.11; the package supports 3.10)
_RequestT = TypeVar("_RequestT", bound="Request")

#: the cluster source that means "this machine's GPUs, through NVML"
DETECTED = "detected"


@dataclass(frozen=True)
class Option:
    """How a person sets one :class:`Request` field on the command line.

    ``flag`` and ``help`` (``{default}`` in it is the field's default); ``type``: argparse's
    conversion of the text (a bad value is argparse's one-line error); ``read``: a conversion after
    parsing that names the option in its :class:`~tensoropt.errors.TensorOptError` (sizes);
    ``negated``: a ``store_true`` flag that sets the field to ``False`` (``--no-cache``);
    ``required``: the field has no default."""

    flag: str
    help: str
    type: Callable[[str], Any] | None = None
    read: Callable[[str, str], Any] | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    negated: bool = False
    required: bool = False

    @property
    def dest(self) -> str:
        """argparse's attribute for the flag (``--max-walks`` → ``max_walks``)."""
        return self.flag.lstrip("-").replace("-", "_")


def device_names(text: str) -> tuple[str, ...]:
    """``--devices gpu0,gpu1`` → ``("gpu0", "gpu1")`` (blanks dropped); argparse reports none."""
    names = tuple(d.strip() for d in text.split(",") if d.strip())
    if not names:
        raise argparse.ArgumentTypeError("--devices must name devices, e.g. gpu0,gpu1")
    return names


def shard_degrees(text: str) -> tuple[int, ...]:
    """``--degrees 1,2,4`` → ``(1, 2, 4)``; argparse reports a bad value."""
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--degrees must be comma-separated integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError("--degrees must be positive integers")
    return ks


def microbatch_counts(text: str) -> tuple[int, ...] | None:
    """``--microbatches 2,4`` → ``(2, 4)``; ``auto`` → ``None``; argparse reports a bad value."""
    if text.strip().lower() == "auto":
        return None
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--microbatches takes auto or comma-separated counts, e.g. 2,4; got "
                                         f"{text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError("--microbatches counts must be whole numbers ≥ 1")
    return ks


def replicate_degrees(text: str) -> tuple[int, ...]:
    """``--dp-replicate 2,4`` → ``(2, 4)``; ``none`` → ``()``; argparse reports a bad value."""
    if text.strip().lower() in ("none", ""):
        return ()
    try:
        ks = tuple(dict.fromkeys(int(k) for k in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--dp-replicate takes comma-separated degrees, e.g. 2,4, or none; got "
                                         f"{text!r}") from None
    if any(k < 2 for k in ks):
        raise argparse.ArgumentTypeError("--dp-replicate degrees must be whole numbers ≥ 2 (1 is FSDP, always priced)")
    return ks


def pipeline_schedules(text: str) -> tuple[str, ...]:
    """``--pipelines 1f1b,gpipe`` → ``("1f1b", "gpipe")``; ``all`` → every schedule priced
    (:data:`~tensoropt.planmodel.pipelined.LOOPED`); ``none`` → ``()``; argparse reports a bad name."""
    word = text.strip().lower()
    if word in ("none", ""):
        return ()
    if word == "all":
        return LOOPED
    names = tuple(dict.fromkeys(s.strip() for s in word.split(",") if s.strip()))
    bad = [s for s in names if s not in LOOPED]
    if bad:
        raise argparse.ArgumentTypeError(f"schedule {bad[0]!r} is not priced; the priced ones are "
                                         f"{', '.join(LOOPED)} (or all, none)")
    return names


def _size(text: str, flag: str) -> int:
    return parse_size(text, flag)


def _size_or_zero(text: str, flag: str) -> int:
    return parse_size(text, flag, allow_zero=True)


def _opt(default: Any, flag: str, help: str, **how: Any) -> Any:
    """A field with a default and its :class:`Option`."""
    return field(default=default, metadata={"option": Option(flag, help, **how)})


@dataclass(frozen=True)
class Request:
    """What to explore.

    ``model``: a model spec (``zoo:NAME?k=v``, ``file.py:factory``, an ``.onnx`` file or a saved
    ``graph.json``); ``cluster``: ``preset:NAME``, a cluster file, or :data:`DETECTED`;
    ``batch``: overrides the model's batch size; ``devices``: the devices plans may use (``None``:
    all); ``optimizer`` and ``precision`` (``fp32`` / ``bf16``; ``None``: fp32, or a saved graph's
    own) are what training runs with; ``budget`` (bytes per device, ``None``: each device's own
    memory) and ``reserve`` (bytes the framework keeps on every device) decide what fits;
    ``profile``: a saved profile of the model to use instead of measuring; ``degrees``: shard
    degrees to profile instead of :func:`~tensoropt.workflow.profile_degrees`' (ignored with
    ``profile``); ``device``: where to profile (``cpu`` or ``cuda[:N]``); ``repeats`` / ``warmup``:
    profiling's timed and untimed calls per operator; ``frontier``:
    whether to track the frontier; ``algos``: the baseline placers to run (``None``: all, ``()``:
    none); ``time_limit``: the MILP placers' solver limit in seconds; ``resolution`` and
    ``max_walks``: frontier tracking's memory resolution in bytes and walk limit;
    ``costs_from``: ``auto`` (measured where the profiled device is the cluster's kind, else the
    cluster kind's device model), ``measured`` (refuse another kind) or ``model`` (always the
    device model); ``calibration``: a calibration file for the device model
    (:mod:`tensoropt.devicemodel`); ``replicas``: on a cluster of several hosts of one shape,
    also the 2-D plans — data parallel across the hosts, the search's plans inside each
    (:mod:`tensoropt.frontier.replicas`: the model captured and profiled again at one host's
    slice of the batch); ``microbatches``: the counts of micro-batches a step may be cut into
    (gradient accumulation: :func:`tensoropt.workflow.join_microbatches`; ``None``: only where no
    plan of whole steps fits); ``pipelines``: the pipeline schedules whose plans join the frontier
    (:func:`tensoropt.workflow.join_pipelines`; ``()``: none); ``dp_replicate``: HSDP's replicate
    degrees for the FSDP × TP recipes across hosts (:func:`tensoropt.frontier.replicas.fsdp_tp_recipes`:
    the hosts in that many replicate groups, FSDP2 sharding inside each; ``()``: FSDP over all hosts
    only); ``cache``: read and keep captures and
    untimed profiles in the cache folder
    (``cache_dir``, else :func:`tensoropt._cache.cache_root`'s), so that a second request for the
    same model costs the search only — ``False``: capture and profile afresh (measured calls too).

    A ``budget`` or ``reserve`` may be given as a size (``"16GiB"``): it is kept in bytes.
    """

    model: str
    cluster: str = field(metadata={"option": Option("--cluster", "preset:NAME or a cluster YAML / JSON file",
                                                    required=True)})
    batch: int | None = _opt(None, "--batch", "batch size (overrides the model's default)", type=int)
    devices: tuple[str, ...] | None = _opt(
        None, "--devices", "the devices plans may use, comma-separated (default: all of the cluster's)",
        type=device_names, metavar="NAMES")
    optimizer: str = _opt(DEFAULT_OPTIMIZER, "--optimizer",
                          "what training steps with, which sizes the optimizer state: adamw / adam 2 ×, momentum "
                          "1 ×, sgd 0 × the parameters (default {default})", choices=tuple(OPTIMIZER_ALPHA))
    precision: str | None = _opt(
        None, "--precision",
        "what the model trains in: fp32 (default; a saved graph.json keeps its own), bf16 (mixed precision: "
        "captured, profiled and run under torch.autocast, float32 weights) or bf16-params (FSDP2's "
        "MixedPrecisionPolicy: every operator on bfloat16 copies of float32 master weights, gradients reduced in "
        "float32; run through tensoropt export)", choices=PRECISIONS)
    budget: int | None = _opt(None, "--budget",
                              "memory per device, e.g. 16GiB: a plan fits when every device's peak is within "
                              "min(its memory, budget) − reserve", read=_size, metavar="SIZE")
    reserve: int = _opt(0, "--reserve",
                        "memory the framework keeps on every device beside the model (CUDA context, allocator "
                        "slack), e.g. 600MiB (default {default})", read=_size_or_zero, metavar="SIZE")
    profile: str | None = _opt(None, "--profile",
                               "use this saved profile of MODEL (made by `tensoropt profile MODEL -o P`; checked "
                               "against the graph) instead of profiling", metavar="PROFILE_JSON")
    degrees: tuple[int, ...] | None = _opt(
        None, "--degrees", "shard degrees to profile, comma-separated (default: the mesh sizes); ignored with "
                           "--profile", type=shard_degrees)
    device: str = _opt("cpu", "--device", "where to profile: cpu or cuda[:N] (default {default})")
    repeats: int = _opt(5, "--repeats", "profiling: timed repeats per operator call (median; default {default})",
                        type=int)
    warmup: int = _opt(1, "--warmup", "profiling: untimed calls first (default {default})", type=int)
    frontier: bool = _opt(True, "--no-frontier", "leave out the frontier", negated=True)
    algos: tuple[str, ...] | None = ()
    time_limit: float | None = _opt(None, "--time-limit",
                                    "time limit of each MILP placer's solver (netsplit, pesto; default: the "
                                    "placer's own)", type=float, metavar="SECONDS")
    resolution: int | None = _opt(None, "--resolution",
                                  "memory resolution of the frontier (0 = exact; default: 1/1000 of min(smallest "
                                  "device memory, the largest memory a plan can need))",
                                  read=_size_or_zero, metavar="SIZE")
    max_walks: int = _opt(DEFAULT_MAX_WALKS, "--max-walks",
                          "plans walked per mesh (the search's candidates, then the polish around the frontier) "
                          "before the polish stops (default {default}; 0: the search's candidates only)",
                          type=int, metavar="N")
    costs_from: str = _opt("auto", "--costs-from",
                           "operator times: auto (measured where the profile's device is the cluster's kind, else "
                           "the cluster kind's device model), measured (refuse another kind), model (always the "
                           "device model; default {default})", choices=COSTS_FROM)
    calibration: str | None = _opt(None, "--calibration",
                                   "the device model's calibration (made by `tensoropt calibrate`; default: the one "
                                   "shipped for the kind, else the uncalibrated datasheet model)",
                                   metavar="CALIBRATION_JSON")
    replicas: bool = True
    microbatches: tuple[int, ...] | None = _opt(
        None, "--microbatches",
        "steps cut into micro-batches (gradient accumulation), comma-separated counts, e.g. 2,4: the search runs "
        "again on the model captured at each micro-batch and those plans join the frontier; auto (default): only "
        "where no plan of whole steps fits, the fewest of 2, 4, 8, … micro-batches whose plans fit; 1: whole steps "
        "only", type=microbatch_counts, metavar="K,…|auto")
    pipelines: tuple[str, ...] = _opt(
        (), "--pipelines",
        "pipeline plans on the frontier: the schedules to price, comma-separated (gpipe, 1f1b, interleaved-1f1b, "
        "looped-bfs, interleaved-zb), or all: every pipeline over the devices (2, 4, … ranks, data-parallel copies of "
        "it over the rest) at ranks × 1, 2, 4 micro-batches and micro-batches of one row, blocks kept and "
        "checkpointed (kept only for interleaved-zb), each on the model captured at its micro-batch (default none)",
        type=pipeline_schedules, metavar="SCHEDULES|all|none")
    dp_replicate: tuple[int, ...] = _opt(
        (), "--dp-replicate",
        "on a cluster of several hosts, torchtitan's HSDP × TP recipes beside FSDP × TP: the hosts in that many "
        "replicate groups (comma-separated degrees dividing the hosts, e.g. 2,4), FSDP2 sharding over the hosts of a "
        "group and all-reducing each shard's gradients over the groups (default none)",
        type=replicate_degrees, metavar="R,…|none")
    cache: bool = _opt(True, "--no-cache",
                       "capture and profile afresh: read nothing from the cache folder and keep nothing there "
                       "(captures, untimed profiles, measured operator calls)", negated=True)
    cache_dir: str | None = _opt(None, "--cache-dir",
                                 "the cache folder (default $TENSOROPT_CACHE_DIR, else ~/.cache/tensoropt). A model "
                                 "is known by its zoo name and parameters, an hf: config's content and query, or a "
                                 "factory file's content (not the files it imports: edit those, and pass "
                                 "--no-cache)", metavar="DIR")

    def __post_init__(self) -> None:
        # sizes given as text are read as their option reads them and kept in bytes (a frozen
        # dataclass sets its own fields through object's)
        for f in dataclasses.fields(self):
            option = f.metadata.get("option")
            value = getattr(self, f.name)
            if option is not None and option.read is not None and isinstance(value, str):
                object.__setattr__(self, f.name, option.read(value, f.name))
        if self.batch is not None and (isinstance(self.batch, bool) or int(self.batch) != self.batch or self.batch < 1):
            raise TensorOptError(f"batch size must be a positive integer, got {self.batch!r}")
        if self.repeats < 1 or self.warmup < 0:
            raise TensorOptError("profiling repeats must be ≥ 1 and warm-up calls ≥ 0")
        if self.devices is not None and not self.devices:
            raise TensorOptError("choose at least one device")
        if self.degrees is not None and (not self.degrees or any(k < 1 for k in self.degrees)):
            raise TensorOptError(f"shard degrees must be positive integers, got {self.degrees!r}")
        if self.reserve < 0:
            raise TensorOptError(f"the reserve must be ≥ 0 bytes, got {self.reserve}")
        if self.max_walks < 0:
            raise TensorOptError(f"max_walks must be ≥ 0, got {self.max_walks}")
        if self.microbatches is not None and (not self.microbatches or any(
                isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.microbatches)):
            raise TensorOptError(f"micro-batch counts must be whole numbers ≥ 1, got {self.microbatches!r}")
        if any(isinstance(k, bool) or not isinstance(k, int) or k < 2 for k in self.dp_replicate):
            raise TensorOptError(f"HSDP's replicate degrees must be whole numbers ≥ 2, got {self.dp_replicate!r}")
        optimizer_alpha(self.optimizer)          # an unknown optimizer names the choices
        check_precision_name(self.precision)     # so does an unknown precision
        check_budget_value(self.budget)
        unknown = [a for a in self.algos or () if a not in PLACERS]
        if unknown:
            raise TensorOptError(f"unknown placer {unknown[0]!r}; known: {', '.join(PLACERS)}")
        solver_options(self.placers, self.time_limit)   # a non-positive limit is refused here
        if self.costs_from not in COSTS_FROM:
            raise TensorOptError(f"costs_from must be one of {', '.join(COSTS_FROM)}, got {self.costs_from!r}")

    @property
    def cache_folder(self) -> bool | str:
        """Where captures and profiles are kept, as :meth:`LoadedModel.capture
        <tensoropt.modelspec.LoadedModel.capture>` and :func:`~tensoropt.measure.profile` take it:
        ``False`` (no cache), ``True`` (the default folder) or a folder."""
        return False if not self.cache else self.cache_dir or True

    @property
    def placers(self) -> tuple[str, ...]:
        """The baseline placers to run, in :data:`~tensoropt.placers.PLACERS` order when all."""
        return tuple(PLACERS) if self.algos is None else tuple(self.algos)

    def to_dict(self) -> dict[str, Any]:
        """A JSON value (tuples as lists); :meth:`from_dict` reads it back."""
        d = asdict(self)
        for k in _TUPLE_FIELDS:
            d[k] = list(d[k]) if d[k] is not None else None
        return d

    @classmethod
    def from_dict(cls: type[_RequestT], d: dict[str, Any]) -> _RequestT:
        """The request (of this class: the dashboard's subclass reads its own) :meth:`to_dict` wrote."""
        d = dict(d)
        for k in _TUPLE_FIELDS:
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        return cls(**d)


_FIELDS = {f.name: f for f in dataclasses.fields(Request)}
#: the fields that hold tuples: lists in JSON (:meth:`Request.to_dict`), tuples again when read back
_TUPLE_FIELDS = ("devices", "degrees", "algos", "microbatches", "pipelines", "dp_replicate")


def option_of(name: str) -> Option:
    """The :class:`Option` of :class:`Request`'s field ``name`` (a field nobody sets by a flag:
    ``KeyError``)."""
    option = _FIELDS[name].metadata.get("option")
    if option is None:
        raise KeyError(f"Request.{name} has no command-line option")
    return option


def default_of(name: str) -> Any:
    """:class:`Request`'s default for the field ``name``: what the CLI's option and the
    dashboard's control start at."""
    default = _FIELDS[name].default
    if default is dataclasses.MISSING:
        raise KeyError(f"Request.{name} has no default")
    return default


def help_of(name: str) -> str:
    """The field's help text with its default written in."""
    option = option_of(name)
    return option.help.replace("{default}", str(default_of(name))) if "{default}" in option.help else option.help


#: the fields every exploring command (``frontier``, ``compare``, ``place``) sets by an option
EXPLORING = ("cluster", "batch", "devices", "budget", "reserve", "precision", "optimizer", "profile", "costs_from",
             "calibration", "repeats", "cache", "cache_dir")

__all__ = ["DETECTED", "EXPLORING", "Option", "Request", "default_of", "device_names", "help_of", "option_of",
           "shard_degrees"]
