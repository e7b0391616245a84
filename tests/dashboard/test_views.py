"""What the dashboard shows of a result, without a browser: the page's inputs in bytes; on a cluster
of unequal GPUs the page's decision of which plans fit equals :func:`tensoropt.planmodel.fits.fits` of
the simulator's per-device peaks — the rule of the CLI, the CSV and ``tensoropt compare``; the banner
saying where the operator times come from; what the page's script is handed; the commands of a plan;
the banner over a result the controls no longer ask for."""

import dataclasses
import json
import math
import shlex

import pytest
from dash import html

from tensoropt.dashboard import figures as F
from tensoropt.dashboard.commands import run_commands
from tensoropt.dashboard.pipeline import Request, ResultStore
from tensoropt.dashboard.requests import request_from_controls
from tensoropt.dashboard.views import (
    frontier_view,
    gib_bytes,
    likely_plans,
    page_data,
    placer_notes,
    plan_commands,
    plan_verdict,
    reserve_bytes,
    search_notes,
    source_banner,
    stale_text,
    summary_lines,
)
from tensoropt.planmodel import simulate
from tensoropt.planmodel.fits import fits

from .conftest import SMALL_BYTES

GiB = 2 ** 30


def test_inputs_in_bytes():
    assert [gib_bytes(v) for v in (None, "", 0, -1, "abc", math.inf, math.nan)] == [None] * 7
    assert gib_bytes(16) == 16 * GiB and gib_bytes("0.5") == GiB / 2
    assert reserve_bytes(None) == 0 and reserve_bytes(-2) == 0 and reserve_bytes(0.5) == GiB // 2


def _plans(store, key):
    """Plan id → the simulator's per-device peaks, for every plan the frontier chart draws (each curve
    point, each baseline that is not one)."""
    ids = [p["plan_id"] for p in F.drawn_plans(store.curves(key), store.baselines(key))]
    return {pid: simulate(store.plan(key, pid), store.graph(key), store.costs(key), store.cluster(key)).memory_bytes
            for pid in ids}


@pytest.mark.parametrize("budget", [None, 9000, 17200, 2 ** 20])
@pytest.mark.parametrize("reserve", [0, 500])
def test_page_fits_equal_the_library_on_unequal_gpus(hetero_result, budget, reserve):
    store, key = hetero_result
    cluster = store.cluster(key)
    peaks = _plans(store, key)
    expected = {pid: fits(p, cluster, budget=budget, reserve=reserve) for pid, p in peaks.items()}
    drawn_plans = F.drawn_plans(store.curves(key), store.baselines(key))
    got = {p["plan_id"]: fits(p["peaks"], cluster, budget=budget, reserve=reserve) for p in drawn_plans}
    assert got == expected
    # every curve point's peaks are the simulator's, device by device
    assert {p["plan_id"]: F.row_peaks(p) for p in store.curves(key)} == \
        {p["plan_id"]: peaks[p["plan_id"]] for p in store.curves(key)}
    # the figure greys exactly what does not fit; the line under it counts the curves' plans that fit
    fig, lines = frontier_view(store, key, budget, reserve)
    drawn = {pid: colour != F.GREY for t in fig.data if t.meta["role"] in ("curve", "baseline")
             for pid, colour in zip(t.customdata, t.marker.color)}
    assert drawn == expected
    curve = [p["plan_id"] for p in store.curves(key)]
    assert lines[-1].startswith(f"{sum(expected[p] for p in curve)} of {len(curve)} plans on the curves fit")
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
    # m-topo's plan is not drawn twice: it is a point of the one-device curve, found by m-topo
    assert base["m-topo"]["same_as"] and base["m-topo"]["same_as"] in {p["plan_id"] for p in store.curves(key)}


def _text(component) -> str:
    """The text a Dash component shows (its children's strings, in order)."""
    if isinstance(component, str):
        return component
    children = getattr(component, "children", None)
    return "".join(_text(c) for c in (children if isinstance(children, list) else [children]) if c is not None)


