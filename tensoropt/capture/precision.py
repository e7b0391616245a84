"""Training precision, and the one place that decides what runs under autocast and what runs on
bfloat16 copies of the parameters.

A graph trains in ``fp32``, ``bf16`` or ``bf16-params`` (:data:`~tensoropt.graph.PRECISIONS`,
recorded in :attr:`OpGraph.precision <tensoropt.graph.OpGraph.precision>`).  ``bf16`` is mixed precision as
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

``bf16-params`` is the mixed precision large models train in with PyTorch's FSDP2 (torchtitan's
default): ``fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
reduce_dtype=torch.float32))``.  Every operator computes on bfloat16 copies of the parameters
(FSDP2 casts each unit's shards and all-gathers them in bfloat16), so the residual stream, the
norms and the additions are bfloat16 too — where autocast keeps them float32 — unless the model
upcasts them itself (an RMSNorm's variance, a loss's ``.float()``); the sharded master weights,
the gradients (reduce-scattered in float32) and the optimizer state stay float32; floating-point
inputs are cast to bfloat16 (FSDP2's ``cast_forward_inputs``).  It is captured by capturing a
copy of the model whose floating-point parameters are bfloat16 (:func:`bf16_parameters`), no
autocast; the graph records the master dtypes (:meth:`OpGraph.compute_bytes
<tensoropt.graph.OpGraph.compute_bytes>` is the bfloat16 copy).  PyTorch's FSDP2 runs it
(``tensoropt export``); tensoropt's own executors do not (:func:`check_executable`: one line).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ..errors import TensorOptError
from ..graph import PRECISIONS, Precision, check_precision

__all__ = ["PRECISIONS", "AUTOCAST_DTYPES", "PARAM_DTYPES", "check_precision", "precision_of", "precision_context",
           "device_types", "bf16_parameters", "check_executable"]

#: precision → the dtype autocast computes in (``fp32``, ``bf16-params``: no autocast)
AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16}
#: precision → the dtype the operators read the parameters in, where not their own (FSDP2's ``param_dtype``)
PARAM_DTYPES: dict[str, torch.dtype] = {"bf16-params": torch.bfloat16}


def precision_of(graph_or_precision: Any) -> Precision:
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
    """Run what follows as a graph of this precision runs: nothing for ``fp32`` and for
    ``bf16-params`` (its graph computes in bfloat16 on its own: its parameters are bfloat16
    copies); for ``bf16`` ``torch.autocast(device_type=…, dtype=torch.bfloat16)`` for every device
    type given (:func:`device_types`: one executor may run on the CPU and on GPUs).  Enter it
    around forward passes only (module docstring)."""
    precision = precision_of(graph_or_precision)
    if precision not in AUTOCAST_DTYPES:
        yield
        return
    with contextlib.ExitStack() as stack:
        for kind in device_types(device_type):
            stack.enter_context(torch.autocast(device_type=kind, dtype=AUTOCAST_DTYPES[precision]))
        yield


def bf16_parameters(model: torch.nn.Module, inputs: Iterable[Any], *,
                    copy_model: bool = True) -> tuple[torch.nn.Module, list[Any], dict[str, str]]:
    """``model`` as a ``bf16-params`` step computes with it: a copy (``copy_model=False``: the
    model itself, already a copy) whose floating-point parameters are bfloat16 — a tied weight
    stays one parameter —, buffers untouched (FSDP2 casts parameters only); ``inputs`` with every
    floating-point tensor cast to bfloat16 (FSDP2's ``cast_forward_inputs``); and each
    parameter's master dtype by every name it has (``"float32"``), for the graph to record.

    >>> m, (x,), masters = bf16_parameters(torch.nn.Linear(2, 3), [torch.ones(4, 2)])
    >>> m.weight.dtype, x.dtype, masters["weight"]
    (torch.bfloat16, torch.bfloat16, 'float32')
    """
    if copy_model:
        model = copy.deepcopy(model)
    masters: dict[str, str] = {}
    cast: dict[int, torch.nn.Parameter] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for name, p in list(mod._parameters.items()):
            if p is None or not p.is_floating_point():
                continue
            masters[f"{mod_name}.{name}" if mod_name else name] = str(p.dtype).removeprefix("torch.")
            if id(p) not in cast:
                cast[id(p)] = torch.nn.Parameter(p.detach().to(PARAM_DTYPES["bf16-params"]),
                                                 requires_grad=p.requires_grad)
            mod._parameters[name] = cast[id(p)]
    out = [x.to(PARAM_DTYPES["bf16-params"]) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
           for x in inputs]
    return model, out, masters


def check_executable(precision: Any, error: type[Exception] = TensorOptError) -> None:
    """Refuse ``bf16-params`` on tensoropt's own executors (local and distributed): they run the
    captured graph on the model's own parameters, not on bfloat16 copies of float32 masters.
    PyTorch's FSDP2 runs it (``tensoropt export --to torchrun`` writes ``fully_shard`` with its
    ``MixedPrecisionPolicy``)."""
    if precision_of(precision) == Precision.BF16_PARAMS:
        raise error("tensoropt's executor does not run bf16-params (bfloat16 copies of float32 master parameters): "
                    "export the plan (tensoropt export PLAN MODEL -o DIR: FSDP2 with MixedPrecisionPolicy), or "
                    "capture the model in bf16 (autocast) to run it here")
