"""Operator classes: which achievable rate prices an operator.

A device reaches a different fraction of its peak on a large matrix product than on an
elementwise add or a layer norm; a device model keeps one fit per *class* of operator
(:class:`~tensoropt.devicemodel.calibration.ClassFit`).  The classes, by the ATen operator's
base name (``aten.addmm.default`` → ``addmm``):

============  ==========================================================================
``matmul``    matrix products: ``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``linear``, ``matmul``, and
              the fused recurrent layers (``lstm``, ``gru``), whose FLOPs are matrix products
``conv``      convolutions (cuDNN runs float32 ones in TF32 by default)
``attention`` fused attention (``scaled_dot_product_attention`` and its kernels)
``norm``      normalisation and softmax: a reduction and an elementwise pass in one kernel
``movement``  data movement: copies, concatenation, gathers (embedding), padding, scatter
``elementwise`` everything else that computes: pointwise math, reductions, dropout, losses
============  ==========================================================================

It owns the names and nothing else: it must not price (:mod:`.price` does).

Example::

    >>> op_class("aten.addmm.default"), op_class("aten.native_layer_norm.default"), op_class("aten.gelu.default")
    ('matmul', 'norm', 'elementwise')
"""

from __future__ import annotations

#: the classes, in the order tables list them
OP_CLASSES = ("matmul", "conv", "attention", "norm", "movement", "elementwise")
#: the classes whose FLOPs run on the matrix units (their peak depends on the dtype)
COMPUTE_CLASSES = frozenset({"matmul", "conv", "attention"})

_MATMUL = {"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "addbmm", "einsum", "dot", "mv", "addmv",
           "_addmm_activation", "tensordot",
           "lstm", "gru", "rnn_tanh", "rnn_relu", "LSTM", "GRU", "RNN"}   # fused recurrent layers: GEMMs
_CONV = {"convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
         "_convolution", "cudnn_convolution", "mkldnn_convolution", "convolution_overrideable", "Conv1d", "Conv2d",
         "Conv3d", "ConvTranspose2d"}
_ATTENTION = {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu", "_flash_attention_forward", "_efficient_attention_forward"}
_NORM = {"layer_norm", "native_layer_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
         "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training", "cudnn_batch_norm",
         "group_norm", "native_group_norm", "instance_norm", "rms_norm", "_fused_rms_norm", "softmax", "_softmax",
         "log_softmax", "_log_softmax", "local_step", "LayerNorm", "BatchNorm1d", "BatchNorm2d", "GroupNorm"}
_MOVEMENT = {"cat", "concat", "stack", "copy", "copy_", "_to_copy", "clone", "contiguous", "to", "embedding",
             "embedding_bag", "index", "index_select", "gather", "take", "index_put", "index_put_", "scatter",
             "scatter_add", "slice_scatter", "select_scatter", "pad", "constant_pad_nd", "reflection_pad2d",
             "replication_pad2d", "repeat", "roll", "flip", "tile", "masked_fill", "where", "narrow_copy",
             "Embedding", "cumsum"}


def base_name(op: str) -> str:
    """The operator's base name: ``aten.addmm.default`` → ``addmm``, ``torch.nn.functional.gelu``
    → ``gelu``, a module call ``Conv2d`` stays ``Conv2d``."""
    parts = [p for p in op.split(".") if p]
    if len(parts) >= 3 and parts[0] in ("aten", "prims", "tensoropt"):
        return parts[1] if parts[0] != "tensoropt" else parts[-1]
    if parts and parts[-1] in ("default", "Tensor", "Scalar", "int", "dim", "out") and len(parts) >= 2:
        return parts[-2]
    return parts[-1] if parts else op


def op_class(op: str) -> str:
    """The class (:data:`OP_CLASSES`) that prices operator ``op`` (module docstring)."""
    b = base_name(op)
    for names, cls in ((_MATMUL, "matmul"), (_CONV, "conv"), (_ATTENTION, "attention"), (_NORM, "norm"),
                       (_MOVEMENT, "movement")):
        if b in names:
            return cls
    return "elementwise"


__all__ = ["COMPUTE_CLASSES", "OP_CLASSES", "base_name", "op_class"]
