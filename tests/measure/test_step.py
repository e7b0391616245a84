"""measure_step: a real training step's time and memory (the cost model's ground truth)."""

import json
from collections import OrderedDict

import pytest
import torch
from torch import nn

import tensoropt.zoo
from tensoropt.errors import ProfileError, TensorOptError
from tensoropt.measure.step import StepMeasurement, measure_step, training_loss

BATCH, IN, HIDDEN, OUT = 512, 64, 256, 10


def mlp():
    """3 linear layers whose activations (batch 512 × 256) outweigh the parameters, so the peak
    is in the backward for every optimizer and Adam's state adds to it unchanged."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, OUT))
    return model, (torch.randn(BATCH, IN),)


def nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


PARAM_BYTES = 4 * (IN * HIDDEN + HIDDEN + HIDDEN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT)


@pytest.fixture(scope="module")
def mlp_runs():
    out = {}
    for opt in ("sgd", "momentum", "adam"):
        model, inputs = mlp()
        out[opt] = measure_step(model, inputs, optimizer=opt, repeats=5, warmup=1,
                                crosscheck=(opt == "adam"))
    return out


def test_mlp_peak_holds_params_grads_and_activations(mlp_runs):
    m = mlp_runs["sgd"]
    assert isinstance(m, StepMeasurement)
    assert nbytes(mlp()[0].parameters()) == PARAM_BYTES
    assert m.breakdown["parameter"] == PARAM_BYTES          # exactly
    assert m.breakdown["buffer"] == 0
    assert m.breakdown["input"] == BATCH * IN * 4
    assert m.baseline_bytes == PARAM_BYTES + BATCH * IN * 4
    assert sum(m.breakdown.values()) == m.peak_bytes
    assert m.peak_bytes >= 2 * PARAM_BYTES                   # parameters + gradients at least
    # the peak is in the backward, with the saved activations still counted as "activation"
    assert m.peak_phase == "backward"
    assert m.breakdown["activation"] > 0 and m.breakdown["temp"] > 0
    # saved for backward at the end of the forward: both ReLU outputs (each also the next
    # Linear's saved input) and the 4-byte loss; the logits are dropped
    assert m.saved_activation_bytes == 2 * BATCH * HIDDEN * 4 + 4


def test_optimizer_state_adds_alpha_times_params(mlp_runs):
    sgd, momentum, adam = mlp_runs["sgd"], mlp_runs["momentum"], mlp_runs["adam"]
    assert sgd.breakdown["optimizer"] == 0
    assert momentum.breakdown["optimizer"] == PARAM_BYTES   # one momentum buffer per parameter
    assert abs((momentum.peak_bytes - sgd.peak_bytes) - PARAM_BYTES) <= 0.1 * PARAM_BYTES
    assert abs((adam.peak_bytes - sgd.peak_bytes) - 2 * PARAM_BYTES) <= 0.1 * 2 * PARAM_BYTES
    # Adam's two moments plus one 4-byte step counter per parameter tensor
    assert adam.breakdown["optimizer"] == 2 * PARAM_BYTES + 6 * 4
    for m in mlp_runs.values():
        assert m.breakdown["parameter"] == PARAM_BYTES
        assert m.optimizer in ("sgd", "momentum", "adam")


def test_tracker_peak_agrees_with_profiler_allocations(mlp_runs):
    m = mlp_runs["adam"]
    assert m.profiler_peak_bytes is not None
    assert abs(m.profiler_peak_bytes - m.peak_bytes) <= 0.01 * m.peak_bytes


def test_times(mlp_runs):
    for m in mlp_runs.values():
        assert len(m.times_s) == 5 and all(t > 0 for t in m.times_s)
        assert m.time_s > 0 and m.forward_s > 0 and m.backward_s > 0
        # each phase is timed inside its step, so each phase's median is at most the steps' (order
        # statistics keep a step-by-step bound); their sum against 1.5 steps failed under load
        assert m.forward_s <= m.time_s and m.backward_s <= m.time_s
        assert m.device == "cpu" and m.threads == torch.get_num_threads()
        d = m.to_dict()
        assert json.loads(json.dumps(d)) == d
        assert d["time_s"] == m.time_s and d["breakdown"] == m.breakdown


def test_zoo_gpt2_integer_inputs():
    model, inputs = tensoropt.zoo.build("gpt2", {}, tiny=True)
    ids = inputs[0]
    assert not ids.is_floating_point()
    m = measure_step(model, inputs, optimizer="adam", repeats=2, warmup=1)
    assert m.breakdown["parameter"] == nbytes({id(p): p for p in model.parameters()}.values())
    assert m.breakdown["input"] == nbytes([ids])           # ids stay int64
    assert m.peak_bytes >= 4 * m.breakdown["parameter"]    # params + grads + 2 moments
    assert m.time_s > 0


def test_buffers_tied_weights_and_side_effects(small_cnn, tied_lm):
    model, inputs = small_cnn
    model.eval()
    m = measure_step(model, inputs, optimizer="momentum", repeats=1, warmup=1)
    assert m.breakdown["buffer"] == nbytes(model.buffers()) > 0    # batch-norm statistics
    assert m.breakdown["parameter"] == nbytes(model.parameters())  # the unused head too
    assert not model.training                                       # mode restored
    assert all(p.grad is None for p in model.parameters())

    model, inputs = tied_lm
    m = measure_step(model, inputs, repeats=1, warmup=0)
    assert m.breakdown["parameter"] == nbytes(model.parameters())  # shared weight once
    assert m.peak_bytes >= 2 * m.breakdown["parameter"]


def test_memory_off():
    model, inputs = mlp()
    m = measure_step(model, inputs, repeats=1, warmup=0, memory=False)
    assert m.peak_bytes == 0 and m.breakdown == {} and m.time_s > 0


def test_training_loss_nested_outputs():
    a = torch.randn(3, 4, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[100, 200]])                    # would add 150 if it were counted
    mask = torch.tensor([True, False])
    loss = training_loss({"logits": a, "ids": ids, "rest": (b, [mask, "text", None])})
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert torch.allclose(loss, a.mean() + b.float().mean())
    loss.backward()
    assert torch.allclose(a.grad, torch.full_like(a, 1 / a.numel()))   # the seed: 1/numel
    assert torch.allclose(training_loss((a, ids)), a.mean())
    assert torch.allclose(training_loss(OrderedDict(x=a)), training_loss(a))
    with pytest.raises(ProfileError, match="no floating-point tensor"):
        training_loss((ids, mask))


def test_bad_input_is_a_clear_error():
    model, inputs = mlp()
    with pytest.raises(ProfileError, match=r"unknown optimizer 'rmsprop'.*sgd, momentum, adam"):
        measure_step(model, inputs, optimizer="rmsprop")
    assert issubclass(ProfileError, TensorOptError)
    with pytest.raises(ProfileError, match="repeats"):
        measure_step(model, inputs, repeats=0)
    with pytest.raises(ProfileError, match="bad device"):
        measure_step(model, inputs, device="gpu0")
    with pytest.raises(ProfileError, match="not supported"):
        measure_step(model, inputs, device="meta")
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ProfileError, match="no trainable parameter"):
        measure_step(frozen, (torch.randn(1, 2),))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_without_cuda():
    model, inputs = mlp()
    with pytest.raises(ProfileError, match="CUDA is not available"):
        measure_step(model, inputs, device="cuda")
