"""What a plan costs to run: GPU-hours and dollars per 1,000 steps and per epoch, at a price per
GPU-hour for each device kind, the fastest plan on every number of GPUs under a budget, and which of
those to take (:func:`decide`: the cheapest and the fastest, a count no better than a smaller one folded).

The page computes the same in the browser (:mod:`.clientside`) so that a new budget or price
redraws without a request to the server; the functions here are the reference the tests hold
the page to, and what the Python side shows before the browser does.

:data:`LIST_PRICES` is the default price table: on-demand list prices per GPU-hour, at the date
and from the source each entry names (docs/dashboard.md, "Prices").  They are list prices at a
date, not quotes: prices change (AWS cut its P4 and P5 prices in June 2025), and every one is
editable on the page.  A kind without an entry (the consumer cards, which no cloud lists) has
no default: its cost columns ask for a price.

It owns the price table and the arithmetic of costs and scaling; it must not read files, draw,
or touch Dash.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensoropt.devicemodel.kinds import find_kind, normalise_name

HOUR = 3600.0


@dataclass(frozen=True)
class ListPrice:
    """One default price: ``usd_per_gpu_hour`` for the device kind ``kind`` (a key of the device-kind
    catalogue, tensoropt/devicemodel/kinds.yaml), how it was derived, from where, as of when."""

    kind: str
    usd_per_gpu_hour: float
    derivation: str
    source: str
    as_of: str


#: the default prices (module docstring); the table in docs/dashboard.md is this one
LIST_PRICES: dict[str, ListPrice] = {p.kind: p for p in (
    ListPrice("v100-sxm2-16gb", 3.06, "AWS p3.16xlarge (8 × V100 SXM2 16 GB) $24.48/h on demand, us-east-1, ÷ 8",
              "AWS EC2 on-demand list price since the P3 launch (2017-10); not re-checked against an AWS page "
              "when this table was written (none was reachable)", "2017-10"),
    ListPrice("a100-sxm4-40gb", 4.10, "AWS p4d.24xlarge (8 × A100 SXM4 40 GB) $32.77/h on demand, us-east-1, ÷ 8",
              "xither.com, 'GPU Compute Costs: On-Prem vs. Cloud vs. Spot Instances' (Q2 2024 price); usage.ai, "
              "'GPU instance cost optimization' (updated 2026-06-24) quotes the same $32.77/h", "2024-Q2"),
    ListPrice("h100-sxm5-80gb", 3.90, "AWS EC2 P5 (H100 80 GB) on demand, per GPU, after AWS's June 2025 price cut",
              "costnimbus.com, 'GPU cost management for ML teams', table 'Current GPU Pricing Reality (March "
              "2026)'; before the cut: p5.48xlarge $98.32/h ÷ 8 = $12.29 (usage.ai)", "2026-03"),
    ListPrice("l4", 0.80, "one L4: AWS G6 $0.80–1.10/h, GCP g2-standard-4 $0.70–0.80/h (the low end)",
              "costnimbus.com, the same table (March 2026)", "2026-03"),
)}


def price_key(kind: str) -> str:
    """The key a device kind's price goes by: its catalogue key (``"v100-sxm2-16gb"`` for
    ``"Tesla V100-SXM2-16GB"``), else its normalised name.

    >>> price_key("Tesla V100-SXM2-16GB"), price_key("My Accelerator")
    ('v100-sxm2-16gb', 'myaccelerator')
    """
    found = find_kind(kind)
    return found.key if found is not None else normalise_name(kind)


def default_prices(kinds: Iterable[str]) -> dict[str, float | None]:
    """Price key → the default USD per GPU-hour (:data:`LIST_PRICES`; ``None`` without one), for
    the device kinds ``kinds`` (names as a cluster gives them)."""
    out: dict[str, float | None] = {}
    for kind in kinds:
        key = price_key(kind)
        entry = LIST_PRICES.get(key)
        out[key] = entry.usd_per_gpu_hour if entry else None
    return out


def parse_prices(text: str | None) -> dict[str, float]:
    """The URL's ``price`` value, ``key:usd,key:usd`` (a bare number: one price for every kind,
    under the key ``*``), as a dict; malformed or non-positive entries are dropped.

    >>> parse_prices("v100-sxm2-16gb:2.5,l4:0.7"), parse_prices("3"), parse_prices("x:-1,y:abc")
    ({'v100-sxm2-16gb': 2.5, 'l4': 0.7}, {'*': 3.0}, {})
    """
    out: dict[str, float] = {}
    for item in (text or "").split(","):
        key, sep, value = item.rpartition(":")
        try:
            usd = float(value)
        except ValueError:
            continue
        if math.isfinite(usd) and usd >= 0:
            out[key.strip() if sep else "*"] = usd
    return out


def format_prices(prices: Mapping[str, float | None]) -> str:
    """The inverse of :func:`parse_prices` (entries without a price left out)."""
    return ",".join(f"{k}:{v:g}" for k, v in prices.items() if v is not None)


def steps_per_epoch(epoch_samples: float | None, batch: int | None) -> int | None:
    """Steps of one epoch of ``epoch_samples`` samples at ``batch`` samples a step (the last one
    partial); ``None`` when either is missing or not positive."""
    if not epoch_samples or not batch or epoch_samples <= 0 or batch <= 0:
        return None
    return math.ceil(epoch_samples / batch)


def plan_costs(time_s: float, devices: Sequence[str], kinds: Mapping[str, str], prices: Mapping[str, float | None],
               *, batch: int | None, epoch_samples: float | None) -> dict[str, float | None]:
    """What one plan costs: ``samples_per_s``, the wall-clock ``hours_per_1k_steps`` and
    ``hours_per_epoch``, ``gpu_hours_per_1k_steps`` (its devices × 1,000 steps),
    ``gpu_hours_per_epoch``, and ``usd_per_1k_steps`` / ``usd_per_epoch`` at ``prices`` (price key →
    USD per GPU-hour; ``None`` when a device's kind has no price).  ``kinds``: device → kind name."""
    k = len(devices)
    per_step_h = time_s / HOUR
    steps = steps_per_epoch(epoch_samples, batch)
    usd_h: float | None = 0.0
    for d in devices:
        p = prices.get(price_key(kinds.get(d, "")), prices.get("*"))
        usd_h = None if p is None or usd_h is None else usd_h + p
    out: dict[str, float | None] = {
        "samples_per_s": batch / time_s if batch and time_s > 0 else None,
        "hours_per_1k_steps": per_step_h * 1000,
        "hours_per_epoch": per_step_h * steps if steps else None,
        "gpu_hours_per_1k_steps": k * per_step_h * 1000,
        "gpu_hours_per_epoch": k * per_step_h * steps if steps else None,
    }
    out["usd_per_1k_steps"] = usd_h * per_step_h * 1000 if usd_h is not None else None
    out["usd_per_epoch"] = usd_h * per_step_h * steps if usd_h is not None and steps else None
    return out


def gpus_needed(plans: Sequence[Mapping[str, Any]], fit: Mapping[str, bool], kinds: Mapping[str, str],
                prices: Mapping[str, float | None], *, batch: int | None,
                epoch_samples: float | None, counts: Iterable[int] = (), least: Mapping[int, int] | None = None,
                room: float | None = None) -> list[dict[str, Any]]:
    """One row per device count ``k`` that has a plan, and per ``k`` of ``counts`` (the page: 1 … the
    devices chosen): the fastest plan on ``k`` devices that fits (``fit``: plan id → whether it fits
    the page's budget), its step, samples/s, scaling efficiency and costs (:func:`plan_costs`).
    Scaling efficiency is throughput per GPU against the smallest ``k`` with a plan that fits:
    ``(sps_k / sps_k0) / (k / k0)``.  A ``k`` where nothing fits has ``plan_id`` ``None`` and its
    least memory in ``least_memory_bytes``; one with no plan at all (no mesh of the search, no
    placer used that many devices) has ``least_memory_bytes`` ``None`` too — unless ``least[k]``, what
    every plan running each operator over ``k`` devices (the search's) holds at the least on each
    (:func:`tensoropt.planmodel.fits.least_state_bytes` + :func:`~tensoropt.planmodel.fits.least_live_bytes`),
    is more than ``room``, the most any device may hold under the page's budget: then nothing fits
    there either, and the row has that bound as ``least_memory_bytes`` with ``at_least``.  ``plans``: dicts with
    ``plan_id``, ``devices``, ``memory_bytes``, ``time_s``; on one count the fastest to the
    microsecond, then the least memory.  A row :func:`dominated` by a smaller count's (no faster, no
    cheaper) has ``use_k`` and ``use_plan_id``: that count and its plan (the first of them by
    :func:`decide`'s "fastest" order, never one folded itself) — the page folds the row into "use the
    4-GPU plan".  O(plans + counts²)."""
    by_k: dict[int, list[Mapping[str, Any]]] = {int(k): [] for k in counts}
    for p in plans:
        by_k.setdefault(len(p["devices"]), []).append(p)
    rows: list[dict[str, Any]] = []
    base: tuple[int, float] | None = None
    for k in sorted(by_k):
        if not by_k[k]:
            bound = (least or {}).get(k)
            if bound is not None and room is not None and bound > room:
                rows.append({"k": k, "plan_id": None, "least_memory_bytes": bound, "at_least": True})
            else:
                rows.append({"k": k, "plan_id": None, "least_memory_bytes": None})
            continue
        ok = [p for p in by_k[k] if fit.get(p["plan_id"], False)]
        if not ok:
            rows.append({"k": k, "plan_id": None, "least_memory_bytes": min(p["memory_bytes"] for p in by_k[k])})
            continue
        best = min(ok, key=lambda p: (_us(p["time_s"]), p["memory_bytes"]))
        row: dict[str, Any] = {"k": k, "plan_id": best["plan_id"], "time_s": best["time_s"],
                               "memory_bytes": best["memory_bytes"],
                               **plan_costs(best["time_s"], best["devices"], kinds, prices, batch=batch,
                                            epoch_samples=epoch_samples)}
        if base is None:
            base = (k, best["time_s"])
        k0, t0 = base
        row["efficiency"] = (t0 / best["time_s"]) / (k / k0)
        row["efficiency_vs"] = k0
        over = [r for r in rows if r["plan_id"] is not None and dominated(row, r)]
        if over:
            use = _first(over, _faster)
            row["use_k"], row["use_plan_id"] = use["k"], use["plan_id"]
        rows.append(row)
    return rows


# ---- the decision: which row of gpus_needed to take --------------------------------------------
# One rule, here; the page's script (.clientside: dominated, faster, cheaper, decide) mirrors it
# line for line, and tests/dashboard/test_decision.py holds the two to the same answers.
#: two costs this close (relative) are the same cost (float sums of the same prices differ in the last bits)
COST_TIE = 1e-9


def _us(time_s: float) -> int:
    """A step in whole microseconds, as the page shows it: two steps are a tie when these are equal."""
    return math.floor(time_s * 1e6 + 0.5)


def cost_column(rows: Iterable[Mapping[str, Any]]) -> str:
    """The cost rows are compared by: ``usd_per_1k_steps`` when every one of ``rows`` has a price,
    else ``gpu_hours_per_1k_steps`` (per 1,000 steps: an epoch is the same steps on every row).

    >>> cost_column([{"usd_per_1k_steps": 1.0}, {"usd_per_1k_steps": None}])
    'gpu_hours_per_1k_steps'
    """
    return "usd_per_1k_steps" if all(r["usd_per_1k_steps"] is not None for r in rows) else "gpu_hours_per_1k_steps"


def _cost_order(a: Mapping[str, Any], b: Mapping[str, Any], column: str) -> int:
    """-1, 0 or 1: ``a`` cheaper than, as cheap as (:data:`COST_TIE`), or dearer than ``b``."""
    x, y = a[column], b[column]
    if abs(x - y) <= COST_TIE * max(abs(x), abs(y)):
        return 0
    return -1 if x < y else 1


def dominated(row: Mapping[str, Any], by: Mapping[str, Any]) -> bool:
    """Whether the GPUs-needed row ``row`` is dominated by ``by``: ``by`` on fewer GPUs, its step no
    slower (to the microsecond) and no dearer (:func:`cost_column` of the two) — more GPUs for nothing.

    >>> one = {"k": 1, "time_s": 0.000651, "usd_per_1k_steps": 1.0, "gpu_hours_per_1k_steps": 1.0}
    >>> two = {"k": 2, "time_s": 0.0006512, "usd_per_1k_steps": 2.0, "gpu_hours_per_1k_steps": 2.0}
    >>> dominated(two, one), dominated(one, two)
    (True, False)
    """
    return (by["k"] < row["k"] and _us(by["time_s"]) <= _us(row["time_s"])
            and _cost_order(by, row, cost_column((by, row))) <= 0)


def _faster(a: Mapping[str, Any], b: Mapping[str, Any], column: str) -> bool:
    """Whether ``a`` goes before ``b`` as the fastest: a shorter step (to the microsecond), then fewer
    GPUs, then cheaper."""
    if _us(a["time_s"]) != _us(b["time_s"]):
        return _us(a["time_s"]) < _us(b["time_s"])
    if a["k"] != b["k"]:
        return a["k"] < b["k"]
    return _cost_order(a, b, column) < 0


def _cheaper(a: Mapping[str, Any], b: Mapping[str, Any], column: str) -> bool:
    """Whether ``a`` goes before ``b`` as the cheapest: cheaper (:data:`COST_TIE`), then fewer GPUs,
    then a shorter step."""
    order = _cost_order(a, b, column)
    if order:
        return order < 0
    if a["k"] != b["k"]:
        return a["k"] < b["k"]
    return _us(a["time_s"]) < _us(b["time_s"])


def _first(rows: Sequence[Mapping[str, Any]],
           before: Callable[[Mapping[str, Any], Mapping[str, Any], str], bool]) -> Mapping[str, Any]:
    """The row of ``rows`` that goes before every other by ``before`` (:func:`_faster` or
    :func:`_cheaper`), costs by :func:`cost_column` of ``rows``."""
    column = cost_column(rows)
    best = rows[0]
    for r in rows[1:]:
        if before(r, best, column):
            best = r
    return best


def decide(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The decision line's two plans among :func:`gpus_needed`'s ``rows`` that have a plan that fits:
    ``cheapest`` (cheapest per step, ties to fewer GPUs, then the shorter step) and ``fastest``
    (shortest step to the microsecond, ties to fewer GPUs, then the cheaper), both ``None`` when
    nothing fits, and ``cost``: the column they were compared by (:func:`cost_column`).

    >>> rows = [{"k": 1, "plan_id": "a", "time_s": 0.000651, "usd_per_1k_steps": 1.0, "gpu_hours_per_1k_steps": 1.0},
    ...         {"k": 2, "plan_id": "b", "time_s": 0.000651, "usd_per_1k_steps": 2.0, "gpu_hours_per_1k_steps": 2.0}]
    >>> d = decide(rows); d["cheapest"]["k"], d["fastest"]["k"], d["cost"]
    (1, 1, 'usd_per_1k_steps')
    """
    ok = [r for r in rows if r.get("plan_id") is not None]
    if not ok:
        return {"cheapest": None, "fastest": None, "cost": None}
    return {"cheapest": _first(ok, _cheaper), "fastest": _first(ok, _faster), "cost": cost_column(ok)}


__all__ = ["ListPrice", "LIST_PRICES", "price_key", "default_prices", "parse_prices", "format_prices",
           "steps_per_epoch", "plan_costs", "gpus_needed", "COST_TIE", "cost_column", "dominated", "decide"]
