"""Functionalize a captured graph: every in-place write to an activation becomes a new value.

torch.export's training IR keeps the in-place ops a model calls (``relu_`` of an
``inplace=True`` ReLU, a residual ``x += y``, ``bernoulli_`` of stochastic depth, the
``copy_`` of ``t[:, 0] = v``).  Every later stage reasons about values, not storage: the
profiler runs a node once per shard shape and per repeat (an in-place op run twice on a shared
tensor changes what it measures), the executor runs each shard on a piece of its input, and the
cost model counts an output per node.  So the capture rewrites, once, each in-place op whose
target is an *activation* (a tensor computed inside the graph) into its out-of-place variant,
and every later read of the mutated tensor — or of any view of it — into a read of the new
value:

- ``y = relu_(x)``  →  ``y = relu(x)``; later readers of ``x`` read ``y``;
- a write through a view, ``v = select(x, 2, 0); add_(v, d)``  →  ``v' = add(v, d);
  x' = select_scatter(x, v', 2, 0)``; later readers of ``x`` read ``x'`` and a view of ``x``
  read later is taken again from ``x'`` (what ``torch.func.functionalize`` does, restricted to
  the view ops below);
- when the out-of-place op would promote the dtype (``int += float``) the result is cast back,
  as the in-place op keeps its target's dtype;
- ``detach_`` writes no values (it only cuts autograd history): it becomes ``detach``, and later
  readers of its target — and of the tensor the target is (``y = h.to(h.device)`` returns ``h``
  itself; a ``to`` that converts returns a copy) — read the detached value; into an input or a
  buffer too, as nothing is written there.

In-place writes to *buffers* (batch norm's running statistics, ``num_batches_tracked``) stay:
they are the model's state, and the executor writes them back once.  A write into a user input
or a parameter, or through a view this pass cannot invert, is a :class:`CaptureError` naming
the op and its module.  O(V + E) per rewritten op in the worst case (later readers are
redirected by scanning the node's users).

Example::

    ep = torch.export.export(model, args, strict=False)
    renamed = functionalize(ep, placeholders)   # ep.graph_module now has no in-place activation op
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.fx as fx

from ..errors import CaptureError

aten = torch.ops.aten

# view op → how to write a new value of the view back into its base: f(base, value, *view_args)
_SCATTER: dict[Any, Callable[..., Any]] = {}


def _inverse_permutation(dims: Any, ndim: int) -> list[int]:
    dims = [d % ndim for d in dims]
    inv = [0] * ndim
    for i, d in enumerate(dims):
        inv[d] = i
    return inv


def _view_writeback(view: fx.Node) -> tuple[Any, tuple, dict] | None:
    """``(op, extra_args, kwargs)`` such that ``op(base, new_view_value, *extra_args)`` is the base
    with the view's elements replaced; ``None`` when this view cannot be inverted."""
    t = view.target
    base = view.args[0]
    base_val = base.meta.get("val") if isinstance(base, fx.Node) else None
    if t == aten.select.int:
        return aten.select_scatter.default, tuple(view.args[1:3]), {}
    if t == aten.slice.Tensor:
        args = list(view.args[1:]) + [None] * (4 - len(view.args[1:]))
        dim, start, end, step = (args + [0, None, None, 1])[:4]
        return aten.slice_scatter.default, (0 if dim is None else dim, start, end, 1 if step is None else step), {}
    if t == aten.diagonal.default:
        return aten.diagonal_scatter.default, tuple(view.args[1:]), {}
    if t == aten.as_strided.default:
        return aten.as_strided_scatter.default, tuple(view.args[1:]), {}
    if t in (aten.alias.default, aten.detach.default, aten.contiguous.default) or t in TO_OPS:
        return _identity, (), {}
    if base_val is None:
        return None
    if t in (aten.view.default, aten._unsafe_view.default, aten.unsqueeze.default, aten.squeeze.dim,
             aten.squeeze.dims, aten.squeeze.default, aten.flatten.using_ints, aten.unflatten.int) \
            or (t == aten.reshape.default and base_val.is_contiguous()):
        return aten.reshape.default, (list(base_val.shape),), {}
    if t == aten.permute.default:
        return aten.permute.default, (_inverse_permutation(view.args[1], base_val.dim()),), {}
    if t in (aten.transpose.int,):
        return aten.transpose.int, tuple(view.args[1:3]), {}
    if t in (aten.t.default,):
        return aten.t.default, (), {}
    return None


