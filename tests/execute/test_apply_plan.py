"""apply_plan: every plan trains the model exactly as the model itself does (float64)."""

import copy

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensoropt
from tensoropt import ExecutionError, NodeConfig, Plan, PlanError, apply_plan
from tensoropt.execute import compare_with_model, parse_device_map

from .conftest import every_split_kind, fresh

TOL = 1e-5


def check_plan(case, plan):
    """Loss, gradients and buffers equal the model's; one SGD step leaves the same parameters."""
    model, inputs = fresh(case)
    reference = copy.deepcopy(model)
    planned = apply_plan(model, inputs, plan, graph=case[2])
    cmp = compare_with_model(reference, planned, inputs)
    assert cmp.max_rel_diff < TOL, (cmp.worst, cmp.max_rel_diff)
    for m in (reference, planned):
        torch.optim.SGD(m.parameters(), lr=0.1).step()
    ref = dict(reference.named_parameters())
    for name, p in planned.named_parameters():
        assert torch.allclose(p, ref[name], rtol=TOL, atol=1e-12), name
    return planned


@pytest.mark.parametrize("name", ["cnn", "tied", "vgg16", "gpt2"])
@pytest.mark.parametrize("algo", ["dp", "m-topo", "m-etf", "m-sct"])
def test_baseline_plans_train_like_the_model(cases, titan, name, algo):
    _, _, graph, costs = cases[name]
    plan = tensoropt.place(graph, costs, titan, algo, devices=["gpu0", "gpu1"])
    planned = check_plan(cases[name], plan)
    # every node runs as planned: views whose sizes come from the batch (GPT-2's attention
    # reshapes) are split too, with the shard's own batch size, not run whole
    assert planned.fallbacks == []


@pytest.mark.parametrize("name", ["cnn", "vgg16", "gpt2"])
def test_frontier_extremes_train_like_the_model(cases, titan, name):
    _, _, graph, costs = cases[name]
    fr = tensoropt.track_frontier(graph, costs, titan)
    for point in (fr.min_time(), fr.min_memory()):
        check_plan(cases[name], point.plan)


def test_every_split_kind_on_a_cnn_is_exact_and_visible_in_the_code(cases):
    """Batch split (batch norm exact over the whole batch), channel split, partial sums, recompute."""
    planned = check_plan(cases["cnn"], every_split_kind(cases["cnn"][2]))
    code = planned.graph_module.code
    for piece in (".to(", "split_pieces", "torch.cat", "run_checkpointed", "add"):
        assert piece in code, piece
    assert planned.fallbacks == []


def test_views_split_along_channels_reshape_their_pieces_exactly(cases):
    # every GPT-2 view that carries features split along them, everything else whole on both
    # devices: each view reads a piece cut from a whole tensor (not contiguous), reshaped
    _, _, graph, costs = cases["gpt2"]
    mesh = ("gpu0", "gpu1")
    views = {n.name for n in graph.ops if n.metadata_only and ("channel", 2) in costs[n.name].shards}
    assert any(graph.nodes[v].op == "aten.view.default" for v in views)
    plan = Plan({n.name: NodeConfig(mesh, "channel" if n.name in views else "R") for n in graph.ops},
                graph_fingerprint=graph.fingerprint, order=[n.name for n in graph.ops])
    planned = check_plan(cases["gpt2"], plan)
    assert planned.fallbacks == []
    assert "torch.ops.aten.reshape.default" in planned.graph_module.code


def test_a_parameter_used_on_two_devices_gets_both_gradients(cases):
    """The tied embedding / projection weight is read on gpu0 and gpu1: autograd sums both."""
    _, _, graph, _ = cases["tied"]
    configs = {n.name: NodeConfig(("gpu1",) if n.op.endswith("linear.default") else ("gpu0",)) for n in graph.ops}
    readers = {graph.params["embed.weight"].owner, *graph.params["embed.weight"].readers}
    assert {configs[r].devices for r in readers} == {("gpu0",), ("gpu1",)}
    check_plan(cases["tied"], Plan(configs, graph_fingerprint=graph.fingerprint))


def test_the_planned_module_owns_the_model_parameters(cases):
    model, inputs = fresh(cases["cnn"])
    graph = cases["cnn"][2]
    plan = Plan({n.name: NodeConfig(("gpu0",)) for n in graph.ops}, graph_fingerprint=graph.fingerprint)
    planned = apply_plan(model, inputs, plan, graph=graph)
    assert [id(p) for p in planned.parameters()] == [id(p) for p in model.parameters()]
    assert list(planned.state_dict()) == list(model.state_dict())
    before = model.bn.num_batches_tracked.item()
    planned(*inputs)
    assert model.bn.num_batches_tracked.item() == before + 1   # running statistics updated once


