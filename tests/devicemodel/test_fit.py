"""Fitting a calibration (tensoropt.devicemodel.fit) on synthetic profiles whose times were made
from known coefficients: the fit must give them back."""

import numpy as np
import pytest

from tensoropt.devicemodel import (
    Calibration,
    ClassFit,
    DeviceModel,
    cpu_model,
    device_model,
    fit_calibration,
    step_seconds,
)
from tensoropt.devicemodel.fit import samples
from tensoropt.errors import TensorOptError
from tensoropt.measure.costmodel import CostModel, NodeCost, ShardCost, Work

P = 1e11     # the synthetic device's peak FLOP/s (fp32)
BW = 1e10    # and its memory bandwidth, bytes/s
DEVICE = {"type": "cpu", "name": "synthetic", "peak_flops": P, "memory_Bps": BW}

# the coefficients the synthetic times are made from: (fp floor, bp floor, e, b); e None: no FLOPs term
TRUE = {
    "matmul": (5e-6, 1e-5, 0.5, 0.4),
    "elementwise": (3e-6, 6e-6, None, 0.6),
}
OPS = {"matmul": "aten.addmm.default", "elementwise": "aten.gelu.default", "norm": "aten.native_layer_norm.default"}


def seconds(cls, flops, nbytes, backward, peak=P, bandwidth=BW):
    """The formula, written out: floor + F / (P e) + B / (BW b)."""
    fp_floor, bp_floor, e, b = TRUE[cls]
    return (bp_floor if backward else fp_floor) + (flops / (peak * e) if e else 0.0) + nbytes / (bandwidth * b)


def synthetic_nodes(rng, cls, count, prefix, peak=P, bandwidth=BW):
    """``count`` calls of class ``cls`` with log-uniform work (FLOPs 1e3..1e10, bytes 1e2..1e8,
    forward and backward drawn apart: from floor-bound to FLOP- or byte-bound), times from TRUE."""
    nodes = []
    for i in range(count):
        ff, fb = (int(10 ** rng.uniform(3, 10)) if TRUE[cls][2] else 0 for _ in range(2))
        bf, bb = (int(10 ** rng.uniform(2, 8)) for _ in range(2))
        work = Work(fp_flops=ff, bp_flops=fb, fp_bytes=bf, bp_bytes=bb)
        nodes.append(NodeCost(f"{prefix}{i}", OPS[cls], seconds(cls, ff, bf, False, peak, bandwidth),
                              seconds(cls, fb, bb, True, peak, bandwidth), "measured", work=work))
    return nodes


def costmodel(nodes, name="synthetic-a", **settings):
    return CostModel({n.name: n for n in nodes}, graph_fingerprint="0" * 64, graph_name=name, device=DEVICE,
                     settings={"precision": "fp32", "timed": True, **settings})


def with_noise(nodes, rng, amplitude):
    """Every time multiplied by (1 + u), u uniform in [-amplitude, amplitude]."""
    return [NodeCost(n.name, n.op, n.fp_s * (1 + rng.uniform(-amplitude, amplitude)),
                     n.bp_s * (1 + rng.uniform(-amplitude, amplitude)), n.method, work=n.work) for n in nodes]


def assert_recovered(fit, cls, rel):
    fp_floor, bp_floor, e, b = TRUE[cls]
    assert fit.fp_floor_s == pytest.approx(fp_floor, rel=rel)
    assert fit.bp_floor_s == pytest.approx(bp_floor, rel=rel)
    assert fit.bytes_fraction == pytest.approx(b, rel=rel)
    if e is None:
        assert fit.flops_fraction is None
    else:
        assert fit.flops_fraction == pytest.approx(e, rel=rel)


