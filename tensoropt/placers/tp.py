"""Tensor parallelism as Megatron-LM runs it (Shoeybi et al. 2019, "Megatron-LM: Training
Multi-Billion Parameter Language Models Using Model Parallelism"): every operator over all the
devices of one host, the weights of each repeated block cut in column / row pairs.

The pairing is read from the graph's data flow, never from module names.  In each repeated block
(:func:`~tensoropt.graph.block_of`), in the graph's order:

- a *layer* is an operator with a weight (:func:`~tensoropt.planmodel.reshard.is_weighted`, not an
  embedding lookup) that reads a trainable parameter;
- a layer that reads the block's replicated activations is **column parallel**: ``channel``
  (``S(channel)``: each device its slice of the output features, the weight's rows);
- the operators its output reaches inside the block before the next layers (:func:`_region`: on a
  path from it to one of them) **follow the split**: ``channel`` where the operator has a channel
  split of that degree in the profile (activations, elementwise ops, attention over heads, the
  views between), else ``R`` — the plan model prices the gather that operator needs;
- the layers at the end of those paths are **row parallel**: ``reduce`` (each device its slice of
  the input features, the output partial sums, all-reduced where a consumer reads them whole);
- everything else is replicated (``R``): norms, residual adds, the dropout after a row layer, and
  every operator outside the blocks (embeddings, the head, mask arithmetic).

A layer or a follower without the shard of that degree in the profile stays ``R`` (counted in the
notes).  Every device runs the whole batch: this is tensor parallelism alone, with no data axis.

GPT-2 under the current split rules: the MLP is Megatron's exactly (``c_fc`` column, GELU split,
``c_proj`` row, no communication between them).  Attention is not: the fused ``c_attn``'s column
split cuts ``[q | k | v]`` in contiguous pieces, not by heads, and the ``split`` into q, k, v has no
channel split, so it reads the projection whole (an all-gather per block); the attention core
(``scaled_dot_product_attention``) then runs split by heads, reading q, k, v whole (a local slice),
and its output stays split through the merge of the heads into the row-parallel ``c_proj``.  The
plan is correct and checkable; the notes say which operators went which way and what fraction of
the step's FLOPs runs split (tiny GPT-2: 86.7 %).  Llama is Megatron's exactly: q, k, v, gate and
up column, o and down row, and everything between on each device's heads — the head split, RoPE,
grouped-query attention (where the degree divides the key / value heads), the merge — so a block
communicates only in the all-reduce after each row layer, as PyTorch's ``ColwiseParallel`` /
``RowwiseParallel`` run it (:func:`tensoropt.planmodel.tensorparallel.tensor_parallel_modules`; the plan is
priced so, runtime ``dtensor``, where those styles express it).  The
rule reads no transformer vocabulary, so a block of convolutions is paired the same way (its
first convolution column, the next row, …), and a model whose repeated block is a single module
(VGG's ``features.0``, ``features.2``, …) gets its layers column parallel alone, each output
gathered.

Example (a block of two linears on two A100s: the first column, the ReLU split, the second row)::

    >>> import torch
    >>> from tensoropt import capture, load_cluster, price, profile
    >>> block = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    >>> graph = capture(torch.nn.Sequential(block), (torch.randn(4, 8),))
    >>> priced = price(profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
    ...                load_cluster("preset:a100-4-nvlink"))
    >>> plan = place(graph, priced.costs, priced.cluster, devices=["gpu0", "gpu1"])
    >>> [(n, str(c.layout)) for n, c in plan.configs.items()]
    [('linear', 'channel'), ('relu', 'channel'), ('linear_1', 'reduce')]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..cluster import Cluster
from ..graph import OpGraph, OpNode, block_of
from ..layouts import Layout
from ..measure.costmodel import CostModel
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import NodeConfig, Plan, PlanError
from ..planmodel.reshard import is_weighted, op_basename, reads_nothing
from ..planmodel.tensorparallel import price_as_dtensor
from ._common import refuse_unless_walked_fits

NAME = "tp"
#: the same with sequence parallelism (:func:`sequence_rows`)
SEQUENCE_PARALLEL_NAME = "tp+sp"


@dataclass
class Roles:
    """What :func:`megatron_roles` decided for each operator of the blocks (every other operator
    is replicated): the layers cut by columns and by rows, the followers split along the channels,
    and the operators between a column and a row layer that stay whole (no channel split of that
    degree), with the layers that lacked one."""

    column: list[str] = field(default_factory=list)
    row: list[str] = field(default_factory=list)
    follow: list[str] = field(default_factory=list)
    whole: list[str] = field(default_factory=list)
    unsplit_layers: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)

    def layouts(self) -> dict[str, Layout]:
        """Operator -> its layout, for the operators split (the others are ``R``)."""
        return {**dict.fromkeys(self.column, Layout.CHANNEL), **dict.fromkeys(self.follow, Layout.CHANNEL),
                **dict.fromkeys(self.row, Layout.REDUCE), **dict.fromkeys(self.rows, Layout.BATCH)}


def place(graph: OpGraph, costs: CostModel, cluster: Cluster, *, devices: Sequence[str] | str | None = None,
          optimizer: str | int = DEFAULT_OPTIMIZER) -> Plan:
    """Megatron tensor parallelism over ``devices`` (default: all of the cluster's; module
    docstring).  Raises :class:`~tensoropt.plan.PlanError` on one device, when no layer of a
    repeated block has a column split of that degree in the profile, or when the walked peak does
    not fit the smallest device.  O(V + E) per block and one memory walk."""
    plan = tensor_parallel_plan(graph, costs, cluster, devices=devices, optimizer=optimizer)
    refuse_unless_walked_fits(plan, graph, costs, cluster, plan.devices, optimizer, NAME,
                              "use more devices, devices with more memory, a smaller batch, or frontier tracking")
    return plan


def place_sequence_parallel(graph: OpGraph, costs: CostModel, cluster: Cluster, *,
                            devices: Sequence[str] | str | None = None,
                            optimizer: str | int = DEFAULT_OPTIMIZER) -> Plan:
    """:func:`place` with sequence parallelism (:func:`sequence_rows`): the blocks' norms and
    residual adds on each device's rows of tokens.  Raises as :func:`place` does, and when no
    operator of the blocks may be cut by rows at that degree."""
    plan = tensor_parallel_plan(graph, costs, cluster, devices=devices, optimizer=optimizer, sequence_parallel=True)
    refuse_unless_walked_fits(plan, graph, costs, cluster, plan.devices, optimizer, SEQUENCE_PARALLEL_NAME,
                              "use more devices, devices with more memory, a smaller batch, or frontier tracking")
    return plan


def tensor_parallel_plan(graph: OpGraph, costs: CostModel, cluster: Cluster, *,
                         devices: Sequence[str] | str | None = None,
                         optimizer: str | int = DEFAULT_OPTIMIZER, sequence_parallel: bool = False) -> Plan:
    """:func:`place`'s plan, whether it fits or not (what FSDP over hosts runs inside each host:
    :mod:`tensoropt.frontier.replicas`); ``sequence_parallel``: :func:`place_sequence_parallel`'s.
    O(V + E) per block."""
    costs.check_graph(graph)
    name = SEQUENCE_PARALLEL_NAME if sequence_parallel else NAME
    names = tuple(cluster.select(devices))
    n = len(names)
    roles = _split_roles(graph, costs, n, name)
    if sequence_parallel:
        roles.rows = sequence_rows(graph, costs, n, roles)
        if not roles.rows:
            raise PlanError(f"{name}: no operator of the blocks may run on a piece of the batch rows: none has a "
                            f"('batch', {n}) shard in the profile (the batch must have at least {n} rows); use tp")
    split = roles.layouts()
    configs = {nd.name: NodeConfig(names, split.get(nd.name, Layout.R)) for nd in graph.ops}
    fraction = split_flops_fraction(costs, split)
    notes = [f"tensor parallel over {n} devices: {len(roles.column)} layers column-parallel (channel): "
             f"{_listed(roles.column)}; {len(roles.row)} row-parallel (reduce): {_listed(roles.row)}",
             f"{len(roles.follow)} operators follow the channel split between them; "
             f"{len(roles.whole)} between them stay whole (no channel split of degree {n}: the plan model prices "
             f"their gather){': ' + _listed(roles.whole) if roles.whole else ''}; every other operator replicated "
             "(norms, residual adds, embeddings, the head, everything outside the blocks)",
             f"{fraction:.1%} of the step's FLOPs (forward and backward, where the profile records them) run split"]
    if roles.rows:
        notes.insert(2, f"sequence parallel: {len(roles.rows)} operators of the blocks between the row and the column "
                        "layers (norms, residual adds) on each device's rows of tokens (batch), the row layers' "
                        "partial sums reduce-scattered and gathered again before the column layers")
    if roles.unsplit_layers:
        notes.append(f"{len(roles.unsplit_layers)} layers of the blocks lack the shard they need and stay replicated: "
                     f"{_listed(roles.unsplit_layers)}")
    plan = Plan(configs, graph_fingerprint=graph.fingerprint, graph_name=graph.name, batch_size=graph.batch_size,
                cluster_name=cluster.name, cluster_fingerprint=cluster.fingerprint, algorithm=name,
                options={"devices": list(names), "optimizer": optimizer}, order=[nd.name for nd in graph.ops],
                plan_id=name, notes=notes)
    return price_as_dtensor(plan, graph)


def megatron_layouts(graph: OpGraph, costs: CostModel, n: int) -> dict[str, Layout]:
    """Each operator's layout under Megatron's tensor parallelism over ``n`` devices (the operators
    replicated left out) — what a pipeline's stages run in on each pipeline rank's ``n`` tp devices
    (:func:`tensoropt.planmodel.pipelined.price_pipeline`'s ``layouts``).  Nothing to split is a
    :class:`~tensoropt.plan.PlanError` saying why.  O(V + E) per block."""
    costs.check_graph(graph)
    return _split_roles(graph, costs, n, NAME).layouts()


def _split_roles(graph: OpGraph, costs: CostModel, n: int, name: str) -> Roles:
    """:func:`megatron_roles` over ``n`` devices, or a :class:`~tensoropt.plan.PlanError` (placer
    ``name``'s) where there are too few devices or no layer to split by columns."""
    if n < 2:
        raise PlanError(f"{name}: tensor parallelism needs at least 2 devices, got {n}")
    roles = megatron_roles(graph, costs, n)
    if not roles.column:
        why = ("the model has no repeated blocks (module paths with a numeric part)"
               if not any(block_of(nd.module_path) for nd in graph.ops) else
               f"no layer of its blocks has a ('channel', {n}) shard in the profile")
        raise PlanError(f"{name}: nothing to split by columns: {why}; profile with that shard degree "
                        f"(tensoropt profile MODEL --degrees 1,{n}) or use a placer that splits the batch (dp, fsdp)")
    return roles


def megatron_roles(graph: OpGraph, costs: CostModel, n: int) -> Roles:
    """The column / row pairs of every repeated block at degree ``n`` and the operators between
    them (module docstring), from the data flow: a layer no earlier column layer's region reaches
    is column parallel, the layers its region reaches are row parallel.  O(V + E) per column layer's
    region, each within its block."""
    trainable = {q for q, p in graph.params.items() if p.is_trainable}
    order = {nd.name: i for i, nd in enumerate(graph.ops)}   # (once: a region is sorted by it, 7,600 of 70B's)
    roles = Roles()
    decided: set[str] = set()
    for node in graph.ops:
        block = block_of(node.module_path)
        if block is None or node.name in decided or not _is_layer(node, trainable):
            continue
        decided.add(node.name)
        if not _has(costs, node, "channel", n):
            roles.unsplit_layers.append(node.name)
            continue
        roles.column.append(node.name)
        between, rows = _region(graph, node.name, block, trainable, order)
        for name in between:
            if name in decided:
                continue
            decided.add(name)
            (roles.follow if _has(costs, graph.nodes[name], "channel", n) else roles.whole).append(name)
        for name in rows:
            if name in decided:
                continue
            decided.add(name)
            (roles.row if _has(costs, graph.nodes[name], "reduce", n) else roles.unsplit_layers).append(name)
    return roles


def sequence_rows(graph: OpGraph, costs: CostModel, n: int, roles: Roles) -> list[str]:
    """The operators sequence parallelism (Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models") runs on each device's rows of tokens: the token
    stream between the row and the column layers — an operator of a repeated block that
    :func:`megatron_roles` keeps whole, has its ``('batch', n)`` shard in the profile, and lies on a
    path of such operators from a row layer (the residual adds, the dropout after it, the next norm)
    or to a column layer (the first block's norm).  Each works token by token, so a row layer's
    partial sums are reduce-scattered to it (not all-reduced) and a column layer's input gathered
    once from it: the same messages' bytes, the activations between them ÷ n.  What reads no such
    path (rotary tables, masks) stays whole; the first block's stream is cut from the whole
    embedding (no message), the last one's gathered for what follows.  O(V + E)."""
    split = roles.layouts()
    stream = {nd.name for nd in graph.ops
              if block_of(nd.module_path) is not None and nd.name not in split and _has(costs, nd, "batch", n)}
    chosen: set[str] = set()
    ahead = list(roles.row)
    while ahead:   # forward from the row layers
        for c in graph.successors(ahead.pop()):
            if c in stream and c not in chosen:
                chosen.add(c)
                ahead.append(c)
    behind = list(roles.column)
    while behind:  # back from the column layers
        for p in graph.nodes[behind.pop()].inputs:
            if p in stream and p not in chosen:
                chosen.add(p)
                behind.append(p)
    return [nd.name for nd in graph.ops if nd.name in chosen]


def _is_layer(node: OpNode, trainable: set[str]) -> bool:
    """An operator with a weight that reads a trainable parameter (a linear, a matrix product, a
    convolution), not an embedding lookup (a table read by index, which has no columns to pair)."""
    return (is_weighted(node) and not op_basename(node.op).startswith("embedding")
            and any(q in trainable for q in (*node.params, *node.param_reads)))


def _has(costs: CostModel, node: OpNode, layout: str, n: int) -> bool:
    """Whether ``node`` may run as ``layout`` over ``n`` devices: the graph gives it that split and
    the profile has the shard (an operator without a cost, e.g. a graph input, never)."""
    if node.name not in costs:
        return False
    if layout == Layout.CHANNEL and node.split.channel is None:
        return False
    return (layout, n) in costs.legal(node.name)


def _region(graph: OpGraph, column: str, block: str, trainable: set[str],
            order: Mapping[str, int]) -> tuple[list[str], list[str]]:
    """The operators of ``block`` between the column layer ``column`` and the layers its output
    reaches (the row layers), and those layers: the operators reached from ``column`` without
    passing a layer that lie on a path to one of them, in graph order (``order``: operator →
    position).  Operators that reach no layer (a block's output that leaves the split unpaired) are
    not between: they stay whole."""
    reached: set[str] = set()
    rows: list[str] = []
    stack = [column]
    while stack:
        for c in graph.successors(stack.pop()):
            nd = graph.nodes.get(c)
            if nd is None or nd.kind != "op" or c in reached or reads_nothing(nd) or block_of(nd.module_path) != block:
                continue
            reached.add(c)
            if _is_layer(nd, trainable):
                rows.append(c)
            else:
                stack.append(c)
    # keep the reached operators from which a row layer is reachable inside the reached set
    leads = set(rows)
    back = list(rows)
    while back:
        for p in graph.nodes[back.pop()].inputs:
            if p in reached and p not in leads:
                leads.add(p)
                back.append(p)
    between = sorted((c for c in leads if c not in rows), key=order.__getitem__)
    return between, sorted(rows, key=order.__getitem__)


def split_flops_fraction(costs: CostModel, layouts: dict[str, Layout]) -> float:
    """The fraction of the step's FLOPs (forward and backward, :class:`~tensoropt.measure.costmodel.Work`;
    the forward alone for a node profiled before work was recorded) that the operators of
    ``layouts`` hold; 0 when the profile records none."""
    def flops(name: str) -> int:
        c = costs.get(name)
        if c is None:
            return 0
        return c.work.fp_flops + c.work.bp_flops if c.work is not None else c.flops

    total = sum(flops(name) for name in costs.nodes)
    return sum(flops(name) for name in layouts) / total if total else 0.0


def _listed(names: Sequence[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" … (+{len(names) - most})" if len(names) > most else "")
