"""The URL's query string as the page's state, shareable: :func:`url_state` writes the controls'
values into it (``?model=…&cluster=…``, the keys of :data:`URL_KEYS`); :func:`apply_url` reads a
link back into the controls' new values, whether the page computes it at once, and what it could
not take, in words.  An uploaded file travels as ``upload:NAME`` (its content hash under the
store's uploads), never as a path on the server.

It owns the codec and what a link may run by itself (a zoo model, an upload, the server's own
model, never another ``file.py:factory``); it must not touch Dash (:mod:`.callbacks` wires it to the
``url`` components) nor run anything.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from tensoropt import zoo
from tensoropt.graph import PRECISIONS
from tensoropt.optimizers import OPTIMIZER_ALPHA
from tensoropt.planmodel.pipelined import LOOPED

from . import prices
from .pipeline import DETECTED, ResultStore
from .requests import chosen_source, split_zoo_spec, zoo_spec

#: the URL's keys, in the order they are written
URL_KEYS = ("model", "cluster", "devices", "batch", "optimizer", "precision", "pipelines", "costs", "budget", "reserve",
            "price", "epoch", "plan")
#: an uploaded file as a link names it (its content hash and suffix under the store's uploads)
UPLOAD_PREFIX = "upload:"


def _upload_token(path: str | None, store: ResultStore) -> str | None:
    """``upload:NAME`` for a file under the store's uploads, else ``None``."""
    if not path:
        return None
    p = Path(path)
    return UPLOAD_PREFIX + p.name if p.parent == store.uploads() else None


def _upload_path(token: str, store: ResultStore, suffixes: tuple[str, ...]) -> str | None:
    """The uploaded file ``upload:NAME`` names, when it is one (a plain name with one of ``suffixes``) and
    is still there; else ``None``."""
    name = token[len(UPLOAD_PREFIX):]
    stem, dot, suffix = name.rpartition(".")
    if not stem or not all(c in "0123456789abcdef" for c in stem) or f".{suffix}" not in suffixes:
        return None
    path = store.uploads() / name
    return str(path) if path.is_file() else None


def _number(text: Any, kind: type = float) -> Any:
    """A positive finite number of ``kind`` from a URL value (or a control's), else ``None``."""
    try:
        v = kind(text) if text not in (None, "") else None
    except (TypeError, ValueError):
        return None
    return v if v is not None and math.isfinite(v) and v > 0 else None


def url_state(store: ResultStore, *, source: str | None, zoo_name: str | None, zoo_params: str | None,
              spec: str | None, onnx_path: str | None, csource: str | None, preset: str | None, cpath: str | None,
              devices: Sequence[str] | None, batch: Any = None, optimizer: str | None = None,
              precision: str | None = None, costs: str | None = None, budget: Any = None, reserve: Any = None,
              price: Mapping[str, float | None] | None = None, epoch: Any = None, plan: str | None = None,
              pipelines: Sequence[str] | None = None) -> str:
    """The query string that holds the page's state (``?model=…&cluster=…``; :data:`URL_KEYS`):
    the model spec (an uploaded ONNX file as ``upload:NAME``), the cluster (``preset:NAME``,
    ``detected`` or ``upload:NAME``), the devices, batch, optimizer, precision, the pipeline
    schedules priced (``1f1b,gpipe``), where the times
    come from, the budget and reserve (GiB), the prices (``key:usd,…``), the epoch size and the
    selected plan.  :func:`apply_url` reads it back.  Values that cannot be said are left out."""
    q: list[tuple[str, str]] = []
    model = None
    source = chosen_source(source or "", zoo_name, zoo_params, spec)   # the model the run button would ask for
    if source == "onnx":
        model = _upload_token(onnx_path, store)
    elif source == "spec":
        model = (spec or "").strip() or None
    elif zoo_name:
        model = zoo_spec(zoo_name, zoo_params)
    if model:
        q.append(("model", model))
    cluster = (DETECTED if csource == "detected" else _upload_token(cpath, store) if csource == "upload"
               else f"preset:{preset}" if preset else None)
    if cluster:
        q.append(("cluster", cluster))
    if devices:
        q.append(("devices", ",".join(devices)))
    for k, v in (("batch", batch), ("optimizer", optimizer), ("precision", precision),
                 ("pipelines", ",".join(pipelines or ())), ("costs", costs)):
        if v not in (None, ""):
            q.append((k, str(v)))
    for k, v in (("budget", budget), ("reserve", reserve)):
        if _number(v) is not None:   # what apply_url takes back: a positive finite number of GiB
            q.append((k, f"{float(v):g}"))
    text = prices.format_prices(price or {})
    if text:
        q.append(("price", text))
    if epoch not in (None, ""):
        q.append(("epoch", str(epoch)))
    if plan:
        q.append(("plan", plan))
    return "?" + urlencode(q, safe=":,;")


