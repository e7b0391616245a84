"""Human-readable summaries of an OpGraph (what ``tensoropt graph`` prints).

It owns the wording and layout of those summaries; it must not compute anything a plan or a
profile needs (it only reads the graph), and it is the only module here that draws with rich.

Example::

    >>> import torch
    >>> from tensoropt import capture
    >>> graph = capture(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()), (torch.randn(8, 16),))
    >>> print_graph(graph, Console(width=100), top=2)   # the summary, then tables (op histogram, …)
    Sequential  (torch.export, batch 8, fingerprint ...)
      note: captured with torch.export (non-strict) in ... s
      2 ops (0 metadata-only, 0 generators), 3 edges
      parameters: 544 (2.1 KiB), buffers 0 B, constants 0 B
    ...
    >>> fmt_bytes(3 * 2**30)
    '3.0 GiB'
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from .graph import OpGraph, ParamKind


def fmt_bytes(n: float) -> str:
    """``1536`` → ``1.5 KiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _natural(name: str) -> list[Any]:
    """Sort key: the numbers in a name compared as numbers (``gpu2`` before ``gpu10``)."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


#: more runs than this are written as the first two, an ellipsis, the last and the count
_MAX_RUNS = 4


def fmt_devices(devices: Sequence[str], sep: str = ", ") -> str:
    """Devices in a line: fewer than five as given (``"gpu0, gpu1"``); five or more by name, each run
    of three or more consecutive numbers as a range that counts right (``gpu0–gpu7`` is eight) — the
    first and last name with a count read as five devices where there were eight (``gpu0 … gpu4 (8)``).
    More than four runs: the first two, ``…``, the last and how many devices.

    >>> fmt_devices(["gpu0", "gpu1"]), fmt_devices(["gpu0", "gpu5", "gpu1", "gpu6", "gpu2", "gpu7", "gpu3", "gpu4"])
    ('gpu0, gpu1', 'gpu0–gpu7')
    >>> fmt_devices(["gpu0", "gpu1", "gpu2", "gpu3", "gpu5", "gpu6", "gpu10"])
    'gpu0–gpu3, gpu5, gpu6, gpu10'
    >>> fmt_devices([f"h{h}g{g}" for g in range(8) for h in range(10)], sep=",")
    'h0g0–h0g7,h1g0–h1g7,…,h9g0–h9g7 (80 devices)'
    """
    return _fmt_devices(tuple(devices), sep)


@functools.lru_cache(maxsize=4096)
def _fmt_devices(devices: tuple[str, ...], sep: str) -> str:
    # cached: a plan's graph labels each of its operators by its devices (Llama-3-8B: 3,456 calls a
    # drawing, 60 % of its time, for a handful of device sets)
    if len(devices) < 5:
        return sep.join(devices)
    runs: list[list[str]] = []
    last: tuple[str, int] | None = None
    for d in sorted(devices, key=_natural):
        m = re.fullmatch(r"(.*?)(\d+)", d)
        at = (m.group(1), int(m.group(2))) if m else None
        if runs and at and last and at[0] == last[0] and at[1] == last[1] + 1:
            runs[-1].append(d)
        else:
            runs.append([d])
        last = at
    pieces = [f"{r[0]}–{r[-1]}" if len(r) >= 3 else sep.join(r) for r in runs]
    if len(pieces) > _MAX_RUNS:
        return f"{sep.join(pieces[:2])}{sep}…{sep}{pieces[-1]} ({len(devices)} devices)"
    return sep.join(pieces)


def fmt_count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n:,}"


@dataclass(frozen=True)
class GraphSummary:
    ops: int
    metadata_only: int
    generators: int
    edges: int
    params: int              # number of parameter elements
    param_bytes: int
    buffer_bytes: int
    constant_bytes: int
    activation_bytes: int    # sum of output bytes of non-metadata ops (upper bound on what backward saves)
    batch_splittable: int
    channel_splittable: int


def summarize(g: OpGraph) -> GraphSummary:
    """Counts and byte totals of a graph, O(V + E)."""
    ops = g.ops
    return GraphSummary(
        ops=len(ops),
        metadata_only=sum(n.metadata_only for n in ops),
        generators=sum(n.generator for n in ops),
        edges=len(g.edges),
        params=sum(p.numel for p in g.params.values() if p.kind == ParamKind.PARAMETER),
        param_bytes=g.param_bytes("parameter"),
        buffer_bytes=g.param_bytes("buffer"),
        constant_bytes=g.param_bytes("constant"),
        activation_bytes=sum(n.output_bytes for n in ops if not n.metadata_only),
        batch_splittable=sum(n.split.batch is not None for n in ops if not n.metadata_only),
        channel_splittable=sum(n.split.channel is not None for n in ops if not n.metadata_only),
    )


def print_graph(g: OpGraph, console: Console, *, top: int = 10, limit: int = 40) -> None:
    """Print the summary, op histogram, largest tensors, largest parameters and the node table."""
    _print_summary(g, console)
    console.print(_op_histogram_table(g, top))
    console.print(_largest_tensors_table(g, top))
    console.print(_largest_params_table(g, top))
    ruleless = _ruleless_table(g)
    if ruleless is not None:
        console.print(ruleless)
    console.print(_nodes_table(g, limit))


def _print_summary(g: OpGraph, console: Console) -> None:
    """The graph's name, source, batch, fingerprint, notes and :func:`summarize` counts."""
    s = summarize(g)
    console.print(f"[bold]{g.name}[/bold]  ({g.source}, batch {g.batch_size}, fingerprint {g.fingerprint[:16]})")
    for note in g.notes:
        console.print(f"  note: {note}")
    console.print(
        f"  {s.ops} ops ({s.metadata_only} metadata-only, {s.generators} generators), {s.edges} edges\n"
        f"  parameters: {fmt_count(s.params)} ({fmt_bytes(s.param_bytes)}), buffers {fmt_bytes(s.buffer_bytes)}, "
        f"constants {fmt_bytes(s.constant_bytes)}\n"
        f"  activations (sum of op outputs): {fmt_bytes(s.activation_bytes)}\n"
        f"  splittable ops: {s.batch_splittable} along the batch, {s.channel_splittable} along channels")


