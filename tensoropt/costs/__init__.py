"""The cost-model stage: OpGraph → CostModel (measured per-node times and memory figures).

- :func:`profile` (:mod:`.profiler`): run every operator alone, forward and backward, at every
  shard shape; cached; roofline estimates where an op cannot run alone; then (default) the
  times each operator takes inside whole training steps (:mod:`.sequence`).
- :class:`CostModel` / :class:`NodeCost` / :class:`ShardCost` (:mod:`.model`): the profile as a
  JSON value tied to the graph's fingerprint.
- :func:`node_memory`, :func:`step_memory` (:mod:`.memory`): per-node and whole-step memory.
- :func:`measure_step` (:mod:`.step`): a real training step's time and memory, the ground truth.
"""

from .memory import (OPTIMIZER_ALPHA, NodeMemory, StepMemory, node_memory, optimizer_alpha,
                     optimizer_temp_bytes, step_memory)
from .model import CostModel, NodeCost, ShardCost
from .profiler import profile
from .step import StepMeasurement, measure_step, training_loss

__all__ = ["profile", "CostModel", "NodeCost", "ShardCost", "node_memory", "step_memory", "NodeMemory",
           "StepMemory", "measure_step", "StepMeasurement", "training_loss", "optimizer_alpha", "optimizer_temp_bytes", "OPTIMIZER_ALPHA"]
