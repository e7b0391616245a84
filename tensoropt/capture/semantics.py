"""Operator semantics: which ATen ops are metadata-only or generators, and how each may be split.

The rules read the op's schema (``OpOverload.is_view``, the ``pointwise`` tag, whether it takes
tensor inputs at all) and the op's own arguments (the ``dim`` of a softmax or a cat), never node
or module names.  Batch dimensions come from torch.export's symbolic shapes (see
:mod:`tensoropt.capture.export`); this module decides whether an op *keeps samples independent*
along that dimension and which dimension is its *channel* (feature) dimension.

Rules, in order of evidence:
- channel dimension of an output: conv / pooling / batch norm / upsampling → 1; linear, matmul
  family and embedding → last; scaled-dot-product attention → 1 (heads); pointwise ops, dropout,
  copies → inherited from the input of the same rank; views, transposes, reductions, softmax,
  cat → mapped through from the input when the op leaves that dimension intact.
- batch split is legal when the output has a batch dimension and the op does not mix samples
  along it (softmax / cumsum / sort / cat / index / slice along the batch dimension do; a view
  that moves the batch dimension behind other elements does) — except an ``index`` whose index
  tensors carry the batch: split by them, its source read whole.  Batch norm in training mode is
  legal but not exact (per-shard statistics).
"""

from __future__ import annotations

import operator
from typing import Any, Sequence

import torch

from ..graph import SplitDims, TensorMeta

_CONV = {"conv1d", "conv2d", "conv3d", "convolution", "conv_transpose1d", "conv_transpose2d",
         "conv_transpose3d", "_convolution", "cudnn_convolution", "mkldnn_convolution"}
_CHANNEL1 = _CONV | {
    "batch_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
    "_native_batch_norm_legit_no_training", "instance_norm",
    "max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices",
    "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d",
    "adaptive_avg_pool3d", "_adaptive_avg_pool2d", "adaptive_max_pool2d", "adaptive_max_pool1d",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_bilinear2d",
    "upsample_bicubic2d", "upsample_linear1d", "upsample_trilinear3d", "_upsample_bilinear2d_aa",
    "_upsample_nearest_exact2d", "pixel_shuffle", "channel_shuffle",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
}
_CHANNEL_LAST = {"linear", "addmm", "mm", "bmm", "matmul", "baddbmm", "embedding", "_embedding_bag",
                 "embedding_bag", "einsum", "lstm", "gru", "rnn_tanh", "rnn_relu", "_thnn_fused_lstm_cell"}
_BATCH_NORMS = {"batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                "_native_batch_norm_legit_functional"}
# ops that combine elements along their `dim` argument: argument position of that dim
_MIXES_ALONG_DIM = {
    "softmax": 1, "_softmax": 1, "log_softmax": 1, "_log_softmax": 1, "cumsum": 1, "cumprod": 1,
    "cummax": 1, "cummin": 1, "logcumsumexp": 1, "sort": 1, "argsort": 1, "cat": 1, "concat": 1,
    "concatenate": 1, "stack": 1, "index_select": 1, "gather": 1, "scatter": 1, "scatter_add": 1,
    "scatter_reduce": 1, "index_add": 1, "index_copy": 1, "index_fill": 1, "slice": 1, "narrow": 1,
    "select": 1, "diff": 1, "topk": 2, "kthvalue": 2, "split": 2, "split_with_sizes": 2,
    "chunk": 2, "unbind": 1, "roll": 2, "flip": 1, "glu": 1, "unsafe_split": 2,
}
_DIM_DEFAULTS = {"cat": 0, "concat": 0, "stack": 0, "split": 0, "split_with_sizes": 0, "chunk": 0,
                 "unbind": 0, "topk": -1, "sort": -1, "argsort": -1, "diff": -1, "kthvalue": -1, "glu": -1}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "prod", "var", "std", "var_mean",
               "std_mean", "norm", "linalg_vector_norm", "logsumexp", "any", "all", "argmax", "argmin"}
_COPIES = {"dropout", "native_dropout", "clone", "_to_copy", "contiguous", "to", "type_as",
           "alias", "detach", "lift_fresh_copy", "feature_dropout", "alpha_dropout", "bernoulli"}
_LIKE = ("_like",)
_POSITIONAL_GENERATORS = {"arange", "range", "linspace", "logspace", "randperm"}


def op_basename(target: Any) -> str:
    """``aten.conv2d.default`` → ``conv2d``; ``operator.getitem`` → ``getitem``."""
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name.split("::")[-1]
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name.split("::")[-1]
    return getattr(target, "__name__", str(target))


