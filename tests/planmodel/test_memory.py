"""The memory model: per-node figures and the whole-step peak, checked against a real step."""

import pytest
import torch
from conftest import ResidualMLP

import tensoropt
from tensoropt.cluster import Cluster, Device, LinkModel
from tensoropt.errors import ProfileError
from tensoropt.graph import block_of
from tensoropt.measure import measure_step, profile
from tensoropt.optimizers import optimizer_alpha, optimizer_temp_bytes
from tensoropt.plan import NodeConfig, Plan
from tensoropt.planmodel import node_memory, step_memory
from tensoropt.planmodel.memory import keeps_input, output_kept
from tensoropt.planmodel.meshplan import MeshEvaluator
from tensoropt.planmodel.walk import plan_memory, recompute_segments


@pytest.fixture(scope="module")
def profiled():
    """Capture and profile each model once for the whole module (memory figures only: 1 repeat)."""
    done = {}

    def get(spec):
        if spec not in done:
            loaded = tensoropt.load_model(spec)
            graph = loaded.capture()
            done[spec] = loaded, graph, profile(graph, shard_degrees=(1,), repeats=1)
        return done[spec]
    return get


@pytest.mark.parametrize("spec", ["zoo:vgg16?tiny=1", "zoo:wide_resnet?tiny=1", "zoo:gpt2?tiny=1"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_whole_step_peak_is_within_5_percent_of_a_measured_step(spec, optimizer, profiled):
    loaded, graph, costs = profiled(spec)
    est = step_memory(graph, costs, optimizer=optimizer)["dev0"]
    real = measure_step(loaded.model, loaded.example_inputs, optimizer=optimizer, repeats=1, warmup=1).peak_bytes
    assert est.peak == pytest.approx(real, rel=0.05), (est, real)
    assert est.params == sum(p.numel() * 4 for p in loaded.model.parameters())


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_checkpoint_around_every_block_is_priced_as_a_measured_step(optimizer):
    # the plan that recomputes every operator of the four blocks (one segment per block) against
    # PyTorch's own recipe — torch.utils.checkpoint around each block — measured under MemTracker
    torch.manual_seed(0)
    model, x = ResidualMLP(), torch.randn(512, 32)
    graph = tensoropt.capture(model, (x,))
    costs = profile(graph, shard_degrees=(1,), repeats=1, cache=False)
    names = [n.name for n in graph.ops]
    blocks = {n for n in names if block_of(graph.nodes[n].module_path) is not None}
    plan = Plan({n: NodeConfig(("dev0",), recompute=n in blocks) for n in names}, graph_fingerprint=graph.fingerprint,
                order=names)
    assert [block_of(graph.nodes[s[0]].module_path) for s in recompute_segments(names, plan.configs, graph)] == \
        [f"blocks.{i}" for i in range(4)]
    one = Cluster("one", [Device("dev0", 2**40)], {}, default=LinkModel(0.0, 1e12))
    est = plan_memory(plan, graph, costs, one, optimizer=optimizer)["dev0"].peak
    checkpointed = ResidualMLP(checkpoint=True)
    checkpointed.load_state_dict(model.state_dict())
    real = measure_step(checkpointed, (x,), optimizer=optimizer, repeats=1, warmup=1).peak_bytes
    assert est == pytest.approx(real, rel=0.05), (est, real)
    # and it is the trade: well under the step that keeps every block's activations
    kept = measure_step(model, (x,), optimizer=optimizer, repeats=1, warmup=1).peak_bytes
    assert real < 0.7 * kept and est < 0.7 * step_memory(graph, costs, optimizer=optimizer)["dev0"].peak


def test_node_memory_splits_weights_and_trades_activations_for_recompute(small_cnn):
    model, inputs = small_cnn
    graph = tensoropt.capture(model, inputs)
    costs = profile(graph, shard_degrees=(1, 2), repeats=1, cache=False)
    conv = next(n.name for n in graph.ops if n.op == "aten.conv2d.default")
    relu = next(n.name for n in graph.ops if n.op == "aten.relu.default")
    weight = (8 * 3 * 3 * 3 + 8) * 4
    full = node_memory(graph, costs, conv, alpha=2)
    assert (full.params, full.grads, full.optimizer) == (weight, weight, 2 * weight)
    half = node_memory(graph, costs, conv, layout="channel", degree=2, alpha=2)
    assert (half.params, half.optimizer) == (weight // 2, weight)
    batch = node_memory(graph, costs, conv, layout="batch", degree=2)
    assert batch.params == weight                          # data parallel replicates the weights
    kept = node_memory(graph, costs, relu)
    assert kept.activations == costs[relu].output_bytes      # relu keeps its output for backward
    again = node_memory(graph, costs, relu, recompute=True)
    assert again.activations == 0 and again.transient == kept.transient + kept.activations


def test_a_view_kept_for_backward_keeps_its_base():
    # pow saves its input, a view of the linear's output: the view is the linear's storage, so the
    # linear's node memory keeps its output (a transformer reads most activations through views)
    class ViewThenPow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 32)

        def forward(self, x):
            return self.fc(x).view(4, 2, 32).pow(3)

    torch.manual_seed(0)
    graph = tensoropt.capture(ViewThenPow(), (torch.randn(8, 16),))
    costs = profile(graph, shard_degrees=(1,), repeats=1, cache=False)
    view = next(n for n in graph.ops if n.op == "aten.view.default")
    base, power = view.inputs[0], next(iter(graph.successors(view.name)))
    assert graph.nodes[power].op.startswith("aten.pow")
    assert keeps_input(graph, costs, power, view.name) and keeps_input(graph, costs, view.name, base)
    assert output_kept(graph, costs, base)
    assert node_memory(graph, costs, base).activations >= costs[base].output_bytes == 8 * 32 * 4
    assert node_memory(graph, costs, view.name).activations == 0      # no storage of its own


def test_step_memory_with_a_placement_counts_each_device(small_cnn):
    model, inputs = small_cnn
    graph = tensoropt.capture(model, inputs)
    costs = profile(graph, shard_degrees=(1,), repeats=1, cache=False)
    ops = [n.name for n in graph.ops]
    half = len(ops) // 2
    placement = {n: ("a" if i < half else "b") for i, n in enumerate(ops)}
    per = step_memory(graph, costs, placement=placement)
    whole = step_memory(graph, costs)["dev0"]
    assert set(per) == {"a", "b"}
    assert per["a"].params + per["b"].params == whole.params   # each parameter lives where it is used
    assert max(p.peak for p in per.values()) < whole.peak
    with pytest.raises(ProfileError, match="no device for"):
        step_memory(graph, costs, placement={ops[0]: "a"})


def test_optimizer_settings():
    assert [optimizer_alpha(o) for o in ("sgd", "momentum", "adam", 3)] == [0, 1, 2, 3]
    with pytest.raises(ProfileError, match="unknown optimizer 'lamb'"):
        optimizer_alpha("lamb")
    # per tensor, in the optimizer's order: 30's sqrt and quotient beside 10's denom (10 + 2 × 30);
    # the other way round the first's two (2 × 30) outlast the second's with the first's denom
    assert optimizer_temp_bytes("adam", [10, 30]) == 70
    assert optimizer_temp_bytes("adam", [30, 10]) == 60
    assert optimizer_temp_bytes("adam", [10, 30], foreach=True) == 40
    assert optimizer_temp_bytes("momentum", [10, 30]) == 0


def test_a_per_tensor_adamw_step_holds_the_previous_denominator_beside_two_temporaries_measured():
    """PyTorch's own AdamW step (CPU: the per-tensor loop) on three equal 64 × 32 weights and a bias,
    its storage measured op by op (StoragePeak, what the pipeline's ranks are measured with): beyond
    the parameters, gradients and state, three weights' worth at once — the rule's, not two."""
    from tensoropt.measure.step import make_optimizer
    from tensoropt.measure.storage import StoragePeak

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(64, 32)) for _ in range(3)] + [torch.nn.Parameter(torch.randn(32))]
    opt = make_optimizer("adamw", params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()   # the state exists from here
    held = [*params, *(p.grad for p in params), *(v for st in opt.state.values() for v in st.values())]
    with StoragePeak(held) as peak:
        opt.step()
    resident = sum(t.untyped_storage().nbytes() for t in held)
    weight = 64 * 32 * 4
    assert peak.peak_bytes - resident == 3 * weight
    assert optimizer_temp_bytes("adamw", [p.numel() * 4 for p in params]) == 3 * weight


def test_the_peak_splits_into_what_holds_it_worked_by_hand():
    # y = x Wᵀ, W 2×4 float32 (32 B), x 3×4 (48 B, held by the caller all step), y 3×2 (24 B)
    torch.manual_seed(0)
    g = tensoropt.capture(torch.nn.Linear(4, 2, bias=False), (torch.randn(3, 4),))
    c = tensoropt.profile(g, repeats=1)
    adamw = tensoropt.step_memory(g, c, optimizer="adamw")["dev0"]
    # AdamW's step: W + its gradient + exp_avg + exp_avg_sq + sqrt/div temporaries (2 × 32) + x
    assert (adamw.peak, adamw.peak_phase) == (32 + 32 + 64 + 64 + 48, "optimizer")
    assert adamw.parts() == {"parameters": 32, "gradients": 32, "optimizer": 64, "activations": 48,
                             "transient": 64, "reserve": 0}
    sgd = tensoropt.step_memory(g, c, optimizer="sgd")["dev0"]
    # SGD updates in place: the peak is the linear's backward, W's gradient made beside y's gradient
    assert (sgd.peak, sgd.peak_phase) == (32 + 32 + 48 + 24, "backward")
    assert sgd.parts() == {"parameters": 32, "gradients": 32, "optimizer": 0, "activations": 48,
                           "transient": 24, "reserve": 0}


def test_a_tied_weight_read_whole_and_cut_accumulates_its_second_gradient_worked_by_hand():
    # An embedding whose weight W (64 × 32 floats: 8,192 B) the output layer reads too, batch 2 × 4
    # tokens, SGD; the embedding split by channel over two devices (it cuts W's columns), the
    # output layer replicated (it reads W whole): the executors hold W whole on both devices and
    # sum its gradient, in one flat buffer that lives all step (8,192 B from the start).
    # Backward of the output layer (first): its gradient of W, a whole W-sized tensor (8,192 B),
    # waits in autograd's buffer for the embedding's (two contributions to one leaf are summed
    # before it gets them): 8,192 B from then on.  Backward of the embedding (last): its gradient of
    # W is computed for its half of the columns (4,096 B) and padded to the whole (8,192 B); then
    # autograd sums it with the waiting one, out of place (8,192 B more), its own output's gradient
    # freed by then: W + buffer + waiting + ids (2·4·8 = 64 B) + padded + sum =
    # 8,192 · 3 + 64 + 16,384 = 41,024 B, the peak.  Measured on two gloo ranks (measure_plan's
    # MemTracker): 41,544 B on the rank that computes the loss (520 B not modelled), 33,344 on the
    # other; the rule before — the first contribution added into the buffer at once, the sum not
    # held — gave 29,248 B, 30 % under.
    torch.manual_seed(0)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 32)
            self.proj = torch.nn.Linear(32, 64, bias=False)
            self.proj.weight = self.embed.weight

        def forward(self, ids):
            return self.proj(self.embed(ids))

    graph = tensoropt.capture(Tied(), (torch.randint(0, 64, (2, 4)),))
    costs = tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False)
    cluster = tensoropt.load_cluster("preset:titan-rtx-5").without_kinds()
    mesh = ("gpu0", "gpu1")
    plan = tensoropt.Plan({"embedding": tensoropt.NodeConfig(mesh, "channel"),
                           "linear": tensoropt.NodeConfig(mesh, "R")}, graph_fingerprint=graph.fingerprint)
    for d, m in plan_memory(plan, graph, costs, cluster, optimizer="sgd").items():
        assert (m.peak, m.peak_at, m.peak_phase) == (41_024, "embedding (gradients summed)", "backward"), d
        assert m.parts() == {"parameters": 8_192, "gradients": 2 * 8_192, "optimizer": 0, "activations": 64,
                             "transient": 2 * 8_192, "reserve": 0}
    ev = MeshEvaluator(graph, costs, cluster, mesh, configs={n: (c,) for n, c in plan.configs.items()},
                       optimizer="sgd")
    assert ev.evaluate([0, 0])[0] == 41_024        # the compiled walk, the same by hand


