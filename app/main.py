"""``create_app()``: the tensoropt dashboard as a Dash app (issue 7).

Run it with ``tensoropt app`` (binds 127.0.0.1:8050), or ``create_app().run()``.

It owns assembling the app (store, background manager, upload limit, layout, callbacks) and
loading, once, the modules the default's first run imports (:func:`~.startup.preload`: the page's
jobs are forks of the server, so they start with them loaded); it must not compute anything when
the app is built.  Starting the default's run with the server is :func:`~.startup.precompute`'s
(``tensoropt app`` calls it before this module is imported).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import dash
import diskcache

from tensoropt.request import default_of

from .callbacks import register_callbacks
from .layout import build_layout
from .pipeline import DEFAULT_CLUSTER, DEFAULT_MODEL, DEFAULT_PRECISION, ResultStore, default_cache_dir
from .startup import preload
from .uploads import UPLOAD_KINDS


def create_app(*, cache_dir: str | os.PathLike[str] | None = None, default_model: str = DEFAULT_MODEL,
               default_cluster: str = DEFAULT_CLUSTER, default_precision: str | None = DEFAULT_PRECISION,
               repeats: int = default_of("repeats"), warmup: int = default_of("warmup"),
               algos: Sequence[str] | None = None) -> dash.Dash:
    """The dashboard.  ``cache_dir``: where results, uploads and the background-job cache live
    (default :func:`~tensoropt.dashboard.pipeline.default_cache_dir`, per user); ``default_model`` /
    ``default_cluster`` / ``default_precision`` (``None``: fp32): what the page computes when it
    opens (the README's main command by default); ``repeats`` / ``warmup``: the profiling defaults;
    ``algos``: the baseline placers (default: all of :data:`tensoropt.placers.PLACERS`).  Building
    the app computes nothing: the page's first load starts the default run (background job, progress bar), and a request
    already computed is read back from ``cache_dir`` at once.  The modules the default's model
    needs are imported here (:func:`preload`)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    store = ResultStore(root)
    manager = dash.DiskcacheManager(diskcache.Cache(str(root / "jobs")))
    app = dash.Dash(__name__, title="tensoropt", background_callback_manager=manager,
                    suppress_callback_exceptions=False)
    # uploads arrive base64-encoded in a callback request: bound what the server accepts
    largest = max(limit for _, limit in UPLOAD_KINDS.values())
    app.server.config["MAX_CONTENT_LENGTH"] = largest * 4 // 3 + 2 ** 20
    app.layout = build_layout(default_model=default_model, default_cluster=default_cluster, repeats=repeats,
                              warmup=warmup, default_precision=default_precision)
    register_callbacks(app, store, algos=tuple(algos) if algos is not None else None, default_model=default_model)
    preload(default_model)
    return app


__all__ = ["create_app"]
