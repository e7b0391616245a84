"""Run a plan: rewrite the captured graph so every operator runs where the plan says, and train.

:func:`apply_plan` returns a :class:`PlannedModule` — an ``nn.Module`` that owns the user's own
parameter and buffer objects (its ``parameters()`` are the model's, its ``state_dict`` keys are
the model's) and whose ``forward`` runs the rewritten ``torch.fx.GraphModule``
(:attr:`PlannedModule.graph_module`; ``print(m.graph_module.code)`` shows the ``.to(…)`` moves,
``split_pieces`` / ``cat`` / sum nodes).  How the graph is rewritten: :mod:`.rewrite`; how a value
moves between devices and layouts: :mod:`.layouts`.  :func:`check_plan` (:mod:`.check`) checks a plan:
the same loss, gradients and buffer updates as the unmodified model.

A ``bf16`` graph (:attr:`OpGraph.precision <tensoropt.graph.OpGraph.precision>`) runs its forward
under the autocast it was captured in (:func:`tensoropt.capture.precision_context`, for every
device type of the device map); the loss and the backward run outside it.

The graph is the one captured in training mode: batch norm uses batch statistics and dropout
draws masks even after ``.eval()``.  Random ops draw keyed masks (:mod:`.randomness`): every
shard draws its piece of the mask the whole op would draw, so a plan trains the same function
as the model, and the check runs with dropout on.

The package's names live in its modules — :mod:`.planned` (:func:`apply_plan`, the device map),
:mod:`.check`, :mod:`.rewrite`, :mod:`.layouts`, :mod:`.randomness` — and are re-exported here;
this file holds no code, so no module of the package imports it back.
"""

from __future__ import annotations

from .check import Comparison, check_plan, compare_with_model, rel_diff
from .layouts import Placed, Transport
from .planned import (
    PlannedModule,
    apply_plan,
    default_device_map,
    disable_dropout,
    parse_device_map,
    parse_mapping,
    resolve_device_map,
)
from .randomness import KeyedRandomMode
from .rewrite import rewrite

__all__ = ["apply_plan", "PlannedModule", "default_device_map", "parse_device_map", "parse_mapping",
           "resolve_device_map",
           "compare_with_model", "check_plan", "Comparison", "rel_diff", "disable_dropout", "Placed", "Transport",
           "rewrite",
           "KeyedRandomMode"]
