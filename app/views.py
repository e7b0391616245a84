"""What the dashboard shows of a stored result, as values the callbacks hand to the page: the
page's GiB inputs in bytes, the lines above the frontier and its figure, the search's notes
(:func:`search_notes`), what the page's script redraws from (:func:`page_data`, for
:mod:`.clientside`), the decision line's words (:func:`decision_text`), the banner over a result
the controls no longer ask for (:func:`stale_text`), whether a plan fits in words, the banner saying
where the operator times come from, the price inputs, the compare dropdown's choices and a plan's
commands.

Each is a function of a :class:`~.pipeline.ResultStore` and a result's key, or of plain values:
testable without a browser or a Dash server.  Where the page wants components (the banner, the
notes, the price inputs) they are returned as components; everything else is a plain value.

It owns what the page says of a result; it must not wire callbacks (:mod:`.callbacks` does),
compute (:mod:`.pipeline` does) nor draw (:mod:`.figures` does).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go
from dash import dcc, html

from tensoropt.describe import fmt_bytes, fmt_devices
from tensoropt.planmodel.fits import fits
from tensoropt.planmodel.pipelined import pipeline_text
from tensoropt.planmodel.wrappers import fsdp_across_replicas, mesh_text

from . import figures, plangraph, prices
from .commands import plan_filename, run_commands
from .pipeline import Request, ResultStore

if TYPE_CHECKING:
    from tensoropt import Cluster, Plan, SimResult


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


def summary_lines(store: ResultStore, key: str, *, errors: bool = True) -> list[str]:
    """The lines above the frontier: what was computed and how long it took, the curves drawn,
    whether the baselines still run, and (``errors``) the placers' errors (:func:`placer_errors`)."""
    s = store.summary(key)
    counts = ", ".join(str(k) for k in s.get("device_counts", []))
    lines = [f"{s['ops']} operators; devices {', '.join(s['devices'])}; profiled/captured in {s['profile_s']:.1f} s, "
             f"tracked in {s['tracking_s']:.1f} s; "
             f"{'exact' if s['exact'] else 'not exact (see the search notes below)'}; "
             f"{s['points']} plans on the frontier, {s.get('curve_points', s['points'])} on the curves of "
             f"{counts} GPUs"]
    if not store.complete(key):
        lines.append("the baseline placers are still running: their markers appear when they are done")
    return lines + (placer_errors(store, key) if errors else [])


def placer_errors(store: ResultStore, key: str) -> list[str]:
    """Why each baseline placer that made no plan made none, in its words (naming the placer)."""
    # the placers' messages already name the placer
    return [b["error"] if b["error"].startswith(b["algo"]) else f"{b['algo']}: {b['error']}"
            for b in store.baselines(key) if b.get("error")]


def folded(element_id: str, title: str, lines: Sequence[str]) -> html.Details:
    """``lines`` folded under the one line ``title``, closed: on Llama-3-8B's default the twelve placers'
    errors and the 28 search notes, open, pushed the chart and the GPUs-needed table below a 1366 × 768
    laptop's first screen (the decision line above them says what to do)."""
    return html.Details(id=element_id, open=False, style={"margin": "2px 0"}, children=[
        html.Summary(title), html.Ul([html.Li(n) for n in lines], style={"margin": "2px 0"})])


def placer_notes(store: ResultStore, key: str) -> html.Details:
    """Why the baseline placers without a plan made none (:func:`placer_errors`), :func:`folded`."""
    errors = placer_errors(store, key)
    return folded("placer-errors", f"baseline placers without a plan ({len(errors)})", errors)


def search_notes(store: ResultStore, key: str) -> html.Details:
    """The search's notes on the page (``frontier.json``'s: what memory and time are, the resolution,
    how many plans were walked, whether the search was exact and why, the placers whose plans did not
    join), :func:`folded` under a line that says how many and whether the search was exact (the summary
    line above it points here)."""
    info = store.frontier_info(key)
    notes = [str(n) for n in info.get("notes") or []]
    return folded("search-notes", f"the search's notes ({len(notes)}): {'exact' if info.get('exact') else 'not exact'}",
                  notes)


