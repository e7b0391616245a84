"""Tensor storage alive while a call runs, counted at PyTorch's dispatcher.

:class:`StoragePeak` counts every storage an operator returns from its first sight until it is
freed — what MemTracker counts, without its module hooks (MemTracker refuses a module called again
at the top level, as a pipeline stage is once per micro-batch).  The pipeline's ranks are measured
with it (:mod:`tensoropt.distributed.pipelined`), and the profiler reads an operator's scratch with
it (:func:`scratch_bytes`): a backward formula written as several ATen calls — ``pow``'s is
``grad * (exponent * self.pow(exponent - 1))`` — holds its intermediate results until it returns,
beside its inputs and the gradients it returns, on any device.  The CUDA allocator's peak sees the
same and the libraries' workspaces too (:func:`tensoropt.measure.profiler._cuda_workspace`); on the
CPU and on FakeTensors, the dispatcher is where they can be seen.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

T = TypeVar("T")


class StoragePeak(TorchDispatchMode):
    """The most bytes of tensor storage alive at once while the mode is on: every storage an
    operator returns counts from its first sight until it is freed, beside ``held`` (storages alive
    before, counted once).

    Example::

        >>> import torch
        >>> with StoragePeak() as peak:
        ...     a = torch.ones(256)          # 1 KiB
        ...     b = a * 2                    # 2 KiB alive
        ...     del a, b
        ...     c = torch.ones(128)          # 0.5 KiB
        >>> peak.peak_bytes, peak.alive_bytes
        (2048, 512)
    """

    def __init__(self, held: Sequence[torch.Tensor] = ()):
        super().__init__()
        self._seen: set[int] = set()
        self.alive_bytes = 0
        #: the operator whose output made the peak (``""``: the storages held from the start)
        self.peak_op = ""
        for t in held:
            self._count(t)
        self.peak_bytes = self.alive_bytes

    def _count(self, t: torch.Tensor) -> None:
        t = getattr(t, "_local_tensor", t)   # a DTensor (FSDP2's shards): its local tensor's storage
        st = t.untyped_storage()
        key = st._cdata
        if key in self._seen or st.nbytes() == 0:
            return
        self._seen.add(key)
        self.alive_bytes += st.nbytes()
        weakref.finalize(st, self._freed, key, st.nbytes())

    def _freed(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.alive_bytes -= nbytes

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._count(t)
        if self.alive_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_op = self.alive_bytes, str(func)
        return out


def scratch_bytes(call: Callable[[], T]) -> tuple[T, int]:
    """``call()`` and the scratch it held: the most storage its operators made alive at once
    beyond what is still alive when it returns (what it returns and what it keeps — autograd's
    saved tensors — the memory model counts apart).

    Example (``pow``'s backward: ``self.pow(1)``, ``2 * that`` and the gradient — two 4 KiB
    temporaries beside the 4 KiB it returns)::

        >>> x = torch.randn(1024, requires_grad=True)
        >>> y, dy = x.pow(2), torch.ones(1024)
        >>> grads, scratch = scratch_bytes(lambda: torch.autograd.grad(y, x, dy))
        >>> scratch
        8192
    """
    with StoragePeak() as peak:
        out = call()
    return out, max(0, peak.peak_bytes - peak.alive_bytes)


def node_scratch_bytes(outputs: Sequence[torch.Tensor], backward: Callable[[], T]) -> tuple[T, int]:
    """``backward()`` — a backward through the autograd graph of ``outputs`` — and the most scratch
    one node of that graph held while it ran: the storage its operators made alive at once beyond
    what is alive when the node returns (its gradients).  Node by node, not over the call: the
    engine frees a node's saved tensors when it returns, so what the next node makes — autocast's
    ``ToCopyBackward`` casting a bfloat16 weight gradient to the float32 weight's — does not meet
    them, while a node's own temporaries (``pow``'s) do.

    Example (as :func:`scratch_bytes`'s, ``pow``'s one node; a float32 copy read in bfloat16 makes
    a second node, ``ToCopyBackward``, whose bfloat16 input is the first's gradient, not scratch)::

        >>> x = torch.randn(1024, requires_grad=True)
        >>> y, dy = x.pow(2), torch.ones(1024)
        >>> node_scratch_bytes([y], lambda: torch.autograd.grad(y, x, dy))[1]
        8192
        >>> z = x.to(torch.bfloat16) * 2
        >>> node_scratch_bytes([z], lambda: torch.autograd.grad(z, x, dy.to(torch.bfloat16)))[1]
        0
    """
    peak = StoragePeak()
    most = [0]

    def before(*_: Any) -> None:
        peak.peak_bytes = peak.alive_bytes

    def after(*_: Any) -> None:
        most[0] = max(most[0], peak.peak_bytes - peak.alive_bytes)

    handles, seen = [], set()
    todo: list[Any] = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while todo:
        node = todo.pop()
        if node is None or node in seen or type(node).__name__ == "AccumulateGrad":
            continue
        seen.add(node)
        handles += [node.register_prehook(before), node.register_hook(after)]
        todo += [nxt for nxt, _ in node.next_functions]
    try:
        with peak:
            out = backward()
    finally:
        for h in handles:
            h.remove()
    return out, most[0]


__all__ = ["StoragePeak", "node_scratch_bytes", "scratch_bytes"]
