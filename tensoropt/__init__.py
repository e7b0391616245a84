"""tensoropt: the Pareto set of (per-device memory, iteration time) plans for training a PyTorch
model on several GPUs.  See README.md and docs/architecture.md.

Stages, imports flowing one way (measure → plan model → search → surfaces):
:mod:`tensoropt.capture` (model → :class:`OpGraph`), :mod:`tensoropt.measure` (OpGraph →
:class:`CostModel`: operators measured alone and in sequence; a real step's time and memory),
:mod:`tensoropt.cluster` (devices and links), :mod:`tensoropt.planmodel` (what a :class:`Plan`
costs: layouts and resharding, the memory walk, the simulator, whether it fits),
:mod:`tensoropt.frontier` (the Pareto set of plans) and :mod:`tensoropt.placers` (the baselines),
:mod:`tensoropt.workflow` (one request → everything the surfaces show), then the surfaces:
:mod:`tensoropt.cli` and the dashboard (:mod:`tensoropt.dashboard`).  Plans run through
:mod:`tensoropt.execute` (the captured torch.fx graph rewritten) and :mod:`tensoropt.distributed`
(the same on torch.distributed, one process per rank).
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from ._lazy import lazy_exports

if TYPE_CHECKING:
    from .capture import capture, load_onnx
    from .cluster import Cluster, Device, LinkModel, detect_cluster, list_presets, load_cluster
    from .devicemodel import CostsKindError, Priced, device_model, price
    from .errors import (
        CaptureError,
        ClusterSpecError,
        ExecutionError,
        GraphFormatError,
        ModelSpecError,
        ProfileError,
        TensorOptError,
    )
    from .execute import PlannedModule, apply_plan
    from .frontier import BudgetError, Frontier, FrontierPoint, candidate_meshes, track_frontier
    from .graph import Edge, OpGraph, OpNode, ParamInfo, SplitDims, TensorMeta
    from .measure import CostModel, NodeCost, ShardCost, profile
    from .modelspec import LoadedModel, load_graph, load_model
    from .placers import PLACERS, place
    from .plan import Estimate, NodeConfig, Plan, PlanError
    from .planmodel import node_memory, step_memory
    from .planmodel.reshard import Reshard, edge_reshard, param_sync, reshard
    from .planmodel.simulate import SimResult, TimelineEvent, plan_memory, simulate
    from .workflow import Exploration, Request, explore

#: every name the package exports → the module it comes from, imported when the name is first read
#: (PEP 562): ``import tensoropt.cli`` then imports only what the command runs — a frontier whose
#: graph and profile are cached never imports torch (about 1.5 s of a command's start)
_EXPORTS = {
    **dict.fromkeys(("capture", "load_onnx"), ".capture"),
    **dict.fromkeys(("Cluster", "Device", "LinkModel", "detect_cluster", "list_presets", "load_cluster"), ".cluster"),
    **dict.fromkeys(("CostsKindError", "Priced", "device_model", "price"), ".devicemodel"),
    **dict.fromkeys(("CaptureError", "ClusterSpecError", "ExecutionError", "GraphFormatError", "ModelSpecError",
                     "ProfileError", "TensorOptError"), ".errors"),
    **dict.fromkeys(("PlannedModule", "apply_plan"), ".execute"),
    **dict.fromkeys(("BudgetError", "Frontier", "FrontierPoint", "candidate_meshes", "track_frontier"), ".frontier"),
    **dict.fromkeys(("Edge", "OpGraph", "OpNode", "ParamInfo", "SplitDims", "TensorMeta"), ".graph"),
    **dict.fromkeys(("CostModel", "NodeCost", "ShardCost"), ".measure.costmodel"),
    "profile": ".measure.profiler",
    **dict.fromkeys(("LoadedModel", "load_graph", "load_model"), ".modelspec"),
    **dict.fromkeys(("PLACERS", "place"), ".placers"),
    **dict.fromkeys(("Estimate", "NodeConfig", "Plan", "PlanError"), ".plan"),
    **dict.fromkeys(("node_memory", "step_memory"), ".planmodel"),
    **dict.fromkeys(("Reshard", "edge_reshard", "param_sync", "reshard"), ".planmodel.reshard"),
    **dict.fromkeys(("SimResult", "TimelineEvent", "plan_memory", "simulate"), ".planmodel.simulate"),
    **dict.fromkeys(("Exploration", "Request", "explore"), ".workflow"),
}


class _Package(types.ModuleType):
    """The package's module: ``tensoropt.capture`` is the function, as it always was, though the
    subpackage of that name is imported after it (which sets the package's attribute to the
    subpackage: refused here; the subpackage stays ``sys.modules["tensoropt.capture"]``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "capture" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


__version__ = "0.1.0"

__all__ = [
    "capture", "load_onnx", "load_model", "load_graph", "LoadedModel",
    "profile", "CostModel", "NodeCost", "ShardCost", "node_memory", "step_memory",
    "OpGraph", "OpNode", "ParamInfo", "SplitDims", "TensorMeta", "Edge",
    "price", "Priced", "device_model", "CostsKindError",
    "track_frontier", "Frontier", "FrontierPoint", "BudgetError", "candidate_meshes",
    "Plan", "NodeConfig", "Estimate", "PlanError", "place", "PLACERS",
    "simulate", "SimResult", "TimelineEvent", "plan_memory", "reshard", "edge_reshard", "param_sync", "Reshard",
    "Cluster", "Device", "LinkModel", "load_cluster", "detect_cluster", "list_presets",
    "apply_plan", "PlannedModule", "ExecutionError", "Request", "explore", "Exploration",
    "TensorOptError", "CaptureError", "GraphFormatError", "ModelSpecError", "ClusterSpecError", "ProfileError",
]
