"""Plans of ``mlp_model.py:factory`` made by hand for the export tests: every operator on the
same two devices (``batch`` where it can be, else ``R``) with the sharding levels and
recomputation asked, or a split plan that cuts two linears (``channel`` then ``reduce``)."""

from pathlib import Path

import tensoropt
from tensoropt import NodeConfig, Plan
from tensoropt.plan import shardable

SPEC = f"{Path(__file__).with_name('mlp_model.py')}:factory"
MESH = ("gpu0", "gpu1")


def graph_of(batch=None):
    return tensoropt.load_model(SPEC, batch=batch).capture(method="export")


def make_plan(graph, *, levels=None, recompute=(), layouts=None, devices=None, plan_id="p"):
    """``levels``: module path prefix → sharding level of the operators under it that may shard
    their parameters (:func:`tensoropt.plan.shardable`: not the tied heads); ``recompute``:
    operator names recomputed; ``layouts``: operator → layout; ``devices``: operator → devices
    (default :data:`MESH`)."""
    levels, layouts, devices = levels or {}, layouts or {}, devices or {}
    configs = {}
    for n in graph.ops:
        mesh = devices.get(n.name, MESH)
        layout = layouts.get(n.name, "batch" if n.split.batch is not None and len(mesh) > 1 else "R")
        level = next((lv for prefix, lv in levels.items() if n.module_path.startswith(prefix)), 0) \
            if shardable(graph, n.name) else 0
        configs[n.name] = NodeConfig(mesh, layout, n.name in recompute, level)
    return Plan(configs, graph_fingerprint=graph.fingerprint, graph_name=graph.name, batch_size=graph.batch_size,
                plan_id=plan_id)


def block_ops(graph):
    """The operators inside the two blocks (what a per-block checkpoint recomputes)."""
    return {n.name for n in graph.ops if n.module_path.startswith("blocks.")}