def op_name(target: Any) -> str:
    """The name a node's ``op`` field holds: ``aten.conv2d.default``, ``getitem``, ``sym_size``."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if target is operator.getitem:
        return "getitem"
    mod = getattr(target, "__module__", "") or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", str(target))
    return f"{mod}.{name}" if mod and mod not in ("builtins", "_operator") else name


def is_metadata_only(target: Any) -> bool:
    """Views, getitem and size queries: no compute, no new storage."""
    if target is operator.getitem:
        return True
    if isinstance(target, torch._ops.OpOverload):
        return bool(target.is_view) or op_basename(target).startswith("sym_")
    return False


def is_generator(target: Any, has_tensor_input: bool) -> bool:
    """An op whose output does not depend on any input's values: a constant, arange, zeros,
    ``*_like`` / ``new_*`` (which read only their input's shape)."""
    if not has_tensor_input:
        return True
    base = op_basename(target)
    return base.endswith(_LIKE) or base.startswith("new_")


def _norm_dim(d: Any, rank: int) -> int | None:
    if not isinstance(d, int) or rank == 0:
        return None
    return d % rank if -rank <= d < rank else None


def _dim_arg(base: str, args: Sequence[Any], kwargs: dict, rank: int) -> list[int]:
    pos = _MIXES_ALONG_DIM[base]
    if "dim" in kwargs:
        d = kwargs["dim"]
    elif "dims" in kwargs:
        d = kwargs["dims"]
    elif len(args) > pos:
        d = args[pos]
    else:
        d = _DIM_DEFAULTS.get(base, None)
    ds = d if isinstance(d, (list, tuple)) else [d]
    return [x for x in (_norm_dim(v, rank) for v in ds) if x is not None]


def _whole_slice(base: str, args: Sequence[Any], kwargs: dict, size: int) -> bool:
    """Whether a ``slice`` takes its whole dimension (``x[:]``, which torch.export writes as
    ``slice(x, 0, 0, 9223372036854775807)``): it keeps every sample where it was."""
    if base != "slice":
        return False
    start, end, step = (list(args[2:5]) + [None, None, None])[:3]      # slice(x, dim, start, end, step)
    start, end, step = kwargs.get("start", start), kwargs.get("end", end), kwargs.get("step", step)
    return (start in (None, 0) and (end is None or (isinstance(end, int) and end >= size))
            and step in (None, 1))


def _prefix(shape: Sequence[int], dim: int) -> int:
    n = 1
    for s in shape[:dim]:
        n *= s
    return n


def _map_through_reshape(src: TensorMeta, dim: int, out: TensorMeta) -> int | None:
    """Where dimension ``dim`` of ``src`` lands in ``out`` after a reshape, if it survives whole:
    same number of elements before it and the same size."""
    pre = _prefix(src.shape, dim)
    for j, s in enumerate(out.shape):
        if s == src.shape[dim] and _prefix(out.shape, j) == pre:
            return j
    return None


def output_channel_dim(target: Any, args: Sequence[Any], kwargs: dict,
                       tensor_inputs: Sequence[TensorMeta], out: TensorMeta) -> int | None:
    """The channel (feature) dimension of the op's first output, or ``None``."""
    rank = len(out.shape)
    if rank == 0:
        return None
    base = op_basename(target)
    if base in _CHANNEL1:
        return 1 if rank >= 2 else None
    if base in _CHANNEL_LAST:
        return rank - 1
    src = tensor_inputs[0] if tensor_inputs else None
    if src is None or src.channel_dim is None:
        return None
    c = src.channel_dim
    if base in _COPIES or (isinstance(target, torch._ops.OpOverload) and torch.Tag.pointwise in target.tags):
        same_rank = [t for t in tensor_inputs if len(t.shape) == rank and t.channel_dim is not None]
        return same_rank[0].channel_dim if same_rank else None
    if target is operator.getitem:
        return c if len(src.shape) == rank else None
    if base in ("transpose", "swapaxes", "swapdims"):
        d0, d1 = (_norm_dim(a, rank) for a in args[1:3])
        return d1 if c == d0 else d0 if c == d1 else c
    if base == "t":
        return rank - 1 - c if rank == 2 else c
    if base == "permute":
        perm = [_norm_dim(p, rank) for p in args[1]]
        return perm.index(c) if c in perm else None
    if base in _MIXES_ALONG_DIM:
        dims = _dim_arg(base, args, kwargs, len(src.shape))
        if c in dims:
            return None
        return c if len(src.shape) == rank else _map_through_reshape(src, c, out)
    if base in ("layer_norm", "native_layer_norm"):
        normalized = len(args[1]) if len(args) > 1 else 1
        return c if c < rank - normalized else None
    if base in _REDUCTIONS:
        return _reduced_dim(src, c, args, kwargs)
    if is_metadata_only(target):  # view, reshape, unsqueeze, squeeze, expand, flatten, ...
        return _map_through_reshape(src, c, out) if base != "expand" else c
    return None


def _reduced_dim(src: TensorMeta, c: int, args: Sequence[Any], kwargs: dict) -> int | None:
    """Where dimension ``c`` lands after a reduction over ``dim`` (``None`` if it is reduced)."""
    rank = len(src.shape)
    d = kwargs.get("dim", args[1] if len(args) > 1 else None)
    if d is None or isinstance(d, (list, tuple)) and len(d) == 0:
        return None  # reduction over everything
    dims = {_norm_dim(x, rank) for x in (d if isinstance(d, (list, tuple)) else [d])}
    if c in dims:
        return None
    keepdim = kwargs.get("keepdim", args[2] if len(args) > 2 and isinstance(args[2], bool) else False)
    return c if keepdim else c - sum(1 for x in dims if x is not None and x < c)


def split_dims(target: Any, args: Sequence[Any], kwargs: dict,
               tensor_inputs: Sequence[TensorMeta], out: TensorMeta | None) -> SplitDims:
    """How the op may be split: see the module docstring."""
    if out is None:
        return SplitDims()
    base = op_basename(target)
    batch = out.batch_dim
    if base in _POSITIONAL_GENERATORS:  # arange(B) split in two is not two arange(B/2)
        batch = None
    if batch is not None:
        src = next((t for t in tensor_inputs if t.batch_dim is not None), None)
        if src is not None:
            if base in _MIXES_ALONG_DIM and src.batch_dim in _dim_arg(base, args, kwargs, len(src.shape)) \
                    and not _whole_slice(base, args, kwargs, src.shape[src.batch_dim]):
                batch = None
            elif base == "index" and len(args) > 1 and isinstance(args[1], (list, tuple)) \
                    and len(args[1]) > src.batch_dim and args[1][src.batch_dim] is not None \
                    and not _indexed_by_batch(args[1], tensor_inputs, out):
                batch = None
            elif is_metadata_only(target) and _prefix(src.shape, src.batch_dim) != _prefix(out.shape, batch):
                batch = None
    training_bn = base in _BATCH_NORMS and _bn_training(base, args, kwargs)
    return SplitDims(batch=batch, channel=out.channel_dim, batch_exact=not training_bn)


def _indexed_by_batch(indices: Sequence[Any], tensor_inputs: Sequence[TensorMeta], out: TensorMeta) -> bool:
    """Whether ``index(x, indices)`` gathers along the batch by index tensors that carry it
    (``x[arange(B)[:, None], j]``, as Hugging Face builds its attention masks): the output's batch
    dimension is the index tensors' broadcast one, so each shard reads ``x`` whole and its piece
    of every index tensor that has the batch (the others, size 1 there, whole) — shard ``i``
    gathers exactly block ``i`` of the output, whatever the indices' values.  ``tensor_inputs``
    are ``x``'s meta then one per distinct index tensor."""
    nodes = [i for i in indices if i is not None]
    if indices[0] is None or len(tensor_inputs) != 1 + len({id(i) for i in nodes}) or out.batch_dim is None:
        return False   # the broadcast dims lead the output only when the first dim is indexed
    metas = tensor_inputs[1:]
    rank = max(len(m.shape) for m in metas)
    carried = False
    for m in metas:
        at = out.batch_dim - (rank - len(m.shape))      # the dim of m aligned with the output's batch
        if m.batch_dim is not None:
            if m.batch_dim != at:
                return False
            carried = True
        elif 0 <= at < len(m.shape) and m.shape[at] != 1:
            return False
    return carried


def _bn_training(base: str, args: Sequence[Any], kwargs: dict) -> bool:
    if base == "_native_batch_norm_legit_no_training":
        return False
    pos = {"batch_norm": 5, "native_batch_norm": 5, "_native_batch_norm_legit": 5,
           "_native_batch_norm_legit_functional": 5}[base]
    v = kwargs.get("training", args[pos] if len(args) > pos else True)
    return bool(v)
