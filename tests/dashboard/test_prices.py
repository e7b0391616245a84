"""What a plan costs and the fastest plan on every number of GPUs, worked by hand; the default price
table is what docs/dashboard.md lists."""

import re
from pathlib import Path

import pytest

from tensoropt.dashboard import prices as P
from tensoropt.devicemodel.kinds import load_kinds

KINDS = {"a": "Tesla V100-SXM2-16GB", "b": "Tesla V100-SXM2-16GB", "c": "NVIDIA TITAN RTX", "d": "NVIDIA TITAN RTX"}


def test_costs_by_hand():
    # 2 V100s at $3 each, a 0.36 s step, batch 8, an epoch of 100 samples = 13 steps
    got = P.plan_costs(0.36, ["a", "b"], KINDS, {"v100-sxm2-16gb": 3.0}, batch=8, epoch_samples=100)
    # wall-clock: 0.36 s × 1,000 = 0.1 h; 0.36 s × 13 steps
    assert got == pytest.approx({"samples_per_s": 8 / 0.36, "hours_per_1k_steps": 0.1,
                                 "hours_per_epoch": 0.36 * 13 / 3600, "gpu_hours_per_1k_steps": 0.2,
                                 "gpu_hours_per_epoch": 2 * 0.36 * 13 / 3600, "usd_per_1k_steps": 0.6,
                                 "usd_per_epoch": 6 * 0.36 * 13 / 3600})
    # a kind without a price: GPU-hours, no dollars; a bare number prices every kind
    none = P.plan_costs(0.36, ["a", "c"], KINDS, {"v100-sxm2-16gb": 3.0, "titan-rtx": None}, batch=8,
                        epoch_samples=None)
    assert none["usd_per_1k_steps"] is None and none["gpu_hours_per_epoch"] is None
    assert none["gpu_hours_per_1k_steps"] == pytest.approx(0.2)
    assert P.plan_costs(0.36, ["c"], KINDS, {"*": 1.0}, batch=8, epoch_samples=None)["usd_per_1k_steps"] == \
        pytest.approx(0.1)


PLANS = [  # k=1: 10 s (fits) ; k=2: 6 s (fits), 4 s (does not) ; k=4: 3 s (fits) ; k=3: only a plan that does not fit
    {"plan_id": "one", "devices": ["a"], "memory_bytes": 900, "time_s": 10.0},
    {"plan_id": "two-slow", "devices": ["a", "b"], "memory_bytes": 500, "time_s": 6.0},
    {"plan_id": "two-fast", "devices": ["a", "b"], "memory_bytes": 950, "time_s": 4.0},
    {"plan_id": "three", "devices": ["a", "b", "c"], "memory_bytes": 1200, "time_s": 2.0},
    {"plan_id": "four", "devices": ["a", "b", "c", "d"], "memory_bytes": 300, "time_s": 3.0},
]
FIT = {"one": True, "two-slow": True, "two-fast": False, "three": False, "four": True}


def test_the_fastest_plan_on_every_number_of_gpus():
    rows = P.gpus_needed(PLANS, FIT, KINDS, {"v100-sxm2-16gb": 3.0, "titan-rtx": 1.0}, batch=8, epoch_samples=80)
    assert [(r["k"], r["plan_id"]) for r in rows] == [(1, "one"), (2, "two-slow"), (3, None), (4, "four")]
    assert rows[2]["least_memory_bytes"] == 1200
    # efficiency against one GPU: (10 / 6) / 2 and (10 / 3) / 4
    assert [r.get("efficiency") for r in rows] == pytest.approx([1.0, 10 / 6 / 2, None, 10 / 3 / 4])
    assert {r.get("efficiency_vs") for r in rows if "efficiency" in r} == {1}
    # four GPUs: two V100s at $3 and two TITAN RTX at $1 for 3 s a step, 10 steps an epoch
    assert rows[3]["usd_per_epoch"] == pytest.approx(8.0 * 3.0 * 10 / 3600)
    # when one GPU does not fit, efficiency is against the fewest that do
    rows = P.gpus_needed(PLANS, {**FIT, "one": False}, KINDS, {}, batch=8, epoch_samples=None)
    assert rows[0]["plan_id"] is None and rows[1]["efficiency"] == 1.0 and rows[3]["efficiency_vs"] == 2
    assert rows[3]["efficiency"] == pytest.approx((6 / 3) / 2) and rows[3]["usd_per_1k_steps"] is None