def test_a_one_device_plan_holds_what_the_model_holds(cases):
    """Every node whole on one device: the planned step's peak is the model's to the byte, and
    stays so after a step under MemTracker (its module hooks must not reach the parameters:
    they made autograd copy every gradient into .grad instead of taking it over)."""
    from tensoropt.measure.step import measure_step

    model, inputs = fresh(cases["gpt2"])
    graph = cases["gpt2"][2]
    reference = measure_step(copy.deepcopy(model), inputs, repeats=1, warmup=1).peak_bytes
    planned = apply_plan(model, inputs, _one_device_plan(graph), graph=graph)
    for _ in range(2):
        assert measure_step(planned, inputs, repeats=1, warmup=1).peak_bytes == reference
    assert all(not p._backward_hooks for p in planned.parameters())


@st.composite
def random_plan(draw, graph, costs, devices=("gpu0", "gpu1", "gpu2", "gpu3")):
    configs = {}
    for n in graph.ops:
        layout, k = draw(st.sampled_from(sorted({("R", 1), *costs.legal(n.name)})))
        mesh = draw(st.permutations(devices))[:k]
        configs[n.name] = NodeConfig(tuple(mesh), layout if k > 1 else "R", draw(st.booleans()))
    return Plan(configs, graph_fingerprint=graph.fingerprint)


@pytest.mark.parametrize("name", ["cnn", "tied"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_valid_plans_train_like_the_model(cases, name, data):
    _, _, graph, costs = cases[name]
    check_plan(cases[name], data.draw(random_plan(graph, costs)))


# ---- bad input: a clear error before any step ----------------------------------------------

def _one_device_plan(graph, device="gpu0"):
    return Plan({n.name: NodeConfig((device,)) for n in graph.ops}, graph_fingerprint=graph.fingerprint)


def test_another_models_plan_is_refused(cases):
    model, inputs = fresh(cases["cnn"])
    with pytest.raises(PlanError, match="fingerprint"):
        apply_plan(model, inputs, _one_device_plan(cases["tied"][2]), graph=cases["cnn"][2])


def test_a_device_map_missing_a_plan_device_is_refused(cases):
    model, inputs = fresh(cases["cnn"])
    with pytest.raises(ExecutionError, match="no entry for plan device.*gpu0"):
        apply_plan(model, inputs, _one_device_plan(cases["cnn"][2]), device_map={"gpu1": "cpu"}, graph=cases["cnn"][2])
    with pytest.raises(ExecutionError, match="PLAN_DEVICE=TORCH_DEVICE"):
        parse_device_map("gpu0:cuda0")


def test_a_cuda_device_that_does_not_exist_is_refused(cases, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    model, inputs = fresh(cases["cnn"])
    with pytest.raises(ExecutionError, match="cuda:3, which does not exist.*1 CUDA device"):
        apply_plan(model, inputs, _one_device_plan(cases["cnn"][2]), device_map={"gpu0": "cuda:3"},
                   graph=cases["cnn"][2])


def test_a_plan_larger_than_the_gpu_is_refused(cases, monkeypatch):
    class Props:
        total_memory = 2**20

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props)
    model, inputs = fresh(cases["cnn"])
    plan = _one_device_plan(cases["cnn"][2]).with_estimate(
        tensoropt.Estimate("simulator", 0.1, {"gpu0": 3 * 2**20}))
    with pytest.raises(ExecutionError, match="needs 0.00 GiB on cuda:0.*has 0.00 GiB"):
        apply_plan(model, inputs, plan, device_map={"gpu0": "cuda:0"}, graph=cases["cnn"][2])


class BatchGather(torch.nn.Module):
    """Hugging Face's mask gather: ``x[arange(B)[:, None], j]`` — index tensors that carry the batch."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        rows = torch.arange(x.shape[0], device=x.device)[:, None]
        cols = torch.arange(3, device=x.device)[None, :] * 2
        picked = torch.cumsum(x, dim=1)[rows, cols]            # (B, 3): row b of x's cumsum
        return self.lin(x) * picked.sum(dim=1, keepdim=True)


def test_an_index_gathering_along_the_batch_splits_by_its_index_tensors():
    # each shard gathers its block of the output from the whole source: split by the index
    # tensors (their pieces hold global row numbers), the source read whole
    from tensoropt.planmodel.reshard import R, edge_reshard, reads_whole

    from .conftest import make_case

    torch.manual_seed(0)
    case = make_case(BatchGather(), (torch.randn(4, 6),))
    graph = case[2]
    index = next(n for n in graph.ops if n.op == "aten.index.Tensor")
    assert index.split.batch == 0
    source, rows = index.inputs[0], index.inputs[1]
    assert reads_whole(graph, index, source) and not reads_whole(graph, index, rows)
    mesh = ("gpu0", "gpu1")
    batch = NodeConfig(mesh, "batch")
    titan = tensoropt.load_cluster("preset:titan-rtx-5").without_kinds()
    assert edge_reshard(graph, source, index.name, batch, batch, titan).dst_layout == R     # gathered
    assert edge_reshard(graph, rows, index.name, NodeConfig(mesh, "R"), batch, titan).time_s == 0  # a local cut
    configs = {n.name: NodeConfig(mesh, "batch" if n.split.batch is not None else "R") for n in graph.ops}
    assert configs[index.name].layout == "batch"
    plan = Plan(configs, graph_fingerprint=graph.fingerprint, order=[n.name for n in graph.ops])
    planned = check_plan(case, plan)
    assert planned.fallbacks == []
