"""Operator semantics: which ATen ops are metadata-only or generators, and how each may be split.

The rules read the op's schema (``OpOverload.is_view``, the ``pointwise`` tag, whether it takes
tensor inputs at all) and the op's own arguments (the ``dim`` of a softmax or a cat), never node
or module names.  Batch dimensions come from torch.export's symbolic shapes (see
:mod:`tensoropt.capture`); this module decides whether an op *keeps samples independent*
along that dimension and which dimension is its *channel* (feature) dimension.

Every op falls in one family of rules (:func:`batch_family`) or in none; **an op in none is
replicated** — never split, whatever its shapes allow — and ``tensoropt graph`` lists it, so
a rule is never guessed.  The families, and when each allows a batch split:

- ``elementwise`` (torch's ``pointwise`` tag, copies, dropout and the like), ``per-sample``
  (weighted layers, normalisation, pooling, resampling, attention, losses), ``reduction``,
  ``generator`` (sized by the batch): whenever the output has the batch dimension — the symbolic
  shapes tie every input to it or leave the output without it;
- ``along`` (softmax, cumsum, sort, cat, gather, flip, roll, diff, fft…: :data:`_ALONG`): when the
  dimensions its arguments name leave the batch out (``dim=None``, every dimension, never does);
  a scatter also needs its index and source to carry the batch;
- ``matrix`` (tril, linalg…): when every input's batch dimension leads its last two;
- ``pad`` / ``repeat``: when the batch dimension is not padded / repeated;
- ``view``: when as many elements precede the batch dimension in the output as in the input
  (a ``squeeze`` without dimensions never: a one-sample shard would lose its batch dimension);
- ``index``: an ``index`` whose index tensors carry the batch splits by them, its source read
  whole.  Batch norm in training mode is legal but not exact (per-shard statistics: the
  executors synchronise it).

The channel dimension of an output: conv / pooling / batch norm / upsampling → 1; linear,
matmul family and embedding → last; scaled-dot-product attention → 1 (heads); pointwise ops,
dropout, copies → inherited from the input of the same rank; views, transposes, ``movedim``,
reductions, softmax, cat → mapped through from the input when the op leaves that dimension
intact; anything else → none.  Every rule is checked against PyTorch's own operator samples by
:mod:`tensoropt.execute.conformance` (``benchmarks/split_rules.py``; the table is in
``docs/split-rules.md``).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, cast

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
    "_upsample_nearest_exact2d", "pixel_shuffle",
    "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
}
_CHANNEL_LAST = {"linear", "addmm", "mm", "bmm", "matmul", "baddbmm", "embedding", "einsum", "lstm", "gru",
                 "rnn_tanh", "rnn_relu", "_thnn_fused_lstm_cell"}
_BATCH_NORMS = {"batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                "_native_batch_norm_legit_functional"}
#: ops that combine elements along the dimensions their arguments name: base name → (argument
#: positions of those dimensions, what they are when not given: a dimension, a tuple, or ALL)
ALL = "all"
_ALONG: dict[str, tuple[tuple[int, ...], Any]] = {
    **{b: ((1,), ALL) for b in ("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax", "cumsum",
                                "cumprod", "cummax", "cummin", "logcumsumexp", "index_select", "gather", "scatter",
                                "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_fill", "narrow",
                                "select", "unfold", "flip")},
    **{b: ((1,), 0) for b in ("cat", "concat", "concatenate", "stack", "unbind", "slice")},
    **{b: ((1,), -1) for b in ("sort", "argsort", "glu", "mode")},
    **{b: ((2,), 0) for b in ("split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "chunk",
                              "unsafe_chunk", "tensor_split", "slice_scatter")},
    **{b: ((2,), -1) for b in ("topk", "kthvalue", "diff", "linalg_cross", "fft_fft", "fft_ifft", "fft_rfft",
                               "fft_irfft", "fft_hfft", "fft_ihfft")},
    **{b: ((2,), ALL) for b in ("roll", "repeat_interleave", "take_along_dim", "select_scatter",
                                "_softmax_backward_data", "_log_softmax_backward_data", "cross", "fft_fftn",
                                "fft_ifftn", "fft_rfftn",
                                "fft_irfftn", "fft_hfftn", "fft_ihfftn")},
    **{b: ((2,), (-2, -1)) for b in ("fft_fft2", "fft_ifft2", "fft_rfft2", "fft_irfft2", "fft_hfft2", "fft_ihfft2")},
    **{b: ((1,), ALL) for b in ("fft_fftshift", "fft_ifftshift")},
    **{b: ((2, 3), (0, 1)) for b in ("diagonal", "diagonal_copy", "linalg_diagonal")},
    "diagonal_scatter": ((3, 4), (0, 1)), "rot90": ((2,), (0, 1)),
    "msort": ((), 0), "flipud": ((), 0), "fliplr": ((), 1), "vsplit": ((), 0), "dsplit": ((), 2),
    "hsplit": ((), 1), "trapezoid": ((), -1), "trapz": ((), -1), "cumulative_trapezoid": ((), -1),
}
#: ops that write a source into an input at an index tensor's positions, both of which may be
#: smaller than the input along every dimension (no shape rule ties them to the batch)
_SCATTER = {"scatter", "scatter_add", "scatter_reduce"}
#: ops on the last two dimensions of each input (matrices): batch split only along a leading one
_MATRIX = {"tril", "triu", "inverse", "det", "logdet", "slogdet", "qr", "svd", "pinverse", "matrix_exp",
           "cholesky", "cholesky_inverse", "cholesky_solve", "ormqr", "geqrf", "triangular_solve", "lu_solve",
           "_lu_with_info", "linalg_lu", "linalg_lu_factor", "linalg_lu_factor_ex", "linalg_lu_solve", "trace",
           "linalg_det", "linalg_slogdet", "linalg_inv", "linalg_inv_ex", "linalg_cholesky", "linalg_cholesky_ex",
           "linalg_qr", "linalg_svd", "linalg_svdvals", "linalg_eig", "linalg_eigh", "linalg_eigvals",
           "linalg_eigvalsh", "linalg_pinv", "linalg_matrix_exp", "linalg_matrix_power", "matrix_power",
           "linalg_solve", "linalg_solve_ex", "linalg_solve_triangular", "linalg_matrix_rank", "linalg_cond",
           "linalg_householder_product", "linalg_ldl_factor", "linalg_lstsq",
           "linalg_multi_dot", "linalg_tensorinv", "linalg_tensorsolve", "_linalg_det", "_linalg_slogdet",
           "_linalg_svd", "_linalg_eigh", "_linalg_solve_ex"}
#: ops that compute each sample on its own whatever their arguments (the batch dimension comes from
#: the symbolic shapes: an output without the batch symbol has no batch, one with it in two
#: dimensions neither): weighted layers, normalisation, pooling, resampling, attention, recurrences
_PER_SAMPLE = _CONV | _CHANNEL1 | _CHANNEL_LAST | {
    "layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm",
    "instance_norm", "local_response_norm", "_weight_norm", "_weight_norm_interface", "cosine_similarity",
    "pairwise_distance", "cdist", "_cdist_forward", "grid_sampler", "grid_sampler_2d", "grid_sampler_3d",
    "affine_grid_generator", "im2col", "col2im", "pixel_unshuffle", "native_channel_shuffle",
    "max_pool1d_with_indices", "fractional_max_pool2d", "fractional_max_pool3d", "lp_pool1d", "lp_pool2d",
    "adaptive_max_pool3d", "max_unpool2d", "max_unpool3d", "upsample_nearest1d", "upsample_bicubic2d",
    "_upsample_nearest_exact1d", "_upsample_nearest_exact3d", "_upsample_bicubic2d_aa", "interpolate",
    "addbmm", "addmv", "mv", "dot", "vdot", "inner", "outer", "ger", "tensordot", "kron", "bilinear",
    "_scaled_dot_product_attention_math", "gru_cell", "lstm_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "nll_loss", "nll_loss_nd", "nll_loss2d", "cross_entropy_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
    "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "soft_margin_loss",
    "multilabel_margin_loss", "multi_margin_loss", "margin_ranking_loss", "hinge_embedding_loss",
    "poisson_nll_loss", "cosine_embedding_loss", "triplet_margin_loss", "ctc_loss", "_ctc_loss",
    "index", "_unsafe_index", "one_hot",
}
#: elementwise ops without torch's ``pointwise`` tag (each element of the output reads the
#: elements of its inputs at the same, broadcast, position)
_ELEMENTWISE = {"__and__", "__or__", "__xor__", "__lshift__", "__rshift__", "bitwise_and", "bitwise_or",
                "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift", "logical_and", "logical_or",
                "logical_xor", "hardswish", "hardsigmoid", "celu", "elu", "selu", "threshold", "prelu",
                "_prelu_kernel", "rrelu", "rrelu_with_noise", "softshrink", "hardshrink", "log_sigmoid",
                "isclose", "nan_to_num", "heaviside", "polar", "complex", "view_as_real",
                "masked_fill", "where", "fill", "copy", "zero", "float_power", "xlogy", "special_xlog1py",
                "ldexp", "fmod", "remainder", "frexp", "lerp", "addcmul", "addcdiv", "clamp", "clip",
                "feature_dropout", "feature_alpha_dropout", "alpha_dropout", "dropout", "native_dropout",
                "bernoulli", "rand_like", "randn_like", "randint_like", "normal_functional", "uniform",
                "exponential", "geometric", "log_normal", "cauchy", "poisson", "binomial", "rsub",
                "broadcast_tensors", "special_ndtr", "special_polygamma", "polygamma"}
#: pad ops by the number of trailing dimensions they pad (``None``: ``len(pad) // 2``)
_PADS = {"constant_pad_nd": None, "pad": None, "_pad_circular": None, "reflection_pad1d": 1, "reflection_pad2d": 2,
         "reflection_pad3d": 3, "replication_pad1d": 1, "replication_pad2d": 2, "replication_pad3d": 3,
         "circular_pad1d": 1, "circular_pad2d": 2, "circular_pad3d": 3}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "aminmax", "max", "min", "prod", "var", "std", "var_mean",
               "std_mean", "norm", "linalg_vector_norm", "logsumexp", "any", "all", "argmax", "argmin"}
_COPIES = {"dropout", "native_dropout", "clone", "_to_copy", "contiguous", "to", "type_as",
           "alias", "detach", "lift_fresh_copy", "feature_dropout", "alpha_dropout", "bernoulli"}
_LIKE = ("_like",)
#: ops that make a tensor from sizes alone (the batch size among them, symbolically)
_GENERATORS = {"zeros", "ones", "empty", "full", "rand", "randn", "randint", "scalar_tensor", "empty_strided",
               "eye", "tril_indices", "triu_indices"}
#: the copying forms of views (``*_copy``): the same shapes as the view
VIEW_COPIES = {"view_copy", "expand_copy", "permute_copy", "transpose_copy", "t_copy", "unsqueeze_copy",
               "squeeze_copy", "_reshape_copy", "alias_copy", "view_as", "expand_as", "reshape_as",
               "flatten", "unflatten", "movedim", "moveaxis", "ravel", "reshape"}
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
    name = str(getattr(target, "__qualname__", None) or getattr(target, "__name__", str(target)))
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


def _dim_arg(base: str, args: Sequence[Any], kwargs: dict, rank: int) -> list[int] | str:
    """The dimensions ``base`` (an op of :data:`_ALONG`) combines elements along, normalised to
    ``0 … rank − 1``, or :data:`ALL` (every dimension: a ``dim=None``, or one not understood)."""
    positions, default = _ALONG[base]
    if base == "hsplit":
        return [1 if rank > 1 else 0]
    given = None
    if len(positions) > 1:      # diagonal(x, offset, dim1, dim2): each dimension its own argument
        names = ("dim1", "dim2")
        given = tuple(kwargs.get(names[i], args[p] if len(args) > p else default[i]) for i, p in enumerate(positions))
    elif "dim" in kwargs or "dims" in kwargs:
        given = kwargs.get("dim", kwargs.get("dims"))
    elif positions and len(args) > positions[0]:
        given = args[positions[0]]
    d = default if given is None else given
    if d is None or d == ALL:
        return ALL
    ds = d if isinstance(d, (list, tuple)) else [d]
    out = [_norm_dim(v, rank) for v in ds]
    return ALL if any(x is None for x in out) else [x for x in out if x is not None]


def _whole_slice(base: str, args: Sequence[Any], kwargs: dict, size: int) -> bool:
    """Whether a ``slice`` takes its whole dimension (``x[:]``, which torch.export writes as
    ``slice(x, 0, 0, 9223372036854775807)``): it keeps every sample where it was."""
    if base != "slice":
        return False
    start, end, step = (list(args[2:5]) + [None, None, None])[:3]      # slice(x, dim, start, end, step)
    start, end, step = kwargs.get("start", start), kwargs.get("end", end), kwargs.get("step", step)
    return (start in (None, 0) and (end is None or (isinstance(end, int) and end >= size))
            and step in (None, 1))


def _prefix(shape: Sequence[int], dim: int | None) -> int:
    """The product of the sizes before ``dim`` (all of them for ``None``)."""
    n = 1
    for s in shape[:dim]:
        n *= s
    return n


def _map_through_reshape(src: TensorMeta, dim: int, out: TensorMeta) -> int | None:
    """Where dimension ``dim`` of ``src`` lands in ``out`` after a reshape: the dimension with as
    many elements before it that is ``dim`` whole, else the outermost factor of ``dim`` split
    (a head split ``(B, T, C) → (B, T, H, D)``: ``H``), else the dimension ``dim`` is the outermost
    factor of, merged (``(B, T, H, D) → (B, T, C)``: ``C``) — a contiguous piece of ``dim`` is a
    contiguous piece of the outermost factor and back, for a degree that divides it (what
    :func:`tensoropt.measure.shards.shard_args` checks before it cuts a view)."""
    pre, size = _prefix(src.shape, dim), src.shape[dim]
    starts = [j for j in range(len(out.shape)) if _prefix(out.shape, j) == pre]
    for j in starts:
        if out.shape[j] == size:
            return j
    for j in starts:
        if out.shape[j] > 1 and _spans(out.shape, j, size):     # split: out[j], out[j+1] … make ``dim``
            return j
    for j in starts:
        if size > 1 and _spans(src.shape, dim, out.shape[j]):   # merged: src[dim], src[dim+1] … make out[j]
            return j
    return None


def _spans(shape: Sequence[int], start: int, n: int) -> bool:
    """Whether ``shape[start] · shape[start + 1] · …`` reaches exactly ``n`` for some end."""
    p = 1
    for s in shape[start:]:
        p *= s
        if p == n:
            return True
        if p > n or p == 0:
            return False
    return False


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
    if base in _SCATTER:
        return None     # its index and source may be shorter than the input along the channels too
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
    if base in ("movedim", "moveaxis"):
        src_dims, dst_dims = (x if isinstance(x, (list, tuple)) else [x] for x in args[1:3])
        src_dims, dst_dims = [_norm_dim(x, rank) for x in src_dims], [_norm_dim(x, rank) for x in dst_dims]
        rest = [d for d in range(rank) if d not in src_dims]
        order: list[int | None] = [None] * rank
        for sd, dd in zip(src_dims, dst_dims):
            order[dd] = sd
        it = iter(rest)
        order = [o if o is not None else next(it) for o in order]
        return order.index(c)
    if base in _ALONG:
        dims = _dim_arg(base, args, kwargs, len(src.shape))
        if dims == ALL or c in dims:
            return None
        return c if len(src.shape) == rank else _map_through_reshape(src, c, out)
    if base in ("layer_norm", "native_layer_norm"):
        normalized = len(args[1]) if len(args) > 1 else 1
        return c if c < rank - normalized else None
    if base in _REDUCTIONS:
        return _reduced_dim(src, c, args, kwargs)
    if base in ("squeeze", "squeeze_copy") and len(args) < 2 and "dim" not in kwargs:
        return None     # a one-channel shard would lose its channel dimension
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


def batch_family(target: Any, has_tensor_input: bool = True) -> str | None:
    """Which rule says whether ``target`` keeps samples independent along the batch, or ``None``:
    tensoropt has no rule for the op, so it never splits it along the batch (replicated — never
    guessed).  Families: ``generator`` (no tensor input, ``*_like``, ``new_*``), ``along`` (mixes
    along the dimensions its arguments name: :data:`_ALONG`), ``matrix`` (works on the last two
    dimensions), ``pad``, ``repeat``, ``view`` (metadata only), ``elementwise`` (torch's
    ``pointwise`` tag, copies, dropout), ``reduction``, ``per-sample`` (weighted layers,
    normalisation, pooling, attention, losses: :data:`_PER_SAMPLE`)."""
    base = op_basename(target)
    if base in _BATCH_NORMS and base != "batch_norm" or base == "_native_batch_norm_legit_no_training":
        return None     # the executors split batch norm as aten.batch_norm (what export records) only
    if base in _ALONG:
        return "along"
    if base in _MATRIX:
        return "matrix"
    if base in _PADS:
        return "pad"
    if base in ("repeat", "tile"):
        return "repeat"
    if base in ("as_strided", "as_strided_copy", "as_strided_scatter"):
        return None     # strides are absolute: a shard's piece is not the same strided walk
    if is_metadata_only(target) or base in VIEW_COPIES:
        return "view"
    if not has_tensor_input or base.endswith(_LIKE) or base.startswith("new_") or base in _GENERATORS:
        return "generator"
    if base in _COPIES or base in _ELEMENTWISE or (isinstance(target, torch._ops.OpOverload)
                                                   and torch.Tag.pointwise in target.tags):
        return "elementwise"
    if base in _REDUCTIONS:
        return "reduction"
    if base in _PER_SAMPLE:
        return "per-sample"
    return None


def split_dims(target: Any, args: Sequence[Any], kwargs: dict,
               tensor_inputs: Sequence[TensorMeta], out: TensorMeta | None, *,
               family: str | None = None, reads_state: bool = False) -> SplitDims:
    """How the op may be split: see the module docstring.  ``tensor_inputs``: the metas of the
    activations it reads; ``reads_state``: whether it also reads a parameter, buffer or constant
    tensor.  ``family``: the op's :func:`batch_family` when ``target`` is not an ATen op (an
    ONNX node's)."""
    if out is None:
        return SplitDims()
    base = op_basename(target)
    family = family or batch_family(target, bool(tensor_inputs))
    if family is None:
        return SplitDims(rule="replicated")     # no rule: never split, whatever the shapes allow
    batch = out.batch_dim
    if base in _POSITIONAL_GENERATORS:  # arange(B) split in two is not two arange(B/2)
        batch = None
    src = next((t for t in tensor_inputs if t.batch_dim is not None), None)
    if batch is not None and src is not None and not _keeps_samples(family, base, args, kwargs, tensor_inputs,
                                                                     src, out, reads_state):
        batch = None
    training_bn = base in _BATCH_NORMS and _bn_training(base, args, kwargs)
    return SplitDims(batch=batch, channel=out.channel_dim, batch_exact=not training_bn, rule=family)


