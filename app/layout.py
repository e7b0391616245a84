"""The page: controls on the left (model, cluster, devices, batch, precision, where the operator times
come from, run and cancel with a progress bar, the memory budget and reserve per device, the price
of a GPU-hour per device kind and the epoch size), the decision line (the cheapest and the fastest
plan that fits), the frontier — one curve per device count, under
a banner saying where its times come from — the GPUs-needed table, and the chosen plan on the right
(its commands, memory, timeline, graph, table, and a second plan beside it).  Component ids are the
contract with :mod:`.callbacks`, :mod:`.clientside` and the browser tests.

It owns the components and their ids; it must not compute anything beyond the controls' default
values (the zoo's parameters, the preset names) nor register callbacks.
"""

from __future__ import annotations

from typing import Any

from dash import dcc, html
from dash.dash_table.DataTable import DataTable

from tensoropt import zoo
from tensoropt.cluster import list_presets
from tensoropt.optimizers import DEFAULT_OPTIMIZER, OPTIMIZER_ALPHA
from tensoropt.planmodel.pipelined import LOOPED

from .figures import GPU_PRESETS_GIB
from .pipeline import DEFAULT_PRECISION
from .requests import COSTS_CHOICES, initial_controls

#: the epoch size the page opens with (samples): the cost columns' "per epoch"
DEFAULT_EPOCH = 1_000_000
#: the GPUs-needed table's columns (id, header)
GPUS_COLUMNS = (("gpus", "GPUs"), ("plan", "fastest plan that fits"), ("step_ms", "step (ms)"),
                ("samples_s", "samples/s"), ("efficiency", "scaling efficiency"), ("memory", "peak per device"),
                ("gpuh_1k", "GPU-h / 1k steps"), ("usd_1k", "$ / 1k steps"), ("gpuh_epoch", "GPU-h / epoch"),
                ("usd_epoch", "$ / epoch"))

_BOX = {"border": "1px solid #ddd", "borderRadius": "6px", "padding": "8px", "marginBottom": "8px"}
_LABEL = {"fontWeight": "bold", "marginTop": "6px", "display": "block"}
#: the stale-result banner's look when shown (hidden: ``display: none``)
STALE_BANNER_STYLE = {"display": "block", "background": "#fde8d0", "border": "1px solid #d9822b", "borderRadius": "4px",
                      "padding": "4px 8px", "margin": "2px 0", "fontWeight": "bold"}
_UPLOAD = {"border": "1px dashed #999", "borderRadius": "4px", "padding": "6px", "textAlign": "center",
           "cursor": "pointer", "fontSize": "90%", "marginTop": "4px"}


def _model_box(start: dict[str, Any]) -> html.Div:
    """Model: zoo / uploaded ONNX / spec, the zoo parameters, the uploads, the batch size (``start``:
    :func:`initial_controls`)."""
    zoo_name, zoo_params = start["zoo_name"], start["zoo_params"]
    return html.Div(style=_BOX, children=[
        html.Span("Model", style=_LABEL),
        dcc.RadioItems(id="model-source", value=start["model_source"],
                       options=[{"label": " zoo", "value": "zoo"}, {"label": " uploaded ONNX", "value": "onnx"},
                                {"label": " spec", "value": "spec"}],
                       inline=True),
        dcc.Dropdown(id="zoo-name", options=list(zoo.ZOO), value=zoo_name, clearable=False),
        dcc.Input(id="zoo-params", value=zoo_params, debounce=True, style={"width": "100%"},
                  placeholder="parameters, e.g. layers=2&seq_len=128 (tiny=1 for the test size)"),
        dcc.Input(id="model-spec", value=start["model_spec"],
                  debounce=True, style={"width": "100%", "marginTop": "4px"},
                  placeholder="or a spec: zoo:NAME?k=v, file.py:factory"),
        dcc.Upload(id="onnx-upload", children=html.Div("drop or click: an ONNX file"), style=_UPLOAD,
                   accept=".onnx"),
        html.Span("Batch size", style=_LABEL),
        dcc.Input(id="batch", type="number", min=1, step=1, placeholder="the model's own",
                  style={"width": "100%"}),
        html.Span("Precision", style=_LABEL),
        dcc.RadioItems(id="precision", value=start["precision"], inline=True,
                       options=[{"label": " fp32", "value": "fp32"}, {"label": " bf16 (mixed)", "value": "bf16"},
                                {"label": " bf16 params (FSDP2)", "value": "bf16-params"}]),
        dcc.Store(id="zoo-params-for", data=zoo_name),
    ])


