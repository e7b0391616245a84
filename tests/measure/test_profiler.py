"""tensoropt.profile: every op measured alone, forward and backward, at every shard shape (the
isolated figures: ``in_sequence=False``; the in-sequence ones are tests/measure/test_sequence.py)."""

import json

import pytest
import torch

import tensoropt
from tensoropt.errors import GraphFormatError, ProfileError
from tensoropt.measure import CostModel, profile


@pytest.fixture
def cnn_profile(small_cnn):
    model, inputs = small_cnn
    graph = tensoropt.capture(model, inputs)
    return graph, profile(graph, shard_degrees=(1, 2, 4), repeats=2, cache=False, in_sequence=False)


def by_op(graph, costs, op):
    return [costs[n.name] for n in graph.ops if n.op == op]


def test_every_op_has_a_cost_and_views_are_free(cnn_profile):
    graph, costs = cnn_profile
    assert set(costs.nodes) == {n.name for n in graph.ops}
    for n in graph.ops:
        c = costs[n.name]
        if n.metadata_only:
            assert c.method == "free" and c.fp_s == 0 and c.bp_s == 0
        else:
            assert c.method in ("measured", "cached") and c.fp_s > 0
    conv, = by_op(graph, costs, "aten.conv2d.default")
    assert conv.bp_s > 0 and conv.flops == 2 * 4 * 8 * 14 * 14 * 3 * 3 * 3  # + bias adds are not counted


class Views(torch.nn.Module):
    """Two (B, T, C) -> (B·T, C) views: 8 features split in two, 9 do not split evenly."""

    def __init__(self):
        super().__init__()
        self.even, self.odd = torch.nn.Linear(8, 8), torch.nn.Linear(8, 9)

    def forward(self, x):
        b, t, _ = x.shape
        return self.even(x).view(b * t, 8), self.odd(x).view(b * t, 9)


def test_a_view_is_split_along_its_channels_only_where_the_executors_can(tmp_path):
    # a view whose features stay last (GPT-2's (B·T, 4C) -> (B, T, 4C)) splits along them —
    # the shape argument's feature entry halved — where the halves are equal; otherwise the
    # executors run it whole on one device, so the profile offers no free channel shard for it
    from tensoropt.execute.rewrite import rewrite
    from tensoropt.plan import NodeConfig, Plan

    graph = tensoropt.capture(Views(), (torch.randn(4, 3, 8),))
    costs = profile(graph, shard_degrees=(1, 2), repeats=1, cache=tmp_path, in_sequence=False)
    views = {n.outputs[0].shape[-1]: n.name for n in graph.ops if n.metadata_only and n.split.channel is not None}
    assert sorted(views) == [8, 9]
    assert ("channel", 2) in costs[views[8]].shards and ("channel", 2) not in costs[views[9]].shards
    mesh = ("d0", "d1")
    plan = Plan({n.name: NodeConfig(mesh, "channel" if n.name in views.values() else "R") for n in graph.ops},
                graph_fingerprint=graph.fingerprint, order=[n.name for n in graph.ops])
    whole = {f.split(" ")[0] for f in rewrite(graph, plan, lambda d: torch.device("cpu")).fallbacks}
    assert whole == {views[9]}                                      # the executors agree
    assert all(("batch", 2) in costs[v].shards for v in views.values())     # a batch split always runs


def test_saved_tensors_are_attributed(cnn_profile):
    graph, costs = cnn_profile
    conv, = by_op(graph, costs, "aten.conv2d.default")
    relu, = by_op(graph, costs, "aten.relu.default")
    bn, = by_op(graph, costs, "aten.batch_norm.default")
    assert conv.saved_inputs == ("x",)             # the weight gradient needs the input image
    assert relu.saves_output and not relu.saved_inputs
    assert bn.extra_saved_bytes >= 2 * 8 * 4        # per-channel mean and inverse std
    assert conv.output_bytes == 4 * 8 * 14 * 14 * 4


def test_a_backward_s_intermediate_results_are_its_scratch_on_any_device():
    # pow's backward is grad · (3 · x.pow(2)): x.pow(2) and 3 · that (64 × 32 float32, 8 KiB each) alive
    # beside the gradient it returns — 16 KiB of scratch on the CPU as on a GPU; a linear's backward
    # returns what it makes (none), and a float32 weight read in bfloat16 casts its bfloat16 gradient in
    # a node of its own, after the matmul's node has returned (none either)
    class Cube(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(32))
            self.proj = torch.nn.Linear(32, 32)

        def forward(self, x):
            return self.proj((x * self.w).pow(3))

    model, x = Cube(), torch.randn(64, 32)
    for precision in ("fp32", "bf16"):
        graph = tensoropt.capture(model, (x,), precision=precision)
        costs = profile(graph, shard_degrees=(1,), repeats=1, cache=False, in_sequence=False, timed=False)
        pow_op, = by_op(graph, costs, "aten.pow.Tensor_Scalar")
        linear, = by_op(graph, costs, "aten.linear.default")
        # (autocast leaves the pow in float32)
        assert (pow_op.workspace_bytes, linear.workspace_bytes) == (2 * 64 * 32 * 4, 0), precision


