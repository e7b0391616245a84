"""Shard rules: which arguments one device sees when an op is split k ways."""

import torch

from tensoropt.graph import TensorMeta
from tensoropt.measure.shards import TensorArg, shard_args, shard_size

aten = torch.ops.aten


def conv_call():
    x, w, b = torch.randn(8, 6, 10, 10), torch.randn(16, 6, 3, 3), torch.randn(16)
    info = {id(x): TensorArg("activation", TensorMeta(x.shape, "float32", 0, 1)),
            id(w): TensorArg("param"), id(b): TensorArg("param")}
    out = TensorMeta((8, 16, 8, 8), "float32", 0, 1)
    return (x, w, b), info, out


def test_batch_cuts_only_activations():
    args, info, out = conv_call()
    (x, w, b), _ = shard_args("conv2d", args, {}, info, "batch", 4, out)
    assert x.shape == (2, 6, 10, 10) and w.shape == (16, 6, 3, 3) and b.shape == (16,)
    assert aten.conv2d.default(x, w, b).shape == (2, 16, 8, 8)


def test_channel_cuts_the_weight_output_dim_and_reduce_the_input_dim():
    args, info, out = conv_call()
    (x, w, b), _ = shard_args("conv2d", args, {}, info, "channel", 4, out)
    assert x.shape == (8, 6, 10, 10) and w.shape == (4, 6, 3, 3) and b.shape == (4,)
    (x, w, b), _ = shard_args("conv2d", args, {}, info, "reduce", 3, out)
    assert x.shape == (8, 2, 10, 10) and w.shape == (16, 2, 3, 3)
    assert aten.conv2d.default(x, w, b).shape == out.shape


def test_per_channel_parameters_follow_the_activation():
    x = torch.randn(4, 8, 5, 5)
    weight, bias, mean, var = torch.ones(8), torch.zeros(8), torch.zeros(8), torch.ones(8)
    info = {id(x): TensorArg("activation", TensorMeta(x.shape, "float32", 0, 1))}
    info.update({id(t): TensorArg("param") for t in (weight, bias, mean, var)})
    out = TensorMeta(x.shape, "float32", 0, 1)
    args = (x, weight, bias, mean, var, True, 0.1, 1e-5, False)
    cut, _ = shard_args("batch_norm", args, {}, info, "channel", 2, out)
    assert cut[0].shape == (4, 4, 5, 5) and all(t.shape == (4,) for t in cut[1:5])
    assert aten.batch_norm.default(*cut).shape == (4, 4, 5, 5)


def test_matmul_family_and_non_applicable_layouts():
    x, w = torch.randn(6, 10), torch.randn(10, 12)
    info = {id(x): TensorArg("activation", TensorMeta(x.shape, "float32", 0, 1)), id(w): TensorArg("param")}
    out = TensorMeta((6, 12), "float32", 0, 1)
    (a, b), _ = shard_args("mm", (x, w), {}, info, "channel", 4, out)
    assert b.shape == (10, 3)
    (a, b), _ = shard_args("mm", (x, w), {}, info, "reduce", 4, out)
    assert a.shape == (6, 3) and b.shape == (3, 12)
    assert shard_args("relu", (x,), {}, info, "reduce", 2, out) is None
    assert shard_size(10, 4) == 3


def test_grouped_query_attention_is_cut_by_heads_where_the_degree_divides_the_shared_heads():
    # 4 query heads share 2 key / value heads (heads 0, 1 read kv head 0): cut 2 ways, device 0
    # has q heads 0, 1 and kv head 0 — its output is the first two heads of the whole attention
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16), torch.randn(2, 2, 8, 16)
    info = {id(t): TensorArg("activation", TensorMeta(t.shape, "float32", 0, 1)) for t in (q, k, v)}
    out = TensorMeta((2, 4, 8, 16), "float32", 0, 1)
    kwargs = {"is_causal": True, "enable_gqa": True}
    (q2, k2, v2), kw = shard_args("scaled_dot_product_attention", (q, k, v), dict(kwargs), info, "channel", 2, out)
    assert (q2.shape, k2.shape, v2.shape) == ((2, 2, 8, 16), (2, 1, 8, 16), (2, 1, 8, 16))
    whole = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
    piece = torch.nn.functional.scaled_dot_product_attention(q2, k2, v2, **kw)
    torch.testing.assert_close(piece, whole[:, :2])
    # 4 ways would split a shared kv head between two devices; without enable_gqa the heads must match
    assert shard_args("scaled_dot_product_attention", (q, k, v), dict(kwargs), info, "channel", 4, out) is None
    assert shard_args("scaled_dot_product_attention", (q, k, v), {"is_causal": True}, info, "channel", 2, out) is None
