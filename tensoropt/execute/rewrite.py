"""Rewrite a captured graph by a plan: every operator on its devices, split, moved, in the plan's
order (the NetSplit thesis §4.5, FastT's SplitOperation).

Input: the :class:`~tensoropt.graph.OpGraph` of a ``torch.export`` capture (its ``module`` holds
the ATen graph with parameters and buffers lifted to placeholders), a :class:`~tensoropt.plan.Plan`
checked against it, and ``device_of`` (plan device name → torch device string).  Output: a
:class:`Rewritten` — a new ``torch.fx.GraphModule`` with the same placeholders, and what each
placeholder stands for.  O(V + E) nodes emitted, times the mesh sizes.

Per operator, in ``plan.order``, under its :class:`~tensoropt.plan.NodeConfig`:

- ``R`` (or one device): the whole op on every device of the mesh, each reading the whole inputs;
- ``batch`` / ``channel`` / ``reduce`` over ``k`` devices: which argument is cut along which
  dimension is what :func:`tensoropt.measure.shards.shard_args` (the profiler's rule) cuts —
  asked once per node with meta tensors of the real shapes; shard ``i`` reads piece ``i`` of
  each cut argument (activations moved and resliced by :class:`~.layouts.Transport` as needed,
  parameters copied to the shard's device inside the graph and sliced there, so autograd sums
  their gradients back); the output is ``S`` along the output's batch / channel dimension, or
  ``P`` for ``reduce`` (whose bias is added by shard 0 only);
- sizes that depend on the batch (``sym_size`` and arithmetic on it) become constants: the
  shard's own batch in a batch split, the whole batch elsewhere;
- views and getitem of a tuple follow their producer's placement; ``_assert_tensor_metadata``
  (a check of the capture device) is dropped; a ``device=`` argument names the shard's device;
- **batch norm in training under a batch split** (``aten.batch_norm``) is synchronised, as
  ``SyncBatchNorm`` does: every shard sums its slice and its squares per channel, the sums are
  added up across the mesh (two vectors of the channel count moved, not the activations), and
  every shard normalises its slice with the whole batch's mean and (biased) variance; autograd
  carries the gradient back through the same sums, and the running statistics are updated once
  (unbiased variance, the op's momentum), as the original does.  The other batch-norm forms
  (and a ``None`` momentum) run whole on the mesh's first device instead, their input gathered
  there;
- buffers an op writes in place (running statistics, ``num_batches_tracked``) are given a copy
  and written back to the original buffer (the slice of it a channel shard owns) after the op,
  once — replicas other than the first write to their own copy;
- a split whose shard rule is missing or whose largest shard, run on meta tensors, does not give
  the promised shape (a view with fixed sizes split by channel) runs whole on the mesh's first
  device instead, and is listed in :attr:`Rewritten.fallbacks`;
- ``recompute``: each recomputed segment of the plan (a block's run of recomputed operators,
  :func:`~tensoropt.planmodel.walk.recompute_segments`) runs as one
  ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` region (:mod:`.segments`);
- a sharding level (:class:`~tensoropt.layouts.Shard`) changes nothing here: every device of the
  mesh reads the whole parameter, as at level 0.  Which pieces are kept between uses, and the
  gathers and reduce-scatters around the uses, are the executors' (:mod:`.sharding`; per rank
  :mod:`tensoropt.distributed.zero`; one process keeps parameters whole and says so).  Every
  node appended while an operator is emitted names it in ``meta[OP_META]``.

Owns: turning the captured graph plus a plan into a new ``torch.fx`` graph, node by node.
Must not: run anything but meta-tensor shape checks, choose a plan or a layout (the plan says),
cost anything, or emit a move itself — every move, gather, sum and slice goes through
:class:`~.layouts.Transport`, the seam the distributed backend reads back.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from .. import syncbn
from ..errors import ExecutionError
from ..graph import OpGraph, OpNode, Precision, split_fits
from ..layouts import Layout, largest_piece, piece_sizes
from ..measure.shards import VIEWS, TensorArg, shard_args
from ..plan import Plan
from ..planmodel.reshard import op_basename
from ..planmodel.walk import recompute_segments
from .check import check_term
from .layouts import P, Placed, R, S, Transport
from .randomness import draw_shape, is_keyed, keyed_call, random_keys
from .segments import checkpoint_segments

_BATCH_NORMS = {"batch_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional"}
_BIAS_AT_2 = {"linear", "conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d", "conv_transpose2d",
              "conv_transpose3d"}
_BETA = {"addmm", "baddbmm", "addbmm"}


#: the meta key of a rewritten node naming the operator of the capture it was emitted for (set on
#: the nodes appended while that operator was emitted: its parts, moves, gathers; a piece cut right
#: after its producer is inserted there and keeps no name): how the distributed backend finds a
#: parameter's readers (:mod:`tensoropt.distributed.zero`)
OP_META = "tensoropt_op"


@dataclass
class Rewritten:
    """The rewritten graph and what its placeholders are: ``sources[i]`` is ``("parameter" |
    "buffer", qualified name)``, ``("constant", tensor)`` or ``("input", index among the user's
    flattened inputs)``; ``fallbacks`` says which nodes ran whole because no shard rule runs them
    in the plan's layout (a note for the user, not an error: the values are the same)."""

    module: fx.GraphModule
    sources: list[tuple[str, Any]]
    fallbacks: list[str]
    #: with ``probe``: the operators whose whole outputs follow the model's outputs, in order
    probes: tuple[str, ...] = ()
    #: the plan's recomputed segments (operator names); run as checkpoint regions in ``module``
    #: unless the rewrite was asked not to (``segments=False``: the caller runs them)
    segments: tuple[tuple[str, ...], ...] = ()
    #: the nodes that are a buffer, or a move or copy of one: a checkpoint region reads them by
    #: reference (:class:`~.segments.ByReference`: the step writes into buffers after it)
    by_reference: frozenset[str] = frozenset()


