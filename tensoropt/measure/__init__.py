"""Measuring: what every operator of a graph costs on the device at hand, and what a real
training step costs (the ground truth the plan model is checked against).

This package measures and records; it does not model plans (that is :mod:`tensoropt.planmodel`,
which reads what is measured here, never the other way round).

- :func:`profile` (:mod:`.profiler`): run every operator alone, forward and backward, at every
  shard shape; cached; roofline estimates where an op cannot run alone; then (default) the
  times each operator takes inside whole training steps (:mod:`.sequence`).
- :class:`CostModel` / :class:`NodeCost` / :class:`ShardCost` (:mod:`.costmodel`): the profile as
  a JSON value tied to the graph's fingerprint.
- :func:`measure_step` (:mod:`.step`): a real training step's time and memory.

Example::

    >>> import torch
    >>> from tensoropt import capture
    >>> graph = capture(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()), (torch.randn(8, 16),))
    >>> costs = profile(graph, shard_degrees=(1, 2), repeats=3)
    >>> costs.save("profile.json")
    >>> costs.legal("linear"), costs.total_fp_s > 0
    ([('batch', 2), ('channel', 2), ('reduce', 2)], True)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from .costmodel import CostModel, NodeCost, ShardCost

if TYPE_CHECKING:
    from .profiler import profile
    from .step import StepMeasurement, measure_step, training_loss

#: the names that need torch, imported when first read (PEP 562): reading a profile needs only
#: :mod:`.costmodel`
_LAZY = {"profile": ".profiler", "StepMeasurement": ".step", "measure_step": ".step", "training_loss": ".step"}


__getattr__ = lazy_exports(__name__, _LAZY)

__all__ = ["CostModel", "NodeCost", "ShardCost", "StepMeasurement", "measure_step", "profile", "training_loss"]
