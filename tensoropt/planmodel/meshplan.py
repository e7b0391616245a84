"""One compiled evaluator of the plans that run every operator on one mesh: simulated step time
and walked per-device peak, in microseconds per plan.

Frontier tracking searches plans in which every operator runs on the same mesh of ``k`` devices
(in one of its configurations: a layout, with or without recomputation).  For such a plan the
simulator (:mod:`.simulate`) and the memory walk (:mod:`.walk`) reduce to a small machine:

- **time**: every compute task occupies every mesh device (lockstep), so computation is one
  chain — forwards in the plan's order, then for each node in reverse its recomputation and its
  backward — each lasting its shard time over the mesh's slowest device; every transfer on the
  mesh (a reshard collective, a batch norm's statistics, the loss's all-reduce, the gradients'
  all-reduce) occupies at least the mesh's ring links, so transfers are one channel served first
  come first served by (ready time, creation order), and run while the devices compute.  The
  tasks, their dependencies and their order of creation are the simulator's
  (:class:`~.simulate._StepTasks`), and :func:`~.meshkernels._simulate` runs :meth:`~.simulate._Schedule.run`'s
  event loop on them;
- **memory**: every device holds the same shard of every tensor (a collective on one mesh
  delivers the same piece to each), so one device's walk is every device's; :func:`~.meshkernels._walk` is
  :func:`~.walk.walk`'s live-set walk on integer storage keys.

:class:`MeshEvaluator` reads every cost from the plan model's own rules, once per (graph, mesh)
— :func:`~.walk.shard_cost`, :func:`~.reshard.edge_reshard`, :func:`~.reshard.stat_sync`,
:func:`~.reshard.read_layout`, the ring all-reduce of :mod:`tensoropt.cluster.collectives` —
into arrays indexed by configuration; a plan is then a vector of configuration indices, and
evaluating it builds no dict and no object: re-costing a plan one node's configuration away from
another reads that node's and its edges' entries and re-runs the two linear passes, O(V + E)
compiled steps.  It is checked equal to :func:`~.simulate.simulate` (time within 1e-9 relative,
every device's peak to the byte) on random plans of real graphs in
``tests/planmodel/test_meshplan.py``.

Owns: the compiled twin of the simulator and the walk for one-mesh plans.  Must not: state a cost
rule of its own (a new rule goes into :mod:`.simulate` / :mod:`.walk` / :mod:`.reshard` first,
then here, and the equality test says whether the two agree).

Example (a two-layer MLP on a preset's A100s, :func:`tensoropt.examples.mlp_on`)::

    >>> from tensoropt import simulate
    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, cluster = mlp_on()
    >>> ev = MeshEvaluator(graph, costs, cluster, ("gpu0", "gpu1"), optimizer="adam")
    >>> vec = [0] * len(ev.names)            # every operator replicated (configuration 0: R)
    >>> peak, seconds = ev.evaluate(vec)
    >>> sim = simulate(ev.plan(vec), graph, costs, cluster, optimizer="adam")
    >>> (peak, seconds) == (sim.max_memory_bytes, sim.time_s)
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .. import _kernels as kernels
from ..cluster import Cluster
from ..cluster.collectives import allgather_time
from ..graph import OpGraph, ParamKind, block_of, grad_nodes
from ..layouts import Layout, TensorLayout
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER, optimizer_alpha
from ..plan import NodeConfig, Plan, piece_nbytes
from .meshkernels import TINY_TABLES, _simulate, _simulate_many, _walk, _walk_many
from .reshard import (
    P,
    edge_reshard,
    move,
    op_basename,
    output_layout,
    piece_bytes,
    read_layout,
    reads_nothing,
    stat_sync,
)
from .walk import _workspace, aliases_input, fill_segments, keeps_nothing, shard_cost

__all__ = ["MeshEvaluator"]

_LAYOUT_ID = {Layout.R: 0, Layout.BATCH: 1, Layout.CHANNEL: 2, Layout.REDUCE: 3}
_TENSOR_ID = {TensorLayout.R: 0, TensorLayout.SB: 1, TensorLayout.SC: 2, TensorLayout.P: 3}


class MeshEvaluator:
    """Plans of ``graph`` whose every operator runs on ``mesh`` (see the module docstring).

    ``configs``: operator name → its configurations on the mesh (default: one replicated
    configuration per node; frontier tracking passes its problem's).  ``names``: the operators,
    in the plan's order (the graph's).  :meth:`evaluate` takes a configuration index per name.
    O(V·c + E·c²) reshards evaluated once, for c configurations per node."""

    def __init__(self, graph: OpGraph, costs: CostModel, cluster: Cluster, mesh: Sequence[str], *,
                 configs: Mapping[str, Sequence[NodeConfig]] | None = None,
                 optimizer: str | int = DEFAULT_OPTIMIZER, context_bytes: int = 0, microbatches: int = 1):
        kernels.ready()   # the kernels a job's start began compiling (tensoropt._kernels)
        self.graph, self.costs, self.cluster = graph, costs, cluster
        self.mesh = tuple(mesh)
        self.optimizer = optimizer
        #: the micro-batches a step of every plan runs (:attr:`Plan.microbatches <tensoropt.plan.Plan.microbatches>`;
        #: ``graph`` is the model at one micro-batch)
        self.microbatches = microbatches
        ops = graph.ops
        self.names = [n.name for n in ops]
        self.configs: dict[str, tuple[NodeConfig, ...]] = {
            n: tuple(configs[n]) if configs is not None else (NodeConfig(self.mesh),) for n in self.names}
        self._tables = _build_tables(graph, costs, cluster, self.mesh, self.names, self.configs, optimizer,
                                     context_bytes, microbatches)

    def plan(self, vec: Sequence[int] | np.ndarray) -> Plan:
        """The :class:`~tensoropt.plan.Plan` of configuration vector ``vec`` (what keeps nothing
        between two recomputed operators of a block recomputed with them: :func:`~.walk.fill_segments`)."""
        plan = Plan(self.plan_configs(vec), graph_fingerprint=self.graph.fingerprint, graph_name=self.graph.name,
                    order=list(self.names))
        return plan.with_microbatches(self.microbatches) if self.microbatches > 1 else plan

    def plan_configs(self, vec: Sequence[int] | np.ndarray) -> dict[str, NodeConfig]:
        """The configurations of :meth:`plan`."""
        configs = {n: self.configs[n][int(s)] for n, s in zip(self.names, vec)}
        return fill_segments(self.names, configs, self.graph, self.costs)

    def evaluate(self, vec: Sequence[int] | np.ndarray) -> tuple[int, float]:
        """(per-device peak bytes, simulated step seconds) of the plan ``vec``."""
        a = np.asarray(vec, dtype=np.int64)
        t = self._tables
        return int(_walk(a, *t["walk"])[0]), float(_simulate(a, *t["time"]))

    def memory_parts(self, vec: Sequence[int] | np.ndarray) -> dict[str, int]:
        """The peak of plan ``vec`` split as :meth:`~.walk.StepMemory.parts` splits it (parameters,
        gradients, optimizer, activations, transient, reserve), adding up to the peak."""
        r = _walk(np.asarray(vec, dtype=np.int64), *self._tables["walk"])
        return dict(zip(("parameters", "gradients", "optimizer", "activations", "transient", "reserve"),
                        (int(x) for x in r[1:])))

    def evaluate_many(self, vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`evaluate` of every row of ``vecs`` (plans × nodes): (peaks, seconds)."""
        vecs = np.ascontiguousarray(vecs, dtype=np.int64)
        t = self._tables
        return _walk_many(vecs, *t["walk"]), _simulate_many(vecs, *t["time"])


