"""Fitting a calibration to measured profiles.

Every call a profile timed (whole or a shard, forward and backward apart) is one sample: its
class ``c``, its work (FLOPs ``F``, bytes ``B``) and its measured seconds ``t``.  Per class, the
device model's formula (:mod:`.calibration`) is linear in its unknowns
``x = (floor_fp, floor_bp, 1/e, 1/b)``::

    t ≈ [fwd] · floor_fp + [bwd] · floor_bp + F / P · (1/e) + B / BW · (1/b)

so the fit is a non-negative least squares (``scipy.optimize.nnls``) over the samples, each row
divided by ``t^w`` (``w = 1``: relative error, every call alike; ``w = 0.5``, the default:
between that and absolute error, which the long calls a step's time is made of would dominate).
A class with fewer than ``min_samples`` samples takes the fit over all samples (``"all"``).

Then the check: per profile, the predicted and the measured whole-step time (the sum over its
nodes, forward and backward) and the per-call error distribution — the figures a calibration
carries as ``error`` and every output quotes.

It owns the fit; it must not measure (:mod:`.calibrate`) nor choose what to fit on.

Example::

    >>> from tensoropt import load_model, profile
    >>> costs_a = profile(load_model("zoo:rnnlm?tiny=1").capture(), shard_degrees=(1, 2), repeats=1)
    >>> costs_b = profile(load_model("zoo:transformer?tiny=1").capture(), shard_degrees=(1, 2), repeats=1)
    >>> cal = fit_calibration([costs_a, costs_b], name="my-box")
    >>> cal.name, sorted(cal.error["step_pct"])      # the predicted step against the measured one, per profile
    ('my-box', ['rnnlm-tiny', 'transformer-tiny'])
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import TensorOptError
from ..measure.costmodel import CostModel, Work
from .calibration import Calibration, ClassFit, DeviceModel
from .kinds import find_kind
from .opclass import op_class

#: methods whose times were measured (alone or in sequence) on the profile's device
TIMED = frozenset({"measured", "cached", "sequence", "adjusted"})


@dataclass(frozen=True)
class Sample:
    """One timed call: the op, its class, its work, forward or backward, its seconds, precision."""

    op: str
    cls: str
    flops: int
    nbytes: int
    backward: bool
    seconds: float
    precision: str


def samples(costs: CostModel) -> Iterator[Sample]:
    """Every timed call of a profile (module docstring), whole and shards, forward and backward."""
    precision = str(costs.settings.get("precision", "fp32"))
    for node in costs.nodes.values():
        pieces = [(node.method, node.fp_s, node.bp_s, node.work)]
        pieces += [(s.method, s.fp_s, s.bp_s, s.work) for s in node.shards.values()]
        for method, fp, bp, work in pieces:
            if method not in TIMED or work is None:
                continue
            cls = op_class(node.op)
            if fp > 0:
                yield Sample(node.op, cls, work.fp_flops, work.fp_bytes, False, fp, precision)
            if bp > 0:
                yield Sample(node.op, cls, work.bp_flops, work.bp_bytes, True, bp, precision)


def _solve(rows: list[Sample], model: DeviceModel, weight: float) -> ClassFit:
    a = np.zeros((len(rows), 4))
    y = np.zeros(len(rows))
    for i, s in enumerate(rows):
        scale = s.seconds ** weight
        peak = model.peak(model.dtype(s.cls, s.precision))
        a[i] = [0.0 if s.backward else 1.0, 1.0 if s.backward else 0.0, s.flops / peak, s.nbytes / model.memory_Bps]
        a[i] /= scale
        y[i] = s.seconds / scale
    from scipy.optimize import nnls  # here: scipy's import is 0.26 s of every job's start, and only a fit needs it

    x, _ = nnls(a, y)
    return ClassFit(1.0 / x[2] if x[2] > 0 else None, 1.0 / x[3] if x[3] > 0 else None,
                    float(x[0]), float(x[1]), len(rows))


def fit_calibration(profiles: Sequence[CostModel], *, name: str, device: str = "", gpu: bool | None = None,
                    peak_flops: dict[str, float] | None = None, memory_Bps: float | None = None,
                    source: str = "", weight: float = 0.5, min_samples: int = 12) -> Calibration:
    """A calibration fitted on the timed calls of ``profiles`` (module docstring), with its
    error on them.

    The peaks the fractions are of: ``peak_flops`` / ``memory_Bps``, else the datasheet peaks of
    the first profile's device where the catalogue knows it (those a device model prices with),
    else its measured ones (``device["peak_flops_by_dtype"]``, else ``device["peak_flops"]``: its
    float32 matmul rate; ``device["memory_Bps"]``: its copy bandwidth).  ``device`` and ``gpu``
    default to the first profile's.  Raises when the profiles hold no timed call with work (made
    before work was recorded, or untimed).
    O(samples) per class for the fit (NNLS on four unknowns).
    """
    if not profiles:
        raise TensorOptError("fit_calibration needs at least one measured profile")
    first = profiles[0].device
    kind = find_kind(str(first.get("name", "")))
    if kind is not None:   # fractions of the datasheet peaks the device model prices with
        peaks, bw = dict(peak_flops or kind.peak_flops), float(memory_Bps or kind.memory_Bps)
    else:
        measured_peaks = first.get("peak_flops_by_dtype") or {"fp32": first.get("peak_flops") or 0.0}
        peaks = dict(peak_flops or {str(k): float(v) for k, v in measured_peaks.items()})
        bw = float(memory_Bps or first.get("memory_Bps") or 0.0)
    if not peaks.get("fp32", 0) > 0 or bw <= 0:
        raise TensorOptError("the profile records no measured peak FLOP/s or memory bandwidth (made with "
                             "timing off?); pass peak_flops= and memory_Bps=")
    is_gpu = first.get("type") == "cuda" if gpu is None else gpu
    reference = DeviceModel(device or str(first.get("name", name)), peaks, bw,
                            Calibration(name, "", is_gpu, peaks, bw, {"all": ClassFit(1, 1, 0, 0)}), None, is_gpu)
    all_samples = [s for c in profiles for s in samples(c)]
    if not all_samples:
        raise TensorOptError("none of the profiles holds a timed call with its work recorded: profile with timing "
                             "on, with this version (tensoropt profile MODEL -o profile.json)")
    classes = {"all": _solve(all_samples, reference, weight)}
    for cls in sorted({s.cls for s in all_samples}):
        rows = [s for s in all_samples if s.cls == cls]
        if len(rows) >= min_samples:
            classes[cls] = _solve(rows, reference, weight)
    cal = Calibration(name, reference.name, is_gpu, peaks, bw, classes, source=source)
    return Calibration(cal.name, cal.device, cal.gpu, cal.peak_flops, cal.memory_Bps, cal.classes,
                       check(cal, profiles), source)


def check(cal: Calibration, profiles: Sequence[CostModel]) -> dict[str, object]:
    """How ``cal`` predicts ``profiles`` (each at its own device's peaks, the calibration's):
    per-call absolute relative errors (``ops``, ``median_abs_pct``, ``p90_abs_pct``) and per
    profile the whole step's signed error (``step_pct``: graph name → %)."""
    model = DeviceModel(cal.device or cal.name, cal.peak_flops, cal.memory_Bps, cal, None, cal.gpu)
    errors = []
    for c in profiles:
        for s in samples(c):
            w = Work(s.flops, s.flops, s.nbytes, s.nbytes)
            fp, bp = model.seconds(s.op, w, s.precision)
            errors.append(abs((bp if s.backward else fp) - s.seconds) / s.seconds)
    steps = {}
    for c in profiles:
        predicted, measured = step_seconds(c, model), c.total_fp_s + c.total_bp_s
        steps[c.graph_name or "profile"] = round(100 * (predicted - measured) / measured, 2) if measured else 0.0
    errors.sort()
    p90 = errors[min(len(errors) - 1, int(0.9 * len(errors)))] if errors else 0.0
    return {"ops": len(errors), "median_abs_pct": round(100 * statistics.median(errors), 2) if errors else 0.0,
            "p90_abs_pct": round(100 * p90, 2), "step_pct": steps}


def step_seconds(costs: CostModel, model: DeviceModel) -> float:
    """The sum over ``costs``' nodes of ``model``'s forward and backward seconds at full shape
    (a one-device step's compute), for nodes with work; the others as measured."""
    precision = str(costs.settings.get("precision", "fp32"))
    total = 0.0
    for n in costs.nodes.values():
        if n.work is None or n.method == "free":
            total += n.fp_s + n.bp_s
            continue
        fp, bp = model.seconds(n.op, n.work, precision, backward=n.bp_s > 0 or not costs.settings.get("timed", True))
        total += fp + bp
    return total


__all__ = ["TIMED", "Sample", "check", "fit_calibration", "samples", "step_seconds"]
