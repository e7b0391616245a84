"""The operator graph: what every later stage (profiler, frontier tracking, placers, executor) reads.

An :class:`OpGraph` is a DAG of :class:`OpNode` in topological order.  Nodes are the model's
inputs (``kind="input"``), its operators (``kind="op"``, one ATen op each) and one
``kind="output"`` node that reads what the model returns.  Parameters, buffers and lifted
constants are not nodes: each is a :class:`ParamInfo` in :attr:`OpGraph.params`, *owned* by the
first operator that computes with it and *read* by the others (a tied embedding is owned by the
embedding and read by the LM head), so memory counts it once.

:attr:`OpGraph.precision` is what the graph trains in (:data:`PRECISIONS`,
:mod:`tensoropt.capture.precision`): ``fp32``; ``bf16`` — mixed precision, captured and run under
``torch.autocast(dtype=torch.bfloat16)``: activations where autocast computes in bfloat16 are
bfloat16 in their :class:`TensorMeta`, parameters stay float32 (master weights); or
``bf16-params`` — FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: every
operator computes on bfloat16 copies of the parameters, so the activations are bfloat16 wherever
the model does not upcast them itself, while the parameters as training keeps them — the
:class:`ParamInfo` — are the float32 master weights (their gradients reduced and kept in float32,
the optimizer state float32); :meth:`OpGraph.compute_bytes` is a parameter's bfloat16 copy.

Everything here is a plain value that round-trips through JSON losslessly
(:meth:`OpGraph.save` / :meth:`OpGraph.load`).  The captured ``torch.fx.GraphModule`` (and the
``ExportedProgram`` when torch.export made it) rides along in :attr:`OpGraph.module` /
:attr:`OpGraph.exported` for the profiler and the executor, with the example inputs in
:attr:`OpGraph.example_inputs`; they are not serialised.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

import networkx as nx

from ._io import read_json, write_json_atomic
from .errors import GraphFormatError, TensorOptError
from .layouts import Layout, StrValueEnum

GRAPH_FORMAT = "tensoropt.graph/1"

DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4, "uint64": 8,
    "bool": 1, "complex64": 8, "complex128": 16,
}

NODE_KINDS = ("input", "op", "output")


class Precision(StrValueEnum):
    """What a graph trains in: ``fp32``; ``bf16`` (mixed precision under autocast, fp32 weights);
    ``bf16-params`` (FSDP2's mixed precision: parameters cast to bf16, fp32 master weights and
    reduction) — :mod:`tensoropt.capture.precision`."""

    FP32 = "fp32"
    BF16 = "bf16"
    BF16_PARAMS = "bf16-params"


#: every precision a graph may train in
PRECISIONS = tuple(Precision)
#: precision → the dtype its matrix operations compute in (what prices them on a device)
COMPUTE_DTYPES: dict[str, str] = {Precision.FP32: "float32", Precision.BF16: "bfloat16",
                                  Precision.BF16_PARAMS: "bfloat16"}


def check_precision(precision: Any, error: type[Exception] = TensorOptError) -> Precision:
    """``precision`` as a :class:`Precision` if it is one (``None``: ``fp32``), else ``error``
    naming the choices."""
    if precision is None:
        return Precision.FP32
    if precision not in PRECISIONS:
        raise error(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return Precision(precision)


def split_fits(layout: str, degree: int, batch_size: int | None) -> bool:
    """Whether a node may run split ``degree`` ways in ``layout`` given the graph's batch size:
    the one rule the profiler (what it measures), the cost model (what plans may use) and the
    executor (what it runs) share for what the shapes alone do not say.  A batch split cuts the
    *batch* (the executor gives each shard ``batch / degree`` samples, also where a view folds the
    batch into a larger dimension), so it needs at least ``degree`` samples."""
    return layout != Layout.BATCH or batch_size is None or degree <= batch_size


def block_of(module_path: str) -> str | None:
    """The repeated block an operator of ``module_path`` belongs to (what a checkpoint per block,
    torchtitan's recipe, wraps): the path up to and including its first numeric part (a
    ``ModuleList`` / ``Sequential`` entry), else ``None``.

    >>> block_of("transformer.h.3.attn.c_attn"), block_of("lm_head"), block_of("layer1.0.conv1")
    ('transformer.h.3', None, 'layer1.0')
    """
    return _block_of(module_path)


@functools.cache
def _block_of(module_path: str) -> str | None:
    # cached: the walk and each frontier point ask it of every operator (a model has a few
    # thousand module paths; a 70B's frontier asked it 850,000 times)
    parts = module_path.split(".") if module_path else []
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i + 1])
    return None


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise GraphFormatError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one tensor, and which of its dimensions are the batch / channel ones.

    ``batch_dim`` is the dimension whose size scales with the batch (found from torch.export's
    symbolic shapes, not from sizes); ``channel_dim`` the feature / channel dimension as the
    producing operator defines it (conv: 1, linear: last).  Either is ``None`` when absent.
    """

    shape: tuple[int, ...]
    dtype: str
    batch_dim: int | None = None
    channel_dim: int | None = None

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_bytes(self.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype,
                "batch_dim": self.batch_dim, "channel_dim": self.channel_dim}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> TensorMeta:
        shape = _field(d, "shape", list, where)
        if not all(isinstance(s, int) and s >= 0 for s in shape):
            raise GraphFormatError(f"{where}.shape must be a list of non-negative integers, got {shape!r}")
        dtype = _field(d, "dtype", str, where)
        dtype_bytes(dtype)
        bd, cd = d.get("batch_dim"), d.get("channel_dim")
        for key, v in (("batch_dim", bd), ("channel_dim", cd)):
            if v is not None and not (isinstance(v, int) and 0 <= v < max(len(shape), 1)):
                raise GraphFormatError(f"{where}.{key} must be null or a dimension of shape {shape}, got {v!r}")
        return cls(tuple(shape), dtype, bd, cd)


