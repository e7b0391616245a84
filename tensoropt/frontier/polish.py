"""The polish: every plan of one mesh evaluated so far (:class:`Evaluated`, keyed by its
configuration vector, so that no plan is walked twice), its Pareto set by walked peak and
simulated step, the plans around a plan (:meth:`Evaluated.neighbours`: one-node moves, moves of a
whole class of repeated operators (:func:`repeated_nodes`), blocks recomputed or kept whole;
:meth:`Evaluated.joint_moves`: one sharding level on a tied weight's readers, or on every node at
another level) and the local search around the frontier (:meth:`Evaluated.polish`: in rounds, each
around the frontier points not yet looked around, each round spending half of the walks left).

The polish is a local search bounded by ``max_walks``: on large graphs it stops before it
converges.  What that leaves out is measured, not bounded (``benchmarks/polish_reach.py``: each
frontier against one found with forty times the walks).

The search's additive estimate only chooses which plans are walked; every figure kept is the
compiled evaluator's (:class:`~tensoropt.planmodel.meshplan.MeshEvaluator`: the simulator's).  The
hot sums are :mod:`.polish_kernels`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..graph import OpGraph, block_of
from ..layouts import Layout, Shard
from ..plan import trainable_reads
from ..planmodel.meshplan import MeshEvaluator
from . import point_sets
from .graph_problem import MeshProblem
from .polish_kernels import _additive_many, _class_moves, _single_moves

__all__ = ["Evaluated", "repeated_nodes"]


def repeated_nodes(graph: OpGraph, names: Sequence[str], labels: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Classes of repeated operators (indices into ``names``): the same op with the same output
    shapes, at the same place in modules whose paths differ only in their numbers (a transformer's
    ``h.0.attn`` and ``h.7.attn``, a ResNet's ``layer1.0`` and ``layer1.2``), with the same
    configurations; classes of one node are left out.  O(V)."""
    seen: dict[tuple[Any, ...], int] = {}
    classes: dict[tuple[Any, ...], list[int]] = {}
    for i, name in enumerate(names):
        node = graph.nodes[name]
        shapes = tuple(tuple(t.shape) for t in node.outputs)
        here = (node.module_path, node.op, shapes)
        nth = seen[here] = seen.get(here, -1) + 1
        key = (re.sub(r"\.\d+(?=\.|$)", ".#", node.module_path), node.op, shapes, nth, tuple(labels[i]))
        classes.setdefault(key, []).append(i)
    return [np.array(m, dtype=np.int64) for m in classes.values() if len(m) > 1]