@torch.no_grad()
def write_back(buffer: torch.Tensor, value: torch.Tensor, dim: int | None, k: int, index: int) -> None:
    """Copy ``value`` (an op's in-place update of a copy) into ``buffer`` — into its piece
    ``index`` of ``k`` along ``dim`` when the op saw a piece."""
    target = buffer if dim is None else torch.tensor_split(buffer, k, dim)[index]
    target.copy_(value.to(target.device))


def _sym_value(val: torch.SymInt | torch.SymBool | torch.SymFloat, batch_syms: set[sympy.Symbol],
               batch: int | None) -> int | bool | float:
    """The concrete value of a SymInt-valued node: its hint, or the expression at ``batch``."""
    expr = sympy.sympify(val.node.expr)
    if batch is not None and batch_syms:
        # sympify again: xreplace of a bare symbol returns the Python int it was given
        expr = sympy.sympify(expr.xreplace({s: sympy.Integer(batch) for s in batch_syms}))
    env = val.node.shape_env
    known = getattr(env, "backed_var_to_val", None) or env.var_to_val
    expr = expr.xreplace({s: known[s] for s in expr.free_symbols if s in known})
    return int(expr) if isinstance(val, torch.SymInt) else bool(expr) if isinstance(val, torch.SymBool) else float(expr)


def _shape(val: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s.node.hint) if isinstance(s, torch.SymInt) else int(s) for s in val.shape)


def _has_tensor(val: Any) -> bool:
    if isinstance(val, torch.Tensor):
        return True
    return isinstance(val, (list, tuple)) and any(_has_tensor(v) for v in val)


#: a shard's ``(args, kwargs)`` with its tensor arguments as :class:`_Cut` marks
_Template = tuple[tuple[Any, ...], dict[str, Any]]


class _Cut:
    """Marks a tensor argument in a shard template: ``node`` read whole (``dim`` None) or cut."""

    def __init__(self, node: fx.Node, dim: int | None):
        self.node, self.dim = node, dim


