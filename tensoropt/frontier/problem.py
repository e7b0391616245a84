"""The abstract cost problem frontier tracking solves, independent of torch.

A :class:`Problem` is a DAG.  Node ``v`` has ``k_v >= 1`` configurations, each with a cost
``(mem, time)``; edge ``u → v`` has a cost ``(mem, time)`` for every pair
``(config of u, config of v)`` (a ``k_u × k_v`` matrix of each).  An *assignment* picks one
configuration per node; its cost is the sum over all nodes and all edges of the chosen costs —
memory is additive per device (within one mesh every device holds the same shard
sizes), time is additive.  The task is the Pareto set of (mem, time) over all assignments.

Infeasible choices are allowed: a configuration or a configuration pair whose ``mem`` or
``time`` is ``+inf`` can never be part of a plan (tracking drops it; :func:`brute_force`
skips assignments that use it).  NaN and ``-inf`` are rejected.

Parallel edges (two edges ``u → v``) are allowed: their costs add.  Self loops and cycles are
rejected.  Node names are strings; configuration labels (``"batch@mesh4"``…) are optional and
only carried along.

Also here: :func:`brute_force` (the exact Pareto set by enumeration, for tests — exponential)
and :func:`min_scalarized` (the single-objective optimum of ``w_mem·mem + w_time·time`` by
variable elimination — OptCNN's objective with ``w_mem = 0`` — exact on any graph, exponential
only in the graph's treewidth).

It owns the problem's format and its checks; it must not import torch or the plan model.

Example::

    >>> p = Problem.build({"a": [(1, 2), (2, 1)], "b": [(0, 1)]}, [("a", "b", [[0], [1]], [[0], [0]])])
    >>> [(m, t) for m, t, _ in brute_force(p)]
    [(1.0, 3.0), (3.0, 2.0)]
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import networkx as nx
import numpy as np

from ..errors import GraphFormatError
from . import point_sets

PROBLEM_FORMAT = "tensoropt.frontier.problem/1"

__all__ = ["PROBLEM_FORMAT", "ProblemError", "NodeCosts", "EdgeCosts", "Problem", "brute_force",
           "min_scalarized"]


class ProblemError(GraphFormatError, ValueError):
    """A frontier problem is malformed (bad shape, NaN, unknown node, cycle…); the message says where."""


def _frozen_array(x: Any, shape_what: str, ndim: int) -> np.ndarray:
    try:
        a = np.array(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise ProblemError(f"{shape_what} must be numbers") from None
    if a.ndim != ndim:
        raise ProblemError(f"{shape_what} must be a {ndim}-d array of numbers, got shape {a.shape}")
    if np.isnan(a).any() or np.isneginf(a).any():
        raise ProblemError(f"{shape_what} holds NaN or -inf (use +inf for an infeasible choice)")
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class NodeCosts:
    """One node: the cost of each of its configurations (``mem[s]``, ``time[s]``)."""

    name: str
    mem: np.ndarray
    time: np.ndarray
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProblemError(f"node name must be a non-empty string, got {self.name!r}")
        m = _frozen_array(self.mem, f"node {self.name!r} mem", 1)
        t = _frozen_array(self.time, f"node {self.name!r} time", 1)
        if m.shape != t.shape or m.size == 0:
            raise ProblemError(f"node {self.name!r}: mem and time must list the same number (>= 1) of "
                               f"configurations, got {m.size} and {t.size}")
        labels = tuple(self.labels)
        if labels and (len(labels) != m.size or not all(isinstance(x, str) for x in labels)):
            raise ProblemError(f"node {self.name!r}: labels must be {m.size} strings (one per configuration)")
        object.__setattr__(self, "mem", m)
        object.__setattr__(self, "time", t)
        object.__setattr__(self, "labels", labels)

    @property
    def k(self) -> int:
        """Number of configurations."""
        return int(self.mem.size)


@dataclass(frozen=True, eq=False)
class EdgeCosts:
    """One edge ``src → dst``: ``mem[s_src, s_dst]``, ``time[s_src, s_dst]`` per configuration pair."""

    src: str
    dst: str
    mem: np.ndarray
    time: np.ndarray

    def __post_init__(self) -> None:
        where = f"edge {self.src!r} -> {self.dst!r}"
        m = _frozen_array(self.mem, f"{where} mem", 2)
        t = _frozen_array(self.time, f"{where} time", 2)
        if m.shape != t.shape:
            raise ProblemError(f"{where}: mem and time matrices differ in shape: {m.shape} vs {t.shape}")
        object.__setattr__(self, "mem", m)
        object.__setattr__(self, "time", t)


@dataclass(frozen=True, eq=False)
class Problem:
    """Nodes (in a fixed order: the order of tie-breaks and of assignments) and edges."""

    nodes: tuple[NodeCosts, ...]
    edges: tuple[EdgeCosts, ...] = ()

    def __post_init__(self) -> None:
        nodes = tuple(self.nodes)
        edges = tuple(self.edges)
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "edges", edges)
        index: dict[str, int] = {}
        for i, n in enumerate(nodes):
            if not isinstance(n, NodeCosts):
                raise ProblemError(f"nodes[{i}] must be a NodeCosts, got {type(n).__name__}")
            if n.name in index:
                raise ProblemError(f"node {n.name!r} is listed twice")
            index[n.name] = i
        for i, e in enumerate(edges):
            if not isinstance(e, EdgeCosts):
                raise ProblemError(f"edges[{i}] must be an EdgeCosts, got {type(e).__name__}")
            for end in (e.src, e.dst):
                if end not in index:
                    raise ProblemError(f"edge {e.src!r} -> {e.dst!r} names an unknown node {end!r}")
            if e.src == e.dst:
                raise ProblemError(f"edge {e.src!r} -> {e.dst!r} is a self loop")
            want = (nodes[index[e.src]].k, nodes[index[e.dst]].k)
            if e.mem.shape != want:
                raise ProblemError(f"edge {e.src!r} -> {e.dst!r}: cost matrices must be {want[0]}x{want[1]} "
                                   f"(configs of {e.src!r} x configs of {e.dst!r}), got {e.mem.shape}")
        object.__setattr__(self, "_index", index)
        # acyclic (Kahn)
        indeg = [0] * len(nodes)
        out: list[list[int]] = [[] for _ in nodes]
        for e in edges:
            out[index[e.src]].append(index[e.dst])
            indeg[index[e.dst]] += 1
        ready = [i for i, d in enumerate(indeg) if d == 0]
        seen = 0
        while ready:
            v = ready.pop()
            seen += 1
            for w in out[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    ready.append(w)
        if seen != len(nodes):
            cyc = sorted(nodes[i].name for i, d in enumerate(indeg) if d > 0)
            raise ProblemError(f"the problem graph has a cycle through {cyc[:5]}{'…' if len(cyc) > 5 else ''}")

    # ---- construction helpers -----------------------------------------------------------
    def masked(self, infeasible: Mapping[int, np.ndarray]) -> Problem:
        """This problem with the configurations ``infeasible[i]`` (a boolean mask over node ``i``'s
        configurations) made infeasible (``+inf`` memory and time) — built without checking again
        what a mask cannot change (names, edges, shapes, acyclicity): Llama-3-405B's τ runs made
        6,710 nodes anew, 0.3 s a run, to rule out a few configurations of some.

            >>> p = Problem.build({"a": [(1, 2), (2, 1)], "b": [(0, 1)]}, [("a", "b", [[0], [1]], [[0], [0]])])
            >>> p.masked({0: np.array([False, True])}).nodes[0].mem.tolist()
            [1.0, inf]
        """
        nodes = list(self.nodes)
        for i, bad in infeasible.items():
            n = nodes[i]
            if bad.shape != n.mem.shape:
                raise ProblemError(f"node {n.name!r}: a mask of {bad.shape} over {n.k} configurations")
            masked = object.__new__(NodeCosts)
            for name, value in (("name", n.name), ("labels", n.labels),
                                ("mem", np.where(bad, np.inf, n.mem)), ("time", np.where(bad, np.inf, n.time))):
                if isinstance(value, np.ndarray):
                    value.setflags(write=False)
                object.__setattr__(masked, name, value)
            nodes[i] = masked
        out = object.__new__(Problem)
        object.__setattr__(out, "nodes", tuple(nodes))
        object.__setattr__(out, "edges", self.edges)
        object.__setattr__(out, "_index", self._index)  # type: ignore[attr-defined]
        object.__setattr__(out, "_shared", self.shared_memo())
        return out

    def shared_memo(self) -> dict[Any, Any]:
        """Answers about this problem's nodes' names and its edges — what :meth:`masked` keeps —
        shared with every problem masked from it (:func:`~.repeats.check`'s verdict on the
        edges)."""
        memo = self.__dict__.get("_shared")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_shared", memo)
        return memo

    @classmethod
    def build(cls, nodes: Mapping[str, Sequence[Sequence[float]]] | Sequence[tuple[str, Sequence[Sequence[float]]]],
              edges: Iterable[tuple[str, str, Any, Any]] = ()) -> Problem:
        """``nodes``: name → ``[(mem, time), …]`` per configuration (or a list of such pairs);
        ``edges``: ``(src, dst, mem_matrix, time_matrix)`` tuples."""
        items = nodes.items() if isinstance(nodes, Mapping) else nodes
        ns = []
        for name, confs in items:
            c = np.asarray(confs, dtype=np.float64)
            if c.ndim != 2 or c.shape[1] != 2:
                raise ProblemError(f"node {name!r}: configurations must be (mem, time) pairs")
            ns.append(NodeCosts(name, c[:, 0], c[:, 1]))
        es = [EdgeCosts(s, d, m, t) for s, d, m, t in edges]
        return cls(tuple(ns), tuple(es))

    @classmethod
    def from_networkx(cls, g: nx.DiGraph) -> Problem:
        """A ``networkx.DiGraph`` whose nodes carry ``mem`` and ``time`` sequences (and optionally
        ``labels``) and whose edges carry ``mem`` and ``time`` matrices.  Node names become
        ``str(node)``; node order is the graph's node order."""
        ns = [NodeCosts(str(v), d["mem"], d["time"], tuple(d.get("labels", ()))) for v, d in g.nodes(data=True)]
        es = [EdgeCosts(str(u), str(v), d["mem"], d["time"]) for u, v, d in g.edges(data=True)]
        return cls(tuple(ns), tuple(es))

    def to_networkx(self) -> nx.DiGraph:
        if len({(e.src, e.dst) for e in self.edges}) != len(self.edges):
            raise ProblemError("a DiGraph cannot hold parallel edges; use to_dict()")
        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.name, mem=n.mem, time=n.time, labels=n.labels)
        for e in self.edges:
            g.add_edge(e.src, e.dst, mem=e.mem, time=e.time)
        return g

    # ---- basic queries --------------------------------------------------------------------
    def index(self, name: str) -> int:
        """Position of node ``name`` in :attr:`nodes`."""
        try:
            return int(self._index[name])  # type: ignore[attr-defined]
        except KeyError:
            raise KeyError(f"no node named {name!r}") from None

    @property
    def node_names(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.nodes)

    @property
    def n_assignments(self) -> int:
        return math.prod(n.k for n in self.nodes)

    def _as_vector(self, assignment: Mapping[str, int] | Sequence[int] | np.ndarray) -> list[int]:
        if isinstance(assignment, np.ndarray):   # a configuration vector (a frontier's row): checked at once
            return self._checked_vector(assignment)
        if isinstance(assignment, Mapping):
            try:   # every node given and no more (then nothing else is in it): one pass, no search
                vec = [int(assignment[n.name]) for n in self.nodes]
            except KeyError:
                vec = []
            if len(vec) != len(self.nodes) or len(assignment) != len(self.nodes):
                missing = [n.name for n in self.nodes if n.name not in assignment]
                extra = [k for k in assignment if k not in self._index]  # type: ignore[attr-defined]
                raise ProblemError(f"assignment must give every node a configuration; missing {missing[:5]}, "
                                   f"unknown {extra[:5]}")
        else:
            vec = [int(x) for x in assignment]
            if len(vec) != len(self.nodes):
                raise ProblemError(f"assignment has {len(vec)} entries for {len(self.nodes)} nodes")
        for n, s in zip(self.nodes, vec):
            if not 0 <= s < n.k:
                raise ProblemError(f"node {n.name!r} has configurations 0..{n.k - 1}, got {s}")
        return vec

    def _checked_vector(self, vec: np.ndarray) -> list[int]:
        """:meth:`_as_vector` of an integer array, its range checked in one pass (a frontier's
        points: Llama-3-405B's 283 of 6,710 nodes each took 9 ms node by node)."""
        if vec.shape != (len(self.nodes),) or not np.issubdtype(vec.dtype, np.integer):
            raise ProblemError(f"assignment has shape {vec.shape} ({vec.dtype}) for {len(self.nodes)} nodes: "
                               "one integer per node")
        ks = self.__dict__.get("_ks")
        if ks is None:
            ks = np.fromiter((n.k for n in self.nodes), dtype=np.int64, count=len(self.nodes))
            object.__setattr__(self, "_ks", ks)
        bad = np.flatnonzero((vec < 0) | (vec >= ks))
        if bad.size:
            n = self.nodes[int(bad[0])]
            raise ProblemError(f"node {n.name!r} has configurations 0..{n.k - 1}, got {int(vec[bad[0]])}")
        return cast("list[int]", vec.tolist())

    def cost_of(self, assignment: Mapping[str, int] | Sequence[int]) -> tuple[float, float]:
        """(mem, time) of an assignment (node name → configuration index, or a list in node
        order): the sum over nodes, then edges (``math.fsum``, so the value is the correctly
        rounded sum, independent of order)."""
        vec = self._as_vector(assignment)
        mems = [n.mem[s] for n, s in zip(self.nodes, vec)]
        times = [n.time[s] for n, s in zip(self.nodes, vec)]
        for e in self.edges:
            a, b = vec[self.index(e.src)], vec[self.index(e.dst)]
            mems.append(e.mem[a, b])
            times.append(e.time[a, b])
        if any(math.isinf(x) for x in mems + times):
            return math.inf, math.inf
        return math.fsum(mems), math.fsum(times)

    # ---- JSON ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON value (``+inf`` is written as ``Infinity``, which Python's json reads back)."""
        def node(n: NodeCosts) -> dict[str, Any]:
            d: dict[str, Any] = {"name": n.name, "mem": n.mem.tolist(), "time": n.time.tolist()}
            if n.labels:
                d["labels"] = list(n.labels)
            return d

        return {"format": PROBLEM_FORMAT,
                "nodes": [node(n) for n in self.nodes],
                "edges": [{"src": e.src, "dst": e.dst, "mem": e.mem.tolist(), "time": e.time.tolist()}
                          for e in self.edges]}

    @classmethod
    def from_dict(cls, d: Any) -> Problem:
        if not isinstance(d, Mapping) or d.get("format") != PROBLEM_FORMAT:
            raise ProblemError(f"not a frontier problem: expected an object with format {PROBLEM_FORMAT!r}")
        nodes, edges = d.get("nodes"), d.get("edges", [])
        if not isinstance(nodes, list) or not isinstance(edges, list):
            raise ProblemError("problem.nodes and problem.edges must be lists")
        try:
            ns = tuple(NodeCosts(x["name"], x["mem"], x["time"], tuple(x.get("labels", ()))) for x in nodes)
            es = tuple(EdgeCosts(x["src"], x["dst"], x["mem"], x["time"]) for x in edges)
        except (KeyError, TypeError) as exc:
            raise ProblemError(f"problem node / edge entry lacks a field or is not an object: {exc}") from None
        return cls(ns, es)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Problem):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]


