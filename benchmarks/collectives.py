"""The distributed backend's collectives on gloo: torch.distributed's own ("native") against the
same collective run as messages between the ranks ("p2p", what ``--collectives auto`` picks on
gloo), and a plain exchange of the same bytes for scale.

    python benchmarks/collectives.py [--sizes 256B,16KiB,1MiB] [--repeats 60] [--busy-ms 1]

Two processes, one thread each (tensoropt.distributed.launch), through
:class:`tensoropt.distributed.transport.PeerLink` — the calls the executor makes: all-gather
(each rank's buffer of SIZE), reduce-scatter and all-reduce (a SIZE buffer; "in place": the
gradient buffers' two-round form).  Each call is timed
once right after a barrier ("idle") and once after ``--busy-ms`` of matrix products ("busy": how a
step calls them, after compute); median of ``--repeats`` (the first 10 dropped), rank 0's clock.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from tensoropt.cluster import fmt_size, parse_size
from tensoropt.distributed import launch
from tensoropt.distributed.transport import Channel, PeerLink


def _job(rt, sizes, repeats, busy_ms):
    import torch.distributed as dist

    torch.set_num_threads(1)
    a = torch.randn(128, 128)
    t = time.perf_counter()
    for _ in range(20):
        a @ a
    per_mm = (time.perf_counter() - t) / 20
    n_mm = max(1, round(busy_ms * 1e-3 / per_mm))
    chan = Channel(None, (0, 1), 1 << 21)
    other = 1 - rt.rank
    rows = []
    for nbytes in sizes:
        n = max(2, nbytes // 4)
        x = torch.randn(n)
        y = torch.randn(n)
        links = {how: PeerLink(rt, how) for how in ("native", "p2p")}

        def exchange(link):
            out = torch.empty(n)
            work = dist.isend(x, other, tag=7)
            dist.recv(out, other, tag=7)
            work.wait()

        calls = {
            "exchange": lambda link: exchange(link),
            "all-gather": lambda link: link.gather_pieces(x, 0, [n, n], chan, "x"),
            "reduce-scatter": lambda link: link.scatter_blocks(list(x.chunk(2)), 0, chan, "x"),
            "all-reduce": lambda link: link.all_reduce_out(x, chan, "x"),
            "all-reduce in place": lambda link: link.all_reduce(y, chan, "x"),
        }
        for name, call in calls.items():
            for how in (("p2p",) if name == "exchange" else ("native", "p2p")):
                for busy in (False, True):
                    times = []
                    for _ in range(repeats):
                        dist.barrier()
                        if busy:
                            for _ in range(n_mm):
                                a @ a
                        t0 = time.perf_counter()
                        call(links[how])
                        links[how].wait_sends()
                        times.append(time.perf_counter() - t0)
                    rows.append((nbytes, name, "—" if name == "exchange" else how, busy,
                                 statistics.median(times[10:])))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256B,16KiB,1MiB")
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--busy-ms", type=float, default=1.0)
    a = ap.parse_args()
    sizes = [int(parse_size(s, "--sizes")) for s in a.sizes.split(",")]
    rows = launch(_job, 2, {"sizes": sizes, "repeats": a.repeats, "busy_ms": a.busy_ms}, timeout_s=600)[0]
    got = {(r[0], r[1], r[2], r[3]): r[4] for r in rows}
    table = Table(title=f"gloo, 2 ranks, 1 thread each: median µs (busy = after {a.busy_ms:g} ms of compute)")
    for col in ("size", "call", "native idle", "p2p idle", "native busy", "p2p busy", "native / p2p (busy)"):
        table.add_column(col, justify="right")
    for nbytes in sizes:
        for call in ("exchange", "all-gather", "reduce-scatter", "all-reduce", "all-reduce in place"):
            how = ("—",) if call == "exchange" else ("native", "p2p")
            cell = {(h, b): got[(nbytes, call, h, b)] * 1e6 for h in how for b in (False, True)}
            if call == "exchange":
                table.add_row(fmt_size(nbytes), call, "", f"{cell['—', False]:.0f}", "", f"{cell['—', True]:.0f}", "")
            else:
                table.add_row(fmt_size(nbytes), call, f"{cell['native', False]:.0f}", f"{cell['p2p', False]:.0f}",
                              f"{cell['native', True]:.0f}", f"{cell['p2p', True]:.0f}",
                              f"{cell['native', True] / cell['p2p', True]:.1f}×")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