def _keeps_samples(family: str, base: str, args: Sequence[Any], kwargs: dict, tensor_inputs: Sequence[TensorMeta],
                   src: TensorMeta, out: TensorMeta, reads_state: bool) -> bool:
    """Whether the op, in its family, leaves ``src``'s batch dimension independent (``src``: the
    first input with one)."""
    rank, b = len(src.shape), cast(int, src.batch_dim)   # src has one (see the caller)
    if base in _SCATTER and (reads_state or any(t.batch_dim != b for t in tensor_inputs)):
        return False    # its index and source may be shorter than the input: each must carry the batch
    if family == "along":
        dims = _dim_arg(base, args, kwargs, rank)
        return not (dims == ALL or b in dims) or _whole_slice(base, args, kwargs, src.shape[b])
    if family == "matrix":
        return all(t.batch_dim is None or t.batch_dim < len(t.shape) - 2 for t in tensor_inputs)
    if family == "pad":
        n = _PADS[base]
        if n is None:
            pad = kwargs.get("pad", args[1] if len(args) > 1 else None)
            n = len(pad) // 2 if isinstance(pad, (list, tuple)) else rank
        return b < rank - n
    if family == "repeat":
        reps = list(kwargs.get("repeats", kwargs.get("dims", args[1] if len(args) > 1 else ())))
        at = b + len(reps) - rank
        return 0 <= at < len(reps) and reps[at] == 1
    if base in ("index", "_unsafe_index") and len(args) > 1 and isinstance(args[1], (list, tuple)) \
            and len(args[1]) > b and args[1][b] is not None:
        return _indexed_by_batch(args[1], tensor_inputs, out)
    if family == "view":
        if base in ("squeeze", "squeeze_copy") and len(args) < 2 and "dim" not in kwargs:
            return False        # a shard of one sample would lose its batch dimension
        return _prefix(src.shape, b) == _prefix(out.shape, out.batch_dim)
    return True


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