def test_a_noise_free_profile_gives_back_its_coefficients(tmp_path):
    """Times made exactly by the formula: every class's floors and fractions come back, errors 0."""
    rng = np.random.default_rng(0)
    nodes = synthetic_nodes(rng, "matmul", 40, "mm") + synthetic_nodes(rng, "elementwise", 40, "ew")
    cal = fit_calibration([costmodel(nodes)], name="synthetic-fit")
    assert isinstance(cal, Calibration)
    assert cal.device == "synthetic" and not cal.gpu                     # from the profile's device
    assert cal.peak_flops == {"fp32": P} and cal.memory_Bps == BW       # the profile's measured peaks
    assert set(cal.classes) == {"all", "matmul", "elementwise"}
    assert cal.classes["matmul"].samples == 80 and cal.classes["all"].samples == 160
    assert_recovered(cal.classes["matmul"], "matmul", rel=1e-6)
    assert_recovered(cal.classes["elementwise"], "elementwise", rel=1e-6)   # no FLOPs: no FLOPs term
    assert cal.error["ops"] == 160
    assert cal.error["median_abs_pct"] <= 0.01 and cal.error["p90_abs_pct"] <= 0.01
    assert cal.error["step_pct"] == {"synthetic-a": pytest.approx(0.0, abs=0.01)}
    # the fitted calibration prices the synthetic device again: one hand-made matmul call
    fp, bp = cpu_model(cal).seconds("aten.mm.default", Work(10**9, 2 * 10**9, 10**6, 3 * 10**6))
    # 5e-6 + 1e9 / (1e11 * 0.5) + 1e6 / (1e10 * 0.4) = 5e-6 + 20 ms + 0.25 ms
    assert fp == pytest.approx(20.255e-3, rel=1e-6)
    # 1e-5 + 2e9 / 5e10 + 3e6 / 4e9 = 1e-5 + 40 ms + 0.75 ms
    assert bp == pytest.approx(40.76e-3, rel=1e-6)
    cal.save(tmp_path / "cal.json")                     # a fitted calibration is a file like any other
    assert Calibration.load(tmp_path / "cal.json") == cal


def test_a_gpu_profile_is_fitted_against_its_datasheet_peaks():
    """Profiled on a catalogue kind (an H100), the fractions are of its datasheet peaks (67 TFLOPS
    FP32, 3.35 TB/s), not of the rates the profiler measured, and the fit prices that kind."""
    rng = np.random.default_rng(5)
    nodes = synthetic_nodes(rng, "matmul", 20, "mm", peak=67e12, bandwidth=3.35e12)
    h100 = CostModel({n.name: n for n in nodes}, graph_fingerprint="0" * 64, graph_name="on-h100",
                     device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "peak_flops": 50e12,
                             "memory_Bps": 2.9e12},
                     settings={"precision": "fp32", "timed": True})
    cal = fit_calibration([h100], name="h100-fit")
    assert cal.gpu and cal.device == "NVIDIA H100 80GB HBM3"
    assert cal.peak_flops["fp32"] == 67e12 and cal.peak_flops["bf16"] == 989.5e12 and cal.memory_Bps == 3.35e12
    assert_recovered(cal.classes["matmul"], "matmul", rel=1e-6)
    model = device_model("H100", cal)
    fp, _ = model.seconds("aten.mm.default", Work(10**12, 0, 10**9, 0))
    # 5e-6 + 1e12 / (67e12 * 0.5) + 1e9 / (3.35e12 * 0.4)
    assert fp == pytest.approx(5e-6 + 1e12 / 33.5e12 + 1e9 / 1.34e12, rel=1e-6)


def predicted_relative_sd(nodes, cls, amplitude, weight=0.5):
    """The standard deviation of each fitted unknown (fp floor, bp floor, 1/e, 1/b), relative to
    its true value, for times with multiplicative noise uniform in ±amplitude — first-order
    least-squares theory, independent of the code under test.

    The fit solves min |A x - y| with rows a_i / t_i^w and y_i = t_i^(1-w) (w = weight).  With
    t_i = t0_i (1 + eps_i) the residual at the true x is t0_i^(1-w) eps_i to first order, so
    dx = (A'A)^-1 A' r and Cov(x) = s^2 (A'A)^-1 A' diag(t0^(2(1-w))) A (A'A)^-1, s^2 = amplitude^2 / 3.
    """
    fp_floor, bp_floor, e, b = TRUE[cls]
    rows, t0 = [], []
    for n in nodes:
        for bwd, flops, nbytes in ((False, n.work.fp_flops, n.work.fp_bytes), (True, n.work.bp_flops, n.work.bp_bytes)):
            rows.append([0.0 if bwd else 1.0, 1.0 if bwd else 0.0, flops / P, nbytes / BW])
            t0.append(seconds(cls, flops, nbytes, bwd))
    t0 = np.array(t0)
    a = np.array(rows) / t0[:, None] ** weight
    inv = np.linalg.inv(a.T @ a)
    meat = a.T @ (a * (t0 ** (2 * (1 - weight)))[:, None])
    cov = (amplitude**2 / 3) * inv @ meat @ inv
    x_true = np.array([fp_floor, bp_floor, 1 / e, 1 / b])
    return np.sqrt(np.diag(cov)) / x_true