class Evaluated:
    """Every plan of one mesh evaluated so far by the compiled evaluator
    (:class:`~tensoropt.planmodel.meshplan.MeshEvaluator`: its simulated step and its walked peak,
    the figures :func:`~tensoropt.simulate` gives), with the search's additive estimate of it.
    Plans are configuration vectors (index per node, problem order), kept as rows."""

    def __init__(self, mp: MeshProblem, ev: MeshEvaluator, graph: OpGraph):
        self.mp, self.ev = mp, ev
        nodes = mp.problem.nodes
        self.ks = np.array([n.k for n in nodes], dtype=np.int64)
        cmax = int(self.ks.max()) if len(nodes) else 1
        # the search's additive costs, vectorised: Σ node + Σ edge (+ max transient for memory; inf: infeasible)
        self._mem = np.full((len(nodes), cmax), np.inf)
        self._time = np.full((len(nodes), cmax), np.inf)
        self._tr = np.zeros((len(nodes), cmax))
        for v, n in enumerate(nodes):
            self._mem[v, :n.k] = np.where(np.isfinite(n.time), n.mem, np.inf)
            self._time[v, :n.k] = n.time
            self._tr[v, :n.k] = mp.transient[n.name]
        edges = mp.problem.edges
        self._e_src = np.array([mp.problem.index(e.src) for e in edges], dtype=np.int64)
        self._e_dst = np.array([mp.problem.index(e.dst) for e in edges], dtype=np.int64)
        self._e_mem = np.full((len(edges), cmax, cmax), np.inf)
        self._e_time = np.full((len(edges), cmax, cmax), np.inf)
        for j, e in enumerate(edges):
            ka, kb = e.mem.shape
            self._e_mem[j, :ka, :kb] = np.where(np.isfinite(e.time), e.mem, np.inf)
            self._e_time[j, :ka, :kb] = e.time
        # each node's incident edges (CSR), for re-costing a one-node move from its plan's sums
        ends = np.concatenate([self._e_src, self._e_dst])
        order = np.argsort(ends, kind="stable")
        self._inc_edge = np.concatenate([np.arange(len(edges)), np.arange(len(edges))])[order].astype(np.int64)
        self._inc_ptr = np.searchsorted(ends[order], np.arange(len(nodes) + 1)).astype(np.int64)
        self.classes = repeated_nodes(graph, [n.name for n in nodes], [n.labels for n in nodes])
        self._cls_ptr = np.cumsum([0] + [len(m) for m in self.classes]).astype(np.int64)   # the classes, CSR
        self._cls_idx = (np.concatenate(self.classes) if self.classes else np.zeros(0)).astype(np.int64)
        # each configuration's recomputing twin (same devices, layout and level; -1: none), and the
        # nodes of each repeated block: a block recomputed whole is one segment (a checkpoint per block)
        self._recomputed = np.full((len(nodes), cmax), -1, dtype=np.int64)
        self._kept = np.full((len(nodes), cmax), -1, dtype=np.int64)    # and its keeping twin
        for v, n in enumerate(nodes):
            cfgs = mp.configs[n.name]
            twin = {(c.devices, c.layout, int(c.shard)): i for i, c in enumerate(cfgs) if c.recompute}
            plain = {(c.devices, c.layout, int(c.shard)): i for i, c in enumerate(cfgs) if not c.recompute}
            for i, c in enumerate(cfgs):
                self._recomputed[v, i] = twin.get((c.devices, c.layout, int(c.shard)), -1)
                self._kept[v, i] = plain.get((c.devices, c.layout, int(c.shard)), -1)
        # each node's FSDP-with-checkpointing configuration: batch, recomputed, its parameters at
        # level 3 where it may shard them (-1: none), for the move that makes a block that recipe
        self._fsdp_ac = np.full(len(nodes), -1, dtype=np.int64)
        for v, n in enumerate(nodes):
            cfgs = mp.configs[n.name]
            pick = [i for i, c in enumerate(cfgs) if c.layout == Layout.BATCH and c.recompute]
            if pick:
                self._fsdp_ac[v] = max(pick, key=lambda i: int(cfgs[i].shard) == int(Shard.PARAMETERS))
        # each configuration's twin at every sharding level (same devices, layout and recomputation;
        # -1: none), and the readers of every trainable parameter read by more than one node (a tied
        # weight: an embedding and an output layer) — for the joint moves (:meth:`joint_moves`)
        self._at_level = np.full((len(nodes), cmax, len(Shard)), -1, dtype=np.int64)
        self._level = np.zeros((len(nodes), cmax), dtype=np.int64)
        for v, n in enumerate(nodes):
            cfgs = mp.configs[n.name]
            same = {(c.devices, c.layout, bool(c.recompute), int(c.shard)): i for i, c in enumerate(cfgs)}
            for i, c in enumerate(cfgs):
                self._level[v, i] = int(c.shard)
                for lv in Shard:
                    self._at_level[v, i, int(lv)] = same.get((c.devices, c.layout, bool(c.recompute), int(lv)), -1)
        readers: dict[str, list[int]] = {}
        for v, n in enumerate(nodes):
            for q in trainable_reads(graph, n.name):
                readers.setdefault(q, []).append(v)
        self.ties = [np.array(sorted(set(vs)), dtype=np.int64) for vs in readers.values() if len(set(vs)) > 1]
        by_block: dict[str, list[int]] = {}
        for v, n in enumerate(nodes):
            b = block_of(graph.nodes[n.name].module_path)
            if b is not None:
                by_block.setdefault(b, []).append(v)
        members = [np.array(m, dtype=np.int64) for m in by_block.values()]
        self.blocks = ([np.concatenate(members)] if len(members) > 1 else []) + members
        self._in_block = {v for m in members for v in m.tolist()}
        #: rounds of the polish done, and what its last one saved (:meth:`_gain`: time at equal
        #: memory, least memory; fractions)
        self.rounds = 0
        self.last_gain = (0.0, 0.0)
        self.seen: dict[bytes, int] = {}
        self.vecs: list[np.ndarray] = []
        self.peak: list[float] = []
        self.time: list[float] = []
        self.est: list[float] = []

    def __len__(self) -> int:
        return len(self.vecs)

    def recipes(self) -> np.ndarray:
        """The hand recipes on this mesh, in the search's terms (one row each): data parallel —
        every operator ``batch`` where it may, ``R`` where not — then with ZeRO-1, ZeRO-2 and
        ZeRO-3 (FSDP) where a node's parameters may shard, then FSDP with every repeated block
        recomputed (torchtitan's recipe).  Walked beside the search's own plans, so the polish
        starts from them too (the search's estimate can miss what a whole recomputed block holds)."""
        nodes = self.mp.problem.nodes
        rows = []
        for level, recompute in ((Shard.NONE, False), (Shard.OPTIMIZER, False), (Shard.GRADIENTS, False),
                                 (Shard.PARAMETERS, False), (Shard.PARAMETERS, True)):
            row = np.zeros(len(nodes), dtype=np.int64)
            for v, n in enumerate(nodes):
                cfgs = self.mp.configs[n.name]
                want = recompute and v in self._in_block
                ranks = [(c.layout == Layout.BATCH, int(c.shard) == int(level), bool(c.recompute) == want)
                         for c in cfgs]
                row[v] = max(range(len(cfgs)), key=ranks.__getitem__)
            rows.append(row)
        return np.array(rows, dtype=np.int64).reshape(len(rows), len(nodes))

    def estimate(self, vecs: np.ndarray) -> np.ndarray:
        """The search's additive estimate of each row's memory (inf where a choice is infeasible)."""
        return self.additive(vecs)[0]

    def additive(self, vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The search's additive (memory estimate, time) of each row (inf where infeasible)."""
        return _additive_many(np.ascontiguousarray(vecs, dtype=np.int64), self._mem, self._time, self._tr,
                              self._e_src, self._e_dst, self._e_mem, self._e_time)

    def add(self, vecs: np.ndarray) -> int:
        """Evaluate the rows not seen before and feasible; returns how many were new."""
        if not len(vecs):
            return 0
        fresh, keys = [], []
        for r in range(len(vecs)):
            key = vecs[r].tobytes()
            if key not in self.seen:
                self.seen[key] = -1
                fresh.append(r)
                keys.append(key)
        if not fresh:
            return 0
        rows = np.ascontiguousarray(vecs[fresh])
        est = self.estimate(rows)
        ok = np.isfinite(est)
        rows, est = rows[ok], est[ok]
        keys = [k for k, good in zip(keys, ok) if good]
        peaks, times = self.ev.evaluate_many(rows)
        for r, key in enumerate(keys):
            self.seen[key] = len(self.vecs)
            self.vecs.append(rows[r])
        self.peak.extend(peaks.astype(np.float64).tolist())
        self.time.extend(times.tolist())
        self.est.extend(est.tolist())
        return len(keys)

    def frontier(self, resolution: float, backend: str | None) -> tuple[list[int], int]:
        """The evaluated plans' Pareto set by (peak, simulated time), memory ascending, and how
        many the resolution merged."""
        keep, merged = point_sets.reduce(np.array(self.peak), np.array(self.time), resolution, backend=backend,
                                         return_merged=True)
        return [int(i) for i in keep], int(merged)

    def neighbours(self, i: int, blocks_first: bool = False, limit: int | None = None) -> np.ndarray:
        """The plans around plan ``i``, most promising first (the first ``limit``, default all):
        every plan one node's configuration
        away, every plan that sets one configuration on a whole class of repeated nodes
        (:func:`repeated_nodes`: a transformer's twelve blocks move together), and the plans that
        recompute every repeated block, or one of them, whole (each a segment: the checkpoint per
        block that a node-by-node search rarely assembles), as it is or as FSDP with checkpointing
        (batch, parameters at level 3), and those that keep every block, or one, instead (from
        FSDP with every block recomputed, the plans between it and FSDP) — with ``blocks_first``
        (the polish's least-memory point) every one of these and the ladders from it (the last k
        blocks kept, the first k recomputed), then the ``limit`` best ranked and as many more as
        there were block moves; else the block moves last.  The rest ranked by the
        search's additive costs relative to plan ``i``'s: those that save memory or time first
        (by the larger relative saving), then the rest by the smaller relative loss.  The one-node
        and the class moves are re-costed from plan ``i``'s sums (:func:`_single_moves`,
        :func:`_class_moves`) and only the plans returned are built."""
        base = self.vecs[i]
        mv, mc, est1, tim1 = _single_moves(np.ascontiguousarray(base, dtype=np.int64), self.ks, self._mem,
                                           self._time, self._tr, self._e_src, self._e_dst, self._e_mem,
                                           self._e_time, self._inc_ptr, self._inc_edge)
        # every class set to one configuration where more than one member differs (one differing
        # member is a single-node move), re-costed from plan i's sums; its row is built if picked
        ck, cc, est2, tim2 = _class_moves(np.ascontiguousarray(base, dtype=np.int64), self._cls_ptr, self._cls_idx,
                                          self.ks, self._mem, self._time, self._tr, self._e_src, self._e_dst,
                                          self._e_mem, self._e_time, self._inc_ptr, self._inc_edge)
        est, tim = np.concatenate([est1, est2]), np.concatenate([tim1, tim2])
        (be,), (bt,) = self.additive(base[None, :])
        gain = np.maximum((be - est) / max(abs(be), 1.0), (bt - tim) / max(abs(bt), 1e-30))
        # every block, then each block, recomputed whole — first around the least-memory point,
        # whatever the additive estimate says of them (it sees a segment only edge by edge); last
        # elsewhere, where the budget goes to the ranked moves
        n_ranked = gain.size if limit is None else max(0, min(gain.size, limit))
        blocks = []
        # (elsewhere than blocks_first the block moves come after the ranked ones: none where those fill
        # the limit — Llama-3-405B's polish built 378 rows of 6,710 a call to cut them off)
        for members in self.blocks if blocks_first or n_ranked == gain.size else ():
            for twin in (self._recomputed[members, base[members]], self._fsdp_ac[members],
                         self._kept[members, base[members]]):
                row = base.copy()
                row[members[twin >= 0]] = twin[twin >= 0]
                if (row != base).sum() > 1:
                    blocks.append(row)
        if blocks_first and len(self.blocks) > 2:
            # the ladder between every block recomputed and none: the last k blocks kept (their
            # activations are the first backward frees), k = 1 … N−1, and the first k recomputed —
            # the plans between FSDP with checkpointing and FSDP, one block of memory apart
            for twins in (self._kept, self._recomputed):
                row = base.copy()
                for members in self.blocks[:0:-1]:
                    twin = twins[members, row[members]]
                    row[members[twin >= 0]] = twin[twin >= 0]
                    if (row != base).sum() > 1:
                        blocks.append(row.copy())
        if blocks_first and limit is not None:
            # the least-memory point, where memory binds: as many of the best ranked moves again as
            # it has block moves (Llama-3-8B's least plan on 8 H100s, 48.7 → 45.1 GiB: two classes of
            # 32 linears cut along their reduction dimension, which the block moves crowded out)
            n_ranked = min(gain.size, n_ranked + len(blocks))
        picked = np.argsort(-gain, kind="stable")[:n_ranked]
        ranked = np.repeat(base[None, :], picked.size, axis=0)
        one = picked < mv.size
        ranked[np.flatnonzero(one), mv[picked[one]]] = mc[picked[one]]
        for r, w in zip(np.flatnonzero(~one).tolist(), (picked[~one] - mv.size).tolist()):
            ranked[r, self.classes[ck[w]]] = cc[w]
        block_rows = np.array(blocks, dtype=np.int64).reshape(len(blocks), len(base))
        if blocks_first:    # every block move, then the ``limit`` best ranked
            return np.concatenate([block_rows, ranked])
        out = np.concatenate([ranked, block_rows])
        return out if limit is None else out[:limit]

    def _gain(self, before: Sequence[int], after: Sequence[int]) -> tuple[float, float]:
        """What a round of the polish moved the frontier (plans ``before`` it, ``after`` it): the
        largest fraction of time a plan after saves against the fastest plan before within its
        memory, and the fraction of the least memory saved."""
        peak, time = np.array(self.peak), np.array(self.time)
        old_m, old_t = peak[list(before)], time[list(before)]
        faster = 0.0
        for k in after:
            within = old_t[old_m <= peak[k]]
            if within.size:
                faster = max(faster, 1.0 - time[k] / float(within.min()))
        least = float(old_m.min())
        smaller = max(0.0, 1.0 - float(peak[list(after)].min()) / least) if least > 0 else 0.0
        return faster, smaller

    def joint_moves(self, i: int) -> np.ndarray:
        """The plans around plan ``i`` that change one sharding level on several nodes at once, each
        node keeping its layout and recomputation: every reader of a tied weight set to one level
        (an embedding and the output layer that shares its weight: moved apart, the tie edge holds the
        larger piece for both, so no one-node move gains), and every node at one level moved to
        another (ZeRO-3 to ZeRO-2 across the model: the estimate ranks each node's move alone).
        A few rows (ties × levels + levels²); only those that change more than one node.

        On GPT-2-12L on eight V100s, the plan that moves the tied ``wte`` of the embedding and the
        output layer from ZeRO-3 to ZeRO-2 together is 9 % faster at 2.5 % less memory than the
        frontier point it comes from, which 4,000 walks of one-node and class moves did not find."""
        base = np.asarray(self.vecs[i], dtype=np.int64)
        have = self._level[np.arange(base.size), base]
        rows = []
        for members in self.ties:
            for lv in Shard:
                twin = self._at_level[members, base[members], int(lv)]
                row = base.copy()
                row[members[twin >= 0]] = twin[twin >= 0]
                if (row != base).sum() > 1:
                    rows.append(row)
        for src in Shard:
            at = np.flatnonzero(have == int(src))
            for dst in Shard:
                if dst == src or at.size < 2:
                    continue
                twin = self._at_level[at, base[at], int(dst)]
                row = base.copy()
                row[at[twin >= 0]] = twin[twin >= 0]
                if (row != base).sum() > 1:
                    rows.append(row)
        return np.array(rows, dtype=np.int64).reshape(len(rows), base.size)

    def polish(self, resolution: float, backend: str | None, max_evals: int) -> bool:
        """Local search around the frontier: evaluate the plans around each frontier point
        (:meth:`neighbours`), again around every new frontier point, until the frontier stops
        changing.  True when it finished — every frontier point's neighbours evaluated — within
        ``max_evals`` plans evaluated on the mesh in all; else each round gave half of the walks
        left to the points not yet looked around (each its joint moves, then its most promising
        neighbours), and the next round the rest to the points that round found.
        O(points × (Σ configs + classes × configs)) evaluations."""
        done: set[int] = set()
        complete = True
        before: list[int] | None = None
        while True:
            front, _ = self.frontier(resolution, backend)
            if before is not None:
                self.rounds += 1
                self.last_gain = self._gain(before, front)
            todo = [k for k in front if k not in done]
            if not todo:
                return complete
            room = max_evals - len(self)
            if room <= 0:
                return False
            before = front
            # half of what is left goes to this round's points, so that the points it finds get
            # rounds of their own (spending it all at once ended the polish with GPT-2-12L's
            # least-memory point, found in the first round, never looked around)
            share = max(1, room // (2 * len(todo)))
            for k in todo:
                # front: memory ascending.  Around the least-memory point, every block move (the
                # plans between recomputing every block and none, which the estimate misjudges:
                # a Llama's FSDP with checkpointing is estimated at twice its walked peak), then
                # its share; around every point, the joint moves of sharding levels, then its share
                # of the most promising moves
                least = k == front[0]
                around = np.concatenate([self.joint_moves(k),
                                         self.neighbours(k, blocks_first=least, limit=share + 1)])
                if len(around) > share and not least:
                    around, complete = around[:share], False
                self.add(around)
                done.add(k)
