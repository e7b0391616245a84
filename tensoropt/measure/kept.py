"""Untimed profiles kept in the cache folder, found without importing torch.

An untimed profile (:func:`tensoropt.measure.profile` with ``timed=False``: every call once, for its
memory and work) depends on the graph (its fingerprint), the shard degrees, repeats and warm-up,
the device it ran on (kind and name: nothing is timed, so not its threads), torch's version and
the profiler's own code (:func:`tensoropt._cache.code_digest`) — not on the model object, which a
graph read from the capture cache does not have.  It is kept by that identity
(:class:`tensoropt._cache.ContentCache`, ``profiles/``); this module computes the identity and
reads and keeps entries, and knows the profiling device without torch where it is the CPU, so
that a command whose graph and profile are cached never imports torch.

Example::

    >>> profiling_on("cpu")[0]
    'cpu'
"""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from typing import Any

from .._cache import ContentCache, cache_root, code_digest, package_version
from ..errors import GraphFormatError
from ..graph import OpGraph
from .costmodel import CostModel

__all__ = ["cpu_name", "keep_profile", "kept_profile", "profile_identity", "profiling_on"]

#: what decides an untimed profile besides the graph and its settings: the profiler's own code
PROFILER_CODE = ("measure", "capture", "graph.py", "layouts.py", "syncbn.py", "_malloc.py")


def cpu_name() -> str:
    """This machine's processor, as ``/proc/cpuinfo`` names it (else the platform's word)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def profiling_on(device: str) -> tuple[str, str]:
    """``(type, name)`` of the device profiles are made on (``cpu`` or ``cuda[:N]``); torch is
    imported only for a GPU (and checks the name, as :func:`~.profiler.profiling_device` does)."""
    if device.strip() == "cpu":
        return "cpu", cpu_name()
    from .profiler import profiling_device
    from .timing import device_name

    dev = profiling_device(device)
    return dev.type, device_name(dev)


def profile_identity(graph: OpGraph, degrees: Sequence[int], repeats: int, warmup: int,
                     device: str) -> dict[str, Any]:
    """What an untimed profile of ``graph`` with these settings depends on (module docstring)."""
    kind, name = profiling_on(device)
    return {"what": "untimed profile", "graph": graph.fingerprint,
            "degrees": sorted({1, *(int(k) for k in degrees)}), "repeats": repeats, "warmup": warmup,
            "device": {"type": kind, "name": name}, "torch": package_version("torch"),
            "code": code_digest(*PROFILER_CODE)}


def _store(cache: bool | str | os.PathLike[str]) -> ContentCache | None:
    return None if cache is False else ContentCache(cache_root(None if cache is True else cache), "profiles")


def kept_profile(graph: OpGraph, *, device: str = "cpu", shard_degrees: Sequence[int] = (1, 2, 4, 8),
                 repeats: int = 5, warmup: int = 1, cache: bool | str | os.PathLike[str] = True,
                 timed: bool = False) -> CostModel | None:
    """The untimed profile :func:`~tensoropt.measure.profile` would read from the cache for these
    arguments, without profiling anything (``graph`` needs no module); ``None`` where none is
    kept (an entry of an older profile format counts as none), or ``timed``."""
    store = _store(cache)
    if timed or store is None:
        return None
    value = store.get(profile_identity(graph, shard_degrees, repeats, warmup, device))
    if value is None:
        return None
    try:
        costs = CostModel.from_dict(value, "cached profile")
    except GraphFormatError:
        return None
    return costs if costs.graph_fingerprint == graph.fingerprint else None


def keep_profile(costs: CostModel, graph: OpGraph, *, device: str, shard_degrees: Sequence[int], repeats: int,
                 warmup: int, cache: bool | str | os.PathLike[str] = True) -> None:
    """Keep the untimed profile ``costs`` of ``graph`` for :func:`kept_profile`."""
    store = _store(cache)
    if store is not None:
        store.put(profile_identity(graph, shard_degrees, repeats, warmup, device), costs.to_dict())
