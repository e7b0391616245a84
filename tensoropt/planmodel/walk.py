"""The memory walk of one training step of a :class:`~tensoropt.plan.Plan`: the peak of every
device.  The simulator (:func:`tensoropt.simulate`) and the whole-step model
:func:`~tensoropt.costs.step_memory` both use it, so there is one memory model.

Every device walks its own program (its forward in plan order, its backward in reverse):

- parameters, buffers, gradients, optimizer state (α × trainable parameters) of every node the
  device runs: whole under ``R`` / ``batch``, ``1/degree`` (rounded up) under ``channel`` /
  ``reduce``; gradients appear at the first backward that computes them
  (a second user's contribution is accumulated out of place: 2 × the parameter transiently);
  gradients the executors sum across devices (:func:`~tensoropt.planmodel.reshard.synced_parameters`) live
  in one flat buffer for the whole step (the distributed backend keeps it between steps, as
  DDP's buckets), each contribution computed apart and then copied or added in (1 × the
  parameter transiently; a contribution of a piece — the parameter held whole, this reader
  cutting it — the piece and then the whole: the cut's backward pads it to the whole), and
  after the backward each group's buffer is summed in place (the all-reduce's staging, a few
  MiB in gloo's ring or in segments as messages, is not counted);
- activations at shard size (:meth:`NodeCost.at` output and extra saved bytes): a node's output
  from when it runs until its last consumer on the device, or until the last backward that saved
  it; what a node receives from another configuration (:attr:`Reshard.recv_bytes`) from its first
  consumer on the device; views share their base's storage (also across devices: the base's copy
  there); the batch on every device that reads it, for the whole step;
- recomputation: a ``recompute`` node keeps nothing of its own (no saved output, no extra saved
  tensors) but keeps its inputs until its backward (they are needed to run it again); in backward
  its output and extra tensors exist again while its backward runs;
- the loss: the gradient of each model output, dense (a mean's backward writes it out); a 16-bit
  output is read as float32 by the loss, so its gradient exists in float32 too while it is cast
  back (bf16 autocast);
- backward: activation gradients (the size of the tensor they belong to) from the first backward
  that produces one until the producer's backward on that device (the gradient of a received
  copy: until its last consumer there has run backward, when it is sent back; a gradient that
  arrives from another device: during its producer's backward), workspace where measured;
- the optimizer step: parameters + gradients + state + :func:`optimizer_temp_bytes`.

:func:`~tensoropt.costs.step_memory` is this walk for a plan that puts every node whole on one
device, in graph order (a memory-only cluster stands in for the links: only the bytes a reshard
delivers matter here, not its time).  Not counted: communication buffers (collectives' staging,
activations' collectives), the loss's own memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..graph import OpGraph, OpNode
from ..plan import NodeConfig, Plan, PlanError
from .reshard import Reshard, edge_reshard, output_layout, piece_bytes, read_layout, reads_nothing, synced_parameters
from .memory import StepMemory, aliases_input
from ..graph import grad_nodes
from ..optimizers import optimizer_alpha, optimizer_temp_bytes
from ..measure.costmodel import CostModel, ShardCost
from ..optimizers import DEFAULT_OPTIMIZER

# ---- edges: one reshard per (producer, consumer mesh, read layout[, gradient layout]) ---------------


@dataclass
class PlanEdges:
    """The reshards of a plan, shared by the timing and the memory walk."""

    # (producer, consumer devices, read layout) -> the reshard (its forward part)
    fwd: dict[tuple[str, tuple[str, ...], str], Reshard] = field(default_factory=dict)
    # (consumer, producer) -> forward key, for producers that are operators
    key_of: dict[tuple[str, str], tuple[str, tuple[str, ...], str]] = field(default_factory=dict)
    # (producer, devices, read, grad layout) -> (reshard, consumers whose gradients it carries, in plan order)
    bwd: dict[tuple, tuple[Reshard, list[str]]] = field(default_factory=dict)
    # (consumer, producer) -> backward key
    bkey_of: dict[tuple[str, str], tuple] = field(default_factory=dict)
    # (graph input, device) -> bytes it holds of the batch
    batch: dict[tuple[str, str], int] = field(default_factory=dict)


def plan_edges(plan: Plan, graph: OpGraph, cluster: Any,
               reshards: dict[tuple, Reshard] | None = None) -> PlanEdges:
    """Every reshard of ``plan`` (forward and backward keys) and the batch each device holds.
    ``reshards``: a cache of :func:`~tensoropt.planmodel.reshard.edge_reshard` by (producer, consumer,
    their configurations), shared by the walks of many plans of one graph and cluster.  O(E)."""
    e = PlanEdges()
    for name in plan.order:
        node, cfg = graph.nodes[name], plan.configs[name]
        for p, nbytes in zip(node.inputs, node.input_bytes):
            prod = graph.nodes[p]
            if prod.kind != "op":  # the batch: delivered to every reader in the layout it reads
                read = read_layout(graph, node, p, cfg)
                for d in cfg.devices:
                    e.batch[(p, d)] = max(e.batch.get((p, d), 0), piece_bytes(read, cfg.degree, nbytes))
                continue
            ck = (p, name, plan.configs[p], cfg)
            rs = reshards.get(ck) if reshards is not None else None
            if rs is None:
                rs = edge_reshard(graph, p, name, plan.configs[p], cfg, cluster)
                if reshards is not None:
                    reshards[ck] = rs
            # an edge that moves nothing (reads_nothing) must not share a real read's reshard
            key = (p, tuple(cfg.devices), rs.dst_layout) + (("unread",) if reads_nothing(node) else ())
            e.fwd.setdefault(key, rs)
            e.key_of[(name, p)] = key
            bkey = (*key, rs.grad_layout)
            e.bkey_of[(name, p)] = bkey
            if bkey in e.bwd:
                e.bwd[bkey][1].append(name)
            else:
                e.bwd[bkey] = (rs, [name])
    return e


def shard_cost(costs: CostModel, node: OpNode, cfg: NodeConfig) -> ShardCost | None:
    """The node's cost at its configuration; a missing shard is a PlanError naming the fix."""
    if node.name not in costs:
        return None
    layout = cfg.layout if cfg.degree > 1 else "R"
    try:
        return costs[node.name].at(layout, cfg.degree)
    except KeyError:
        legal = ", ".join(f"{lay}×{k}" for lay, k in costs.legal(node.name)) or "none"
        raise PlanError(f"node {node.name!r} ({node.op}) runs as {layout} over {cfg.degree} devices, but the "
                        f"profile has no cost for that shard (it has: {legal}); profile with "
                        f"shard_degrees including {cfg.degree}, or choose another layout") from None


