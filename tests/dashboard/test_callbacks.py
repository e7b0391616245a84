"""The dashboard's callbacks without a browser: the choice of where the operator times come from
as the run's request, a refused choice as the run button's message on the page (not a traceback);
the request the page opens with; nothing on the page waits for the run but the whole result."""


import pytest
from dash import no_update

from tensoropt.dashboard.callbacks import run_controls
from tensoropt.dashboard.layout import build_layout
from tensoropt.dashboard.pipeline import DEFAULT_CLUSTER, DEFAULT_MODEL, Request
from tensoropt.dashboard.requests import first_request, initial_controls, request_from_controls
from tensoropt.errors import TensorOptError

from .conftest import TINY

GiB = 2 ** 30


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


@pytest.mark.filterwarnings(r"ignore:\s*The dash_table.DataTable will be removed:DeprecationWarning")   # Dash's
def test_the_pipeline_schedules_ticked_are_the_request_s_pipelines():
    """The page opens with no schedule ticked (no pipeline priced: the CLI's default); those ticked are
    the request's ``pipelines``, in the priced order whatever the order of the ticks."""
    box = _component(build_layout(default_model=DEFAULT_MODEL, default_cluster=DEFAULT_CLUSTER, repeats=1,
                                  warmup=0), "pipelines")
    assert box.value == [] and [o["value"] for o in box.options] == [
        "gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb"]

    def pipelines(ticked):
        return request_from_controls("zoo", "gpt2", "layers=2", "", None, None, None, "preset", "titan-rtx-5", None,
                                     ["gpu0"], None, 1, 0, "auto", None, None, ticked, algos=()).pipelines

    assert pipelines(None) == () and pipelines([]) == ()
    assert pipelines(["interleaved-1f1b", "gpipe"]) == ("gpipe", "interleaved-1f1b")


def test_a_spec_typed_while_the_zoo_is_chosen_is_the_run_s_model():
    """The issue's third case: a spec typed with "zoo" still selected ran the zoo model ("cached result").
    The typed spec wins; a blank box, or one saying the zoo fields' own spec, leaves the zoo model."""
    def model(source, spec, params="layers=2"):
        return request_from_controls(source, "gpt2", params, spec, None, None, None, "preset", "titan-rtx-5", None,
                                     ["gpu0"], None, 1, 0, algos=()).model

    assert model("zoo", TINY) == TINY
    assert model("zoo", "  ") == "zoo:gpt2?layers=2"
    assert model("zoo", "zoo:gpt2?layers=2") == "zoo:gpt2?layers=2"
    assert model("zoo", "zoo:gpt2") == "zoo:gpt2"   # the zoo model with other parameters: what was typed
    assert model("spec", TINY) == TINY


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
