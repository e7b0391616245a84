"""Mixed precision (``--precision bf16``): a graph captured under autocast, profiled under it, and
its walked memory checked against a real bf16 training step.

What bf16 means here (:mod:`tensoropt.capture.precision`): the parameters, their gradients and
AdamW's two moments stay float32 — 4 + 4 + 8 bytes per parameter — while the ops autocast lists
(linear, convolution) compute in bfloat16 on bfloat16 copies of their inputs and weights, copies
they keep for the backward: 2 more bytes per weight element while saved, for every such layer
whose input carries a gradient (a first Linear, reading the batch, computes no input gradient and
keeps no copy of its weight; a convolution keeps its copy anyway).  Activations are bfloat16:
half the bytes.
"""

import argparse
import copy

import pytest
import torch
from conftest import SmallCNN, run_cli
from torch import nn

import tensoropt
from tensoropt import OpGraph
from tensoropt.capture import precision_context
from tensoropt.errors import GraphFormatError, ModelSpecError, ProfileError, TensorOptError
from tensoropt.measure import measure_step, profile
from tensoropt.measure.profiler import check_precision
from tensoropt.planmodel import step_memory

B, IN, H, OUT = 512, 64, 256, 10     # the MLP of tests/measure/test_step.py
N_PARAMS = IN * H + H + H * H + H + H * OUT + OUT


