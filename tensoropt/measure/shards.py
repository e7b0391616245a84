"""The arguments one device sees when a node is split k ways: the shapes the profiler measures.

Given a node's real arguments (tensors and the rest, as the captured graph calls the op), a
layout and a degree ``k``, :func:`shard_args` returns the arguments of the largest shard, or
``None`` when the layout does not apply to the op:

- ``batch``: every activation with a batch dimension is cut along it (parameters stay whole) —
  but an ``index`` whose index tensors carry the batch reads its source whole;
- ``channel``: the op's output channels / features are cut — for a weighted op the weight's
  output dimension (conv ``weight[0]``, linear ``weight[0]``, ``addmm``/``mm`` second operand's
  last dim, embedding ``weight[1]``, attention heads of q / k / v); for any other op every
  activation or parameter whose aligned dimension carries the output channels;
- ``reduce``: the reduction dimension of a linear / convolution / matmul (input features of
  both operands) — the partial-sum layout.

Shards are contiguous copies (a real device holds its shard densely).  The caller checks the
shard's output shape; a rule that does not produce the expected shape is not trusted.

Example::

    >>> import torch
    >>> from tensoropt.graph import TensorMeta
    >>> x, w = torch.randn(4, 3, 8, 8), torch.randn(16, 3, 3, 3)
    >>> out = TensorMeta((4, 16, 6, 6), "float32", batch_dim=0, channel_dim=1)
    >>> info = {id(x): TensorArg("activation", TensorMeta((4, 3, 8, 8), "float32", batch_dim=0, channel_dim=1)),
    ...         id(w): TensorArg("param", trainable=True)}
    >>> for layout in ("batch", "channel", "reduce"):
    ...     args, kwargs = shard_args("conv2d", (x, w), {}, info, layout, 2, out)
    ...     print(layout, [tuple(a.shape) for a in args])
    batch [(2, 3, 8, 8), (16, 3, 3, 3)]
    channel [(4, 3, 8, 8), (8, 3, 3, 3)]
    reduce [(4, 2, 8, 8), (16, 2, 3, 3)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, cast

import torch

from ..graph import TensorMeta

_CONV = {"conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"}
_LINEAR = {"linear"}
_MM_SECOND = {"addmm": (1, 2), "mm": (0, 1), "bmm": (0, 1), "matmul": (0, 1), "baddbmm": (1, 2)}
#: views that reshape: split along channels by :func:`_channel_view` (the executors run a split
#: one as ``reshape``: a piece cut from a whole tensor need not be contiguous)
VIEWS = {"view", "_unsafe_view", "reshape"}
_ATTENTION = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention"}


@dataclass(frozen=True)
class TensorArg:
    """What a tensor argument of a node is: an activation (with its graph meta) or a parameter.

    ``trainable``: the tensor gets a gradient in training — a parameter that training updates,
    or an activation downstream of one (a graph input is not: a first layer computes no input
    gradient, and saves nothing for one).  Said here, not read off the tensor, because a shard
    cut from it is a plain tensor that must still get its gradient (else a ``reduce`` shard's
    backward is timed without the weight gradient)."""

    kind: str                       # "activation" | "param"
    meta: TensorMeta | None = None  # for activations: batch / channel dims
    trainable: bool = False


def shard_size(n: int, k: int) -> int:
    """Size of the largest of ``k`` shards of a dimension of size ``n`` (ceil)."""
    return math.ceil(n / k)


def _cut(t: torch.Tensor, dim: int, k: int) -> torch.Tensor:
    # a copy, not .contiguous(): a leading piece of a contiguous tensor is itself contiguous, and
    # .contiguous() would return that view of the whole storage (an op that keeps its input's
    # storage, or the saved-tensor bytes, would then count the whole tensor for the shard)
    dim = dim % t.dim()
    return t.narrow(dim, 0, shard_size(t.shape[dim], k)).clone(memory_format=torch.contiguous_format)


def legal_degree(size: int | None, k: int) -> bool:
    return size is not None and size >= k


def shard_args(base: str, args: Sequence[Any], kwargs: dict, info: dict[int, TensorArg], layout: str, k: int,
               out: TensorMeta) -> tuple[tuple, dict] | None:
    """The arguments of the largest shard of a node split ``k`` ways in ``layout``.

    ``base`` is the op's base name (``conv2d``), ``info`` maps ``id(tensor)`` of every tensor
    argument to what it is, ``out`` is the node's first output meta.  Returns ``None`` when the
    layout does not apply.  O(number of arguments).
    """
    args, kwargs = list(args), dict(kwargs)
    if layout == "batch":
        return _batch(args, kwargs, info, k, whole=_index_source(base, args, info))
    if layout == "channel":
        return _channel(base, args, kwargs, info, k, out)
    if layout == "reduce":
        return _reduce(base, args, kwargs, k)
    raise ValueError(f"unknown layout {layout!r}")


def _map_tensors(obj: Any, fn) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(o, fn) for o in obj)
    return obj


def _index_source(base: str, args: list, info: dict[int, TensorArg]) -> set[int]:
    """``{id(x)}`` for ``index(x, indices)`` whose index tensors carry the batch (split by them,
    :func:`tensoropt.capture.semantics.split_dims`): ``x`` is read whole; else nothing."""
    if base != "index" or len(args) < 2 or not isinstance(args[1], (list, tuple)):
        return set()
    carried = any(isinstance(t, torch.Tensor) and (a := info.get(id(t))) is not None and a.meta is not None
                  and a.meta.batch_dim is not None for t in args[1])
    return {id(args[0])} if carried else set()


def _batch(args: list, kwargs: dict, info: dict[int, TensorArg], k: int,
           whole: AbstractSet[int] = frozenset()) -> tuple[tuple, dict] | None:
    touched = []

    def cut(t: torch.Tensor) -> torch.Tensor:
        a = info.get(id(t))
        if a is None or a.kind != "activation" or a.meta is None or a.meta.batch_dim is None or id(t) in whole:
            return t
        if not legal_degree(t.shape[a.meta.batch_dim], k):
            raise _Illegal
        touched.append(t)
        return _cut(t, a.meta.batch_dim, k)

    try:
        new_args, new_kwargs = _map_tensors(tuple(args), cut), {key: _map_tensors(v, cut) for key, v in kwargs.items()}
    except _Illegal:
        return None
    return (new_args, new_kwargs) if touched else None


class _Illegal(Exception):
    pass


def _channel(base: str, args: list, kwargs: dict, info: dict[int, TensorArg], k: int,
             out: TensorMeta) -> tuple[tuple, dict] | None:
    c = out.channel_dim
    if c is None or not legal_degree(out.shape[c], k):
        return None
    size = out.shape[c]
    if base in _CONV:
        groups = _conv_groups(base, args, kwargs)
        if _transposed(base, args, kwargs):
            # weight [in, out / groups, kH, kW]: the output channels are its dimension 1
            if groups != 1:
                return None
            args[1] = _cut(args[1], 1, k)
            if len(args) > 2 and isinstance(args[2], torch.Tensor):
                args[2] = _cut(args[2], 0, k)
            return tuple(args), kwargs
        args[1] = _cut(args[1], 0, k)
        if len(args) > 2 and isinstance(args[2], torch.Tensor):
            args[2] = _cut(args[2], 0, k)
        if groups > 1:  # depthwise / grouped: input channels and groups are cut with the output
            if groups % k:
                return None
            args[0] = _cut(args[0], 1, k)
            _set_conv_groups(base, args, kwargs, groups // k)
        return tuple(args), kwargs
    if base in _LINEAR:
        args[1] = _cut(args[1], 0, k)
        if len(args) > 2 and isinstance(args[2], torch.Tensor):
            args[2] = _cut(args[2], 0, k)
        return tuple(args), kwargs
    if base in _MM_SECOND:
        _, second = _MM_SECOND[base]
        if args[second].dim() < 2:
            return None
        args[second] = _cut(args[second], -1, k)
        if base in ("addmm", "baddbmm") and isinstance(args[0], torch.Tensor) and args[0].dim() >= 1 \
                and args[0].shape[-1] == size:
            args[0] = _cut(args[0], -1, k)
        return tuple(args), kwargs
    if base == "embedding":
        args[0] = _cut(args[0], 1, k)
        return tuple(args), kwargs
    if base in VIEWS:
        return _channel_view(args, kwargs, info, k, out)
    if base in _ATTENTION:
        # heads are dimension 1 of q, k and v only in the 4-D form ([B, H, L, E]; a 3-D call's
        # dimension 1 is the sequence, which k and v must keep whole); grouped-query attention
        # (``enable_gqa``: k / v with H_kv heads, each shared by H / H_kv heads of q) is cut where
        # k divides H_kv — piece i of q's heads then reads exactly piece i of k's and v's
        if any(not isinstance(t, torch.Tensor) or t.dim() != 4 for t in args[:3]) or args[0].shape[1] != size:
            return None
        kv = args[1].shape[1]
        if args[2].shape[1] != kv or (kv != size and (not kwargs.get("enable_gqa") or size % kv or kv % k)):
            return None
        for i in range(3):
            args[i] = _cut(args[i], 1, k)
        mask = args[3] if len(args) > 3 else kwargs.get("attn_mask")
        if isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[1] == size:
            mask = _cut(mask, 1, k)
            if len(args) > 3:
                args[3] = mask
            else:
                kwargs["attn_mask"] = mask
        return tuple(args), kwargs
    return _channel_generic(args, kwargs, info, k, out)


def _channel_view(args: list, kwargs: dict, info: dict[int, TensorArg], k: int,
                  out: TensorMeta) -> tuple[tuple, dict] | None:
    """A view / reshape whose input channel dimension becomes its output channel dimension with
    the same number of elements before it (GPT-2's ``(B·T, 4C) → (B, T, 4C)``, a head split
    ``(B, T, C) → (B, T, H, D)``): piece ``i`` of the input, viewed, is piece ``i`` of the output,
    so the input is cut and the shape argument's channel entry divided.  Only for channel sizes
    that ``k`` divides (every shard gets the same shape argument)."""
    x, shape = args[0], args[1] if len(args) > 1 else kwargs.get("size", kwargs.get("shape"))
    a = info.get(id(x)) if isinstance(x, torch.Tensor) else None
    d = a.meta.channel_dim if a is not None and a.kind == "activation" and a.meta is not None else None
    c = out.channel_dim
    if d is None or c is None or not isinstance(shape, (list, tuple)) or c >= len(shape):
        return None
    if x.shape[d] % k or out.shape[c] % k or math.prod(x.shape[:d]) != math.prod(out.shape[:c]):
        return None
    if shape[c] != -1 and shape[c] != out.shape[c]:
        return None   # a size from the batch (a graph node), or one this rule does not know
    new_shape = list(shape)
    if shape[c] != -1:
        new_shape[c] = out.shape[c] // k
    args[0] = _cut(x, d, k)
    if len(args) > 1:
        args[1] = type(shape)(new_shape)
    else:
        kwargs["size" if "size" in kwargs else "shape"] = type(shape)(new_shape)
    return tuple(args), kwargs


def _channel_generic(args: list, kwargs: dict, info: dict[int, TensorArg], k: int,
                     out: TensorMeta) -> tuple[tuple, dict] | None:
    """Pointwise ops, norms, pooling, dropout …: cut every tensor whose aligned dimension holds
    the output channels (an activation's own channel dim, else the dimension broadcasting aligns
    with the output's from the right; 1-D per-channel parameters such as batch-norm weights and
    running statistics)."""
    c = cast(int, out.channel_dim)   # a channel split is only asked of an output that has one
    size, rank = out.shape[c], len(out.shape)
    touched = []

    def cut(t: torch.Tensor) -> torch.Tensor:
        a = info.get(id(t))
        if a is None or t.dim() == 0:
            return t
        d = a.meta.channel_dim if a.kind == "activation" and a.meta is not None else None
        if d is None or d >= t.dim() or t.shape[d] != size:
            d = t.dim() - (rank - c)  # broadcasting aligns dimensions from the right
            if not (0 <= d < t.dim() and t.shape[d] == size):
                d = 0 if a.kind == "param" and t.dim() == 1 and t.shape[0] == size else None
        if d is None:
            return t
        touched.append(t)
        return _cut(t, d, k)

    new_args = _map_tensors(tuple(args), cut)
    new_kwargs = {key: _map_tensors(v, cut) for key, v in kwargs.items()}
    return (new_args, new_kwargs) if touched else None


def _reduce(base: str, args: list, kwargs: dict, k: int) -> tuple[tuple, dict] | None:
    if base in _CONV:
        if _conv_groups(base, args, kwargs) != 1:
            return None
        # the input channels: the weight's dimension 1, or 0 for a transposed convolution
        w_in = 0 if _transposed(base, args, kwargs) else 1
        if not legal_degree(args[1].shape[w_in], k):
            return None
        args[0], args[1] = _cut(args[0], 1, k), _cut(args[1], w_in, k)
        return tuple(args), kwargs
    if base in _LINEAR:
        if not legal_degree(args[1].shape[1], k):
            return None
        args[0], args[1] = _cut(args[0], -1, k), _cut(args[1], 1, k)
        return tuple(args), kwargs
    if base in _MM_SECOND:
        first, second = _MM_SECOND[base]
        if args[second].dim() < 2 or not legal_degree(args[first].shape[-1], k):
            return None
        args[first], args[second] = _cut(args[first], -1, k), _cut(args[second], -2, k)
        return tuple(args), kwargs
    return None


def _transposed(base: str, args: Sequence[Any], kwargs: dict) -> bool:
    """Whether a convolution op is a transposed one (``conv_transpose*``, or ``convolution`` with
    ``transposed=True``), whose weight is laid out ``[in, out / groups, …]``."""
    if base.startswith("conv_transpose"):
        return True
    return base == "convolution" and bool(args[6] if len(args) > 6 else kwargs.get("transposed", False))


def _conv_groups(base: str, args: Sequence[Any], kwargs: dict) -> int:
    pos = 8 if base == "convolution" else 6
    return int(args[pos]) if len(args) > pos else int(kwargs.get("groups", 1))


def _set_conv_groups(base: str, args: list, kwargs: dict, groups: int) -> None:
    pos = 8 if base == "convolution" else 6
    if len(args) > pos:
        args[pos] = groups
    else:
        kwargs["groups"] = groups
