"""A model on the meta device (too large to materialise) is profiled on FakeTensors only: each
operator's memory and work, untimed.  The reference is outside the fake path: the same model
built with real weights and profiled on real tensors (``timed=False``) must give the very same
per-operator figures, in fp32 and under bf16 autocast."""

import pytest
import torch

import tensoropt
from tensoropt.errors import CaptureError, ProfileError
from tensoropt.measure import profile, profiler
from tensoropt.measure.feed import runs_on_fake
from tensoropt.zoo.hf import Logits

transformers = pytest.importorskip("transformers")


def llama(meta: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    """A two-block Llama (RMSNorm, rotary embeddings, grouped-query SDPA attention, SwiGLU) and a
    batch of ids, built on the meta device or with real (seeded) weights."""
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   use_cache=False)
    torch.manual_seed(0)
    with torch.device("meta" if meta else "cpu"):
        model = transformers.LlamaForCausalLM(cfg)
        ids = torch.zeros(4, 32, dtype=torch.long)
    return Logits(model, use_cache=False), ids


class ConvNet(torch.nn.Module):
    """Convolution, batch norm (buffers updated in training), dropout (a saved mask), a linear head."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.drop = torch.nn.Dropout(0.1)
        self.head = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.head(self.drop(torch.relu(self.bn(self.conv(x)))).flatten(1))


def convnet(meta: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    with torch.device("meta" if meta else "cpu"):
        return ConvNet(), torch.randn(4, 3, 8, 8)


@pytest.mark.parametrize("build", [llama, convnet], ids=["llama", "convnet"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_meta_model_is_the_same_graph_and_profile_as_the_model_with_real_weights(build, precision, monkeypatch):
    """Captured as its fake twin on the CPU (tensoropt.capture.fake), a model built on the meta
    device is the very graph of the same model with real weights — same fingerprint, so a plan
    made for one applies to the other — and its untimed profile, on FakeTensors only, gives every
    operator the figures a profile on real tensors gives — but where PyTorch's fake kernel itself
    differs from the CPU's: under bf16 autocast batch norm's keeps its saved mean and inverse
    deviation in bfloat16, the CPU kernel in float32 (2 statistics x 8 channels x 2 bytes less,
    checked by hand below)."""
    real = tensoropt.capture(*build(False), precision=precision)
    meta = tensoropt.capture(*build(True), precision=precision)
    assert not runs_on_fake(real) and runs_on_fake(meta)
    assert meta.fingerprint == real.fingerprint
    got = profile(meta, timed=False, cache=False, shard_degrees=(2, 4))
    # the model with weights, as a large one is profiled: on FakeTensors too (profiler.UNTIMED_ON_FAKE;
    # from 1 GiB of outputs, forced here), the same figures
    monkeypatch.setattr(profiler, "FAKE_MIN_OUTPUT_BYTES", 0)
    assert profile(real, timed=False, cache=False, shard_degrees=(2, 4)).to_dict()["nodes"] == got.to_dict()["nodes"]
    monkeypatch.setattr(profiler, "UNTIMED_ON_FAKE", False)      # and on real tensors, every operator computed
    want = profile(real, timed=False, cache=False, shard_degrees=(2, 4))
    assert list(got.nodes) == list(want.nodes)
    differ = [n for n in want.nodes if got.nodes[n].to_dict() != want.nodes[n].to_dict()]
    if build is convnet and precision == "bf16":
        assert differ == ["batch_norm"]
        bn, bn_real = got.nodes["batch_norm"], want.nodes["batch_norm"]
        assert bn_real.extra_saved_bytes - bn.extra_saved_bytes == 2 * 8 * 2
        assert bn_real.saved_bytes - bn.saved_bytes == 2 * 8 * 2
    else:
        assert differ == []
    # and it is not vacuous: the matmuls have work, the activations bytes, the shards are there
    linears = [c for c in got.nodes.values() if c.op == "aten.linear.default"]
    assert linears and all(c.work.fp_flops > 0 and c.output_bytes > 0 and c.shards for c in linears)
    if precision == "bf16":     # autocast took effect: a linear's output is bfloat16 (2 bytes an element)
        first = next(n for n in meta.ops if n.op == "aten.linear.default")
        assert first.outputs[0].dtype == "bfloat16"


def test_a_meta_model_is_never_timed():
    graph = tensoropt.capture(*llama(True))
    with pytest.raises(ProfileError, match="meta device.*device model.*smaller variant"):
        profile(graph, timed=True, cache=False)


def test_a_data_dependent_size_in_a_meta_model_names_the_operator_and_its_module():
    class Picks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            y = self.proj(x)
            return y.sum() + torch.nonzero(y > 0).float().sum()

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.picks = Picks()

        def forward(self, x):
            return self.picks(x)

    with torch.device("meta"):
        model, x = Outer(), torch.randn(4, 8)
    with pytest.raises(CaptureError, match=r"picks \(Picks\).*aten\.nonzero.*data-dependent"):
        tensoropt.capture(model, (x,))


def test_a_fused_lstm_is_profiled_on_real_tensors_whatever_its_size(monkeypatch):
    """PyTorch's fake LSTM kernel saves other tensors than the CPU's: a model with one is never
    profiled on FakeTensors (profiler._fake_pays), so its figures are the real run's."""
    lstm = torch.nn.LSTM(8, 16, batch_first=True)
    graph = tensoropt.capture(lstm, (torch.randn(4, 5, 8),))
    monkeypatch.setattr(profiler, "FAKE_MIN_OUTPUT_BYTES", 0)
    got = profile(graph, timed=False, cache=False, shard_degrees=(2,))
    monkeypatch.setattr(profiler, "UNTIMED_ON_FAKE", False)
    want = profile(graph, timed=False, cache=False, shard_degrees=(2,))
    assert got.to_dict()["nodes"] == want.to_dict()["nodes"]
    monkeypatch.setattr(profiler, "UNTIMED_ON_FAKE", True)      # and forced onto FakeTensors, it would differ
    monkeypatch.setattr(profiler, "_fake_pays", lambda graph: True)
    assert profile(graph, timed=False, cache=False, shard_degrees=(2,)).to_dict()["nodes"] != want.to_dict()["nodes"]