def frontier_view(store: ResultStore, key: str, budget: float | None, reserve: int, selected: str | None = None,
                  compare: str | None = None) -> tuple[go.Figure, list[str]]:
    """The frontier figure of a result (:func:`figures.frontier_figure`: every curve point and
    baseline, greyed where it does not fit — :func:`tensoropt.planmodel.fits.fits` of each plan's
    per-device peaks with ``budget``, ``None``: each device's own memory, and ``reserve``) and the
    lines above and under it (:func:`summary_lines`, then :func:`figures.fit_summary`).  The page
    draws it once without a budget; its script restyles it for the budget (:mod:`.clientside`)."""
    s = store.summary(key)
    points, base, cluster = store.curves(key), store.baselines(key), store.cluster(key)
    counts = ", ".join(str(k) for k in s.get("device_counts", []))
    title = (f"{s['graph_name']} (batch {s['batch_size']}) on {s['cluster_name']}: {s['points']} Pareto-optimal plans, "
             f"curves for {counts} GPUs")
    fig = figures.frontier_figure(points, base, cluster=cluster, budget_bytes=budget, reserve_bytes=reserve,
                                  selected=selected, compare=compare, batch=s["batch_size"], title=title)
    plans = figures.drawn_plans(points, base)
    fit = {p["plan_id"]: fits(p["peaks"], cluster, budget=budget, reserve=reserve) for p in plans}
    return fig, [*summary_lines(store, key), figures.fit_summary(plans, fit, budget, reserve)]


def _hours(h: float) -> str:
    """Wall-clock hours as the decision line writes them: three significant digits, no exponent.

    >>> _hours(0.022604), _hours(0.000181), _hours(12.34), _hours(1234.4)
    ('0.0226', '0.000181', '12.3', '1234')
    """
    digits = min(9, max(0, 2 - math.floor(math.log10(h)))) if h > 0 else 0
    return f"{h:.{digits}f}"


def _decided(row: Mapping[str, Any], cost: str) -> str:
    """One plan of the decision line: its GPUs, step, cost and wall-clock hours, per epoch when the
    page has an epoch size, else per 1,000 steps (``cost``: :func:`~.prices.cost_column`)."""
    per, unit = ("epoch", "epoch") if row["hours_per_epoch"] is not None else ("1k_steps", "1k steps")
    if cost == "usd_per_1k_steps":
        money = f"${row['usd_per_' + per]:.{2 if per == 'epoch' else 4}f}"
    else:
        money = f"{row['gpu_hours_per_' + per]:.{3 if per == 'epoch' else 4}f} GPU-h"
    k = row["k"]
    return (f"{k} GPU{'s' if k != 1 else ''}, {row['time_s'] * 1e3:.3f} ms a step, {money} per {unit}, "
            f"{_hours(row['hours_per_' + per])} h per {unit}")