def test_a_noisy_profile_gives_back_its_coefficients_within_the_noise():
    """±5 % multiplicative noise: each coefficient within 4 standard deviations of the truth, the
    standard deviations predicted by least-squares theory (here about 2.5 % for the floors, which
    only the smallest calls pin down, 0.6 % for e and 0.8 % for b)."""
    rng = np.random.default_rng(1)
    clean = synthetic_nodes(rng, "matmul", 100, "mm")
    noisy = with_noise(clean, rng, 0.05)
    cal = fit_calibration([costmodel(noisy)], name="noisy")
    sd = predicted_relative_sd(clean, "matmul", 0.05)
    assert sd[:2].max() < 0.03 and sd[2:].max() < 0.01     # the design determines every unknown
    fit = cal.classes["matmul"]
    fp_floor, bp_floor, e, b = TRUE["matmul"]
    assert abs(fit.fp_floor_s / fp_floor - 1) < 4 * sd[0]
    assert abs(fit.bp_floor_s / bp_floor - 1) < 4 * sd[1]
    assert abs(e / fit.flops_fraction - 1) < 4 * sd[2]     # the fit's unknown is 1/e
    assert abs(b / fit.bytes_fraction - 1) < 4 * sd[3]
    # per-call errors: |eps| / (1 + eps) for eps uniform in ±5 %: median 2.5 %, 90th percentile 4.5 %
    assert 2.0 < cal.error["median_abs_pct"] < 3.0
    assert 4.0 < cal.error["p90_abs_pct"] < 5.3
    # the measured step is a sum of times each within ±5 % of its noise-free value
    assert abs(cal.error["step_pct"]["synthetic-a"]) < 5.0


def test_a_class_with_too_few_samples_takes_the_fit_over_all():
    """3 layer norms (6 samples) are under min_samples (12): they are priced by the "all" fit."""
    rng = np.random.default_rng(2)
    mm = synthetic_nodes(rng, "matmul", 20, "mm")
    norms = [NodeCost(f"ln{i}", OPS["norm"], 2e-5, 4e-5, "measured", work=Work(0, 0, 10**5, 2 * 10**5))
             for i in range(3)]
    cal = fit_calibration([costmodel(mm + norms)], name="few")
    assert set(cal.classes) == {"all", "matmul"}
    assert cal.classes["all"].samples == 46 and cal.classes["matmul"].samples == 40
    assert cal.fit_for("norm") is cal.classes["all"]
    assert_recovered(cal.classes["matmul"], "matmul", rel=1e-6)
    lower = fit_calibration([costmodel(mm + norms)], name="few", min_samples=6)
    assert set(lower.classes) == {"all", "matmul", "norm"} and lower.classes["norm"].samples == 6


