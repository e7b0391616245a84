"""The dashboard's callbacks: :func:`register_callbacks` wires the layout of :mod:`.layout` to
the work of :mod:`.pipeline`, what :mod:`.views` says of a result, the URL's state of
:mod:`.urlstate` and the figures of :mod:`.figures` and :mod:`.plangraph`.

Long work (capture, profiling, frontier tracking, baselines) runs as a Dash *background* callback
(its own process, a progress bar, a cancel button; :func:`run_controls` is its work); it receives
and returns JSON values only (the request as a dict, the result's key), never torch objects.
Every callback turns bad input into a message on the page — a
:class:`~tensoropt.errors.TensorOptError`'s text after ``error:``, the words the CLI prints — and
leaves the rest of the page working.

What a budget, reserve, price or epoch size changes is redrawn in the browser
(:mod:`.clientside`, fed once per result by :func:`~.views.page_data`); the URL's query string holds
the page's state (:func:`~.urlstate.url_state` writes it, :func:`~.urlstate.apply_url` reads it back
on load).

It owns the wiring (which input updates which output) and the run button's job; it must not
compute (:mod:`.pipeline` does), word what the page shows of a result (:mod:`.views` does), encode
the URL (:mod:`.urlstate` does) nor draw (:mod:`.figures` does), and it must not hand torch objects
to a background callback.
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Callable, Collection, Mapping
from typing import Any

import dash
from dash import ALL, Input, Output, State, ctx, html, no_update

from tensoropt.cluster import list_presets
from tensoropt.errors import TensorOptError
from tensoropt.workflow import read_cluster

from . import figures, plangraph
from .clientside import VIEW_JS
from .commands import plan_filename
from .layout import DEFAULT_EPOCH, STALE_BANNER_STYLE
from .pipeline import ResultStore, behind_the_page, run_request
from .requests import chosen_source, cluster_spec, request_from_controls, zoo_default_params
from .tables import table_page
from .uploads import accept_upload
from .urlstate import apply_url, url_state
from .views import (
    compare_summary,
    device_options,
    frontier_view,
    gib_bytes,
    graph_hint,
    likely_plans,
    page_data,
    placer_notes,
    plan_commands,
    plan_options,
    plan_verdict,
    price_inputs,
    reserve_bytes,
    search_notes,
    shown_key,
    source_banner,
    stale_text,
    summary_lines,
)


def _explain(e: BaseException) -> str:
    if isinstance(e, TensorOptError):
        return f"error: {e}"
    return f"internal error: {type(e).__name__}: {e} (a bug in tensoropt; please report it)"


#: what the run button's background job reports: (done, total, text, the frontier's key once ready)
ProgressUpdate = tuple[str, str, str, str | None]


def run_controls(store: ResultStore, set_progress: Callable[[ProgressUpdate], None], controls: tuple[Any, ...],
                 algos: tuple[str, ...] | None, *, own_process: bool = False) -> tuple[Any, str]:
    """The run button's work: the request of ``controls`` (in :func:`request_from_controls`' order)
    computed into ``store``, its progress through ``set_progress``.  Returns ``(key, "")``, or
    ``(no_update, message)`` when it failed: bad input — a cluster of another kind than the costs'
    included — is the library's message; anything else is an internal error, its traceback printed
    on the server's console, never on the page.  ``own_process``: this is a job's process (a
    background callback's), whose baselines run behind the page once its frontier is written
    (:func:`~.pipeline.behind_the_page`)."""
    partial: list[str | None] = [None]

    def progress(stage: str, done: int, total: int, message: str) -> None:
        text = message if stage == "done" else f"{stage}: {message}"
        set_progress((str(done), str(max(total, 1)), text, partial[0]))

    def frontier_ready(key: str) -> None:
        partial[0] = key
        set_progress(("1", "1", "frontier ready; running the baseline placers", key))
        if own_process:
            behind_the_page()

    try:
        req = request_from_controls(*controls, algos=algos)
        key = run_request(req, store, progress, on_frontier=frontier_ready)
    except Exception as e:  # noqa: BLE001 - shown on the page; the app keeps working
        if not isinstance(e, TensorOptError):
            traceback.print_exc()
        return no_update, _explain(e)
    return key, ""


# ---- the controls ------------------------------------------------------------------------------
def _register_controls(app: dash.Dash, store: ResultStore) -> None:
    """The model, cluster and budget controls: zoo defaults, uploads, the device list, presets."""

    @app.callback(Output("zoo-params", "value"), Output("zoo-params-for", "data"), Input("zoo-name", "value"),
                  State("zoo-params-for", "data"), prevent_initial_call=True)
    def _zoo_defaults(name: str, params_for: str | None) -> tuple[Any, Any]:
        if not name or name == params_for:   # the parameters on show are this model's (a link set them)
            return no_update, no_update
        return zoo_default_params(name), name

    @app.callback(Output("model-source", "value", allow_duplicate=True), Output("model-spec", "value",
                                                                                 allow_duplicate=True),
                  Input("model-source", "value"), Input("model-spec", "value"), Input("zoo-name", "value"),
                  Input("zoo-params", "value"), prevent_initial_call=True)
    def _model_choice(source: str, spec: str | None, zoo_name: str | None, zoo_params: str | None) -> tuple[Any, Any]:
        # the radio follows the request (requests.chosen_source: a spec typed while the zoo is chosen wins, whether or
        # not this has run when the run button reads the controls); choosing another source, a zoo model or its
        # parameters empties the spec box, which would otherwise win over them.  A link sets these all at once, and
        # consistently (apply_url): nothing changes then.
        which = {t["prop_id"].split(".")[0] for t in ctx.triggered}
        typed = (spec or "").strip()
        if which & {"zoo-name", "zoo-params"} and not which & {"model-source", "model-spec"}:
            return ("zoo" if source != "zoo" else no_update), ("" if typed else no_update)
        if "model-spec" in which and typed:
            meant = "spec" if source == "onnx" else chosen_source(source, zoo_name, zoo_params, spec)
            return (meant if meant != source else no_update), no_update
        if "model-source" in which and source != "spec" and typed:
            return no_update, ""
        return no_update, no_update

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

    @app.callback(Output("devices", "options"), Output("devices", "value", allow_duplicate=True),
                  Output("devices-for", "data", allow_duplicate=True),
                  Output("run-message", "children", allow_duplicate=True),
                  Input("cluster-source", "value"), Input("cluster-preset", "value"), Input("cluster-path", "data"),
                  State("devices", "value"), State("devices-for", "data"),
                  prevent_initial_call="initial_duplicate")
    def _devices(source: str, preset: str | None, uploaded: str | None, chosen: list[str] | None,
                 chosen_for: str | None) -> tuple[Any, ...]:
        try:
            spec = cluster_spec(source, preset, uploaded)
            cluster = read_cluster(spec)
        except Exception as e:  # noqa: BLE001
            return [], [], None, _explain(e)
        opts = device_options(cluster)
        if chosen and chosen_for == spec and set(chosen) <= set(cluster.names):
            return opts, no_update, no_update, ""   # a selection made for this cluster (by a link, say) stays
        return opts, list(cluster.names), spec, ""

    @app.callback(Output("budget", "value", allow_duplicate=True),
                  *[Input(f"budget-{g}", "n_clicks") for g in figures.GPU_PRESETS_GIB],
                  Input("budget-none", "n_clicks"), prevent_initial_call=True)
    def _budget_preset(*_clicks: int) -> float | None:
        which = ctx.triggered_id
        return None if which == "budget-none" else float(which.split("-")[1])


# ---- the run -------------------------------------------------------------------------------------
_RUN_STATES = (State("model-source", "value"), State("zoo-name", "value"), State("zoo-params", "value"),
               State("model-spec", "value"), State("onnx-path", "data"), State("profile-path", "data"),
               State("batch", "value"), State("cluster-source", "value"), State("cluster-preset", "value"),
               State("cluster-path", "data"), State("devices", "value"), State("optimizer", "value"),
               State("repeats", "value"), State("warmup", "data"), State("costs-from", "value"),
               State("calibration-path", "data"), State("precision", "value"), State("pipelines", "value"))


def _register_run(app: dash.Dash, store: ResultStore, algos: tuple[str, ...] | None) -> None:
    """The run button (and the stale-result banner's): :func:`~.pipeline.run_request` as a background
    job with a progress bar and a cancel button; the frontier's key arrives as progress (``partial-key``)
    before the baselines are done.  The page's first run starts once the URL's state is applied
    (``url-ready``).  Each run clears the lines of the last; the banner says when the result on show is
    not the one the controls ask for (:func:`~.views.stale_text`)."""

    @app.callback(
        Output("result-key", "data"), Output("run-message", "children"),
        Input("run", "n_clicks"), Input("stale-run", "n_clicks"), Input("url-ready", "data"), *_RUN_STATES,
        background=True, prevent_initial_call=True,
        progress=[Output("progress", "value"), Output("progress", "max"), Output("progress-text", "children"),
                  Output("partial-key", "data")],
        running=[(Output("run", "disabled"), True, False), (Output("stale-run", "disabled"), True, False),
                 (Output("cancel", "disabled"), False, True)],
        cancel=[Input("cancel", "n_clicks")],
        interval=250,   # how often the page asks for progress: the frontier is drawn up to this much after it is ready
    )
    def _run(set_progress: Callable[[ProgressUpdate], None], _n: int, _stale: int, ready: Any,
             *controls: Any) -> tuple[Any, str]:
        if ctx.triggered_id == "url-ready" and not (ready or {}).get("run", True):
            try:   # a link's model that is not run by itself: its result, when computed already, is only read back
                computed = store.complete(request_from_controls(*controls, algos=algos).key)
            except Exception:  # noqa: BLE001 - the message below says what to do
                computed = False
            if not computed:
                return no_update, " ".join((ready or {}).get("messages", []))
        return run_controls(store, set_progress, controls, algos,   # the States: request_from_controls' order
                            own_process=True)

    # each run starts on a clean slate: no status or error line of an earlier run (or upload) stays under the
    # buttons.  In the browser, so that it lands before the run's own lines, whatever the server's pace
    app.clientside_callback(
        "function(a, b) { return ['', '', '']; }",
        Output("progress-text", "children", allow_duplicate=True),
        Output("run-message", "children", allow_duplicate=True),
        Output("upload-message", "children", allow_duplicate=True),
        Input("run", "n_clicks"), Input("stale-run", "n_clicks"), prevent_initial_call=True)

    @app.callback(Output("stale-banner", "style"), Output("stale-text", "children"),
                  Input("shown-key", "data"), *[Input(s.component_id, s.component_property) for s in _RUN_STATES])
    def _stale(shown: Mapping[str, Any] | None, *controls: Any) -> tuple[Any, str]:
        key = shown_key(shown)
        if not key or not store.frontier_ready(key):
            return {"display": "none"}, ""
        try:
            wanted: Any = request_from_controls(*controls, algos=algos)
        except Exception as e:  # noqa: BLE001 - controls that make no request differ from any result
            wanted = str(e)
        text = stale_text(key, store.summary(key).get("request") or {}, wanted)
        return ({"display": "none"}, "") if text is None else (STALE_BANNER_STYLE, text)

    @app.callback(Output("progress-text", "children", allow_duplicate=True),
                  Output("run-message", "children", allow_duplicate=True),
                  Input("cancel", "n_clicks"), prevent_initial_call=True)
    def _cancelled(_n: int) -> tuple[str, str]:
        return "cancelled", "the run was cancelled: nothing of it is kept; press run to start again"


# ---- the frontier, the GPUs-needed table, the selection -------------------------------------------
def _register_frontier(app: dash.Dash, store: ResultStore) -> None:
    """The frontier figure (drawn on the server once per result and selection, restyled in the
    browser for the budget), the summary above it, the GPUs-needed table, which plan is selected."""

    # the result on show: its frontier as soon as the run reports it (partial-key, a progress output), then the whole
    # result (result-key, the run's output).  A callback whose input is an output of a running background callback
    # waits until that callback ends, and so does every callback downstream of it: so nothing on the page takes
    # result-key as an input but the second writer here, whose output is a duplicate (a distinct output to Dash,
    # which then does not hold back what reads shown-key).  The primary writer must be the partial one.
    # (in the browser: every progress report sets partial-key again, most often to nothing)
    app.clientside_callback(
        "function(k) { return k ? {key: k, done: false} : window.dash_clientside.no_update; }",
        Output("shown-key", "data"), Input("partial-key", "data"), prevent_initial_call=True)

    @app.callback(Output("shown-key", "data", allow_duplicate=True), Input("result-key", "data"),
                  prevent_initial_call=True)
    def _show_result(done_key: str | None) -> Any:
        return {"key": done_key, "done": True} if done_key and store.complete(done_key) else no_update

    # the result's data, lines and plan choices: once per result shown (not on each selection: a click on a plan
    # redrew all of them, 0.3 s of the server's and the page's time on Llama-3-8B, to move one ring)
    @app.callback(Output("page-data", "data"), Output("result-summary", "children"), Output("compare-plan", "options"),
                  Input("shown-key", "data"))
    def _result(shown: Mapping[str, Any] | None) -> tuple[Any, ...]:
        key = shown_key(shown)
        if not key or not store.frontier_ready(key):
            return None, "", []
        try:
            lines = summary_lines(store, key, errors=False)
            errors = placer_notes(store, key)
            notes = search_notes(store, key)
            data = page_data(store, key)
        except Exception as e:  # noqa: BLE001 - a result that cannot be read is a message
            if not isinstance(e, TensorOptError):
                traceback.print_exc()
            return no_update, html.Div(_explain(e), style={"color": "#a00"}), no_update
        summary = [source_banner(store.summary(key)), html.Ul([html.Li(x) for x in lines], style={"margin": "2px 0"}),
                   errors, notes]
        if store.complete(key):   # every plan there: simulate those a click most likely opens, ahead of it
            store.warm(key, likely_plans(store, key))
        return data, summary, plan_options(store, key)

    # the frontier as the server draws it, once per result (the page's script greys it for the budget and rings
    # the selected and compared plans in the browser: a click sends no figure)
    @app.callback(Output("frontier-base", "data"), Input("shown-key", "data"))
    def _frontier(shown: Mapping[str, Any] | None) -> Any:
        key = shown_key(shown)
        if not key or not store.frontier_ready(key):
            return figures.frontier_figure([], title="no result yet: run profiling + frontier").to_plotly_json()
        try:
            fig, _lines = frontier_view(store, key, None, 0)
        except Exception:  # noqa: BLE001 - _result says why the result cannot be read
            return no_update
        return fig.to_plotly_json()

    app.clientside_callback(
        VIEW_JS,
        Output("frontier-graph", "figure"), Output("gpus-table", "data"), Output("fit-summary", "children"),
        Output("decision", "children"),
        Input("frontier-base", "data"), Input("page-data", "data"), Input("budget", "value"), Input("reserve", "value"),
        Input({"type": "price", "kind": ALL}, "value"), Input("epoch", "value"), Input("selected-plan", "data"),
        Input("compare-plan", "value"), State({"type": "price", "kind": ALL}, "id"))

    @app.callback(Output("price-inputs", "children"), Input("page-data", "data"), State("url-prices", "data"),
                  State({"type": "price", "kind": ALL}, "value"), State({"type": "price", "kind": ALL}, "id"),
                  prevent_initial_call=True)
    def _prices(data: Mapping[str, Any] | None, wanted: Mapping[str, float] | None, values: list[Any],
                ids: list[Mapping[str, str]]) -> Any:
        if not data:
            return no_update
        current = {i["kind"]: v for i, v in zip(ids, values)}
        if set(current) == set(data["kinds"]):
            return no_update   # the same kinds: keep what the user typed
        return price_inputs(data["kinds"], current, wanted or {})

    # a table click's cell is let go at once: a second click on the same row (after a point was clicked) is a new
    # active cell, else Dash sees no change and the row's plan does not open again
    @app.callback(Output("selected-plan", "data"), Output("gpus-table", "active_cell"),
                  Input("frontier-graph", "clickData"), Input("gpus-table", "active_cell"),
                  State("gpus-table", "data"), State("page-data", "data"), prevent_initial_call=True)
    def _select(click: Any, cell: Any, rows: list[dict[str, Any]] | None,
                data: Mapping[str, Any] | None) -> tuple[Any, Any]:
        if ctx.triggered_id == "gpus-table":
            if not cell:
                return no_update, no_update
            try:
                # the row's plan id (a column the table does not show: the plan cell may say more; a folded
                # row's is the plan of the smaller count it names)
                wanted = rows[cell["row"]].get("plan_id") if rows else None
                hit = next((p["plan_id"] for p in (data or {}).get("plans", []) if p["plan_id"] == wanted), None)
            except (TypeError, KeyError, IndexError):
                return no_update, None
            return hit or no_update, None
        try:
            return str(click["points"][0]["customdata"]), no_update
        except (TypeError, KeyError, IndexError):
            return no_update, no_update

    @app.callback(Output("selected-plan", "data", allow_duplicate=True), Output("url-plan", "data"),
                  Input("shown-key", "data"), State("url-plan", "data"), State("selected-plan", "data"),
                  prevent_initial_call=True)
    def _new_result(shown: Mapping[str, Any] | None, wanted: str | None, selected: str | None) -> tuple[Any, Any]:
        key = shown_key(shown)
        ids: set[str] = set()
        if key and store.frontier_ready(key):
            ids = {p["plan_id"] for p in figures.drawn_plans(store.curves(key), store.baselines(key))}
        if wanted and wanted in ids:
            return wanted, None   # the link's plan, once it is there
        if selected in ids or selected is None:
            # still a plan of the result on show (its baselines came), or none: kept — writing None again would
            # draw the frontier a second time (every reader of selected-plan runs again: 0.5 s on the default)
            return no_update, no_update
        return None, no_update


# ---- the selected plan ---------------------------------------------------------------------------
def _register_plan(app: dash.Dash, store: ResultStore) -> None:
    """The selected plan's panel (summary, commands, memory, timeline, graph, table), the plan graph's
    groups and node details, the compared plan, and the downloads."""

    @app.callback(Output("plan-panel", "style"), Output("plan-title", "children"), Output("plan-summary", "children"),
                  Output("memory-graph", "figure"), Output("run-commands", "children"),
                  Input("selected-plan", "data"), Input("budget", "value"), Input("reserve", "value"),
                  State("shown-key", "data"), prevent_initial_call=True)
    def _plan(plan_id: str | None, budget_gib: float | None, reserve_gib: float | None,
              shown: Mapping[str, Any] | None) -> tuple[Any, ...]:
        key = shown_key(shown)
        if not plan_id or not key:
            return ({"display": "none"}, "", [], no_update, "")
        budget, reserve = gib_bytes(budget_gib), reserve_bytes(reserve_gib)
        try:
            plan, cluster = store.plan(key, plan_id), store.cluster(key)
            sim = store.simulation(key, plan_id, reserve)
            verdict = plan_verdict(store, key, plan_id, budget, reserve)
            commands = plan_commands(store, key, plan_id)
        except Exception as e:  # noqa: BLE001
            if not isinstance(e, TensorOptError):
                traceback.print_exc()
            return ({"display": "block"}, _explain(e), [], no_update, "")
        capacity = {d: cluster.device(d).memory_bytes for d in sim.memory}
        summary = [html.Li(x) for x in figures.plan_summary(plan, sim, verdict)]
        return ({"display": "block"}, f"plan {plan_id}", summary,
                figures.memory_figure(sim, capacity, budget_bytes=budget), commands)

    # the timeline apart: a budget changes the memory chart and the verdict, never the timeline (its thousand bars
    # were sent and drawn again on every budget typed while a plan was open)
    @app.callback(Output("gantt-graph", "figure"), Input("selected-plan", "data"), Input("reserve", "value"),
                  State("shown-key", "data"), prevent_initial_call=True)
    def _timeline(plan_id: str | None, reserve_gib: float | None, shown: Mapping[str, Any] | None) -> Any:
        key = shown_key(shown)
        if not plan_id or not key:
            return no_update
        try:
            return figures.gantt_figure(store.simulation(key, plan_id, reserve_bytes(reserve_gib)))
        except Exception:  # noqa: BLE001 - the panel's title says why (the same simulation failed there)
            return no_update

    @app.callback(Output("plan-table", "data"), Output("plan-table", "page_count"),
                  Output("plan-table", "page_current"),
                  Input("selected-plan", "data"), Input("plan-table", "page_current"), Input("plan-table", "sort_by"),
                  Input("plan-table", "filter_query"), State("plan-table", "page_size"), State("shown-key", "data"),
                  prevent_initial_call=True)
    def _plan_table(plan_id: str | None, page: int | None, sort_by: list[dict[str, str]] | None, query: str | None,
                    size: int | None, shown: Mapping[str, Any] | None) -> tuple[Any, ...]:
        key = shown_key(shown)
        if not plan_id or not key:
            return [], 1, 0
        if ctx.triggered_id in ("selected-plan", None) or "plan-table.filter_query" in ctx.triggered_prop_ids:
            page = 0   # another plan, or another filter: its first page
        try:
            plan = store.plan(key, plan_id)
            graph = store.inputs(key, plan.graph_fingerprint)[0]
        except TensorOptError:
            return [], 1, 0   # the panel's title says what went wrong
        rows, pages = table_page(figures.plan_table_rows(plan, graph), page=page, size=size or 15, sort_by=sort_by,
                                 query=query)
        return rows, pages, min(page or 0, pages - 1)

    @app.callback(Output("plan-graph", "figure"), Output("graph-hint", "children"),
                  Input("selected-plan", "data"), Input("expanded-groups", "data"), Input("graph-node", "data"),
                  State("shown-key", "data"), prevent_initial_call=True)
    def _graph(plan_id: str | None, expanded: list[str] | None, node: str | None,
               shown: Mapping[str, Any] | None) -> tuple[Any, Any]:
        key = shown_key(shown)
        if not plan_id or not key:
            return no_update, ""
        try:
            plan = store.plan(key, plan_id)
            graph, costs = store.inputs(key, plan.graph_fingerprint)
            fig = plangraph.plan_graph_figure(plan, graph, store.cluster(key), costs=costs,
                                              expanded=expanded or [], selected=node)
        except Exception as e:  # noqa: BLE001
            if not isinstance(e, TensorOptError):
                traceback.print_exc()
            return no_update, _explain(e)
        return fig, graph_hint(plangraph.mixed_groups(plan, graph))

    @app.callback(Output("expanded-groups", "data"), Output("graph-node", "data"), Output("node-details", "children"),
                  Input("plan-graph", "clickData"), Input("expand-all", "n_clicks"), Input("collapse-all", "n_clicks"),
                  Input("selected-plan", "data"), State("expanded-groups", "data"), State("shown-key", "data"),
                  prevent_initial_call=True)
    def _graph_click(click: Any, _all: int, _none: int, plan_id: str | None, expanded: list[str] | None,
                     shown: Mapping[str, Any] | None) -> tuple[Any, Any, Any]:
        key = shown_key(shown)
        which = ctx.triggered_id
        if which == "selected-plan":
            return no_update, None, []
        if not plan_id or not key:
            return no_update, no_update, no_update
        graph = store.graph(key)
        if which == "expand-all":
            return sorted(plangraph.groups(graph)), no_update, no_update
        if which == "collapse-all":
            return [], no_update, no_update
        try:
            kind, name = click["points"][0]["customdata"]
        except (TypeError, KeyError, IndexError, ValueError):
            return no_update, no_update, no_update
        plan = store.plan(key, plan_id)
        graph, costs = store.inputs(key, plan.graph_fingerprint)
        if kind == "group":
            now = set(expanded or [])
            now.symmetric_difference_update({name})
            return sorted(now), name, [html.Li(x) for x in plangraph.node_details(name, plan, graph, costs)]
        if kind == "edge":
            return no_update, no_update, [html.Li(f"edge {name}: its reshard cost is in the hover")]
        return no_update, name, [html.Li(x) for x in plangraph.node_details(name, plan, graph, costs)]

    @app.callback(Output("compare-panel", "style"), Output("compare-summary", "children"), Output("memory-a", "figure"),
                  Output("memory-b", "figure"), Output("gantt-compare", "figure"), Output("diff-table", "data"),
                  Input("compare-plan", "value"), Input("selected-plan", "data"), State("budget", "value"),
                  State("reserve", "value"), State("shown-key", "data"),
                  prevent_initial_call=True)
    def _compare(other: str | None, plan_id: str | None, budget_gib: float | None, reserve_gib: float | None,
                 shown: Mapping[str, Any] | None) -> tuple[Any, ...]:
        key = shown_key(shown)
        if not other or not plan_id or not key:
            return ({"display": "none"}, "", no_update, no_update, no_update, [])
        budget, reserve = gib_bytes(budget_gib), reserve_bytes(reserve_gib)
        try:
            a, b = store.plan(key, plan_id), store.plan(key, other)
            graph, cluster = store.graph(key), store.cluster(key)
            sa, sb = store.simulation(key, plan_id, reserve), store.simulation(key, other, reserve)
        except Exception as e:  # noqa: BLE001
            if not isinstance(e, TensorOptError):
                traceback.print_exc()
            return ({"display": "block"}, _explain(e), no_update, no_update, no_update, [])
        rows = plangraph.differing(a, b, graph)
        mems = []
        for pid, sim in ((plan_id, sa), (other, sb)):
            capacity = {d: cluster.device(d).memory_bytes for d in sim.memory}
            mem = figures.memory_figure(sim, capacity, budget_bytes=budget)
            mem.update_layout(title=f"{pid}: simulated peak per device")
            mems.append(mem)
        # both timelines on one time axis, one above the other
        gantt = figures.compare_gantt_figure((plan_id, sa), (other, sb))
        summary = compare_summary((plan_id, a, sa), (other, b, sb), len(rows), len(graph.ops))
        return ({"display": "block"}, summary, *mems, gantt, rows)

    @app.callback(Output("download-plan", "data"), Input("download-plan-button", "n_clicks"),
                  State("selected-plan", "data"), State("shown-key", "data"),
                  prevent_initial_call=True)
    def _download_plan(_n: int, plan_id: str | None, shown: Mapping[str, Any] | None) -> Any:
        key = shown_key(shown)
        if not plan_id or not key:
            return no_update
        plan = store.plan(key, plan_id)
        return {"content": json.dumps(plan.to_dict(), indent=1), "filename": plan_filename(plan_id)}

    @app.callback(Output("download-csv", "data"), Input("download-csv-button", "n_clicks"),
                  State("shown-key", "data"), prevent_initial_call=True)
    def _download_csv(_n: int, shown: Mapping[str, Any] | None) -> Any:
        key = shown_key(shown)
        if not key or not store.frontier_ready(key):
            return no_update
        s = store.summary(key)
        return {"content": store.frontier_csv(key), "filename": f"frontier-{s['graph_name']}.csv"}


# ---- the URL ------------------------------------------------------------------------------------
def _register_url(app: dash.Dash, store: ResultStore, trusted: Collection[str]) -> None:
    """The URL's query string holds the page's state: read once when the page opens (and on the
    browser's back and forward: ``url``), written whenever a control changes (``url-out``; two
    components, so that writing never reads back)."""
    presets = set(list_presets())

    @app.callback(Output("model-source", "value", allow_duplicate=True), Output("zoo-name", "value"),
                  Output("zoo-params", "value", allow_duplicate=True),
                  Output("zoo-params-for", "data", allow_duplicate=True), Output("model-spec", "value"),
                  Output("onnx-path", "data", allow_duplicate=True),
                  Output("cluster-source", "value", allow_duplicate=True), Output("cluster-preset", "value"),
                  Output("cluster-preset", "options"), Output("cluster-path", "data", allow_duplicate=True),
                  Output("devices", "value", allow_duplicate=True), Output("devices-for", "data", allow_duplicate=True),
                  Output("batch", "value"), Output("optimizer", "value"), Output("precision", "value"),
                  Output("pipelines", "value"), Output("costs-from", "value", allow_duplicate=True),
                  Output("budget", "value", allow_duplicate=True),
                  Output("reserve", "value"), Output("epoch", "value"),
                  Output("url-plan", "data", allow_duplicate=True), Output("url-prices", "data"),
                  Output("url-ready", "data"),
                  Input("url", "search"), prevent_initial_call="initial_duplicate")
    def _apply(search: str | None) -> tuple[Any, ...]:
        got = apply_url(search, store, trusted)
        keep = no_update

        def take(name: str) -> Any:
            return got.get(name, keep)

        preset = got.get("cluster_preset")
        options: Any = keep
        if preset is not None and preset not in presets:
            options = sorted(presets | {preset})
        spec = None
        if "devices" in got:
            try:
                spec = cluster_spec(got.get("cluster_source", "preset"), preset, got.get("cluster_path"))
            except TensorOptError:
                spec = None
        return (take("model_source"), take("zoo_name"), take("zoo_params"),
                take("zoo_name"), take("model_spec"), take("onnx_path"),
                take("cluster_source"), take("cluster_preset"), options, take("cluster_path"),
                take("devices"), spec if spec is not None else keep,
                take("batch"), take("optimizer"), take("precision"), take("pipelines"), take("costs"), take("budget"),
                take("reserve"),
                take("epoch"), take("plan"), got.get("prices", {}),
                {"run": got["run"], "messages": got["messages"], "search": search or ""})

    @app.callback(Output("url-out", "search"),
                  Input("model-source", "value"), Input("zoo-name", "value"), Input("zoo-params", "value"),
                  Input("model-spec", "value"), Input("onnx-path", "data"), Input("cluster-source", "value"),
                  Input("cluster-preset", "value"), Input("cluster-path", "data"), Input("devices", "value"),
                  Input("batch", "value"), Input("optimizer", "value"), Input("precision", "value"),
                  Input("pipelines", "value"),
                  Input("costs-from", "value"), Input("budget", "value"), Input("reserve", "value"),
                  Input({"type": "price", "kind": ALL}, "value"), Input("epoch", "value"),
                  Input("selected-plan", "data"), State({"type": "price", "kind": ALL}, "id"),
                  State("url-plan", "data"), State("url-prices", "data"), State("url-ready", "data"),
                  prevent_initial_call=True)
    def _write(source: str, zoo_name: str, zoo_params: str, spec: str, onnx_path: str | None, csource: str,
               preset: str, cpath: str | None, devices: list[str], batch: Any, optimizer: str, precision: str,
               pipelines: list[str] | None, costs: str, budget: Any, reserve: Any, price_values: list[Any], epoch: Any,
               selected: str | None,
               price_ids: list[Mapping[str, str]], pending: str | None, pending_prices: Mapping[str, float] | None,
               ready: Any) -> Any:
        if ready is None:
            return no_update   # the URL is not read yet: writing now would lose it
        price = {i["kind"]: float(v) for i, v in zip(price_ids, price_values)
                 if v not in (None, "") and math.isfinite(float(v))}
        if not price_ids:
            price = dict(pending_prices or {})   # no result yet, no price inputs: keep the link's
        return url_state(store, source=source, zoo_name=zoo_name, zoo_params=zoo_params, spec=spec,
                         onnx_path=onnx_path, csource=csource, preset=preset, cpath=cpath, devices=devices,
                         # the precision always, fp32 too: a server's default may be another (bf16-params)
                         batch=batch, optimizer=optimizer, precision=precision, pipelines=pipelines,
                         costs=None if costs == "auto" else costs, budget=budget,
                         reserve=reserve, price=price, epoch=None if epoch == DEFAULT_EPOCH else epoch,
                         plan=pending or selected)


def register_callbacks(app: dash.Dash, store: ResultStore, *, algos: tuple[str, ...] | None = None,
                       default_model: str | None = None) -> None:
    """Attach every callback of the page to ``app``; results live in ``store``; ``algos``: the
    baseline placers to run (default: all); ``default_model``: the model the server was started
    with, which a link may run at once whatever its spec (:func:`apply_url`)."""
    _register_controls(app, store)
    _register_run(app, store, algos)
    _register_frontier(app, store)
    _register_plan(app, store)
    _register_url(app, store, (default_model,) if default_model else ())


__all__ = ["register_callbacks", "run_controls"]
