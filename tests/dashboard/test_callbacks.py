"""The dashboard's callbacks' work without a browser: the page's inputs in bytes; on a cluster of
unequal GPUs the page's decision of which plans fit equals :func:`tensoropt.planmodel.fits.fits` of the
simulator's per-device peaks — the rule of the CLI, the CSV and ``tensoropt compare``; the choice of
where the operator times come from, the banner saying it, and a refused choice as a message."""

import math

import pytest
from dash import html, no_update

from tensoropt.dashboard import figures as F
from tensoropt.dashboard.callbacks import (
    frontier_view,
    gib_bytes,
    plan_verdict,
    request_from_controls,
    reserve_bytes,
    run_controls,
    source_banner,
)
from tensoropt.dashboard.layout import build_layout
from tensoropt.dashboard.pipeline import DEFAULT_CLUSTER, DEFAULT_MODEL
from tensoropt.errors import TensorOptError
from tensoropt.planmodel import simulate
from tensoropt.planmodel.fits import fits

from .conftest import SMALL_BYTES, TINY

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


def _controls(costs: str, profile: str | None = None, calibration: str | None = None) -> tuple:
    """The run button's States (request_from_controls' order): the tiny model as a spec on titan-rtx-5's
    gpu0, gpu1, one profiling repeat, no warm-up, the given choice of where the times come from."""
    return ("spec", None, None, TINY, None, profile, None, "preset", "titan-rtx-5", None, ["gpu0", "gpu1"], None, 1,
            0, costs, calibration)


def _component(layout, component_id):
    """The component of ``layout`` with ``component_id`` (depth first)."""
    if getattr(layout, "id", None) == component_id:
        return layout
    children = getattr(layout, "children", None)
    for child in children if isinstance(children, list) else [children]:
        found = _component(child, component_id) if child is not None and not isinstance(child, str) else None
        if found is not None:
            return found
    return None


def _text(component) -> str:
    """The text a Dash component shows (its children's strings, in order)."""
    if isinstance(component, str):
        return component
    children = getattr(component, "children", None)
    return "".join(_text(c) for c in (children if isinstance(children, list) else [children]) if c is not None)


@pytest.mark.filterwarnings(r"ignore:\s*The dash_table.DataTable will be removed:DeprecationWarning")   # Dash's
def test_costs_from_control_maps_to_the_request():
    """The page's choice of where the times come from is the request's ``costs_from``, ``profile``
    and ``calibration``; the page opens on ``auto``."""
    choice = _component(build_layout(default_model=DEFAULT_MODEL, default_cluster=DEFAULT_CLUSTER, repeats=1,
                                     warmup=0), "costs-from")
    assert choice.value == "auto" and [o["value"] for o in choice.options] == ["auto", "measured", "profile", "model"]
    assert choice.options[0]["label"].strip().startswith("automatic: measured where this machine is the cluster's")

    def fields(*controls):
        req = request_from_controls(*controls, algos=())
        return req.costs_from, req.profile, req.calibration

    assert fields(*_controls("auto", "p.json", "c.json")) == ("auto", None, "c.json")   # an upload is not a choice
    assert fields(*_controls("measured", "p.json", "c.json")) == ("measured", None, None)
    assert fields(*_controls("profile", "p.json", "c.json")) == ("auto", "p.json", "c.json")
    assert fields(*_controls("model", None, "c.json")) == ("model", None, "c.json")
    assert fields(*_controls(None)) == ("auto", None, None)
    with pytest.raises(TensorOptError, match="upload a saved profile JSON first"):
        request_from_controls(*_controls("profile"), algos=())


def test_banner_of_the_default_names_the_titan_rtx_device_model(default_result):
    """Above the default's frontier: its times are the TITAN RTX device model's, said as such."""
    store, _, key, _ = default_result
    banner = source_banner(store.summary(key))
    text = _text(banner)
    assert text.startswith("Operator times: NVIDIA TITAN RTX device model (calibration ")
    assert "TITAN RTX" in text and "device model" in text and "estimates, not measurements" in text
    assert banner.className == "times-modelled"


def test_banner_of_measured_times_and_notes():
    notes = ["gpu0: speed 2 as the cluster gives it", "gpu1: no kind stated, taken as the profiled device"]
    banner = source_banner({"times_from": "measured on AMD EPYC 7B13", "times_notes": notes, "times_modelled": False})
    *line, listed = banner.children
    assert _text(html.Div(line)) == "Operator times: measured on AMD EPYC 7B13"
    assert [_text(li) for li in listed.children] == notes and banner.className == "times-measured"
    assert _text(source_banner({})) == "Operator times: not recorded"   # a summary from before sources were kept


def test_measured_on_the_default_preset_is_a_message_on_the_page(tiny_result):
    """``measured on this machine`` on titan-rtx-5 without a profile: the run's message on the page
    is the library's (both kinds and the ways out), not a traceback, and no result is shown."""
    store = tiny_result[0]
    updates = []
    key, message = run_controls(store, updates.append, _controls("measured"), ())
    assert key is no_update
    assert message.startswith("error: the costs were to be measured on ") and ", but the plan's devices are TITAN RTX" \
        in message and "--costs-from model" in message
    assert "Traceback" not in message and "internal error" not in message
    assert updates and all(partial is None for *_, partial in updates)   # no frontier reached the page