def _cluster_box(start: dict[str, Any], repeats: int, warmup: int) -> html.Div:
    """Cluster: preset / uploaded / detected, the devices to use, the optimizer, the pipeline
    schedules to price, profiling repeats
    (``start``: :func:`initial_controls`)."""
    preset = start["cluster_preset"]
    return html.Div(style=_BOX, children=[
        html.Span("Cluster", style=_LABEL),
        dcc.RadioItems(id="cluster-source", value=start["cluster_source"], inline=True,
                       options=[{"label": " preset", "value": "preset"},
                                {"label": " uploaded YAML", "value": "upload"},
                                {"label": " this machine's GPUs", "value": "detected"}]),
        # a preset with parameters (h100-hosts?hosts=1) is a choice of its own beside the list's names
        dcc.Dropdown(id="cluster-preset", options=sorted({*list_presets(), preset}), value=preset, clearable=False),
        dcc.Upload(id="cluster-upload", children=html.Div("drop or click: a cluster YAML"), style=_UPLOAD,
                   accept=".yaml,.yml,.json"),
        html.Span("Devices to use", style=_LABEL),
        dcc.Checklist(id="devices", options=[], value=[], inline=True,
                      inputStyle={"marginRight": "3px", "marginLeft": "8px"}),
        dcc.Store(id="devices-for"),
        html.Span("Optimizer", style=_LABEL),
        dcc.Dropdown(id="optimizer", options=list(OPTIMIZER_ALPHA), value=DEFAULT_OPTIMIZER, clearable=False),
        html.Span("Pipelines on the frontier (schedules)", style=_LABEL,
                  title="every pipeline over the devices at these schedules, priced and joined where no plan "
                        "dominates it (tensoropt frontier --pipelines)"),
        dcc.Checklist(id="pipelines", options=[{"label": f" {s}", "value": s} for s in LOOPED], value=[],
                      inline=True, inputStyle={"marginRight": "3px", "marginLeft": "8px"}),
        html.Span("Profiling repeats", style=_LABEL),
        dcc.Input(id="repeats", type="number", min=1, step=1, value=repeats, style={"width": "100%"}),
        dcc.Store(id="warmup", data=warmup),
    ])


def _costs_box() -> html.Div:
    """Where the operator times come from (:data:`COSTS_CHOICES`), the profile upload, and an
    optional calibration for the device model."""
    return html.Div(style=_BOX, children=[
        html.Span("Operator times from", style=_LABEL),
        dcc.RadioItems(id="costs-from", value="auto",
                       options=[{"label": f" {label}", "value": v} for v, label in COSTS_CHOICES.items()]),
        dcc.Upload(id="profile-upload", children=html.Div("a saved profile JSON of this model"),
                   style=_UPLOAD, accept=".json"),
        dcc.Upload(id="calibration-upload", children=html.Div("optional: a calibration JSON for the device model"),
                   style=_UPLOAD, accept=".json"),
    ])


def _run_controls() -> list[Any]:
    """The run and cancel buttons, the progress bar and the message lines under them."""
    return [
        html.Div(style={"display": "flex", "gap": "6px"}, children=[
            html.Button("Run profiling + frontier", id="run", n_clicks=0,
                        style={"flex": "1", "padding": "8px", "fontWeight": "bold"}),
            html.Button("Cancel", id="cancel", n_clicks=0, disabled=True, style={"padding": "8px"},
                        title="stop the running job (what it computed so far is not kept)"),
        ]),
        html.Progress(id="progress", value="0", max="1", style={"width": "100%", "marginTop": "6px"}),
        html.Div(id="progress-text", style={"fontSize": "85%", "color": "#555", "minHeight": "1.2em"}),
        html.Div(id="upload-message", style={"fontSize": "90%", "whiteSpace": "pre-wrap"}),
        html.Div(id="run-message", style={"fontSize": "90%", "whiteSpace": "pre-wrap", "color": "#a00"}),
    ]


