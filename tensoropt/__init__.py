"""tensoropt: the Pareto set of (per-device memory, iteration time) plans for training a PyTorch
model on several GPUs.  See README.md and the design notes.

Stages (one module each): :mod:`tensoropt.capture` (model → :class:`OpGraph`),
:mod:`tensoropt.costs` (OpGraph → :class:`CostModel`; the memory walk of a plan),
:mod:`tensoropt.cluster` (devices and links), :mod:`tensoropt.frontier` (the Pareto set of
:class:`Plan` s), :mod:`tensoropt.placers` (the baselines), :mod:`tensoropt.simulate` (a plan's
time, memory and timeline), :mod:`tensoropt.compare` (every algorithm simulated alike),
:mod:`tensoropt.execute` (a plan run by rewriting the captured torch.fx graph) and
:mod:`tensoropt.distributed` (the same on torch.distributed, one process per rank).
"""

from .capture import capture, load_onnx
from .cluster import Cluster, Device, LinkModel, detect_cluster, list_presets, load_cluster
from .costs import CostModel, NodeCost, ShardCost, node_memory, profile, step_memory
from .errors import (CaptureError, ClusterSpecError, ExecutionError, GraphFormatError, ModelSpecError, ProfileError,
                     TensorOptError)
from .execute import PlannedModule, apply_plan
from .frontier import BudgetError, Frontier, FrontierPoint, candidate_meshes, track_frontier
from .graph import Edge, OpGraph, OpNode, ParamInfo, SplitDims, TensorMeta
from .modelspec import LoadedModel, load_graph, load_model
from .placers import PLACERS, place
from .plan import Estimate, NodeConfig, Plan, PlanError
from .reshard import Reshard, edge_reshard, param_sync, reshard
from .simulate import SimResult, TimelineEvent, plan_memory, simulate

__version__ = "0.1.0"

__all__ = [
    "capture", "load_onnx", "load_model", "load_graph", "LoadedModel",
    "profile", "CostModel", "NodeCost", "ShardCost", "node_memory", "step_memory",
    "OpGraph", "OpNode", "ParamInfo", "SplitDims", "TensorMeta", "Edge",
    "track_frontier", "Frontier", "FrontierPoint", "BudgetError", "candidate_meshes",
    "Plan", "NodeConfig", "Estimate", "PlanError", "place", "PLACERS",
    "simulate", "SimResult", "TimelineEvent", "plan_memory", "reshard", "edge_reshard", "param_sync", "Reshard",
    "Cluster", "Device", "LinkModel", "load_cluster", "detect_cluster", "list_presets",
    "apply_plan", "PlannedModule", "ExecutionError",
    "TensorOptError", "CaptureError", "GraphFormatError", "ModelSpecError", "ClusterSpecError", "ProfileError",
]