@dataclass(frozen=True)
class SplitDims:
    """How an operator may be split across devices (layouts S(batch) / S(channel)).

    ``batch``: the output dimension that may be split so that every shard computes the same op
    on a slice of the batch (``None`` if the op mixes samples, e.g. a reduction over the batch).
    ``batch_exact`` is ``False`` when independent shards would give a different result than the
    whole (batch norm in training needs statistics over the whole batch); the executor keeps such
    an op exact by running it whole on its mesh's first device, which the cost model does not
    charge yet.
    ``channel``: the output dimension that may be split by splitting the operator's weights or
    features (conv output channels, linear output features, attention heads), or ``None``.
    ``rule``: the family of split rules the op falls under (``"elementwise"``, ``"per-sample"``,
    ``"along"`` …: :func:`tensoropt.capture.semantics.batch_family`), ``"replicated"`` for an op
    tensoropt has no rule for (never split, never guessed), ``None`` where not recorded.
    """

    batch: int | None = None
    channel: int | None = None
    batch_exact: bool = True
    rule: str | None = None


class ParamKind(StrValueEnum):
    """What a tensor of the model that no operator makes is: a ``parameter`` (trained when it
    requires a gradient: :attr:`ParamInfo.is_trainable`), a ``buffer`` (batch-norm statistics,
    written in place) or a ``constant`` the capture lifted."""

    PARAMETER = "parameter"
    BUFFER = "buffer"
    CONSTANT = "constant"


#: every kind a graph file's parameter may have
PARAM_KINDS = tuple(ParamKind)


@dataclass(frozen=True)
class ParamInfo:
    """A parameter, buffer or lifted constant tensor, and which nodes use it."""

    name: str                      # the module's own name, e.g. "transformer.h.0.attn.c_attn.weight"
    shape: tuple[int, ...]
    dtype: str                     # as training keeps it (a bf16-params graph: the float32 master)
    kind: ParamKind                # a plain string given is made the member ("parameter" | "buffer" | "constant")
    requires_grad: bool
    owner: str | None              # node that owns it; None when no operator uses it
    readers: tuple[str, ...] = ()  # other nodes that read it

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ParamKind(self.kind))

    @property
    def is_trainable(self) -> bool:
        """A parameter that requires a gradient: what the optimizer updates, whose gradient the
        step makes (the one statement of "trainable parameter")."""
        return self.kind == ParamKind.PARAMETER and self.requires_grad

    @property
    def numel(self) -> int:
        return TensorMeta(self.shape, self.dtype).numel

    @property
    def nbytes(self) -> int:
        return TensorMeta(self.shape, self.dtype).nbytes


