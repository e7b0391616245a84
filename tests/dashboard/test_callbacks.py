"""The dashboard's callbacks' work without a browser: the page's inputs in bytes, and on a cluster of
unequal GPUs the page's decision of which plans fit equals :func:`tensoropt.planmodel.fits.fits` of the
simulator's per-device peaks — the rule of the CLI, the CSV and ``tensoropt compare``."""

import math

import pytest

from tensoropt.dashboard import figures as F
from tensoropt.dashboard.callbacks import frontier_view, gib_bytes, plan_verdict, reserve_bytes
from tensoropt.planmodel import simulate
from tensoropt.planmodel.fits import fits

from .conftest import SMALL_BYTES

GiB = 2 ** 30


def test_inputs_in_bytes():
    assert [gib_bytes(v) for v in (None, "", 0, -1, "abc", math.inf, math.nan)] == [None] * 7
    assert gib_bytes(16) == 16 * GiB and gib_bytes("0.5") == GiB / 2
    assert reserve_bytes(None) == 0 and reserve_bytes(-2) == 0 and reserve_bytes(0.5) == GiB // 2


def _plans(store, key):
    """Plan id → the simulator's per-device peaks, for every frontier point and baseline plan."""
    ids = [r["plan_id"] for r in store.frontier_rows(key)] + [
        b["plan_id"] for b in store.baselines(key) if b["plan_id"]]
    return {pid: simulate(store.plan(key, pid), store.graph(key), store.costs(key), store.cluster(key)).memory_bytes
            for pid in ids}


@pytest.mark.parametrize("budget", [None, 9000, 17200, 2 ** 20])
@pytest.mark.parametrize("reserve", [0, 500])
def test_page_fits_equal_the_library_on_unequal_gpus(hetero_result, budget, reserve):
    store, key = hetero_result
    cluster = store.cluster(key)
    peaks = _plans(store, key)
    expected = {pid: fits(p, cluster, budget=budget, reserve=reserve) for pid, p in peaks.items()}
    got = F.fit_flags(store.frontier_rows(key), store.baselines(key), cluster, budget_bytes=budget,
                      reserve_bytes=reserve)
    assert got == expected
    # the frontier's rows are the simulator's peaks, device by device
    assert {pid: F.row_peaks(r) for r in store.frontier_rows(key) for pid in [r["plan_id"]]} == \
        {r["plan_id"]: peaks[r["plan_id"]] for r in store.frontier_rows(key)}
    # the figure greys exactly what does not fit; the summary counts the frontier's plans that fit
    fig, lines = frontier_view(store, key, budget, reserve)
    drawn = {pid: colour != F.GREY for t in fig.data for pid, colour in zip(t.customdata, t.marker.color)}
    assert drawn == expected
    rows = store.frontier_rows(key)
    assert f"{sum(expected[r['plan_id']] for r in rows)} of {len(rows)} plans fit" in lines[0]
    for pid, ok in expected.items():
        assert plan_verdict(store, key, pid, budget, reserve).startswith("fits" if ok else "does not fit")


def test_a_peak_above_the_small_gpu_fits_on_the_large_one(hetero_result):
    """m-topo's plan peaks above the small device's memory, but on the 1 GiB device only: it fits
    (a cap at the smallest device's memory would refuse it); dp's plan is on both, and the small
    device cannot hold it."""
    store, key = hetero_result
    base = {b["algo"]: b for b in store.baselines(key)}
    assert base["m-topo"]["peak_memory_bytes"] > SMALL_BYTES and list(base["m-topo"]["memory_bytes"]) == ["big"]
    fit = F.fit_flags([], [base["dp"], base["m-topo"]], store.cluster(key))
    assert fit == {"baseline-dp": False, "baseline-m-topo": True}
    verdict = plan_verdict(store, key, "baseline-dp", None, 0)
    assert verdict.startswith("does not fit each device's memory: small over by")
    # the CSV's own fits column (the library's, no budget) says the same of the frontier's points
    assert all(F.fit_flags([r], [], store.cluster(key))[r["plan_id"]] == (r["fits_budget"] == "true")
               for r in store.frontier_rows(key))
