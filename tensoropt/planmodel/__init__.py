"""The plan model: what a :class:`~tensoropt.plan.Plan` costs — layouts and resharding
(:mod:`.reshard`), per-node and whole-step memory (:mod:`.memory`), the memory walk of one step
(:mod:`.walk`), the event simulator (:mod:`.simulate`) and whether a plan fits (:mod:`.fits`).

It reads measured costs (:mod:`tensoropt.measure`) and the cluster (:mod:`tensoropt.cluster`) and
never measures; the search (:mod:`tensoropt.frontier`, :mod:`tensoropt.placers`) calls it, never
the other way round.

Example (a two-layer MLP on a preset's A100s, :func:`tensoropt.examples.mlp_on`)::

    >>> from tensoropt.examples import mlp_on
    >>> graph, costs, cluster = mlp_on()
    >>> from tensoropt import place
    >>> plan = place(graph, costs, cluster, "dp", devices=["gpu0", "gpu1"])
    >>> result = simulate(plan, graph, costs, cluster)
    >>> round(result.time_s * 1e6, 1), result.memory_bytes
    (67.0, {'gpu0': 17872, 'gpu1': 17872})
    >>> fits(result.memory_bytes, cluster)
    True
"""

from .fits import fits
from .memory import NodeMemory, StepMemory, node_memory, step_memory
from .simulate import SimResult, simulate

__all__ = ["NodeMemory", "SimResult", "StepMemory", "fits", "node_memory", "simulate", "step_memory"]