def _budget_box() -> html.Div:
    """The memory budget (with GPU presets) and the reserve per device."""
    return html.Div(style=_BOX, children=[
        html.Span("Memory budget per device (GiB)", style=_LABEL),
        dcc.Input(id="budget", type="number", min=0, step="any", placeholder="none: each device's own",
                  debounce=True, style={"width": "100%"}),
        html.Div([html.Button(f"{g} GiB", id=f"budget-{g}", n_clicks=0, style={"marginRight": "4px"})
                  for g in GPU_PRESETS_GIB] + [html.Button("none", id="budget-none", n_clicks=0)],
                 style={"marginTop": "4px"}),
        html.Span("Reserve per device (GiB)", style=_LABEL,
                  title="what the framework keeps on each device beside the model (CUDA context, allocator "
                        "slack): a plan fits when each device's peak ≤ min(its memory, budget) − reserve"),
        dcc.Input(id="reserve", type="number", min=0, step="any", value=0, debounce=True,
                  style={"width": "100%"}),
    ])


def _price_box() -> html.Div:
    """The price of a GPU-hour per device kind (inputs made per result, :mod:`.prices`' defaults) and
    the epoch size: what the GPUs-needed table's cost columns use."""
    return html.Div(style=_BOX, children=[
        html.Span("Price per GPU-hour (USD)", style=_LABEL,
                  title="list prices at a date (docs/dashboard.md, Prices); edit them: the table redraws in the "
                        "browser"),
        html.Div(id="price-inputs", children=[html.Span("after a run: one price per device kind",
                                                        style={"color": "#777", "fontSize": "90%"})]),
        html.Span("Epoch size (samples)", style=_LABEL),
        dcc.Input(id="epoch", type="number", min=1, step=1, value=DEFAULT_EPOCH, debounce=True,
                  style={"width": "100%"}),
    ])


def _stores(cluster_path: str | None) -> list[Any]:
    """The page's state: uploaded paths (``cluster_path``: the server's default cluster file), the
    result keys, the selected and compared plans, what the server hands the page's script, the URL's
    state waiting for its result, the plan graph's state."""
    return [dcc.Store(id="onnx-path"), dcc.Store(id="profile-path"), dcc.Store(id="cluster-path", data=cluster_path),
            dcc.Store(id="calibration-path"), dcc.Store(id="result-key"), dcc.Store(id="partial-key"),
            dcc.Store(id="shown-key"),
            dcc.Store(id="selected-plan"), dcc.Store(id="frontier-base"), dcc.Store(id="page-data"),
            dcc.Store(id="url-ready"), dcc.Store(id="url-plan"), dcc.Store(id="url-prices"),
            dcc.Store(id="expanded-groups", data=[]), dcc.Store(id="graph-node"),
            dcc.Location(id="url", refresh=False), dcc.Location(id="url-out", refresh=False)]


_TABLE_STYLE = {"fontSize": "12px", "textAlign": "left", "maxWidth": "320px", "overflow": "hidden",
                "textOverflow": "ellipsis"}
