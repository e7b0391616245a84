r"""A model cut into pipeline stages: contiguous runs of its blocks, balanced by time.

The units are the graph's operators in order, grouped into blocks
(:func:`~tensoropt.graph.block_of`: a transformer layer, a ResNet stage's entry; each from its
first operator to its last) and runs of operators outside every block (the embedding, the final
norm and head).  A cut into ``S`` stages is
``S − 1`` boundaries between units; the one chosen minimises the slowest stage's forward +
backward time (uneven stages allowed: a stage with the embedding may take fewer layers), by
dynamic programming over the ``U`` units:

.. math::

    T(k, u) = \min_{u' < u} \max\bigl(T(k - 1, u'),\ t(u' .. u)\bigr), \qquad O(S\,U^2)

the first optimum in unit order on ties (deterministic).  Each :class:`Stage` carries its
operators, its times at the costs' shape (profile the model at the micro-batch size to price a
micro-batch), its parameters' bytes, the activations it keeps per micro-batch in flight
(:func:`~.memory.node_memory`, whole, on one device, and the inputs it receives from earlier
stages, which PyTorch's ``PipelineStage`` keeps for the backward; those apart too: PyTorch keeps
them in receive buffers made for every micro-batch of the step) and the bytes it sends on.

Example — a four-layer MLP cut into two stages of two layers::

    >>> import torch
    >>> from tensoropt import capture, load_cluster, price, profile
    >>> from tensoropt.planmodel.stages import cut_stages
    >>> layers = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()) for _ in range(4)]
    >>> graph = capture(torch.nn.Sequential(*layers), (torch.randn(8, 64),))
    >>> costs = price(profile(graph, timed=False), load_cluster("preset:a100-4-nvlink")).costs
    >>> [s.blocks for s in cut_stages(graph, costs, 2)]
    [('0', '1'), ('2', '3')]

It owns where the stages are cut and what each holds; it must not order the micro-batches
(:mod:`.pipeline` does) nor place a stage's operators on devices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import TensorOptError
from ..graph import OpGraph, block_of
from ..measure.costmodel import CostModel
from .memory import node_memory


@dataclass(frozen=True)
class Stage:
    """One pipeline stage: its ``ops`` in order, the ``blocks`` they belong to (``None`` runs of
    operators outside blocks are left out of the names), ``forward_s`` / ``backward_s``,
    ``param_bytes`` (trainable and not), ``trainable_bytes``, ``activation_bytes`` kept per
    micro-batch, ``send_bytes``: its outputs read by a later stage, per micro-batch, and
    ``received_bytes``: the part of ``activation_bytes`` that is its inputs from earlier stages (the
    tensors PyTorch receives them into, which it holds all step:
    :func:`~.pipelined.boundary_buffers`)."""

    ops: tuple[str, ...]
    blocks: tuple[str, ...]
    forward_s: float
    backward_s: float
    param_bytes: int
    trainable_bytes: int
    activation_bytes: int
    send_bytes: int
    received_bytes: int


def _units(graph: OpGraph) -> list[list[str]]:
    """The graph's operators in order, in units a cut may not enter: each block from its first
    operator to its last, with whatever the trace put between them (GPT-2's causal mask is made
    among its first block's operators, under the model's own module: PyTorch's pipelining, which
    splits at a block's beginning or end, keeps it inside), and the runs outside every block."""
    ops = graph.ops
    keys = [block_of(node.module_path) for node in ops]
    last = {key: i for i, key in enumerate(keys) if key is not None}
    units: list[list[str]] = []
    i = 0
    while i < len(ops):
        j = i + 1
        key = keys[i]
        if key is None:
            while j < len(ops) and keys[j] is None:
                j += 1
        else:
            end = last[key] + 1
            while j < end:   # a block whose span overlaps this one's is in its unit
                inner = keys[j]
                end = max(end, last[inner] + 1) if inner is not None else end
                j += 1
        units.append([node.name for node in ops[i:j]])
        i = j
    return units


def _cut(times: list[float], stages: int) -> list[int]:
    """The start index of each stage after the first: the min-max partition of ``times``."""
    n = len(times)
    prefix = [0.0]
    for t in times:
        prefix.append(prefix[-1] + t)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    back = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for u in range(k, n - (stages - k) + 1):
            for v in range(k - 1, u):
                cost = max(best[k - 1][v], prefix[u] - prefix[v])
                if cost < best[k][u]:
                    best[k][u], back[k][u] = cost, v
    starts, u = [], n
    for k in range(stages, 0, -1):
        u = back[k][u]
        starts.append(u)
    return sorted(starts)[1:]


def cut_stages(graph: OpGraph, costs: CostModel, stages: int, *,
               starts: Sequence[str] | None = None) -> list[Stage]:
    """``graph`` cut into ``stages`` contiguous stages (module docstring); more stages than units
    is a :class:`~tensoropt.errors.TensorOptError` naming how many there are.  ``starts``: the cut
    a plan already made (the first operator of each stage after the first, :func:`stage_starts`),
    kept as it is rather than balanced again on these costs — an operator that begins no unit, or
    a count that is not ``stages − 1``, is a :class:`~tensoropt.errors.TensorOptError`."""
    units = _units(graph)
    if stages < 1 or stages > len(units):
        raise TensorOptError(f"{graph.name or 'the model'} has {len(units)} runs of blocks and other operators: "
                             f"it can be cut into 1 to {len(units)} pipeline stages, not {stages}")
    if starts is None:
        times = [sum(sum(costs.time(name)) for name in unit if name in costs) for unit in units]
        cuts = _cut(times, stages)
    else:
        first = {unit[0]: u for u, unit in enumerate(units)}
        bad = [name for name in starts if name not in first]
        if bad or len(starts) != stages - 1:
            why = (f"operator {bad[0]!r} begins no run of blocks" if bad
                   else f"{len(starts)} cuts make {len(starts) + 1} stages, not {stages}")
            raise TensorOptError(f"the pipeline's cut does not fit {graph.name or 'the model'}: {why}")
        cuts = sorted(first[name] for name in starts)
    starts_at = [0, *cuts, len(units)]
    where = {}
    groups = []
    for i in range(stages):
        ops = [name for unit in units[starts_at[i]:starts_at[i + 1]] for name in unit]
        groups.append(ops)
        where.update(dict.fromkeys(ops, i))
    out = []
    for i, ops in enumerate(groups):
        fwd = bwd = 0.0
        act = send = received = 0
        params: set[str] = set()
        seen_inputs: set[str] = set()
        blocks: list[str] = []
        for name in ops:
            node = graph.nodes[name]
            if name in costs:
                f, b = costs.time(name)
                fwd, bwd = fwd + f, bwd + b
                act += node_memory(graph, costs, name).activations
                if any(where.get(c, i) > i for c in graph.successors(name)):
                    send += costs[name].at().output_bytes
                # an input received from an earlier stage: PipelineStage keeps it for the backward
                for src, nbytes in zip(node.inputs, node.input_bytes):
                    if where.get(src, i) < i and src not in seen_inputs:
                        seen_inputs.add(src)
                        act += nbytes
                        received += nbytes
            params.update(node.params)
            key = block_of(node.module_path)
            if key is not None and (not blocks or blocks[-1] != key):
                blocks.append(key)
        held = sum(graph.params[p].nbytes for p in params)
        trainable = sum(graph.params[p].nbytes for p in params if graph.params[p].is_trainable)
        out.append(Stage(tuple(ops), tuple(blocks), fwd, bwd, held, trainable, act, send, received))
    return out


def stage_starts(stages: Sequence[Stage]) -> tuple[str, ...]:
    """The first operator of each stage after the first: the cut as :func:`cut_stages` takes it back."""
    return tuple(stage.ops[0] for stage in stages[1:])


__all__ = ["Stage", "cut_stages", "stage_starts"]
