"""``tensoropt app``: the dashboard (``tensoropt.dashboard``, the ``app/`` folder) on http://127.0.0.1:8050.

Binds 127.0.0.1 unless ``--host`` says otherwise (the page runs models and reads uploads: do not
expose it to a network you do not trust).  ``--model`` / ``--cluster`` / ``--precision`` set what the page
computes when it opens (default: the README's main command, no GPU needed); that request starts computing
with the server (``--lazy``: not before a page asks).

It owns the ``app`` command's options and the checks before the server starts; the page is
:mod:`tensoropt.dashboard`'s.  It must not import the dashboard at module level: every command
loads this module to build the parser, and Dash + plotly (about half a second) serve only this one.
"""

from __future__ import annotations

import argparse
import gc
import socket

from rich.console import Console
from rich.markup import escape

from ..errors import TensorOptError
from ..graph import PRECISIONS
from ._common import add_request_options, check_repeats


def _cmd_app(args: argparse.Namespace, console: Console) -> int:
    if not 0 < args.port < 65536:
        raise TensorOptError(f"--port must be between 1 and 65535, got {args.port}")
    check_repeats(args)
    try:
        # lazy: Dash and plotly load only for this command (module docstring), and only after the default's run
        # has started (startup imports neither); an install without the app/ folder mapped to
        # tensoropt.dashboard (pyproject package-dir) fails here.  mypy does not follow the editable install's
        # import hook and may not find the module, hence the ignores
        from tensoropt.dashboard.pipeline import (  # type: ignore[import-not-found, unused-ignore]
            DEFAULT_CLUSTER,
            DEFAULT_MODEL,
            DEFAULT_PRECISION,
        )
        from tensoropt.dashboard.startup import (  # type: ignore[import-not-found, unused-ignore]
            precompute,
            preload,
        )
    except ImportError as e:
        raise _cannot_start(e) from None

    _check_port_free(args.host, args.port)
    defaults = {"cache_dir": args.cache_dir, "default_model": args.model or DEFAULT_MODEL,
                "default_cluster": args.cluster or DEFAULT_CLUSTER,
                "default_precision": args.precision or DEFAULT_PRECISION, "repeats": args.repeats,
                "algos": args.algos.split(",") if args.algos else None}
    if not args.lazy:
        # the page's first run, started now — a fork, before the server's threads and before Dash and plotly load
        # here (issue 40: its capture and profile overlap the server's start): the page opened a few seconds later
        # follows it instead of starting it.  The model's library (transformers, 2 s) is loaded first, once for
        # both: imported after the fork, the server's copy competed with the run's capture for the two cores
        # (command to frontier drawn in headless Chromium 12.1 s before, 11.5 s after, medians of 3)
        preload(defaults["default_model"])
        # what is loaded now lives as long as the server: out of the collector's sight (its full collections walked
        # torch's and transformers' objects, 0.1 - 0.15 s each, in the run and in the page's first answers)
        gc.freeze()
        precompute(**defaults)
    try:
        from tensoropt.dashboard import create_app  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:   # Dash or plotly missing or broken
        raise _cannot_start(e) from None
    dash_app = create_app(**defaults)   # imports what the default's model needs (the page's jobs, forks, inherit it)
    gc.freeze()   # the app and Dash too (above); a first draw's page data took 0.15 s of collection before
    url = f"http://{'127.0.0.1' if args.host in ('127.0.0.1', 'localhost') else args.host}:{args.port}/"
    console.print(f"tensoropt dashboard on {escape(url)} (Ctrl+C to stop)", highlight=False)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]listening on {escape(args.host)}: anyone who can reach it can run models and "
                      "upload files[/yellow]")
    dash_app.run(host=args.host, port=args.port, debug=args.debug_app, use_reloader=False)
    return 0


def _cannot_start(e: ImportError) -> TensorOptError:
    return TensorOptError(f"the dashboard cannot start: {e}; install the project with "
                          "`pip install -e .` from the repository (it ships the app/ package)")


def _check_port_free(host: str, port: int) -> None:
    """Refuse a port something else listens on, before the server starts (werkzeug would exit
    with an OSError deep inside)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise TensorOptError(f"cannot listen on {host}:{port} ({e.strerror or e}); another program (or another "
                                 f"tensoropt app) uses it: stop it, or pass --port with a free port, e.g. "
                                 f"--port {port + 1}") from None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("app", help="the web dashboard (Plotly Dash)",
                       description="Open the dashboard: choose a model and a cluster, track the frontier, compare "
                                   "with the baseline placers, inspect and download plans.")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8050, help="port (default 8050)")
    # defaults live in tensoropt.dashboard.pipeline; importing it here would load Dash for every command
    p.add_argument("--model", help="model computed when the page opens (default zoo:llama3-8b)")
    p.add_argument("--cluster", help="cluster of that first run (default preset:h100-hosts?hosts=1: 8 H100 80 GB)")
    p.add_argument("--precision", choices=PRECISIONS, help="precision of that first run (default bf16-params: "
                                                           "FSDP2's bf16 copies of fp32 master weights)")
    add_request_options(p, "repeats")
    p.add_argument("--algos", help="comma-separated baseline placers to compare (default: all)")
    p.add_argument("--cache-dir", help="results, uploads and job state (default: ~/.cache/tensoropt/app, or "
                                       "$TENSOROPT_APP_CACHE_DIR)")
    p.add_argument("--lazy", action="store_true",
                   help="compute nothing before a page asks (by default the page's first request — the --model "
                        "on the --cluster — starts computing with the server, and the page follows it)")
    p.add_argument("--debug-app", action="store_true", help="Dash debug mode (dev tools, reloader off)")
    p.set_defaults(func=_cmd_app)