# ---- tables ---------------------------------------------------------------------------------


def _csr(rows: Sequence[Sequence[Any]], dtype: Any = np.int64) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    for i, r in enumerate(rows):
        ptr[i + 1] = ptr[i] + len(r)
    flat = np.array([x for r in rows for x in r], dtype=dtype) if ptr[-1] else np.zeros(0, dtype=dtype)
    return ptr, flat


def _build_tables(graph: OpGraph, costs: CostModel, cluster: Cluster, mesh: tuple[str, ...], names: list[str],
                  configs: Mapping[str, tuple[NodeConfig, ...]], optimizer: str | int,
                  context_bytes: int, microbatches: int = 1) -> dict[str, tuple[Any, ...]]:
    """The arrays both kernels read (module docstring): every figure from the plan model's rules."""
    n, k = len(names), len(mesh)
    index = {name: i for i, name in enumerate(names)}
    cmax = max((len(configs[x]) for x in names), default=1)
    d0 = mesh[0]
    speed = min(cluster.device(d).speed for d in mesh)
    needs_grad = grad_nodes(graph)
    out_node = next((x for x in graph if x.kind == "output"), None)
    # every producer that is not an operator is part of the batch (as the walk and the simulator take it)
    inputs = list(dict.fromkeys(p for x in graph.ops for p in x.inputs if graph.nodes[p].kind != "op"))
    xindex = {x: i for i, x in enumerate(inputs)}

    # nodes × configurations
    fp = np.zeros((n, cmax))
    bp = np.zeros((n, cmax))
    out_b = np.zeros((n, cmax), dtype=np.int64)
    extra = np.zeros((n, cmax), dtype=np.int64)
    ws = np.zeros((n, cmax), dtype=np.int64)
    rc = np.zeros((n, cmax), dtype=np.bool_)
    pieces = np.ones((n, cmax), dtype=np.int64)
    cut = np.zeros((n, cmax), dtype=np.int64)          # 0: reads its parameters whole; else (layout, op) id + 1
    stat = np.full((n, cmax), -1.0)                    # a batch norm's statistics exchange, one direction
    loss_ar = np.full((n, cmax), -1.0)                 # a model output's all-reduce of partial sums before the loss
    ops = [graph.nodes[x] for x in names]
    cut_ids: dict[tuple[str, str], int] = {}
    for i, node in enumerate(ops):
        for c, cfg in enumerate(configs[node.name]):
            sh = shard_cost(costs, node, cfg)
            if sh is not None:
                fp[i, c], bp[i, c] = sh.fp_s, sh.bp_s
                out_b[i, c], extra[i, c] = sh.output_bytes, sh.extra_saved_bytes
            else:
                out_b[i, c] = piece_bytes(output_layout(cfg), cfg.degree, sum(t.nbytes for t in node.outputs))
            ws[i, c] = _workspace(costs.get(node.name), cfg)
            rc[i, c] = cfg.recompute
            pieces[i, c] = cfg.param_pieces
            if cfg.param_pieces > 1:
                cut[i, c] = 1 + cut_ids.setdefault((cfg.layout, op_basename(node.op)), len(cut_ids))
            st = stat_sync(graph, node, cfg, cluster)
            if st is not None:
                stat[i, c] = st.time_s
    outputs = [p for p in (out_node.inputs if out_node is not None else ()) if p in index]
    for p in outputs:
        i = index[p]
        nbytes = out_node.input_bytes[out_node.inputs.index(p)] if out_node is not None else 0
        for c, cfg in enumerate(configs[p]):
            if output_layout(cfg) == P:
                stages, _ = move(P, cfg.devices, TensorLayout.R, cfg.devices, nbytes, cluster)
                loss_ar[i, c] = stages[0].time_s if stages else -2.0   # -2: P but nothing moves

    # node inputs (slots): producers, the layout each configuration reads, the edges' reshards
    slot_rows: list[list[int]] = []
    slot_info: list[tuple[int, int, bool]] = []      # (producer index or -1 - input index, node, saved)
    for i, node in enumerate(ops):
        row = []
        cost = costs.get(node.name)
        for p in node.inputs:
            pn = graph.nodes[p]
            prod = index[p] if pn.kind == "op" else -1 - xindex[p]
            row.append(len(slot_info))
            slot_info.append((prod, i, cost is not None and p in cost.saved_inputs))
        slot_rows.append(row)
    ns = len(slot_info)
    slot_ptr, slot_ids = _csr(slot_rows)
    slot_prod = np.array([s[0] for s in slot_info], dtype=np.int64)
    slot_node = np.array([s[1] for s in slot_info], dtype=np.int64)
    by_prod: list[list[int]] = [[] for _ in range(n)]
    for sl, (prod, _, _) in enumerate(slot_info):
        if prod >= 0:
            by_prod[prod].append(sl)
    prod_ptr, prod_slots = _csr(by_prod)
    slot_saved = np.array([s[2] for s in slot_info], dtype=np.bool_)
    read = np.zeros((ns, cmax), dtype=np.int64)            # by the consumer's configuration
    batch_piece = np.zeros((ns, cmax), dtype=np.int64)     # graph inputs: the piece read
    fwd_dur = np.full((ns, cmax, cmax), -1.0)              # [slot, producer config, consumer config]; -1: no stage
    bwd_dur = np.full((ns, cmax, cmax), -1.0)
    grad_l = np.zeros((ns, cmax, cmax), dtype=np.int64)
    recv = np.zeros((ns, cmax, cmax), dtype=np.int64)
    # what an edge reads and moves depends on the two configurations' layouts alone (one mesh:
    # the same devices; recomputing or sharding parameters moves no activation): each layout
    # pair is costed once, then spread over the configurations that share it
    by_layout: dict[str, tuple[list[NodeConfig], np.ndarray]] = {}
    for x in names:
        first: dict[str, int] = {}
        reps: list[NodeConfig] = []
        which = []
        for cfg in configs[x]:
            if cfg.layout not in first:
                first[cfg.layout] = len(reps)
                reps.append(cfg)
            which.append(first[cfg.layout])
        by_layout[x] = (reps, np.array(which, dtype=np.int64))
    for s, (prod, i, _) in enumerate(slot_info):
        node = ops[i]
        pname = names[prod] if prod >= 0 else inputs[-1 - prod]
        nbytes = node.input_bytes[node.inputs.index(pname)]
        creps, cwhich = by_layout[node.name]
        nc = cwhich.size
        lays = [read_layout(graph, node, pname, cfg) for cfg in creps]
        read[s, :nc] = np.array([_TENSOR_ID[lay] for lay in lays], dtype=np.int64)[cwhich]
        if prod < 0:
            batch_piece[s, :nc] = np.array([piece_bytes(lay, cfg.degree, nbytes) for lay, cfg in zip(lays, creps)],
                                           dtype=np.int64)[cwhich]
            continue
        preps, pwhich = by_layout[pname]
        fw = np.full((len(preps), len(creps)), -1.0)
        bw = np.full((len(preps), len(creps)), -1.0)
        gl = np.zeros((len(preps), len(creps)), dtype=np.int64)
        rv = np.zeros((len(preps), len(creps)), dtype=np.int64)
        for a, pcfg in enumerate(preps):
            for c, cfg in enumerate(creps):
                rs = edge_reshard(graph, pname, node.name, pcfg, cfg, cluster)
                assert len(rs.forward) <= 1 and len(rs.backward) <= 1, "one mesh: at most one collective"
                if rs.forward:
                    fw[a, c] = rs.forward[0].time_s
                if rs.backward:
                    bw[a, c] = rs.backward[0].time_s
                gl[a, c] = _TENSOR_ID[rs.grad_layout]
                vals = set(rs.recv_bytes.values())
                assert len(vals) <= 1, "one mesh: every device receives the same piece"
                rv[a, c] = rs.recv_bytes.get(d0, 0)
        pairs = np.ix_(pwhich, cwhich)
        na = pwhich.size
        fwd_dur[s, :na, :nc] = fw[pairs]
        bwd_dur[s, :na, :nc] = bw[pairs]
        grad_l[s, :na, :nc] = gl[pairs]
        recv[s, :na, :nc] = rv[pairs]
    unread = np.array([reads_nothing(node) for node in ops], dtype=np.bool_)

    # parameters: who reads them, their bytes
    params = [q for q in graph.params]
    qindex = {q: j for j, q in enumerate(params)}
    q_bytes = np.array([graph.params[q].nbytes for q in params], dtype=np.int64)
    q_kind = np.array([0 if graph.params[q].kind == ParamKind.PARAMETER else 1 for q in params], dtype=np.int64)
    q_train = np.array([graph.params[q].is_trainable for q in params],
                       dtype=np.bool_)
    node_q_ptr, node_q = _csr([[qindex[q] for q in (*node.params, *node.param_reads)] for node in ops])
    readers: list[list[int]] = [[] for _ in params]
    for i, node in enumerate(ops):
        for q in (*node.params, *node.param_reads):
            readers[qindex[q]].append(i)
    q_read_ptr, q_readers = _csr(readers)

    # static per node
    alias = np.array([aliases_input(node, costs) for node in ops], dtype=np.bool_)
    ng = np.array([bool(needs_grad.get(x)) for x in names], dtype=np.bool_)
    is_out = np.zeros(n, dtype=np.bool_)
    for p in outputs:
        is_out[index[p]] = True
    out_list = np.array([index[p] for p in outputs], dtype=np.int64)
    gets = np.array([bool(needs_grad.get(x)) and (is_out[i] or any(
        needs_grad.get(c) and graph.nodes[c].kind == "op" for c in graph.successors(x))) for i, x in enumerate(names)],
        dtype=np.bool_)
    saves_out = np.array([bool(costs.get(x) is not None and costs[x].saves_output) for x in names], dtype=np.bool_)
    widened = np.array([bool(node.outputs) and node.outputs[0].dtype in ("bfloat16", "float16") for node in ops],
                       dtype=np.bool_)
    ncfg = np.array([len(configs[x]) for x in names], dtype=np.int64)

    # the ring of the mesh (gradients' all-reduce, whose bytes depend on the plan)
    ring_lat = np.zeros(max(k, 1))
    ring_bw = np.ones(max(k, 1))
    for j in range(k):
        link = cluster.link(mesh[j], mesh[(j + 1) % k]) if k > 1 else None
        if link is not None:
            ring_lat[j] = link.latency_s if link.exchange_latency_s is None else link.exchange_latency_s
            ring_bw[j] = link.bandwidth_Bps * link.duplex
    rate = costs.settings.get("grad_copy_Bps") or (costs.settings.get("in_sequence") or {}).get("grad_copy_Bps") \
        or 0.0
    alpha = optimizer_alpha(optimizer)
    adam = (optimizer if isinstance(optimizer, str) else ("adam" if optimizer >= 2 else "sgd")).lower() in (
        "adam", "adamw")
    # sharding levels: each configuration's; which parameters a plan shards is decided per plan
    # (:func:`_levels`: tensoropt.plan.sharded_parameters on one mesh), each gathered and
    # reduce-scattered on its own (its ring all-gather's time; a reduce-scatter takes as long)
    shard = np.zeros((n, cmax), dtype=np.int64)
    for i, node in enumerate(ops):
        for c, cfg in enumerate(configs[node.name]):
            shard[i, c] = int(cfg.shard)
    q_ag = np.array([allgather_time(cluster, mesh, int(b)) if b and k > 1 else 0.0 for b in q_bytes])
    q_piece = np.array([piece_nbytes(graph.params[q].numel, graph.params[q].nbytes, max(k, 1)) for q in params],
                       dtype=np.int64)
    common = (slot_ptr, slot_ids, slot_prod, read, recv, unread, node_q_ptr, node_q, q_read_ptr, q_readers, q_bytes,
              q_train, pieces, cut, shard, q_ag, q_piece, k)
    # recomputed segments (:func:`~.walk.recompute_segments`): each node's block, and which
    # configurations keep nothing (may sit inside a recomputed run)
    blocks: dict[str, int] = {}
    blk = np.array([blocks.setdefault(block_of(node.module_path) or node.module_path, len(blocks)) for node in ops],
                   dtype=np.int64)
    keeps0 = np.zeros((n, cmax), dtype=np.bool_)
    for i, node in enumerate(ops):
        for c, cfg in enumerate(configs[node.name]):
            keeps0[i, c] = keeps_nothing(costs, node, cfg)
    time = (ncfg, fp, bp, rc, stat, loss_ar, ng, is_out, out_list, fwd_dur, bwd_dur, grad_l, float(speed),
            float(rate), ring_lat, ring_bw, slot_node, prod_ptr, prod_slots, blk, keeps0, *common, microbatches)
    walk = (out_b, extra, ws, rc, alias, ng, gets, saves_out, widened, out_list, slot_saved, batch_piece, len(inputs),
            q_kind, alpha, adam, context_bytes, blk, keeps0, *common, microbatches)
    return {"time": time, "walk": walk}