def mlp():
    """3 linear layers, batch 512: activations (512 × 256) outweigh the parameters."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(IN, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, OUT))
    return model, (torch.randn(B, IN),)


def cnn():
    """conv → batch norm → relu → pool → mean → linear, 16 images of 3 × 32 × 32."""
    torch.manual_seed(0)
    return SmallCNN(), (torch.randn(16, 3, 32, 32),)


def linears(graph):
    return [n for n in graph.ops if n.op == "aten.linear.default"]


@pytest.fixture(scope="module")
def mlp_graphs():
    """The MLP captured in fp32 and in bf16, each with its profile (memory figures: 1 repeat)."""
    model, inputs = mlp()
    out = {}
    for precision in ("fp32", "bf16"):
        graph = tensoropt.capture(model, inputs, precision=precision)
        out[precision] = graph, profile(graph, shard_degrees=(1, 2), repeats=1)
    return out


def test_precision_context_is_autocast_for_bf16_only(mlp_graphs):
    graph16, _ = mlp_graphs["bf16"]
    with precision_context("fp32", "cpu"):
        assert not torch.is_autocast_enabled("cpu")
    with precision_context(graph16, "cpu"):     # a graph says its own precision
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")
    with pytest.raises(TensorOptError, match="precision must be one of fp32, bf16"), precision_context("fp16"):
        pass


def test_a_bf16_graph_halves_activations_keeps_fp32_weights_and_has_its_own_fingerprint(mlp_graphs, tmp_path):
    g32, _ = mlp_graphs["fp32"]
    g16, _ = mlp_graphs["bf16"]
    assert (g32.precision, g16.precision) == ("fp32", "bf16")
    for a, b in zip(linears(g32), linears(g16)):      # torch.export recorded autocast's dtypes
        assert (a.outputs[0].dtype, b.outputs[0].dtype) == ("float32", "bfloat16")
        assert b.outputs[0].nbytes * 2 == a.outputs[0].nbytes
    assert linears(g16)[1].outputs[0].nbytes == B * H * 2
    assert {p.dtype for p in g16.params.values()} == {"float32"}       # master weights
    assert g16.param_bytes() == g32.param_bytes() == 4 * N_PARAMS
    assert g16.fingerprint != g32.fingerprint
    # saved and loaded with its precision; a file from before precisions existed is fp32
    g16.save(tmp_path / "g16.json")
    back = OpGraph.load(tmp_path / "g16.json")
    assert back.precision == "bf16" and back.fingerprint == g16.fingerprint
    old = g32.to_dict()
    del old["precision"]
    assert OpGraph.from_dict(old).precision == "fp32" and OpGraph.from_dict(old).fingerprint == g32.fingerprint
    edited = g16.to_dict()
    edited["precision"] = "fp32"                   # the precision is part of the fingerprint
    with pytest.raises(GraphFormatError, match="fingerprint"):
        OpGraph.from_dict(edited)
    # a saved graph keeps its precision: asking for another one of it is an error
    with pytest.raises(ModelSpecError, match="saved in bf16, not fp32"):
        tensoropt.load_model(str(tmp_path / "g16.json")).capture(precision="fp32")
    assert tensoropt.load_model(str(tmp_path / "g16.json")).capture().precision == "bf16"


def test_a_bf16_profile_measures_under_autocast(mlp_graphs):
    g16, c16 = mlp_graphs["bf16"]
    _, c32 = mlp_graphs["fp32"]
    assert c16.settings["precision"] == "bf16" and c32.settings["precision"] == "fp32"
    first, second, last = (c16[n.name] for n in linears(g16))
    relu = next(n.name for n in g16.ops if n.op == "aten.relu.default")
    assert second.output_bytes == B * H * 2 == c32[second.name].output_bytes // 2
    # saved for backward: the bf16 input it reads (the relu's output), and the bf16 copy autocast
    # made of its float32 weight (an extra tensor: 2 bytes per weight element)
    assert second.saved_inputs == (relu,) and second.extra_saved_bytes == H * H * 2
    assert last.extra_saved_bytes == H * OUT * 2
    # the first layer reads the float32 batch: its bf16 copy is saved, its weight's is not (no
    # input gradient in training, so none is needed)
    assert first.saved_inputs == () and first.extra_saved_bytes == B * IN * 2
    # shards are measured under the same autocast
    assert second.shards[("batch", 2)].output_bytes == B // 2 * H * 2
    assert second.shards[("channel", 2)].extra_saved_bytes == H // 2 * H * 2
    assert c16.settings["in_sequence"]["used"]


def test_bf16_measurements_are_cached_apart_from_fp32_ones(tmp_path):
    # a float32 Linear run under autocast is another call than one run without: an fp32 graph
    # never takes a bf16 graph's measurements, and a bf16 graph profiled again is read from the
    # cache on FakeTensors under the same autocast
    model, inputs = mlp()
    g16 = tensoropt.capture(model, inputs, precision="bf16")
    first = profile(g16, shard_degrees=(1, 2), repeats=1, cache=tmp_path, in_sequence=False)
    again = profile(g16, shard_degrees=(1, 2), repeats=1, cache=tmp_path, in_sequence=False)
    assert again.settings["from_cache_only"] and again.settings["measured_calls"] == 0
    assert {n: c.extra_saved_bytes for n, c in again.nodes.items()} == {n: c.extra_saved_bytes
                                                                        for n, c in first.nodes.items()}
    g32 = tensoropt.capture(model, inputs)
    fp32 = profile(g32, shard_degrees=(1, 2), repeats=1, cache=tmp_path, in_sequence=False)
    alone = profile(g32, shard_degrees=(1, 2), repeats=1, cache=False, in_sequence=False)
    assert fp32.settings["measured_calls"] == alone.settings["measured_calls"] > 0   # nothing taken from bf16


def test_a_profile_of_another_precision_is_refused_naming_both(mlp_graphs, tmp_path):
    from tensoropt.cli._common import costs_for

    CPU_BOX = tensoropt.load_cluster("preset:titan-rtx-5").without_kinds()   # priced as this CPU

    g32, c32 = mlp_graphs["fp32"]
    g16, c16 = mlp_graphs["bf16"]
    check_precision(c16, g16)
    with pytest.raises(ProfileError, match=r"measured in fp32, but graph .* trains in bf16.*--precision bf16"):
        check_precision(c32, g16)
    path = tmp_path / "fp32.json"
    c32.save(path)
    with pytest.raises(ProfileError, match="measured in fp32, but graph"):   # --profile on every command
        costs_for(g16, (1,), argparse.Namespace(profile=str(path)), CPU_BOX, ["gpu0"])
    assert costs_for(g32, (1,), argparse.Namespace(profile=str(path)), CPU_BOX, ["gpu0"]).costs.graph_fingerprint \
        == g32.fingerprint


@pytest.mark.parametrize("make", [mlp, cnn], ids=["mlp", "cnn"])
def test_the_walked_bf16_peak_is_within_5_percent_of_a_measured_bf16_step(make):
    # the tolerance of tests/planmodel/test_memory.py's fp32 comparison
    model, inputs = make()
    graph = tensoropt.capture(model, inputs, precision="bf16")
    costs = profile(graph, shard_degrees=(1,), repeats=1)
    walked = step_memory(graph, costs, optimizer="adamw")["dev0"]
    real = measure_step(copy.deepcopy(model), inputs, optimizer="adamw", repeats=1, warmup=1, precision="bf16")
    assert real.precision == "bf16"
    assert walked.peak == pytest.approx(real.peak_bytes, rel=0.05), (walked, real.peak_bytes, real.breakdown)
    assert real.breakdown["parameter"] == 4 * sum(p.numel() for p in model.parameters())    # float32
    # float32 master weights in the walk too (of the layers the step runs: not SmallCNN.unused)
    assert walked.params == 4 * sum(p.numel for p in graph.params.values() if p.kind == "parameter" and p.owner)


def test_bytes_per_parameter_by_hand(mlp_graphs):
    model, inputs = mlp()
    g16, c16 = mlp_graphs["bf16"]
    walked = step_memory(g16, c16, optimizer="adamw")["dev0"]
    real = measure_step(model, inputs, optimizer="adamw", repeats=1, warmup=1, precision="bf16")
    # float32 weights 4 B + float32 gradients 4 B + AdamW's exp_avg and exp_avg_sq 8 B per parameter
    assert (walked.params, walked.grads, walked.optimizer) == (4 * N_PARAMS, 4 * N_PARAMS, 8 * N_PARAMS)
    assert real.breakdown["parameter"] == 4 * N_PARAMS
    assert real.breakdown["optimizer"] == 8 * N_PARAMS + 6 * 4        # and a 4-byte step count per tensor
    # + 2 B per weight element of the layers that keep autocast's bf16 copy for the backward: the
    # profile's extra saved bytes are those copies and the batch's bf16 copy ...
    copies = 2 * (H * H + H * OUT)
    assert sum(c16[n.name].extra_saved_bytes for n in linears(g16)) == copies + B * IN * 2
    # ... and what the real step holds at the end of its forward is exactly: both ReLU outputs in
    # bf16, the batch's bf16 copy, the weight copies and the 4-byte loss (fp32: 2·B·H·4 + 4)
    assert real.saved_activation_bytes == 2 * B * H * 2 + B * IN * 2 + copies + 4


def test_measure_step_refuses_an_unknown_precision():
    model, inputs = mlp()
    with pytest.raises(ProfileError, match="precision must be one of fp32, bf16"):
        measure_step(model, inputs, precision="fp16")


def test_cli_graph_and_profile_take_precision(capsys, tmp_path):
    out_json = tmp_path / "g.json"
    code, out, err = run_cli(capsys, "graph", "zoo:vgg16?tiny=1", "--batch", "2", "--precision", "bf16",
                             "--json", str(out_json))
    assert code == 0, err
    assert "precision bf16" in out and OpGraph.load(out_json).precision == "bf16"
    profile_json = tmp_path / "p.json"
    code, out, err = run_cli(capsys, "profile", "zoo:vgg16?tiny=1", "--batch", "2", "--degrees", "1",
                             "--repeats", "1", "--isolated", "--precision", "bf16", "-o", str(profile_json))
    assert code == 0, err
    assert "bf16" in out
    assert tensoropt.CostModel.load(profile_json).settings["precision"] == "bf16"
    with pytest.raises(SystemExit):     # argparse: one of fp32, bf16
        run_cli(capsys, "graph", "zoo:vgg16?tiny=1", "--precision", "fp16")
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


def test_a_bf16_output_s_float32_loss_gradient_is_walked():
    # the loss reads the bf16 logits as float32: their gradient exists in float32 (4 B an element)
    # beside its bf16 cast (2 B) at the start of the backward — the peak of a small LM in bf16
    torch.manual_seed(0)
    lm = tensoropt.load_model("zoo:gpt2?tiny=1&batch=32")
    g = lm.capture(precision="bf16")
    c = tensoropt.profile(g, repeats=1)
    walked = tensoropt.step_memory(g, c, optimizer="adamw")["dev0"]
    measured = measure_step(lm.model, lm.example_inputs, optimizer="adamw", precision="bf16", repeats=1, warmup=1)
    assert walked.peak_at == "loss"
    assert walked.peak == pytest.approx(measured.peak_bytes, rel=0.005)   # measured: -0.01 %