def _identity(base: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return value


def _scatter_call(op: Any, base: Any, value: Any, extra: tuple) -> tuple[Any, tuple]:
    """The node call that writes ``value`` back into ``base`` (views that reshape ignore base)."""
    if op in (aten.reshape.default, aten.permute.default, aten.transpose.int, aten.t.default):
        return op, (value, *extra)
    if op is _identity:
        return None, (value,)
    return op, (base, value, *extra)


def is_view_of_input(n: fx.Node) -> bool:
    """Whether node ``n`` returns a view of its first argument (so a write into it writes into
    that argument).  ``contiguous`` and ``reshape`` return a view only of a contiguous tensor, and
    ``to`` only when it converts nothing (it returns its input itself then); otherwise a copy,
    which a write does not reach back from."""
    t = n.target
    if not (isinstance(t, torch._ops.OpOverload) and t.is_view) or not isinstance(n.args[0], fx.Node):
        return False
    if t in (aten.contiguous.default, aten.reshape.default):
        base = n.args[0].meta.get("val")
        return isinstance(base, torch.Tensor) and base.is_contiguous()
    if t in TO_OPS:
        return to_returns_its_input(n)
    return True


# ``Tensor.to`` in every form: its input itself when there is nothing to convert, a copy otherwise
TO_OPS = frozenset(getattr(aten.to, o) for o in aten.to.overloads())


def to_returns_its_input(n: fx.Node) -> bool:
    """Whether the ``to`` call ``n`` converts nothing (same dtype, device, layout and strides, no
    ``copy=True``): torch returns the input tensor itself, so a write into it is a write into
    the input (``y = h.to(h.device); y.detach_()`` detaches ``h``)."""
    src, out = n.args[0].meta.get("val"), n.meta.get("val")    # type: ignore[union-attr]
    if not isinstance(src, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    schema = typing.cast(torch._ops.OpOverload, n.target)._schema
    names = [a.name for a in schema.arguments]
    copy = n.kwargs.get("copy", n.args[names.index("copy")] if len(n.args) > names.index("copy") else False)
    return not copy and (src.dtype, src.device, src.layout) == (out.dtype, out.device, out.layout) \
        and _sizes(src.shape) == _sizes(out.shape) and _sizes(src.stride()) == _sizes(out.stride())


def _sizes(sizes: Any) -> tuple:
    """Sizes or strides as comparable values (a symbolic one as its expression: comparing
    SymInts themselves would add guards to a finished export)."""
    return tuple(s.node.expr if isinstance(s, torch.SymInt) else int(s) for s in sizes)


def written_positions(target: Any) -> list[int]:
    """Positions of the tensor arguments an ATen op writes in place (its schema's ``(a!)``)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return []
    return [i for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only]


# in-place ops whose out-of-place form has another name
_FUNCTIONAL_NAMES = {"normal_": "normal_functional"}


def functional_variant(target: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The out-of-place overload of an in-place ATen op (``add_.Tensor`` → ``add.Tensor``,
    ``bernoulli_.float`` → ``bernoulli.p``): the overload of the op without the trailing ``_``
    whose arguments have the same names in the same order, or ``None``."""
    schema = target._schema
    name = schema.name.split("::")[-1]
    if not name.endswith("_"):
        return None
    packet = getattr(aten, _FUNCTIONAL_NAMES.get(name, name[:-1]), None)
    if packet is None:
        return None
    def signature(arguments: Any) -> list[tuple[str, str]]:
        # ``self`` of an in-place op is ``input`` of some functional ones (dropout_ → dropout)
        return [("self" if a.name == "input" else a.name, str(a.type)) for a in arguments]

    want = signature(schema.arguments)
    for overload in packet.overloads():
        op = getattr(packet, overload)
        args = op._schema.arguments
        if signature(args) == want and not any(a.alias_info is not None and a.alias_info.is_write
                                                      for a in args):
            return op
    return None


def functionalize(gm: fx.GraphModule, kind_of: Mapping[str, str],
                  where: Callable[[fx.Node], str]) -> dict[str, str]:
    """Rewrite every in-place op of ``gm`` whose target is an activation (module docstring).

    ``kind_of`` maps placeholder names to ``"input" | "parameter" | "buffer" | "constant"``;
    ``where(node)`` names the module a node came from, for errors.  Returns the renames
    ``{old node name: new node name}`` of nodes whose value a new node now holds (for the output
    signature).  Raises :class:`CaptureError` for a write into an input or parameter, or through
    a view that cannot be inverted.
    """
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    # node → (base node, the view node) chain: the activation a view reads from
    base_of: dict[fx.Node, fx.Node] = {}
    renames: dict[str, str] = {}
    changed = False
    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        if is_view_of_input(n):
            base_of[n] = n.args[0]
        chain = _written_chain(n, base_of, kind_of, where)
        if chain is None:
            continue
        root = chain[-1]
        new_val, new_root = _write_out_of_place(graph, n, chain, where)
        # later readers: of n itself (it returns its target) → the new view value; of the root
        # → the new root; of a view of the root taken before n → that view taken again
        created = {x for x in graph.nodes if x not in order}
        _redirect(n, new_val, order, after=n, skip=created)
        _redirect(root, new_root, order, after=n, skip=created)
        _take_views_again(graph, n, root, new_root, base_of, order)
        renames[n.name] = new_val.name
        graph.erase_node(n)
        order = {x: i for i, x in enumerate(graph.nodes)}
        changed = True
    changed |= drop_dead(graph)
    if changed:
        graph.lint()
        gm.recompile()
    return renames


def _written_chain(n: fx.Node, base_of: Mapping[fx.Node, fx.Node], kind_of: Mapping[str, str],
                   where: Callable[[fx.Node], str]) -> list[fx.Node] | None:
    """The activation ``n`` writes in place, as the chain target, its base, …, the root
    activation; ``None`` when ``n`` writes nothing in place or writes a buffer (model state: the
    executor writes it back).  A :class:`CaptureError` for a write into several arguments, an
    input or a parameter."""
    pos = written_positions(n.target)
    if not pos:
        return None
    if pos != [0] or not isinstance(n.args[0], fx.Node):
        raise CaptureError(f"{where(n)}: {n.target} writes into several arguments in place; tensoropt cannot "
                           "follow it — call its out-of-place form")
    target = n.args[0]
    chain = [target]                      # target, its base, …, the root activation
    while chain[-1] in base_of:
        chain.append(base_of[chain[-1]])
    root = chain[-1]
    if root.op == "placeholder":
        kind = kind_of.get(root.name, "input")
        if n.target == aten.detach_.default and kind != "parameter":
            return chain                 # writes no values (cuts autograd history): nothing to write back
        if kind == "buffer":
            return None                  # model state: the executor writes it back
        raise CaptureError(f"{where(n)}: {n.target} writes in place into the model's {kind} {root.name!r}; "
                           f"tensoropt plans need it unchanged by forward — write `x = x.op(...)` (out of place) "
                           "or clone it first")
    return chain


def _write_out_of_place(graph: fx.Graph, n: fx.Node, chain: list[fx.Node],
                        where: Callable[[fx.Node], str]) -> tuple[fx.Node, fx.Node]:
    """Insert before ``n`` its out-of-place call (cast back to its target's dtype) and, for a
    write through views, each view's new value written back into its base, inner to outer;
    ``(the new value of n's target, the new root)``.  A :class:`CaptureError` when the op has no
    out-of-place form or a view no inverse."""
    functional = functional_variant(typing.cast(torch._ops.OpOverload, n.target))   # written: an ATen op
    if functional is None:
        raise CaptureError(f"{where(n)}: the in-place op {n.target} has no out-of-place form tensoropt knows; "
                           "write the out-of-place call in the model")
    with graph.inserting_before(n):
        new_val = graph.call_function(functional, n.args, n.kwargs)
        new_val.meta = dict(n.meta)
        new_val = _keep_dtype(graph, new_val, n)
        value = new_val
        for view in chain[:-1]:           # write the view's new value back, inner to outer
            inv = _view_writeback(view)
            if inv is None:
                raise CaptureError(f"{where(n)}: {n.target} writes through the view {view.target} "
                                   "(no inverse known to tensoropt); write the out-of-place form")
            op, extra, _ = inv
            base = typing.cast(fx.Node, view.args[0])
            op, args = _scatter_call(op, base, value, extra)
            if op is not None:
                value = graph.call_function(op, args)
                value.meta = {k: v for k, v in base.meta.items() if k != "stack_trace"}
                value.meta["nn_module_stack"] = n.meta.get("nn_module_stack", base.meta.get("nn_module_stack"))
    return new_val, value


def _take_views_again(graph: fx.Graph, n: fx.Node, root: fx.Node, new_root: fx.Node,
                      base_of: dict[fx.Node, fx.Node], order: Mapping[fx.Node, int]) -> None:
    """Every view of ``root`` taken before ``n`` taken again from ``new_root`` (a view of a view
    from its base taken again), for the readers after ``n``; unread ones are dropped later."""
    again: dict[fx.Node, fx.Node] = {root: new_root}
    anchor = new_root
    for alias in [a for a in list(base_of) if order.get(a, 1 << 60) < order[n] and _root(a, base_of) is root]:
        later = [u for u in alias.users if u in order and order[u] > order[n]]
        with graph.inserting_after(anchor):
            fresh = graph.call_function(typing.cast(Callable[..., Any], alias.target),
                                        (again[base_of[alias]], *alias.args[1:]), alias.kwargs)
            fresh.meta = dict(alias.meta)
        again[alias] = anchor = fresh
        base_of[fresh] = again[base_of[alias]]
        for u in later:
            u.replace_input_with(alias, fresh)


def drop_dead(graph: fx.Graph) -> bool:
    """Erase operator nodes nobody reads (views left behind by the rewrite, the parts of a
    ``ModelOutput`` the loss does not read), except those that write in place or draw random
    numbers (removing a draw would shift every later one).  Returns whether any was erased."""
    erased = False
    for n in reversed(list(graph.nodes)):
        if n.op != "call_function" or n.users or written_positions(n.target) or _is_random(n.target):
            continue
        if not isinstance(n.target, torch._ops.OpOverload) and n.target.__module__ not in ("_operator", "operator"):
            continue
        graph.erase_node(n)
        erased = True
    return erased


def _is_random(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


def _root(n: fx.Node, base_of: Mapping[fx.Node, fx.Node]) -> fx.Node:
    while n in base_of:
        n = base_of[n]
    return n


def _redirect(old: fx.Node, new: fx.Node, order: Mapping[fx.Node, int], *, after: fx.Node,
              skip: set[fx.Node]) -> None:
    """Readers of ``old`` placed after ``after`` (and not in ``skip``) read ``new`` instead."""
    for u in list(old.users):
        if u in skip or order[u] <= order[after]:
            continue
        u.replace_input_with(old, new)


def _keep_dtype(graph: fx.Graph, new_val: fx.Node, inplace: fx.Node) -> fx.Node:
    """Cast the out-of-place result back to the in-place target's dtype when they differ."""
    want = typing.cast(fx.Node, inplace.args[0]).meta.get("val")
    got = _meta_dtype(new_val)
    if want is None or got is None or got == want.dtype:
        return new_val
    cast = graph.call_function(aten._to_copy.default, (new_val,), {"dtype": want.dtype})
    cast.meta = dict(inplace.meta)
    return cast


def _meta_dtype(node: fx.Node) -> torch.dtype | None:
    """The dtype the node's op gives on meta tensors of its arguments' shapes."""
    def meta(a: Any) -> Any:
        val = a.meta.get("val") if isinstance(a, fx.Node) else None
        if isinstance(val, torch.Tensor):
            return torch.empty([int(s.node.hint) if isinstance(s, torch.SymInt) else int(s) for s in val.shape],
                               dtype=val.dtype, device="meta")
        if isinstance(a, fx.Node):
            return val
        return a
    try:
        target = typing.cast(Callable[..., Any], node.target)
        out = target(*fx.node.map_aggregate(node.args, meta), **fx.node.map_aggregate(node.kwargs, meta))
    except Exception:  # noqa: BLE001 - unknown: keep the op's own result
        return None
    return out.dtype if isinstance(out, torch.Tensor) else None
