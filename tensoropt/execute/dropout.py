"""Dropout off in a rewritten graph.

Plans draw dropout masks keyed (:mod:`.randomness`), the same as the model's, so checks run
with dropout on; turning it off is for comparisons that want a deterministic step without random
masks at all (``benchmarks/executor_check.py``, the distributed jobs' plan checks).  Turning
dropout off in the *model* before capture would change the graph (Hugging Face models skip a
``p = 0`` dropout, so the plan's fingerprint no longer matches); :func:`dropout_off` instead sets
the probability of every dropout op of the *rewritten* graph to 0 (keyed calls included), which
makes it the identity exactly (``aten.dropout`` / ``native_dropout`` with ``p = 0`` scale by 1
and keep every element; attention with ``dropout_p = 0`` draws no mask).  O(nodes).

Owns: finding dropout probabilities in a rewritten graph and zeroing them in a copy.  Must
not: touch the model or the original graph module (it returns a copy).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import torch.fx as fx

from ..planmodel.reshard import op_basename
from .randomness import keyed_call
from .segments import run_checkpointed

#: arguments a keyed random call (.randomness.keyed_call) puts before the op's own
_KEYED_LEAD = 7

#: op base name -> (position of the probability among the op's arguments, its keyword)
DROPOUT_P = {"dropout": (1, "p"), "native_dropout": (1, "p"), "feature_dropout": (1, "p"),
             "alpha_dropout": (1, "p"), "feature_alpha_dropout": (1, "p"),
             "scaled_dot_product_attention": (4, "dropout_p"),
             "_scaled_dot_product_flash_attention_for_cpu": (2, "dropout_p"),
             "_scaled_dot_product_efficient_attention": (5, "dropout_p"),
             "_scaled_dot_product_flash_attention": (3, "dropout_p")}


def dropout_sites(graph_module: fx.GraphModule) -> Iterator[tuple[fx.Node, int, str]]:
    """Every dropout op of ``graph_module`` (also inside ``run_checkpointed`` and in the
    checkpointed segments' sub-graphs): ``(node, position of its probability among the node's
    arguments, its keyword)``.  O(nodes)."""
    for gm in graph_module.modules():
        if isinstance(gm, fx.GraphModule):
            yield from _sites(gm)


def _sites(graph_module: fx.GraphModule) -> Iterator[tuple[fx.Node, int, str]]:
    for n in graph_module.graph.nodes:
        if n.op != "call_function":
            continue
        checkpointed = n.target is run_checkpointed
        keyed = n.target is keyed_call
        spec = DROPOUT_P.get(op_basename(str(n.args[0] if checkpointed or keyed else n.target)))
        if spec is not None:
            pos, key = spec
            yield n, pos + (_KEYED_LEAD if keyed else 1 if checkpointed else 0), key


def dropout_off(graph_module: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``graph_module`` whose dropout ops have probability 0; the original is left as
    it is."""
    gm = copy.deepcopy(graph_module)
    for n, pos, key in list(dropout_sites(gm)):
        if key in n.kwargs:
            n.kwargs = {**n.kwargs, key: 0.0}
        elif len(n.args) > pos:
            n.args = (*n.args[:pos], 0.0, *n.args[pos + 1:])
    for sub in gm.modules():
        if isinstance(sub, fx.GraphModule):
            sub.recompile()
    return gm


def count_dropout(graph_module: fx.GraphModule) -> int:
    """How many dropout ops with a non-zero probability ``graph_module`` has."""
    return sum(bool(n.kwargs.get(key, n.args[pos] if len(n.args) > pos else 0.0))
               for n, pos, key in dropout_sites(graph_module))