# --------------------------------------------------------------------------------------------
# reference solvers

def brute_force(problem: Problem, *, limit: int = 2_000_000) -> list[tuple[float, float, dict[str, int]]]:
    """The exact Pareto set by enumerating all assignments: ``[(mem, time, assignment), …]`` by
    memory ascending.  Among assignments of equal (mem, time) the first in lexicographic order
    (node order, configurations ascending) is returned.  Exponential: refuses more than
    ``limit`` assignments.  Costs are summed in node-then-edge order, as in :meth:`Problem.cost_of`
    up to rounding."""
    total = problem.n_assignments
    if total > limit:
        raise ValueError(f"brute force over {total} assignments exceeds the limit of {limit}")
    ks = [n.k for n in problem.nodes]
    cfg = np.indices(ks).reshape(len(ks), -1) if ks else np.zeros((0, 1), np.int64)
    mem = np.zeros(cfg.shape[1])
    time = np.zeros(cfg.shape[1])
    for v, n in enumerate(problem.nodes):
        mem += n.mem[cfg[v]]
        time += n.time[cfg[v]]
    for e in problem.edges:
        a, b = cfg[problem.index(e.src)], cfg[problem.index(e.dst)]
        mem += e.mem[a, b]
        time += e.time[a, b]
    bad = np.isinf(mem) | np.isinf(time)
    mem[bad] = np.inf
    time[bad] = np.inf
    idx = point_sets.reduce(mem, time, backend="numpy")
    names = problem.node_names
    return [(float(mem[i]), float(time[i]), {names[v]: int(cfg[v, i]) for v in range(len(names))})
            for i in idx]