# ---- compiled ahead ---------------------------------------------------------------------------


def _tiny_evaluator() -> MeshEvaluator:
    """A plan evaluator of a tiny captured model — an embedding whose weight the output reuses and
    a residual block, priced through a device model (nothing timed) — on two devices (about 1 s)."""
    import torch

    from ..capture import capture
    from ..cluster import load_cluster
    from ..devicemodel import price
    from ..measure import profile

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(16, 8)
            self.norm = torch.nn.LayerNorm(8)
            self.mlp = torch.nn.Linear(8, 8)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)
            x = x + torch.relu(self.mlp(self.norm(x)))
            logits: torch.Tensor = x @ self.embed.weight.t()
            return logits

    # a fork of a process whose torch ran threads: one thread here (as a DataLoader worker), or an op
    # can wait forever on a thread pool the fork did not copy
    torch.set_num_threads(1)
    graph = capture(Tiny(), (torch.zeros(2, 4, dtype=torch.long),))
    cluster = load_cluster("preset:v100-8-nvlink")
    costs = price(profile(graph, shard_degrees=(1, 2), repeats=1, timed=False), cluster, costs_from="model").costs
    return MeshEvaluator(graph, costs, cluster, cluster.names[:2])


def write_tiny_tables(path: Path = TINY_TABLES) -> None:
    """Save :func:`_tiny_evaluator`'s tables in ``path`` (``tiny_tables.npz`` beside
    :mod:`.meshkernels`, which compiles its kernels on them without torch).  Run it when the tables'
    entries change (``tests/test_kernels.py`` says so): ``python -c "from
    tensoropt.planmodel.meshplan import write_tiny_tables; write_tiny_tables()"``."""
    tables = _tiny_evaluator()._tables
    arrays: dict[str, Any] = {f"{name}_{i:02d}": np.asarray(x) for name in ("walk", "time")
                              for i, x in enumerate(tables[name])}
    np.savez_compressed(path, **arrays)
