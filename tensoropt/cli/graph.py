"""``tensoropt graph``: capture a model and describe its operator graph (:func:`tensoropt.describe.print_graph`).

It owns the ``graph`` command's options; it must not profile or place anything.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console

from ..describe import print_graph
from ..graph import Precision
from ..modelspec import load_model
from ._common import add_capture_arguments, cache_of, save_output


def _cmd_graph(args: argparse.Namespace, console: Console) -> int:
    t0 = time.perf_counter()
    loaded = load_model(args.model, batch=args.batch, lazy=True)     # built where the capture is not cached
    with console.status(f"capturing {args.model} …"):
        graph = loaded.capture(batch_dim=args.batch_dim, method=args.method, precision=args.precision,
                               cache=cache_of(args))
    t1 = time.perf_counter()
    print_graph(graph, console, top=args.top, limit=0 if args.all else args.limit)
    if graph.precision != Precision.FP32:
        console.print(f"precision {graph.precision}: activations as torch.autocast computes them, parameters float32")
    console.print(f"built and captured in {t1 - t0:.2f} s" if "read from the capture cache" not in graph.notes
                  else f"read from the capture cache in {t1 - t0:.2f} s")
    save_output(console, graph, args.json)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("graph", help="capture a model and describe its operator graph")
    add_capture_arguments(g, "zoo:NAME[?k=v&…], path/to/file.py:factory, model.onnx or graph.json")
    g.add_argument("--method", choices=("auto", "export", "fx"), default="auto",
                   help="capture door: torch.export then torch.fx (auto), or one of them")
    g.add_argument("--json", metavar="OUT", help="write the OpGraph as JSON")
    g.add_argument("--top", type=int, default=10, help="rows in the histogram / largest-tensor tables")
    g.add_argument("--limit", type=int, default=40, help="nodes to list (default 40)")
    g.add_argument("--all", action="store_true", help="list every node")
    g.set_defaults(func=_cmd_graph)
