"""Whether a plan fits: the one rule every surface applies (the CLI, the CSV, compare, the dashboard).

A plan fits a cluster when **every device's** peak is within that device's usable memory:

    usable(d) = min(memory(d), budget) − reserve
    fits      = ∀ d ∈ devices(plan): peak(d) ≤ usable(d)

``memory(d)`` is the device's capacity from the cluster, ``budget`` an optional uniform cap per
device (a user's "at most 16 GiB each"), ``reserve`` what the framework keeps on each device
beside the model (a CUDA context, allocator slack; 0 by default).  On a cluster of unequal GPUs
a plan's devices are checked one by one: a plan whose peak fits the large GPU but not the small
one does not fit, whatever its largest peak is compared against.

    >>> from tensoropt.cluster import Cluster, Device, LinkModel
    >>> c = Cluster("two", [Device("big", 24 << 30), Device("small", 8 << 30)], {}, default=LinkModel(0, 1e9))
    >>> fits({"big": 10 << 30}, c)
    True
    >>> fits({"big": 10 << 30, "small": 9 << 30}, c)
    False
    >>> fits({"big": 10 << 30}, c, budget=8 << 30)
    False
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..cluster import Cluster
from ..cluster.units import parse_size
from ..describe import fmt_bytes
from ..errors import TensorOptError
from ..graph import OpGraph, grad_nodes
from ..measure.costmodel import CostModel
from ..optimizers import optimizer_alpha
from .walk import aliases_input, segment_block

__all__ = ["usable_bytes", "fits", "over_by", "check_budget_value", "least_state_bytes", "LeastLive",
           "least_live_bytes", "least_live_by_count", "cannot_fit", "held_at"]


def check_budget_value(budget: Any, what: str = "budget") -> int | float | None:
    """``budget`` as bytes (``None`` stays ``None``; a string such as ``"16GiB"`` is parsed); a
    non-positive or non-numeric one is a :class:`TensorOptError` naming it."""
    if budget is None:
        return None
    if isinstance(budget, str):
        budget = parse_size(budget, what)
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0 or math.isinf(budget):
        raise TensorOptError(f"{what} must be a positive number of bytes, got {budget!r}")
    return budget


def usable_bytes(cluster: Cluster, device: str, *, budget: int | float | None = None, reserve: int = 0) -> float:
    """What a plan may use on ``device``: ``min(capacity, budget) − reserve``.  O(1)."""
    cap = float(cluster.device(device).memory_bytes)
    if budget is not None:
        cap = min(cap, float(budget))
    return cap - reserve


def over_by(peaks: Mapping[str, int], cluster: Cluster, *, budget: int | float | None = None,
            reserve: int = 0) -> dict[str, int]:
    """The devices whose peak exceeds their usable memory, with the excess in bytes (empty when
    the plan fits).  O(devices)."""
    out = {}
    for d, peak in peaks.items():
        excess = peak - usable_bytes(cluster, d, budget=budget, reserve=reserve)
        if excess > 0:
            out[d] = int(math.ceil(excess))
    return out


def fits(peaks: Mapping[str, int], cluster: Cluster, *, budget: int | float | None = None, reserve: int = 0) -> bool:
    """Whether every device's peak is within its usable memory (module docstring).  O(devices)."""
    return not over_by(peaks, cluster, budget=budget, reserve=reserve)


