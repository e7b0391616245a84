"""tensoropt: the Pareto set of (per-device memory, iteration time) plans for training a PyTorch
model on several GPUs.  See README.md and the design notes.

Stages (one module each): :mod:`tensoropt.capture` (model → :class:`OpGraph`),
:mod:`tensoropt.costs` (OpGraph → :class:`CostModel`), :mod:`tensoropt.cluster` (devices and links), …
"""

from .capture import capture, load_onnx
from .costs import CostModel, NodeCost, ShardCost, node_memory, profile, step_memory
from .errors import CaptureError, GraphFormatError, ModelSpecError, TensorOptError
from .graph import Edge, OpGraph, OpNode, ParamInfo, SplitDims, TensorMeta
from .modelspec import LoadedModel, load_graph, load_model

__version__ = "0.1.0"

__all__ = [
    "capture", "load_onnx", "profile", "CostModel", "NodeCost", "ShardCost", "node_memory", "step_memory", "load_model", "load_graph", "LoadedModel",
    "OpGraph", "OpNode", "ParamInfo", "SplitDims", "TensorMeta", "Edge",
    "TensorOptError", "CaptureError", "GraphFormatError", "ModelSpecError",
]