# ---- the walk ---------------------------------------------------------------------------------------


def plan_memory(plan: Plan, graph: OpGraph, costs: CostModel, cluster: Any, *, optimizer: str | int = DEFAULT_OPTIMIZER,
                foreach: bool = False, context_bytes: int = 0) -> dict[str, StepMemory]:
    """Peak memory per device of one training step of ``plan`` (the simulator's memory model,
    without the timing; see the module docstring).  O(V + E) per device."""
    plan.check(graph, cluster)
    costs.check_graph(graph)
    return walk(plan, graph, costs, plan_edges(plan, graph, cluster), grad_nodes(graph), optimizer=optimizer,
                   foreach=foreach, context_bytes=context_bytes)


def walk(plan: Plan, graph: OpGraph, costs: CostModel, edges: PlanEdges, needs_grad: Mapping[str, bool], *,
            optimizer: str | int, foreach: bool, context_bytes: int) -> dict[str, StepMemory]:
    alpha = optimizer_alpha(optimizer)
    devices = plan.devices
    mem = {d: StepMemory() for d in devices}
    END = len(plan.order) + 1
    configs = plan.configs

    synced = synced_parameters(graph, plan)
    # parameters: a slice under channel / reduce, whole otherwise (and whole wherever the
    # executors sum its gradients: read whole somewhere, or cut two ways); once per device
    held: dict[tuple[str, str], int] = {}
    piece_of: dict[tuple[str, str], int] = {}   # (node, param) -> bytes on each of its devices
    for name in plan.order:
        node, cfg = graph.nodes[name], configs[name]
        split = cfg.param_pieces
        for p in (*node.params, *node.param_reads):
            piece_of[(name, p)] = b = -(-graph.params[p].nbytes // split)
            if p in synced:
                b = graph.params[p].nbytes
            for d in cfg.devices:
                held[(p, d)] = max(held.get((p, d), 0), b)
    trainable_sizes: dict[str, list[int]] = {d: [] for d in devices}
    for (p, d), b in held.items():
        info = graph.params[p]
        if info.kind == "parameter":
            mem[d].params += b
            if info.requires_grad:
                mem[d].grads += b
                mem[d].optimizer += alpha * b
                trainable_sizes[d].append(b)
        else:
            mem[d].buffers += b

    # storage of every tensor as each device sees it
    shard: dict[str, ShardCost | None] = {n: shard_cost(costs, graph.nodes[n], configs[n]) for n in plan.order}
    size: dict[tuple, int] = {}                     # storage key -> bytes (same on every device that has it)
    owner_on: dict[tuple[str, str], tuple] = {}     # (node, device) -> storage key of its output there
    reads: dict[tuple[str, str], list[tuple[str, tuple]]] = {}  # (node, device) -> [(producer, storage key)]
    program: dict[str, list[str]] = {d: [] for d in devices}
    for name in plan.order:
        node, cfg = graph.nodes[name], configs[name]
        c = costs[name] if name in costs else None
        alias = aliases_input(node, costs)
        sh = shard[name]
        out_bytes = sh.output_bytes if sh is not None else piece_bytes(
            output_layout(cfg), cfg.degree, sum(t.nbytes for t in node.outputs))
        for d in cfg.devices:
            program[d].append(name)
            keys = []
            for p in node.inputs:
                if graph.nodes[p].kind != "op":
                    keys.append((p, (p, "batch")))
                    size[(p, "batch")] = 0
                    continue
                fk = edges.key_of[(name, p)]
                recv = edges.fwd[fk].recv_bytes.get(d, 0)
                if recv:
                    k = (p, "recv", fk[2], fk[1])
                    size[k] = recv
                else:
                    k = owner_on.get((p, d))
                keys.append((p, k))
            reads[(name, d)] = keys
            if alias:
                owner_on[(name, d)] = keys[0][1]
            else:
                owner_on[(name, d)] = (name, "out")
                size[(name, "out")] = out_bytes
    batch_keys = {(p, "batch") for (p, _) in edges.batch}

    out_node = next((n for n in graph if n.kind == "output"), None)
    model_outputs = [p for p in (out_node.inputs if out_node is not None else ()) if p in configs]
    result: dict[str, StepMemory] = {}
    for d in devices:
        m = mem[d]
        prog = program[d]
        pos = {n: i for i, n in enumerate(prog)}
        live: dict[tuple, int] = {}
        savers: dict[tuple, set[str]] = {}            # storage key -> backwards here that need it
        saved_by: dict[str, list[tuple]] = {}         # node -> the keys it saves
        last_use: dict[tuple, int] = {}

        def save(k: tuple, name: str) -> None:
            savers.setdefault(k, set()).add(name)
            saved_by.setdefault(name, []).append(k)

        for name in prog:
            node, cfg = graph.nodes[name], configs[name]
            c = costs[name] if name in costs else None
            own = owner_on[(name, d)]
            if own == (name, "out"):
                last_use[own] = max(last_use.get(own, -1), pos[name])
            for p, k in reads[(name, d)]:
                if k is None:
                    continue
                last_use[k] = max(last_use.get(k, -1), pos[name])
                if cfg.recompute or (c is not None and p in c.saved_inputs):
                    save(k, name)
            if c is not None and c.saves_output and not cfg.recompute and own is not None:
                save(own, name)
        for p in model_outputs:
            k = owner_on.get((p, d))
            if k is not None:
                last_use[k] = END
        base = m.params + m.buffers + m.optimizer + context_bytes
        # gradients the executors sum across devices live in one flat buffer per group, kept
        # between steps; each contribution is computed, then copied or added in
        summed = [q for q, devs in synced.items() if d in devs]
        grads_now = sum(held[(q, d)] for q in summed)

        at_peak: dict[tuple, int] = {}

        def note(phase: str, at: str) -> None:
            nonlocal at_peak
            held = sum(live.values())
            t = base + grads_now + held
            if t > m.peak:
                m.peak, m.peak_phase, m.peak_at = t, phase, at
                m.activations_at_peak = held
                m.grads_at_peak = grads_now
                m.context = context_bytes
                at_peak = live.copy()   # split into kept and transient once, at the end

        for (x, dd), b in edges.batch.items():
            if dd == d:
                live[(x, "batch")] = b
                m.inputs += b
        note("forward", "inputs")

        # ---- forward ----
        # a tensor nothing saves is freed after its last reader (savers do not change in forward)
        free_after: dict[int, list[tuple]] = {}
        for k, u in last_use.items():
            if u < END and not savers.get(k) and k not in batch_keys:
                free_after.setdefault(u, []).append(k)
        for name in prog:
            node, cfg = graph.nodes[name], configs[name]
            sh = shard[name]
            c = costs[name] if name in costs else None
            for _, k in reads[(name, d)]:
                if k is not None and k not in live:
                    live[k] = size[k]
            own = owner_on[(name, d)]
            if own == (name, "out"):
                live[own] = size[own]
            extra = (name, "saved")
            if sh is not None and sh.extra_saved_bytes:
                live[extra] = sh.extra_saved_bytes
                if not cfg.recompute:
                    save(extra, name)
            ws = _workspace(c, cfg)
            if ws:
                live[("#workspace",)] = ws
            note("forward", name)
            live.pop(("#workspace",), None)
            if cfg.recompute:
                live.pop(extra, None)
            for k in free_after.get(pos[name], ()):
                live.pop(k, None)
        for k in [k for k in live if last_use.get(k, -1) >= END and not savers.get(k)]:
            del live[k]

        # ---- backward ----
        grad_keys: dict[tuple, int] = {}             # storage key -> its gradient's bytes
        recv_users: dict[tuple, set[str]] = {}        # received copy -> consumers here still to run backward
        for name in prog:
            if needs_grad.get(name):
                for p, k in reads[(name, d)]:
                    if k is not None and k[1] == "recv" and needs_grad.get(p):
                        recv_users.setdefault(k, set()).add(name)
        widened = 0   # the loss reads a 16-bit output as float32: its gradient is float32 first
        for p in model_outputs:
            k = owner_on.get((p, d))
            if needs_grad.get(p) and k is not None:
                grad_keys[k] = size.get(k, 0)
                live[(k, "#grad")] = grad_keys[k]
                out = graph.nodes[p].outputs
                if out and out[0].dtype in ("bfloat16", "float16"):
                    widened += 2 * grad_keys[k]
        if widened:
            live[("#loss",)] = widened
            note("backward", "loss")
            live.pop(("#loss",))
        param_done: set[str] = set(summed)
        for name in reversed(prog):
            if not needs_grad.get(name):
                continue
            node, cfg = graph.nodes[name], configs[name]
            sh = shard[name]
            c = costs[name] if name in costs else None
            own = owner_on[(name, d)]
            if cfg.recompute:  # the forward runs again: its output and extra tensors exist while it runs backward
                again = (sh.extra_saved_bytes if sh is not None else 0)
                if own is not None and own not in live:
                    again += size.get(own, 0)
                live[("#recompute",)] = again
            if own == (name, "out") and own not in grad_keys and _gets_grad(graph, name, needs_grad, model_outputs):
                grad_keys[own] = size[own]       # the gradient arrived from another device
                live[(own, "#grad")] = size[own]
            for p, k in reads[(name, d)]:
                if k is None or not needs_grad.get(p) or k in grad_keys:
                    continue
                owned = k == (p, "out") or k[1] == "recv"
                grad_keys[k] = size[k] if owned else 0  # a view's gradient is a view of its base's
                live[(k, "#grad")] = grad_keys[k]
            accumulating = 0
            for p in (*node.params, *node.param_reads):
                info = graph.params[p]
                if info.kind == "parameter" and info.requires_grad:
                    b = held[(p, d)]
                    if p not in param_done:
                        param_done.add(p)
                        grads_now += b
                    elif p in synced:
                        # a piece of a parameter held whole (read whole elsewhere, or cut two
                        # ways): the cut's backward makes a whole-sized gradient of it
                        piece = piece_of[(name, p)]
                        accumulating += piece + (b if piece < b else 0)
                    else:
                        accumulating += 2 * piece_of[(name, p)]
            if accumulating:
                live[("#accumulate",)] = accumulating
            ws = _workspace(c, cfg)
            if ws:
                live[("#workspace",)] = ws
            note("backward", name)
            for k in (("#workspace",), ("#accumulate",), ("#recompute",)):
                live.pop(k, None)
            if own == (name, "out"):
                live.pop((own, "#grad"), None)
            for k in saved_by.get(name, ()):
                s = savers[k]
                s.discard(name)
                if not s and k not in batch_keys:   # the batch is held by the caller all step
                    live.pop(k, None)
            for p, k in reads[(name, d)]:
                users = recv_users.get(k)
                if users is not None and name in users:
                    users.discard(name)
                    if not users:
                        live.pop((k, "#grad"), None)   # summed here, sent back
        if summed:
            # summed in place; the all-reduce's staging is bounded (transport.PeerLink.all_reduce)
            note("backward", "gradient sync")
        live = {k: v for k, v in live.items() if k in batch_keys}
        grads_now = m.grads
        m.optimizer_temp = optimizer_temp_bytes(optimizer, trainable_sizes[d], foreach=foreach)
        live[("#optimizer",)] = m.optimizer_temp
        note("optimizer", "step")
        # activation gradients, workspace, accumulation, recomputed tensors, optimizer temporaries
        m.transient_at_peak = sum(v for k, v in at_peak.items() if _transient_key(k))
        result[d] = m
    return result


def _transient_key(k: tuple) -> bool:
    """Whether a live-set key of the walk is a transient buffer rather than a kept tensor: the
    ``#``-named scratch entries and every activation gradient ``(storage, "#grad")``."""
    return (isinstance(k[0], str) and k[0].startswith("#")) or (len(k) == 2 and k[1] == "#grad")


def _gets_grad(graph: OpGraph, name: str, needs_grad: Mapping[str, bool], outputs: list[str]) -> bool:
    """Whether some gradient reaches ``name``'s output (a consumer carries one, or it is a model output)."""
    if not needs_grad.get(name):
        return False
    if name in outputs:
        return True
    return any(needs_grad.get(c) and graph.nodes[c].kind == "op" for c in graph.successors(name))


def _workspace(c: Any, cfg: NodeConfig) -> int:
    if c is None or not c.workspace_bytes:
        return 0
    if cfg.degree > 1 and cfg.layout != "R":
        return -(-c.workspace_bytes // cfg.degree)
    return c.workspace_bytes