def least_state_bytes(graph: OpGraph, devices: int, optimizer: str | int) -> int:
    """What every plan of ``graph`` on ``devices`` devices holds on one of them at every moment
    of its step, at the least: the trainable parameters and their optimizer state (α bytes per
    parameter byte), sharded over every device (ZeRO-3 / FSDP: a device holds at least its
    ``1/devices`` of each).  Gradients, activations and the batch come on top; so this is a
    lower bound of every plan's peak.

    >>> import torch, tensoropt
    >>> graph = tensoropt.capture(torch.nn.Linear(1024, 1024), (torch.randn(8, 1024),))
    >>> graph.trainable_bytes, least_state_bytes(graph, 4, "adamw")     # (1 + 2) x 4,198,400 / 4
    (4198400, 3148800)
    """
    total = graph.trainable_bytes * (1 + optimizer_alpha(optimizer))
    return -(-total // devices)


class LeastLive(NamedTuple):
    """What every plan that runs each operator over all of some devices holds on each of them, at
    the least, beside its state (:func:`least_live_bytes`): ``bytes``, the operator at whose
    ``moment`` (``"forward"`` / ``"backward"``) it holds them (``None``: no operator has costs), and
    how many tensors of that are kept for an earlier operator's backward (``kept``)."""

    bytes: int
    op: str | None
    moment: str = "forward"
    kept: int = 0


def least_live_bytes(graph: OpGraph, costs: CostModel, devices: int) -> LeastLive:
    """What every plan of ``graph`` that runs each operator over all ``devices`` devices (the plans
    of a mesh the search tracks) holds on each of them, at the least, beside
    :func:`least_state_bytes`, at one moment of its step — each storage once (a view's is its
    base's) and each in the smallest piece the walk can give it on that many devices (the whole, a
    profiled shard's output, a received slice ``⌈bytes/devices⌉``).  The largest of, over operators X:

    - X's **forward**: its output and every input it reads from another operator;
    - X's **backward** (X computes a gradient): what X saved (inputs, output), its output's
      gradient and its inputs' gradients (those the walk makes whole: a tensor no view reads);

    each with what **earlier operators keep for their backward** then: a tensor ``t`` made in one
    block (:func:`~tensoropt.planmodel.walk.segment_block`) and saved by an ancestor of X in another
    block that computes a gradient.  No plan frees ``t`` before that reader's backward: unrecomputed,
    the reader saves it; recomputed, its segment — inside one block — keeps what it reads from
    outside, and ``t`` is (a transformer's residual stream, one tensor a block).

    The walk (:mod:`tensoropt.planmodel.walk`) holds all of these together then, on every device of
    the mesh; with the model's state, this is a lower bound of every such plan's peak — checked against
    every plan of small models enumerated and walked (``tests/planmodel/test_fits.py``).  An LM's loss
    is where it matters: Llama-3-8B at 16 × 8,192 tokens reads 62.6 GiB of float32 logits into
    ``log_softmax`` and writes as much, so no plan on two 80 GiB GPUs fits, whatever its layouts; on
    four, its backward (its output, that output's gradient and its input's, 15.7 GiB each) with the 35
    tensors earlier operators keep then (the 32 blocks' inputs among them, 0.5 GiB each) is 63.5 GiB a
    device, 85.9 GiB with the state: none fits there either (the least plan the search walked there
    holds 89.1 GiB).

    >>> import torch, tensoropt
    >>> graph = tensoropt.capture(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()),
    ...                           (torch.randn(64, 256),))
    >>> costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1, timed=False)
    >>> least_live_bytes(graph, costs, 2)    # relu's backward: its output, its gradient, the linear's output's
    LeastLive(bytes=98304, op='relu', moment='backward', kept=0)
    """
    return least_live_by_count(graph, costs, (devices,))[devices]


#: operators whose moments with what earlier ones keep are priced on each count (the largest by
#: what they hold themselves): what the earlier ones keep only grows along the graph, and the
#: largest operator (an LM's loss) comes last
_CANDIDATES = 8


def least_live_by_count(graph: OpGraph, costs: CostModel, counts: Iterable[int]) -> dict[int, LeastLive]:
    """:func:`least_live_bytes` on each of ``counts`` devices, what each operator holds found once
    (the dashboard asks for every count up to a cluster's GPUs: Llama-3-405B's 512, one by one, took
    15 s).  O(operators + counts × what they hold)."""
    nodes, ops = graph.nodes, graph.ops
    needs = grad_nodes(graph)

    def alias(name: str) -> bool:
        return aliases_input(nodes[name], costs)

    def storage(name: str) -> str:
        while alias(name):
            name = nodes[name].inputs[0]
        return name

    def is_op(name: str) -> bool:
        return nodes[name].kind == "op"

    column: dict[str, int] = {}          # a storage (an operator with costs) → its column

    def col(name: str) -> int | None:
        return column.setdefault(name, len(column)) if is_op(name) and costs.get(name) is not None else None

    # a gradient the walk makes whole for each of these storages: the loss's, for the model's
    # outputs; an operator's backward's, for a tensor no view reads (one read through a view may get
    # a view of it: tensoropt's executor makes none)
    out_node = next((n for n in graph if n.kind == "output"), None)
    loss = {storage(p) for p in (out_node.inputs if out_node is not None else ()) if is_op(p) and needs.get(p)}
    viewed = {n.inputs[0] for n in ops if alias(n.name)} - loss
    moments: list[tuple[int, str, list[int], list[int]]] = []   # (op, moment, storages, gradients)
    keeps = [0] * len(ops)        # of each operator: the storages it saves from another block (bits)
    kept = [0] * len(ops)         # what each operator's ancestors keep so, while it runs (bits)
    index = {n.name: i for i, n in enumerate(ops)}
    for i, node in enumerate(ops):
        name, c = node.name, costs.get(node.name)
        ins = [p for p in dict.fromkeys(node.inputs) if is_op(p)]
        held = {col(storage(p)) for p in ins}
        if not alias(name):
            held.add(col(name))
        moments.append((i, "forward", [j for j in held if j is not None], []))
        for p in ins:
            kept[i] |= kept[index[p]] | keeps[index[p]]
        if c is None or not needs.get(name):
            continue
        block = segment_block(node)
        saved: set[int | None] = set()
        for p in c.saved_inputs:
            if p in nodes and is_op(p):
                s = storage(p)
                j = col(s)
                saved.add(j)
                if j is not None and segment_block(nodes[s]) != block:
                    keeps[i] |= 1 << j
        own = not alias(name)
        if c.saves_output and own:
            saved.add(col(name))
        grads = []
        gets_grad = name in loss or any(needs.get(u) and is_op(u) for u in graph.successors(name))
        if own and name not in viewed and gets_grad:
            grads.append(col(name))
        grads += [col(p) for p in ins if needs.get(p) and not alias(p) and p not in viewed]
        moments.append((i, "backward", [j for j in saved if j is not None], [j for j in grads if j is not None]))

    whole = np.array([costs[n].output_bytes for n in column], dtype=np.int64)
    # a profiled shard's output on k devices, where it is smaller: (column, bytes) by k
    shards: dict[int, list[tuple[int, int]]] = {}
    for n, j in column.items():
        for (_, k), sh in costs[n].shards.items():
            shards.setdefault(k, []).append((j, sh.output_bytes))
    rows = np.array([r for r, m in enumerate(moments) for _ in (*m[2], *m[3])], dtype=np.int64)
    cols = np.array([j for m in moments for j in (*m[2], *m[3])], dtype=np.int64)
    bits: dict[int, list[int]] = {}      # an operator's kept bits as columns, where asked
    out: dict[int, LeastLive] = {}
    for k in counts:
        piece = np.minimum(whole, -(-whole // k))
        for j, b in shards.get(k, ()):
            piece[j] = min(piece[j], b)
        own_total = np.zeros(len(moments), dtype=np.int64)
        np.add.at(own_total, rows, piece[cols])
        best = LeastLive(0, None)
        for r in np.argsort(-own_total, kind="stable")[:_CANDIDATES].tolist():
            i, moment, storages, grads = moments[r]
            if i not in bits:
                bits[i] = _columns(kept[i])
            extra = [j for j in bits[i] if j not in storages]
            total = int(own_total[r]) + int(piece[extra].sum())
            if total > best.bytes:
                best = LeastLive(total, ops[i].name, moment, len(extra))
        out[k] = best
    return out


def _columns(bits: int) -> list[int]:
    """The set bits of ``bits``, lowest first."""
    out = []
    while bits:
        low = bits & -bits
        out.append(low.bit_length() - 1)
        bits ^= low
    return out


def cannot_fit(graph: OpGraph, cluster: Cluster, devices: Sequence[str], optimizer: str | int, *,
               budget: int | float | None = None, reserve: int = 0, costs: CostModel | None = None,
               live: LeastLive | None = None) -> str | None:
    """Why no plan of ``graph`` on ``devices`` can fit (:func:`least_state_bytes`, with ``costs``
    plus :func:`least_live_bytes` — then of the plans that run every operator over all of them, as
    the search's do — above the smallest device's usable memory), or ``None`` when one might.
    ``live``: :func:`least_live_bytes` for these devices where the caller has it (from
    :func:`least_live_by_count`, for several meshes at once)."""
    state = least_state_bytes(graph, len(devices), optimizer)
    if live is None:
        live = least_live_bytes(graph, costs, len(devices)) if costs is not None else LeastLive(0, None)
    room = min(usable_bytes(cluster, d, budget=budget, reserve=reserve) for d in devices)
    if state + live.bytes <= room:
        return None
    usable = f"more than the {fmt_bytes(room)} ({int(room)} bytes) usable"
    if state > room or live.op is None:
        return (f"its parameters and optimizer state, sharded over all {len(devices)} devices, already hold "
                f"{fmt_bytes(state)} ({state} bytes) on each, {usable}")
    return (f"its parameters and optimizer state, sharded over all {len(devices)} devices ({fmt_bytes(state)} on "
            f"each), and {held_at(graph, live)}, split as far as it can be ({fmt_bytes(live.bytes)} on each), "
            f"already hold {fmt_bytes(state + live.bytes)} ({state + live.bytes} bytes), {usable}")


def held_at(graph: OpGraph, live: LeastLive) -> str:
    """What a :class:`LeastLive` holds, in words: "what log_softmax (aten.log_softmax.int) reads and
    writes" at a forward, "what the backward of … holds" at a backward, and the kept tensors."""
    assert live.op is not None
    node = graph.nodes[live.op]
    named = f"{live.op} ({node.op}{' in ' + node.module_path if node.module_path else ''})"
    what = f"what {named} reads and writes" if live.moment == "forward" else \
        f"what the backward of {named} holds (what it saved, its output's and its inputs' gradients)"
    if live.kept:
        what += f" with the {live.kept} tensor(s) earlier operators keep for their backward then"
    return what