def rewrite(graph: OpGraph, plan: Plan, device_of: Callable[[str], str], *,
            loss_terms: bool | str = False, probe: bool = False, segments: bool = True) -> Rewritten:
    """See the module docstring.  Raises :class:`ExecutionError` for a graph not captured with
    torch.export or a split the shard rules cannot express.

    ``loss_terms``: instead of the model's outputs (each gathered whole on its first device),
    the graph returns the training loss (:func:`tensoropt.measure.step.training_loss`, Σ over
    floating-point outputs of their mean) as one term per part, computed where the part lies
    — ``part.float().mean()`` for a whole output (the first replica of an ``R`` one, or the only
    part), ``part.float().sum() / numel`` for every ``S`` piece and ``P`` part — so no output
    moves anywhere (what the simulator assumes; the
    distributed backend sums the terms of each rank).  ``loss_terms="check"``: the terms of the
    check's loss instead (:func:`~tensoropt.execute.check.check_term`: ``Σ part · W``, ``W`` the
    output's fixed weights cut as the part is).

    ``probe``: after the outputs, every operator's output whole on its mesh's first device
    (one tensor per operator with a single tensor output, in the plan's order; named by
    :attr:`Rewritten.probes`), so a check can find the first operator whose value differs.

    ``segments``: each recomputed segment of the plan as one checkpoint region
    (:mod:`.segments`, what the memory walk prices); ``False``: the graph flat, the segments'
    operators plain calls named in :attr:`Rewritten.segments` (the distributed backend, whose
    ranks run the graph node by node, runs them)."""
    ep, gm = graph.exported, graph.module
    if graph.expansion is not None:
        raise ExecutionError(f"graph {graph.name!r} was expanded to {graph.expansion.depth} blocks from a short "
                             "capture (a model on the meta device): it has no module at full depth, and a model "
                             "without weights cannot run; run a materialised model (fewer layers) captured whole")
    if ep is None or gm is None:
        raise ExecutionError(f"graph {graph.name!r} was not captured with torch.export (source {graph.source!r}); "
                             "the executor rewrites torch.export graphs: capture with method='export'")
    new = fx.Graph()
    transport = Transport(new, device_of)
    inputs = _placeholders(new, graph, ep, gm)
    keys = random_keys(gm.graph.nodes)
    seed = None
    if keys:
        # the step's seed of the keyed random draws (tensoropt.execute.randomness), a Python int
        seed = new.placeholder("rng_seed")
        inputs.sources.append(("seed", None))
    regions = recompute_segments(plan.order, plan.configs, graph)
    ctx = _Emitter(graph, plan, new, transport, inputs.values, inputs.lifted, inputs.batch_syms, device_of, keys,
                   seed)
    _emit_in_order(ctx, gm, plan)
    outs = _outputs(new, graph, ep, gm, transport, inputs.values, loss_terms)
    probes = [name for name in plan.order if name in graph.nodes and graph.nodes[name].kind == "op"
              and name in inputs.values and len(graph.nodes[name].outputs) == 1
              and not isinstance(inputs.values[name].dim, tuple)] if probe else []
    outs += [transport.whole(inputs.values[name], plan.configs[name].devices[0]) for name in probes]
    new.output(tuple(outs))
    root = torch.nn.Module()
    by_reference = _buffer_values(new, inputs.sources)
    if segments:
        checkpoint_segments(new, root, regions, op_of=lambda n: n.meta.get(OP_META),
                            by_ref=lambda n: n.name in by_reference, stays_after=writes_buffer)
    module = fx.GraphModule(root, new, class_name="PlannedGraph")
    return Rewritten(module, inputs.sources, ctx.fallbacks, tuple(probes), tuple(regions), by_reference)


def _buffer_values(graph: fx.Graph, sources: list[tuple[str, Any]]) -> frozenset[str]:
    """The nodes of ``graph`` that are a buffer (a placeholder of source ``buffer``), or a move or
    a copy of one."""
    out = {n.name for n, (kind, _) in zip(graph.find_nodes(op="placeholder"), sources) if kind == "buffer"}
    for n in graph.nodes:   # in order: a move or copy's source is seen first
        if (n.op == "call_method" and n.target in ("to", "clone") and isinstance(n.args[0], fx.Node)
                and n.args[0].name in out):
            out.add(n.name)
    return frozenset(out)


def writes_buffer(n: fx.Node) -> bool:
    """A node that writes into a buffer (a write-back, a synchronised batch norm's running
    statistics): it must not run again when a checkpoint region is recomputed."""
    return n.op == "call_function" and n.target in (write_back, syncbn.update_running_stats)


@dataclass
class _Inputs:
    """The rewritten graph's placeholders so far: every value as placed (on no device yet), what
    each placeholder stands for (:attr:`Rewritten.sources`), which are lifted parameters /
    buffers / constants, and the symbols of the batch size."""

    values: dict[str, Placed]
    sources: list[tuple[str, Any]]
    lifted: set[str]
    batch_syms: set[sympy.Symbol]


