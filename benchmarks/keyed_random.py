"""What keyed random draws cost against torch's own: dropout and attention dropout, whole and
as one of two pieces along the batch (tensoropt.execute.randomness).

    python benchmarks/keyed_random.py [--repeats 20] [--device cpu] [--threads 1]

Prints a markdown table of median times (ms) and their ratios, all measured in one run.  One
intra-op thread by default: on a shared 2-core machine a multi-threaded element-wise op waits
for descheduled threads (8 ms steps), which measures the load, not the op.

It times draws and prints: it must not change the keyed-random mode of anything it does not
create itself.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from tensoropt.execute.randomness import Draw, keyed_op

aten = torch.ops.aten


def median_ms(fn, repeats: int, device: str) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = args.device
    x = torch.randn(8, 128, 768, device=dev)
    q = torch.randn(8, 12, 128, 64, device=dev)
    half = x[:4]
    rows = [
        ("dropout p=0.1, 8×128×768", lambda: F.dropout(x, 0.1, True),
         lambda: keyed_op(aten.dropout.default, Draw(1, 0, x.shape), x, 0.1, True),
         lambda: keyed_op(aten.dropout.default, Draw(1, 0, x.shape, 0, 2, 0), half, 0.1, True)),
        ("attention, dropout 0.1, 8×12×128×64", lambda: F.scaled_dot_product_attention(q, q, q, dropout_p=0.1),
         lambda: keyed_op(aten.scaled_dot_product_attention.default, Draw(1, 0, (8, 12, 128, 128)), q, q, q, None, 0.1),
         lambda: keyed_op(aten.scaled_dot_product_attention.default, Draw(1, 0, (8, 12, 128, 128), 0, 2, 0),
                          q[:4], q[:4], q[:4], None, 0.1)),
    ]
    print(f"device {dev}, torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}")
    print("| op | torch (ms) | keyed, whole (ms) | keyed ÷ torch | keyed, ½ batch (ms) | ½ ÷ whole |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, ref, whole, piece in rows:
        t, w, p = (median_ms(f, args.repeats, dev) for f in (ref, whole, piece))
        print(f"| {name} | {t:.2f} | {w:.2f} | {w / t:.2f} | {p:.2f} | {p / w:.2f} |", flush=True)


if __name__ == "__main__":
    main()
