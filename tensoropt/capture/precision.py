"""Training precision, and the one place that decides what runs under autocast.

A graph trains in ``fp32`` or in ``bf16`` (:data:`~tensoropt.graph.PRECISIONS`, recorded in
:attr:`OpGraph.precision <tensoropt.graph.OpGraph.precision>`).  ``bf16`` is mixed precision as
``torch.autocast(dtype=torch.bfloat16)`` does it: parameters stay float32 (master weights, their
gradients and the optimizer state float32 too), and the ops autocast lists (matmul, linear,
convolution, attention …) compute in bfloat16 on bfloat16 copies of their inputs — copies that
those ops save for backward, weights included.

``torch.export`` run under autocast records autocast's dtypes in the node metadata (a Linear's
output is bfloat16) but inserts no cast nodes: the captured graph is bf16 only when it is also
*run* under autocast.  So everything that runs a graph or its model — the capture
(:func:`tensoropt.capture`), the profiler's every call and its in-sequence steps
(:mod:`tensoropt.measure`), :func:`~tensoropt.measure.step.measure_step`, the executors and the
check's reference (:mod:`tensoropt.execute`, :mod:`tensoropt.distributed`) — enters
:func:`precision_context` with the graph (or its precision) and the device type it runs on.
The loss (:func:`~tensoropt.measure.step.training_loss`, float32) and the backward run outside it,
as autocast's own recipe says (autograd runs each backward op in its forward op's dtype).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ..graph import PRECISIONS, check_precision

__all__ = ["PRECISIONS", "AUTOCAST_DTYPES", "check_precision", "precision_of", "precision_context",
           "device_types"]

#: precision → the dtype autocast computes in (``fp32``: no autocast)
AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16}


def precision_of(graph_or_precision: Any) -> str:
    """The precision of an :class:`~tensoropt.graph.OpGraph` (anything with ``.precision``; a
    graph made before precisions existed: ``fp32``), or the precision string itself."""
    if graph_or_precision is None or isinstance(graph_or_precision, str):
        return check_precision(graph_or_precision)
    return check_precision(getattr(graph_or_precision, "precision", None))


def device_types(where: Any) -> list[str]:
    """The torch device types of ``where``: a device type or device (``"cpu"``, ``"cuda:1"``,
    ``torch.device``), tensors, or an iterable of any of these; sorted, ``["cpu"]`` when none;
    ``meta`` (a model that holds no values) counts as ``cpu``.

    >>> device_types([torch.empty(1, device="meta"), "cuda:1"])
    ['cpu', 'cuda']
    """
    found: set[str] = set()

    def add(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            found.add(x.device.type)
        elif isinstance(x, torch.device):
            found.add(x.type)
        elif isinstance(x, str):
            found.add(torch.device(x).type)
        elif isinstance(x, Iterable):
            for y in x:
                add(y)

    add(where)
    # a model on the meta device holds no values and runs nowhere; autocast has no meta policy, so
    # its graph is captured and walked (on FakeTensors) under the CPU's (tensoropt.measure.feed)
    found = {"cpu" if kind == "meta" else kind for kind in found}
    return sorted(found) or ["cpu"]


@contextlib.contextmanager
def precision_context(graph_or_precision: Any, device_type: Any = "cpu") -> Iterator[None]:
    """Run what follows as a graph of this precision runs: nothing for ``fp32``; for ``bf16``
    ``torch.autocast(device_type=…, dtype=torch.bfloat16)`` for every device type given
    (:func:`device_types`: one executor may run on the CPU and on GPUs).  Enter it around
    forward passes only (module docstring)."""
    precision = precision_of(graph_or_precision)
    if precision == "fp32":
        yield
        return
    with contextlib.ExitStack() as stack:
        for kind in device_types(device_type):
            stack.enter_context(torch.autocast(device_type=kind, dtype=AUTOCAST_DTYPES[precision]))
        yield