def _placeholders(new: fx.Graph, graph: OpGraph, ep: ExportedProgram, gm: fx.GraphModule) -> _Inputs:
    """One placeholder of ``new`` per placeholder of the capture, in its order (the same names
    and meta), and what each stands for by the export's input specs."""
    out = _Inputs({}, [], set(), set())
    specs = {getattr(s.arg, "name", None): s for s in ep.graph_signature.input_specs}
    n_inputs = 0
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        ph = new.placeholder(n.name)
        ph.meta = dict(n.meta)
        out.values[n.name] = Placed(R, (None,), (ph,))
        spec = specs[n.name]
        if spec.kind == InputKind.USER_INPUT:
            out.sources.append(("input", n_inputs))
            n_inputs += 1
            val = n.meta.get("val")
            size = val.shape[graph.batch_dim] if isinstance(val, torch.Tensor) and val.dim() > graph.batch_dim \
                else None
            if isinstance(size, torch.SymInt):
                out.batch_syms |= size.node.expr.free_symbols
            continue
        out.lifted.add(n.name)
        if spec.kind == InputKind.PARAMETER:
            out.sources.append(("parameter", spec.target))
        elif spec.kind == InputKind.BUFFER:
            out.sources.append(("buffer", spec.target))
        else:
            assert spec.target is not None   # a lifted constant names its tensor in ep.constants
            out.sources.append(("constant", ep.constants[spec.target]))
    return out


def _emit_in_order(ctx: _Emitter, gm: fx.GraphModule, plan: Plan) -> None:
    """Every tensor-valued node of the capture, in ``plan.order``, into ``ctx.values``: a getitem
    of a tuple-valued node follows its producer's placement, every other node is emitted."""
    src = {n.name: n for n in gm.graph.nodes}
    for name in plan.order:
        n = src[name]
        if not _has_tensor(n.meta.get("val")):
            continue  # sizes become constants where used; metadata asserts name the capture device
        tuple_of = n.args[0] if n.target is operator.getitem else None
        if isinstance(tuple_of, fx.Node) and isinstance(tuple_of.meta.get("val"), (list, tuple)):
            index = n.args[1]
            assert isinstance(index, int)   # a getitem of a tuple-valued ATen op: a constant index
            ctx.values[name] = ctx.values[tuple_of.name].element(
                index, lambda part, i: ctx.new.call_function(operator.getitem, (part, i)))
            continue
        root = ctx.new._root
        last = root.prev   # every node from here on is this operator's (moves and cuts included)
        ctx.values[name] = ctx.emit(n)
        node = last.next
        while node is not root:
            node.meta.setdefault(OP_META, name)
            node = node.next


def _outputs(new: fx.Graph, graph: OpGraph, ep: ExportedProgram, gm: fx.GraphModule, transport: Transport,
             values: dict[str, Placed], loss_terms: bool | str) -> list[fx.Node | Any]:
    """The rewritten graph's outputs: the model's outputs, each whole on its first device, or
    their loss terms where they lie (``loss_terms``, :func:`rewrite`)."""
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    outs: list[fx.Node | Any] = []
    floating = 0     # floating outputs so far (the check's weights are numbered by them)
    for a, spec in zip(out_node.args[0], ep.graph_signature.output_specs):
        if spec.kind != OutputKind.USER_OUTPUT:
            raise ExecutionError(f"the captured graph returns a {spec.kind.name} output; the executor runs graphs "
                                 "whose only outputs are the model's (capture in training IR, non-strict)")
        if loss_terms == "check":
            terms = _check_terms(new, graph, a, values, floating)
            floating += bool(terms)
            outs.extend(terms)
        elif loss_terms:
            outs.extend(_loss_terms(new, graph, a, values))
        elif isinstance(a, fx.Node):
            v = values[a.name]
            first = v.devices[0]
            # a user input returned as is lies on no plan device: it is its own placeholder
            outs.append(v.parts[0] if first is None else transport.whole(v, first))
        else:
            outs.append(a)
    return outs


def _loss_terms(new: fx.Graph, graph: OpGraph, a: Any, values: dict[str, Placed]) -> list[fx.Node]:
    """Output ``a``'s share of the training loss, one term per part where it lies (see
    :func:`rewrite`); none for a non-tensor or non-floating-point output.  Every element gets
    exactly the gradient the whole output's mean gives (``1 / numel`` in float32): a whole
    output's term is its mean, as :func:`~tensoropt.measure.step.training_loss` (and the profiler)
    compute it; a part's is :func:`dense_mean_term`, its sum over the whole's element count
    with the gradient the mean gives, materialised.  Both backwards hand the output's consumer a
    dense gradient, as a real loss's does (cross-entropy's gradient of the logits is dense) and
    as the memory walk counts it; a plain ``sum() / numel`` hands it an expanded scalar instead,
    0 bytes — GPT-2's data-parallel rank then peaked 7 % below the walk, the 8 MiB logits
    gradient missing — and ``(part / numel).sum()`` writes a part-sized copy in forward (1.5 ms a
    step for that logits piece).  Element counts are the captured ones (the meta's may be
    symbolic in the batch)."""
    node = graph.nodes.get(a.name) if isinstance(a, fx.Node) else None
    meta = node.outputs[0] if node is not None and len(node.outputs) == 1 else None
    if meta is None or not meta.dtype.startswith(("float", "bfloat")) or meta.numel == 0:
        return []
    v = values[a.name]
    parts = v.parts[:1] if v.kind == R else v.parts
    if len(parts) == 1:
        return [new.call_method("mean", (new.call_method("float", (parts[0],)),))]
    return [new.call_function(dense_mean_term, (new.call_method("float", (p,)), meta.numel)) for p in parts]


