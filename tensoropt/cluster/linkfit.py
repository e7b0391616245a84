"""Link fitting: ``time = latency + bytes / bandwidth`` through measured transfer times, and the
statistics of a fit.

What it owns: the least-squares line per link (:func:`fit_link`), the duplex factor from
simultaneous-exchange times (:func:`fit_duplex`), the per-pair medians and fits of a whole sweep
(:func:`fit_pairs`), and :class:`BenchError`.  What it must not do: start processes, touch a GPU
or time anything; the runner (:mod:`tensoropt.cluster.bench`) measures and calls into this
module, never the other way round.

The math.  With sizes ``x_i`` and times ``t_i``, the fit minimises
``Σ w_i² (latency + x_i · s − t_i)²`` over ``latency ≥ 0`` and the slope ``s`` (seconds per byte,
``bandwidth = 1 / s``), with ``w_i = 1 / t_i`` by default (relative residuals: a sweep spans four
orders of magnitude of size).  ``r2`` is the coefficient of determination in that weighted
metric.  The duplex of a link is the ratio of the one-way model's byte time to the measured
exchange's, pooled over sizes: ``Σ x / bandwidth ÷ Σ (t_exchange − latency)``, clamped to
``[MIN_DUPLEX, 1]``.  This is the link model the NetSplit thesis and FastT fit from
point-to-point benchmarks.

Example::

    >>> f = fit_link([1e6, 4e6], [1.1e-4, 3.4e-4])
    >>> round(f.latency_s * 1e6), round(f.bandwidth_Bps / 1e9, 1)
    (33, 13.0)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ClusterSpecError
from .spec import LinkModel

Pair = tuple[str, str]
#: ``(rank or GPU index a, b, size in bytes) → [seconds, …]``: what the runner measured
RawTimes = Mapping[tuple[int, int, int], Sequence[float]]


class BenchError(ClusterSpecError):
    """A link benchmark could not produce a cluster spec (a worker failed or hung, a fit is
    degenerate, an option is out of range); the message says which pair / rank and what to change."""


@dataclass(frozen=True)
class LinkFit:
    """A fitted link: ``time(bytes) = latency_s + bytes / bandwidth_Bps``.

    ``r2`` is the coefficient of determination of the fit in the metric it minimised (relative
    residuals by default, see :func:`fit_link`); ``n`` the number of (size, time) points.
    ``duplex`` is the fraction of the bandwidth each direction keeps when both carry traffic at
    once (:func:`fit_duplex`; 1.0 when not measured).
    """

    latency_s: float
    bandwidth_Bps: float
    r2: float
    n: int
    duplex: float = 1.0

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps

    def time_both_ways(self, nbytes: float) -> float:
        """The modelled time of a simultaneous exchange of ``nbytes`` each way."""
        return self.latency_s + nbytes / (self.bandwidth_Bps * self.duplex)

    @property
    def link(self) -> LinkModel:
        """The :class:`tensoropt.cluster.LinkModel` of this fit."""
        return LinkModel(latency_s=self.latency_s, bandwidth_Bps=self.bandwidth_Bps, duplex=self.duplex)


def _pair_label(pair: object) -> str:
    if pair is None:
        return "the link"
    if isinstance(pair, tuple) and len(pair) == 2:
        return f"link {pair[0]} → {pair[1]}"
    return f"link {pair}"


def fit_link(sizes_bytes: Sequence[float], times_s: Sequence[float], *, pair: object = None,
             weighting: str = "relative") -> LinkFit:
    """Least-squares line ``time = latency + bytes / bandwidth`` through measured points.

    ``weighting="relative"`` (default) minimises the relative residuals ``(fit − t) / t``: a
    sweep spans four orders of magnitude of size, and plain least squares would let the noise of
    the largest transfer (a few % of tens of ms) decide the latency (under a ms).
    ``weighting="none"`` is the plain fit.  Both recover an exact line exactly.  A negative
    intercept is not a latency: the fit is then constrained to latency 0 (the constrained
    least-squares optimum lies on that boundary).  ``pair`` (e.g. ``("cpu0", "cpu1")``) only
    names the link in error messages.

    Raises :class:`BenchError` when there are fewer than two distinct sizes, a time is not
    positive and finite, or the slope is not positive (bandwidth undefined).
    """
    what = _pair_label(pair)
    x = np.asarray(sizes_bytes, dtype=np.float64).ravel()
    y = np.asarray(times_s, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise BenchError(f"{what}: {x.size} sizes but {y.size} times")
    if not (np.all(np.isfinite(x)) and np.all(x >= 0)):
        raise BenchError(f"{what}: sizes must be finite and ≥ 0 bytes")
    if not (np.all(np.isfinite(y)) and np.all(y > 0)):
        raise BenchError(f"{what}: times must be finite and > 0 s, got {y.tolist()}")
    if np.unique(x).size < 2:
        raise BenchError(f"{what}: a line needs at least two distinct sizes, got {np.unique(x).tolist()}")
    if weighting == "relative":
        w = 1.0 / y
    elif weighting == "none":
        w = np.ones_like(y)
    else:
        raise ValueError(f"weighting must be 'relative' or 'none', not {weighting!r}")

    scale = float(x.max())                       # fit in units of the largest size: well conditioned
    xs = x / scale
    a = np.stack([np.ones_like(xs), xs], axis=1) * w[:, None]
    (latency, slope), *_ = np.linalg.lstsq(a, y * w, rcond=None)
    if latency < 0:                              # constrained optimum: the line through the origin
        latency = 0.0
        slope = float(np.sum(w * w * xs * y) / np.sum(w * w * xs * xs))
    # flat within rounding (the size explains < 1e-6 of the largest time) is no bandwidth either
    flat = not (math.isfinite(slope) and slope > 1e-6 * float(y.max()))   # slope: s per largest size, here
    slope = float(slope) / scale                 # seconds per byte
    if flat:
        raise BenchError(
            f"{what}: the measured times do not grow with the size (fitted slope {slope:.3g} s/B), so "
            f"the bandwidth is undefined; sizes {fmt_bytes(x.min())} … {fmt_bytes(x.max())} were too small "
            "or the measurements too noisy — use larger sizes (e.g. --max-size 256MiB) and more --repeats")
    fit = latency + slope * x
    wm = np.sum(w * w * y) / np.sum(w * w)       # weighted mean of the data
    ss_res = float(np.sum((w * (y - fit)) ** 2))
    ss_tot = float(np.sum((w * (y - wm)) ** 2))
    r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return LinkFit(latency_s=float(latency), bandwidth_Bps=1.0 / slope, r2=float(r2), n=int(x.size))


#: smallest duplex fit_duplex reports: below it, the "link" is not carrying data both ways at all
MIN_DUPLEX = 0.01


def fit_duplex(latency_s: float, bandwidth_Bps: float, sizes_bytes: Sequence[float],
               exchange_times_s: Sequence[float]) -> float:
    """The ``duplex`` of a link from simultaneous-exchange times (both ends send ``size`` bytes to
    each other at once, timed until both have received).

    Estimator: the bytes-dominated part of the time (the time minus the link's latency) of the
    one-way model over that of the exchange, pooled over the sizes as a ratio of sums::

        duplex = Σ size / bandwidth  ÷  Σ (exchange time − latency)

    i.e. the factor for which the model ``latency + size / (bandwidth · duplex)``
    (:meth:`tensoropt.cluster.LinkModel.time_both_ways`) matches the summed measured exchange
    times; the largest transfer, which has the least noise for its length, weighs most.  Use it
    at sizes where the bytes dominate the latency (the top of a sweep).  The result is clamped to
    ``[MIN_DUPLEX, 1]``: an exchange as fast as one way, or faster (noise), is full duplex (1.0).
    """
    x = np.asarray(sizes_bytes, dtype=np.float64).ravel()
    y = np.asarray(exchange_times_s, dtype=np.float64).ravel()
    if x.shape != y.shape or x.size == 0:
        raise BenchError(f"duplex: needs as many exchange times as sizes (≥ 1), got {x.size} sizes, {y.size} times")
    if not (np.all(np.isfinite(y)) and np.all(y > 0)):
        raise BenchError(f"duplex: exchange times must be finite and > 0 s, got {y.tolist()}")
    one_way = float(np.sum(x)) / bandwidth_Bps
    both = float(np.sum(y - latency_s))
    if both <= one_way:
        return 1.0
    return max(MIN_DUPLEX, one_way / both)


@dataclass(frozen=True)
class PairFits:
    """The per-pair statistics of a sweep (see :class:`tensoropt.cluster.bench.BenchResult`)."""

    samples: dict[Pair, dict[int, float]]
    raw: dict[Pair, dict[int, tuple[float, ...]]]
    fits: dict[Pair, LinkFit]
    exchange: dict[Pair, dict[int, float]]
    exchange_raw: dict[Pair, dict[int, tuple[float, ...]]]


def fit_pairs(one_way: RawTimes, exchanges: RawTimes, names: Mapping[int, str]) -> PairFits:
    """Medians per (pair, size), a :func:`fit_link` per ordered pair, and its duplex from the
    exchanges (:func:`fit_duplex`) where some were timed.

    ``one_way[(a, b, size)]``: one-way times from ``a`` to ``b``; ``exchanges[(a, b, size)]``: the
    times of a simultaneous exchange between ``a`` and ``b`` (one exchange serves both directions);
    ``names``: the device name of each index.
    """
    samples: dict[Pair, dict[int, float]] = {}
    raw: dict[Pair, dict[int, tuple[float, ...]]] = {}
    fits: dict[Pair, LinkFit] = {}
    for (a, b, size), ts in sorted(one_way.items()):
        pair = (names[a], names[b])
        raw.setdefault(pair, {})[size] = tuple(ts)
        samples.setdefault(pair, {})[size] = statistics.median(ts)
    for pair, by_size in samples.items():
        fits[pair] = fit_link(list(by_size), list(by_size.values()), pair=pair)
    exchange: dict[Pair, dict[int, float]] = {}
    exchange_raw: dict[Pair, dict[int, tuple[float, ...]]] = {}
    for (a, b, size), ts in sorted(exchanges.items()):
        for pair in ((names[a], names[b]), (names[b], names[a])):      # one exchange serves both directions
            exchange_raw.setdefault(pair, {})[size] = tuple(ts)
            exchange.setdefault(pair, {})[size] = statistics.median(ts)
    for pair, by_size in exchange.items():
        f = fits[pair]
        fits[pair] = dataclasses.replace(f, duplex=fit_duplex(f.latency_s, f.bandwidth_Bps, list(by_size),
                                                               list(by_size.values())))
    return PairFits(samples=samples, raw=raw, fits=fits, exchange=exchange, exchange_raw=exchange_raw)


def fmt_bytes(n: float) -> str:
    """``4 KiB``, ``1.5 MiB``: a size for messages (binary units, at most one decimal)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or float(n).is_integer() else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
