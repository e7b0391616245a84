"""One rule decides whether a plan fits: every device's peak within min(its memory, budget) − reserve,
and the frontier's CSV, compare and the CLI all apply it."""

import csv

import pytest
import torch
from conftest import SmallCNN

import tensoropt
from tensoropt.cluster import Cluster, Device, LinkModel, load_cluster
from tensoropt.compare import compare
from tensoropt.errors import TensorOptError
from tensoropt.frontier import BudgetError, track_frontier
from tensoropt.planmodel.fits import check_budget_value, fits, over_by, usable_bytes

GiB = 2**30
PAIR = Cluster("pair", [Device("big", 24 * GiB), Device("small", 8 * GiB)], {}, default=LinkModel(1e-5, 1e10))
MIXED = load_cluster("preset:turing-mixed-4").without_kinds()   # priced as the CPU that profiled


def test_each_device_is_checked_against_its_own_memory():
    assert fits({"big": 20 * GiB}, PAIR)
    assert not fits({"big": 20 * GiB, "small": 9 * GiB}, PAIR)        # the small one overflows
    assert fits({"big": 8 * GiB, "small": 8 * GiB}, PAIR)              # exactly full fits
    assert over_by({"big": 25 * GiB, "small": 9 * GiB}, PAIR) == {"big": GiB, "small": GiB}


def test_budget_caps_every_device_and_reserve_comes_off():
    assert usable_bytes(PAIR, "big", budget=16 * GiB) == 16 * GiB
    assert usable_bytes(PAIR, "small", budget=16 * GiB) == 8 * GiB     # a budget never adds memory
    assert usable_bytes(PAIR, "big", budget=16 * GiB, reserve=GiB) == 15 * GiB
    assert not fits({"big": 16 * GiB}, PAIR, budget=16 * GiB, reserve=1)
    assert over_by({"small": 8 * GiB}, PAIR, reserve=512) == {"small": 512}


def test_a_bad_budget_is_one_clear_error():
    assert check_budget_value("16GiB") == 16 * GiB
    for bad in (0, -1, float("inf"), True, "lots"):
        with pytest.raises(TensorOptError):
            check_budget_value(bad)


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    g = tensoropt.capture(SmallCNN(), (torch.randn(4, 3, 16, 16),))
    return g, tensoropt.profile(g, shard_degrees=(1, 2, 4), repeats=1)


def test_frontier_csv_and_compare_agree_on_a_mixed_cluster(cnn, tmp_path):
    g, costs = cnn
    fr = track_frontier(g, costs, MIXED)
    # a budget (less its reserve) between the frontier's smallest and largest peaks: some plans fit, some not
    budget = (fr[0].memory_bytes + fr[-1].memory_bytes) // 2 + 1024
    fr = track_frontier(g, costs, MIXED, budget=budget, reserve=1024)
    marks = [p.fits_budget for p in fr]
    assert any(marks) and not all(marks)
    with open(fr.to_csv(tmp_path / "f.csv"), newline="") as f:
        for row in csv.DictReader(f):
            peaks = {d: int(b) for d, b in (x.split("=") for x in row["device_memory_bytes"].split(";"))}
            assert (row["fits_budget"] == "true") == fits(peaks, MIXED, budget=budget, reserve=1024)
            assert int(row["memory_bytes"]) == max(peaks.values())
    rows = compare(g, costs, MIXED, algos=["dp", "m-topo"], budget=budget, reserve=1024, frontier=fr)
    assert [r.algo for r in rows][-1] == "frontier fastest-that-fits"
    for r in rows:
        if r.error is None:
            assert r.fits == fits(dict(r.memory_bytes), MIXED, budget=budget, reserve=1024)
    best = rows[-1]          # the frontier's fastest plan that fits, simulated: it fits there too
    assert best.plan.plan_id == fr.best_under(budget).plan_id and best.fits
    assert best.peak_memory_bytes == fr.best_under(budget).memory_bytes   # one measure: the walked peak


def test_no_plan_fitting_the_devices_says_which_device_is_too_small(cnn):
    g, costs = cnn
    roomy = track_frontier(g, costs, PAIR, meshes=[["small"]], resolution=0)
    need = roomy.min_memory().memory_bytes
    tight = Cluster("tight", [Device("small", need - 100)], {}, default=LinkModel(1e-5, 1e10))
    with pytest.raises(BudgetError) as info:
        track_frontier(g, costs, tight, budget=10 * need, resolution=0)
    msg = str(info.value)
    assert "within the budget, but over the memory of small by 100 B" in msg and info.value.exit_code == 2