def test_shards_are_measured_at_their_shapes(cnn_profile):
    graph, costs = cnn_profile
    conv, = by_op(graph, costs, "aten.conv2d.default")
    head = costs[[n.name for n in graph.ops if n.op == "aten.linear.default"][0]]
    for layout in ("batch", "channel", "reduce"):
        assert conv.shards[(layout, 2)].method in ("measured", "cached")
    assert conv.shards[("batch", 2)].output_bytes == conv.output_bytes // 2
    assert conv.shards[("channel", 4)].output_bytes == conv.output_bytes // 4
    assert conv.shards[("reduce", 2)].output_bytes == conv.output_bytes     # partial sums are full-sized
    assert head.shards[("channel", 2)].output_bytes == head.output_bytes // 2
    # a batch-norm keeps exact per-channel semantics when its channels are cut
    bn, = by_op(graph, costs, "aten.batch_norm.default")
    assert bn.shards[("channel", 2)].method in ("measured", "cached")
    assert ("reduce", 2) not in bn.shards               # no partial-sum layout for a norm
    assert costs.legal(conv.name) == sorted(conv.shards)
    # its batch shard is measured as the executors run it: a synchronised batch norm's share
    # (statistics of its part, normalise with the whole batch's), not the fused op's half.  Told
    # apart by what autograd keeps, not by the clock: the synchronised share's variance
    # Σ(x − mean)² keeps the centred part (one output's worth, beside 2 × 8 channel statistics
    # of 4 bytes), the fused op only its per-channel mean and inverse std (2 × 8 × 4 = 64 bytes)
    batch = bn.shards[("batch", 2)]
    assert batch.method in ("measured", "cached")
    assert bn.extra_saved_bytes == 2 * 8 * 4
    assert batch.extra_saved_bytes >= batch.output_bytes == bn.output_bytes // 2


def test_a_shard_backward_computes_every_gradient_training_does(small_cnn, monkeypatch):
    # a weight cut for a shard is a plain tensor, not a Parameter: its backward must still
    # compute the weight gradient (the partial-sum shard of a conv was once timed with the
    # input gradient only: half its backward, on every plan that cuts the input channels)
    from tensoropt.measure import profiler

    calls = []
    real = profiler._measure_call

    def spy(fn, args, kwargs, grad_flags, param_flags, *rest):
        shapes = [tuple(t.shape) for t in profiler._tensors((args, kwargs))]
        calls.append((str(fn), shapes, list(grad_flags), list(param_flags)))
        return real(fn, args, kwargs, grad_flags, param_flags, *rest)

    monkeypatch.setattr(profiler, "_measure_call", spy)
    model, inputs = small_cnn
    graph = tensoropt.capture(model, inputs)
    profile(graph, shard_degrees=(1, 2), repeats=1, cache=False, in_sequence=False)
    convs = [c for c in calls if "conv2d" in c[0]]
    assert len(convs) == 4                                  # whole, batch, channel, reduce halves
    for _, shapes, grads, params in convs:
        weight = params.index(True)
        assert grads[weight], f"no weight gradient timed for the conv shard of shapes {shapes}"
    # the partial-sum shard: input channels cut (3 -> 2), the weight's too
    reduce_, = [c for c in convs if c[1][0][1] < inputs[0].shape[1]]
    # input (the image: no gradient in training, so none timed), weight, bias
    assert reduce_[1][1][1] == 2 and reduce_[2] == [False, True, True]


def test_a_shard_the_cache_lacks_is_measured_not_scaled(small_cnn, tmp_path):
    model, inputs = small_cnn
    graph = tensoropt.capture(model, inputs)
    profile(graph, shard_degrees=(1,), repeats=1, cache=tmp_path, in_sequence=False)
    # every degree-1 call is cached now; degree 2 is not: the cache-only walk misses and the
    # profiler measures (it once fell back to 1/2 of the whole op, marked "scaled")
    costs = profile(graph, shard_degrees=(1, 2), repeats=1, cache=tmp_path, in_sequence=False)
    assert not costs.settings["from_cache_only"]
    assert all(sc.method == "measured" for c in costs.nodes.values() for (_, k), sc in c.shards.items() if k == 2)


