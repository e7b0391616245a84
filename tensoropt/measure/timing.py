"""Timing one callable, and what the device can do at best (for roofline estimates).

CPU: ``time.perf_counter`` around each call.  CUDA: ``torch.cuda.Event`` pairs, synchronised
once per sample.  A sample repeats the call ``inner`` times when one call is shorter than
:data:`MIN_SAMPLE_S`, so Python's timer and dispatch jitter do not dominate tiny ops; the result
is the median over samples of the per-call time.

It owns the clock and the device's peak FLOP/s and memory bandwidth; it must not know about
graphs, shards or caches (the profiler does).

Example::

    >>> x = torch.randn(64, 64)
    >>> median, samples = time_callable(lambda: x @ x, device=torch.device("cpu"), repeats=5)
    >>> len(samples), median > 0
    (5, True)
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .kept import cpu_name

MIN_SAMPLE_S = 2e-4      # shorter calls are repeated inside one sample
MAX_INNER = 200
BUDGET_S = 1.5           # long calls take fewer repeats (never fewer than MIN_REPEATS)
MIN_REPEATS = 3


def time_callable(fn: Callable[[], Any], *, device: torch.device, repeats: int = 5, warmup: int = 1,
                  budget_s: float = BUDGET_S) -> tuple[float, list[float]]:
    """Median seconds per call of ``fn`` and the samples.

    ``warmup`` untimed calls first (at least one, which also sizes the inner loop); then up to
    ``repeats`` samples, fewer when ``repeats`` samples would exceed ``budget_s`` (but at least
    :data:`MIN_REPEATS`).  O(repeats × inner) calls.
    """
    cuda = device.type == "cuda"
    t_first = _one(fn, cuda, 1)
    for _ in range(max(0, warmup - 1)):
        _one(fn, cuda, 1)
    inner = 1 if t_first >= MIN_SAMPLE_S else min(MAX_INNER, math.ceil(MIN_SAMPLE_S / max(t_first, 1e-7)))
    n = repeats
    if t_first * repeats > budget_s:
        n = max(min(repeats, MIN_REPEATS), int(budget_s / max(t_first, 1e-9)))
    samples = [_one(fn, cuda, inner) for _ in range(max(1, n))]
    return statistics.median(samples), samples


def _one(fn: Callable[[], Any], cuda: bool, inner: int) -> float:
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / inner
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def device_info(device: torch.device, *, measure: bool = True) -> dict[str, Any]:
    """Where costs are measured: type, name, threads, torch version, and (``measure=True``) the
    achieved peak FLOP/s (median of float32 matmuls; per dtype in ``peak_flops_by_dtype``) and
    memory bandwidth (median of large copies) that roofline estimates and device-model
    calibrations divide by."""
    info: dict[str, Any] = {"type": device.type, "name": device_name(device),
                            "threads": torch.get_num_threads(), "torch": torch.__version__.split("+")[0]}
    if device.type == "cuda":
        info["index"] = device.index if device.index is not None else torch.cuda.current_device()
        info["memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
    if measure:
        info["peak_flops_by_dtype"] = _matmul_peaks(device)
        info["peak_flops"] = info["peak_flops_by_dtype"]["fp32"]
        src = torch.empty(16 * 2 ** 20, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        t, _ = time_callable(lambda: dst.copy_(src), device=device, repeats=5, warmup=2)
        info["memory_Bps"] = 2 * src.nbytes / t     # read + write
    return info


def _matmul_peaks(device: torch.device) -> dict[str, float]:
    """Achieved matmul FLOP/s per dtype (median of square products): ``fp32`` everywhere; on a
    GPU also ``tf32`` (float32 with TF32 allowed) and ``bf16`` — the rates a device model's
    fractions are of."""
    n = 4096 if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    out: dict[str, float] = {}
    t, _ = time_callable(lambda: a @ b, device=device, repeats=5, warmup=2)
    out["fp32"] = 2 * n ** 3 / t
    if device.type == "cuda":
        before = torch.backends.cuda.matmul.allow_tf32
        try:
            torch.backends.cuda.matmul.allow_tf32 = True
            t, _ = time_callable(lambda: a @ b, device=device, repeats=5, warmup=2)
            out["tf32"] = 2 * n ** 3 / t
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        t, _ = time_callable(lambda: a16 @ b16, device=device, repeats=5, warmup=2)
        out["bf16"] = 2 * n ** 3 / t
    return out


def device_key(info: dict[str, Any]) -> str:
    """What must match for a cached measurement to be reused: device type and name, threads, torch."""
    return f"{info['type']}|{info['name']}|threads={info['threads']}|torch={info['torch']}"

