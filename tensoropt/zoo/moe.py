"""Top-k mixture of experts with static shapes: capacity-based dispatch, as GShard and Switch
Transformer train it, as an experts implementation of Hugging Face transformers.

Why not Hugging Face's own: its eager experts loop over the experts a batch hits
(``nonzero`` / ``torch.where`` on the expert mask), which torch.export cannot capture (a
data-dependent number of loop iterations); its ``batched_mm`` experts gather one copy of an
expert's weights per (token, choice) pair — the right FLOPs, but ``(tokens·k, 2·ffn, hidden)``
and ``(tokens·k, hidden, ffn)`` tensors, 0.7 GB a pair for Mixtral-8x7B in fp32; its
``grouped_mm`` experts (transformers 5's default) capture, but ``torch._grouped_mm`` /
transformers' fallback op has no ``FlopCounterMode`` formula, so the experts count no work.

Here (Lepikhin et al. 2020, "GShard", Algorithm 1; Fedus et al. 2022, "Switch Transformers"):
each sequence is a group; each expert takes ``capacity = ceil(seq_len · k / experts ·
capacity_factor)`` tokens of it.  A token's choices are queued first choices before second ones
(GShard's priority); a choice that finds its expert full is dropped (the token keeps its other
choices and the residual path).  Dispatch and combine are gathers by slot index, so the expert
matmuls are two batched matmuls of static shape ``(experts, batch · capacity, ·)``: with
``capacity_factor = 1`` exactly the work of dropless top-k routing (every token through k
experts), which is what Mixtral trains (Jiang et al. 2024, "Mixtral of Experts", with
MegaBlocks' dropless kernels); 1.25 is Switch Transformer's training factor (25 % more expert
work, fewer drops).  The batch stays dimension 0 up to the expert matmuls and dimension 1 in
them, so a plan may still split the batch.

Only the experts' computation changes: :func:`dispatch_by_capacity` registers
:func:`capacity_experts_forward` with transformers' ``ExpertsInterface`` (the hook its
``@use_experts_implementation`` experts dispatch through) and selects it, so each model keeps
its own router, shared experts and parameter names (Mixtral, Qwen-MoE, OLMoE, …).  The stacked
expert weights are kept transposed, ``(experts, in, out)`` (transformers' own ``is_transposed``
layout, GPT-OSS's), so that the batched matmul reads each weight itself: a plan shards a
parameter for the operator that reads it (ZeRO levels with the batch split, the channel split),
and read through a ``transpose`` — a view with no batch to split — Mixtral-8x7B's experts, 96 %
of its parameters, could not be sharded by any plan.  (A checkpoint in transformers' usual
``(experts, out, in)`` layout loads into the model before the call, not after.)

Example::

    >>> capacity(seq_len=8192, top_k=2, num_experts=8, capacity_factor=1.0)
    2048
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._base import ZooDependencyError, check

#: The name the implementation is registered under in transformers' ``ExpertsInterface``.
IMPLEMENTATION = "tensoropt_capacity"
#: The attribute :func:`dispatch_by_capacity` sets on every experts module: (seq_len, capacity_factor).
GROUPING = "tensoropt_grouping"


def capacity(seq_len: int, top_k: int, num_experts: int, capacity_factor: float) -> int:
    """Slots per expert per sequence: ``ceil(seq_len · top_k / num_experts · capacity_factor)``,
    at most ``seq_len`` (a token never takes two slots of one expert), at least 1."""
    want = math.ceil(seq_len * top_k * capacity_factor / num_experts - 1e-9)
    return max(1, min(seq_len, want))


def dispatch(hidden: torch.Tensor, index: torch.Tensor, weight: torch.Tensor, num_experts: int, cap: int,
             run: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Route ``hidden`` ``(groups, seq, dim)`` to the experts ``index`` ``(groups, seq, k)`` names,
    ``cap`` slots per expert per group, run ``run`` on ``(experts, groups · cap, dim)`` (every
    expert on its rows) and return the outputs weighted by ``weight`` and summed per token."""
    groups, seq, dim = hidden.shape
    k = index.shape[-1]
    slots = num_experts * cap
    # (groups, k·seq): choice j of token t at j·seq + t, so first choices queue first
    choice = index.transpose(1, 2).reshape(groups, k * seq)
    onehot = F.one_hot(choice, num_experts)
    position = ((onehot.cumsum(1) - 1) * onehot).sum(-1)              # place in its expert's queue
    slot = torch.where(position < cap, choice * cap + position, slots)  # `slots`: dropped
    # Which token fills each slot; `seq` (a zero row) where none does, or for the dropped.
    token = torch.arange(seq, device=hidden.device).repeat(k).expand(groups, -1)
    filler = torch.full((groups, slots + 1), seq, dtype=token.dtype, device=hidden.device)
    filler = filler.scatter(1, slot, token)[:, :slots]
    padded = torch.cat([hidden, hidden.new_zeros(groups, 1, dim)], 1)
    x = padded.gather(1, filler.unsqueeze(-1).expand(-1, -1, dim))        # (groups, slots, dim)
    x = x.reshape(groups, num_experts, cap, dim).transpose(0, 1).reshape(num_experts, groups * cap, dim)
    y = run(x)
    y = y.reshape(num_experts, groups, cap, dim).transpose(0, 1).reshape(groups, slots, dim)
    y = torch.cat([y, y.new_zeros(groups, 1, dim)], 1)                   # slot `slots` is zero
    out = y.gather(1, slot.unsqueeze(-1).expand(-1, -1, dim))
    out = out * weight.transpose(1, 2).reshape(groups, k * seq, 1)
    return out.reshape(groups, k, seq, dim).sum(1)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    """Every expert's linear layer on its rows: ``x`` ``(experts, n, in)``, ``weight``
    ``(experts, out, in)`` (``(experts, in, out)`` when ``transposed``)."""
    y = torch.bmm(x, weight if transposed else weight.transpose(1, 2))
    return y if bias is None else y + bias.unsqueeze(1)