class _DenseMeanTerm(torch.autograd.Function):
    """``part.sum() / numel`` whose backward writes the mean's gradient out whole."""

    @staticmethod
    def forward(ctx: Any, part: torch.Tensor, numel: int) -> torch.Tensor:
        ctx.shape, ctx.numel = part.shape, numel
        return part.sum() / numel

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # the whole output's mean backward: the scalar expanded, divided by numel elementwise
        # (same float32 value in every element), then dense, as that division makes it
        return (grad / ctx.numel).expand(ctx.shape).contiguous(), None


def dense_mean_term(part: torch.Tensor, numel: int) -> torch.Tensor:
    """A piece's share of the mean of an output of ``numel`` elements, ``part.sum() / numel``,
    with the gradient the whole output's mean gives each of its elements, written out dense."""
    return _DenseMeanTerm.apply(part, numel)


def _check_terms(new: fx.Graph, graph: OpGraph, a: Any, values: dict[str, Placed], index: int) -> list[fx.Node]:
    """Output ``a``'s share of the check's loss, one term per part where it lies (the first
    replica of an ``R`` output, every ``S`` piece with its piece of the weights, every ``P`` part
    with the whole weights); none for a non-tensor or non-floating-point output."""
    node = graph.nodes.get(a.name) if isinstance(a, fx.Node) else None
    meta = node.outputs[0] if node is not None and len(node.outputs) == 1 else None
    if meta is None or not meta.dtype.startswith(("float", "bfloat")) or meta.numel == 0:
        return []
    v = values[a.name]
    if v.kind == R or len(v.parts) == 1:
        return [new.call_function(check_term, (v.parts[0], meta.shape, index))]
    if v.kind == P:
        return [new.call_function(check_term, (p, meta.shape, index)) for p in v.parts]
    return [new.call_function(check_term, (p, meta.shape, index, v.dim, len(v.parts), i)) for i,
            p in enumerate(v.parts)]


