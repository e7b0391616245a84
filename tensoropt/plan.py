"""Plan: how to run one training step of one graph on a cluster — what every producer of plans
(frontier tracking, every baseline placer) returns and every consumer (simulator, executor,
dashboard, CSV) takes.

A plan gives every operator node a :class:`NodeConfig` — the ordered group of devices it runs
on (its *mesh*; one device = plain placement), its layout on that mesh and whether its
activations are recomputed — plus an execution order and the estimates made of it
(:class:`Estimate`: iteration time and per-device peak memory, and which model made them).
It is a JSON value (``"format": "tensoropt.plan/3"``) that carries the fingerprint of the graph
it belongs to, so a plan is never applied to another model (nnScaler #28: a plan silently reused
after the batch size changed).

Layouts (:class:`Layout`): ``R`` replicate (every device runs the whole op), ``batch``
(``S(batch)``: each device a slice of the batch), ``channel`` (``S(channel)``: each device a slice
of the output channels, weights split too), ``reduce`` (``P``: each device a slice of the input
features, partial sums added afterwards).  A configuration holds its layout as a :class:`Layout`
(given as the plain string ``"batch"`` or as the member: the same configuration), which equals,
hashes and serialises as the string, so plan JSON is unchanged, and carries the predicates
(``cfg.layout.cuts_params``).  The layouts of *tensors* between nodes
(``S(batch)``, ``P`` …) are :class:`tensoropt.layouts.TensorLayout`; both live in
:mod:`tensoropt.layouts`, the layout vocabulary (re-exported here).

This module holds data and checks only: it never costs a plan (:mod:`tensoropt.planmodel`) and
never imports torch-facing code, so every package may import it.

Example::

    >>> cfg = NodeConfig(("gpu0", "gpu1"), "channel")
    >>> cfg.param_pieces, cfg.layout.cuts_params, cfg.to_dict()["layout"]
    (2, True, 'channel')
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._io import RawJSON, graph_file_header, read_json, write_json_atomic
from .errors import GraphFormatError, TensorOptError
from .layouts import LAYOUTS, Layout, Shard, largest_piece, param_pieces, piece_range, piece_sizes

# for annotations only: the graph and the cluster import nothing of this module, but the cluster is a layer above
if TYPE_CHECKING:
    from .cluster import Cluster
    from .graph import OpGraph

PLAN_FORMAT = "tensoropt.plan/3"
#: formats a plan file may have: version 1 has no sharding levels (every node's is ``NONE``),
#: versions 1 and 2 no replicas (every plan runs on the devices its configurations name)
PLAN_FORMATS = ("tensoropt.plan/1", "tensoropt.plan/2", PLAN_FORMAT)

#: what runs a plan, and so what its memory and time are priced as (:attr:`Plan.runtime`, kept in
#: ``options["runtime"]``): ``executor`` — tensoropt's own executor (:mod:`tensoropt.execute`,
#: :mod:`tensoropt.distributed`: every operator's parameters gathered, freed and reduced on its own);
#: ``fsdp2`` — PyTorch's FSDP2 as ``tensoropt export`` writes it for a data-parallel plan whose
#: parameters are sharded at level 3: ``fully_shard`` on every repeated block, then on the model
#: (its root unit holds the rest), the last block kept gathered after forward, a
#: ``MixedPrecisionPolicy`` for a ``bf16-params`` graph (:mod:`tensoropt.planmodel.walk` says what
#: each holds); ``ddp`` — PyTorch's ``DistributedDataParallel`` as ``tensoropt export`` writes it
#: for a data-parallel plan without sharding (default buckets: a flat copy of the gradients, beside
#: each ``.grad``); ``zero1`` — the same with ``ZeroRedundancyOptimizer`` (each rank the optimizer
#: state of the whole parameters it steps) for a plan sharded at level 1
#: (:mod:`tensoropt.planmodel.wrappers` says what the wrappers hold); ``pipelining`` — PyTorch's
#: :mod:`torch.distributed.pipelining` running each stage's operators on its rank under PyTorch's
#: own autograd (one micro-batch's step, :mod:`tensoropt.planmodel.pipelined`); ``dtensor`` — PyTorch's
#: tensor parallelism as ``tensoropt export`` writes it for a plan its styles express
#: (:func:`tensoropt.planmodel.tensorparallel.tensor_parallel_modules`): ``parallelize_module`` on
#: the plan's devices, PyTorch's autograd, each parameter's ``.grad`` made at its backward (no flat
#: buffer: a parameter every rank reads whole gets the same gradient on each)
RUNTIMES = ("executor", "fsdp2", "ddp", "zero1", "pipelining", "dtensor")


class PlanError(TensorOptError):
    """A plan does not fit the graph or cluster it is used with; the message says which node and why."""


@dataclass(frozen=True)
class NodeConfig:
    """How one node runs: on which devices (in mesh order), in which layout, recomputed or not,
    and how much of its parameters each device keeps (``shard``, :class:`~tensoropt.layouts.Shard`:
    ZeRO's stages; ``NONE`` unless the node reads its parameters whole over several devices)."""

    devices: tuple[str, ...]
    layout: Layout = Layout.R      # a string given is made the member (a bad one: ValueError)
    recompute: bool = False
    shard: int = Shard.NONE

    def __post_init__(self) -> None:
        if type(self.layout) is not Layout:
            object.__setattr__(self, "layout", Layout(self.layout))

    @property
    def degree(self) -> int:
        return len(self.devices)

    @property
    def param_pieces(self) -> int:
        """Into how many pieces this configuration cuts its node's parameters (:func:`param_pieces`)."""
        return param_pieces(self.layout, self.degree)

    def to_dict(self) -> dict[str, Any]:
        return {"devices": list(self.devices), "layout": self.layout.value, "recompute": self.recompute,
                "shard": int(self.shard)}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> NodeConfig:
        if not isinstance(d, Mapping):
            raise GraphFormatError(f"{where} must be an object with devices, layout, recompute")
        devices = d.get("devices")
        if not isinstance(devices, list) or not devices or not all(isinstance(x, str) for x in devices):
            raise GraphFormatError(f"{where}.devices must be a non-empty list of device names")
        if len(set(devices)) != len(devices):
            raise GraphFormatError(f"{where}.devices names a device twice: {devices}")
        layout = d.get("layout", "R")
        if layout not in LAYOUTS:
            raise GraphFormatError(f"{where}.layout must be one of {LAYOUTS}, got {layout!r}")
        recompute = d.get("recompute", False)
        if not isinstance(recompute, bool):
            raise GraphFormatError(f"{where}.recompute must be true or false")
        shard = d.get("shard", 0)
        if isinstance(shard, bool) or shard not in tuple(Shard):
            raise GraphFormatError(f"{where}.shard must be a sharding level 0-3 (none, optimizer state, + "
                                   f"gradients, + parameters), got {shard!r}")
        return cls(tuple(devices), Layout(layout), recompute, Shard(shard))


def shardable(graph: OpGraph, name: str) -> tuple[str, ...]:
    """The trainable parameters node ``name`` owns and no other node reads: those its sharding
    level shards whatever the other nodes do (what PyTorch's own wrappers express:
    :mod:`tensoropt.export`).  A tied weight is sharded too where all its readers agree
    (:func:`sharded_parameters`, the rule)."""
    node = graph.nodes[name]
    qs = [q for q in (*node.params, *node.param_reads)
          if graph.params[q].is_trainable]
    if any(graph.params[q].readers or graph.params[q].owner != name for q in qs):
        return ()
    return tuple(qs)


def trainable_reads(graph: OpGraph, name: str) -> tuple[str, ...]:
    """The trainable parameters node ``name`` reads (owns or reads): those a sharding level of it
    may shard (:func:`sharded_parameters` says which it does)."""
    node = graph.nodes[name]
    return tuple(q for q in (*node.params, *node.param_reads)
                 if graph.params[q].is_trainable)


@dataclass(frozen=True)
class ShardedParameter:
    """One trainable parameter a plan's sharding levels keep in pieces: its ``level``, the
    ``devices`` of the mesh (in mesh order: device ``i`` keeps piece ``i``), the nodes that read
    it (``readers``, in the plan's order: its owner, or a tied weight's several), its element
    count and its bytes.  ``charged``: always True (the plan model charges every one; kept for
    the executors' older readers)."""

    name: str
    level: Shard
    devices: tuple[str, ...]
    readers: tuple[str, ...]
    numel: int
    nbytes: int = 0
    charged: bool = True

    @property
    def sizes(self) -> list[int]:
        """Every device's piece, in elements (mesh order)."""
        return piece_sizes(self.numel, len(self.devices))

    def bounds(self, index: int) -> tuple[int, int]:
        """``[start, end)`` of the flattened parameter kept at place ``index`` of the mesh."""
        return piece_range(self.numel, len(self.devices), index)

    @property
    def piece_nbytes(self) -> int:
        """Bytes of the largest piece (the first ranks'): ``⌈numel / k⌉`` elements."""
        return piece_nbytes(self.numel, self.nbytes, len(self.devices))


def piece_nbytes(numel: int, nbytes: int, k: int) -> int:
    """Bytes of the largest of ``k`` pieces of a flattened tensor of ``numel`` elements and
    ``nbytes`` bytes: ``⌈numel / k⌉ × itemsize`` (what the first ranks hold; up to itemsize − 1
    bytes more than ``⌈nbytes / k⌉``)."""
    if numel <= 0:
        return largest_piece(nbytes, k)
    return largest_piece(numel, k) * (nbytes // numel)


def _shard_refusal(graph: OpGraph, configs: Mapping[str, NodeConfig], q: str) -> str | None:
    """Why trainable parameter ``q`` is not sharded under ``configs`` (None: it is)."""
    info = graph.params[q]
    nodes = [n for n in (info.owner, *info.readers) if n is not None]
    cfgs = {n: configs.get(n) for n in nodes}
    missing = [n for n, c in cfgs.items() if c is None]
    if missing:
        return f"{q!r} is also read by {missing[0]!r}, which the plan does not configure"
    levels = {Shard(c.shard) for c in cfgs.values() if c is not None}
    meshes = {tuple(c.devices) for c in cfgs.values() if c is not None}
    if levels == {Shard.NONE}:
        return f"{q!r}: no reader has a level"
    described = "; ".join(f"{n!r} level {int(c.shard)} on {','.join(c.devices)} as {c.layout!r}"
                          for n, c in cfgs.items() if c is not None)
    if len(levels) > 1 or len(meshes) > 1:
        return (f"its tied parameter {q!r} is read by {len(nodes)} nodes that do not share one level on one mesh "
                f"({described})")
    if any(c is not None and (c.degree < 2 or c.param_pieces > 1) for c in cfgs.values()):
        return f"its tied parameter {q!r} is cut or not replicated by one of its readers ({described})"
    return None


def sharded_parameters(graph: OpGraph, plan: Plan | Mapping[str, NodeConfig]) -> dict[str, ShardedParameter]:
    """The rule of which parameters a plan's sharding levels keep in pieces — the plan model's
    (:mod:`tensoropt.planmodel`) and the executors' (:mod:`tensoropt.execute.sharding`) alike.

    A trainable parameter is sharded at level ``L ≥ 1`` over mesh ``M`` when every node reading
    it (its owner and, for a tied weight, every other reader) runs with level ``L`` on the same
    mesh ``M`` of several devices, reading it whole (``R`` / ``batch``).  A parameter read by one
    node is sharded by that node's level alone; GPT-2's tied embedding / LM head only where both
    agree.  ``plan``: a :class:`Plan` or node → :class:`NodeConfig`.  O(V + parameters)."""
    configs = plan.configs if isinstance(plan, Plan) else plan
    order = {n: i for i, n in enumerate(plan.order if isinstance(plan, Plan) else configs)}
    seen: set[str] = set()
    out: dict[str, ShardedParameter] = {}
    for name, cfg in configs.items():
        if not cfg.shard:
            continue
        for q in trainable_reads(graph, name):
            if q in seen:
                continue
            seen.add(q)
            if _shard_refusal(graph, configs, q) is not None:
                continue
            info = graph.params[q]
            readers = tuple(sorted((n for n in (info.owner, *info.readers) if n is not None),
                                   key=lambda n: order.get(n, len(order))))
            out[q] = ShardedParameter(q, Shard(cfg.shard), tuple(cfg.devices), readers, info.numel, info.nbytes)
    return out


def _check_shard(graph: OpGraph, name: str, cfg: NodeConfig, sharded: Mapping[str, ShardedParameter],
                 configs: Mapping[str, NodeConfig]) -> None:
    """A sharding level needs parameters replicated over several devices that it shards: its own,
    or a tied weight whose every reader has the same level on the same mesh."""
    if cfg.degree < 2 or param_pieces(cfg.layout, cfg.degree) > 1:
        raise PlanError(f"node {name!r} shards its parameters (level {int(cfg.shard)}) but "
                        f"{'runs on one device' if cfg.degree < 2 else f'cuts them ({cfg.layout})'}: a sharding "
                        "level applies to parameters replicated over several devices (layout 'R' or 'batch')")
    qs = trainable_reads(graph, name)
    if any(q in sharded for q in qs):
        return
    if not qs:
        raise PlanError(f"node {name!r} shards its parameters (level {int(cfg.shard)}) but reads no trainable "
                        "parameter; give it shard 0")
    why = next(w for w in (_shard_refusal(graph, configs, q) for q in qs) if w is not None)
    raise PlanError(f"node {name!r} shards its parameters (level {int(cfg.shard)}) but shards none: {why} — a "
                    "tied weight is sharded only where every reader has the same level on the same mesh and reads "
                    "it whole; give the readers one level, or this node shard 0")


@dataclass(frozen=True)
class Estimate:
    """What a model predicts for a plan: iteration time and per-device peak memory.

    ``source`` names the model: ``"frontier"`` (TensorOpt's additive cost),
    ``"simulator"`` (event-driven), or a placer's own objective; ``times_from`` where the
    operator times it adds up come from ("measured on …" or a device model,
    :func:`tensoropt.devicemodel.costs_source`; empty where not recorded).
    """

    source: str
    time_s: float
    memory_bytes: Mapping[str, int] = field(default_factory=dict)
    times_from: str = ""

    @property
    def max_memory_bytes(self) -> int:
        return max(self.memory_bytes.values(), default=0)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source, "time_s": self.time_s, "memory_bytes": dict(self.memory_bytes)}
        if self.times_from:
            d["times_from"] = self.times_from
        return d

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Estimate:
        if not isinstance(d, Mapping) or not isinstance(d.get("source"), str):
            raise GraphFormatError(f"{where} must be an object with a string field 'source'")
        t = d.get("time_s")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            raise GraphFormatError(f"{where}.time_s must be a non-negative number, got {t!r}")
        mem = d.get("memory_bytes", {})
        if not isinstance(mem, Mapping) or not all(isinstance(v, int) and v >= 0 for v in mem.values()):
            raise GraphFormatError(f"{where}.memory_bytes must map device names to non-negative integers")
        times_from = d.get("times_from", "")
        if not isinstance(times_from, str):
            raise GraphFormatError(f"{where}.times_from must be a string, got {times_from!r}")
        return cls(d["source"], float(t), dict(mem), times_from)


def _whole_at_least_one(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


#: each field of ``options["pipeline"]``: what it must be, and the test of it
_PIPELINE_FIELDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "schedule": ("a schedule's name", lambda v: isinstance(v, str) and bool(v)),
    "stages_per_rank": ("a whole number ≥ 1", _whole_at_least_one),
    "checkpoint": ("true or false", lambda v: isinstance(v, bool)),
    "shard": ("true or false (absent: false)", lambda v: v is None or isinstance(v, bool)),
    "tp": ("a whole number ≥ 1 (absent: 1)", lambda v: v is None or _whole_at_least_one(v)),
    "tp_modules": ("an object of module path → tensor-parallel style (absent: none)",
                   lambda v: v is None or isinstance(v, Mapping) and all(isinstance(k, str) and isinstance(x, str)
                                                                         for k, x in v.items())),
    "starts": ("a list of operator names", _names),
    "checkpointed": ("a list of module names", _names),
    "split_points": ('a list of [module, "beginning" | "end"] pairs', lambda v: isinstance(v, list) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and p[1] in ("beginning", "end") for p in v)),
}


