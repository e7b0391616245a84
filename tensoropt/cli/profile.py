"""``tensoropt profile``: measure every operator of a model and write the profile JSON.

It owns the ``profile`` command's options and its report (the top operators, the totals, the
in-sequence check); the measuring is :func:`tensoropt.measure.profile`'s: it must not time
anything itself.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..describe import fmt_bytes
from ..graph import OpGraph
from ..measure import CostModel, profile
from ..measure.profiler import busy_warning
from ._common import add_capture_arguments, add_request_options, cache_of, capture_spec, check_repeats, save_output
from ._progress import ProgressBars

#: the shard degrees `tensoropt profile` measures unless told (no cluster names its meshes here)
PROFILED_DEGREES = (1, 2, 4, 8)


def _print_top(console: Console, graph: OpGraph, costs: CostModel, top: int) -> None:
    """The ``top`` operators by forward + backward time."""
    t = Table(title=f"{escape(graph.name)} (batch {graph.batch_size}, {graph.precision}) on "
                    f"{escape(costs.device['name'])}, "
                    f"{costs.device['threads']} threads — top {top} ops by forward + backward time",
              title_justify="left")
    for col in ("node", "op", "forward", "backward", "share", "saved", "how", "module"):
        t.add_column(col, justify="right" if col in ("forward", "backward", "share", "saved") else "left")
    total = costs.total_fp_s + costs.total_bp_s
    for n in costs.top(top):
        t.add_row(escape(n.name), escape(n.op), f"{n.fp_s * 1e3:.3f} ms", f"{n.bp_s * 1e3:.3f} ms",
                  f"{(n.fp_s + n.bp_s) / total:.1%}" if total else "-", fmt_bytes(n.saved_bytes), n.method,
                  escape(graph.nodes[n.name].module_path))
    console.print(t)


def _print_totals(console: Console, costs: CostModel, took: float) -> None:
    """Totals, how each cost was found, the in-sequence comparison and a busy-machine warning."""
    m = {k: costs.count(k) for k in ("measured", "cached", "free", "roofline", "sequence")}
    shards = [s for n in costs.nodes.values() for s in n.shards.values()]
    scaled = sum(1 for s in shards if s.method == "scaled")
    console.print(f"Σ forward {costs.total_fp_s * 1e3:.2f} ms, Σ backward {costs.total_bp_s * 1e3:.2f} ms over "
                  f"{len(costs)} ops ({m['measured']} measured alone, {m['cached']} identical to one measured, "
                  f"{m['sequence']} timed in sequence, {m['free']} metadata-only, {m['roofline']} roofline "
                  f"estimates); {len(shards)} shard costs ({scaled} scaled from the full shape); "
                  f"{costs.settings['measured_calls']} calls measured, {costs.settings['cached_calls']} from cache; "
                  f"profiled in {took:.1f} s")
    seq = costs.settings.get("in_sequence", {})
    if seq.get("used"):
        console.print(f"in sequence: a whole step {seq['step_s'] * 1e3:.2f} ms; Σ forward + backward "
                      f"{seq['in_sequence_sum_s'] * 1e3:.2f} ms in sequence vs {seq['isolated_sum_s'] * 1e3:.2f} ms "
                      "with every operator timed alone")
    elif seq.get("why"):
        console.print(f"[yellow]in sequence: {escape(seq['why'])}[/yellow]")
    warning = busy_warning(costs)
    if warning:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")


def _cmd_profile(args: argparse.Namespace, console: Console) -> int:
    check_repeats(args)
    # captured afresh: a timed profile runs the model's module, which a cached graph has not
    graph = capture_spec(args.model, console, batch=args.batch, batch_dim=args.batch_dim, precision=args.precision)
    t0 = time.perf_counter()
    with ProgressBars(console) as progress:
        costs = profile(graph, device=args.device, shard_degrees=args.degrees, repeats=args.repeats,
                        warmup=args.warmup, cache=cache_of(args), progress=progress, in_sequence=not args.isolated)
    took = time.perf_counter() - t0
    _print_top(console, graph, costs, args.top)
    _print_totals(console, costs, took)
    save_output(console, costs, args.output)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profile", help="measure every operator (forward, backward, memory) at every shard shape")
    add_capture_arguments(p, "zoo:NAME[?k=v&…] or path/to/file.py:factory")
    add_request_options(p, "device", "degrees", "repeats", "warmup", default={"degrees": PROFILED_DEGREES},
                        help={"degrees": "shard degrees to measure, comma-separated (default "
                                         f"{','.join(map(str, PROFILED_DEGREES))})"})
    p.add_argument("--isolated", action="store_true",
                   help="keep every operator's time alone (skip timing them inside whole training steps)")
    p.add_argument("--top", type=int, default=15, help="rows in the top-ops table (default 15)")
    p.add_argument("-o", "--output", metavar="PROFILE_JSON", help="write the profile as JSON")
    p.set_defaults(func=_cmd_profile)
