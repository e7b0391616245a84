"""``create_app()``: the tensoropt dashboard as a Dash app (issue 7).

Run it with ``tensoropt app`` (binds 127.0.0.1:8050), or ``create_app().run()``.

It owns assembling the app (store, background manager, upload limit, layout, callbacks),
loading, once, the modules the default's first run imports (:func:`preload`: the page's jobs are
forks of the server, so they start with them loaded), and starting the default's run beside the
server when asked (:func:`precompute`: ``tensoropt app`` does, so that the page opened a few seconds
later finds its work under way); it must not compute anything when the app is built.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path

import dash
import diskcache

from tensoropt import zoo
from tensoropt.errors import TensorOptError

from .callbacks import first_request, register_callbacks
from .layout import build_layout, split_zoo_spec
from .pipeline import DEFAULT_CLUSTER, DEFAULT_MODEL, Request, ResultStore, default_cache_dir, run_request
from .uploads import UPLOAD_KINDS


def preload(model: str) -> bool:
    """Import what building ``model`` imports when that is Hugging Face's ``transformers`` (a zoo
    GPT-2 or BERT: about 2.5 s on a 2-core machine), so that the page's background jobs — forks of
    the server process — start with it loaded; whether it did.  Nothing is built or computed."""
    if not model.startswith("zoo:"):
        return False
    try:
        entry = zoo.get(split_zoo_spec(model)[0])
    except ValueError:
        return False
    if getattr(entry.build, "__module__", "") != "tensoropt.zoo.hf":
        return False
    try:
        import transformers
    except ImportError:
        return False
    # transformers loads a model's modules on first access: these are the zoo's
    _ = (transformers.GPT2Config, transformers.GPT2LMHeadModel, transformers.BertConfig, transformers.BertForMaskedLM)
    return True


def _precompute(req: Request, root: str) -> None:
    """The body of :func:`precompute`'s process: the request computed into the store at ``root``; it
    ends with the server (a thread watches the parent), and a failure leaves the page to compute the
    request itself, and to show why."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)   # the server is gone: nobody will read the result

    threading.Thread(target=watch, daemon=True).start()
    try:
        run_request(req, ResultStore(root))
    except TensorOptError:
        pass   # bad input: the page's run says so, in the CLI's words
    except Exception:  # noqa: BLE001 - the server goes on; the page's run meets it again
        print("tensoropt app: computing the page's default failed (the page will try again):", file=sys.stderr)
        traceback.print_exc()


def precompute(*, cache_dir: str | os.PathLike[str] | None = None, default_model: str = DEFAULT_MODEL,
               default_cluster: str = DEFAULT_CLUSTER, repeats: int = 3, warmup: int = 1,
               algos: Sequence[str] | None = None) -> BaseProcess:
    """Start computing, in a process of its own (a fork of this one), the request the page runs when
    it opens with no link (:func:`~.callbacks.first_request` of the same arguments as
    :func:`create_app`'s) into the same store; returns the process (a daemon: it ends with the
    server).  The page's run of that request follows it instead of computing it again
    (:func:`~.pipeline.run_request`).  Call it before the server starts threads (a fork copies one
    thread)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    req = first_request(default_model, default_cluster, repeats, warmup,
                        algos=tuple(algos) if algos is not None else None)
    proc = multiprocessing.get_context("fork").Process(target=_precompute, args=(req, str(root)), daemon=True,
                                                       name="tensoropt-app-default")
    proc.start()
    return proc


def create_app(*, cache_dir: str | os.PathLike[str] | None = None, default_model: str = DEFAULT_MODEL,
               default_cluster: str = DEFAULT_CLUSTER, repeats: int = 3, warmup: int = 1,
               algos: Sequence[str] | None = None) -> dash.Dash:
    """The dashboard.  ``cache_dir``: where results, uploads and the background-job cache live
    (default :func:`~tensoropt.dashboard.pipeline.default_cache_dir`, per user); ``default_model`` /
    ``default_cluster``: what the page computes when it opens (the README's main command by
    default); ``repeats`` / ``warmup``: the profiling defaults; ``algos``: the baseline placers
    (default: all of :data:`tensoropt.placers.PLACERS`).  Building the app computes nothing: the
    page's first load starts the default run (background job, progress bar), and a request
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
                              warmup=warmup)
    register_callbacks(app, store, algos=tuple(algos) if algos is not None else None, default_model=default_model)
    preload(default_model)
    return app


__all__ = ["create_app", "precompute", "preload"]
