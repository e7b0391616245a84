"""Every zoo model (tiny variant) captures through torch.export with exact parameter bytes."""

import importlib.util

import pytest

from tensoropt import capture, zoo
from tests.conftest import model_param_bytes

NAMES = sorted(zoo.ZOO)


@pytest.mark.parametrize("name", NAMES)
def test_capture_tiny_zoo_model(name):
    entry = zoo.get(name)
    if entry.requires and importlib.util.find_spec(entry.requires) is None:
        pytest.skip(f"{name} needs `{entry.requires}` (pip install -e .[zoo]), which is not installed")
    model, inputs = zoo.build(name, tiny=True)
    g = capture(model, inputs, name=name)
    assert g.source == "torch.export", g.notes
    # every tensor a node produces has a concrete shape and a dtype
    for n in g:
        for t in n.outputs:
            assert all(isinstance(s, int) and s >= 0 for s in t.shape) and t.dtype
    assert any(n.outputs for n in g.ops)
    # parameters: exactly the model's own bytes, each counted once
    assert g.param_bytes() == model_param_bytes(model)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert g.param_bytes("buffer") == buffers
    # the batch dimension was found symbolically on the inputs and flows to the output
    batch = inputs[0].shape[0]
    assert g.batch_size == batch
    assert all(n.outputs[0].batch_dim == 0 for n in g.inputs)
    out = g["output"]
    assert all(g[o].outputs[0].batch_dim == 0 for o in out.inputs)
    assert sum(n.split.batch is not None for n in g.ops) > len(g.ops) / 3
