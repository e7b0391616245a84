"""Graph coarsening for placers: colocation groups and heavy-edge node grouping.

A :class:`Grouping` partitions the operator nodes of an :class:`~tensoropt.graph.OpGraph` into
groups whose members must share a device.  A placer decides where each *group* goes and
:meth:`Grouping.expand` turns that back into a device per node.  Two passes build groupings,
both on union-find (networkx's ``UnionFind``: disjoint sets with path compression and union by
size, the structure TensorFlow's Placer keeps its colocation groups in):

- :func:`colocate` — TensorFlow Placer's colocation heuristics:

  - **A**: a generator node (``OpNode.generator``: ``arange``, ``new_ones`` …) joins its
    consumer, so a constant is made where it is used (TF places a generator with its consumer
    when all its consumers share a device; here it joins its first consumer);
  - **B**: a metadata-only node (``OpNode.metadata_only``: view, reshape, getitem …) joins its
    producer — TF's rule reads the node's first input; a view of a graph input (the batch) has
    no producer to join and stays alone;
  - **C**: nodes that use the same parameter colocate — TF colocates a node with its reference
    / resource inputs (the variable); here a parameter's owner and every node that reads it
    (a tied embedding and the LM head) form one group, so the parameter is held once.

- :func:`heavy_edge_groups` — NetSplit's node grouping (the NetSplit thesis §5.2.3, Algorithm 3): check
  that the graph fits the devices' total memory, then merge the two ends of the edges in order
  of the bytes they carry, heaviest first, skipping a merge whose group would exceed the
  smallest device's memory, until ``target`` groups remain (default ``2 × devices``, the
  thesis's lower bound).  One rule is added: a merge that would close a cycle in the quotient
  graph (groups as nodes) is skipped, so the groups can be scheduled as units (when the starting
  grouping's quotient already has cycles — heuristic C joins an embedding with a far-away LM
  head — merges of groups already on one cycle are allowed: they create none).

Both take and return plain values; neither looks at devices beyond their memory sizes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import networkx as nx
from networkx.utils import UnionFind

from ..cluster import Cluster
from ..describe import fmt_bytes
from ..errors import TensorOptError
from ..graph import OpGraph
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER, optimizer_alpha
from ..plan import PlanError
from ..planmodel.memory import node_memory

T = TypeVar("T")

RULES = "ABC"


@dataclass(frozen=True)
class Grouping:
    """A partition of a graph's operator nodes into groups that share a device.

    ``group_of`` maps every ``kind="op"`` node to its group id; ids are ``0 … len − 1``, numbered
    by each group's first member in graph (topological) order.  ``members[g]`` lists group
    ``g``'s nodes in graph order.  ``method`` says how it was made (``"colocation ABC"``,
    ``"heavy-edge"`` …).
    """

    group_of: Mapping[str, int]
    members: tuple[tuple[str, ...], ...]
    method: str = ""

    def __len__(self) -> int:
        return len(self.members)

    @classmethod
    def singletons(cls, graph: OpGraph) -> Grouping:
        """Every operator alone."""
        return cls._from_uf(graph, UnionFind(n.name for n in graph.ops), "none")

    @classmethod
    def from_sets(cls, graph: OpGraph, sets: Iterable[Iterable[str]], method: str = "given") -> Grouping:
        """Groups from sets of node names; operators in no set are alone.  A name that is not an
        operator of ``graph`` raises :class:`TensorOptError`."""
        ops = [n.name for n in graph.ops]
        uf = UnionFind(ops)
        known = set(ops)
        for s in sets:
            s = list(s)
            for x in s:
                if x not in known:
                    raise TensorOptError(f"group member {x!r} is not an operator of graph {graph.name!r}")
            uf.union(*s)
        return cls._from_uf(graph, uf, method)

    @classmethod
    def _from_uf(cls, graph: OpGraph, uf: UnionFind, method: str) -> Grouping:
        # groups numbered by their first member in graph order, whichever member names the set
        gid: dict[str, int] = {}
        group_of: dict[str, int] = {}
        members: list[list[str]] = []
        for n in graph.ops:
            r = uf[n.name]
            if r not in gid:
                gid[r] = len(members)
                members.append([])
            group_of[n.name] = gid[r]
            members[gid[r]].append(n.name)
        return cls(group_of, tuple(tuple(m) for m in members), method)

    def union_find(self) -> UnionFind:
        """A union-find holding these groups (to refine them further)."""
        uf = UnionFind(self.group_of)
        for m in self.members:
            uf.union(*m)
        return uf

    def expand(self, group_placement: Mapping[int, T] | Sequence[T]) -> dict[str, T]:
        """A placement of groups (group id → device, or a list indexed by group id) as a placement
        of nodes (node → device).  Every group must be placed."""
        seq = isinstance(group_placement, Sequence)
        missing = [g for g in range(len(self.members))
                   if (g >= len(group_placement) if seq else g not in group_placement)]
        if missing:
            raise TensorOptError(f"the group placement has no device for group {missing[0]} "
                                 f"(members {', '.join(self.members[missing[0]][:3])}…)")
        return {n: group_placement[g] for n, g in self.group_of.items()}

    def quotient(self, graph: OpGraph) -> nx.DiGraph:
        """The graph of groups: node ``g`` (attribute ``members``), an edge ``g → h`` when a member
        of ``g`` feeds one of ``h`` (attribute ``nbytes``: the bytes summed over those edges).
        Edges inside a group and edges from graph inputs / to the output are left out.  O(V + E)."""
        q = nx.DiGraph()
        for g, m in enumerate(self.members):
            q.add_node(g, members=m)
        for e in graph.edges:
            a, b = self.group_of.get(e.src), self.group_of.get(e.dst)
            if a is None or b is None or a == b:
                continue
            if q.has_edge(a, b):
                q[a][b]["nbytes"] += e.nbytes
            else:
                q.add_edge(a, b, nbytes=e.nbytes)
        return q

    def is_acyclic(self, graph: OpGraph) -> bool:
        """Whether the quotient graph is a DAG (groups can run as units in some order)."""
        return bool(nx.is_directed_acyclic_graph(self.quotient(graph)))

    def memory(self, graph: OpGraph, costs: CostModel, *, alpha: int = 0) -> list[int]:
        """Bytes each group holds on its device: see :func:`group_memory`."""
        return [group_memory(graph, costs, m, alpha=alpha) for m in self.members]

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "groups": [list(m) for m in self.members]}


def group_memory(graph: OpGraph, costs: CostModel, members: Iterable[str], *, alpha: int = 0,
                 node_bytes: Mapping[str, int] | None = None) -> int:
    """What a group of nodes holds on the device it is placed on (the NetSplit thesis eq. 6-1's left side):
    the resident memory of each member (:func:`~tensoropt.planmodel.memory.node_memory`: parameters it owns,
    their gradients and α × optimizer state, activations kept for backward), plus the parameters
    members *read* but a node outside the group owns (held here too, with gradients and state;
    each once).  ``node_bytes`` gives precomputed resident bytes per node."""
    members = list(members)
    inside = set(members)
    total = 0
    read: set[str] = set()
    for n in members:
        total += node_bytes[n] if node_bytes is not None else node_memory(graph, costs, n, alpha=alpha).resident
        for p in graph.nodes[n].param_reads:
            info = graph.params[p]
            if info.owner not in inside and p not in read:
                read.add(p)
                total += param_held_bytes(graph, p, alpha)
    return total


def param_held_bytes(graph: OpGraph, name: str, alpha: int) -> int:
    """Bytes a device holds for one parameter: itself, plus its gradient and α × itself of
    optimizer state when it is trainable."""
    info = graph.params[name]
    if info.is_trainable:
        return (2 + alpha) * info.nbytes
    return info.nbytes


def parse_rules(rules: str | None) -> str:
    """``"ABC"``, ``"ab"``, ``"none"`` / ``""`` / ``None`` → the rules, upper-case, in A-B-C order."""
    if rules is None:
        return ""
    if not isinstance(rules, str):
        raise TensorOptError(f"colocation rules must be a string of A, B, C (or 'none'), got {rules!r}")
    r = rules.strip().upper()
    if r in ("", "NONE"):
        return ""
    bad = sorted(set(r) - set(RULES))
    if bad:
        raise TensorOptError(f"unknown colocation rule(s) {', '.join(bad)} in {rules!r}: the rules are "
                             "A (a generator joins its consumer), B (a metadata-only node joins its producer), "
                             "C (nodes sharing a parameter colocate); 'none' for no colocation")
    return "".join(x for x in RULES if x in r)


def colocate(graph: OpGraph, rules: str | None = "ABC", *, base: Grouping | None = None) -> Grouping:
    """Colocation groups by TensorFlow Placer's heuristics A, B, C (see the module docstring),
    refining ``base`` (default: every operator alone).  ``rules`` picks which apply (``"ABC"``,
    ``"BC"``, ``"none"``).  O((V + E + P) α(V))."""
    rules = parse_rules(rules)
    uf = base.union_find() if base is not None else UnionFind(n.name for n in graph.ops)
    ops = {n.name for n in graph.ops}
    if "A" in rules:
        for n in graph.ops:
            if n.generator:
                consumers = [c for c in graph.successors(n.name) if c in ops]
                if consumers:
                    uf.union(n.name, consumers[0])
    if "B" in rules:
        for n in graph.ops:
            if n.metadata_only and n.inputs and n.inputs[0] in ops:
                uf.union(n.name, n.inputs[0])
    if "C" in rules:
        for p in graph.params.values():
            uf.union(*(u for u in (p.owner, *p.readers) if u in ops))
    prefix = f"{base.method} + " if base is not None and base.method not in ("", "none") else ""
    return Grouping._from_uf(graph, uf, f"{prefix}colocation {rules or 'none'}")


def heavy_edge_groups(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | None = None,
                      target: int | None = None, max_group_bytes: int | None = None,
                      optimizer: str | int = DEFAULT_OPTIMIZER,
                      base: Grouping | None = None, acyclic: bool = True) -> Grouping:
    """NetSplit's node grouping (the NetSplit thesis, Algorithm 3; see the module docstring).

    ``devices`` (default: all of ``cluster``) give the memory budget: the graph's total (sum of
    :func:`group_memory` over singletons) must fit their sum, else :class:`PlanError`
    ("insufficient memory"); a merged group may hold at most ``max_group_bytes`` (default: the
    smallest device's memory).  Merging stops at ``target`` groups (default ``2 × len(devices)``)
    or when the edges run out.  ``base`` is a grouping to start from (e.g. :func:`colocate`'s);
    with ``acyclic`` a merge that would create a cycle among groups is skipped (checked with
    networkx on the quotient graph).  O(E · (V + E)) in the worst case (one reachability search
    per edge considered).
    """
    names = list(devices) if devices is not None else list(cluster.names)
    if not names:
        raise TensorOptError("heavy-edge grouping needs at least one device")
    mems = [cluster.device(d).memory_bytes for d in names]
    alpha = optimizer_alpha(optimizer)
    node_bytes = {n.name: node_memory(graph, costs, n.name, alpha=alpha).resident for n in graph.ops}
    required = group_memory(graph, costs, list(node_bytes), alpha=alpha, node_bytes=node_bytes)
    if required > sum(mems):
        raise PlanError(f"insufficient memory: graph {graph.name!r} needs {fmt_bytes(required)} "
                        f"(parameters, gradients, optimizer state, kept activations) but devices "
                        f"{', '.join(names)} have {fmt_bytes(sum(mems))} together")
    limit = min(mems) if max_group_bytes is None else int(max_group_bytes)
    target = 2 * len(names) if target is None else int(target)
    if target < 1:
        raise TensorOptError(f"heavy-edge grouping target must be at least 1 group, got {target}")

    start = base if base is not None else Grouping.singletons(graph)
    uf = start.union_find()
    q = start.quotient(graph)
    # quotient nodes are labelled by the union-find root of their group (which member is the root
    # changes no decision below: the merges read only sizes, bytes and paths)
    label: dict[int, str] = {g: uf[m[0]] for g, m in enumerate(start.members)}
    q = nx.relabel_nodes(q, label)
    group = {label[g]: list(m) for g, m in enumerate(start.members)}
    reads = {r: any(graph.nodes[n].param_reads for n in m) for r, m in group.items()}
    mem = {r: group_memory(graph, costs, m, alpha=alpha, node_bytes=node_bytes) for r, m in group.items()}
    count = len(start)

    pos = {n.name: i for i, n in enumerate(graph.ops)}
    edges = [e for e in graph.edges if e.src in pos and e.dst in pos]
    edges.sort(key=lambda e: (-e.nbytes, pos[e.dst], pos[e.src]))
    for e in edges:
        if count <= target:
            break
        a: str = uf[e.src]
        b: str = uf[e.dst]
        if a == b:
            continue
        if reads[a] or reads[b]:  # a parameter read on one side may be owned on the other: count it once
            merged = group_memory(graph, costs, group[a] + group[b], alpha=alpha, node_bytes=node_bytes)
        else:
            merged = mem[a] + mem[b]
        if merged > limit:
            continue
        if acyclic and _closes_cycle(q, a, b):
            continue
        uf.union(a, b)
        r: str = uf[a]
        other = b if r == a else a
        _contract(q, r, other)
        group[r] = group[r] + group.pop(other)
        reads[r] = reads[r] or reads.pop(other)
        mem[r] = merged
        mem.pop(other)
        count -= 1
    method = f"{start.method} + heavy-edge" if start.method not in ("", "none") else "heavy-edge"
    return Grouping._from_uf(graph, uf, method)


def _contract(q: nx.DiGraph, keep: str, other: str) -> None:
    """Merge quotient node ``other`` into ``keep`` (edges summed, no self-loop)."""
    for x, _, d in list(q.in_edges(other, data=True)):
        if x != keep:
            _add(q, x, keep, d.get("nbytes", 0))
    for _, y, d in list(q.out_edges(other, data=True)):
        if y != keep:
            _add(q, keep, y, d.get("nbytes", 0))
    q.remove_node(other)


def _add(q: nx.DiGraph, a: str, b: str, nbytes: int) -> None:
    if q.has_edge(a, b):
        q[a][b]["nbytes"] += nbytes
    else:
        q.add_edge(a, b, nbytes=nbytes)


def _closes_cycle(q: nx.DiGraph, a: str, b: str) -> bool:
    """Whether merging quotient nodes ``a`` and ``b`` creates a cycle: some path joins them other
    than the direct edges between them — unless they already lie on one cycle (a base grouping's
    quotient may have cycles; merging inside one adds none)."""
    removed = [(x, y) for x, y in ((a, b), (b, a)) if q.has_edge(x, y)]
    data = [q.edges[x, y] for x, y in removed]
    q.remove_edges_from(removed)
    try:
        around = nx.has_path(q, a, b) or nx.has_path(q, b, a)
    finally:
        for (x, y), d in zip(removed, data):
            q.add_edge(x, y, **d)
    if not around:
        return False
    return not (bool(nx.has_path(q, a, b)) and bool(nx.has_path(q, b, a)))
