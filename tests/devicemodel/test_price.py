"""Pricing a profile for a cluster (tensoropt.devicemodel.price): a CPU profile converted for a
V100 cluster through its device model, never a CPU's times used as a V100's, and the guard that
the simulator and frontier tracking call."""

import dataclasses

import pytest
import torch

import tensoropt
from tensoropt.cluster import Cluster, Device, LinkModel, load_cluster
from tensoropt.devicemodel import (
    UNCALIBRATED_GPU,
    CostsKindError,
    check_costs_kind,
    convert,
    costs_kind,
    costs_source,
    device_model,
    is_modelled,
    price,
)
from tensoropt.devicemodel.price import kind_matches, prices_by_model
from tensoropt.errors import ProfileError, TensorOptError
from tensoropt.measure import profile
from tensoropt.measure.costmodel import CostModel, NodeCost, Work

GiB = 2**30
V100 = "Tesla V100-SXM2-16GB"
V100_RATE = 15.7e12 * 0.7      # V100 datasheet FP32 peak x the uncalibrated 70 %
V100_BW = 900e9 * 0.8          # V100 datasheet HBM2 bandwidth x the uncalibrated 80 %


class Tiny(torch.nn.Module):
    """(8, 4, 16) -> Linear(16, 32) -> relu -> flatten (a view: free) -> Linear(128, 10)."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(16, 32)
        self.head = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)).flatten(1))


@pytest.fixture(scope="module")
def graph():
    torch.manual_seed(0)
    return tensoropt.capture(Tiny(), (torch.randn(8, 4, 16),))


@pytest.fixture(scope="module")
def untimed(graph):
    """Memory and work only: each call run once on the CPU, nothing timed."""
    return profile(graph, timed=False, repeats=1, cache=False, shard_degrees=(2,))


@pytest.fixture(scope="module")
def timed(graph):
    """Times measured on this machine's CPU."""
    return profile(graph, repeats=1, warmup=0, cache=False, shard_degrees=(2,), in_sequence=False)


def cluster(*devices):
    return Cluster("test", list(devices), {}, default=LinkModel(1e-5, 1e10))


def head(graph):
    """The Linear(128, 10) node (the graph's second linear)."""
    return [n.name for n in graph.ops if n.op == "aten.linear.default"][1]


def test_an_untimed_cpu_profile_is_priced_for_a_v100_cluster(graph, untimed):
    """price() sees V100s and costs made on a CPU: every time comes from the V100's device model."""
    v100 = load_cluster("preset:v100-8-nvlink")
    priced = price(untimed, v100)
    assert priced.modelled and is_modelled(priced.costs)
    assert f"{V100} device model" in priced.source and priced.source == costs_source(priced.costs)
    assert costs_kind(priced.costs) == V100
    assert priced.costs.device["work_recorded_on"] == untimed.device["name"]
    assert priced.costs.settings["timed"] is True and priced.cluster is v100
    for name, before in untimed.nodes.items():
        after = priced.costs[name]
        if before.method == "free":          # the flatten view stays free
            assert after == before
            continue
        assert after.method == "modelled" and after.fp_s > 0 and after.bp_s > 0
        # memory figures and work as the profile recorded them
        for f in ("param_bytes", "output_bytes", "saved_inputs", "saves_output", "saved_bytes",
                  "extra_saved_bytes", "workspace_bytes", "flops", "work"):
            assert getattr(after, f) == getattr(before, f), f
        assert set(after.shards) == set(before.shards)
        for key, s in before.shards.items():
            t = after.shards[key]
            assert t.method == "modelled" and t.fp_s > 0
            assert (t.output_bytes, t.saved_bytes, t.extra_saved_bytes, t.work) == \
                   (s.output_bytes, s.saved_bytes, s.extra_saved_bytes, s.work)
    assert [n for n in graph.ops if untimed[n.name].method == "free"]      # the test saw a free node
    assert untimed.settings["timed"] is False and untimed.total_fp_s == 0  # the input is left as it was


