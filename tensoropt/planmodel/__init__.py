"""The plan model: what a :class:`~tensoropt.plan.Plan` costs — layouts and resharding
(:mod:`.reshard`), per-node and whole-step memory (:mod:`.memory`), the memory walk of one step
(:mod:`.walk`), the event simulator (:mod:`.simulate`) and whether a plan fits (:mod:`.fits`).

It reads measured costs (:mod:`tensoropt.measure`) and the cluster (:mod:`tensoropt.cluster`) and
never measures; the search (:mod:`tensoropt.frontier`, :mod:`tensoropt.placers`) calls it, never
the other way round.

Example::

    >>> result = simulate(plan, graph, costs, cluster)               # doctest: +SKIP
    >>> result.time_s, result.peak_memory_bytes                      # doctest: +SKIP
"""

from .fits import fits
from .memory import NodeMemory, StepMemory, node_memory, step_memory
from .simulate import SimResult, simulate

__all__ = ["NodeMemory", "SimResult", "StepMemory", "fits", "node_memory", "simulate", "step_memory"]
