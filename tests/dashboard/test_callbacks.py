"""The dashboard's callbacks' work without a browser: the page's inputs in bytes; on a cluster of
unequal GPUs the page's decision of which plans fit equals :func:`tensoropt.planmodel.fits.fits` of the
simulator's per-device peaks — the rule of the CLI, the CSV and ``tensoropt compare``; the choice of
where the operator times come from, the banner saying it, and a refused choice as a message; the
URL's state written and read back; what the page's script is handed; the commands of a plan."""

import json
import math
import shlex
from urllib.parse import parse_qsl

import pytest
from dash import html, no_update

from tensoropt.dashboard import figures as F
from tensoropt.dashboard.callbacks import (
    URL_KEYS,
    apply_url,
    frontier_view,
    gib_bytes,
    page_data,
    plan_commands,
    plan_verdict,
    reserve_bytes,
    run_controls,
    source_banner,
    url_state,
)
from tensoropt.dashboard.commands import run_commands
from tensoropt.dashboard.layout import build_layout
from tensoropt.dashboard.pipeline import DEFAULT_CLUSTER, DEFAULT_MODEL, Request, save_upload
from tensoropt.dashboard.requests import first_request, initial_controls, request_from_controls
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


def test_banner_of_a_v100_result_names_the_v100_device_model(gpt2_result):
    """Above a small GPT-2 on V100s: its times are the V100 device model's, said as such."""
    store, _, key, _ = gpt2_result
    banner = source_banner(store.summary(key))
    text = _text(banner)
    assert text.startswith("Operator times: Tesla V100-SXM2-16GB device model (calibration ")
    assert "device model" in text and "estimates, not measurements" in text
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


def test_the_url_holds_the_page_state_and_reads_back(tiny_result, tmp_path):
    """Every control the URL holds comes back from it; defaults are left out; an upload is named by its
    content, not by its path on the server."""
    store = tiny_result[0]
    search = url_state(store, source="zoo", zoo_name="gpt2", zoo_params="layers=6&hidden=256", spec="", onnx_path=None,
                       csource="preset", preset="v100-8-nvlink", cpath=None, devices=["gpu0", "gpu1"], batch=16,
                       optimizer="sgd", precision="bf16", costs="model", budget=2.5, reserve=0.5,
                       price={"v100-sxm2-16gb": 2.0, "l4": None}, epoch=5000, plan="p003-2dev")
    assert search.startswith("?model=zoo:gpt2%3Flayers%3D6%26hidden%3D256&cluster=preset:v100-8-nvlink"
                             "&devices=gpu0,gpu1")
    got = apply_url(search, store)
    assert got == {"run": True, "messages": [], "model_source": "zoo", "zoo_name": "gpt2",
                   "zoo_params": "layers=6&hidden=256", "cluster_source": "preset", "cluster_preset": "v100-8-nvlink",
                   "devices": ["gpu0", "gpu1"], "batch": 16, "optimizer": "sgd", "precision": "bf16", "costs": "model",
                   "budget": 2.5, "reserve": 0.5, "epoch": 5000, "prices": {"v100-sxm2-16gb": 2.0}, "plan": "p003-2dev"}
    assert set(URL_KEYS) == {k for k, _ in parse_qsl(search[1:])}
    # nothing set, nothing said: the page's defaults stay
    assert apply_url("", store) == {"run": True, "messages": []}
    # an uploaded cluster travels as upload:NAME and comes back as the same file
    up = save_upload(store, b"name: c\ndevices: []\n", ".yaml")
    search = url_state(store, source="zoo", zoo_name="gpt2", zoo_params="", spec="", onnx_path=None,
                       csource="upload", preset=None, cpath=str(up), devices=None)
    assert f"cluster=upload:{up.name}" in search and str(up.parent) not in search
    assert apply_url(search, store)["cluster_path"] == str(up)


def test_a_link_never_runs_a_file_of_this_machine(tiny_result):
    """A link may name any model spec, but only a zoo model or an upload runs at once: a
    ``file.py:factory`` spec (code of this machine) is filled in and waits for the run button; a
    missing upload, an unknown cluster and bad numbers are said or dropped."""
    store = tiny_result[0]
    got = apply_url("?model=/tmp/evil.py:build&cluster=preset:titan-rtx-5", store)
    assert got["run"] is False and got["model_source"] == "spec" and got["model_spec"] == "/tmp/evil.py:build"
    assert "press run" in got["messages"][0]
    # the model the server was started with is the page's own default: a link runs it
    assert apply_url("?model=/tmp/evil.py:build", store, trusted=("/tmp/evil.py:build",))["run"] is True
    got = apply_url("?model=upload:0123abcd.onnx&cluster=/etc/passwd&budget=-3&batch=x&price=v100:abc", store)
    assert got["run"] is False and "model_source" not in got and "budget" not in got and "batch" not in got
    assert got["prices"] == {} and len(got["messages"]) == 2
    assert apply_url("?model=upload:../../etc/passwd.onnx", store)["run"] is False   # no path out of the uploads


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