def test_sharding_levels_hold_what_zero_and_fsdp_hold_worked_by_hand():
    # Linear(16, 32) → ReLU → Linear(32, 4), batch 8 split over two devices, Adam (α = 2).  The
    # parameters: 2,048 + 128 and 512 + 16 = 2,704 B; a device's pieces 1,024 + 64 + 256 + 8 =
    # 1,352 B.  The batch piece: 4 rows × 16 × 4 = 256 B.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    graph = tensoropt.capture(model, (torch.randn(8, 16),))
    priced = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                             tensoropt.load_cluster("preset:titan-rtx-5"), costs_from="model")
    costs, cluster = priced.costs, priced.cluster
    mesh = ("gpu0", "gpu1")

    def walked(level):
        plan = tensoropt.Plan({n.name: tensoropt.NodeConfig(mesh, "batch", shard=level if n.params else 0)
                               for n in graph.ops}, graph_fingerprint=graph.fingerprint)
        sim = tensoropt.simulate(plan, graph, costs, cluster, optimizer="adam")
        mem = plan_memory(plan, graph, costs, cluster, optimizer="adam")
        assert sim.memory_bytes == {d: m.peak for d, m in mem.items()}
        # each transfer once (a ring collective occupies both links of the pair)
        return mem["gpu0"], sorted({(e.node, e.detail.split(":")[0]) for e in sim.timeline if e.kind == "link"})

    # none (DDP): everything whole; the peak is the optimizer step with Adam's two parameter-sized
    # temporaries of the largest weight: 2,704 × (1 + 1 + 2) + 256 + 2 × 2,048 = 15,168 B
    m, links = walked(0)
    assert (m.peak, m.peak_phase) == (15_168, "optimizer")
    assert [d for _, d in links] == ["parameter gradients on gpu0,gpu1"]
    # optimizer state sharded (ZeRO-1): state 2 × 1,352; the step's temporaries 2 × 1,024; now the
    # first linear's backward peaks: 2,704 (parameters) + 2,704 (state) + 2,704 (the summed gradient
    # buffer, all step) + 256 + its weight and bias gradients before they are added in (2,176) + its
    # output's gradient (512) = 11,056 B; after the step the updated parameters are gathered
    m, links = walked(1)
    assert (m.peak, m.peak_at, m.optimizer, m.optimizer_temp) == (11_056, "linear", 2_704, 2_048)
    assert sorted(d for _, d in links) == ["parameter gradients on gpu0,gpu1",
                                           "updated parameters gathered on gpu0,gpu1"]
    # + gradients (ZeRO-2): no summed buffer; each gradient made whole by its reader's backward, then
    # reduce-scattered (the executor's gate, after that backward: the reader's output gradient freed),
    # its piece kept.  During the first linear's backward: 2,704 + 2,704 + 264 (linear_1's piece) + 256 +
    # 2,176 (its gradients whole) + 512 (its output's gradient) = 8,616 B; in its reduce-scatter right
    # after: 2,704 + 2,704 + 1,352 (both pieces) + 256 + 2,176 = 9,192 B, the peak (the piece was counted
    # during the backward before: 9,704 B; on GPT-2 2 × 256 the walk was one piece, 4 MiB, over the executor)
    m, links = walked(2)
    assert (m.peak, m.peak_at, m.grads) == (9_192, "linear (reduce-scatter)", 1_352)
    assert sorted(d for _, d in links) == ["gradients reduce-scattered on gpu0,gpu1"] * 2 + \
        ["updated parameters gathered on gpu0,gpu1"]
    # + parameters (FSDP): pieces of everything, the layer's parameters gathered whole to run it,
    # forward and again backward, dropped by the gate after its reduce-scatter: during the first
    # linear's backward 1,352 + 2,704 + 264 + 256 + 2,176 (gathered) + 2,176 (its gradients whole) + 512
    # = 9,440 B; in the reduce-scatter 1,352 + 2,704 + 1,352 + 256 + 2,176 + 2,176 = 10,016 B, the
    # peak — more than ZeRO-2 on a model this small
    m, links = walked(3)
    assert (m.peak, m.peak_at, m.params) == (10_016, "linear (reduce-scatter)", 1_352)
    assert links == sorted([("linear", "forward parameters gathered on gpu0,gpu1"),
                                    ("linear_1", "forward parameters gathered on gpu0,gpu1"),
                                    ("linear_1", "backward parameters gathered on gpu0,gpu1"),
                                    ("linear", "backward parameters gathered on gpu0,gpu1"),
                                    ("linear_1", "gradients reduce-scattered on gpu0,gpu1"),
                                    ("linear", "gradients reduce-scattered on gpu0,gpu1")])