def options_problem(options: Mapping[str, Any]) -> str | None:
    """What is wrong with a plan's ``options`` — its ``microbatches`` (:attr:`Plan.microbatches`), its
    ``pipeline`` (:attr:`Plan.pipeline`) — naming the field, or ``None``: the one check of
    :meth:`Plan.check` and :meth:`Plan.from_dict`."""
    k = options.get("microbatches", 1)
    if not _whole_at_least_one(k):
        return f"options.microbatches must be a whole number ≥ 1 (the micro-batches a step runs), got {k!r}"
    r = options.get("dp_replicate", 1)
    if not _whole_at_least_one(r):
        return (f"options.dp_replicate must be a whole number ≥ 1 (the replicate groups of HSDP over the replicas), "
                f"got {r!r}")
    if r > 1 and options.get("runtime") != "fsdp2":
        return f"options.dp_replicate needs options.runtime 'fsdp2' (HSDP), got {options.get('runtime')!r}"
    spec = options.get("pipeline")
    if spec is None:
        return None
    if not isinstance(spec, Mapping):
        return "options.pipeline must be an object (schedule, stages_per_rank, checkpoint, starts, split_points)"
    if options.get("runtime") != "pipelining":
        return f"options.pipeline needs options.runtime 'pipelining', got {options.get('runtime')!r}"
    for key, (want, ok) in _PIPELINE_FIELDS.items():
        if not ok(spec.get(key)):
            return f"options.pipeline.{key} must be {want}, got {spec.get(key)!r}"
    return None