def test_samples_are_the_timed_calls_with_work():
    """A measured call gives a forward and a backward sample; its measured shard two more; a
    scaled shard, a free node, a call without work and a zero backward none."""
    shard = ShardCost(1e-3, 2e-3, 0, 0, 0, "measured", Work(10, 20, 30, 40))
    scaled = ShardCost(5e-4, 1e-3, 0, 0, 0, "scaled", Work(5, 10, 15, 20))
    nodes = [NodeCost("mm", OPS["matmul"], 2e-3, 4e-3, "measured", work=Work(1, 2, 3, 4),
                      shards={("batch", 2): shard, ("batch", 4): scaled}),
             NodeCost("view", "aten.view.default", 0.0, 0.0, "free"),
             NodeCost("old", OPS["matmul"], 2e-3, 4e-3, "measured"),                          # no work
             NodeCost("fwd", OPS["elementwise"], 1e-3, 0.0, "cached", work=Work(0, 0, 8, 0))]
    got = [(s.op, s.backward, s.flops, s.nbytes, s.seconds) for s in samples(costmodel(nodes))]
    assert sorted(got) == sorted([
        ("aten.addmm.default", False, 1, 3, 2e-3), ("aten.addmm.default", True, 2, 4, 4e-3),
        ("aten.addmm.default", False, 10, 30, 1e-3), ("aten.addmm.default", True, 20, 40, 2e-3),
        ("aten.gelu.default", False, 0, 8, 1e-3)])


def test_fit_refuses_profiles_it_cannot_use():
    """No profiles, no timed call with work, or no peaks to take fractions of: a TensorOptError."""
    with pytest.raises(TensorOptError, match="at least one"):
        fit_calibration([], name="x")
    untimed = costmodel([NodeCost("mm", OPS["matmul"], 0.0, 0.0, "measured", work=Work(1, 1, 1, 1))], timed=False)
    with pytest.raises(TensorOptError, match="timed call"):
        fit_calibration([untimed], name="x")
    rng = np.random.default_rng(3)
    no_peaks = CostModel({n.name: n for n in synthetic_nodes(rng, "matmul", 3, "mm")}, graph_fingerprint="0" * 64,
                         device={"type": "cpu", "name": "synthetic"}, settings={"timed": True})
    with pytest.raises(TensorOptError, match="peak_flops="):
        fit_calibration([no_peaks], name="x")
    cal = fit_calibration([no_peaks], name="x", peak_flops={"fp32": P}, memory_Bps=BW, min_samples=1)
    assert cal.peak_flops == {"fp32": P} and cal.memory_Bps == BW


def test_a_cpu_fit_never_prices_a_gpu():
    """A calibration fitted on a CPU profile is refused by device_model for a GPU kind."""
    rng = np.random.default_rng(4)
    cal = fit_calibration([costmodel(synthetic_nodes(rng, "matmul", 10, "mm"))], name="cpu-fit")
    with pytest.raises(TensorOptError, match="CPU"):
        device_model("V100", cal)


HAND = DeviceModel("hand", {"fp32": 1e12}, 1e11, Calibration("hand", "", False, {"fp32": 1e12}, 1e11,
                                                              {"all": ClassFit(0.5, 0.25, 1e-5, 2e-5)}), None, False)


def test_step_seconds_by_hand():
    """A matmul priced by the model plus a call without work counted as measured."""
    nodes = [NodeCost("mm", OPS["matmul"], 1.0, 1.0, "measured", work=Work(2 * 10**9, 4 * 10**9, 10**6, 2 * 10**6)),
             NodeCost("relu", "aten.relu.default", 1e-3, 2e-3, "measured")]       # no work: as measured
    # mm forward: 1e-5 + 2e9 / (1e12 * 0.5) + 1e6 / (1e11 * 0.25) = 4.05e-3
    # mm backward: 2e-5 + 4e9 / 5e11 + 2e6 / 2.5e10 = 8.1e-3; relu: 1e-3 + 2e-3
    assert step_seconds(costmodel(nodes), HAND) == pytest.approx(4.05e-3 + 8.1e-3 + 3e-3, rel=1e-12)


def test_step_seconds_prices_a_backward_where_one_ran():
    """A call timed without backward (bp_s 0) gets none; in an untimed profile every call with
    backward work gets one."""
    node = NodeCost("mm", OPS["matmul"], 1.0, 0.0, "measured", work=Work(2 * 10**9, 4 * 10**9, 10**6, 2 * 10**6))
    assert step_seconds(costmodel([node]), HAND) == pytest.approx(4.05e-3, rel=1e-12)
    untimed = NodeCost("mm", OPS["matmul"], 0.0, 0.0, "measured", work=node.work)
    assert step_seconds(costmodel([untimed], timed=False), HAND) == pytest.approx(4.05e-3 + 8.1e-3, rel=1e-12)