@dataclass(frozen=True)
class OpNode:
    """One node of the graph.

    ``inputs`` are the producer nodes in argument order (each once) and ``input_bytes`` the bytes
    each edge carries.  ``params`` are the parameters this node owns, ``param_reads`` those it
    reads but another node owns.  ``module_path`` is the ``nn.Module`` the op came from
    (``""`` for the root).
    """

    name: str
    op: str
    kind: str = "op"
    inputs: tuple[str, ...] = ()
    input_bytes: tuple[int, ...] = ()
    outputs: tuple[TensorMeta, ...] = ()
    params: tuple[str, ...] = ()
    param_reads: tuple[str, ...] = ()
    split: SplitDims = field(default_factory=SplitDims)
    metadata_only: bool = False
    generator: bool = False
    module_path: str = ""
    module_type: str = ""

    @property
    def output_bytes(self) -> int:
        return sum(t.nbytes for t in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["outputs"] = [t.to_dict() for t in self.outputs]
        d["split"] = asdict(self.split)
        for k in ("inputs", "input_bytes", "params", "param_reads"):
            d[k] = list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> OpNode:
        name = _field(d, "name", str, where)
        where = f"{where} ({name})"
        kind = _field(d, "kind", str, where)
        if kind not in NODE_KINDS:
            raise GraphFormatError(f"{where}.kind must be one of {NODE_KINDS}, got {kind!r}")
        inputs = _str_list(d, "inputs", where)
        input_bytes = _field(d, "input_bytes", list, where)
        if len(input_bytes) != len(inputs) or not all(isinstance(b, int) and b >= 0 for b in input_bytes):
            raise GraphFormatError(f"{where}.input_bytes must hold one non-negative integer per input")
        outputs = tuple(TensorMeta.from_dict(t, f"{where}.outputs[{i}]")
                        for i, t in enumerate(_field(d, "outputs", list, where)))
        split = _field(d, "split", dict, where)
        try:
            split_dims = SplitDims(**split)
        except TypeError:
            raise GraphFormatError(f"{where}.split must have keys batch, channel, batch_exact[, rule], "
                                   f"got {sorted(split)}") from None
        return cls(
            name=name, op=_field(d, "op", str, where), kind=kind,
            inputs=inputs, input_bytes=tuple(input_bytes), outputs=outputs,
            params=_str_list(d, "params", where), param_reads=_str_list(d, "param_reads", where),
            split=split_dims,
            metadata_only=_field(d, "metadata_only", bool, where),
            generator=_field(d, "generator", bool, where),
            module_path=_field(d, "module_path", str, where),
            module_type=_field(d, "module_type", str, where),
        )


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    nbytes: int


class OpGraph:
    """An operator DAG with parameters, in topological order.  See the module docstring.

    Build one with :func:`tensoropt.capture`, :func:`tensoropt.load_onnx` or :meth:`OpGraph.load`.
    The constructor checks that node names are unique, that every input names an earlier node
    and that every parameter reference resolves.
    """

    def __init__(self, nodes: list[OpNode], params: Mapping[str, ParamInfo], *, name: str = "model",
                 source: str = "", batch_size: int | None = None, batch_dim: int = 0,
                 notes: list[str] | None = None, module: Any = None, exported: Any = None,
                 example_inputs: tuple | None = None, precision: str = "fp32"):
        if precision not in PRECISIONS:
            raise GraphFormatError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.name = name
        self.source = source            # "torch.export", "torch.fx" or "onnx"
        self.batch_size = batch_size
        self.batch_dim = batch_dim
        self.notes = list(notes or [])  # what capture had to assume, shown to the user
        #: "fp32"; "bf16": captured, profiled and run under autocast; "bf16-params": computed on
        #: bfloat16 copies of float32 master parameters (tensoropt.capture.precision)
        self.precision = Precision(precision)
        self.nodes: dict[str, OpNode] = {}
        for n in nodes:
            if n.name in self.nodes:
                raise GraphFormatError(f"duplicate node name {n.name!r}")
            for i in n.inputs:
                if i not in self.nodes:
                    raise GraphFormatError(f"node {n.name!r} reads {i!r}, which is not an earlier node")
            self.nodes[n.name] = n
        self.params: dict[str, ParamInfo] = dict(params)
        for p in self.params.values():
            for user in (p.owner, *p.readers):
                if user is not None and user not in self.nodes:
                    raise GraphFormatError(f"parameter {p.name!r} names node {user!r}, which does not exist")
        for n in self.nodes.values():
            for q in (*n.params, *n.param_reads):
                if q not in self.params:
                    raise GraphFormatError(f"node {n.name!r} uses parameter {q!r}, which is not in params")
        self.module = module        # torch.fx.GraphModule for the executor (not serialised)
        self.exported = exported    # torch.export.ExportedProgram when torch.export captured it
        self.example_inputs = example_inputs  # the inputs it was captured with (the profiler runs them)
        self.call: Any = None       # tensoropt.capture.ModelCall: how the eager model is called (not serialised)
        #: tensoropt.capture.expand.Expansion where the graph was synthesised from a short capture (its
        #: ``template`` holds the module and inputs; ``module`` and ``exported`` are then None), else None
        self.expansion: Any = None

    # ---- views -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.nodes.values())

    def __getitem__(self, name: str) -> OpNode:
        return self.nodes[name]

    @property
    def ops(self) -> list[OpNode]:
        """The operator nodes (not the inputs or the output), in topological order."""
        return [n for n in self.nodes.values() if n.kind == "op"]

    @property
    def inputs(self) -> list[OpNode]:
        return [n for n in self.nodes.values() if n.kind == "input"]

    @property
    def edges(self) -> list[Edge]:
        return [Edge(src, n.name, b) for n in self.nodes.values() for src, b in zip(n.inputs, n.input_bytes)]

    @cached_property
    def nx(self) -> nx.DiGraph:
        """The graph as a ``networkx.DiGraph``; node attribute ``node`` holds the :class:`OpNode`,
        edge attribute ``nbytes`` the bytes carried.  Built once, O(V + E)."""
        g = nx.DiGraph()
        for n in self.nodes.values():
            g.add_node(n.name, node=n)
        for e in self.edges:
            g.add_edge(e.src, e.dst, nbytes=e.nbytes)
        return g

    def successors(self, name: str) -> list[str]:
        return list(self.nx.successors(name))

    def param_bytes(self, kind: str = "parameter") -> int:
        """Total bytes of the parameters (or buffers / constants) of the given kind, each counted once."""
        return sum(p.nbytes for p in self.params.values() if p.kind == kind)

    def compute_bytes(self, name: str) -> int:
        """Bytes of parameter ``name`` as the graph's operators read it: in a ``bf16-params`` graph
        the bfloat16 copy of a floating-point master weight (what FSDP2 all-gathers and computes
        on: half a float32 master), else the parameter itself."""
        info = self.params[name]
        if (self.precision == Precision.BF16_PARAMS and info.kind == ParamKind.PARAMETER
                and info.dtype in ("float32", "float64")):
            return TensorMeta(info.shape, "bfloat16").nbytes
        return info.nbytes

    def op_histogram(self) -> Counter:
        return Counter(n.op for n in self.ops)

    @property
    def trainable_bytes(self) -> int:
        """Bytes of the trainable parameters, each counted once (remembered, as :attr:`fingerprint`)."""
        return self._remembered("trainable_bytes", lambda: sum(
            p.nbytes for p in self.params.values() if p.is_trainable))

    def _remembered(self, what: str, compute: Any) -> Any:
        """``compute()``, remembered while the graph holds the same node and parameter objects
        under the same names (every one is frozen: a change replaces an object, and the objects
        kept here cannot be freed for a new one to take their identity) and the same precision —
        the search asks for the fingerprint of one graph tens of times (issue 38: 2,047
        recomputations in one run).  The check compares lists of names and object ids, in C: 0.36
        ms for Llama-3-70B's 4,274 nodes and 725 parameters, where a Python loop over them took
        4.7 ms, 205 times in its search."""
        nodes, params = self.nodes, self.params
        key = (self.precision, list(nodes), list(map(id, nodes.values())), list(params),
               list(map(id, params.values())))
        memo = self.__dict__.setdefault("_memo", {})
        hit = memo.get(what)
        if hit is not None and hit[0] == key:
            return hit[1]
        value = compute()
        memo[what] = (key, value, tuple(nodes.values()), tuple(params.values()))   # the objects kept alive
        return value

    # ---- identity ----------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        """SHA-256 over structure, shapes, dtypes and precision (not names of modules, not notes).

        Two captures of the same model at the same batch size have the same fingerprint; any
        change of batch size, shape, dtype, operator, wiring or precision changes it.  Plans and
        profiles carry it so they are never applied to another graph (a bf16 graph never reuses
        an fp32 profile).  An fp32 graph's fingerprint is what it was before precisions existed.
        Remembered while the graph's nodes, parameters and precision stay the same objects.
        """
        return str(self._remembered("fingerprint", self._fingerprint))

    def _fingerprint(self) -> str:
        canon = {
            "nodes": [[n.name, n.op, n.kind, list(n.inputs),
                       [[list(t.shape), t.dtype] for t in n.outputs], list(n.params), list(n.param_reads)]
                      for n in self.nodes.values()],
            "params": [[p.name, list(p.shape), p.dtype, p.kind] for p in self.params.values()],
        }
        if self.precision != Precision.FP32:
            canon["precision"] = str(self.precision)
        return hashlib.sha256(json.dumps(canon, separators=(",", ":")).encode()).hexdigest()

    # ---- JSON --------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": GRAPH_FORMAT,
            "name": self.name,
            "source": self.source,
            "fingerprint": self.fingerprint,
            "batch_size": self.batch_size,
            "batch_dim": self.batch_dim,
            "precision": str(self.precision),
            "notes": self.notes,
            "nodes": [n.to_dict() for n in self.nodes.values()],
            "params": [{"name": p.name, "shape": list(p.shape), "dtype": p.dtype, "kind": p.kind.value,
                        "requires_grad": p.requires_grad, "owner": p.owner, "readers": list(p.readers)}
                       for p in self.params.values()],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "graph") -> OpGraph:
        if not isinstance(d, Mapping):
            raise GraphFormatError(f"{where} must be a JSON object")
        fmt = d.get("format")
        if fmt != GRAPH_FORMAT:
            raise GraphFormatError(f"{where}.format must be {GRAPH_FORMAT!r}, got {fmt!r}")
        nodes = [OpNode.from_dict(n, f"{where}.nodes[{i}]") for i, n in enumerate(_field(d, "nodes", list, where))]
        params = {}
        for i, p in enumerate(_field(d, "params", list, where)):
            pw = f"{where}.params[{i}]"
            kind = _field(p, "kind", str, pw)
            if kind not in PARAM_KINDS:
                raise GraphFormatError(f"{pw}.kind must be one of {PARAM_KINDS}, got {kind!r}")
            owner = p.get("owner")
            if owner is not None and not isinstance(owner, str):
                raise GraphFormatError(f"{pw}.owner must be a node name or null")
            info = ParamInfo(name=_field(p, "name", str, pw), shape=tuple(_field(p, "shape", list, pw)),
                             dtype=_field(p, "dtype", str, pw), kind=kind,
                             requires_grad=_field(p, "requires_grad", bool, pw), owner=owner,
                             readers=_str_list(p, "readers", pw))
            dtype_bytes(info.dtype)
            params[info.name] = info
        precision = d.get("precision", "fp32")   # written before precisions existed: fp32
        if precision not in PRECISIONS:
            raise GraphFormatError(f"{where}.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        g = cls(nodes, params, name=_field(d, "name", str, where), source=_field(d, "source", str, where),
                batch_size=d.get("batch_size"), batch_dim=d.get("batch_dim", 0), notes=d.get("notes") or [],
                precision=precision)
        stored = d.get("fingerprint")
        if stored is not None and stored != g.fingerprint:
            raise GraphFormatError(f"{where}.fingerprint {stored[:12]}… does not match the graph's content "
                                   f"({g.fingerprint[:12]}…): the file was edited or is corrupt")
        return g

    def save(self, path: str | os.PathLike) -> None:
        """Write the graph as JSON, atomically."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike) -> OpGraph:
        """Read a graph written by :meth:`save`; a malformed file raises :class:`GraphFormatError`
        naming the field."""
        return cls.from_dict(read_json(path, "graph"), where=str(path))

    def __repr__(self) -> str:
        return (f"OpGraph({self.name!r}, {len(self.ops)} ops, {len(self.params)} params, "
                f"source={self.source!r}, "
                + (f"precision={self.precision!r}, " if self.precision != Precision.FP32 else "")
                + f"fingerprint={self.fingerprint[:12]})")


def _field(d: Mapping[str, Any], key: str, typ: type, where: str) -> Any:
    if not isinstance(d, Mapping):
        raise GraphFormatError(f"{where} must be a JSON object")
    if key not in d:
        raise GraphFormatError(f"{where} is missing field {key!r}")
    v = d[key]
    if typ is int and isinstance(v, bool) or not isinstance(v, typ):
        raise GraphFormatError(f"{where}.{key} must be {typ.__name__}, got {type(v).__name__}")
    return v


def _str_list(d: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    v = _field(d, key, list, where)
    if not all(isinstance(s, str) for s in v):
        raise GraphFormatError(f"{where}.{key} must be a list of strings")
    return tuple(v)


def grad_nodes(graph: OpGraph) -> dict[str, bool]:
    """Which nodes' outputs carry a gradient in training (downstream of a trainable parameter)."""
    trainable = {p.name for p in graph.params.values() if p.is_trainable}
    out: dict[str, bool] = {}
    for n in graph:
        float_out = any(t.dtype.startswith(("float", "bfloat", "complex")) for t in n.outputs)
        out[n.name] = n.kind == "op" and float_out and not n.generator and (
            any(out.get(i, False) for i in n.inputs) or any(p in trainable for p in (*n.params, *n.param_reads)))
    return out
