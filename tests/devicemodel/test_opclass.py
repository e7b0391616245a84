"""Operator classes (tensoropt.devicemodel.opclass): which achievable rate prices an operator."""

import pytest

from tensoropt.devicemodel import OP_CLASSES, op_class
from tensoropt.devicemodel.opclass import COMPUTE_CLASSES, base_name


@pytest.mark.parametrize("op, cls", [
    ("aten.addmm.default", "matmul"),
    ("aten.mm.default", "matmul"),
    ("aten.bmm.default", "matmul"),
    ("aten.linear.default", "matmul"),
    ("aten.convolution.default", "conv"),
    ("aten.conv2d.default", "conv"),
    ("aten._scaled_dot_product_flash_attention_for_cpu.default", "attention"),
    ("aten.scaled_dot_product_attention.default", "attention"),
    ("aten.native_layer_norm.default", "norm"),
    ("aten.layer_norm.default", "norm"),
    ("aten.batch_norm.default", "norm"),
    ("aten._softmax.default", "norm"),
    ("aten.embedding.default", "movement"),
    ("aten.cat.default", "movement"),
    ("aten.index_select.default", "movement"),
    ("aten.gelu.default", "elementwise"),
    ("aten.add.Tensor", "elementwise"),
    ("aten.relu.default", "elementwise"),
    ("aten.mean.dim", "elementwise"),
    ("tensoropt.syncbn.local_step", "norm"),       # the profiler's synchronised batch-norm shard
    ("torch.nn.functional.gelu", "elementwise"),
    ("Conv2d", "conv"),                             # a torch.fx capture's module call
    ("LayerNorm", "norm"),
])
def test_op_class(op, cls):
    """Each operator name maps to the class whose fit prices it."""
    assert op_class(op) == cls


def test_base_name_strips_the_namespace_and_overload():
    """aten.NAME.OVERLOAD and dotted Python paths reduce to NAME."""
    assert base_name("aten.addmm.default") == "addmm"
    assert base_name("aten.add.Tensor") == "add"
    assert base_name("torch.nn.functional.gelu") == "gelu"
    assert base_name("Conv2d") == "Conv2d"


def test_the_class_list():
    """Six classes; matrix products, convolutions and attention run on the matrix units."""
    assert OP_CLASSES == ("matmul", "conv", "attention", "norm", "movement", "elementwise")
    assert {"matmul", "conv", "attention"} == COMPUTE_CLASSES