def test_banner_of_a_v100_result_names_the_v100_device_model(gpt2_result):
    """Above a small GPT-2 on V100s: its times are the V100 device model's, said as such."""
    store, _, key, _ = gpt2_result
    banner = source_banner(store.summary(key))
    text = _text(banner)
    assert text.startswith("Operator times: Tesla V100-SXM2-16GB device model (calibration ")
    assert "device model" in text and "estimates, not measurements" in text
    # what the model was checked on: H100 steps, not a V100 (it said "checked … on 3 measured H100 steps")
    assert "not checked on a Tesla V100-SXM2-16GB: checked only on 3 measured H100 steps" in text
    assert banner.className == "times-modelled"


def test_banner_of_measured_times_and_notes():
    notes = ["gpu0: speed 2 as the cluster gives it", "gpu1: no kind stated, taken as the profiled device"]
    banner = source_banner({"times_from": "measured on AMD EPYC 7B13", "times_notes": notes, "times_modelled": False})
    *line, listed = banner.children
    assert _text(html.Div(line)) == "Operator times: measured on AMD EPYC 7B13"
    assert [_text(li) for li in listed.children] == notes and banner.className == "times-measured"
    assert _text(source_banner({})) == "Operator times: not recorded"   # a summary from before sources were kept


def test_the_search_notes_are_on_the_page(tiny_result, tmp_path):
    """The line above the frontier says whether the search was exact; the notes it points to are the
    frontier file's, every one, folded under a line that counts them (open when not exact)."""
    store, _, key, _ = tiny_result
    written = json.loads((store.folder(key) / "frontier.json").read_text())
    details = search_notes(store, key)
    summary, listed = details.children
    assert [_text(li) for li in listed.children] == written["notes"] and len(written["notes"]) > 2
    assert _text(summary) == f"the search's notes ({len(written['notes'])}): " + \
        ("exact" if written["exact"] else "not exact")
    assert details.open is False   # folded: open, 28 notes pushed the chart below a laptop's first screen
    assert ("; exact; " if written["exact"] else "; not exact (see the search notes below); ") in \
        summary_lines(store, key)[0]
    # a search that was not exact (the same file in a store of its own): its line says so, the notes stay folded
    other = ResultStore(tmp_path)
    (other.folder(key) / "frontier.json").write_text(json.dumps({**written, "exact": False}))
    assert _text(search_notes(other, key).children[0]).endswith("): not exact")
    assert search_notes(other, key).open is False


def test_the_placers_errors_are_folded_under_a_line_that_counts_them(gpt2_result):
    """Each baseline placer that made no plan, in its own words (baselines.json's), under one closed line;
    the lines above the chart hold them only when asked."""
    store, _, key, _ = gpt2_result
    written = [b for b in json.loads((store.folder(key) / "baselines.json").read_text()) if b.get("error")]
    details = placer_notes(store, key)
    title, listed = details.children
    assert _text(title) == f"baseline placers without a plan ({len(written)})" and details.open is False
    assert [_text(li) for li in listed.children] == \
        [b["error"] if b["error"].startswith(b["algo"]) else f"{b['algo']}: {b['error']}" for b in written]
    assert summary_lines(store, key) == summary_lines(store, key, errors=False) + [_text(li) for li in listed.children]


def test_page_data_is_what_the_script_needs(tiny_result):
    """The page's script gets every drawn plan once, each device's memory and price key: the same
    plans, peaks and fits the Python side computes (the browser test holds the script to them)."""
    store, _, key, _ = tiny_result
    data = page_data(store, key)
    drawn = F.drawn_plans(store.curves(key), store.baselines(key))
    assert [p["plan_id"] for p in data["plans"]] == [p["plan_id"] for p in drawn]
    assert len({p["plan_id"] for p in data["plans"]}) == len(data["plans"])            # one point per plan
    assert data["price_keys"] == {"gpu0": "titan-rtx", "gpu1": "titan-rtx"}
    assert data["kinds"] == {"titan-rtx": "TITAN RTX"}
    assert data["capacity"] == {d: store.cluster(key).device(d).memory_bytes for d in ("gpu0", "gpu1")}
    assert data["batch"] == store.graph(key).batch_size and json.dumps(data)        # plain JSON
    assert data["counts"] == [1, 2]                                                 # the rows of the table