def apply_url(search: str | None, store: ResultStore, trusted: Collection[str] = ()) -> dict[str, Any]:
    """What a URL's query string (:func:`url_state`) sets on the page: a dict with the controls' new
    values (absent: leave it), ``run`` (whether the page computes it at once) and ``messages`` (what
    it could not take, in words).  A link runs a zoo model, an uploaded file or a model of
    ``trusted`` (the one the server was started with) at once; any other model spec
    (``file.py:factory`` runs code of this machine) is filled in, and runs only when its result is
    already computed (reading it back runs nothing) or the run button is pressed."""
    params = dict(parse_qsl((search or "").lstrip("?"), keep_blank_values=False))
    out: dict[str, Any] = {"run": True, "messages": []}
    model = params.get("model", "").strip()
    if model.startswith(UPLOAD_PREFIX):
        path = _upload_path(model, store, (".onnx",))
        if path is None:
            out["messages"].append(f"the link's model {model} is not an uploaded ONNX file of this server: upload it "
                                   "again")
            out["run"] = False
        else:
            out.update(model_source="onnx", onnx_path=path, model_spec="")   # an old spec in the box would win
    elif model.startswith("zoo:") and split_zoo_spec(model)[0] in zoo.ZOO:
        name, query = split_zoo_spec(model)
        out.update(model_source="zoo", zoo_name=name, zoo_params=query, model_spec="")   # else a spec would win
    elif model in trusted:
        out.update(model_source="spec", model_spec=model)
    elif model:
        out.update(model_source="spec", model_spec=model)
        out["run"] = False
        out["messages"].append(f"the link names the model {model}: press run to compute it (a link never runs a "
                               "file of this machine by itself)")
    cluster = params.get("cluster", "").strip()
    if cluster == DETECTED:
        out.update(cluster_source="detected")
    elif cluster.startswith("preset:"):
        out.update(cluster_source="preset", cluster_preset=cluster[len("preset:"):])
    elif cluster.startswith(UPLOAD_PREFIX):
        path = _upload_path(cluster, store, (".yaml", ".yml", ".json"))
        if path is None:
            out["messages"].append(f"the link's cluster {cluster} is not an uploaded cluster file of this server: "
                                   "upload it again")
            out["run"] = False
        else:
            out.update(cluster_source="upload", cluster_path=path)
    elif cluster:
        out["messages"].append(f"the link's cluster {cluster!r} is not a preset, an upload or 'detected'; "
                               "choose one")
        out["run"] = False
    if params.get("devices"):
        out["devices"] = [d for d in params["devices"].split(",") if d]
    if _number(params.get("batch"), int):
        out["batch"] = _number(params.get("batch"), int)
    if params.get("optimizer") in OPTIMIZER_ALPHA:
        out["optimizer"] = params["optimizer"]
    if params.get("precision") in PRECISIONS:
        out["precision"] = params["precision"]
    if params.get("pipelines"):
        wanted = params["pipelines"].split(",")
        out["pipelines"] = [s for s in LOOPED if s in wanted]
    if params.get("costs") in ("auto", "measured", "model"):
        out["costs"] = params["costs"]
    for k in ("budget", "reserve"):
        if _number(params.get(k)) is not None:
            out[k] = _number(params.get(k))
    if _number(params.get("epoch"), int):
        out["epoch"] = _number(params.get("epoch"), int)
    if params.get("price"):
        out["prices"] = prices.parse_prices(params["price"])
    if params.get("plan"):
        out["plan"] = params["plan"]
    return out

__all__ = ["URL_KEYS", "UPLOAD_PREFIX", "url_state", "apply_url"]