def test_every_number_of_gpus_has_a_row():
    """The page lists every device count from 1 to the devices chosen: one with no plan at all (here 5
    and 6 of six GPUs) says so — no least memory, nothing to select — and leaves the others as they were."""
    rows = P.gpus_needed(PLANS, FIT, KINDS, {}, batch=8, epoch_samples=None, counts=range(1, 7))
    assert [(r["k"], r["plan_id"]) for r in rows] == [(1, "one"), (2, "two-slow"), (3, None), (4, "four"),
                                                        (5, None), (6, None)]
    assert [r["least_memory_bytes"] for r in rows if r["plan_id"] is None] == [1200, None, None]
    assert rows[:4] == P.gpus_needed(PLANS, FIT, KINDS, {}, batch=8, epoch_samples=None)


def test_prices_in_the_url_and_by_kind():
    assert P.parse_prices(P.format_prices({"v100-sxm2-16gb": 2.5, "l4": None, "h100-sxm5-80gb": 3.9})) == \
        {"v100-sxm2-16gb": 2.5, "h100-sxm5-80gb": 3.9}
    assert P.default_prices(["Tesla V100-SXM2-16GB", "NVIDIA TITAN RTX"]) == {"v100-sxm2-16gb": 3.06,
                                                                            "titan-rtx": None}
    assert P.steps_per_epoch(1000, 8) == 125 and P.steps_per_epoch(1001, 8) == 126 and P.steps_per_epoch(0, 8) is None


def test_every_default_price_is_a_catalogue_kind_and_in_the_docs():
    kinds = load_kinds()
    doc = (Path(__file__).resolve().parents[2] / "docs" / "dashboard.md").read_text(encoding="utf-8")
    for key, p in P.LIST_PRICES.items():
        assert key in kinds and p.kind == key and p.usd_per_gpu_hour > 0 and p.source and p.as_of
        row = next(line for line in doc.splitlines() if line.startswith("|") and f"`{key}`" in line)
        assert re.search(rf"\$ ?{p.usd_per_gpu_hour:.2f}\b", row), row


def test_a_count_no_faster_than_a_smaller_one_says_to_use_the_smaller():
    # 1 GPU 10 s; 2 GPUs 6 s; 3 GPUs 6 s to the microsecond (a hair slower); 4 GPUs 7 s; 5 GPUs 5 s
    plans = [{"plan_id": f"k{k}", "devices": list("abcde"[:k]), "memory_bytes": 100, "time_s": t}
             for k, t in ((1, 10.0), (2, 6.0), (3, 6.0000004), (4, 7.0), (5, 5.0))]
    kinds = dict.fromkeys("abcde", "Tesla V100-SXM2-16GB")
    rows = P.gpus_needed(plans, {p["plan_id"]: True for p in plans}, kinds, {}, batch=8, epoch_samples=None)
    assert [(r["k"], r.get("use_k")) for r in rows] == [(1, None), (2, None), (3, 2), (4, 2), (5, None)]


def test_a_count_no_plan_can_fit_says_so_with_its_bound():
    """Counts 5 and 6 have no plan; every plan on 5 would hold at least 20 GiB on a device, on 6 at
    least 10 GiB. With 16 GiB the most a device may hold, 5 cannot fit (its bound said), 6 is only
    not searched; with 24 GiB neither is ruled out."""
    GiB = 1 << 30
    least = {5: 20 * GiB, 6: 10 * GiB}
    rows = P.gpus_needed(PLANS, FIT, KINDS, {}, batch=8, epoch_samples=None, counts=range(1, 7), least=least,
                         room=16 * GiB)
    assert [(r["k"], r["least_memory_bytes"], r.get("at_least")) for r in rows if r["k"] >= 5] == \
        [(5, 20 * GiB, True), (6, None, None)]
    rows = P.gpus_needed(PLANS, FIT, KINDS, {}, batch=8, epoch_samples=None, counts=range(1, 7), least=least,
                         room=24 * GiB)
    assert [r["least_memory_bytes"] for r in rows if r["k"] >= 5] == [None, None]