@pytest.mark.filterwarnings(r"ignore:\s*The dash_table.DataTable will be removed:DeprecationWarning")   # Dash's
def test_the_first_request_is_llama3_8b_where_data_parallelism_does_not_fit():
    """What ``tensoropt app`` starts computing with the server is the request the page makes when it
    opens: Llama 3.1 8B in FSDP2's mixed precision (bf16 copies of fp32 master weights: how it is
    trained), AdamW, on every GPU of one host of eight H100 80 GB, times from ``auto``, the server's
    profiling repeats and placers (written out here, not derived) — and the page's budget is each
    device's own memory, at which data parallelism does not fit.

    By hand: Llama 3.1 8B has 8,030,261,248 parameters (Meta's published count: embeddings and output
    128,256 x 4,096 each, 32 blocks of attention 4,096 x (4,096 + 2 x 1,024 + 4,096), SwiGLU
    3 x 4,096 x 14,336 and two RMSNorms of 4,096, a final RMSNorm: 2 x 525,336,576 + 32 x 218,112,000 + 4,096).
    Data parallelism keeps all of it on every GPU: fp32 parameters (4 B), their gradients (4 B) and
    AdamW's two moments (8 B) — 16 B each, 128,484,179,968 B = 119.7 GiB, more than the 80 GiB
    (85,899,345,920 B) of an H100 80 GB before a single activation or bf16 copy."""
    from tensoropt import load_cluster

    want = Request(model="zoo:llama3-8b", cluster="preset:h100-hosts?hosts=1",
                   devices=tuple(f"h0g{i}" for i in range(8)), optimizer="adamw", precision="bf16-params",
                   repeats=3, warmup=1, algos=None, costs_from="auto")
    assert first_request(DEFAULT_MODEL, DEFAULT_CLUSTER, 3, 1, algos=None) == want
    assert first_request(DEFAULT_MODEL, DEFAULT_CLUSTER, 3, 1, algos=None).key == want.key
    params = 2 * 128256 * 4096 + 32 * (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096) + 4096
    assert params == 8_030_261_248
    cluster = load_cluster(DEFAULT_CLUSTER)
    assert [cluster.device(d).memory_bytes for d in want.devices] == [80 * GiB] * 8
    assert 16 * params == 128_484_179_968 > 80 * GiB
    # the page opens with no budget of its own (each device's memory) and the precision it trains in
    layout = build_layout(default_model=DEFAULT_MODEL, default_cluster=DEFAULT_CLUSTER, repeats=3, warmup=1)
    assert "value" not in _component(layout, "budget").to_plotly_json()["props"]   # none set: each device's own
    assert _component(layout, "precision").value == "bf16-params"
    assert _component(layout, "cluster-preset").value == "h100-hosts?hosts=1"
    assert "h100-hosts?hosts=1" in _component(layout, "cluster-preset").options
    # not a property of one default: another model and cluster keep theirs
    tiny = first_request(TINY, "preset:titan-rtx-5", 1, 0, algos=("dp",))
    assert (tiny.model, tiny.devices, tiny.algos, tiny.repeats) == (TINY, tuple(f"gpu{i}" for i in range(5)),
                                                                  ("dp",), 1)
    assert first_request(TINY, "preset:titan-rtx-5", 1, 0, algos=(), default_precision=None).precision is None


def test_a_default_cluster_file_stands_as_the_uploaded_cluster(tmp_path):
    """``tensoropt app --cluster my.yaml``: the page opens on that file (not on the first preset), and
    on this machine's GPUs for ``detected``."""
    from tensoropt import load_cluster

    path = tmp_path / "two.yaml"
    load_cluster("preset:titan-rtx-5").save(path)
    c = initial_controls(TINY, str(path))
    assert (c["model_source"], c["model_spec"], c["cluster_source"], c["cluster_path"]) == \
        ("spec", TINY, "upload", str(path))
    assert first_request(TINY, str(path), 1, 0, algos=()).cluster == str(path)
    assert initial_controls(DEFAULT_MODEL, "detected")["cluster_source"] == "detected"
    assert initial_controls(DEFAULT_MODEL, DEFAULT_CLUSTER)["cluster_preset"] == "h100-hosts?hosts=1"


def test_nothing_waits_for_the_run_but_the_whole_result(tmp_path):
    """Dash holds back a callback whose input is an output of a background callback still running, and
    every callback downstream of it (seen on Dash 4.4: the page drew its frontier only once the
    baselines were done, half a minute later).  So the frontier on show (``shown-key``) is written first
    from the run's progress (``partial-key``), and the run's own outputs are read by one callback only,
    whose output is a duplicate of ``shown-key`` — a distinct output to Dash, which does not hold back
    what reads ``shown-key``."""
    from tensoropt.dashboard import create_app

    cmap = create_app(cache_dir=tmp_path).callback_map
    (run,) = [k for k, cb in cmap.items() if cb.get("background")]
    run_outputs = {o.split("@")[0] for o in run.strip(".").split("...")}
    assert run_outputs == {"result-key.data", "run-message.children"}
    readers = {k: [f"{i['id']}.{i['property']}" for i in cb["inputs"]] for k, cb in cmap.items()}
    waiting = [k for k, ins in readers.items() if run_outputs & set(ins)]
    assert len(waiting) == 1 and waiting[0].startswith("shown-key.data@")
    assert readers["shown-key.data"] == ["partial-key.data"]
