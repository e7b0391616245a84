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
from collections.abc import Mapping, Sequence
from typing import Any

from ..cluster import Cluster
from ..cluster.units import parse_size
from ..errors import TensorOptError
from ..graph import OpGraph
from ..optimizers import optimizer_alpha

__all__ = ["usable_bytes", "fits", "over_by", "check_budget_value", "least_state_bytes", "cannot_fit"]


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


def cannot_fit(graph: OpGraph, cluster: Cluster, devices: Sequence[str], optimizer: str | int, *,
               budget: int | float | None = None, reserve: int = 0) -> str | None:
    """Why no plan of ``graph`` on ``devices`` can fit (:func:`least_state_bytes` above the
    smallest device's usable memory), or ``None`` when one might."""
    least = least_state_bytes(graph, len(devices), optimizer)
    room = min(usable_bytes(cluster, d, budget=budget, reserve=reserve) for d in devices)
    if least <= room:
        return None
    return (f"its parameters and optimizer state, sharded over all {len(devices)} devices, already hold "
            f"{least} bytes on each, more than the {int(room)} usable")
