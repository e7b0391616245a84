"""The distributed backend's collectives on gloo: torch.distributed's own ("native") against the
same collective run as messages between the ranks ("p2p", what ``--collectives auto`` picks on
gloo), and a plain exchange of the same bytes for scale.

    python benchmarks/collectives.py [--sizes 256B,16KiB,1MiB] [--repeats 60] [--busy-ms 1]

Two processes, one thread each (tensoropt.distributed.launch), through
:class:`tensoropt.distributed.transport.PeerLink` — the calls the executor makes: all-gather
(each rank's buffer of SIZE), reduce-scatter and all-reduce (a SIZE buffer; "in place": the
gradient buffers' two-round form).  Each call is timed
once right after a barrier ("idle") and once after ``--busy-ms`` of matrix products ("busy"):
median of ``--repeats`` (the first 10 dropped), rank 0's clock.  "chain" is what a step pays:
``--repeats`` calls in a row, each after ``--busy-ms`` of compute, no barrier between them; per call,
(the chain's time − the same compute's alone) / calls — the mean, so rank skew and a
communication thread that competes with compute for the cores count (on gloo, a point-to-point
message waiting for its receiver keeps gloo's ``gloo_tcp_loop`` thread busy: "loop CPU" is that
thread's CPU time per call, from ``/proc/self/task/*/schedstat``).

It times the transport's calls as the executor makes them: it must not change how they run, and it
writes nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from rich.console import Console
from rich.table import Table

from tensoropt.cluster import fmt_size, parse_size
from tensoropt.distributed import launch
from tensoropt.distributed.transport import Channel, PeerLink


def _comm_cpu_s() -> float:
    """CPU seconds of this process's threads other than the main one (gloo's loops)."""
    me, total = str(os.getpid()), 0
    for tid in os.listdir("/proc/self/task"):
        if tid != me:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    return total * 1e-9


def _calls(x: torch.Tensor, y: torch.Tensor, n: int, chan: Channel, other: int) -> dict[str, Callable]:
    """The calls timed on ``x`` / ``y`` (``n`` floats each), each taking the link to run on."""

    def exchange(link):
        out = torch.empty(n)
        work = dist.isend(x, other, tag=7)
        dist.recv(out, other, tag=7)
        work.wait()

    return {
        "exchange": exchange,
        "all-gather": lambda link: link.gather_pieces(x, 0, [n, n], chan, "x"),
        "reduce-scatter": lambda link: link.scatter_blocks(list(x.chunk(2)), 0, chan, "x"),
        "all-reduce": lambda link: link.all_reduce_out(x, chan, "x"),
        "all-reduce in place": lambda link: link.all_reduce(y, chan, "x"),
    }


def _job(rt, sizes, repeats, busy_ms):
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
        for name, call in _calls(x, y, n, chan, other).items():
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
                rows.append((nbytes, name, "—" if name == "exchange" else how, "chain",
                             _chain(functools.partial(call, links[how]), links[how], a, n_mm, repeats)))
    return rows


def _chain(call, link, a, n_mm, repeats):
    """(added seconds per call, loop-thread CPU seconds per call) of ``repeats`` calls in a row,
    each after ``n_mm`` products of ``a``."""
    def run(with_call):
        link.barrier()
        c0, t0 = _comm_cpu_s(), time.perf_counter()
        for _ in range(repeats):
            for _ in range(n_mm):
                a @ a
            if with_call:
                call()
        link.wait_sends()
        link.barrier()
        return time.perf_counter() - t0, _comm_cpu_s() - c0
    run(True)   # warm-up
    compute, _ = run(False)
    both, cpu = run(True)
    return (both - compute) / repeats, cpu / repeats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256B,16KiB,1MiB")
    ap.add_argument("--repeats", type=int, default=60)
    ap.add_argument("--busy-ms", type=float, default=1.0)
    a = ap.parse_args()
    sizes = [int(parse_size(s, "--sizes")) for s in a.sizes.split(",")]
    rows = launch(_job, 2, {"sizes": sizes, "repeats": a.repeats, "busy_ms": a.busy_ms}, timeout_s=600)[0]
    got = {(r[0], r[1], r[2], r[3]): r[4] for r in rows}
    table = Table(title=f"gloo, 2 ranks, 1 thread each: µs per call (idle / busy: median, after a barrier and "
                        f"after {a.busy_ms:g} ms of compute; chain: added per call in a row, loop CPU per call)")
    for col in ("size", "call", "how", "idle", "busy", "chain", "loop CPU"):
        table.add_column(col, justify="right")
    for nbytes in sizes:
        for call in ("exchange", "all-gather", "reduce-scatter", "all-reduce", "all-reduce in place"):
            for how in (("—",) if call == "exchange" else ("native", "p2p")):
                chain, cpu = got[(nbytes, call, how, "chain")]
                table.add_row(fmt_size(nbytes), call, how, f"{got[(nbytes, call, how, False)] * 1e6:.0f}",
                              f"{got[(nbytes, call, how, True)] * 1e6:.0f}", f"{chain * 1e6:.0f}", f"{cpu * 1e6:.0f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
