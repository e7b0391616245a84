"""The FLOPs of one call, by PyTorch's ``FlopCounterMode`` with the formulas it lacks.

``FlopCounterMode`` knows the matrix products and the CUDA attention kernels, but not the CPU's
fused attention (``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which every
capture on this machine — a fake one of a Llama included — dispatches
``scaled_dot_product_attention`` to: the attention counted no work, and the device model priced
32 layers of Llama-3-8B's attention at 8,192 tokens by their bytes alone.  Here it counts as
PyTorch counts the CUDA kernels (``sdpa_flop`` / ``sdpa_backward_flop``: two products of
``2·b·h·s_q·s_k·d`` forward, four backward).

Causal attention: a flash kernel (FlashAttention-2, and PyTorch's CPU one) skips the blocks the
mask removes, so of the ``s²`` query–key pairs of a square causal attention it computes
``s·(s+1)/2``; the count is scaled by ``(s + 1) / (2s)`` for every fused attention called with
``is_causal`` (PyTorch's own formulas count the whole square).

>>> import torch, torch.nn.functional as F
>>> q = k = v = torch.ones(2, 4, 16, 8)
>>> with counting_flops() as count:
...     _ = F.scaled_dot_product_attention(q, k, v, is_causal=True)
>>> count.get_total_flops() == 4 * 2 * 4 * 16 * 16 * 8 * 17 // 32
True
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import flop_counter

__all__ = ["FLOP_FORMULAS", "counting_flops"]

_aten = torch.ops.aten


def _causal_aware(op: Any, whole: Callable[..., int]) -> Callable[..., int]:
    """``whole`` (a formula over shapes) scaled to the pairs a causal kernel computes where ``op``
    is called with ``is_causal`` on a square attention; positions from ``op``'s schema."""
    names = [a.name for a in op.default._schema.arguments]
    at_q, at_k, at_causal = names.index("query"), names.index("key"), names.index("is_causal")

    def formula(*args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        flops = int(whole(*args, **kwargs))     # torch's formulas take shapes or tensors alike
        causal = args[at_causal] if len(args) > at_causal else kwargs.get("is_causal", False)
        s_q, s_k = args[at_q][-2], args[at_k][-2]
        if causal and s_q == s_k and s_q > 0:
            return flops * (s_q + 1) // (2 * s_q)
        return flops
    return formula


#: formulas over argument shapes, by operator, that replace or add to ``FlopCounterMode``'s
FLOP_FORMULAS: dict[Any, Callable[..., int]] = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _causal_aware(
        _aten._scaled_dot_product_flash_attention_for_cpu, flop_counter.sdpa_flop),
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _causal_aware(
        _aten._scaled_dot_product_flash_attention_for_cpu_backward, flop_counter.sdpa_backward_flop),
    _aten._scaled_dot_product_flash_attention: _causal_aware(
        _aten._scaled_dot_product_flash_attention, flop_counter.sdpa_flop),
    _aten._scaled_dot_product_flash_attention_backward: _causal_aware(
        _aten._scaled_dot_product_flash_attention_backward, flop_counter.sdpa_backward_flop),
}


def counting_flops() -> flop_counter.FlopCounterMode:
    """A ``FlopCounterMode`` (no display) that also knows :data:`FLOP_FORMULAS`."""
    return flop_counter.FlopCounterMode(display=False, custom_mapping=FLOP_FORMULAS)
