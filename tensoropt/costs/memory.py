"""The memory model: what one training step holds per device, per node and as a whole-step peak.

Categories (seed 003 §4.3 Table 4-2, design §2):

- **parameters** and **buffers** of the nodes a device runs (a parameter read by nodes on two
  devices is held on both);
- **gradients** of trainable parameters (same size), allocated during backward;
- **optimizer state** = α × trainable parameters: α = 0 for SGD, 1 for momentum, 2 for Adam
  (:data:`OPTIMIZER_ALPHA`); it exists for the whole step once the first step has run;
- **activations**: every tensor autograd saved for backward, from the moment its producer ran
  until the last backward that needs it (what the profiler's saved-tensor hooks recorded:
  inputs a node saves, its own output, extra tensors such as dropout masks), plus forward
  temporaries until their last consumer;
- **transient**: gradients of activations during backward, measured op workspace (CUDA), and
  the optimizer step's temporaries (:func:`optimizer_temp_bytes`: Adam's ``sqrt`` and division
  results, two tensors the size of the largest parameter per-tensor, or one set the size of
  all parameters with ``foreach``).

:func:`node_memory` gives the per-node, per-configuration figures frontier tracking adds up;
:func:`step_memory` walks one step (forward in graph order, backward in reverse) tracking live
tensors on each device and returns the peak — the figure checked against a real training step
(:func:`tensoropt.costs.step.measure_step`).  Views share their base's storage; a tensor copied
to another device counts on both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

from ..errors import ProfileError
from ..graph import OpGraph, OpNode
from .model import CostModel

OPTIMIZER_ALPHA = {"sgd": 0, "momentum": 1, "adam": 2}


def optimizer_alpha(optimizer: str | int) -> int:
    """α for an optimizer name (``sgd`` / ``momentum`` / ``adam``) or an explicit integer."""
    if isinstance(optimizer, int) and optimizer >= 0:
        return optimizer
    try:
        return OPTIMIZER_ALPHA[str(optimizer).lower()]
    except KeyError:
        raise ProfileError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZER_ALPHA)} "
                           "or α as a non-negative integer") from None


def optimizer_temp_bytes(optimizer: str | int, param_bytes: list[int], *, foreach: bool = False) -> int:
    """Temporaries of one optimizer step over parameters of the given sizes.

    SGD and momentum update in place (none).  Adam computes ``exp_avg_sq.sqrt() / c`` before the
    in-place ``addcdiv_``: two parameter-sized temporaries alive at once for the per-tensor
    implementation (CPU default), one list the size of every parameter with ``foreach`` (CUDA
    default).  An integer α > 1 is treated as Adam-like.
    """
    name = optimizer if isinstance(optimizer, str) else ("adam" if optimizer >= 2 else "sgd")
    if name.lower() != "adam" or not param_bytes:
        return 0
    return sum(param_bytes) if foreach else 2 * max(param_bytes)


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
                alpha: int = 0, recompute: bool = False) -> NodeMemory:
    """Per-device memory of node ``name`` run in ``layout`` over ``degree`` devices.

    Parameters (and their gradients and optimizer state) are split by ``channel`` / ``reduce``
    layouts and whole under ``R`` / ``batch``.  Activations are the bytes this node is
    responsible for keeping: its extra saved tensors, and its output if the node or a consumer
    saves it; with ``recompute`` none are kept and the saved bytes become transient (the forward
    runs again inside backward).  O(consumers of the node).
    """
    node = graph.nodes[name]
    cost = costs[name] if name in costs else None
    split = degree if layout in ("channel", "reduce") and degree > 1 else 1
    trainable = sum(graph.params[p].nbytes for p in node.params
                    if graph.params[p].requires_grad and graph.params[p].kind == "parameter")
    held = sum(graph.params[p].nbytes for p in node.params)
    if cost is None:
        return NodeMemory(_ceil(held, split), _ceil(trainable, split), alpha * _ceil(trainable, split), 0, 0)
    shard = cost.at(layout, degree)
    out_kept = any(name in costs[c].saved_inputs for c in graph.successors(name) if c in costs) or cost.saves_output
    kept = shard.extra_saved_bytes + (shard.output_bytes if out_kept else 0)
    grads_in = sum(b for b in node.input_bytes) // (degree if layout == "batch" and degree > 1 else 1)
    transient = shard.output_bytes + grads_in + cost.workspace_bytes
    if recompute:
        transient += kept
        kept = 0
    return NodeMemory(_ceil(held, split), _ceil(trainable, split), alpha * _ceil(trainable, split), kept, transient)


def _ceil(n: int, k: int) -> int:
    return -(-n // k)


@dataclass
class StepMemory:
    """One device's memory over a training step."""

    params: int = 0
    buffers: int = 0
    grads: int = 0
    optimizer: int = 0
    peak: int = 0              # the whole-step peak
    peak_phase: str = ""       # "forward", "backward" or "optimizer"
    peak_at: str = ""          # the node running at the peak
    activations_at_peak: int = 0
    inputs: int = 0            # the batch, held from the start
    optimizer_temp: int = 0    # the optimizer step's temporaries

    def to_dict(self) -> dict:
        return asdict(self)


