"""The CostModel: what every operator of one graph costs on one device kind, as a JSON value.

A :class:`CostModel` is what :func:`tensoropt.profile` returns and what frontier tracking, the
placers and the simulator read.  Per node (:class:`NodeCost`) it holds the forward and backward
time at the full shape on one device, and per *shard* (:class:`ShardCost`, keyed by layout and
degree) the same at the shape a configuration gives the node:

- ``("batch", k)``: the node's batch-carrying inputs cut into ``k`` (``S(batch)``);
- ``("channel", k)``: its output channels / features cut into ``k`` (weights cut too, ``S(channel)``);
- ``("reduce", k)``: its reduction (input-feature) dimension cut into ``k`` — the partial-sum
  layout ``P`` of a linear / convolution / matmul, whose output is full-sized and needs a sum.

``R`` (replicate) runs the full shape on every device: the degree-1 figures.  Memory figures are
bytes per device: the output, what autograd saves for backward (split into the node's inputs it
saves, whether it saves its output, and extra tensors such as dropout masks), and the transient
workspace where it can be measured (CUDA).  ``method`` says where a time came from:
``measured`` (run alone, median of repeats), ``cached`` (an identical op measured before),
``scaled`` (a shard that cannot run alone: the full time scaled by its FLOP or size share) and
``roofline`` (FLOPs / device peak, bytes / memory bandwidth), ``free`` (metadata-only: 0),
``sequence`` (timed inside whole training steps, :mod:`.sequence`) and ``adjusted`` (a shard
timed alone, times the node's in-sequence / alone ratio).

It owns the profile's data and file format; it must not measure (the profiler does) nor cost a
plan (:mod:`tensoropt.planmodel` does).

Example (a two-layer MLP on a preset's A100s, :func:`tensoropt.examples.mlp_on`: the profile
records each operator's memory and work here, untimed, and the A100's device model prices the
times)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, cluster = mlp_on()
    >>> costs.save("profile.json")
    >>> costs = CostModel.load("profile.json", graph)
    >>> [round(t * 1e6, 2) for t in costs.time("linear", "batch", 2)], costs.legal("linear")[:3]
    ([7.0, 14.0], [('batch', 2), ('batch', 4), ('batch', 8)])
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .._io import graph_file_header, read_json, write_json_atomic
from ..errors import GraphFormatError, ProfileError
from ..graph import OpGraph, split_fits
from ..layouts import SPLIT_LAYOUTS, Layout

PROFILE_FORMAT = "tensoropt.profile/1"
LAYOUTS = SPLIT_LAYOUTS   # a shard's layouts (R is the full shape)
METHODS = ("measured", "cached", "scaled", "roofline", "free", "sequence", "adjusted", "modelled")
ESTIMATED = frozenset({"scaled", "roofline"})


@dataclass(frozen=True)
class Work:
    """What one call does, whatever runs it: FLOPs (``FlopCounterMode``: matrix products,
    convolutions and attention; other ops count 0) and bytes it reads and writes, forward and
    backward.  A device model turns work into time on a device kind (:mod:`tensoropt.devicemodel`).

    Forward bytes: the call's distinct input tensors (parameters too) plus its outputs; backward
    bytes: the output gradients, what autograd saved, and the input gradients it produces.
    """

    fp_flops: int = 0
    bp_flops: int = 0
    fp_bytes: int = 0
    bp_bytes: int = 0

    def scaled(self, k: int) -> Work:
        """One of ``k`` equal pieces (a shard estimated from the full call)."""
        return Work(self.fp_flops // k, self.bp_flops // k, self.fp_bytes // k, self.bp_bytes // k)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Work | None:
        if d is None:
            return None
        if not isinstance(d, Mapping):
            raise GraphFormatError(f"{where}.work must be an object with fp_flops, bp_flops, fp_bytes, bp_bytes")
        vals = {}
        for key in ("fp_flops", "bp_flops", "fp_bytes", "bp_bytes"):
            v = d.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise GraphFormatError(f"{where}.work.{key} must be a non-negative integer, got {v!r}")
            vals[key] = v
        return cls(**vals)


@dataclass(frozen=True)
class ShardCost:
    """Cost of a node at one shard shape, per device."""

    fp_s: float
    bp_s: float
    output_bytes: int
    saved_bytes: int          # everything autograd keeps for backward (inputs, output, extras), deduplicated
    extra_saved_bytes: int    # saved tensors that are neither an input nor the output (masks, statistics)
    method: str = "measured"
    work: Work | None = None  # what the call does (None: a profile made before work was recorded)

    @property
    def estimated(self) -> bool:
        return self.method in ESTIMATED


def _flat_dict(cost: ShardCost | NodeCost) -> dict[str, Any]:
    """``asdict(cost)`` field by field (its work by ``asdict``; a node's shards are left as they are,
    for :meth:`NodeCost.to_dict` to write): a profile of Llama-3-8B holds 10,000 shards, and
    ``asdict``'s deep copy of each took 0.5 s of its save."""
    cls = type(cost)
    names = _FIELD_NAMES.get(cls)
    if names is None:   # dataclasses.fields, found once a class: it is asked once a shard
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cost))
    d = {n: getattr(cost, n) for n in names}
    d["work"] = None if cost.work is None else asdict(cost.work)
    return d


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True)
class NodeCost:
    """Cost of one node at its full shape on one device, and at every shard shape measured."""

    name: str
    op: str
    fp_s: float
    bp_s: float
    method: str
    param_bytes: int = 0              # parameters this node owns (gradients and optimizer state follow them)
    output_bytes: int = 0
    saved_inputs: tuple[str, ...] = ()  # producers whose output this node saves for backward
    saves_output: bool = False
    saved_bytes: int = 0              # all tensors saved for backward, deduplicated (inputs, output, extras)
    extra_saved_bytes: int = 0
    workspace_bytes: int = 0          # transient memory beyond inputs and outputs (measured on CUDA only)
    flops: int = 0                    # forward FLOPs where FlopCounterMode knows a formula
    shards: Mapping[tuple[str, int], ShardCost] = field(default_factory=dict)
    work: Work | None = None          # what the full call does (None: a profile made before work was recorded)

    @property
    def estimated(self) -> bool:
        return self.method in ESTIMATED

    def at(self, layout: str = "R", degree: int = 1) -> ShardCost:
        """The cost at a layout and degree; ``R`` or degree 1 is the full shape.  KeyError if that
        shard is not legal for the node (see :meth:`CostModel.legal`)."""
        if layout == Layout.R or degree == 1:
            return ShardCost(self.fp_s, self.bp_s, self.output_bytes, self.saved_bytes, self.extra_saved_bytes,
                             self.method, self.work)
        return self.shards[(layout, degree)]

    def to_dict(self) -> dict[str, Any]:
        # field by field, not asdict(self): that converted every shard too (deep copies), only to be replaced below
        d = _flat_dict(self)
        d["saved_inputs"] = list(self.saved_inputs)
        d["shards"] = [{"layout": lay, "degree": k, **_flat_dict(s)} for (lay, k), s in self.shards.items()]
        d["estimated"] = self.estimated
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> NodeCost:
        def num(key: str, src: Mapping[str, Any] = d, at: str = where, typ: type = float) -> Any:
            if key not in src:
                raise GraphFormatError(f"{at} is missing field {key!r}")
            v = src[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise GraphFormatError(f"{at}.{key} must be a non-negative number, got {v!r}")
            return typ(v)

        if not isinstance(d, Mapping) or not isinstance(d.get("name"), str):
            raise GraphFormatError(f"{where} must be an object with a string field 'name'")
        where = f"{where} ({d['name']})"
        method = d.get("method")
        if method not in METHODS:
            raise GraphFormatError(f"{where}.method must be one of {METHODS}, got {method!r}")
        shards = {}
        for i, s in enumerate(d.get("shards", [])):
            sw = f"{where}.shards[{i}]"
            if not isinstance(s, Mapping) or s.get("layout") not in LAYOUTS:
                raise GraphFormatError(f"{sw}.layout must be one of {LAYOUTS}")
            k = s.get("degree")
            if not isinstance(k, int) or k < 2:
                raise GraphFormatError(f"{sw}.degree must be an integer ≥ 2, got {k!r}")
            if s.get("method") not in METHODS:
                raise GraphFormatError(f"{sw}.method must be one of {METHODS}")
            shards[(s["layout"], k)] = ShardCost(
                num("fp_s", s, sw), num("bp_s", s, sw), num("output_bytes", s, sw, int),
                num("saved_bytes", s, sw, int), num("extra_saved_bytes", s, sw, int), s["method"],
                Work.from_dict(s.get("work"), sw))
        return cls(name=d["name"], op=str(d.get("op", "")), fp_s=num("fp_s"), bp_s=num("bp_s"), method=method,
                   param_bytes=num("param_bytes", typ=int), output_bytes=num("output_bytes", typ=int),
                   saved_inputs=tuple(d.get("saved_inputs", ())), saves_output=bool(d.get("saves_output", False)),
                   saved_bytes=num("saved_bytes", typ=int), extra_saved_bytes=num("extra_saved_bytes", typ=int),
                   workspace_bytes=num("workspace_bytes", typ=int), flops=num("flops", typ=int), shards=shards,
                   work=Work.from_dict(d.get("work"), where))


class CostModel:
    """Per-node costs of one graph (by fingerprint) on one device kind.  See the module docstring.

    ``device`` describes where the costs were measured (type, name, threads, torch version, the
    measured peak FLOP/s and memory bandwidth used for roofline estimates); ``settings`` how
    (repeats, warm-up, shard degrees).
    """

    def __init__(self, nodes: Mapping[str, NodeCost], *, graph_fingerprint: str, graph_name: str = "",
                 batch_size: int | None = None, device: Mapping[str, Any] | None = None,
                 settings: Mapping[str, Any] | None = None, profile_s: float = 0.0):
        self.nodes: dict[str, NodeCost] = dict(nodes)
        self.graph_fingerprint = graph_fingerprint
        self.graph_name = graph_name
        self.batch_size = batch_size
        self.device = dict(device or {})
        self.settings = dict(settings or {})
        self.profile_s = profile_s

    def __getitem__(self, name: str) -> NodeCost:
        return self.nodes[name]

    def __contains__(self, name: str) -> bool:
        return name in self.nodes

    def get(self, name: str) -> NodeCost | None:
        """The node's cost, ``None`` for nodes without one (inputs, the output)."""
        return self.nodes.get(name)

    def __len__(self) -> int:
        return len(self.nodes)

    def legal(self, name: str) -> list[tuple[str, int]]:
        """The (layout, degree) shards measured or estimated for a node that the executors can run
        (:func:`~tensoropt.graph.split_fits`; ``R`` is always legal)."""
        return sorted(key for key in self.nodes[name].shards if split_fits(*key, self.batch_size))

    def time(self, name: str, layout: str = "R", degree: int = 1) -> tuple[float, float]:
        """(forward, backward) seconds of a node at a layout and degree; (0, 0) for nodes without
        a cost (inputs, the output)."""
        n = self.nodes.get(name)
        if n is None:
            return 0.0, 0.0
        s = n.at(layout, degree)
        return s.fp_s, s.bp_s

    @property
    def total_fp_s(self) -> float:
        return sum(n.fp_s for n in self.nodes.values())

    @property
    def total_bp_s(self) -> float:
        return sum(n.bp_s for n in self.nodes.values())

    def grad_copy_s(self, nbytes: int | float) -> float:
        """Seconds to copy ``nbytes`` of fresh gradients into buffers kept between steps, at the
        rate the in-sequence run measured (``settings["in_sequence"]["grad_copy_Bps"]``), or a
        device model's (``settings["grad_copy_Bps"]``, :meth:`DeviceModel.copy_Bps
        <tensoropt.devicemodel.calibration.DeviceModel.copy_Bps>`): what the executors pay to put
        the gradients they sum across devices into their flat buffers.  0 where neither is known
        (isolated times, older profiles)."""
        rate = self.settings.get("grad_copy_Bps") or (self.settings.get("in_sequence") or {}).get("grad_copy_Bps") \
            or 0.0
        return nbytes / rate if rate > 0 and nbytes > 0 else 0.0

    def count(self, method: str) -> int:
        return sum(1 for n in self.nodes.values() if n.method == method)

    def top(self, k: int = 10) -> list[NodeCost]:
        """The ``k`` nodes with the largest forward + backward time."""
        return sorted(self.nodes.values(), key=lambda n: -(n.fp_s + n.bp_s))[:k]

    def check_graph(self, graph: OpGraph) -> None:
        """Refuse a graph this profile was not made for, naming both fingerprints and the fix."""
        fp = graph.fingerprint
        if fp != self.graph_fingerprint:
            raise ProfileError(
                f"the profile was made for graph {self.graph_name!r} (fingerprint {self.graph_fingerprint[:12]}…, "
                f"batch {self.batch_size}), not for {graph.name!r} (fingerprint {fp[:12]}…, batch "
                f"{graph.batch_size}); re-profile it: tensoropt profile MODEL --batch {graph.batch_size} "
                "-o profile.json")

    # ---- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, "graph_name": self.graph_name, "graph_fingerprint": self.graph_fingerprint,
                "batch_size": self.batch_size, "device": self.device, "settings": self.settings,
                "profile_s": self.profile_s,
                "summary": {m: self.count(m) for m in METHODS},
                "nodes": [n.to_dict() for n in self.nodes.values()]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "profile") -> CostModel:
        fp = graph_file_header(d, PROFILE_FORMAT, where)
        nodes_in = d.get("nodes")
        if not isinstance(nodes_in, list):
            raise GraphFormatError(f"{where}.nodes must be a list")
        nodes = [NodeCost.from_dict(n, f"{where}.nodes[{i}]") for i, n in enumerate(nodes_in)]
        return cls({n.name: n for n in nodes}, graph_fingerprint=fp, graph_name=str(d.get("graph_name", "")),
                   batch_size=d.get("batch_size"), device=d.get("device") or {}, settings=d.get("settings") or {},
                   profile_s=float(d.get("profile_s", 0.0)))

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile as JSON, atomically."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike, graph: OpGraph | None = None) -> CostModel:
        """Read a profile; with ``graph``, also refuse it if it was made for another graph."""
        cm = cls.from_dict(read_json(path, "profile"), where=str(path))
        if graph is not None:
            cm.check_graph(graph)
        return cm

    def __repr__(self) -> str:
        return (f"CostModel({self.graph_name!r}, {len(self.nodes)} nodes, device={self.device.get('name', '?')!r}, "
                f"fp={self.total_fp_s * 1e3:.2f} ms, bp={self.total_bp_s * 1e3:.2f} ms)")