def tied_head_case():
    """The tied model of tests/distributed/sharding_models.py, captured and priced, on two TITANs."""
    from tests.distributed.sharding_models import tied_head
    model, inputs = tied_head()
    graph = tensoropt.capture(model, inputs)
    priced = tensoropt.price(tensoropt.profile(graph, shard_degrees=(1, 2), timed=False, cache=False),
                             tensoropt.load_cluster("preset:titan-rtx-5"), costs_from="model")
    return graph, priced.costs, priced.cluster


def test_a_tied_weight_sharded_by_its_agreeing_readers_worked_by_hand():
    # Embedding(5, 3) → Linear(3, 3) → an output layer reading the embedding's weight, batch 4
    # split over two devices, AdamW (α = 2).  Parameters: the tied weight 15 elements = 60 B, the
    # linear's 9 + 3 = 36 + 12 B: 108 B.  Pieces by the piece rule, in elements: ⌈15/2⌉ = 8 = 32 B,
    # ⌈9/2⌉ = 5 = 20 B, ⌈3/2⌉ = 2 = 8 B: 60 B on the first device (⌈bytes/2⌉ would say 54 B)
    from tensoropt.plan import PlanError, sharded_parameters
    from tensoropt.planmodel.reshard import node_sharded, shard_steps
    graph, costs, cluster = tied_head_case()
    mesh = ("gpu0", "gpu1")
    tied = next(q for q, p in graph.params.items() if p.readers)
    owner, (head,) = graph.params[tied].owner, graph.params[tied].readers

    def plan_of(levels):
        return tensoropt.Plan({n.name: tensoropt.NodeConfig(mesh, "batch", shard=levels.get(n.name, 0))
                               for n in graph.ops}, graph_fingerprint=graph.fingerprint)

    mid = next(n.name for n in graph.ops if n.params and n.name != owner)
    for level, want in {1: (108, 108, 120), 2: (108, 60, 120), 3: (60, 60, 120)}.items():
        plan = plan_of({owner: level, head: level, mid: level})
        plan.check(graph)
        assert sharded_parameters(graph, plan)[tied].readers == (owner, head)
        mem = plan_memory(plan, graph, costs, cluster, optimizer="adamw")
        for d, m in mem.items():
            assert (m.params, m.grads, m.optimizer) == want, (level, d)
        sim = tensoropt.simulate(plan, graph, costs, cluster, optimizer="adamw")
        assert sim.memory_bytes == {d: m.peak for d, m in mem.items()}
        # the compiled walk and simulator agree on it
        ev = MeshEvaluator(graph, costs, cluster, mesh, configs={n: (c,) for n, c in plan.configs.items()},
                           optimizer="adamw")
        assert ev.evaluate([0] * len(ev.names)) == (sim.max_memory_bytes, pytest.approx(sim.time_s, rel=1e-9))
        # one collective per parameter: the head gathers (and reduce-scatters) the tied weight, the
        # linear its weight and its bias, each on its own
        per_node = node_sharded(graph, sharded_parameters(graph, plan))
        stage = [s for s in shard_steps(graph, head, plan.configs[head], cluster, per_node[head]) if s][0]
        assert [s.nbytes for s in stage.steps] == [60]
        stage = [s for s in shard_steps(graph, mid, plan.configs[mid], cluster, per_node[mid]) if s][0]
        assert sorted(s.nbytes for s in stage.steps) == [12, 36]
    # FSDP (level 3): the tied weight gathered whole for each reader, forward and backward
    plan = plan_of({owner: 3, head: 3, mid: 3})
    sim = tensoropt.simulate(plan, graph, costs, cluster, optimizer="adamw")
    gathers = sorted((e.node, e.detail.split(":")[0]) for e in sim.timeline if e.kind == "link" and e.resource ==
                     "gpu0->gpu1" and "gathered" in e.detail)
    assert gathers == sorted((n, f"{w} parameters gathered on gpu0,gpu1") for n in (owner, head, mid)
                             for w in ("forward", "backward"))
    # the readers disagree: the tied weight whole (60 B everywhere, its gradient summed whole), the
    # linear's pieces at level 3: parameters 60 + 28 = 88, gradients 88, state 2 × 88 = 176
    plan = plan_of({mid: 3})
    m = plan_memory(plan, graph, costs, cluster, optimizer="adamw")["gpu0"]
    assert (m.params, m.grads, m.optimizer) == (88, 88, 176)
    # ... and a level on a reader that then shards nothing is refused, naming the node and why
    with pytest.raises(PlanError, match=f"node '{head}' shards its parameters.*do not share one level"):
        plan_of({head: 3, mid: 3}).check(graph)
    with pytest.raises(PlanError, match=f"node '{owner}' shards its parameters.*do not share one level"):
        plan_of({owner: 2, head: 3}).check(graph)