def min_scalarized(problem: Problem, w_mem: float = 0.0, w_time: float = 1.0) -> tuple[float, dict[str, int]]:
    """``min over assignments of w_mem·mem + w_time·time`` and one minimising assignment, by
    variable elimination (min-sum; greedy min-degree order, ties to the first node).

    With ``w_mem = 0, w_time = 1`` this is OptCNN's single objective (iteration time only).  Every
    minimiser with positive weights lies on the Pareto frontier, so it checks frontier tracking
    on graphs too big for :func:`brute_force`.  Exact on any graph; cost exponential in the
    treewidth only.  Returns ``(inf, {})`` when no assignment is feasible.
    """
    if w_mem < 0 or w_time < 0 or (w_mem == 0 and w_time == 0):
        raise ValueError("weights must be >= 0 and not both 0")

    def scal(m: np.ndarray, t: np.ndarray) -> np.ndarray:
        m, t = np.asarray(m, float), np.asarray(t, float)
        out = w_mem * np.where(np.isinf(m), 0.0, m) + w_time * np.where(np.isinf(t), 0.0, t)
        return np.where(np.isinf(m) | np.isinf(t), np.inf, out)

    n = len(problem.nodes)
    ks = [nd.k for nd in problem.nodes]
    factors: list[tuple[tuple[int, ...], np.ndarray]] = [((v,), scal(nd.mem, nd.time))
                                                         for v, nd in enumerate(problem.nodes)]
    for e in problem.edges:
        a, b = problem.index(e.src), problem.index(e.dst)
        tab = scal(e.mem, e.time)
        factors.append(((a, b), tab) if a < b else ((b, a), tab.T))

    def expand(scope: tuple[int, ...], tab: np.ndarray, full: tuple[int, ...]) -> np.ndarray:
        """Broadcast a factor to the (sorted) scope ``full``."""
        shape = [ks[x] if x in scope else 1 for x in full]
        return tab.reshape(shape)

    alive = set(range(n))
    trace: list[tuple[int, tuple[int, ...], np.ndarray]] = []  # (var, scope of the rest, argmin table)
    while alive:
        v = min(sorted(alive), key=functools.partial(_width, factors=factors))
        mine = [f for f in factors if v in f[0]]
        factors = [f for f in factors if v not in f[0]]
        full = tuple(sorted({x for s, _ in mine for x in s} | {v}))
        total = np.zeros([ks[x] for x in full])
        for s, tab in mine:
            total = total + expand(s, tab, full)
        ax = full.index(v)
        rest = tuple(x for x in full if x != v)
        trace.append((v, rest, np.argmin(total, axis=ax)))
        factors.append((rest, np.min(total, axis=ax)))
        alive.discard(v)
    value = float(sum(float(tab) for s, tab in factors))  # all remaining factors have empty scope
    if math.isinf(value):
        return math.inf, {}
    choice: dict[int, int] = {}
    for v, rest, arg in reversed(trace):
        choice[v] = int(arg[tuple(choice[x] for x in rest)]) if rest else int(arg)
    names = problem.node_names
    return value, {names[v]: choice[v] for v in range(n)}


def _width(v: int, factors: Sequence[tuple[tuple[int, ...], np.ndarray]]) -> int:
    """How many variables eliminating ``v`` joins: the union of the scopes of its factors."""
    sc: set[int] = set()
    for s, _ in factors:
        if v in s:
            sc.update(s)
    return len(sc)
