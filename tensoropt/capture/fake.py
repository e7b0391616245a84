"""Models too large to hold: built on the meta device, captured and walked on FakeTensors.

A model built under ``torch.device("meta")`` has shapes, dtypes and parameter counts but no
storage — Llama-3-405B's weights would take 1.6 TB.  It can be captured as it is, but not as it
trains: autocast has no meta policy (a meta ``Linear`` under bf16 autocast stays float32), and
PyTorch's meta kernels are not the devices' (SDPA's meta kernel lays its output out otherwise,
so a capture records a copy the CPU's never makes).  So every stage that runs such a model runs
it on **FakeTensors on the CPU** instead — a twin of the model whose parameters and buffers are
empty fake tensors of the same sizes (:func:`fake_twin`), its inputs the same (:func:`fake_on`):
the CPU's kernels' shapes, strides and dtypes, autocast's CPU policy, no values and no memory.

It owns what "a model that holds no data" is (:func:`holds_no_data`) and how one is made fake.

Example::

    >>> with torch.device("meta"):
    ...     model = torch.nn.Linear(16, 4)
    >>> on_meta(model), holds_no_data(model.weight)
    (True, True)
    >>> mode = FakeTensorMode(allow_non_fake_inputs=True)
    >>> twin = fake_twin(model, mode)
    >>> type(twin.weight).__name__, twin.weight.device.type, model.weight.device.type
    ('FakeTensor', 'cpu', 'meta')
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

__all__ = ["holds_no_data", "on_meta", "fake_on", "fake_twin", "FakeTensorMode"]


def holds_no_data(t: Any) -> bool:
    """Whether ``t`` is a tensor with shape but no values: on the meta device, or a FakeTensor."""
    return isinstance(t, torch.Tensor) and (t.is_meta or isinstance(t, FakeTensor))


def on_meta(module: torch.nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` holds no data (:func:`holds_no_data`)."""
    return any(holds_no_data(t) for t in (*module.parameters(), *module.buffers()))


def fake_on(mode: FakeTensorMode, v: Any, dev: torch.device | str = "cpu") -> Any:
    """``v`` as a FakeTensor of ``mode`` on ``dev`` (anything else as it is): a tensor that holds
    no data — on the meta device, or a FakeTensor of another mode — becomes an empty fake one of
    the same size, strides, dtype and gradient flag; a real one is converted by the mode."""
    if not isinstance(v, torch.Tensor):
        return v
    dev = torch.device(dev)
    if isinstance(v, FakeTensor) and v.fake_mode is mode and v.device == dev:
        return v
    if holds_no_data(v):
        with mode:
            t = torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=dev)
        if v.requires_grad:
            t.requires_grad_(True)
        return t
    t = mode.from_tensor(v)
    return t if t.device == dev else t.to(dev)


def fake_twin(module: torch.nn.Module, mode: FakeTensorMode, dev: torch.device | str = "cpu") -> torch.nn.Module:
    """A copy of ``module`` whose parameters and buffers are empty FakeTensors of ``mode`` on
    ``dev`` (``module`` itself is untouched; copying a meta model copies no data)."""
    twin = copy.deepcopy(module)
    with mode:
        return twin.to_empty(device=dev)
