"""The dashboard's callbacks: :func:`register_callbacks` wires the layout of :mod:`.layout` to
the work of :mod:`.pipeline` and the figures of :mod:`.figures`.

Long work (capture, profiling, frontier tracking, baselines) runs as a Dash *background* callback
(its own process, a progress bar); it receives and returns JSON values only (the request as a
dict, the result's key), never torch objects.  Every callback turns bad input into a message on
the page (a :class:`~tensoropt.errors.TensorOptError`'s text) and leaves the rest of the page
working.

It owns the wiring (which input updates which output) and turning controls into a request; it
must not compute (:mod:`.pipeline` does) nor draw (:mod:`.figures` does), and it must not hand
torch objects to a background callback.
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable
from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, ctx, html, no_update

from tensoropt.describe import fmt_bytes
from tensoropt.errors import TensorOptError
from tensoropt.optimizers import DEFAULT_OPTIMIZER
from tensoropt.planmodel.fits import fits
from tensoropt.workflow import read_cluster

from . import figures
from .layout import COSTS_CHOICES, zoo_default_params, zoo_spec
from .pipeline import DETECTED, Request, ResultStore, run_request
from .uploads import accept_upload


def _explain(e: BaseException) -> str:
    if isinstance(e, TensorOptError):
        return f"error: {e}"
    return f"internal error: {type(e).__name__}: {e} (a bug in tensoropt; please report it)"


def cluster_spec(source: str, preset: str | None, uploaded: str | None) -> str:
    """The request's cluster string for the cluster controls' state."""
    if source == "detected":
        return DETECTED
    if source == "upload":
        if not uploaded:
            raise TensorOptError("upload a cluster YAML first, or choose a preset")
        return uploaded
    if not preset:
        raise TensorOptError("choose a cluster preset")
    return f"preset:{preset}"


def model_spec(source: str, zoo_name: str | None, zoo_params: str | None, spec: str | None,
               onnx_path: str | None) -> str:
    """The request's model spec for the model controls' state."""
    if source == "onnx":
        if not onnx_path:
            raise TensorOptError("upload an ONNX file first, or choose a zoo model")
        return onnx_path
    if source == "spec":
        text = (spec or "").strip()
        if not text:
            raise TensorOptError("write a model spec (zoo:NAME?k=v or file.py:factory)")
        return text
    if not zoo_name:
        raise TensorOptError("choose a zoo model")
    return zoo_spec(zoo_name, zoo_params)


def costs_fields(choice: str | None, profile_path: str | None, calibration_path: str | None) -> dict[str, Any]:
    """The request's ``costs_from``, ``profile`` and ``calibration`` for the ``costs-from`` control
    (:data:`~.layout.COSTS_CHOICES`): an uploaded profile is used only when that is the choice (and
    then priced as ``auto`` prices: as measured where its device is the cluster's kind); the
    calibration goes wherever a device model may price, so not with ``measured``."""
    choice = choice or "auto"
    if choice not in COSTS_CHOICES:
        raise TensorOptError(f"unknown choice of where the times come from: {choice!r}")
    if choice == "profile" and not profile_path:
        raise TensorOptError("upload a saved profile JSON first, or choose another source of the operator times")
    return {"costs_from": "auto" if choice == "profile" else choice,
            "profile": profile_path if choice == "profile" else None,
            "calibration": calibration_path if choice != "measured" else None}


def gib_bytes(value: float | str | None) -> float | None:
    """A GiB input in bytes; empty, non-numeric, infinite or not positive: ``None``."""
    try:
        gib = float(value) if value not in (None, "") else 0.0
    except (TypeError, ValueError):
        return None
    return gib * figures.GiB if math.isfinite(gib) and gib > 0 else None


def reserve_bytes(value: float | str | None) -> int:
    """The reserve input (GiB per device) in whole bytes; empty, non-numeric or not positive: 0."""
    return int(gib_bytes(value) or 0)


def frontier_view(store: ResultStore, key: str, budget: float | None, reserve: int,
                  selected: str | None = None) -> tuple[go.Figure, list[str]]:
    """The frontier figure of a result and the lines above it: what was computed, how many
    frontier plans fit (:func:`figures.fit_flags`: :func:`tensoropt.planmodel.fits.fits` of each plan's
    per-device peaks with ``budget`` — ``None``: each device's own memory — and ``reserve``),
    whether the baselines still run, and the placers' errors."""
    s = store.summary(key)
    rows, base, cluster = store.frontier_rows(key), store.baselines(key), store.cluster(key)
    title = f"{s['graph_name']} (batch {s['batch_size']}) on {s['cluster_name']}: {s['points']} Pareto-optimal plans"
    fig = figures.frontier_figure(rows, base, cluster=cluster, budget_bytes=budget, reserve_bytes=reserve,
                                  selected=selected, title=title)
    fit = figures.fit_flags(rows, [], cluster, budget_bytes=budget, reserve_bytes=reserve)
    lines = [f"{s['ops']} operators; devices {', '.join(s['devices'])}; profiled/captured in "
             f"{s['profile_s']:.1f} s, tracked in {s['tracking_s']:.1f} s; "
             f"{'exact' if s['exact'] else 'not exact (see the frontier notes)'}; "
             f"{sum(fit.values())} of {len(rows)} plans fit {figures.limit_text(budget, reserve)}"]
    if not store.complete(key):
        lines.append("the baseline placers are still running: their markers appear when they are done")
    # the placers' messages already name the placer
    lines += [b["error"] if b["error"].startswith(b["algo"]) else f"{b['algo']}: {b['error']}"
              for b in base if b.get("error")]
    return fig, lines


def plan_verdict(store: ResultStore, key: str, plan_id: str, budget: float | None, reserve: int) -> str:
    """Whether one plan of a result fits, in words (``fits …`` / ``does not fit …: gpu1 over by
    …``): :func:`tensoropt.planmodel.fits.fits` of its per-device peaks, as the frontier's markers judge it."""
    peaks = figures.plan_peaks(store.frontier_rows(key), store.baselines(key)).get(plan_id)
    if peaks is None:
        return ""
    cluster = store.cluster(key)
    limit = figures.limit_text(budget, reserve)
    if fits(peaks, cluster, budget=budget, reserve=reserve):
        return f"fits {limit}"
    return f"does not fit {limit}: {figures.over_text(peaks, cluster, budget_bytes=budget, reserve_bytes=reserve)}"


def _shown_key(store: ResultStore, done_key: str | None, partial_key: str | None) -> str | None:
    """The result on show: the finished one when there is one, else the frontier whose baselines
    still run."""
    return done_key if done_key and store.complete(done_key) else partial_key


def request_from_controls(source: str, zoo_name: str | None, zoo_params: str | None, spec: str | None,
                          onnx_path: str | None, profile_path: str | None, batch: Any, csource: str,
                          preset: str | None, cpath: str | None, devices: list[str] | None, optimizer: str | None,
                          repeats: Any, warmup: int | None, costs: str | None = "auto",
                          calibration_path: str | None = None, *, algos: tuple[str, ...] | None) -> Request:
    """The :class:`~.pipeline.Request` the run button asks for, from the controls' state (``costs``:
    the ``costs-from`` choice, see :func:`costs_fields`); bad input is a
    :class:`~tensoropt.errors.TensorOptError` saying what to fix."""
    cluster = cluster_spec(csource, preset, cpath)
    if not devices:
        # the device list is filled from the cluster after the page loads: all of them
        devices = list(read_cluster(cluster).names)
    return Request(model=model_spec(source, zoo_name, zoo_params, spec, onnx_path), cluster=cluster,
                   batch=int(batch) if batch not in (None, "") else None, devices=tuple(devices),
                   optimizer=optimizer or DEFAULT_OPTIMIZER, repeats=int(repeats) if repeats else 5,
                   warmup=int(warmup or 0), algos=algos, **costs_fields(costs, profile_path, calibration_path))


#: what the run button's background job reports: (done, total, text, the frontier's key once ready)
ProgressUpdate = tuple[str, str, str, str | None]


def run_controls(store: ResultStore, set_progress: Callable[[ProgressUpdate], None], controls: tuple[Any, ...],
                 algos: tuple[str, ...] | None) -> tuple[Any, str]:
    """The run button's work: the request of ``controls`` (in :func:`request_from_controls`' order)
    computed into ``store``, its progress through ``set_progress``.  Returns ``(key, "")``, or
    ``(no_update, message)`` when it failed: bad input — a cluster of another kind than the costs'
    included — is the library's message; anything else is an internal error, its traceback printed
    on the server's console, never on the page."""
    partial: list[str | None] = [None]

    def progress(stage: str, done: int, total: int, message: str) -> None:
        text = message if stage == "done" else f"{stage}: {message}"
        set_progress((str(done), str(max(total, 1)), text, partial[0]))

    def frontier_ready(key: str) -> None:
        partial[0] = key
        set_progress(("1", "1", "frontier ready; running the baseline placers", key))

    try:
        req = request_from_controls(*controls, algos=algos)
        key = run_request(req, store, progress, on_frontier=frontier_ready)
    except Exception as e:  # noqa: BLE001 - shown on the page; the app keeps working
        if not isinstance(e, TensorOptError):
            traceback.print_exc()
        return no_update, _explain(e)
    return key, ""


def source_banner(summary: dict[str, Any]) -> html.Div:
    """The banner above the frontier: where the result's operator times come from (measured on a
    device, or a device model's estimate, :func:`~.pipeline.times_source`) and what pricing decided."""
    source = summary.get("times_from") or "not recorded"
    modelled = bool(summary.get("times_modelled"))
    look = ({"background": "#fff4d6", "border": "1px solid #e0b040"} if modelled
            else {"background": "#eef4ee", "border": "1px solid #9c9"})
    hint = (" — estimates, not measurements: upload a profile measured on that GPU, or a calibration, to sharpen "
            "them" if modelled else "")
    notes = summary.get("times_notes") or []
    return html.Div(id="times-source", className="times-modelled" if modelled else "times-measured",
                    style={**look, "borderRadius": "4px", "padding": "4px 8px", "margin": "2px 0"},
                    children=[html.Span("Operator times: ", style={"fontWeight": "bold"}), source, hint,
                              *([html.Ul([html.Li(n) for n in notes], style={"margin": "2px 0"})] if notes else [])])


def _register_controls(app: dash.Dash, store: ResultStore) -> None:
    """The model, cluster and budget controls: zoo defaults, uploads, the device list, presets."""

    @app.callback(Output("zoo-params", "value"), Input("zoo-name", "value"), prevent_initial_call=True)
    def _zoo_defaults(name: str) -> str:
        return zoo_default_params(name) if name else ""

    @app.callback(Output("model-source", "value"), Input("onnx-path", "data"), prevent_initial_call=True)
    def _onnx_chosen(path: str | None) -> Any:
        return "onnx" if path else no_update

    @app.callback(Output("cluster-source", "value"), Input("cluster-path", "data"), prevent_initial_call=True)
    def _cluster_chosen(path: str | None) -> Any:
        return "upload" if path else no_update

    @app.callback(Output("costs-from", "value"), Input("profile-path", "data"), prevent_initial_call=True)
    def _profile_chosen(path: str | None) -> Any:
        return "profile" if path else no_update

    @app.callback(Output("onnx-path", "data"), Output("profile-path", "data"), Output("cluster-path", "data"),
                  Output("calibration-path", "data"), Output("upload-message", "children"),
                  Input("onnx-upload", "contents"), Input("profile-upload", "contents"),
                  Input("cluster-upload", "contents"), Input("calibration-upload", "contents"),
                  State("onnx-upload", "filename"), State("profile-upload", "filename"),
                  State("cluster-upload", "filename"), State("calibration-upload", "filename"),
                  prevent_initial_call=True)
    def _upload(onnx_c: str | None, prof_c: str | None, clus_c: str | None, cal_c: str | None, onnx_n: str | None,
                prof_n: str | None, clus_n: str | None, cal_n: str | None) -> tuple[Any, ...]:
        kind, contents, name, slot = {"onnx-upload": ("onnx", onnx_c, onnx_n, 0),
                                      "profile-upload": ("profile", prof_c, prof_n, 1),
                                      "cluster-upload": ("cluster", clus_c, clus_n, 2),
                                      "calibration-upload": ("calibration", cal_c, cal_n, 3)}[ctx.triggered_id]
        out: list[Any] = [no_update] * 4
        try:
            accepted = accept_upload(store, contents, name, kind)
        except Exception as e:  # noqa: BLE001 - a malformed upload is a message, the page keeps working
            out[slot] = None
            return (*out, html.Div(f"{_explain(e)}", className="upload-error", style={"color": "#a00"}))
        out[slot] = str(accepted.path)
        return (*out, html.Div(accepted.message, className="upload-ok", style={"color": "#060"}))

    @app.callback(Output("devices", "options"), Output("devices", "value"),
                  Output("run-message", "children", allow_duplicate=True),
                  Input("cluster-source", "value"), Input("cluster-preset", "value"), Input("cluster-path", "data"),
                  prevent_initial_call="initial_duplicate")
    def _devices(source: str, preset: str | None, uploaded: str | None) -> tuple[Any, ...]:
        try:
            cluster = read_cluster(cluster_spec(source, preset, uploaded))
        except Exception as e:  # noqa: BLE001
            return [], [], _explain(e)
        opts = [{"label": f"{d.name} ({fmt_bytes(d.memory_bytes)})", "value": d.name}
                for d in (cluster.device(n) for n in cluster.names)]
        return opts, list(cluster.names), ""

    @app.callback(Output("budget", "value"),
                  *[Input(f"budget-{g}", "n_clicks") for g in figures.GPU_PRESETS_GIB],
                  Input("budget-none", "n_clicks"), prevent_initial_call=True)
    def _budget_preset(*_clicks: int) -> float | None:
        which = ctx.triggered_id
        return None if which == "budget-none" else float(which.split("-")[1])


def _register_run(app: dash.Dash, store: ResultStore, algos: tuple[str, ...] | None) -> None:
    """The run button: :func:`~.pipeline.run_request` as a background job with a progress bar; the
    frontier's key arrives as progress (``partial-key``) before the baselines are done."""

    @app.callback(
        Output("result-key", "data"), Output("run-message", "children"),
        Input("run", "n_clicks"),
        State("model-source", "value"), State("zoo-name", "value"), State("zoo-params", "value"),
        State("model-spec", "value"), State("onnx-path", "data"), State("profile-path", "data"),
        State("batch", "value"), State("cluster-source", "value"), State("cluster-preset", "value"),
        State("cluster-path", "data"), State("devices", "value"), State("optimizer", "value"),
        State("repeats", "value"), State("warmup", "data"), State("costs-from", "value"),
        State("calibration-path", "data"),
        background=True,
        progress=[Output("progress", "value"), Output("progress", "max"), Output("progress-text", "children"),
                  Output("partial-key", "data")],
        running=[(Output("run", "disabled"), True, False)],
    )
    def _run(set_progress: Callable[[ProgressUpdate], None], _n: int, *controls: Any) -> tuple[Any, str]:
        return run_controls(store, set_progress, controls, algos)   # the States above: request_from_controls' order


def _register_frontier(app: dash.Dash, store: ResultStore) -> None:
    """The frontier figure, the summary above it, and which plan is selected."""

    @app.callback(Output("frontier-graph", "figure"), Output("result-summary", "children"),
                  Input("result-key", "data"), Input("partial-key", "data"), Input("budget", "value"),
                  Input("reserve", "value"), Input("selected-plan", "data"))
    def _frontier(done_key: str | None, partial_key: str | None, budget_gib: float | None,
                  reserve_gib: float | None, selected: str | None) -> tuple[Any, ...]:
        key = _shown_key(store, done_key, partial_key)
        if not key or not store.frontier_ready(key):
            return figures.frontier_figure([], title="no result yet: run profiling + frontier"), ""
        fig, lines = frontier_view(store, key, gib_bytes(budget_gib), reserve_bytes(reserve_gib), selected)
        return fig, [source_banner(store.summary(key)), html.Ul([html.Li(x) for x in lines], style={"margin": "2px 0"})]

    @app.callback(Output("selected-plan", "data"), Input("frontier-graph", "clickData"), prevent_initial_call=True)
    def _select(click: Any) -> Any:
        try:
            return str(click["points"][0]["customdata"])
        except (TypeError, KeyError, IndexError):
            return no_update

    @app.callback(Output("selected-plan", "data", allow_duplicate=True), Input("result-key", "data"),
                  Input("partial-key", "data"), prevent_initial_call=True)
    def _new_result(done_key: str | None, partial_key: str | None) -> Any:
        if ctx.triggered_id == "result-key" and done_key == partial_key:
            return no_update   # the baselines of the frontier on show are done: keep the selection
        return None   # a new result: the old selection is not one of its plans


def _register_plan(app: dash.Dash, store: ResultStore) -> None:
    """The selected plan's panel (summary, memory, timeline, graph, table) and the downloads."""

    @app.callback(Output("plan-panel", "style"), Output("plan-title", "children"), Output("plan-summary", "children"),
                  Output("memory-graph", "figure"), Output("gantt-graph", "figure"), Output("graph-graph", "figure"),
                  Output("plan-table", "data"),
                  Input("selected-plan", "data"), Input("budget", "value"), Input("reserve", "value"),
                  State("result-key", "data"), State("partial-key", "data"), prevent_initial_call=True)
    def _plan(plan_id: str | None, budget_gib: float | None, reserve_gib: float | None, done_key: str | None,
              partial_key: str | None) -> tuple[Any, ...]:
        key = _shown_key(store, done_key, partial_key)
        if not plan_id or not key:
            return ({"display": "none"}, "", [], no_update, no_update, no_update, [])
        budget, reserve = gib_bytes(budget_gib), reserve_bytes(reserve_gib)
        try:
            plan, graph, cluster = store.plan(key, plan_id), store.graph(key), store.cluster(key)
            sim = store.simulation(key, plan_id, reserve)
            verdict = plan_verdict(store, key, plan_id, budget, reserve)
        except Exception as e:  # noqa: BLE001
            return ({"display": "block"}, _explain(e), [], no_update, no_update, no_update, [])
        capacity = {d: cluster.device(d).memory_bytes for d in sim.memory}
        summary = [html.Li(x) for x in figures.plan_summary(plan, sim, verdict)]
        return ({"display": "block"}, f"plan {plan_id}", summary,
                figures.memory_figure(sim, capacity, budget_bytes=budget), figures.gantt_figure(sim),
                figures.graph_figure(plan, graph), figures.plan_table_rows(plan, graph))

    @app.callback(Output("download-plan", "data"), Input("download-plan-button", "n_clicks"),
                  State("selected-plan", "data"), State("result-key", "data"), State("partial-key", "data"),
                  prevent_initial_call=True)
    def _download_plan(_n: int, plan_id: str | None, done_key: str | None, partial_key: str | None) -> Any:
        key = _shown_key(store, done_key, partial_key)
        if not plan_id or not key:
            return no_update
        plan = store.plan(key, plan_id)
        return {"content": json.dumps(plan.to_dict(), indent=1), "filename": f"{plan_id}.json"}

    @app.callback(Output("download-csv", "data"), Input("download-csv-button", "n_clicks"),
                  State("result-key", "data"), State("partial-key", "data"), prevent_initial_call=True)
    def _download_csv(_n: int, done_key: str | None, partial_key: str | None) -> Any:
        key = _shown_key(store, done_key, partial_key)
        if not key or not store.frontier_ready(key):
            return no_update
        s = store.summary(key)
        return {"content": store.frontier_csv(key), "filename": f"frontier-{s['graph_name']}.csv"}


def register_callbacks(app: dash.Dash, store: ResultStore, *, algos: tuple[str, ...] | None = None) -> None:
    """Attach every callback of the page to ``app``; results live in ``store``; ``algos``: the
    baseline placers to run (default: all)."""
    _register_controls(app, store)
    _register_run(app, store, algos)
    _register_frontier(app, store)
    _register_plan(app, store)


__all__ = ["register_callbacks", "cluster_spec", "model_spec", "costs_fields", "gib_bytes", "reserve_bytes",
           "plan_verdict", "frontier_view", "request_from_controls", "run_controls", "source_banner"]