@functools.lru_cache(maxsize=1 << 16)
def _config_json(config: NodeConfig) -> RawJSON:
    """``config`` as the JSON text :meth:`Plan.save` writes for it, encoded once per configuration."""
    return RawJSON(json.dumps(config.to_dict()))


class Plan:
    """A configuration for every operator node, an execution order, and estimates.

    ``configs`` maps every ``kind="op"`` node of the graph to its :class:`NodeConfig`;
    ``order`` is the execution order (a topological order of those nodes; graph order when
    omitted).  ``algorithm`` and ``options`` say what made the plan.

    ``replicas``: the outer axis of a two-dimensional mesh (data parallel across hosts, the plan
    split inside each): ``()`` for a plan that runs on the devices its configurations name, else
    ``R ≥ 2`` groups of equal size, the first the plan's :attr:`devices` in order, each other the
    devices that play those roles in its replica (``replicas[r][i]`` runs what ``replicas[0][i]``
    runs).  Replica ``r`` runs the plan on its slice ``r`` of ``R`` of the step's batch — the
    graph is the model captured at that slice's batch (:attr:`batch_size` is the replica's,
    :attr:`global_batch_size` the step's) — and the gradients are averaged over the replicas, as
    PyTorch's DDP averages them (:func:`tensoropt.planmodel.reshard.replica_syncs` says which
    devices sum what).
    """

    def __init__(self, configs: Mapping[str, NodeConfig], *, graph_fingerprint: str, graph_name: str = "",
                 batch_size: int | None = None, cluster_name: str = "", cluster_fingerprint: str = "",
                 algorithm: str = "", options: Mapping[str, Any] | None = None, order: Iterable[str] | None = None,
                 estimates: Iterable[Estimate] = (), plan_id: str = "", notes: Iterable[str] = (),
                 replicas: Iterable[Iterable[str]] = ()):
        self.configs: dict[str, NodeConfig] = dict(configs)
        self.graph_fingerprint = graph_fingerprint
        self.graph_name = graph_name
        self.batch_size = batch_size
        self.cluster_name = cluster_name
        self.cluster_fingerprint = cluster_fingerprint
        self.algorithm = algorithm
        self.options = dict(options or {})
        self.order: list[str] = list(order) if order is not None else list(self.configs)
        self.estimates: list[Estimate] = list(estimates)
        self.plan_id = plan_id
        self.notes = list(notes)
        self.replicas: tuple[tuple[str, ...], ...] = tuple(tuple(g) for g in replicas)
        self._check_replicas()

    def _check_replicas(self) -> None:
        if not self.replicas:
            return
        first = tuple(self.devices)
        flat = [d for g in self.replicas for d in g]
        if len(self.replicas) < 2:
            raise PlanError(f"a plan with replicas needs at least two groups, got {len(self.replicas)}; "
                            "a plan on one group has no replicas")
        if self.replicas[0] != first:
            raise PlanError(f"the first replica group must be the devices the plan's configurations name, in order "
                            f"({', '.join(first)}), got {', '.join(self.replicas[0])}")
        if any(len(g) != len(first) for g in self.replicas):
            raise PlanError(f"every replica group must have {len(first)} device(s) (as the first), got "
                            f"{[len(g) for g in self.replicas]}")
        if len(set(flat)) != len(flat):
            twice = next(d for d in flat if flat.count(d) > 1)
            raise PlanError(f"device {twice!r} is in two replica groups; each device runs one replica")

    # ---- views -------------------------------------------------------------------------------
    @property
    def devices(self) -> list[str]:
        """Every device the plan uses, in order of first appearance along the execution order."""
        # an operator on the devices of the one before it adds none: a 70B's search asks this some ninety
        # times of plans of 4,000 operators, each on up to 256 devices (configs may change in place: no cache)
        seen: dict[str, None] = {}
        last: tuple[str, ...] = ()
        for name in self.order:
            devices = self.configs[name].devices
            if devices is not last and devices != last:
                seen.update(dict.fromkeys(devices))
                last = devices
        return list(seen)

    @property
    def all_devices(self) -> list[str]:
        """Every device the step runs on: the replicas' groups one after the other (a plan
        without replicas: :attr:`devices`)."""
        return [d for g in self.replicas for d in g] if self.replicas else self.devices

    @property
    def num_replicas(self) -> int:
        """How many replicas run the plan (1 without replicas)."""
        return max(len(self.replicas), 1)

    @property
    def num_devices(self) -> int:
        return len(self.all_devices)

    @property
    def microbatches(self) -> int:
        """How many micro-batches a step runs (gradient accumulation; 1: none): ``options["microbatches"]``.
        Each is the graph's batch (:attr:`batch_size`, the model captured at one micro-batch); a step
        runs them one after the other, each forward and backward, every gradient accumulated, and
        steps the optimizer once (:mod:`tensoropt.execute.replicas` cuts the batch)."""
        return int(self.options.get("microbatches", 1))

    @property
    def dp_replicate(self) -> int:
        """HSDP's replicate degree over the replicas of a plan FSDP2 runs across them
        (``options["dp_replicate"]``, 1 when not set: every replica one shard of FSDP): the
        :attr:`replicas` fall into ``dp_replicate`` groups of ``num_replicas / dp_replicate``
        consecutive ones; FSDP2 shards over a group (``dp_shard``) and all-reduces each shard's
        gradients over the groups (torchtitan's ``(dp_replicate, dp_shard)`` mesh axes)."""
        return int(self.options.get("dp_replicate", 1))

    @property
    def pipeline(self) -> dict[str, Any] | None:
        """The pipeline a plan of runtime ``pipelining`` runs (``options["pipeline"]``, ``None`` for
        any other plan): ``schedule``, ``stages_per_rank``, ``checkpoint`` (every block recomputed),
        ``starts`` (each later stage's first operator), ``split_points`` (where PyTorch's
        ``pipeline`` cuts the module), ``checkpointed`` (the blocks recomputed) and, with tensor-parallel
        ranks, ``tp`` (each pipeline rank's devices) and ``tp_modules`` (module path → PyTorch style);
        its ranks' devices are :attr:`devices` (stage ``s`` on pipeline rank ``s mod ranks``, ``tp`` devices
        a rank, side by side), its copies the :attr:`replicas` and its micro-batches :attr:`microbatches`
        (:mod:`tensoropt.planmodel.pipelined`)."""
        spec = self.options.get("pipeline")
        return dict(spec) if isinstance(spec, Mapping) else None

    @property
    def global_batch_size(self) -> int | None:
        """The step's batch: the micro-batch (:attr:`batch_size`) times the micro-batches times the
        replicas."""
        return None if self.batch_size is None else self.batch_size * self.microbatches * self.num_replicas

    def with_options(self, **changes: Any) -> Plan:
        """A copy whose options have ``changes`` (``runtime="executor"``: priced and run as tensoropt's
        executor runs it), its estimates dropped: they priced the plan as it was."""
        plan = self._copy(options={**self.options, **changes}, estimates=[])
        if plan.runtime not in RUNTIMES:
            raise PlanError(f"options.runtime must be one of {', '.join(RUNTIMES)}, got {plan.runtime!r}")
        return plan

    def with_microbatches(self, k: int) -> Plan:
        """A copy that runs each step as ``k`` micro-batches of :attr:`batch_size` (its estimates
        dropped: they priced another step)."""
        if not _whole_at_least_one(k):
            raise PlanError(f"micro-batches must be a whole number ≥ 1, got {k!r}")
        options = {key: v for key, v in self.options.items() if key != "microbatches"}
        if k > 1:
            options["microbatches"] = k
        return self._copy(options=options, estimates=[])

    def replica_of(self, device: str) -> tuple[int, str]:
        """``(r, d0)``: the replica ``device`` runs and the device of the first group whose role it
        plays (``(0, device)`` for a device of a plan without replicas)."""
        for r, g in enumerate(self.replicas):
            if device in g:
                return r, self.replicas[0][g.index(device)]
        if not self.replicas and device in self.devices:
            return 0, device
        raise PlanError(f"device {device!r} runs no part of this plan (it runs on {', '.join(self.all_devices)})")


    @property
    def runtime(self) -> str:
        """What runs the plan and so what it is priced as (:data:`RUNTIMES`): ``options["runtime"]``,
        ``"executor"`` when not set."""
        return str(self.options.get("runtime", "executor"))

    def estimate(self, source: str) -> Estimate | None:
        """The latest estimate from ``source`` (``"frontier"``, ``"simulator"``, …), if any."""
        return next((e for e in reversed(self.estimates) if e.source == source), None)

    def _copy(self, **changes: Any) -> Plan:
        """A copy with the constructor's arguments in ``changes`` replaced; the configurations and
        estimates are shared (:class:`NodeConfig` and :class:`Estimate` are immutable), the options
        copied.  O(operators), no JSON."""
        fields: dict[str, Any] = {
            "graph_fingerprint": self.graph_fingerprint, "graph_name": self.graph_name, "batch_size": self.batch_size,
            "cluster_name": self.cluster_name, "cluster_fingerprint": self.cluster_fingerprint,
            "algorithm": self.algorithm, "options": copy.deepcopy(self.options), "order": self.order,
            "estimates": self.estimates, "plan_id": self.plan_id, "notes": self.notes, "replicas": self.replicas}
        if "replicas" in changes or "order" in changes:
            return Plan(self.configs, **{**fields, **changes})
        # the same configurations, order and replicas as this plan, checked when it was made (O(operators) a
        # check: a thousand pipeline plans copied as the frontier joins them)
        out = Plan(self.configs, **{**fields, **changes, "replicas": ()})
        out.replicas = self.replicas
        return out

    def renamed(self, plan_id: str, notes: Iterable[str] | None = None) -> Plan:
        """A copy under ``plan_id`` (and with ``notes`` in place of its notes, when given)."""
        return self._copy(plan_id=plan_id, **({} if notes is None else {"notes": notes}))

    def with_estimate(self, est: Estimate) -> Plan:
        """A copy with ``est`` replacing any earlier estimate from the same source."""
        return self._copy(estimates=[e for e in self.estimates if e.source != est.source] + [est])

    # ---- checks ------------------------------------------------------------------------------
    def check(self, graph: OpGraph, cluster: Cluster | None = None) -> None:
        """Refuse a plan that does not fit ``graph`` (and ``cluster``): another graph's
        fingerprint, an operator without a configuration or a configuration for an unknown
        node, a layout the op cannot take, an order that is not a topological order of the
        operators, a device the cluster does not have.  Raises :class:`PlanError`."""
        if graph.fingerprint != self.graph_fingerprint:
            raise PlanError(f"the plan was made for graph {self.graph_name!r} "
                            f"(fingerprint {self.graph_fingerprint[:12]}…, batch {self.batch_size}), not for "
                            f"{graph.name!r} (fingerprint {graph.fingerprint[:12]}…, batch {graph.batch_size}); "
                            "make a new plan for this model and batch size")
        ops = {n.name: n for n in graph.ops}
        missing = [n for n in ops if n not in self.configs]
        if missing:
            raise PlanError(f"the plan has no configuration for {len(missing)} operator(s), e.g. {missing[0]!r}")
        unknown = [n for n in self.configs if n not in ops]
        if unknown:
            raise PlanError(f"the plan configures {unknown[0]!r}, which is not an operator of graph {graph.name!r}")
        for name, cfg in self.configs.items():
            node = ops[name]
            if cfg.degree == 1 and cfg.layout != Layout.R:
                raise PlanError(f"node {name!r} runs on one device but has layout {cfg.layout!r}; use 'R'")
            if cfg.layout == Layout.BATCH and node.split.batch is None:
                raise PlanError(f"node {name!r} ({node.op}) cannot be split along the batch")
            if cfg.layout == Layout.CHANNEL and node.split.channel is None:
                raise PlanError(f"node {name!r} ({node.op}) has no channel dimension to split")
        sharded = sharded_parameters(graph, self) if any(c.shard for c in self.configs.values()) else {}
        for name, cfg in self.configs.items():
            if cfg.shard:
                _check_shard(graph, name, cfg, sharded, self.configs)
        if self.runtime not in RUNTIMES:
            raise PlanError(f"options.runtime must be one of {', '.join(RUNTIMES)}, got {self.runtime!r}")
        problem = options_problem(self.options)
        if problem:
            raise PlanError(problem)
        if self.dp_replicate > 1 and (not self.replicas or self.num_replicas % self.dp_replicate):
            raise PlanError(f"options.dp_replicate ({self.dp_replicate}) must divide the plan's replicas "
                            f"({len(self.replicas)}): HSDP's replicate groups are whole groups of replicas")
        if sorted(self.order) != sorted(ops):
            raise PlanError("the plan's order must list every operator exactly once")
        pos = {n: i for i, n in enumerate(self.order)}
        for n in graph.ops:
            for p in n.inputs:
                if p in pos and pos[p] > pos[n.name]:
                    raise PlanError(f"the plan's order runs {n.name!r} before its input {p!r}")
        if cluster is not None:
            names = set(cluster.names)
            for name, cfg in self.configs.items():
                bad = [d for d in cfg.devices if d not in names]
                if bad:
                    raise PlanError(f"node {name!r} is placed on {bad[0]!r}, which cluster {cluster.name!r} "
                                    f"does not have (it has {', '.join(cluster.names)})")
            bad = [d for d in self.all_devices if d not in names]
            if bad:
                raise PlanError(f"replica device {bad[0]!r} is not in cluster {cluster.name!r} "
                                f"(it has {', '.join(cluster.names)})")

    # ---- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self._as_dict({n: c.to_dict() for n, c in self.configs.items()})

    def _as_dict(self, configs: Mapping[str, Any]) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "plan_id": self.plan_id, "graph_name": self.graph_name,
                "graph_fingerprint": self.graph_fingerprint, "batch_size": self.batch_size,
                "cluster_name": self.cluster_name, "cluster_fingerprint": self.cluster_fingerprint,
                "algorithm": self.algorithm, "options": self.options, "devices": self.devices,
                "estimates": [e.to_dict() for e in self.estimates], "notes": self.notes,
                "order": self.order, "configs": configs,
                "replicas": [list(g) for g in self.replicas]}

    @classmethod
    def from_dict(cls, d: Any, where: str = "plan") -> Plan:
        fp = graph_file_header(d, PLAN_FORMATS, where)
        configs_in = d.get("configs")
        if not isinstance(configs_in, Mapping):
            raise GraphFormatError(f"{where}.configs must map node names to configurations")
        configs = {n: NodeConfig.from_dict(c, f"{where}.configs[{n!r}]") for n, c in configs_in.items()}
        order = d.get("order", list(configs))
        if not isinstance(order, list) or not all(isinstance(x, str) for x in order):
            raise GraphFormatError(f"{where}.order must be a list of node names")
        unknown = [x for x in order if x not in configs]
        if unknown:
            raise GraphFormatError(f"{where}.order names {unknown[0]!r}, which has no configuration")
        est_in = d.get("estimates", [])
        if not isinstance(est_in, list):
            raise GraphFormatError(f"{where}.estimates must be a list")
        replicas = d.get("replicas", [])
        if not isinstance(replicas, list) or not all(isinstance(g, list) and all(isinstance(x, str) for x in g)
                                                    for g in replicas):
            raise GraphFormatError(f"{where}.replicas must be a list of device-name lists (one per replica)")
        estimates = [Estimate.from_dict(e, f"{where}.estimates[{i}]") for i, e in enumerate(est_in)]
        options = d.get("options") or {}
        bad = options_problem(options) if isinstance(options, Mapping) else None
        if bad:
            raise GraphFormatError(f"{where}.{bad}")
        try:
            return cls(configs, graph_fingerprint=fp, graph_name=str(d.get("graph_name", "")),
                       batch_size=d.get("batch_size"), cluster_name=str(d.get("cluster_name", "")),
                       cluster_fingerprint=str(d.get("cluster_fingerprint", "")),
                       algorithm=str(d.get("algorithm", "")), options=options, order=order,
                       estimates=estimates, plan_id=str(d.get("plan_id", "")), notes=d.get("notes") or [],
                       replicas=replicas)
        except PlanError as e:   # the replica groups are the only part the constructor checks
            raise GraphFormatError(f"{where}.replicas: {e}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write the plan as JSON (:func:`~tensoropt._io.json_text` of :meth:`to_dict`), atomically;
        each distinct configuration encoded once (:func:`_config_json`: a mesh plan's operators
        share a few dozen)."""
        if len(self.configs) > 1:
            write_json_atomic(path, self._as_dict({n: _config_json(c) for n, c in self.configs.items()}))
        else:
            write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike, graph: OpGraph | None = None, cluster: Cluster | None = None) -> Plan:
        """Read a plan; with ``graph`` (and ``cluster``), also refuse one that does not fit them."""
        plan = cls.from_dict(read_json(path, "plan"), where=str(path))
        if graph is not None:
            plan.check(graph, cluster)
        return plan

    def __repr__(self) -> str:
        est = ", ".join(f"{e.source}: {e.time_s * 1e3:.2f} ms / {e.max_memory_bytes / 2**30:.2f} GiB"
                        for e in self.estimates)
        where = f"{self.num_replicas} replicas of {self.devices}" if self.replicas else str(self.devices)
        return (f"Plan({self.plan_id or self.algorithm!r}, {len(self.configs)} nodes on {where}"
                f"{', ' + est if est else ''})")

