"""load_onnx: an ONNX file exported from a zoo model gives the same parameter bytes."""

import pytest
import torch

from tensoropt import CaptureError, capture, load_model, load_onnx, zoo
from tests.conftest import model_param_bytes

pytest.importorskip("onnx")


def export_onnx(model, inputs, path, dynamic_batch):
    """torch's exporter (through torch.export), unoptimised so no weight is folded away."""
    model.eval()
    dynamic = ({0: torch.export.Dim("batch")},) if dynamic_batch else None
    torch.onnx.export(model, inputs, str(path), dynamo=True, input_names=["x"], dynamic_shapes=dynamic,
                      optimize=False, verbose=False)


@pytest.mark.parametrize("name", ["vgg16", "wide_resnet"])
def test_onnx_import_has_the_models_parameter_bytes(name, tmp_path):
    model, inputs = zoo.build(name, tiny=True)
    path = tmp_path / f"{name}.onnx"
    export_onnx(model, inputs, path, dynamic_batch=True)
    g = load_onnx(path, batch_size=inputs[0].shape[0])
    assert g.source == "onnx" and g.module is None
    assert g.param_bytes() == model_param_bytes(model)
    conv = next(n for n in g.ops if n.op == "onnx.Conv")
    assert conv.split.batch == 0 and conv.split.channel == 1
    assert conv.outputs[0].shape[0] == inputs[0].shape[0]
    # the same convolutions as the torch capture
    torch_g = capture(model, inputs)
    assert sum(n.op == "onnx.Conv" for n in g.ops) == sum("conv" in n.op for n in torch_g.ops)


def test_onnx_fixed_batch_says_batch_dims_unknown(tmp_path):
    model, inputs = zoo.build("vgg16", tiny=True)
    path = tmp_path / "fixed.onnx"
    export_onnx(model, inputs, path, dynamic_batch=False)
    g = load_model(str(path)).capture()
    assert g.batch_size == inputs[0].shape[0]
    assert any("batch dimensions are unknown" in n for n in g.notes)
    assert all(n.split.batch is None for n in g.ops)


def test_onnx_garbage(tmp_path):
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"not a protobuf at all")
    with pytest.raises(CaptureError, match="not a readable ONNX model"):
        load_onnx(p)