def step_memory(graph: OpGraph, costs: CostModel, *, placement: Mapping[str, str] | None = None,
                optimizer: int | str = "sgd", foreach: bool = False, device: str = "dev0") -> dict[str, StepMemory]:
    """Peak memory per device over one training step (forward, backward, optimizer step).

    ``placement`` maps node names to device names (default: every node on ``device``);
    ``optimizer`` is ``sgd`` / ``momentum`` / ``adam`` or α (:func:`optimizer_alpha`).  The
    walk: parameters, buffers and optimizer state are resident from the start; forward allocates
    each node's output (views allocate nothing) and extra saved tensors, and frees a tensor after
    its last forward consumer unless a backward needs it; backward, in reverse order, allocates
    the gradients of the node's inputs and parameters and frees its saved tensors and its
    output's gradient once no later backward needs them; the optimizer step holds parameters +
    gradients + state + its temporaries (:func:`optimizer_temp_bytes`).  O(V + E).
    """
    costs.check_graph(graph)
    alpha = optimizer_alpha(optimizer)
    ops = [n for n in graph if n.kind == "op"]
    place = {n.name: (placement or {}).get(n.name, device) for n in graph}
    if placement:
        missing = [n.name for n in ops if n.name not in placement]
        if missing:
            raise ProfileError(f"placement has no device for {len(missing)} node(s), e.g. {missing[0]!r}")
        for n in graph:  # the batch starts where its first consumer runs
            if n.kind == "input" and n.name not in placement:
                first = next((c for c in graph.successors(n.name) if c in placement), None)
                place[n.name] = placement[first] if first else placement[ops[0].name]
    devices = sorted(set(place[n.name] for n in ops) | ({device} if not placement else set()))
    mem = {d: StepMemory() for d in devices}
    needs_grad = grad_nodes(graph)

    # parameters live on every device that runs a node using them
    held: dict[str, set[str]] = {}
    trainable_sizes: dict[str, list[int]] = {d: [] for d in devices}
    for n in ops:
        for p in (*n.params, *n.param_reads):
            held.setdefault(p, set()).add(place[n.name])
    for p, devs in held.items():
        info = graph.params[p]
        for d in devs:
            if info.kind == "parameter":
                mem[d].params += info.nbytes
                if info.requires_grad:
                    mem[d].grads += info.nbytes
                    mem[d].optimizer += alpha * info.nbytes
                    trainable_sizes[d].append(info.nbytes)
            else:
                mem[d].buffers += info.nbytes

    owner = _storage_owners(graph, costs)
    size = {n.name: (costs[n.name].output_bytes if n.name in costs else sum(t.nbytes for t in n.outputs))
            for n in graph if n.kind != "output"}
    # who needs each (owner, device) tensor in backward, and its last forward use per device
    savers: dict[tuple[str, str], set[str]] = {}
    last_use: dict[tuple[str, str], int] = {}
    pos = {n.name: i for i, n in enumerate(graph)}
    for n in ops:
        c = costs[n.name] if n.name in costs else None
        d = place[n.name]
        for p in n.inputs:
            key = (owner[p], d)
            last_use[key] = max(last_use.get(key, -1), pos[n.name])
            if c is not None and p in c.saved_inputs:
                savers.setdefault(key, set()).add(n.name)
        if c is not None and c.saves_output:
            savers.setdefault((owner[n.name], d), set()).add(n.name)
    out_node = next((n for n in graph if n.kind == "output"), None)
    if out_node is not None:
        for p in out_node.inputs:  # the model's outputs live until the loss is computed
            key = (owner[p], place[p])
            last_use[key] = max(last_use.get(key, -1), len(pos))

    live: dict[str, dict[tuple[str, str], int]] = {d: {} for d in devices}
    base = {d: m.params + m.buffers + m.optimizer for d, m in mem.items()}
    grads_now = {d: 0 for d in devices}

    def total(d: str) -> int:
        return base[d] + grads_now[d] + sum(live[d].values())

    def note(d: str, phase: str, at: str) -> None:
        t = total(d)
        if t > mem[d].peak:
            mem[d].peak, mem[d].peak_phase, mem[d].peak_at = t, phase, at
            mem[d].activations_at_peak = sum(live[d].values())

    for n in graph:  # the batch
        if n.kind == "input":
            live[place[n.name]][(n.name, place[n.name])] = size[n.name]
            mem[place[n.name]].inputs += size[n.name]
    for d in devices:
        note(d, "forward", "inputs")

    # ---- forward ----
    for n in ops:
        d = place[n.name]
        c = costs[n.name] if n.name in costs else None
        for p in n.inputs:  # a tensor from another device arrives as a copy here
            if (owner[p], d) not in live[d]:
                live[d][(owner[p], d)] = size[owner[p]]
        if owner[n.name] == n.name:
            live[d][(n.name, d)] = size[n.name]
        if c is not None and c.extra_saved_bytes:
            live[d][(f"{n.name}#saved", d)] = c.extra_saved_bytes
            savers[(f"{n.name}#saved", d)] = {n.name}
        if c is not None and c.workspace_bytes:
            live[d][("#workspace", d)] = c.workspace_bytes
        note(d, "forward", n.name)
        live[d].pop(("#workspace", d), None)
        for key in [k for k in live[d] if last_use.get(k, 10**9) <= pos[n.name] and not savers.get(k)]:
            if key[0] in graph.nodes and graph.nodes[key[0]].kind == "input" and key[1] == place[key[0]]:
                continue  # the batch stays alive for the whole step (the caller holds it)
            del live[d][key]

    # outputs no one saved are dropped once the loss exists
    for d in devices:
        for key in [k for k in live[d] if last_use.get(k, -1) >= len(pos) and not savers.get(k)]:
            del live[d][key]

    # ---- backward ----
    grad_live: dict[tuple[str, str], int] = {}
    param_grad_done: set[tuple[str, str]] = set()
    if out_node is not None:  # the loss's gradient reaches every output that carries one
        for p in out_node.inputs:
            if needs_grad.get(p):
                d = place[p]
                grad_live[(owner[p], d)] = size[owner[p]]
                live[d][(f"{owner[p]}#grad", d)] = size[owner[p]]
    for n in reversed(ops):
        if not needs_grad.get(n.name):
            continue
        d = place[n.name]
        c = costs[n.name] if n.name in costs else None
        for p in n.inputs:
            if needs_grad.get(p) and (owner[p], d) not in grad_live:
                g = size[owner[p]] if owner[p] == p else 0  # a view's gradient is a view of its base's
                grad_live[(owner[p], d)] = g
                live[d][(f"{owner[p]}#grad", d)] = g
        accumulating = 0
        for p in (*n.params, *n.param_reads):
            info = graph.params[p]
            if info.kind == "parameter" and info.requires_grad:
                if (p, d) not in param_grad_done:
                    param_grad_done.add((p, d))
                    grads_now[d] += info.nbytes
                else:  # a second user's contribution: AccumulateGrad adds it out of place, so the
                    accumulating += 2 * info.nbytes  # new gradient and the sum exist beside .grad
        if accumulating:
            live[d][("#accumulate", d)] = accumulating
        if c is not None and c.workspace_bytes:
            live[d][("#workspace", d)] = c.workspace_bytes
        note(d, "backward", n.name)
        live[d].pop(("#workspace", d), None)
        live[d].pop(("#accumulate", d), None)
        live[d].pop((f"{owner[n.name]}#grad", d), None) if owner[n.name] == n.name else None
        for key in [k for k, s in savers.items() if n.name in s]:
            s = savers[key]
            s.discard(n.name)
            if not s and key[1] in live:
                live[key[1]].pop(key, None)
    for d in devices:
        live[d] = {k: v for k, v in live[d].items() if k[0] in graph.nodes and graph.nodes[k[0]].kind == "input"}
        grads_now[d] = mem[d].grads
        mem[d].optimizer_temp = optimizer_temp_bytes(optimizer, trainable_sizes[d], foreach=foreach)
        live[d][("#optimizer", d)] = mem[d].optimizer_temp
        note(d, "optimizer", "step")
    return mem