def test_a_converted_linear_costs_what_the_formula_says(graph, untimed):
    """Linear(128, 10) on a batch of 8 (its input needs a gradient), on an uncalibrated V100."""
    priced = price(untimed, load_cluster("preset:v100-8-nvlink"), calibration=UNCALIBRATED_GPU)
    node = priced.costs[head(graph)]
    # forward: 2*8*128*10 = 20480 FLOPs; reads x 8*128*4 + W 10*128*4 + b 10*4, writes 8*10*4 = 9576 bytes
    # backward: dX and dW, 40960 FLOPs; dY 320 + saved x 4096 and W 5120 + dX 4096 + dW 5120 + db 40 = 18792 bytes
    assert node.work == Work(20480, 40960, 9576, 18792)
    assert node.fp_s == pytest.approx(7e-6 + 20480 / V100_RATE + 9576 / V100_BW, rel=1e-12)
    assert node.bp_s == pytest.approx(14e-6 + 40960 / V100_RATE + 18792 / V100_BW, rel=1e-12)
    # its batch shard (4 rows): 10240 FLOPs; x 2048 + W 5120 + b 40 + y 160 = 7368 bytes
    shard = priced.costs[head(graph)].shards[("batch", 2)]
    assert shard.fp_s == pytest.approx(7e-6 + 10240 / V100_RATE + 7368 / V100_BW, rel=1e-12)


def test_convert_with_an_explicit_device_model(untimed):
    """convert() is price's conversion with a device model of one's choosing."""
    h100 = device_model("H100", UNCALIBRATED_GPU)
    costs = convert(untimed, h100)
    assert costs_kind(costs) == "NVIDIA H100 80GB HBM3" and costs.settings["priced_by"] == h100.describe()
    assert all(n.method in ("modelled", "free") for n in costs.nodes.values())


def test_measured_costs_are_never_used_for_another_kind(timed):
    """costs_from="measured": a CPU's times for V100s are refused, naming both and the ways out."""
    with pytest.raises(CostsKindError) as e:
        price(timed, load_cluster("preset:v100-8-nvlink"), costs_from="measured")
    msg = str(e.value)
    assert f"measured on {timed.device['name']}" in msg and V100 in msg
    assert "tensoropt profile" in msg and "--costs-from model" in msg and "speed" in msg


def test_an_untimed_profile_cannot_be_used_as_measured(untimed):
    """Without times there is nothing measured to use."""
    with pytest.raises(CostsKindError, match="untimed"):
        price(untimed, load_cluster("preset:v100-8-nvlink"), costs_from="measured")
    with pytest.raises(TensorOptError, match="costs_from"):
        price(untimed, load_cluster("preset:v100-8-nvlink"), costs_from="guess")


def test_check_costs_kind(timed):
    """The guard: a CPU profile for V100s raises; devices of no kind, of kind cpu, or with a
    speed written out pass."""
    with pytest.raises(CostsKindError) as e:
        check_costs_kind(timed, load_cluster("preset:v100-8-nvlink"))
    assert V100 in str(e.value) and "gpu0" in str(e.value)
    check_costs_kind(timed, cluster(Device("d0", 16 * GiB), Device("d1", 16 * GiB)))              # no kind
    check_costs_kind(timed, cluster(Device("c0", 16 * GiB, "cpu"), Device("c1", 16 * GiB, "CPU")))
    check_costs_kind(timed, cluster(Device("g0", 16 * GiB, V100, speed=12.5), Device("g1", 16 * GiB, V100, speed=12.5)))
    mixed = cluster(Device("c0", 16 * GiB, "cpu"), Device("g0", 16 * GiB, V100))
    check_costs_kind(timed, mixed, ["c0"])                    # only the devices the plan uses count
    with pytest.raises(CostsKindError):
        check_costs_kind(timed, mixed)


def test_an_unknown_kind_cannot_be_priced(timed):
    """A kind the catalogue lacks: the guard says how to name a known one; price has no model."""
    ipu = cluster(Device("i0", 16 * GiB, "Graphcore IPU"))
    with pytest.raises(CostsKindError, match="catalogue knows"):
        check_costs_kind(timed, ipu)
    with pytest.raises(CostsKindError, match="no device model for the device kind"):
        price(timed, ipu)


