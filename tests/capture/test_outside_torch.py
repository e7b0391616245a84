"""A model that draws random numbers outside torch in ``forward`` is refused at capture, naming
the module and the way out (tensoropt.capture.outside_torch): the graph would keep one draw as a
constant.  The models follow what real ones do: WavLM's SpecAugment draws its time mask with
``np.random`` in every forward; LayerDrop with Python's ``random``; a generator made in forward."""

import random

import numpy as np
import pytest
import torch

import tensoropt
from tensoropt.errors import CaptureError, TensorOptError


class SpecAugment(torch.nn.Module):
    """Zeroes whole time steps, the mask drawn as WavLM's ``_compute_mask_indices`` draws it."""

    def __init__(self, mask_time_prob: float, how: str = "legacy"):
        super().__init__()
        self.mask_time_prob, self.how = mask_time_prob, how

    def forward(self, x):
        if self.mask_time_prob > 0:
            steps = x.shape[1]
            drawn = np.random.rand(steps) if self.how == "legacy" else np.random.default_rng().random(steps)
            mask = torch.from_numpy(drawn < self.mask_time_prob)
            x = x.masked_fill(mask[None, :, None], 0.0)
        return x


class Encoder(torch.nn.Module):
    def __init__(self, mask_time_prob: float, how: str = "legacy"):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.augment = SpecAugment(mask_time_prob, how)
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(self.augment(self.proj(x))).sum()


class LayerDrop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            if random.random() >= 0.1:          # as fairseq / wav2vec 2.0 skip a layer in training
                x = layer(x)
        return x.sum()


class TorchNoise(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return (self.proj(x) * (torch.rand_like(x) < 0.5)).sum()


X = torch.randn(4, 10, 8)


@pytest.mark.parametrize("how", ["legacy", "default_rng"])
def test_a_numpy_mask_drawn_in_forward_is_refused_naming_the_module_and_the_way_out(how):
    with pytest.raises(CaptureError) as info:
        tensoropt.capture(Encoder(0.5, how), (X,))
    msg = str(info.value)
    assert msg.startswith("module 'augment' (SpecAugment) draws random numbers with numpy in forward")
    assert "mask_time_prob=0" in msg and "torch.rand" in msg and "\n" not in msg
    assert isinstance(info.value, TensorOptError) and info.value.exit_code == 2


def test_with_the_draw_switched_off_the_same_model_captures():
    graph = tensoropt.capture(Encoder(0.0), (X,))
    assert sum("linear" in n.op or "addmm" in n.op for n in graph.ops) == 2


def test_python_random_in_forward_is_refused_at_the_enclosing_module():
    """The draws happen in LayerDrop's own forward (not in a child's): it is the one named."""
    with pytest.raises(CaptureError, match=r"^module '<root>' \(LayerDrop\) draws random numbers with Python's "
                                           r"random in forward"):
        tensoropt.capture(LayerDrop(), (X,))


def test_torchs_own_draws_are_operators_and_captured():
    graph = tensoropt.capture(TorchNoise(), (X,))
    assert any("rand" in n.op for n in graph.ops)


def test_the_generators_are_as_they_were_after_a_refusal():
    made = np.random.default_rng
    with pytest.raises(CaptureError):
        tensoropt.capture(Encoder(0.5, "default_rng"), (X,))
    assert np.random.default_rng is made
    tensoropt.capture(Encoder(0.0), (X,))          # no hook left behind: nothing found now
