"""The cluster stage: which devices a plan may use and how fast data moves between them.

- :class:`Device`, :class:`LinkModel`, :class:`Cluster` (:mod:`.spec`): devices (name, kind, host,
  memory, relative speed) and a ``latency + bytes / bandwidth`` link for every ordered pair; read
  from / written to YAML or JSON (:meth:`Cluster.load`, :meth:`Cluster.save`), fingerprinted.
- :func:`load_cluster` (:mod:`.presets`): ``preset:NAME`` or a file path → Cluster;
  :func:`list_presets`: the clusters of the papers this project follows (NetSplit's 5× TITAN RTX,
  FastT's 8× V100 NVLink box, an HGX A100 4-GPU board, two Ethernet-connected 4-GPU hosts).
- :func:`detect_cluster` (:mod:`.detect`): this machine's GPUs through NVML, with nominal links.
- Collective costs (:mod:`.collectives`): ring all-reduce, all-gather, reduce-scatter,
  all-to-all and broadcast over an ordered device group, from its pair links.
- Units (:mod:`.units`): ``24GiB``, ``10us``, ``12GB/s`` parsed and written back exactly.

Measured links come from ``tensoropt bench-links``: :mod:`.bench` times the transfers, :mod:`.linkfit`
fits them.  Imports flow one way: units ← spec ← presets, detect, collectives, linkfit ← bench; nothing
in spec imports the modules built on it.

The package must not import the placers, the plan model or the measuring code: it is an input
they read.
"""

from .collectives import (
                          all_to_all_time,
                          allgather_time,
                          backend_reduce_scatter_time,
                          broadcast_time,
                          p2p_time,
                          reduce_scatter_time,
                          ring_allreduce_bytes_time,
                          ring_allreduce_time,
)
from .detect import cluster_from_topology, detect_cluster
from .presets import PRESETS, get_preset, list_presets, load_cluster
from .spec import Cluster, Device, LinkModel, is_cpu_kind
from .units import fmt_rate, fmt_size, fmt_time, parse_rate, parse_size, parse_time

__all__ = [
    "Device", "LinkModel", "Cluster", "is_cpu_kind", "load_cluster", "detect_cluster", "cluster_from_topology",
    "list_presets", "get_preset", "PRESETS",
    "p2p_time", "ring_allreduce_time", "ring_allreduce_bytes_time", "allgather_time", "reduce_scatter_time",
    "backend_reduce_scatter_time",
    "all_to_all_time", "broadcast_time",
    "parse_size", "parse_time", "parse_rate", "fmt_size", "fmt_time", "fmt_rate",
]