def test_measured_costs_are_used_where_the_kinds_match(timed):
    """No kind stated, kind cpu, or a speed given: the measured costs, as they are, with notes."""
    blank = price(timed, cluster(Device("d0", 16 * GiB), Device("d1", 16 * GiB)))
    assert blank.costs is timed and not blank.modelled
    assert blank.source == f"measured on {timed.device['name']}"
    assert any("no kind stated" in n for n in blank.notes)
    fast = price(timed, cluster(Device("g0", 16 * GiB, V100, speed=12.5)))
    assert fast.costs is timed and fast.notes == ["g0: speed 12.5 as the cluster gives it"]
    with pytest.raises(CostsKindError, match="without a stated kind"):
        price(timed, cluster(Device("d0", 16 * GiB)), costs_from="model")    # a model of what?


def test_modelled_costs_price_their_own_kind_as_they_are(untimed):
    """Costs already priced for V100s are the V100s' costs: price() returns them unchanged."""
    v100 = load_cluster("preset:v100-8-nvlink")
    once = price(untimed, v100).costs
    again = price(once, v100)
    assert again.costs is once and again.source == costs_source(once)
    check_costs_kind(once, v100)
    with pytest.raises(CostsKindError, match="device model"):     # ... and are not an A100's
        check_costs_kind(once, load_cluster("preset:a100-4-nvlink"))


def test_repricing_modelled_costs_keeps_where_the_work_was_recorded(untimed):
    """V100-modelled costs re-priced for A100s: the work still comes from the CPU profile."""
    once = price(untimed, load_cluster("preset:v100-8-nvlink")).costs
    twice = price(once, load_cluster("preset:a100-4-nvlink")).costs
    assert costs_kind(twice).startswith("NVIDIA A100")
    assert twice.device["work_recorded_on"] == untimed.device["name"]


def test_a_second_kind_gets_the_speed_the_device_models_give_it():
    """2 V100s and 2 A100s at speed 1: priced as V100s, the A100s at the ratio of the step times."""
    n = 4096
    flops, fp_bytes, bp_bytes = 2 * n**3, 3 * n * n * 4, 5 * n * n * 4      # C = A @ B and its backward
    node = NodeCost("mm", "aten.mm.default", 0.5, 1.0, "measured", work=Work(flops, 2 * flops, fp_bytes, bp_bytes))
    costs = CostModel({"mm": node}, graph_fingerprint="0" * 64, graph_name="mm",
                      device={"type": "cpu", "name": "AMD EPYC"}, settings={"timed": True})
    mixed = cluster(Device("v0", 16 * GiB, V100), Device("v1", 16 * GiB, V100),
                    Device("a0", 40 * GiB, "NVIDIA A100-SXM4-40GB"), Device("a1", 40 * GiB, "NVIDIA A100-SXM4-40GB"))
    priced = price(costs, mixed, calibration=UNCALIBRATED_GPU)
    # a step: forward + backward floors, FLOPs at 70 % of the FP32 peak, bytes at 80 % of the bandwidth
    v100 = 21e-6 + 3 * flops / (15.7e12 * 0.7) + (fp_bytes + bp_bytes) / (900e9 * 0.8)
    a100 = 21e-6 + 3 * flops / (19.5e12 * 0.7) + (fp_bytes + bp_bytes) / (1555e9 * 0.8)
    speeds = {d.name: d.speed for d in priced.cluster.devices}
    assert speeds["v0"] == speeds["v1"] == 1.0
    assert speeds["a0"] == speeds["a1"] == pytest.approx(v100 / a100, rel=1e-12)
    assert 1.2 < speeds["a0"] < 1.3                   # ~19.5 / 15.7: the FP32 peaks' ratio dominates
    assert any(n.startswith("a0: NVIDIA A100-SXM4-40GB at speed 1.2") and V100 in n for n in priced.notes)
    assert costs_kind(priced.costs) == V100
    assert priced.costs["mm"].fp_s == pytest.approx(7e-6 + flops / (15.7e12 * 0.7) + fp_bytes / (900e9 * 0.8))


def test_a_real_mixed_cluster_gives_the_faster_kind_a_speed_above_one(untimed):
    """The tiny model on 2 V100s + 2 A100s: the A100s come out faster, with a note saying so."""
    mixed = cluster(Device("v0", 16 * GiB, V100), Device("v1", 16 * GiB, V100),
                    Device("a0", 80 * GiB, "A100 80GB"), Device("a1", 80 * GiB, "A100 80GB"))
    priced = price(untimed, mixed)
    assert priced.cluster.device("a0").speed > 1.0 and priced.cluster.device("v0").speed == 1.0
    assert [n.split(":")[0] for n in priced.notes] == ["a0", "a1"]
    only_a100s = price(untimed, mixed, devices=["a0", "a1"])      # the devices a request uses decide
    assert only_a100s.source.startswith("NVIDIA A100-SXM4-80GB device model") and not only_a100s.notes


