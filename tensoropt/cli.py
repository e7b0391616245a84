"""The ``tensoropt`` command line.

Every subcommand takes a model spec (``zoo:NAME?k=v``, ``file.py:factory``, ``model.onnx``,
``graph.json``).  Bad input prints one line-or-few message and exits 2; ``--debug`` shows the
traceback instead.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from typing import Sequence

from rich.console import Console
from rich.markup import escape

from .errors import TensorOptError


def _cmd_zoo(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    from . import zoo

    t = Table(title="model zoo (use as zoo:NAME?key=value&…; ?tiny=1 for the test-sized variant)",
              title_justify="left")
    for col in ("name", "description", "parameters (defaults)", "needs"):
        t.add_column(col)
    for name, entry in zoo.ZOO.items():
        params = ", ".join(f"{k}={v}" for k, v in entry.params().items())
        t.add_row(name, escape(entry.description), escape(params), escape("pip install -e .[zoo]") if entry.requires else "")
    console.print(t)
    return 0


def _cmd_graph(args: argparse.Namespace, console: Console) -> int:
    from .describe import print_graph
    from .modelspec import load_model

    t0 = time.perf_counter()
    loaded = load_model(args.model, batch=args.batch)
    t1 = time.perf_counter()
    with console.status(f"capturing {args.model} …"):
        graph = loaded.capture(batch_dim=args.batch_dim, method=args.method)
    t2 = time.perf_counter()
    print_graph(graph, console, top=args.top, limit=0 if args.all else args.limit)
    console.print(f"built in {t1 - t0:.2f} s, captured in {t2 - t1:.2f} s")
    if args.json:
        graph.save(args.json)
        console.print(f"wrote {args.json}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tensoropt", description="Pareto-optimal multi-GPU training plans "
                                "for PyTorch models.")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    z = sub.add_parser("zoo", help="list the built-in models")
    z.set_defaults(func=_cmd_zoo)

    g = sub.add_parser("graph", help="capture a model and describe its operator graph")
    g.add_argument("model", help="zoo:NAME[?k=v&…], path/to/file.py:factory, model.onnx or graph.json")
    g.add_argument("--batch", type=int, help="batch size (overrides the model's default)")
    g.add_argument("--batch-dim", type=int, default=0, help="batch dimension of the inputs (default 0)")
    g.add_argument("--method", choices=("auto", "export", "fx"), default="auto",
                   help="capture door: torch.export then torch.fx (auto), or one of them")
    g.add_argument("--json", metavar="OUT", help="write the OpGraph as JSON")
    g.add_argument("--top", type=int, default=10, help="rows in the histogram / largest-tensor tables")
    g.add_argument("--limit", type=int, default=40, help="nodes to list (default 40)")
    g.add_argument("--all", action="store_true", help="list every node")
    g.set_defaults(func=_cmd_graph)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # wide tables when piped (rich assumes 80 columns without a terminal)
    console = Console(width=None if sys.stdout.isatty() else 160)
    err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
    try:
        return args.func(args, console)
    except TensorOptError as e:
        if args.debug:
            traceback.print_exc()
        err.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
        return e.exit_code
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except Exception as e:  # noqa: BLE001 - a bug of ours: say so, briefly, unless --debug
        if args.debug:
            traceback.print_exc()
        else:
            err.print(f"[red]internal error:[/red] {type(e).__name__}: {escape(str(e))}\n"
                      "rerun with --debug for the traceback and report it", highlight=False, soft_wrap=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