def aliases_input(node: OpNode, costs: CostModel) -> bool:
    """Whether an operator's output lives in its first input's storage: a view, or an op the
    profiler saw return its input (no new output bytes)."""
    c = costs[node.name] if node.name in costs else None
    return node.kind == "op" and bool(node.inputs) and (node.metadata_only or (c is not None and c.output_bytes == 0))


def _storage_owners(graph: OpGraph, costs: CostModel) -> dict[str, str]:
    """The node whose allocation each node's output lives in: itself, or (views, ops that return
    their input) the owner of its first input."""
    owner: dict[str, str] = {}
    for n in graph:
        if n.kind == "output":
            continue
        owner[n.name] = owner[n.inputs[0]] if aliases_input(n, costs) else n.name
    return owner


def grad_nodes(graph: OpGraph) -> dict[str, bool]:
    """Which nodes' outputs carry a gradient in training (downstream of a trainable parameter)."""
    trainable = {p.name for p in graph.params.values() if p.requires_grad and p.kind == "parameter"}
    out: dict[str, bool] = {}
    for n in graph:
        float_out = any(t.dtype.startswith(("float", "bfloat", "complex")) for t in n.outputs)
        out[n.name] = n.kind == "op" and float_out and not n.generator and (
            any(out.get(i, False) for i in n.inputs) or any(p in trainable for p in (*n.params, *n.param_reads)))
    return out