def test_the_plan_commands_name_the_model_the_file_and_the_devices(tiny_result):
    store, req, key, _ = tiny_result
    two = next(p for p in store.curves(key) if p["num_devices"] == 2)
    text = plan_commands(store, key, two["plan_id"])
    lines = text.splitlines()
    assert lines[1] == f"tensoropt run {shlex.quote(req.model)} --plan {two['plan_id']}.json --check"
    assert lines[2] == (f"torchrun --nproc-per-node 2 -m tensoropt.cli run {shlex.quote(req.model)} --plan "
                        f"{two['plan_id']}.json --backend dist")
    assert lines[3] == (f"tensoropt export {two['plan_id']}.json {shlex.quote(req.model)} --to torchrun -o "
                        f"{two['plan_id']}-torchrun --cluster preset:titan-rtx-5")
    cmds, note = run_commands({"model": "/up/abc.onnx", "batch": 4, "precision": "bf16"}, "p1", 3)
    assert cmds[0].endswith("--plan p1.json --batch 4 --precision bf16 --check") and "ONNX" in note
    assert cmds[2] == "tensoropt export p1.json /up/abc.onnx --to torchrun -o p1-torchrun --batch 4 --precision bf16"
    # a pipeline over two copies of two ranks: four processes, PyTorch's pipelining; it exports too
    cmds, note = run_commands({"model": "zoo:llama3-8b?layers=2", "cluster": "preset:a100-4-nvlink"}, "p2", 4,
                              replicas=2, microbatches=4, pipeline="1f1b, 2 ranks × 2 data-parallel copies")
    assert cmds == ["torchrun --nproc-per-node 4 -m tensoropt.cli run 'zoo:llama3-8b?layers=2' --plan p2.json "
                    "--backend dist --check",
                    "torchrun --nproc-per-node 4 -m tensoropt.cli run 'zoo:llama3-8b?layers=2' --plan p2.json "
                    "--backend dist",
                    "tensoropt export p2.json 'zoo:llama3-8b?layers=2' --to torchrun -o p2-torchrun --cluster "
                    "preset:a100-4-nvlink"]
    assert note.startswith("a pipeline (1f1b, 2 ranks × 2 data-parallel copies) — PyTorch's pipelining runs it")
    # torchtitan's FSDP × TP over two hosts of two: the distributed run, and the export on a 2-D mesh
    cmds, note = run_commands({"model": "zoo:llama3-8b?layers=2", "cluster": "preset:h100-hosts?hosts=2&gpus=2"},
                              "p3", 2, replicas=2, mesh="dp 2 (FSDP2) × tp 2")
    assert cmds[1] == ("torchrun --nnodes 2 --nproc-per-node 2 -m tensoropt.cli run 'zoo:llama3-8b?layers=2' --plan "
                       "p3.json --backend dist")
    assert cmds[2] == ("tensoropt export p3.json 'zoo:llama3-8b?layers=2' --to torchrun -o p3-torchrun --cluster "
                       "'preset:h100-hosts?hosts=2&gpus=2'")
    assert "torchtitan's FSDP × TP" in note


EIGHT = tuple(f"gpu{i}" for i in range(8))


def test_no_banner_when_the_controls_ask_for_the_result_on_show():
    shown = Request(model="/w/tiny_model.py:build", cluster="preset:v100-8-nvlink", devices=EIGHT, precision=None)
    # the request the page's controls make for that result: written out, not copied
    again = request_from_controls("spec", "gpt2", "", "/w/tiny_model.py:build", None, None, None, "preset",
                                  "v100-8-nvlink", None, list(EIGHT), None, None, None, "auto", None, "fp32",
                                  algos=None)
    assert stale_text(shown.key, shown.to_dict(), again) is None