def _run_experts(experts: Any, x: torch.Tensor) -> torch.Tensor:
    """A transformers experts module (``@use_experts_implementation``) on ``(experts, n, hidden)``
    rows, as its own implementations compute one row: up (or gate-up), gate, down."""
    bias = experts.has_bias
    if experts.has_gate:
        h = _linear(x, experts.gate_up_proj, experts.gate_up_proj_bias if bias else None, experts.is_transposed)
        h = experts._apply_gate(h)
    else:
        h = experts.act_fn(_linear(x, experts.up_proj, experts.up_proj_bias if bias else None,
                                   experts.is_transposed))
    y = _linear(h, experts.down_proj, experts.down_proj_bias if bias else None, experts.is_transposed)
    return experts.post_expert_norm(y) if experts.has_post_expert_norm else y


def capacity_experts_forward(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    """transformers' experts interface: ``hidden_states`` ``(tokens, hidden)`` (the batch's
    sequences one after another), ``top_k_index`` / ``top_k_weights`` ``(tokens, k)`` from the
    model's router; returns ``(tokens, hidden)``, dispatched by capacity per sequence."""
    grouping = getattr(self, GROUPING, None)
    if grouping is None:
        raise RuntimeError(f"{type(self).__name__} has no {GROUPING}: select {IMPLEMENTATION!r} with "
                           "tensoropt.zoo.moe.dispatch_by_capacity(model, seq_len, capacity_factor)")
    seq_len, factor = grouping
    tokens, dim = hidden_states.shape
    k = top_k_index.shape[-1]
    groups = tokens // seq_len
    out = dispatch(hidden_states.reshape(groups, seq_len, dim), top_k_index.reshape(groups, seq_len, k),
                   top_k_weights.reshape(groups, seq_len, k), self.num_experts,
                   capacity(seq_len, k, self.num_experts, factor), lambda x: _run_experts(self, x))
    return out.reshape(tokens, dim).to(hidden_states.dtype)


def experts_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that follow transformers' experts interface (stacked expert
    weights, dispatched through ``config._experts_implementation``)."""
    return [m for m in model.modules()
            if hasattr(m, "has_gate") and hasattr(m, "num_experts") and hasattr(m, "down_proj")]


def _store_transposed(experts: Any) -> None:
    """Keep ``experts``' stacked weights as ``(experts, in, out)`` (module docstring): the same
    values transposed, the same names, ``is_transposed`` set for every implementation."""
    if experts.is_transposed:
        return
    for name in ("gate_up_proj", "up_proj", "down_proj"):
        weight = getattr(experts, name, None)
        if isinstance(weight, nn.Parameter):
            setattr(experts, name, nn.Parameter(weight.detach().transpose(1, 2).contiguous(),
                                                requires_grad=weight.requires_grad))
    experts.is_transposed = True


def dispatch_by_capacity(model: Any, seq_len: int, capacity_factor: float = 1.0) -> int:
    """Make every experts module of ``model`` (a transformers ``PreTrainedModel``) dispatch by capacity
    (module docstring) for sequences of ``seq_len`` tokens; returns how many there are (0: not a
    mixture of experts, nothing changed)."""
    check(capacity_factor > 0, f"capacity_factor must be positive, got {capacity_factor}")
    modules = experts_modules(model)
    if not modules:
        return 0
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as exc:   # before transformers 5: no experts interface
        raise ZooDependencyError("mixture-of-experts models need transformers >= 5: "
                                 "pip install -U 'transformers>=5'") from exc
    ExpertsInterface.register(IMPLEMENTATION, capacity_experts_forward)
    for m in modules:
        setattr(m, GROUPING, (seq_len, capacity_factor))
        _store_transposed(m)
    model.set_experts_implementation(IMPLEMENTATION)
    return len(modules)
