"""Worked examples the package's docstrings share: the setup an example of the simulator, the
memory walk, a placer or the frontier starts from, written once, so that those examples show
what they are about and not how a graph is captured and priced.

:func:`mlp_on` is a two-layer MLP captured, profiled untimed (memory and work only) and priced on
a preset cluster; its docstring shows the same with the package's own calls.  The docstrings
whose example is about capture, profiling or pricing themselves (:mod:`tensoropt.capture`,
:mod:`tensoropt.measure.profiler`, :mod:`tensoropt.devicemodel.price`) keep those calls.

Owns: the examples' setups.  Must not: be imported by the package's modules (it sits with the
surfaces, above every stage it calls: only docstrings, tests and people use it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .capture import capture
from .cluster import Cluster, load_cluster
from .devicemodel import price
from .graph import OpGraph
from .measure.costmodel import CostModel
from .measure.profiler import profile


def mlp_on(cluster: str = "preset:a100-4-nvlink", *,
           shard_degrees: Sequence[int] = (1, 2, 4, 8)) -> tuple[OpGraph, CostModel, Cluster]:
    """A two-layer MLP (16 → 32 → ReLU → 4, batch 8) captured, profiled untimed with
    ``shard_degrees`` (each operator's memory and work, recorded here) and priced on ``cluster``
    (a spec :func:`tensoropt.load_cluster` reads; its GPUs' device model prices the times):
    ``(graph, costs, cluster)``, ready for :func:`tensoropt.simulate`, :func:`tensoropt.place`
    or :func:`tensoropt.track_frontier`.  The model's weights and input come from torch's global
    random generator, drawn as below.

    It is these calls:

    >>> import torch
    >>> from tensoropt import capture, load_cluster, price, profile
    >>> model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> graph = capture(model, (torch.randn(8, 16),))
    >>> priced = price(profile(graph, timed=False), load_cluster("preset:a100-4-nvlink"))
    >>> costs, cluster = priced.costs, priced.cluster
    >>> list(costs.nodes), cluster.names, costs.device["name"]
    (['linear', 'relu', 'linear_1'], ['gpu0', 'gpu1', 'gpu2', 'gpu3'], 'NVIDIA A100-SXM4-40GB')

    and gives the same graph, costs and cluster:

    >>> graph2, costs2, cluster2 = mlp_on()
    >>> graph2.fingerprint == graph.fingerprint, costs2.to_dict() == costs.to_dict(), cluster2.names == cluster.names
    (True, True, True)
    """
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    graph = capture(model, (torch.randn(8, 16),))
    priced = price(profile(graph, shard_degrees=shard_degrees, timed=False), load_cluster(cluster))
    return graph, priced.costs, priced.cluster
