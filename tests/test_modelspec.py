"""Model specs: zoo:NAME?k=v, file.py:factory, model.onnx, graph.json — and their errors."""

import textwrap

import pytest

from tensoropt import ModelSpecError, load_model


def test_zoo_spec_with_params_and_batch_override():
    m = load_model("zoo:vgg16?tiny=1&num_classes=7")
    assert m.params["num_classes"] == 7
    assert m.model(*m.example_inputs).shape[-1] == 7
    b = load_model("zoo:vgg16?tiny=1", batch=3)
    assert b.example_inputs[0].shape[0] == 3


def test_unknown_zoo_name_lists_names():
    with pytest.raises(ModelSpecError) as e:
        load_model("zoo:vgg61")
    assert "vgg16" in str(e.value) and "gpt2" in str(e.value)


def test_bad_zoo_param():
    with pytest.raises(ModelSpecError, match="layer"):
        load_model("zoo:gpt2?layer=2")
    with pytest.raises(ModelSpecError, match="batch"):
        load_model("zoo:vgg16?batch=abc")
    with pytest.raises(ModelSpecError, match="tiny"):
        load_model("zoo:vgg16?tiny=maybe")


def write(tmp_path, body, name="factory.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def test_factory_file(tmp_path):
    p = write(tmp_path, """
        import torch
        def make(batch=2):
            return torch.nn.Linear(3, 5), (torch.randn(batch, 3),)
    """)
    m = load_model(f"{p}:make", batch=6)
    g = m.capture()
    assert g.batch_size == 6 and g.name == "make"


@pytest.mark.parametrize("body, spec_suffix, message", [
    ("def make():\n    return 1, 2\n", ":make", "must return (model, example_inputs)"),
    ("def make():\n    raise RuntimeError('no GPU here')\n", ":make", "make() raised RuntimeError: no GPU here"),
    ("def build():\n    pass\n", ":make", "has no function 'make'; functions defined there: build"),
    ("import torch\ndef make():\n    return torch.nn.Linear(2, 2), ('text',)\n", ":make",
     "example_inputs must be a tensor, a tuple of inputs or a dict of keyword inputs"),
    ("import torch\ndef make():\n    return torch.nn.Linear(2, 2), (torch.randn(2, 2),)\n", ":make",
     "takes no `batch` parameter"),
    ("this is not python\n", ":make", "importing"),
    ("def make():\n    pass\n", "", "names no factory"),
])
def test_factory_errors(tmp_path, body, spec_suffix, message):
    p = write(tmp_path, body)
    batch = 4 if "batch" in message else None
    with pytest.raises(ModelSpecError) as e:
        load_model(f"{p}{spec_suffix}", batch=batch)
    assert message in str(e.value)


def test_missing_files_and_unknown_form(tmp_path):
    with pytest.raises(ModelSpecError, match="file not found"):
        load_model(str(tmp_path / "nope.py") + ":make")
    with pytest.raises(ModelSpecError, match="file not found"):
        load_model(str(tmp_path / "nope.onnx"))
    with pytest.raises(ModelSpecError, match="use zoo:NAME"):
        load_model("resnet50")


def test_hf_factory_example():
    """The example factory file builds BERT from a config; torch.export captures it."""
    pytest.importorskip("transformers", reason="the zoo extra (transformers) is not installed")
    m = load_model("examples/hf_factory.py:bert", batch=2)
    g = m.capture()
    assert g.source == "torch.export"
    assert g.param_bytes() == sum(p.numel() * 4 for p in m.model.parameters())
    assert any(n.op == "aten.embedding.default" for n in g.ops)
