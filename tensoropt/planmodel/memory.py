"""The memory model: what one training step holds per device, per node and as a whole-step peak.

Categories (the NetSplit thesis §4.3 Table 4-2):

- **parameters** and **buffers** of the nodes a device runs (a parameter read by nodes on two
  devices is held on both);
- **gradients** of trainable parameters (same size), allocated during backward;
- **optimizer state** = α × trainable parameters: α = 0 for SGD, 1 for momentum, 2 for Adam and
  AdamW (``exp_avg`` and ``exp_avg_sq``, each the parameter's size and dtype; the step counter is a
  scalar) (:data:`~tensoropt.optimizers.OPTIMIZER_ALPHA`); it exists for the whole step once the
  first step has run;
- **activations**: every tensor autograd saved for backward, from the moment its producer ran
  until the last backward that needs it (what the profiler's saved-tensor hooks recorded:
  inputs a node saves, its own output, extra tensors such as dropout masks), plus forward
  temporaries until their last consumer;
- **transient**: gradients of activations during backward, measured op workspace (a composite op's
  temporaries; on CUDA the libraries' workspaces too), and the optimizer step's temporaries
  (:func:`~tensoropt.optimizers.optimizer_temp_bytes`: Adam's ``sqrt`` and division results, two
  tensors the size of the largest parameter per-tensor, or one set the size of all parameters with
  ``foreach``).

:func:`node_memory` gives the per-node, per-configuration figures frontier tracking adds up;
:func:`step_memory` walks one step (forward in graph order, backward in reverse) tracking live
tensors on each device and returns the peak — the figure checked against a real training step
(:func:`tensoropt.measure.step.measure_step`).  The walk itself is :mod:`tensoropt.planmodel.walk`,
which the simulator uses for any plan (meshes, shards, recomputation); step_memory is its case
of whole operators on single devices.  Views share their base's storage; a tensor copied to
another device counts on both.

This module owns the per-node figures and the whole-step entry point; it never walks a plan
itself (:mod:`.walk` does, and never imports this module) and never measures.

Example (a two-layer MLP, :func:`tensoropt.examples.mlp_on`; memory reads none of its times)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, _ = mlp_on()
    >>> node_memory(graph, costs, "linear", layout="channel", degree=2, alpha=2)
    NodeMemory(params=1088, grads=1088, optimizer=2176, activations=0, transient=1024)
    >>> step_memory(graph, costs, optimizer="adam")["dev0"].peak
    15424
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..cluster import Cluster, Device, LinkModel
from ..errors import ProfileError
from ..graph import OpGraph
from ..layouts import Layout, largest_piece, param_pieces
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER, optimizer_alpha
from ..plan import NodeConfig, Plan
from .walk import StepMemory, aliases_input, plan_memory

# StepMemory and aliases_input live in .walk (which the walk needs and this module builds on);
# they are re-exported here, where the memory model's readers look for them
__all__ = ["NodeMemory", "StepMemory", "aliases_input", "keeps_input", "node_memory", "output_kept", "step_memory"]


@dataclass(frozen=True)
class NodeMemory:
    """Bytes one device holds for one node in one configuration."""

    params: int
    grads: int
    optimizer: int
    activations: int     # kept from forward to backward
    transient: int       # live only while the node runs (its backward's gradients, workspace)

    @property
    def resident(self) -> int:
        """What adds up over nodes: everything but the transient part."""
        return self.params + self.grads + self.optimizer + self.activations


def node_memory(graph: OpGraph, costs: CostModel, name: str, *, layout: str = "R", degree: int = 1,
                alpha: int = 0, recompute: bool = False, kept_output: bool | None = None) -> NodeMemory:
    """Per-device memory of node ``name`` run in ``layout`` over ``degree`` devices.

    Parameters (and their gradients and optimizer state) are split by ``channel`` / ``reduce``
    layouts and whole under ``R`` / ``batch``.  Activations are the bytes this node is
    responsible for keeping: its extra saved tensors, and its output if the node, a consumer or a
    view of it keeps it (:func:`output_kept`; a view's own output is its base's storage, 0
    bytes); with ``recompute`` none are kept and the saved bytes become transient (the forward
    runs again inside backward).  ``kept_output``: :func:`output_kept` of the node, where the caller
    has it (a search asks for every configuration of every node).  O(consumers of the node, along
    view chains), O(1) given ``kept_output``.
    """
    node = graph.nodes[name]
    cost = costs.get(name)
    split = param_pieces(layout, degree)
    trainable = sum(graph.params[p].nbytes for p in node.params
                    if graph.params[p].is_trainable)
    held = sum(graph.params[p].nbytes for p in node.params)
    if cost is None:
        return NodeMemory(largest_piece(held, split), largest_piece(trainable, split),
                          alpha * largest_piece(trainable, split), 0, 0)
    shard = cost.at(layout, degree)
    if kept_output is None:
        kept_output = output_kept(graph, costs, name)
    kept = shard.extra_saved_bytes + (shard.output_bytes if kept_output else 0)
    grads_in = sum(b for b in node.input_bytes) // (degree if layout == Layout.BATCH and degree > 1 else 1)
    transient = shard.output_bytes + grads_in + cost.workspace_bytes
    if recompute:
        transient += kept
        kept = 0
    return NodeMemory(largest_piece(held, split), largest_piece(trainable, split),
                      alpha * largest_piece(trainable, split), kept, transient)


def output_kept(graph: OpGraph, costs: CostModel, name: str) -> bool:
    """Whether node ``name``'s output storage lives until the backward: the node saves it, a
    consumer saves it, or a view of it is kept (:func:`keeps_input`) — a view shares its base's
    storage, so ``pow(x.view(...))`` saving the view keeps ``x``'s output alive (transformers read
    nearly every activation through a ``(B·T, C) ↔ (B, T, C)`` view).  O(consumers, along view
    chains)."""
    cost = costs.get(name)
    return (cost is not None and cost.saves_output) or any(keeps_input(graph, costs, c, name)
                                                           for c in graph.successors(name))


def keeps_input(graph: OpGraph, costs: CostModel, consumer: str, producer: str) -> bool:
    """Whether ``consumer`` keeps ``producer``'s output until its backward: it saves it, or it is
    a view of it (:func:`aliases_input`) whose own output is kept (:func:`output_kept`)."""
    cost = costs.get(consumer)
    if cost is not None and producer in cost.saved_inputs:
        return True
    node = graph.nodes[consumer]
    return aliases_input(node, costs) and node.inputs[0] == producer and output_kept(graph, costs, consumer)


def step_memory(graph: OpGraph, costs: CostModel, *, placement: Mapping[str, str] | None = None,
                optimizer: int | str = DEFAULT_OPTIMIZER, foreach: bool = False,
                device: str = "dev0") -> dict[str, StepMemory]:
    """Peak memory per device over one training step (forward, backward, optimizer step).

    ``placement`` maps operator names to device names (default: every node on ``device``; names of
    graph inputs are ignored: the batch is on every device that reads it); ``optimizer`` is ``sgd``
    / ``momentum`` / ``adam`` or α (:func:`optimizer_alpha`).  This is the walk of
    :mod:`tensoropt.planmodel.walk` for the plan that runs every operator whole on its device in
    graph order: parameters, buffers and optimizer state are resident from the start; forward
    allocates each node's output (views allocate nothing) and extra saved tensors, and frees a
    tensor after its last forward consumer on the device unless a backward needs it; backward, in
    reverse order, allocates the gradients of the node's inputs and parameters and frees its saved
    tensors and its output's gradient once no later backward needs them; the optimizer step holds
    parameters + gradients + state + its temporaries
    (:func:`~tensoropt.optimizers.optimizer_temp_bytes`).  O(V + E).
    """
    costs.check_graph(graph)
    optimizer_alpha(optimizer)  # an unknown optimizer is a ProfileError before any work
    ops = [n.name for n in graph.ops]
    if placement:
        missing = [n for n in ops if n not in placement]
        if missing:
            raise ProfileError(f"placement has no device for {len(missing)} node(s), e.g. {missing[0]!r}")
        where = {n: placement[n] for n in ops}
    else:
        where = dict.fromkeys(ops, device)
    devices = sorted(set(where.values())) or [device]
    # only the bytes a reshard delivers matter to memory, not how long the links take
    cluster = Cluster("step_memory", [Device(d, 2**62) for d in devices], {}, default=LinkModel(0.0, 1e12))
    plan = Plan({n: NodeConfig((d,)) for n, d in where.items()}, graph_fingerprint=graph.fingerprint,
                graph_name=graph.name, order=ops)
    mem = plan_memory(plan, graph, costs, cluster, optimizer=optimizer, foreach=foreach)
    return {d: mem.get(d, StepMemory()) for d in devices}