def test_identical_calls_are_measured_once_and_cached_on_disk(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 16),
                                torch.nn.ReLU())
    graph = tensoropt.capture(model, (torch.randn(8, 16),))
    first = profile(graph, shard_degrees=(1, 2), repeats=2, cache=tmp_path, in_sequence=False)
    lin = [first[n.name] for n in graph.ops if n.op == "aten.linear.default"]
    # the first Linear reads the batch, which gets no gradient in training: another call than
    # the next two, whose inputs do
    assert [c.method for c in lin] == ["measured", "measured", "cached"]
    assert lin[1].fp_s == lin[2].fp_s
    again = profile(graph, shard_degrees=(1, 2), repeats=2, cache=tmp_path, in_sequence=False)
    assert again.settings["measured_calls"] == 0 and again.settings["cached_calls"] > 0
    assert again.settings["from_cache_only"] and not first.settings["from_cache_only"]
    assert again.device["peak_flops"] == first.device["peak_flops"]   # the device as measured then
    assert {n: c.fp_s for n, c in again.nodes.items()} == {n: c.fp_s for n, c in first.nodes.items()}
    assert all(c.method in ("cached", "free") for c in again.nodes.values())
    fresh = profile(graph, shard_degrees=(1, 2), repeats=2, cache=False)
    assert fresh.settings["measured_calls"] > 0


def test_profile_json_round_trip_and_fingerprint(cnn_profile, tmp_path, tied_lm):
    graph, costs = cnn_profile
    path = tmp_path / "profile.json"
    costs.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == "tensoropt.profile/1" and data["graph_fingerprint"] == graph.fingerprint
    for node in data["nodes"]:
        assert {"name", "op", "fp_s", "bp_s", "output_bytes", "saved_bytes", "param_bytes"} <= set(node)
    back = CostModel.load(path, graph)
    assert back.to_dict() == costs.to_dict()
    other = tensoropt.capture(*tied_lm)
    with pytest.raises(ProfileError) as e:
        CostModel.load(path, other)
    assert graph.fingerprint[:12] in str(e.value) and other.fingerprint[:12] in str(e.value)
    assert "tensoropt profile" in str(e.value)


def test_malformed_profile_names_the_field(cnn_profile, tmp_path):
    _, costs = cnn_profile
    d = costs.to_dict()
    d["nodes"][0]["fp_s"] = -1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    with pytest.raises(GraphFormatError, match=r"nodes\[0\].*fp_s must be a non-negative number"):
        CostModel.load(path)


def test_a_graph_without_its_module_cannot_be_profiled(cnn_profile, tmp_path):
    graph, _ = cnn_profile
    graph.save(tmp_path / "g.json")
    with pytest.raises(ProfileError, match="no captured module"):
        profile(tensoropt.OpGraph.load(tmp_path / "g.json"))
    with pytest.raises(ProfileError, match="no CUDA GPU"):
        if torch.cuda.is_available():
            pytest.skip("a GPU is present: the no-GPU message cannot be checked here")
        profile(graph, device="cuda")


def test_fx_captured_modules_are_profiled_with_their_parameters(small_cnn):
    model, inputs = small_cnn
    graph = tensoropt.capture(model, inputs, method="fx")
    before = model.bn.running_mean.clone()
    costs = profile(graph, shard_degrees=(1, 2), repeats=2, cache=False)
    conv = costs[[n.name for n in graph.ops if n.module_type.endswith("Conv2d") or "conv" in n.name][0]]
    assert conv.fp_s > 0 and conv.bp_s > 0          # backward computes the module's weight gradient
    assert torch.equal(model.bn.running_mean, before)  # profiling does not touch the user's buffers


def test_profiling_leaves_the_model_untouched(small_cnn):
    model, inputs = small_cnn
    graph = tensoropt.capture(model, inputs)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    profile(graph, shard_degrees=(1, 2), repeats=1, cache=False)
    for k, v in model.state_dict().items():
        assert torch.equal(v, state[k]), k


def test_roofline_estimate_uses_flops_and_bandwidth():
    from tensoropt.measure.profiler import _roofline

    x, w = torch.randn(64, 128), torch.randn(256, 128)
    m = _roofline(torch.ops.aten.linear.default, (x, w), {}, [True, True], {"peak_flops": 1e9, "memory_Bps": 1e12})
    assert m.method == "roofline" and m.flops == 2 * 64 * 128 * 256
    assert m.fp_s == pytest.approx(m.flops / 1e9) and m.bp_s == pytest.approx(2 * m.fp_s)
    slow_memory = _roofline(torch.ops.aten.linear.default, (x, w), {}, [False, False],
                            {"peak_flops": 1e15, "memory_Bps": 1e6})
    assert slow_memory.fp_s == pytest.approx((x.nbytes + w.nbytes + 64 * 256 * 4) / 1e6) and slow_memory.bp_s == 0


def test_a_busy_machine_is_reported():
    from tensoropt.measure.profiler import busy_warning

    quiet = CostModel({}, graph_fingerprint="0" * 64, settings={"load_average": [1.1, 1.3], "cpu_count": 2})
    busy = CostModel({}, graph_fingerprint="0" * 64, settings={"load_average": [1.0, 4.2], "cpu_count": 2})
    assert busy_warning(quiet) is None
    assert "load average up to 4.2 on 2 cores" in busy_warning(busy)