def test_banner_when_gpus_are_unchecked():
    """The issue's first case: the 8-GPU result stays on show while four GPUs are checked."""
    shown = Request(model="/w/tiny_model.py:build", cluster="preset:v100-8-nvlink", devices=EIGHT)
    four = dataclasses.replace(shown, devices=EIGHT[:4])
    assert stale_text(shown.key, shown.to_dict(), four) == (
        "these results are for tiny_model.py:build on v100-8-nvlink (devices gpu0–gpu7); the controls now ask "
        "for tiny_model.py:build on v100-8-nvlink (devices gpu0, gpu1, gpu2, gpu3; without gpu4, gpu5, gpu6, gpu7) "
        "— Run to update")
    # a device added back and one more unchecked: both said
    other = dataclasses.replace(shown, devices=("gpu0", "gpu1", "gpu2", "gpu4"))
    assert stale_text(four.key, four.to_dict(), other).endswith(
        "(devices gpu0, gpu1, gpu2, gpu4; without gpu3; adding gpu4) — Run to update")


def test_banner_after_a_cancelled_run_of_another_model_and_cluster():
    """The issue's second case: transformer-tiny on a100-4-nvlink on show, gpt2 on titan-rtx-5 asked for
    (the controls' devices: every one of titan-rtx-5's five)."""
    shown = Request(model="zoo:transformer-tiny", cluster="preset:a100-4-nvlink", devices=EIGHT[:4])
    wanted = request_from_controls("zoo", "gpt2", "", "", None, None, None, "preset", "titan-rtx-5", None, [], None,
                                   None, None, "auto", None, None, algos=None)
    assert stale_text(shown.key, shown.to_dict(), wanted) == (
        "these results are for zoo:transformer-tiny on a100-4-nvlink (devices gpu0, gpu1, gpu2, gpu3); the controls "
        "now ask for zoo:gpt2 on titan-rtx-5 (devices gpu0–gpu4) — Run to update")


def test_banner_names_every_field_that_differs():
    shown = Request(model="zoo:gpt2", cluster="preset:titan-rtx-5", devices=("gpu0",))
    wanted = dataclasses.replace(shown, batch=4, precision="bf16", repeats=1)
    assert stale_text(shown.key, shown.to_dict(), wanted) == (
        "these results are for zoo:gpt2 on titan-rtx-5 (the model's batch; fp32; 5 profiling repeats); the controls "
        "now ask for zoo:gpt2 on titan-rtx-5 (batch 4; bf16; 1 profiling repeat) — Run to update")


def test_controls_that_make_no_request_differ_from_any_result():
    shown = Request(model="zoo:gpt2", cluster="preset:titan-rtx-5")
    assert stale_text(shown.key, shown.to_dict(), "choose a cluster preset") == (
        "these results are for zoo:gpt2 on titan-rtx-5; the controls make no request: choose a cluster preset — "
        "then Run")


def test_the_plans_likely_clicked_first_are_simulated_ahead(hetero_result):
    """The GPUs-needed table's plans with no budget — on each GPU count the fastest whose simulated peaks
    fit each device's own memory (the simulator's peaks, the library's fits) — fastest first; warmed in a
    background thread, a click on one finds its simulation kept (Llama-3-8B: 0.3 to 0.7 s a plan)."""
    store, key = hetero_result
    cluster = store.cluster(key)
    fitting = [(plan.plan_id, len(plan.devices), peaks)
               for plan, peaks in ((store.plan(key, pid), p) for pid, p in _plans(store, key).items())
               if fits(peaks, cluster)]
    times = {pid: store.simulation(key, pid).time_s for pid, _, _ in fitting}
    best = {}
    for pid, k, _ in fitting:
        if k not in best or times[pid] < times[best[k]] - 5e-7:
            best[k] = pid
    want = sorted(best.values(), key=lambda pid: times[pid])
    assert likely_plans(store, key) == want and len(want) >= 1
    fresh = ResultStore(store.root)
    fresh.warm(key, want).join(60)
    assert all((key, "sim", pid, 0) in fresh._memo for pid in want)