def decision_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The line at the top of the page: the cheapest and the fastest plan that fits among the
    GPUs-needed rows (:func:`~.prices.gpus_needed`, :func:`~.prices.decide`), one clause when they
    are the same.  The page's script (:mod:`.clientside`, ``decisionText``) writes the same words.

    >>> row = {"k": 1, "plan_id": "a", "time_s": 0.000651, "usd_per_1k_steps": 0.5, "gpu_hours_per_1k_steps": 0.2,
    ...        "usd_per_epoch": 0.07, "hours_per_epoch": 0.0226, "gpu_hours_per_epoch": 0.0226}
    >>> decision_text([row])
    'cheapest and fastest that fits: 1 GPU, 0.651 ms a step, $0.07 per epoch, 0.0226 h per epoch'
    """
    d = prices.decide(rows)
    cheapest, fastest, cost = d["cheapest"], d["fastest"], d["cost"]
    if cheapest is None or fastest is None:
        return "no plan fits on any number of GPUs: raise the budget, lower the reserve or choose more devices"
    tail = "" if cost == "usd_per_1k_steps" else " (GPU-hours: set a price per GPU-hour for dollars)"
    if cheapest is fastest:
        return f"cheapest and fastest that fits: {_decided(fastest, cost)}{tail}"
    return f"cheapest that fits: {_decided(cheapest, cost)}; fastest that fits: {_decided(fastest, cost)}{tail}"


def page_data(store: ResultStore, key: str) -> dict[str, Any]:
    """What the page's script needs of a result (:mod:`.clientside`): every drawn plan
    (:func:`figures.drawn_plans`: id, label, role, devices, per-device peaks, memory, step), each
    device's memory and price key, the device kinds by price key, the batch, the device counts
    the GPUs-needed table lists (1 … the devices chosen) and what any plan on each count holds at the
    least on one device (``least``; a result made before it has none)."""
    s = store.summary(key)
    plans = figures.drawn_plans(store.curves(key), store.baselines(key))
    kinds = s.get("device_kinds") or {}
    return {"key": key, "batch": s["batch_size"], "capacity": s["device_memory"],
            "counts": list(range(1, len(s["devices"]) + 1)),
            "least": {int(k): v for k, v in (s.get("least_bytes") or {}).items()},
            "price_keys": {d: prices.price_key(kinds.get(d, "")) for d in s["devices"]},
            "kinds": {prices.price_key(k): k for k in kinds.values()},
            "plans": [{k: p[k] for k in ("plan_id", "label", "role", "devices", "memory_bytes", "time_s", "peaks")}
                      for p in plans]}


def likely_plans(store: ResultStore, key: str) -> list[str]:
    """The plans a person most likely opens first: the GPUs-needed table's with no budget — on each
    GPU count the fastest plan that fits every device's own memory (:func:`figures.fastest_that_fits`) —
    the fastest of them first (the decision line's).  What :meth:`~.pipeline.ResultStore.warm` simulates
    ahead of a click."""
    plans = figures.drawn_plans(store.curves(key), store.baselines(key))
    cluster = store.cluster(key)
    fit = {p["plan_id"]: fits(p["peaks"], cluster) for p in plans}
    best = [figures.fastest_that_fits([p for p in plans if p["num_devices"] == k], fit)
            for k in sorted({p["num_devices"] for p in plans})]
    chosen = [b for b in best if b is not None]
    chosen.sort(key=lambda p: (p["time_s"], p["num_devices"]))
    return [p["plan_id"] for p in chosen]


def plan_verdict(store: ResultStore, key: str, plan_id: str, budget: float | None, reserve: int) -> str:
    """Whether one plan of a result fits, in words (``fits …`` / ``does not fit …: gpu1 over by
    …``): :func:`tensoropt.planmodel.fits.fits` of its per-device peaks, as the frontier's markers judge it."""
    peaks = figures.plan_peaks(store.curves(key), store.baselines(key)).get(plan_id)
    if peaks is None:
        return ""
    cluster = store.cluster(key)
    limit = figures.limit_text(budget, reserve)
    if fits(peaks, cluster, budget=budget, reserve=reserve):
        return f"fits {limit}"
    return f"does not fit {limit}: {figures.over_text(peaks, cluster, budget_bytes=budget, reserve_bytes=reserve)}"


def shown_key(shown: Mapping[str, Any] | None) -> str | None:
    """The key of the result on show (the ``shown-key`` store: ``{"key": …, "done": …}``)."""
    return (shown or {}).get("key") or None


def _short_path(spec: str) -> str:
    """A model or cluster spec as the banner names it: a file's name without its folder (uploads are
    named by their content's hash; a ``file.py:factory`` spec by its file), a preset without ``preset:``.

    >>> _short_path("/tmp/x/tiny_model.py:build"), _short_path("preset:v100-8-nvlink"), _short_path("zoo:gpt2?layers=2")
    ('tiny_model.py:build', 'v100-8-nvlink', 'zoo:gpt2?layers=2')
    """
    if spec.startswith("preset:"):
        return spec[len("preset:"):]
    if spec.startswith("zoo:") or "/" not in spec:
        return spec
    return spec.rsplit("/", 1)[1]


#: how the stale-result banner words a request's field (the model and the cluster lead its sentence;
#: a field not named here is written ``name value``)
_FIELD_WORDS: dict[str, Callable[[Any], str]] = {
    "batch": lambda v: "the model's batch" if v is None else f"batch {v}",
    "optimizer": lambda v: f"optimizer {v}",
    "precision": lambda v: "fp32" if v is None else str(v),
    "costs_from": lambda v: f"times from {v}",
    "profile": lambda v: "no uploaded profile" if v is None else f"profile {_short_path(v)}",
    "calibration": lambda v: "no calibration" if v is None else f"calibration {_short_path(v)}",
    "repeats": lambda v: f"{v} profiling repeat{'s' if v != 1 else ''}",
    "warmup": lambda v: f"{v} warm-up call{'s' if v != 1 else ''}",
}


def _field_words(name: str, value: Any) -> str:
    return _FIELD_WORDS[name](value) if name in _FIELD_WORDS else f"{name} {value}"


def stale_text(shown_key: str, shown: Mapping[str, Any], wanted: Request | str) -> str | None:
    """The banner over a result the controls no longer ask for, or ``None`` when they ask for it.

    ``shown_key`` and ``shown`` are the result's key and request (its summary's ``request``, a
    :meth:`~tensoropt.workflow.Request.to_dict`); ``wanted`` is the request the controls make now
    (:func:`~.requests.request_from_controls`), or the message saying why they make none — which
    counts as differing.  The same request is the same key (:attr:`~.pipeline.Request.key`: the
    result's folder), the rule the pipeline keys results by; the words name the fields that differ.

    >>> import dataclasses
    >>> shown = Request(model="zoo:gpt2", cluster="preset:titan-rtx-5", devices=("gpu0", "gpu1"))
    >>> stale_text(shown.key, shown.to_dict(), shown) is None
    True
    >>> print(stale_text(shown.key, shown.to_dict(), dataclasses.replace(shown, devices=("gpu0",))))
    these results are for zoo:gpt2 on titan-rtx-5 (devices gpu0, gpu1); the controls now ask for ... — Run to update
    """
    if isinstance(wanted, Request) and wanted.key == shown_key:
        return None
    model, cluster = _short_path(str(shown.get("model"))), _short_path(str(shown.get("cluster")))
    if not isinstance(wanted, Request):
        return f"these results are for {model} on {cluster}; the controls make no request: {wanted} — then Run"
    now = wanted.to_dict()
    differing = [k for k in shown if k not in ("model", "cluster", "cache", "cache_dir") and shown[k] != now.get(k)]
    was: list[str] = []
    asks: list[str] = []
    for k in differing:
        if k == "devices":
            old, new = list(shown[k] or []), list(now[k] or [])
            was.append(f"devices {fmt_devices(old)}")
            change = []
            if shown.get("cluster") == now["cluster"]:
                change = [f"without {fmt_devices([d for d in old if d not in new])}" if set(old) - set(new) else "",
                          f"adding {fmt_devices([d for d in new if d not in old])}" if set(new) - set(old) else ""]
            asks.append("; ".join([f"devices {fmt_devices(new)}", *(c for c in change if c)]))
        else:
            was.append(_field_words(k, shown[k]))
            asks.append(_field_words(k, now.get(k)))
    was_words = f" ({'; '.join(was)})" if was else ""
    ask_words = f" ({'; '.join(asks)})" if asks else ""
    return (f"these results are for {model} on {cluster}{was_words}; the controls now ask for "
            f"{_short_path(wanted.model)} on {_short_path(wanted.cluster)}{ask_words} — Run to update")


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


def price_inputs(kinds: Mapping[str, str], current: Mapping[str, Any], wanted: Mapping[str, float]) -> list[Any]:
    """One price input per device kind (price key → kind name): its value the one on show, else the
    link's, else the default (:data:`~.prices.LIST_PRICES`), else empty."""
    rows: list[Any] = []
    defaults = prices.default_prices(kinds.values())
    for key, name in kinds.items():
        value = current.get(key, wanted.get(key, wanted.get("*", defaults.get(key))))
        listed = prices.LIST_PRICES.get(key)
        hint = (f"default: {listed.derivation} ({listed.as_of})" if listed else
                "no list price for this kind (docs/dashboard.md): enter one")
        rows.append(html.Div(title=hint, style={"display": "flex", "gap": "4px", "alignItems": "center"}, children=[
            html.Span(name, style={"flex": "1", "fontSize": "90%"}),
            dcc.Input(id={"type": "price", "kind": key}, type="number", min=0, step="any", value=value,
                      debounce=True, placeholder="USD/GPU-h", style={"width": "90px"}),
        ]))
    return rows


def plan_options(store: ResultStore, key: str) -> list[dict[str, str]]:
    """The compare dropdown's choices: every drawn plan, labelled with its devices, peak and step."""
    plans = figures.drawn_plans(store.curves(key), store.baselines(key))
    return [{"label": f"{p['label']}{'' if p['label'] == p['plan_id'] else ' (' + p['plan_id'] + ')'}: "
                      f"{p['num_devices']} GPU(s), {fmt_bytes(p['memory_bytes'])}, {p['time_s'] * 1e3:.3f} ms",
             "value": p["plan_id"]} for p in sorted(plans, key=lambda p: (p["num_devices"], p["memory_bytes"]))]


def plan_commands(store: ResultStore, key: str, plan_id: str) -> str:
    """The commands that check and run a plan of a result (:func:`~.commands.run_commands`), as shown."""
    plan = store.plan(key, plan_id)
    piped, mesh = pipeline_text(plan), mesh_text(plan)
    cmds, note = run_commands(store.summary(key).get("request") or {}, plan_id,
                              plan.num_devices if piped else len(plan.devices), plan.num_replicas, plan.microbatches,
                              piped, mesh)
    where = (f"{plan.num_devices} device(s) as a pipeline: {piped} (mesh {mesh})" if piped
             else f"{plan.num_replicas} hosts of {len(plan.devices)} device(s), mesh {mesh}" if plan.replicas
             else f"{len(plan.devices)} device(s)")
    if plan.microbatches > 1 and not piped:
        where += f", each step {plan.microbatches} micro-batches"
    exports = bool(piped) or (not plan.replicas and plan.microbatches == 1) or fsdp_across_replicas(plan)
    lines = [f"# the plan downloads as {plan_filename(plan_id)}; check it, run it on {where}"
             + (", or export it as a directory torchrun runs" if exports else "") + ":", *cmds]
    return "\n".join(lines + ([f"# {note}"] if note else []))


def device_options(cluster: Cluster) -> list[dict[str, str]]:
    """The devices dropdown's choices: each device of ``cluster``, its name and memory."""
    return [{"label": f"{d.name} ({fmt_bytes(d.memory_bytes)})", "value": d.name}
            for d in (cluster.device(n) for n in cluster.names)]


def graph_hint(mixed: Sequence[str]) -> str:
    """The line under the plan graph: how to use it, and the groups whose operators run differently
    (:func:`~.plangraph.mixed_groups`; the first eight)."""
    hint = (f"groups whose operators run differently: {', '.join(plangraph.short_path(g) for g in mixed[:8])}"
            + (" …" if len(mixed) > 8 else "") if mixed else "every group's operators run alike")
    return "click a group (a square) to draw its operators, an operator for its configuration; " + hint


def compare_summary(first: tuple[str, Plan, SimResult], second: tuple[str, Plan, SimResult], differing: int,
                    ops: int) -> str:
    """The line above two compared plans, each ``(plan id, plan, its simulation)``: each one's peak, step
    and device count, the second's step as a multiple of the first's, and how many of the graph's ``ops``
    operators are configured differently (:func:`~.plangraph.differing`: ``differing``)."""
    (plan_id, a, sa), (other, b, sb) = first, second
    ratio = sb.time_s / sa.time_s if sa.time_s else float("nan")
    return (f"{plan_id}: {fmt_bytes(sa.max_memory_bytes)} peak, {sa.time_s * 1e3:.3f} ms on "
            f"{len(a.devices)} device(s); {other}: {fmt_bytes(sb.max_memory_bytes)} peak, "
            f"{sb.time_s * 1e3:.3f} ms on {len(b.devices)} device(s) ({ratio:.2f}× the step); "
            f"{differing} of {ops} operators configured differently"
            + ("" if set(a.devices) == set(b.devices) else
               " (on different GPUs: compared by layout, sharding, recompute and the share of each plan's GPUs"
               " they run on, whichever GPUs and however many)"))


__all__ = ["gib_bytes", "reserve_bytes", "summary_lines", "placer_errors", "placer_notes", "folded", "frontier_view",
           "page_data", "likely_plans", "plan_verdict",
           "shown_key", "source_banner", "price_inputs", "plan_options", "plan_commands", "device_options",
           "graph_hint", "compare_summary", "decision_text", "stale_text"]
