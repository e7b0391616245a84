"""What ``tensoropt app`` does before the page's modules load: the default's run started in a
process of its own, and the modules its jobs import loaded once — without Dash.

The page's first frontier is the default request's (:func:`~.requests.first_request`); forking
its run first, before Dash, plotly and the page are imported, lets the run's capture and profile
overlap the server's start (issue 40: the frontier on the page within 10 s of the command).

It owns starting that run (:func:`precompute`) and preloading the model's library
(:func:`preload`); it must not import Dash or plotly, nor compute anything itself.
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

from tensoropt import zoo
from tensoropt.errors import TensorOptError
from tensoropt.request import default_of

from .pipeline import (
    DEFAULT_CLUSTER,
    DEFAULT_MODEL,
    DEFAULT_PRECISION,
    Request,
    ResultStore,
    behind_the_page,
    default_cache_dir,
    run_request,
)
from .requests import first_request, split_zoo_spec


def preload(model: str) -> bool:
    """Import what building ``model`` imports when that is Hugging Face's ``transformers`` (a zoo
    GPT-2, BERT, Llama or Mixtral: about 2.5 s on a 2-core machine), so that the page's background jobs — forks of
    the server process — start with it loaded; whether it did.  Nothing is built or computed."""
    if not model.startswith("zoo:"):
        return False
    try:
        entry = zoo.get(split_zoo_spec(model)[0])
    except ValueError:
        return False
    if getattr(entry.build, "__module__", "") not in ("tensoropt.zoo.hf", "tensoropt.zoo.llm"):
        return False
    try:
        import transformers
    except ImportError:
        return False
    # transformers loads a model's modules on first access: these are the zoo's
    _ = (transformers.GPT2Config, transformers.GPT2LMHeadModel, transformers.BertConfig, transformers.BertForMaskedLM,
         transformers.LlamaConfig, transformers.LlamaForCausalLM)
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
        run_request(req, ResultStore(root), on_frontier=lambda _key: behind_the_page())
    except TensorOptError:
        pass   # bad input: the page's run says so, in the CLI's words
    except Exception:  # noqa: BLE001 - the server goes on; the page's run meets it again
        print("tensoropt app: computing the page's default failed (the page will try again):", file=sys.stderr)
        traceback.print_exc()


def precompute(*, cache_dir: str | os.PathLike[str] | None = None, default_model: str = DEFAULT_MODEL,
               default_cluster: str = DEFAULT_CLUSTER, default_precision: str | None = DEFAULT_PRECISION,
               repeats: int = default_of("repeats"), warmup: int = default_of("warmup"),
               algos: Sequence[str] | None = None) -> BaseProcess:
    """Start computing, in a process of its own (a fork of this one), the request the page runs when
    it opens with no link (:func:`~.requests.first_request` of the same arguments as
    :func:`~.main.create_app`'s) into the same store; returns the process (a daemon: it ends with the
    server).  The page's run of that request follows it instead of computing it again
    (:func:`~.pipeline.run_request`).  Call it before the server starts threads (a fork copies one
    thread)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    req = first_request(default_model, default_cluster, repeats, warmup,
                        algos=tuple(algos) if algos is not None else None, default_precision=default_precision)
    proc = multiprocessing.get_context("fork").Process(target=_precompute, args=(req, str(root)), daemon=True,
                                                       name="tensoropt-app-default")
    proc.start()
    return proc


__all__ = ["precompute", "preload"]