def _op_histogram_table(g: OpGraph, top: int) -> Table:
    """The ``top`` most common ops, their count and output bytes."""
    hist = Table(title="op histogram", title_justify="left")
    hist.add_column("op")
    hist.add_column("count", justify="right")
    hist.add_column("output bytes", justify="right")
    out_bytes: dict[str, int] = {}
    for n in g.ops:
        out_bytes[n.op] = out_bytes.get(n.op, 0) + n.output_bytes
    for op, count in g.op_histogram().most_common(top):
        hist.add_row(op, str(count), fmt_bytes(out_bytes[op]))
    return hist


def _largest_tensors_table(g: OpGraph, top: int) -> Table:
    """The ``top`` largest node outputs (metadata-only ops left out)."""
    big = Table(title=f"largest tensors (top {top})", title_justify="left")
    for col in ("node", "op", "shape", "dtype", "bytes", "module"):
        big.add_column(col, justify="right" if col == "bytes" else "left")
    tensors = [(t.nbytes, n, t) for n in g if n.kind != "output" and not n.metadata_only for t in n.outputs]
    for nbytes, n, t in sorted(tensors, key=lambda x: -x[0])[:top]:
        big.add_row(n.name, n.op, str(list(t.shape)), t.dtype, fmt_bytes(nbytes), n.module_path)
    return big


def _largest_params_table(g: OpGraph, top: int) -> Table:
    """The ``top`` largest parameters, buffers and constants, their owner and readers."""
    pt = Table(title=f"largest parameters (top {top} of {len(g.params)})", title_justify="left")
    for col in ("name", "kind", "shape", "bytes", "owner", "also read by"):
        pt.add_column(col, justify="right" if col == "bytes" else "left")
    for p in sorted(g.params.values(), key=lambda p: -p.nbytes)[:top]:
        pt.add_row(p.name, p.kind, str(list(p.shape)), fmt_bytes(p.nbytes), p.owner or "-", ", ".join(p.readers) or "-")
    return pt


def _ruleless_table(g: OpGraph) -> Table | None:
    """The ops without a split rule (:func:`replicated_ops`) and where they are; ``None`` if none."""
    ruleless = replicated_ops(g)
    if not ruleless:
        return None
    rt = Table(title="ops without a split rule (never split: every device that runs one runs it whole)",
               title_justify="left")
    for col in ("op", "count", "modules"):
        rt.add_column(col, justify="right" if col == "count" else "left")
    for op, paths in ruleless.items():
        where = ", ".join(p or "(root)" for p in paths[:3]) + (
            f", … {len(paths) - 3} more" if len(paths) > 3 else "")
        rt.add_row(op, str(len(paths)), where)
    return rt


def _nodes_table(g: OpGraph, limit: int) -> Table:
    """The first ``limit`` nodes (every node when ``limit <= 0``): outputs, split dims, flags,
    parameters owned, module."""
    nt = Table(title="nodes" + (f" (first {limit} of {len(g)}; --all for every node)" if 0 < limit < len(g) else ""),
               title_justify="left")
    for col in ("name", "op", "output", "batch", "channel", "flags", "params", "module"):
        nt.add_column(col)
    shown = list(g)[:limit] if limit > 0 else list(g)
    for n in shown:
        flags = ",".join(f for f, on in (("meta", n.metadata_only), ("gen", n.generator),
                                         ("inexact-batch", not n.split.batch_exact)) if on)
        out = "; ".join(f"{list(t.shape)}" for t in n.outputs)
        nt.add_row(n.name, n.op, out, _dim(n.split.batch), _dim(n.split.channel), flags,
                   str(len(n.params)) if n.params else "", n.module_path)
    return nt


def replicated_ops(g: OpGraph) -> dict[str, list[str]]:
    """Op → module paths of its nodes, for the ops tensoropt has no split rule for
    (``split.rule == "replicated"``): plans run them whole, whatever their shapes allow."""
    out: dict[str, list[str]] = {}
    for n in g.ops:
        if n.split.rule == "replicated":
            out.setdefault(n.op, []).append(n.module_path)
    return dict(sorted(out.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def _dim(d: int | None) -> str:
    return "-" if d is None else str(d)
