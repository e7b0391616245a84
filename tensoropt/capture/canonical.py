"""Canonicalize a captured graph: node order and node names that depend on its structure only.

torch.export records ops in the order the model's Python code ran them, and torch.fx names
nodes in that order (``to``, ``to_1``, …).  Where the code iterates something unordered — Gemma 3
computes its rotary embeddings for each of ``set(config.layer_types)`` — two independent
computations are traced in an order that changes with the process's hash seed, so the same
model gives two graphs, two OpGraphs and two fingerprints in two processes (and a plan written
by one refused by the other).  This pass makes both the order and the names a function of the
graph's structure:

- **order**: placeholders stay first, in their order; every other node is put in the post-order
  of a depth-first search from the output node that visits each node's inputs in argument order
  (``node.all_input_nodes``), a node emitted after its inputs.  Nodes the output does not reach
  (an in-place update of a buffer such as ``num_batches_tracked.add_(1)``, an ``_assert_*``, a
  random draw whose result is unused) are emitted right after their last input that is not a
  placeholder, so that they do not keep it alive to the end of the graph; those that read only
  placeholders (or nothing) at the end; in traced order among themselves.  The output node is
  last.
- **in-place writes keep their place**: an op that writes an argument in place (a buffer the
  functionalization left in place: ``add_``, training batch norm's running statistics) stays
  after the nodes that touch the same tensor (or a view of it) before it in traced order, and
  before those that touch it after, by extra ordering edges; their traced order is their meaning.
- **names**: every node but placeholders and the output is renamed in the new order, fx's way:
  the base of its name (``to_5`` → ``to``, ``getitem_12`` → ``getitem``, ``conv2d`` stays) made
  unique by a counter (``to``, ``to_1``, …).  Placeholders keep their names (an exported
  program's input specs name them).

Anything else whose meaning is the traced order must be recorded before this pass: the capture
records every random node's position among the draws
(:func:`tensoropt.execute.randomness.record_random_keys`; the eager model draws in traced order).

The search is iterative (graphs of 10k+ nodes); the pass is O(V + E), plus sorting, for each
tensor written in place, the nodes that touch it.

Example::

    ep = torch.export.export(model, args, strict=False)
    renames = canonicalize(ep.graph_module)     # {old name: new name} of the renamed nodes
    update_signature(ep, renames)               # output specs name the renamed nodes

A model computing ``tanh(2x) - tanh(3x)`` whose code ran the ``3x`` branch first (say it
iterates a set), before::

    %x : placeholder
    %mul : call_function[operator.mul](x, 3.0)
    %tanh : call_function[torch.tanh](mul)
    %mul_1 : call_function[operator.mul](x, 2.0)
    %tanh_1 : call_function[torch.tanh](mul_1)
    %sub : call_function[operator.sub](tanh_1, tanh)
    return sub

after — the same whichever branch ran first (``sub``'s first argument is searched first)::

    %x : placeholder
    %mul : call_function[operator.mul](x, 2.0)
    %tanh : call_function[torch.tanh](mul)
    %mul_1 : call_function[operator.mul](x, 3.0)
    %tanh_1 : call_function[torch.tanh](mul_1)
    %sub : call_function[operator.sub](tanh, tanh_1)
    return sub
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.fx as fx
from torch.fx.graph import _Namespace

__all__ = ["canonicalize", "canonical_order", "update_signature"]

_SUFFIX = re.compile(r"_\d+$")


def canonicalize(gm: fx.GraphModule) -> dict[str, str]:
    """Put ``gm``'s nodes in canonical order and give them canonical names (module docstring);
    ``gm`` is changed in place and recompiled.  Returns ``{old name: new name}`` for every node
    whose name changed (to update what refers to nodes by name, e.g. :func:`update_signature`)."""
    graph = gm.graph
    order = canonical_order(graph)
    out = order[-1]
    for n in order[:-1]:
        if n.op != "placeholder":
            out.prepend(n)          # moves the node: the new order, placeholders left first
    renames = _rename(graph, order)
    graph.lint()
    gm.recompile()
    return renames


def canonical_order(graph: fx.Graph) -> list[fx.Node]:
    """Every node of ``graph`` in canonical order (module docstring): placeholders first in
    their order, the output last.  The graph is not changed."""
    nodes = list(graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    outputs = [n for n in nodes if n.op == "output"]
    if len(outputs) != 1:
        raise ValueError(f"a graph with {len(outputs)} output nodes cannot be put in canonical order")
    extra = _write_order_edges(nodes, pos)

    def deps(n: fx.Node) -> list[fx.Node]:
        return n.all_input_nodes + extra[n] if n in extra else n.all_input_nodes

    reach = _reachable(outputs[0], deps)
    emitter = _Emitter(nodes, reach, deps)
    _emit_post_order(outputs[0], deps, emitter)
    for n in emitter.last:
        emitter.emit(n)
    order = emitter.order
    order.append(outputs[0])
    if len(order) != len(nodes):
        missing = [n.name for n in nodes if n not in emitter.emitted]
        raise AssertionError(f"canonical order lost nodes {missing[:5]} (a cycle?)")
    return order


def _reachable(output: fx.Node, deps: Callable[[fx.Node], list[fx.Node]]) -> set[fx.Node]:
    """The nodes ``output`` depends on (through ``deps``), itself included."""
    reach: set[fx.Node] = set()
    stack = [output]
    while stack:
        n = stack.pop()
        if n not in reach:
            reach.add(n)
            stack.extend(deps(n))
    return reach


class _Emitter:
    """The canonical order as it is built: placeholders first, then each node :meth:`emit`-ted,
    each node the output does not reach right after the last of its inputs (in traced order);
    :attr:`last`: the unreached nodes reading only placeholders (or nothing), which come at the end."""

    def __init__(self, nodes: list[fx.Node], reach: set[fx.Node], deps: Callable[[fx.Node], list[fx.Node]]):
        self.order: list[fx.Node] = [n for n in nodes if n.op == "placeholder"]
        self.emitted: set[fx.Node] = set(self.order)
        # the unreached nodes wait for their inputs: how many are not emitted yet, and who waits on
        # whom; those reading only placeholders (or nothing) come at the end
        self.waiting: dict[fx.Node, int] = {}
        self.waiters: dict[fx.Node, list[fx.Node]] = {}
        self.last: list[fx.Node] = []
        for n in nodes:
            if n in reach or n in self.emitted:
                continue
            pending = [d for d in dict.fromkeys(deps(n)) if d not in self.emitted]
            self.waiting[n] = len(pending)
            for d in pending:
                self.waiters.setdefault(d, []).append(n)     # traced order
            if not pending:
                self.last.append(n)

    def emit(self, first: fx.Node) -> None:
        """Append ``first``, then every unreached node it releases (its last pending input), depth first."""
        todo = [first]
        while todo:
            n = todo.pop()
            self.order.append(n)
            self.emitted.add(n)
            released = []
            for w in self.waiters.get(n, ()):
                self.waiting[w] -= 1
                if not self.waiting[w]:
                    released.append(w)
            todo.extend(reversed(released))        # the first released is emitted next


def _emit_post_order(output: fx.Node, deps: Callable[[fx.Node], list[fx.Node]], emitter: _Emitter) -> None:
    """Emit every node ``output`` reaches, but itself, in post-order: a depth-first search from
    the output, inputs in argument order."""
    frames: list[tuple[fx.Node, Any]] = [(output, iter(deps(output)))]
    started = {output}
    while frames:
        n, it = frames[-1]
        for d in it:
            if d not in emitter.emitted and d not in started:
                started.add(d)
                frames.append((d, iter(deps(d))))
                break
        else:
            frames.pop()
            if frames:
                emitter.emit(n)


def update_signature(ep: Any, renames: dict[str, str]) -> None:
    """Rename the nodes ``ep``'s output specs and module call signatures name (an
    ``ExportedProgram`` whose graph module :func:`canonicalize` renamed).  Input specs name
    placeholders, which keep their names."""
    if not renames:
        return
    args = [getattr(s, "arg", None) for s in ep.graph_signature.output_specs]
    for entry in getattr(ep, "module_call_graph", None) or ():
        sig = getattr(entry, "signature", None)
        if sig is not None:
            args += list(sig.inputs) + list(sig.outputs)
    for a in args:
        name = getattr(a, "name", None)
        if isinstance(name, str) and name in renames and a is not None:
            a.name = renames[name]


# ------------------------------------------------------------------------------ names

def _rename(graph: fx.Graph, order: list[fx.Node]) -> dict[str, str]:
    """Rename the nodes (placeholders and the output kept) in ``order``, fx's way; rebuilds the
    graph's namespace (fx never frees a name, so renaming node by node would not give ``to``
    back once another node had had it).  Returns ``{old: new}`` of the names that changed."""
    keep = [n for n in order if n.op in ("placeholder", "output")]
    ns = _Namespace()
    for n in keep:
        ns._used_names.add(n.name)
        ns.associate_name_with_obj(n.name, n)
    new_names: dict[fx.Node, str] = {}
    for n in order:
        if n.op not in ("placeholder", "output"):
            new_names[n] = ns.create_name(_SUFFIX.sub("", n.name) or n.name, n)
    renames = {n.name: new for n, new in new_names.items() if n.name != new}
    # the new names are set all at once: a node may take a name another had (``to_4`` ↔ ``to_8``)
    for n, new in new_names.items():
        if n.name != new:
            n.name = new
    graph._graph_namespace = ns
    return renames


# ------------------------------------------------------------------------------ in-place writes

def _written(n: fx.Node) -> list[fx.Node]:
    """The nodes ``n`` writes in place: arguments its schema marks ``(a!)``, and the running
    statistics of a training batch norm (whose schema does not say it updates them)."""
    t = n.target
    if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
        return []
    out: list[fx.Node] = []
    args = t._schema.arguments
    bound: dict[str, Any] = {}
    for i, a in enumerate(args):
        if not a.kwarg_only and i < len(n.args):
            bound[a.name] = n.args[i]
        elif a.name in n.kwargs:
            bound[a.name] = n.kwargs[a.name]
    for a in args:
        if a.alias_info is not None and a.alias_info.is_write:
            out += [x for x in _nodes_in(bound.get(a.name))]
    if bound.get("training") is True:
        for name in ("running_mean", "running_var"):
            out += [x for x in _nodes_in(bound.get(name))]
    return list(dict.fromkeys(out))


def _nodes_in(value: Any) -> Iterable[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg(value, lambda x: _noted(found, x))
    return found


def _noted(found: list[fx.Node], x: fx.Node) -> fx.Node:
    """Append ``x`` to ``found`` and return it (a map_arg callback that collects the nodes)."""
    found.append(x)
    return x


def _is_view(n: fx.Node) -> bool:
    t = n.target
    if n.op != "call_function" or not isinstance(t, torch._ops.OpOverload):
        return False
    returns = t._schema.returns
    return bool(returns) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


def _write_order_edges(nodes: list[fx.Node], pos: dict[fx.Node, int]) -> dict[fx.Node, list[fx.Node]]:
    """Extra inputs that keep in-place writes where they were: for every tensor written in place
    (with its views), the nodes touching it between two writes come after the first and before
    the second, in traced order.  ``{node: its extra inputs}``; empty for a graph without
    in-place writes."""
    writers = {n: _written(n) for n in nodes}
    writers = {n: w for n, w in writers.items() if w}
    if not writers:
        return {}
    # a tensor written in place is its base and every view taken of it (transitively)
    def base(x: fx.Node) -> fx.Node:
        while _is_view(x) and x.args and isinstance(x.args[0], fx.Node):
            x = x.args[0]
        return x

    groups: dict[fx.Node, list[fx.Node]] = {}
    for w in writers.values():
        for x in w:
            b = base(x)
            if b in groups:
                continue
            members, stack = [], [b]
            while stack:
                m = stack.pop()
                members.append(m)
                stack.extend(u for u in m.users if _is_view(u) and u.args and u.args[0] is m)
            groups[b] = members
    extra: dict[fx.Node, list[fx.Node]] = {}

    def edge(before: fx.Node, after: fx.Node) -> None:
        if before is not after and before not in after.all_input_nodes:
            lst = extra.setdefault(after, [])
            if before not in lst:
                lst.append(before)

    for members in groups.values():
        touching = set(m for m in members if m.op != "placeholder")
        for m in members:
            touching.update(m.users)
        seq = sorted(touching, key=pos.__getitem__)
        last_write: fx.Node | None = None
        since: list[fx.Node] = []          # touched since the last write
        for n in seq:
            is_write = n in writers and any(base(x) is members[0] for x in writers[n])
            if is_write:
                for t in since:
                    edge(t, n)
                if last_write is not None:
                    edge(last_write, n)
                last_write, since = n, []
            else:
                if last_write is not None:
                    edge(last_write, n)
                since.append(n)
    return extra
