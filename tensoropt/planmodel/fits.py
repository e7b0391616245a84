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
from typing import Any

import numpy as np

from ..cluster import Cluster
from ..cluster.units import parse_size
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..optimizers import optimizer_alpha
from .walk import aliases_input

__all__ = ["usable_bytes", "fits", "over_by", "check_budget_value", "least_state_bytes", "least_live_bytes",
           "least_live_by_count", "cannot_fit"]


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


def least_live_bytes(graph: OpGraph, costs: CostModel, devices: int) -> tuple[int, str | None]:
    """What every plan of ``graph`` that runs each operator over all ``devices`` devices (the plans
    of a mesh the search tracks) holds on each of them, at the least, beside
    :func:`least_state_bytes`, while the operator that needs the most runs its forward: its output
    and every input it reads from another operator — each storage once (a view's is its base's) and
    each in the smallest piece the walk can give it on that many devices (the whole, a profiled
    shard's output, a received slice ``⌈bytes/devices⌉``).  Returns the bytes and the operator (None:
    no operator has costs).  The batch, gradients and every other activation come on top.

    The walk (:mod:`tensoropt.planmodel.walk`) holds an operator's inputs from their producers to their
    last reader and its output from its forward on, so both are live while it runs, on every device
    of the mesh; with the model's state (each device's share of it), this is a lower bound of every
    such plan's peak — checked against every plan of small models
    enumerated and walked (``tests/planmodel/test_fits.py``).  An LM's loss is where it matters:
    Llama-3-8B at 16 × 8,192 tokens reads 62.6 GiB of float32 logits into ``log_softmax`` and writes
    as much, so no plan on two 80 GB GPUs fits, whatever its layouts.

    >>> import torch, tensoropt
    >>> graph = tensoropt.capture(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU()),
    ...                           (torch.randn(64, 256),))
    >>> costs = tensoropt.profile(graph, shard_degrees=(1, 2), repeats=1, timed=False)
    >>> least_live_bytes(graph, costs, 2)    # relu: the linear's output and its own, half each
    (65536, 'relu')
    """
    return least_live_by_count(graph, costs, (devices,))[devices]


def least_live_by_count(graph: OpGraph, costs: CostModel,
                        counts: Iterable[int]) -> dict[int, tuple[int, str | None]]:
    """:func:`least_live_bytes` on each of ``counts`` devices, what each operator holds found once
    (the dashboard asks for every count up to a cluster's GPUs: Llama-3-405B's 512, one by one, took
    15 s).  O(operators + counts × what they hold)."""
    def storage(name: str) -> str:
        node = graph.nodes[name]
        while aliases_input(node, costs):
            node = graph.nodes[node.inputs[0]]
        return node.name

    ops = graph.ops
    column: dict[str, int] = {}          # a storage (an operator with costs) → its column
    rows: list[int] = []
    cols: list[int] = []
    for r, node in enumerate(ops):
        held = {storage(p) for p in node.inputs if graph.nodes[p].kind == "op"}
        if not aliases_input(node, costs):
            held.add(node.name)
        for n in held:
            if graph.nodes[n].kind == "op" and costs.get(n) is not None:
                rows.append(r)
                cols.append(column.setdefault(n, len(column)))
    whole = np.array([costs[n].output_bytes for n in column], dtype=np.int64)
    # a profiled shard's output on k devices, where it is smaller: (column, bytes) by k
    shards: dict[int, list[tuple[int, int]]] = {}
    for n, j in column.items():
        for (_, k), sh in costs[n].shards.items():
            shards.setdefault(k, []).append((j, sh.output_bytes))
    row, col = np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)
    out: dict[int, tuple[int, str | None]] = {}
    for k in counts:
        piece = np.minimum(whole, -(-whole // k))
        for j, b in shards.get(k, ()):
            piece[j] = min(piece[j], b)
        total = np.zeros(len(ops), dtype=np.int64)
        np.add.at(total, row, piece[col])
        best = int(total.max()) if len(ops) else 0
        out[k] = (best, ops[int(total.argmax())].name) if best > 0 else (0, None)   # the first that holds most
    return out


def cannot_fit(graph: OpGraph, cluster: Cluster, devices: Sequence[str], optimizer: str | int, *,
               budget: int | float | None = None, reserve: int = 0, costs: CostModel | None = None,
               live: tuple[int, str | None] | None = None) -> str | None:
    """Why no plan of ``graph`` on ``devices`` can fit (:func:`least_state_bytes`, with ``costs``
    plus :func:`least_live_bytes` — then of the plans that run every operator over all of them, as
    the search's do — above the smallest device's usable memory), or ``None`` when one might.
    ``live``: :func:`least_live_bytes` for these devices where the caller has it (from
    :func:`least_live_by_count`, for several meshes at once)."""
    state = least_state_bytes(graph, len(devices), optimizer)
    if live is None:
        live = least_live_bytes(graph, costs, len(devices)) if costs is not None else (0, None)
    held, where = live
    room = min(usable_bytes(cluster, d, budget=budget, reserve=reserve) for d in devices)
    if state + held <= room:
        return None
    if state > room or where is None:
        return (f"its parameters and optimizer state, sharded over all {len(devices)} devices, already hold "
                f"{state} bytes on each, more than the {int(room)} usable")
    node = graph.nodes[where]
    return (f"its parameters and optimizer state, sharded over all {len(devices)} devices ({state} bytes on each), "
            f"and what {where} ({node.op}{' in ' + node.module_path if node.module_path else ''}) reads and "
            f"writes, split as far as it can be ({held} bytes on each), already hold {state + held} bytes, "
            f"more than the {int(room)} usable")