class _Emitter:
    """Emits one operator node at a time (state shared along the plan's order)."""

    def __init__(self, graph: OpGraph, plan: Plan, new: fx.Graph, transport: Transport, values: dict[str, Placed],
                 lifted: set[str], batch_syms: set[sympy.Symbol], device_of: Callable[[str], str],
                 keys: dict[str, int] | None = None, seed: fx.Node | None = None):
        self.graph, self.plan, self.new, self.tr, self.values = graph, plan, new, transport, values
        self.lifted, self.batch_syms, self.device_of = lifted, batch_syms, device_of
        self.keys, self.seed = keys or {}, seed
        self.fallbacks: list[str] = []

    # ---- one node ----------------------------------------------------------------------------
    def emit(self, n: fx.Node) -> Placed:
        op, cfg = self.graph.nodes[n.name], self.plan.configs[n.name]
        devices, k = cfg.devices, cfg.degree
        layout = Layout.of(cfg)
        base = op_basename(op.op)
        if layout == Layout.BATCH and base in _BATCH_NORMS and not op.split.batch_exact:
            # exact statistics over the whole batch (see the module docstring)
            synced = self._sync_batch_norm(n, op, devices) if base == "batch_norm" else None
            if synced is not None:
                return synced
            devices, layout = devices[:1], Layout.R
        if layout == Layout.R:
            return self._whole(n, op, devices)
        if not split_fits(layout, k, self.graph.batch_size):
            raise ExecutionError(f"node {n.name!r} is split {k} ways along a batch of {self.graph.batch_size}; "
                                 "use at most as many devices as samples")
        template = self._template(n, layout, op, k)
        if template is None:
            # no shard rule runs this op in this layout: compute it whole on the mesh's first
            # device (the same values; the consumers cut what they read)
            self.fallbacks.append(f"{n.name} ({op.op}): {layout} over {k} devices has no working shard rule; "
                                  f"run whole on {devices[0]}")
            return self._whole(n, op, devices[:1])
        batch = self.graph.batch_size
        # a channel piece cut from a whole tensor is not contiguous: a split view reshapes it
        target = torch.ops.aten.reshape.default if layout == Layout.CHANNEL and base in VIEWS else None
        which = "batch_dim" if layout == Layout.BATCH else "channel_dim"
        dims = tuple(getattr(t, which) for t in op.outputs)
        parts = []
        local_batch = piece_sizes(batch, k) if layout == Layout.BATCH and batch else [None] * k
        for i, d in enumerate(devices):
            parts.append(self._call(n, template, d, k, i, local_batch[i], writes_back=True,
                                    drop_bias=(layout == Layout.REDUCE and i > 0), base=base, target=target,
                                    piece_dim=dims[0] if layout != Layout.REDUCE and dims else None))
        if layout == Layout.REDUCE:
            return Placed(P, tuple(devices), tuple(parts))
        val = n.meta.get("val")
        dim = dims if isinstance(val, (list, tuple)) else dims[0]
        return Placed(S, tuple(devices), tuple(parts), dim)

    def _sync_batch_norm(self, n: fx.Node, op: OpNode, devices: tuple[str, ...]) -> Placed | None:
        """``aten.batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps,
        cudnn)`` in training, split along the batch with statistics summed across the mesh
        (module docstring); ``None`` when this form cannot be synchronised here."""
        x, weight, bias, rmean, rvar, training, momentum, eps = (list(n.args) + [None] * 9)[:8]
        xin = self.graph.nodes.get(x.name) if isinstance(x, fx.Node) else None
        if not isinstance(x, fx.Node) or not training or momentum is None or xin is None or not xin.outputs \
                or xin.outputs[0].batch_dim is None:
            return None
        shape, bdim = xin.outputs[0].shape, xin.outputs[0].batch_dim
        if len(shape) < 2 or bdim == 1:
            return None
        if xin.outputs[0].dtype in ("bfloat16", "float16"):
            # a bf16 graph (autocast): tensoropt.syncbn would sum the statistics in the input's
            # 16-bit dtype and cannot update float32 running statistics with them; run it whole
            # (exact) — the profiler offers no batch shard for it either (its local_step fails alike)
            return None
        k, g, tr = len(devices), self.new, self.tr
        dims = syncbn.reduce_dims(len(shape))
        count = 1
        for dim in dims:
            count *= shape[dim]
        xs = [tr.read(self.values[x.name], d, bdim, k, i) for i, d in enumerate(devices)]
        # two exchanges of one value per channel (tensoropt.syncbn): Σx, then Σ(x − mean)²; partial
        # (P) values on the mesh: reading them whole on a device adds them up
        sums = Placed(P, tuple(devices), tuple(g.call_function(syncbn.channel_sums, (xi, dims)) for xi in xs))
        means = [g.call_function(operator.truediv, (tr.whole(sums, d), count)) for d in devices]
        squares = Placed(P, tuple(devices), tuple(g.call_function(syncbn.centered_squares, (xi, mean, dims))
                                                  for xi, mean in zip(xs, means)))
        parts, variances = [], []
        for i, d in enumerate(devices):
            var = g.call_function(operator.truediv, (tr.whole(squares, d), count))
            variances.append(var)
            # weight and bias: nodes, or None for an affine-free batch norm
            w = tr.whole(self.values[weight.name], d) if isinstance(weight, fx.Node) else None
            b = tr.whole(self.values[bias.name], d) if isinstance(bias, fx.Node) else None
            parts.append(g.call_function(syncbn.normalize, (xs[i], means[i], var, w, b, eps)))
        buffers = [self.values[b.name].parts[0] if isinstance(b, fx.Node) else None for b in (rmean, rvar)]
        g.call_function(syncbn.update_running_stats, (*buffers, means[0], variances[0], count, momentum))
        return Placed(S, tuple(devices), tuple(parts), op.outputs[0].batch_dim)

    def _whole(self, n: fx.Node, op: OpNode, devices: tuple[str, ...]) -> Placed:
        template = self._template(n, None, op, 1)
        assert template is not None   # only a split's template can be refused
        parts = tuple(self._call(n, template, d, 1, i, None, writes_back=(i == 0))
                      for i, d in enumerate(devices))
        return Placed(R, tuple(devices), parts)

    # ---- which argument is cut along which dimension -----------------------------------------
    def _template(self, n: fx.Node, layout: Layout | None, op: OpNode, k: int) -> _Template | None:
        """``(args, kwargs)`` of one shard with every tensor argument a :class:`_Cut` and the
        other arguments as the shard rule sets them (e.g. a grouped conv's groups); ``None``
        when no shard rule runs ``n`` in ``layout`` (``None``: whole, never refused)."""
        info: dict[int, TensorArg] = {}
        shapes: dict[int, tuple[int, ...]] = {}

        def to_meta(a: fx.Node) -> Any:
            val = a.meta.get("val")
            if not isinstance(val, torch.Tensor):
                return a  # a size, kept as its node: resolved per shard
            t = torch.empty(_shape(val), dtype=val.dtype, device="meta")
            meta = None
            if a.name not in self.lifted and a.name in self.graph.nodes:
                outs = self.graph.nodes[a.name].outputs
                meta = outs[0] if outs else None
            info[id(t)] = TensorArg("param" if a.name in self.lifted else "activation", meta)
            shapes[id(t)] = t.shape
            return t

        args_m = fx.node.map_arg(n.args, to_meta)
        kwargs_m = dict(fx.node.map_arg(n.kwargs, to_meta))
        result = None
        if layout is not None:
            result = shard_args(op_basename(op.op), args_m, kwargs_m, info, layout, k, op.outputs[0])
            if result is None and layout != Layout.BATCH:
                return None
        new_args, new_kwargs = result if result is not None else (args_m, kwargs_m)
        if layout is not None and not self._shard_runs(n, op, layout, k, new_args, new_kwargs):
            return None

        def pair(orig: Any, old: Any, cut: Any) -> Any:
            if isinstance(orig, fx.Node):
                if not isinstance(old, torch.Tensor):
                    return orig
                diff = [d for d, (a, b) in enumerate(zip(shapes[id(old)], cut.shape)) if a != b]
                if len(diff) > 1:
                    raise ExecutionError(f"node {n.name!r}: the {layout} shard rule cuts {orig.name!r} along "
                                         f"several dimensions {diff}; give the node layout 'R'")
                return _Cut(orig, diff[0] if diff else None)
            if isinstance(orig, (list, tuple)):
                items = [pair(a, b, c) for a, b, c in zip(orig, old, cut)]
                return items if isinstance(orig, list) else tuple(items)
            return cut

        args = tuple(pair(a, b, c) for a, b, c in zip(n.args, args_m, new_args))
        kwargs = {key: pair(n.kwargs[key], kwargs_m[key], new_kwargs.get(key, kwargs_m[key])) for key in n.kwargs}
        for key in new_kwargs.keys() - n.kwargs.keys():
            kwargs[key] = new_kwargs[key]
        return args, kwargs

    def _shard_runs(self, n: fx.Node, op: OpNode, layout: Layout, k: int, args: Any,
                    kwargs: dict[str, Any]) -> bool:
        """Whether the largest shard, run on meta tensors, gives the shape the layout promises
        (the profiler's test of a shard rule, :mod:`tensoropt.measure.shards`)."""
        batch = largest_piece(self.graph.batch_size, k) if layout == Layout.BATCH and self.graph.batch_size else None
        # a bf16 graph's ops mix dtypes that only autocast reconciles (a conv of a bfloat16
        # activation with a float32 weight), and autocast does not run on meta tensors: the
        # shapes are what is checked, so every floating argument is float32 here
        mixed = getattr(self.graph, "precision", Precision.FP32) != Precision.FP32

        def concrete(obj: Any) -> Any:
            if isinstance(obj, fx.Node):
                return _sym_value(obj.meta["val"], self.batch_syms, batch)
            if mixed and isinstance(obj, torch.Tensor) and obj.is_floating_point():
                return obj.to(torch.float32)
            if isinstance(obj, torch.device):
                return torch.device("meta")
            if isinstance(obj, (list, tuple)):
                return type(obj)(concrete(o) for o in obj)
            return obj

        if not callable(n.target):
            return False   # not a call_function node (calling its name would fail alike)
        try:
            out = n.target(*concrete(tuple(args)), **{key: concrete(v) for key, v in kwargs.items()})
        except Exception:  # noqa: BLE001 - any failure means the rule does not apply to this op
            return False
        got = [tuple(t.shape) for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t,
                                                                                                        torch.Tensor)]
        want = []
        for t in op.outputs:
            shape = list(t.shape)
            d = t.batch_dim if layout == Layout.BATCH else t.channel_dim if layout == Layout.CHANNEL else None
            if d is not None:
                shape[d] = largest_piece(shape[d], k)
            elif layout != Layout.REDUCE:
                return False  # an output that is not cut would differ between shards
            want.append(tuple(shape))
        return got == want

    # ---- one shard ---------------------------------------------------------------------------
    def _call(self, n: fx.Node, template: _Template, device: str, k: int, index: int, batch: int | None,
              *, writes_back: bool, drop_bias: bool = False, base: str = "",
              target: Any = None, piece_dim: int | None = None) -> fx.Node:
        """One shard of ``n`` on ``device`` (``target``: another op to call, same arguments):
        piece ``index`` of ``k`` along its output's ``piece_dim``.  A random node draws keyed
        (:mod:`.randomness`): its piece of the draw the whole op would make."""
        target = target or n.target
        written = _written_args(n)
        backs: list[tuple[fx.Node, fx.Node, int | None]] = []

        def fill(obj: Any, pos: Any) -> Any:
            if isinstance(obj, _Cut):
                v = self.values[obj.node.name]
                piece = self.tr.read(v, device, obj.dim, k, index) if obj.dim is not None else self.tr.whole(v, device)
                if pos in written:
                    if obj.node.name not in self.lifted:
                        raise ExecutionError(f"node {n.name!r} ({n.target}) writes into its input {obj.node.name!r} in "
                                             "place; the executor only supports in-place updates of buffers")
                    piece = self.new.call_method("clone", (piece,))
                    backs.append((self.values[obj.node.name].parts[0], piece, obj.dim))
                return piece
            if isinstance(obj, fx.Node):  # a size that depends on the batch
                return _sym_value(obj.meta["val"], self.batch_syms, batch)
            if isinstance(obj, (list, tuple)):
                return type(obj)(fill(o, pos) for o in obj)
            if isinstance(obj, torch.device):
                return torch.device(self.device_of(device))
            return obj

        args_t, kwargs_t = template
        args = [fill(a, i) for i, a in enumerate(args_t)]
        kwargs = {key: fill(v, key) for key, v in kwargs_t.items()}
        if drop_bias:
            if base in _BIAS_AT_2:
                if len(args) > 2:
                    args[2] = None
                elif "bias" in kwargs:
                    kwargs["bias"] = None
            elif base in _BETA:
                kwargs["beta"] = 0
        if n.name in self.keys and is_keyed(n.target):
            op = self.graph.nodes[n.name]
            in_shapes = [tuple(_shape(a.meta["val"])) for a in n.args[:2]
                         if isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)]
            full = draw_shape(n.target, op.outputs[0].shape, in_shapes)
            # attention draws its weights' mask [.., L, S]: a piece of its output's last dim reads all of it
            dim = piece_dim if k > 1 and piece_dim is not None and not (
                base == "scaled_dot_product_attention" and piece_dim >= len(full) - 1) else None
            args = [n.target, self.seed, self.keys[n.name], full, dim, k if dim is not None else 1,
                    index if dim is not None else 0, *args]
            target = keyed_call
        out = self.new.call_function(target, tuple(args), kwargs)
        return self._finish(out, writes_back, backs, k, index)

    def _finish(self, out: fx.Node, writes_back: bool, backs: list[tuple[fx.Node, fx.Node, int | None]], k: int,
                index: int) -> fx.Node:
        """After a shard's call: write the buffers it updated back (once)."""
        if writes_back:
            for buffer, piece, dim in backs:
                self.new.call_function(write_back, (buffer, piece, dim, k, index))
        return out


# composite ops whose schema does not declare that they update their running statistics in place
_IMPLICIT_WRITES = {"batch_norm": ("running_mean", "running_var"), "instance_norm": ("running_mean", "running_var")}


def _written_args(n: fx.Node) -> set[int | str]:
    """Positions (ints) and keyword names of the arguments an ATen op writes in place."""
    schema = getattr(n.target, "_schema", None)
    if schema is None:
        return set()
    out: set[int | str] = set()
    implicit = _IMPLICIT_WRITES.get(op_basename(str(n.target)), ())
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write or a.name in implicit:
            out.add(i if not a.kwarg_only else a.name)
            out.add(a.name)
    return out
