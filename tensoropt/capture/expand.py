"""Capture at size by expansion: a model whose blocks repeat, captured short, at its full depth.

Llama-3-405B's 126 decoder layers are 126 copies of one block; tracing all of them through
torch.export takes about a minute on two cores to learn what four of them already say.  When a
model can be built at another depth (the zoo's ``layers``, an ``hf:`` spec's ``layers``), it is
built and captured at :data:`SHORT` (4) and ``SHORT - 1`` (3) blocks, and the graph at its full
depth is synthesised from the 4-block capture (:func:`expand`):

- the 4-block graph's nodes fall, in their canonical order (:mod:`tensoropt.capture.canonical`),
  into ``A`` (the model's own operators before the stack, and block 0, among which the values
  every block shares — rotary tables, masks — are computed where block 0 first reads them),
  blocks 1, 2 and 3 (each contiguous, each only its own operators) and ``S`` (after the stack:
  the final norm, the head, the loss, the output).  Block ``i`` is the operators whose module
  path lies under ``<stack>.<i>``, the stack being the ``ModuleList`` whose length is the depth;
- the graph at depth ``N`` is ``A``, block 1, block 2 repeated as blocks ``2 … N-2``, block 3 as
  block ``N-1``, and ``S``.  A copy of block 2 reads its own copy, the copy before it where block
  2 reads block 1 (operator for operator: blocks 1 and 2 must be the same, checked), and ``A``'s
  shared values as block 2 does; block 3 and ``S`` read block ``N-2`` where they read block 2.
  Module paths and parameter names carry the new block index (``model.layers.17.mlp``), the
  parameters are listed in the order torch.export lists them (block by block), each parameter's
  owner and readers follow the copies, and every operator is named in the new order as
  :func:`~tensoropt.capture.canonical.canonicalize` names a capture (fx's counters: ``linear_7``
  …), so the graph — nodes, names, edges, parameters, fingerprint — is the one a capture of the
  whole model gives.

Before a graph is synthesised, the 4-block capture less a block (:func:`expand` to 3 blocks) must
equal the 3-block capture, node for node: the extra block is a repeat, in its operators, shapes,
wiring, names and parameters (:func:`capture_by_expansion`).  Where anything does not fit — no
single stack, blocks that differ, a block reading another than the one before it, a parameter
shared across blocks first used inside a repeated one — :class:`NotExpandable` says why, and the
caller captures the whole model.

The synthesised graph has no ``torch.fx`` module at its full depth: its :class:`Expansion` keeps
the 4-block capture (module, example inputs) and which of its nodes every node copies
(``origin``), so an untimed profile is the short graph's with each copy's costs
(:func:`tensoropt.measure.profile`).

Example (Llama 3 at a tiny width, its 32 layers on the meta device)::

    >>> from tensoropt import zoo
    >>> from tensoropt.capture import capture
    >>> def build(layers):
    ...     model, inputs = zoo.build("llama3-8b", {"layers": layers, "hidden": 64, "ffn": 128, "heads": 4,
    ...                                             "kv_heads": 2, "vocab": 256, "batch": 2, "seq_len": 16})
    ...     return model, ModelCall(inputs)
    >>> graph = capture_by_expansion(build, 32, capture)
    >>> graph.expansion.depth, len(graph.ops), graph.module is None
    (32, 1728, True)
    >>> graph.nodes["linear_222"].module_path, graph.nodes["linear_222"].params
    ('model.model.layers.31.mlp.up_proj', ('model.model.layers.31.mlp.up_proj.weight',))
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import cast

import torch
from torch import nn
from torch.fx.graph import _Namespace

from ..graph import OpGraph, OpNode, ParamInfo
from .call import ModelCall

__all__ = ["SHORT", "Expansion", "NotExpandable", "block_index", "capture_by_expansion", "expand", "stack_path"]

#: the blocks of the capture a graph is expanded from: block 0 (where the shared values are
#: computed), blocks 1 and 2 (repeats: block 2 is copied) and block 3 (the last)
SHORT = 4

_SUFFIX = re.compile(r"_\d+$")


class NotExpandable(Exception):
    """Why a model cannot be captured short and expanded (one line, for the graph's notes)."""


@dataclass(frozen=True)
class Expansion:
    """How a graph was synthesised: ``template``, the capture at :data:`SHORT` blocks (with its
    module and example inputs), the ``stack`` it repeats (``model.model.layers``), the ``depth``
    reached, and ``origin``: every node of the graph → the template node it copies."""

    template: OpGraph
    stack: str
    depth: int
    origin: Mapping[str, str]


def block_index(name: str, stack: str) -> int | None:
    """The block of ``stack`` a module path or parameter name lies in, else ``None``.

    >>> block_index("model.layers.12.mlp.up_proj", "model.layers"), block_index("model.norm", "model.layers")
    (12, None)
    """
    if not name.startswith(stack + "."):
        return None
    head = name[len(stack) + 1:].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _reindexed(name: str, stack: str, old: int, new: int) -> str:
    """``name`` with its block index ``old`` of ``stack`` replaced by ``new`` (unchanged elsewhere)."""
    if old == new or block_index(name, stack) != old:
        return name
    return f"{stack}.{new}{name[len(stack) + 1 + len(str(old)):]}"


def stack_path(short: nn.Module, shorter: nn.Module) -> str:
    """The module path of the one ``ModuleList`` / ``Sequential`` whose length is the depth:
    :data:`SHORT` in ``short``, one less in ``shorter``."""
    lists = (nn.ModuleList, nn.Sequential)
    found = [name for name, m in short.named_modules() if isinstance(m, lists) and len(m) == SHORT]
    other = {name: len(m) for name, m in shorter.named_modules() if isinstance(m, lists)}
    stacks = [name for name in found if other.get(name) == SHORT - 1]
    if len(stacks) != 1:
        raise NotExpandable(f"no single list of blocks follows the depth ({', '.join(stacks) or 'none'} found)")
    return stacks[0]


def check_alike(whole: nn.Module, short: nn.Module, stack: str) -> None:
    """Refuse (:class:`NotExpandable`) a model whose blocks are not built alike: every block of
    ``whole`` (the model at its full depth, on the meta device: no memory), and block 2 of
    ``short``, the same modules with the same parameters, buffers and settings (a module's plain
    attributes: a sliding window, an expert count), its own index (``layer_idx``) aside — what a
    config that varies its blocks (Gemma 3's sliding / full attention every sixth layer, DeepSeek's
    first dense layers) builds, which four blocks may not show."""
    blocks = list(cast(nn.ModuleList, whole.get_submodule(stack)))
    if len(blocks) < SHORT:
        raise NotExpandable(f"{stack} holds {len(blocks)} blocks at full depth")
    first = _form(blocks[0], 0)
    for i, b in enumerate(blocks[1:], 1):
        if _form(b, i) != first:
            raise NotExpandable(f"block {i} of {stack} is not built as block 0 ({_first_unlike(_form(b, i), first)})")
    if _form(cast(nn.ModuleList, short.get_submodule(stack))[2], 2) != first:
        raise NotExpandable(f"the blocks of {stack} are built otherwise at {SHORT} blocks than at {len(blocks)}")


_PLAIN = (bool, int, float, str, type(None), torch.dtype)


def _form(block: nn.Module, index: int) -> list[tuple]:
    """What :func:`check_alike` compares: each module of ``block`` with its type, parameters and
    buffers (shape, dtype) and plain attributes, an attribute holding ``index`` under a name
    saying so (``layer_idx``) read as the index."""
    out = []
    for name, m in block.named_modules():
        attrs = []
        for k, v in sorted(vars(m).items()):
            if k.startswith("_") or not (isinstance(v, _PLAIN) or isinstance(v, (tuple, list))
                                         and all(isinstance(x, _PLAIN) for x in v)):
                continue
            if ("idx" in k or "index" in k or k == "layer_id") and v == index and not isinstance(v, bool):
                v = "<block index>"
            attrs.append((k, repr(v)))
        tensors = [(k, tuple(t.shape), str(t.dtype)) for k, t in (*m.named_parameters(recurse=False),
                                                                  *m.named_buffers(recurse=False)) if t is not None]
        out.append((name, type(m).__qualname__, tuple(tensors), tuple(attrs)))
    return out


def _first_unlike(a: list[tuple], b: list[tuple]) -> str:
    for x, y in zip(a, b):
        if x != y:
            what = "type" if x[1] != y[1] else "parameters" if x[2] != y[2] else "settings"
            return f"{x[0] or 'the block'}: {what} differ"
    return f"{len(a)} / {len(b)} modules"


# ------------------------------------------------------------------------------ the template

#: the parts of the template (module docstring): before the stack (with block 0), blocks 1-3, after it
_A, _S = "A", "S"


@dataclass(frozen=True)
class _Parts:
    """The template's nodes by part: ``A``, blocks 1-3, ``S``; each node's part and block."""

    a: list[OpNode]
    blocks: dict[int, list[OpNode]]
    s: list[OpNode]
    part: dict[str, str | int]
    block: dict[str, int | None]



def _parts(template: OpGraph, stack: str) -> _Parts:
    """The template's parts.  A block's part is its operators (one run) and the operators outside
    the stack that follow it before the next block (a residual sum the loop over the blocks
    computes itself): as many after block 3 as follow blocks 1 and 2."""
    nodes = list(template.nodes.values())
    block = {n.name: block_index(n.module_path, stack) for n in nodes}
    at: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        b = block[n.name]
        if b is not None:
            at.setdefault(b, []).append(i)
    if sorted(at) != list(range(SHORT)):
        raise NotExpandable(f"the capture's operators lie in blocks {sorted(at)} of {stack}, not in each of its "
                            f"{SHORT}")
    for b in range(1, SHORT):
        if at[b][-1] - at[b][0] + 1 != len(at[b]):
            raise NotExpandable(f"block {b} of {stack} is not one run of operators (the model computes something "
                                "between them)")
    if at[0][-1] > at[1][0]:
        raise NotExpandable(f"block 0 of {stack} has operators after block 1's")
    after = [at[b + 1][0] - at[b][-1] - 1 for b in (1, 2)]    # operators outside the stack after blocks 1, 2
    if after[0] != after[1]:
        raise NotExpandable(f"{after[0]} and {after[1]} operators outside {stack} follow its blocks 1 and 2")
    end = at[SHORT - 1][-1] + 1 + after[1]
    if end > len(nodes) or any(block[n.name] is not None for n in nodes[at[SHORT - 1][-1] + 1:end]):
        raise NotExpandable(f"the operators after block {SHORT - 1} of {stack} are not those after the others")
    bounds = {1: (at[1][0], at[2][0]), 2: (at[2][0], at[3][0]), SHORT - 1: (at[SHORT - 1][0], end)}
    blocks = {b: nodes[lo:hi] for b, (lo, hi) in bounds.items()}
    a, s = nodes[:at[1][0]], nodes[end:]
    part: dict[str, str | int] = {n.name: _A for n in a}
    part.update((n.name, _S) for n in s)
    for b, ns in blocks.items():
        part.update((n.name, b) for n in ns)
    return _Parts(a, blocks, s, part, block)


def _same_blocks(parts: _Parts, stack: str) -> dict[str, str]:
    """Block 1's node → block 2's at the same place, checked to be the same operator: op, name,
    shapes, splits, module and parameters (block index aside), and what it reads — its own block
    at the same place, the block before (block 0 or 1), or the same value computed before the
    stack (outside the blocks, or in block 0 and read by every block: a size export computed once)."""
    one, two = parts.blocks[1], parts.blocks[2]
    if len(one) != len(two):
        raise NotExpandable(f"blocks 1 and 2 of {stack} differ: {len(one)} and {len(two)} operators")
    pos = {n.name: i for i, n in enumerate(one)} | {n.name: i for i, n in enumerate(two)}

    def form(n: OpNode, b: int) -> tuple:
        return (_SUFFIX.sub("", n.name), n.op, n.kind, n.outputs, n.split, n.metadata_only, n.generator,
                n.module_type, _reindexed(n.module_path, stack, b, 0), n.input_bytes, len(n.inputs),
                tuple(_reindexed(p, stack, b, 0) for p in n.params),
                tuple(_reindexed(p, stack, b, 0) for p in n.param_reads))

    def same_read(u: str, v: str) -> bool:
        pu, pv = parts.part[u], parts.part[v]
        return (pu, pv) == (1, 2) and pos[u] == pos[v] or u == v and pu == _A or pu == _A and pv == 1

    for x, y in zip(one, two):
        if form(x, 1) != form(y, 2) or not all(same_read(u, v) for u, v in zip(x.inputs, y.inputs)):
            raise NotExpandable(f"blocks 1 and 2 of {stack} differ at {x.name} / {y.name} ({x.op} / {y.op})")
    return {x.name: y.name for x, y in zip(one, two)}


# ------------------------------------------------------------------------------ expanding

#: a node of the expanded graph: (template node, copy) — copy ``j`` of a block-2 node is block ``j``;
#: ``None`` for the nodes that appear once (A, block 1, block 3 as the last block, S)
_Key = tuple[str, int | None]


def expand(template: OpGraph, stack: str, depth: int) -> OpGraph:
    """``template`` (a capture at :data:`SHORT` blocks of ``stack``) at ``depth`` blocks
    (``depth >= SHORT - 1``): module docstring.  The graph's :attr:`~OpGraph.expansion` says how;
    it has no module.  Raises :class:`NotExpandable` naming what does not repeat.  O(nodes at
    ``depth``)."""
    if depth < SHORT - 1:
        raise ValueError(f"expand reaches {SHORT - 1} blocks or more, not {depth}")
    parts = _parts(template, stack)
    one_to_two = _same_blocks(parts, stack)
    two_to_one = {v: k for k, v in one_to_two.items()}
    last = depth - 1
    order: list[tuple[OpNode, int | None]] = [(n, None) for n in (*parts.a, *parts.blocks[1])]
    order += [(n, j) for j in range(2, depth - 1) for n in parts.blocks[2]]
    order += [(n, None) for n in (*parts.blocks[SHORT - 1], *parts.s)]

    def becomes(n: OpNode, copy: int | None) -> tuple[int, int] | None:
        """(template block, the block it becomes) of a node that moves, else None."""
        part = parts.part[n.name]
        return (2, copy) if part == 2 and copy is not None else (SHORT - 1, last) if part == SHORT - 1 else None

    def ref(n: OpNode, copy: int | None, u: str) -> _Key:
        """What copy ``copy`` of ``n`` reads where ``n`` reads ``u``."""
        part, upart = parts.part[n.name], parts.part[u]
        if part in (_A, 1) or upart == _A:     # a value computed before the stack, read by every block
            return (u, None)
        if part == 2 and upart == 2:
            return (u, copy)
        if part == 2 and upart == 1:
            assert copy is not None
            return (u, None) if copy == 2 else (one_to_two[u], copy - 1)
        if part in (SHORT - 1, _S) and upart in (SHORT - 1, _S):
            return (u, None)
        if part in (SHORT - 1, _S) and upart == 2:      # the block before the last
            return (two_to_one[u], None) if depth - 2 == 1 else (u, depth - 2)
        where = f"block {part}" if isinstance(part, int) else "after the blocks"
        raise NotExpandable(f"{n.name} ({where}) reads {u} of block {parts.block[u]}: only its own block, the one "
                            "before and values shared by every block repeat")

    def param(n: OpNode, moves: tuple[int, int] | None, p: str) -> str:
        pb = block_index(p, stack)
        if pb is None or parts.part[n.name] in (_A, 1):
            return p
        if moves is not None and pb == moves[0] or parts.part[n.name] == _S and pb == SHORT - 1:
            return _reindexed(p, stack, pb, last if moves is None else moves[1])
        raise NotExpandable(f"{n.name} (block {parts.part[n.name]}) uses {p} of block {pb}")

    # names: fx's, in the new order, as canonicalize gives them (inputs and the output keep theirs)
    ns = _Namespace()
    for n, _ in order:
        if n.kind != "op":
            ns._used_names.add(n.name)
    name_of: dict[_Key, str] = {
        (n.name, copy): n.name if n.kind != "op" else ns.create_name(_SUFFIX.sub("", n.name) or n.name, object())
        for n, copy in order}
    nodes: list[OpNode] = []
    origin: dict[str, str] = {}
    for n, copy in order:
        moves = becomes(n, copy)
        new = replace(n, name=name_of[(n.name, copy)],
                      inputs=tuple(name_of[ref(n, copy, u)] for u in n.inputs),
                      module_path=n.module_path if moves is None else _reindexed(n.module_path, stack, *moves),
                      params=tuple(param(n, moves, p) for p in n.params),
                      param_reads=tuple(param(n, moves, p) for p in n.param_reads))
        nodes.append(new)
        origin[new.name] = n.name
    params = _params(template, stack, depth, nodes)
    graph = OpGraph(nodes, params, name=template.name, source=template.source, batch_size=template.batch_size,
                    batch_dim=template.batch_dim, notes=list(template.notes), precision=template.precision)
    graph.example_inputs = template.example_inputs
    graph.call = template.call
    graph.expansion = Expansion(template, stack, depth, origin)
    return graph


def _params(template: OpGraph, stack: str, depth: int, nodes: list[OpNode]) -> dict[str, ParamInfo]:
    """The parameters at ``depth``, in torch.export's order (each run of block 2's parameters
    followed by its copies' block by block; block 3's as the last block's), each owned by the
    node that lists it among its ``params`` and read by those that list it among ``param_reads``."""
    owner: dict[str, str] = {}
    readers: dict[str, list[str]] = {}
    for n in nodes:
        for q in n.params:
            if owner.setdefault(q, n.name) != n.name:
                raise NotExpandable(f"parameter {q} would be owned by {owner[q]} and {n.name}: a value shared across "
                                    "blocks is first used inside a repeated block")
        for q in n.param_reads:
            readers.setdefault(q, []).append(n.name)
    ordered: list[tuple[str, ParamInfo]] = []
    run: list[ParamInfo] = []

    def flush() -> None:
        ordered.extend((_reindexed(p.name, stack, 2, j), p) for j in range(2, depth - 1) for p in run)
        run.clear()

    for p in template.params.values():
        b = block_index(p.name, stack)
        if b == 2:
            run.append(p)
            continue
        flush()
        ordered.append((_reindexed(p.name, stack, SHORT - 1, depth - 1), p))
    flush()
    out: dict[str, ParamInfo] = {}
    for name, p in ordered:
        if (p.owner is None) != (name not in owner):
            raise NotExpandable(f"parameter {name} is owned at {SHORT} blocks but not at {depth}, or the reverse")
        out[name] = replace(p, name=name, owner=owner.get(name), readers=tuple(dict.fromkeys(readers.get(name, ()))))
    return out


# ------------------------------------------------------------------------------ capturing short

def capture_by_expansion(build: Callable[[int], tuple[nn.Module, ModelCall]], depth: int,
                         capture: Callable[[nn.Module, ModelCall], OpGraph]) -> OpGraph:
    """The graph of the model ``build(depth)`` would give, from captures of ``build(SHORT)`` and
    ``build(SHORT - 1)`` (``capture(model, call)`` each): the first expanded to ``depth`` once
    the second is checked to be the first less a block (module docstring).  The graph's notes say
    so.  Raises :class:`NotExpandable` (why) where the model does not repeat that way."""
    if depth <= SHORT:
        raise NotExpandable(f"{depth} blocks are captured whole")
    t0 = time.perf_counter()
    short, shorter = build(SHORT), build(SHORT - 1)
    stack = stack_path(short[0], shorter[0])
    whole = build(depth)[0]
    check_alike(whole, short[0], stack)
    del whole
    template = capture(*short)
    check = capture(*shorter)
    del short, shorter
    captured_s = time.perf_counter() - t0
    smaller = expand(template, stack, SHORT - 1)
    differs = first_difference(smaller, check)
    if differs:
        raise NotExpandable(f"the {SHORT - 1}-block capture is not the {SHORT}-block one less a block: {differs}")
    graph = expand(template, stack, depth)
    kept = [n for n in template.notes if not n.startswith("captured with torch.export")]
    graph.notes = [f"captured with torch.export at {SHORT} and {SHORT - 1} blocks of {stack} in {captured_s:.2f} s "
                   f"and expanded to {depth}: blocks 2 … {depth - 2} repeat block 2 (the {SHORT - 1}-block capture "
                   f"checked to be the {SHORT}-block one less a block); no module at full depth"] + kept
    return graph


def first_difference(a: OpGraph, b: OpGraph) -> str | None:
    """The first place two graphs differ (notes aside), in one line; ``None`` where they are the same."""
    da, db = a.to_dict(), b.to_dict()
    for key in da:
        if key in ("notes", "fingerprint", "nodes", "params") or da[key] == db.get(key):
            continue
        return f"{key} {da[key]!r} / {db.get(key)!r}"
    for what in ("nodes", "params"):
        xs, ys = da[what], db[what]
        for x, y in zip(xs, ys):
            if x != y:
                return f"{what[:-1]} {x['name']} / {y['name']}"
        if len(xs) != len(ys):
            return f"{len(xs)} / {len(ys)} {what}"
    return None