#: a table wider than its column scrolls inside it, never the page (1366 px wide: the issue's laptop)
_TABLE_BOX = {"overflowX": "auto", "maxWidth": "100%"}
#: every chart's toolbar: the buttons a person uses here (a picture, zoom, pan, reset), no logo — the
#: toolbar is short, and each chart's title lies under its band (figures.titled)
GRAPH_CONFIG: Any = {"displaylogo": False,
                "modeBarButtonsToRemove": ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d"]}


def _gpus_box() -> html.Div:
    """The GPUs-needed table: per device count the fastest plan under the budget, its throughput,
    scaling and cost (filled by the page's script, :mod:`.clientside`; a click on a row selects its plan)."""
    return html.Div(style={"margin": "8px 0"}, children=[
        html.H4("GPUs needed: the fastest plan that fits on each number of GPUs", style={"margin": "6px 0"}),
        html.Div(id="fit-summary", style={"fontSize": "90%", "color": "#333"}),
        DataTable(id="gpus-table", columns=[{"name": h, "id": c} for c, h in GPUS_COLUMNS], data=[],
                  # cells and headings wrap at spaces (ten columns in a laptop's width), in the page's font
                  style_cell={**_TABLE_STYLE, "whiteSpace": "normal", "height": "auto", "maxWidth": "200px",
                              "fontFamily": "sans-serif", "padding": "2px 4px"},
                  style_header={"fontWeight": "bold", "whiteSpace": "normal", "height": "auto"},
                  style_table=_TABLE_BOX,
                  style_data_conditional=[{"if": {"filter_query": '{plan} = "none fits"'}, "color": "#999"},
                                          {"if": {"filter_query": '{plan} contains "use the"'}, "color": "#999"},
                                          {"if": {"filter_query": '{plan} = "no plan"'}, "color": "#999"}]),
        html.Div("Scaling efficiency: samples/s per GPU against the fewest GPUs with a plan that fits. Costs: "
                 "GPU-hours × the price per GPU-hour of each device's kind; an epoch is ⌈epoch size / batch⌉ "
                 "steps. \"no plan\": the search's meshes skip that many GPUs and no baseline placer used "
                 "them; \"none fits, at least …\": no plan running every operator over that many GPUs (the "
                 "search's) holds less on a GPU — the model's state sharded over all of them and what its "
                 "largest operator reads and writes — so none was searched.",
                 style={"fontSize": "80%", "color": "#666"}),
    ])


def _plan_panel() -> html.Div:
    """The selected plan: title, summary, download and the commands that run it, memory and timeline,
    its layered graph with the clicked node's configuration, the operator table, and a second plan
    beside it."""
    return html.Div(id="plan-panel", style={"display": "none"}, children=[
        html.H4(id="plan-title", style={"margin": "6px 0"}),
        html.Ul(id="plan-summary", style={"fontSize": "90%"}),
        html.Div(style={"display": "flex", "gap": "8px", "alignItems": "flex-start", "margin": "4px 0"}, children=[
            html.Div([html.Button("Download plan JSON", id="download-plan-button", n_clicks=0),
                      dcc.Download(id="download-plan")]),
            html.Div(style={"flex": "1", "minWidth": "0"}, children=[
                html.Div(style={"display": "flex", "gap": "4px"}, children=[
                    # one command a line, never broken inside a flag or path: a long one scrolls in its box
                    html.Pre(id="run-commands", style={"flex": "1", "minWidth": "0", "margin": "0", "padding": "6px",
                                                       "background": "#f6f6f6", "fontSize": "12px",
                                                       "whiteSpace": "pre", "overflowX": "auto"}),
                    dcc.Clipboard(target_id="run-commands", title="copy the commands",
                                  style={"fontSize": "18px", "cursor": "pointer"}),
                ]),
            ]),
        ]),
        html.Div(style={"display": "flex", "gap": "8px"}, children=[
            html.Div(dcc.Graph(id="memory-graph", config=GRAPH_CONFIG), style={"flex": "2 1 0", "minWidth": "0"}),
            html.Div(dcc.Graph(id="gantt-graph", config=GRAPH_CONFIG), style={"flex": "3 1 0", "minWidth": "0"}),
        ]),
        html.Div(style={"display": "flex", "gap": "8px", "alignItems": "center"}, children=[
            html.Button("expand every group", id="expand-all", n_clicks=0),
            html.Button("collapse every group", id="collapse-all", n_clicks=0),
            html.Span(id="graph-hint", style={"fontSize": "85%", "color": "#555"}),
        ]),
        html.Div(style={"display": "flex", "gap": "8px"}, children=[
            # a graph of many layers (every group expanded) is drawn wider than the box, which scrolls
            html.Div(dcc.Graph(id="plan-graph", config=GRAPH_CONFIG),
                     style={"flex": "3 1 0", "minWidth": "0", "overflowX": "auto"}),
            html.Ul(id="node-details", style={"flex": "1 1 0", "minWidth": "0", "fontSize": "85%"}),
        ]),
        # one page crosses the wire (tables.table_page): a plan has a row per operator, Llama-3-8B's 1,728
        DataTable(id="plan-table", page_size=15, page_current=0, page_action="custom", sort_action="custom",
                  sort_mode="single", sort_by=[], filter_action="custom", filter_query="",
                  style_cell=_TABLE_STYLE, style_table=_TABLE_BOX,
                  columns=[{"name": c, "id": c} for c in ("node", "op", "module", "devices", "layout", "shard",
                                                          "recompute")]),
        html.H4("Compare with another plan", style={"margin": "10px 0 4px"}),
        dcc.Dropdown(id="compare-plan", options=[], placeholder="a second plan: memory, timeline and the operators "
                                                                 "whose configuration differs, side by side"),
        html.Div(id="compare-panel", style={"display": "none"}, children=[
            html.Div(id="compare-summary", style={"fontSize": "90%", "margin": "4px 0"}),
            html.Div(style={"display": "flex", "gap": "8px"}, children=[
                html.Div(dcc.Graph(id="memory-a", config=GRAPH_CONFIG), style={"flex": "1 1 0", "minWidth": "0"}),
                html.Div(dcc.Graph(id="memory-b", config=GRAPH_CONFIG), style={"flex": "1 1 0", "minWidth": "0"}),
            ]),
            # the two timelines on one time axis (figures.compare_gantt_figure)
            dcc.Graph(id="gantt-compare", config=GRAPH_CONFIG),
            DataTable(id="diff-table", page_size=15, sort_action="native", filter_action="native",
                      style_cell=_TABLE_STYLE, style_table=_TABLE_BOX,
                      columns=[{"name": h, "id": c} for c, h in (("node", "node"), ("op", "op"), ("module", "module"),
                                                                 ("a", "selected plan"), ("b", "compared plan"))]),
        ]),
    ])


def build_layout(*, default_model: str, default_cluster: str, repeats: int, warmup: int,
                 default_precision: str | None = DEFAULT_PRECISION) -> html.Div:
    """The whole page: the controls column and the results column."""
    start = initial_controls(default_model, default_cluster, default_precision)
    controls = html.Div(style={"width": "330px", "flex": "0 0 330px", "fontSize": "14px"}, children=[
        html.H3("tensoropt", style={"margin": "4px 0"}),
        _model_box(start),
        _cluster_box(start, repeats, warmup),
        _costs_box(),
        *_run_controls(),
        _budget_box(),
        _price_box(),
        *_stores(start["cluster_path"]),
    ])
    main = html.Div(style={"flex": "1", "minWidth": "0"}, children=[
        # over everything else: a result the controls no longer ask for says so (views.stale_text), with a run button
        html.Div(id="stale-banner", style={"display": "none"}, children=[
            html.Span(id="stale-text"),
            html.Button("Run", id="stale-run", n_clicks=0, style={"marginLeft": "8px", "fontWeight": "bold"},
                        title="run what the controls ask for (the same as the run button)"),
        ]),
        # the answer first, above the fold on a laptop: which plan to take (filled by the page's script)
        html.Div(id="decision", style={"fontWeight": "bold", "fontSize": "105%", "padding": "4px 8px",
                                       "margin": "2px 0", "background": "#eef2fb", "borderRadius": "4px"}),
        html.Div(id="result-summary", style={"fontSize": "90%"}),
        # 500 px, less in a low window (the GPUs-needed table's top in a 1366 × 768 laptop's first screen)
        dcc.Graph(id="frontier-graph", style={"height": "clamp(380px, calc(100vh - 300px), 500px)"},
                  config=GRAPH_CONFIG),
        html.Div([html.Button("Download frontier CSV", id="download-csv-button", n_clicks=0),
                  dcc.Download(id="download-csv"),
                  html.Span(" click a point (or a row below) to see its plan; click a legend entry to hide a curve",
                            style={"color": "#555", "fontSize": "90%"})]),
        _gpus_box(),
        _plan_panel(),
    ])
    return html.Div(style={"display": "flex", "gap": "16px", "padding": "8px", "fontFamily": "sans-serif"},
                    children=[controls, main])


__all__ = ["DEFAULT_EPOCH", "GPUS_COLUMNS", "GRAPH_CONFIG", "STALE_BANNER_STYLE", "build_layout"]