def test_an_untimed_profile_is_refused_by_the_simulator_and_frontier_tracking(graph, untimed):
    """Zero times are no times: simulate and track_frontier refuse them through the guard."""
    from tensoropt.frontier.track import track_frontier
    from tensoropt.plan import NodeConfig, Plan
    from tensoropt.planmodel.simulate import simulate

    blank = cluster(Device("d0", 16 * GiB), Device("d1", 16 * GiB))
    plan = Plan({n.name: NodeConfig(("d0",)) for n in graph.ops}, graph_fingerprint=graph.fingerprint,
                order=[n.name for n in graph.ops])
    with pytest.raises(CostsKindError, match="no times"):
        check_costs_kind(untimed, blank)
    with pytest.raises(CostsKindError, match="no times"):
        simulate(plan, graph, untimed, blank)
    with pytest.raises(CostsKindError, match="no times"):
        track_frontier(graph, untimed, blank)


def test_the_simulator_runs_on_converted_costs_and_refuses_raw_ones(graph, untimed, timed):
    """A CPU profile on V100s is refused; priced through the V100 model, it simulates and says so."""
    from tensoropt.plan import NodeConfig, Plan
    from tensoropt.planmodel.simulate import simulate

    v100 = load_cluster("preset:v100-8-nvlink")
    plan = Plan({n.name: NodeConfig(("gpu0",)) for n in graph.ops}, graph_fingerprint=graph.fingerprint,
                order=[n.name for n in graph.ops])
    with pytest.raises(CostsKindError):
        simulate(plan, graph, timed, v100)
    priced = price(untimed, v100)
    res = simulate(plan, graph, priced.costs, v100)
    assert res.times_from == priced.source
    # one device computes every forward and backward: at least their sum
    assert res.compute_s["gpu0"] >= priced.costs.total_fp_s + priced.costs.total_bp_s - 1e-12


def test_convert_needs_the_work(untimed):
    """A profile made before work was recorded cannot be priced: re-profile it."""
    old = CostModel({k: dataclasses.replace(n, work=None) for k, n in untimed.nodes.items()},
                    graph_fingerprint=untimed.graph_fingerprint, graph_name=untimed.graph_name,
                    device=untimed.device, settings=untimed.settings)
    with pytest.raises(ProfileError, match="re-profile"):
        convert(old, device_model("V100"))
    with pytest.raises(ProfileError, match="re-profile"):
        price(old, load_cluster("preset:v100-8-nvlink"))


def test_costs_source_says_where_the_times_come_from(untimed, timed):
    """One line for headers: untimed, measured on a device, or a device model."""
    name = timed.device["name"]
    assert costs_source(timed) == f"measured on {name}"
    assert costs_source(untimed) == f"untimed profile made on {name} (memory and work only)"
    assert costs_source(price(untimed, load_cluster("preset:v100-8-nvlink")).costs).startswith(f"{V100} device model")


def test_kind_matches_and_prices_by_model():
    """Which devices take costs as measured, and whether a request will need a device model."""
    assert kind_matches("", "AMD EPYC") and kind_matches("cpu", "AMD EPYC", "cpu")
    assert kind_matches("V100", V100) and not kind_matches("V100", "NVIDIA A100-SXM4-40GB")
    assert not kind_matches("cpu", V100, "cuda") and not kind_matches(V100, "AMD EPYC", "cpu")
    v100 = load_cluster("preset:v100-8-nvlink")
    assert prices_by_model("auto", v100, None, "AMD EPYC", "cpu")
    assert not prices_by_model("auto", v100, None, V100, "cuda")
    assert prices_by_model("model", v100, None, V100, "cuda")
    assert not prices_by_model("measured", v100, None, "AMD EPYC", "cpu")
    assert not prices_by_model("auto", cluster(Device("d0", GiB)), None, "AMD EPYC", "cpu")
