"""Calibrations and device models: what a device achieves of its peaks, per operator class.

A device model prices one call's :class:`~tensoropt.measure.costmodel.Work` on a device kind
(forward; backward alike with its own work and floor)::

    t_fp = floor_fp[c] + F_fp / (P[dtype(c)] · e[c]) + B_fp / (BW · b[c])

with ``c`` the operator's class (:mod:`.opclass`), ``F`` its FLOPs, ``B`` the bytes it moves,
``P`` the kind's peak FLOP/s in the dtype the class runs in (:meth:`DeviceModel.dtype`), ``BW``
its memory bandwidth, and per class the achieved fractions ``e`` (of peak FLOP/s) and ``b`` (of
bandwidth) and the per-call floors (launch, host work).  Terms add rather than take the larger:
the form a least-squares fit can solve (:mod:`.fit`), and one that a call near the ridge point —
neither compute- nor memory-bound — needs anyway.

A :class:`Calibration` holds ``e``, ``b`` and the floors per class, the peaks they are fractions
of, where they came from and how well they predicted what they were fitted on.  The package
ships calibrations measured on real devices (``calibrations/*.json``); a GPU kind without one is
priced with :data:`UNCALIBRATED_GPU` — 70 % of peak FLOP/s and a 7 µs floor per call (the
figures Meta's autoparallel prices compute with), 80 % of peak bandwidth — and says so.

A :class:`DeviceModel` is a kind's peaks with a calibration's fractions: the thing that prices.

It owns the formula and the calibration file format; it must not measure (:mod:`.calibrate`
does) nor fit (:mod:`.fit`).

Example::

    >>> model = device_model("Tesla V100-SXM2-16GB")     # no calibration shipped for it
    >>> model.describe()
    'Tesla V100-SXM2-16GB device model (calibration uncalibrated-gpu, ...)'
    >>> fp, bp = model.seconds("aten.mm.default", Work(2 * 4096**3, 0, 3 * 4096**2 * 4, 0), "fp32")
    >>> round(fp * 1e3, 2), bp      # ms: 137 GFLOP at 70 % of 15.7 TFLOP/s, 201 MB at 80 % of 900 GB/s, 7 µs
    (12.79, 0.0)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .._io import read_json, write_json_atomic
from ..errors import TensorOptError
from ..graph import COMPUTE_DTYPES
from ..measure.costmodel import Work
from .kinds import DeviceKind, find_kind, load_kinds, same_kind
from .opclass import COMPUTE_CLASSES, OP_CLASSES, op_class

CALIBRATION_FORMAT = "tensoropt.calibration/1"
CALIBRATIONS = Path(__file__).with_name("calibrations")


@dataclass(frozen=True)
class ClassFit:
    """One operator class on one device: achieved fractions of the peaks (``None``: that term
    explained nothing in the fit and is left out) and the per-call floors, in seconds."""

    flops_fraction: float | None
    bytes_fraction: float | None
    fp_floor_s: float
    bp_floor_s: float
    samples: int = 0

    def seconds(self, flops: int, nbytes: int, peak: float, bandwidth: float, backward: bool) -> float:
        t = self.bp_floor_s if backward else self.fp_floor_s
        if self.flops_fraction and flops:
            t += flops / (peak * self.flops_fraction)
        if self.bytes_fraction and nbytes:
            t += nbytes / (bandwidth * self.bytes_fraction)
        return t


@dataclass(frozen=True)
class Calibration:
    """Per-class fits of one device (module docstring).

    ``name``: what to call it; ``device``: the device measured (``""`` for a default from the
    literature); ``gpu``: whether it was a GPU (a CPU's fractions never price a GPU);
    ``peak_flops`` (dtype → FLOP/s) and ``memory_Bps``: the peaks the fractions are of;
    ``classes``: class → :class:`ClassFit` (a class missing falls back to ``"all"``);
    ``error``: how well it predicted what it was fitted on (``ops``, ``median_abs_pct``,
    ``p90_abs_pct``, per model ``step_pct``), empty when never checked; ``source``: how it was made.
    """

    name: str
    device: str
    gpu: bool
    peak_flops: Mapping[str, float]
    memory_Bps: float
    classes: Mapping[str, ClassFit]
    error: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""

    def fit_for(self, cls: str) -> ClassFit:
        return self.classes.get(cls) or self.classes["all"]

    def error_text(self, device: str | None = None) -> str:
        """``step time within ±N % on M models …`` (the largest step error seen; held out where
        the fit was cross-checked, :mod:`.calibrate`), or ``error unknown``.  A calibration only
        checked (not fitted) on one kind of device (``checked_kind``) that prices ``device``, another
        kind, says it was not checked there: its error on the checked kind is no error bar on this one.

        >>> UNCALIBRATED_GPU.error_text("H100")
        'checked: step time -36.9 … +2.5 % on 3 measured H100 steps'
        >>> UNCALIBRATED_GPU.error_text("V100")
        'not checked on a Tesla V100-SXM2-16GB: checked only on 3 measured H100 steps (step time -36.9 … +2.5 %)'
        """
        held = self.error.get("holdout_step_pct") or {}
        steps = held or self.error.get("step_pct") or {}
        checked = self.error.get("checked_step_pct") or {}
        if not steps and checked:
            lo, hi = min(checked.values()), max(checked.values())
            on = f"{len(checked)} measured {self.error.get('checked_on', 'step(s)')}"
            kind = self.error.get("checked_kind")
            if device and kind and not same_kind(device, kind):
                known = find_kind(device)
                return (f"not checked on a {known.name if known else device}: checked only on {on} "
                        f"(step time {lo:+.1f} … {hi:+.1f} %)")
            return f"checked: step time {lo:+.1f} … {hi:+.1f} % on {on}"
        if not steps:
            return "error unknown: never checked against a measurement"
        worst = max(abs(v) for v in steps.values())
        how = "each held out of its fit" if held else "in sample"
        return f"step time within ±{worst:.0f} % on {len(steps)} model(s), {how}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["classes"] = {k: asdict(v) for k, v in self.classes.items()}
        return {"format": CALIBRATION_FORMAT, **d}

    @classmethod
    def from_dict(cls, d: Any, where: str = "calibration") -> Calibration:
        if not isinstance(d, Mapping) or d.get("format") != CALIBRATION_FORMAT:
            raise TensorOptError(f"{where}: not a calibration file (its format field must be {CALIBRATION_FORMAT!r}); "
                                 "make one with: tensoropt calibrate -o calibration.json")
        try:
            classes = {str(k): _class_fit(v, f"{where}.classes.{k}") for k, v in d["classes"].items()}
            peaks = {str(k): float(v) for k, v in d["peak_flops"].items()}
            if not isinstance(d["gpu"], bool):
                raise TensorOptError(f"{where}.gpu must be true or false, got {d['gpu']!r}")
            cal = cls(name=str(d["name"]), device=str(d.get("device", "")), gpu=d["gpu"], peak_flops=peaks,
                      memory_Bps=float(d["memory_Bps"]), classes=classes, error=dict(d.get("error") or {}),
                      source=str(d.get("source", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise TensorOptError(f"{where}: a field is missing or malformed ({e}); calibration files need name, gpu, "
                                 "peak_flops, memory_Bps and classes (tensoropt calibrate writes them)") from None
        if "all" not in cal.classes:
            raise TensorOptError(f"{where}.classes must hold an 'all' entry (the fallback for classes not fitted)")
        if cal.memory_Bps <= 0 or not cal.peak_flops.get("fp32", 0) > 0:
            raise TensorOptError(f"{where}: memory_Bps and peak_flops.fp32 must be positive")
        return cal

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        return cls.from_dict(read_json(path, "calibration"), str(path))


def _class_fit(v: Any, where: str) -> ClassFit:
    """One class's fit read from a calibration file, each figure checked (a fraction is absent
    or a positive number, a floor a non-negative one)."""
    if not isinstance(v, Mapping):
        raise TensorOptError(f"{where} must be an object with flops_fraction, bytes_fraction, fp_floor_s, bp_floor_s")
    for key in ("flops_fraction", "bytes_fraction"):
        x = v.get(key)
        if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x < float("inf")):
            raise TensorOptError(f"{where}.{key} must be a positive number or null, got {x!r}")
    for key in ("fp_floor_s", "bp_floor_s"):
        x = v.get(key)
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < float("inf"):
            raise TensorOptError(f"{where}.{key} must be a non-negative number of seconds, got {x!r}")
    return ClassFit(**v)


def _uncalibrated_gpu() -> Calibration:
    compute = ClassFit(0.70, 0.80, 7e-6, 14e-6)
    memory = ClassFit(None, 0.80, 7e-6, 14e-6)
    classes = {c: (compute if c in COMPUTE_CLASSES else memory) for c in OP_CLASSES}
    classes["all"] = compute
    # benchmarks/device_model.py against the H100 steps in docs/measurements.md (the unmodified
    # models, CUDA events); a check, not fitted in: the convolution networks are priced fast
    checked = {"VGG-16 b32": -36.9, "GPT-2 6x768 b8 512 tokens": 2.5, "WRN-50-2 b32": -31.1}
    return Calibration("uncalibrated-gpu", "", True, {"fp32": 1.0}, 1.0, classes,
                       error={"checked_step_pct": checked, "checked_on": "H100 steps",
                              "checked_kind": "NVIDIA H100 80GB HBM3"},
                       source="literature defaults, not fitted: 70 % of peak FLOP/s and 7 us per call (Meta's "
                              "autoparallel), 80 % of peak bandwidth, backward floor twice the forward's")


#: the fractions a GPU kind without a shipped calibration is priced with (module docstring)
UNCALIBRATED_GPU = _uncalibrated_gpu()


@lru_cache(maxsize=1)
def shipped_calibrations() -> tuple[Calibration, ...]:
    """The calibrations that come with the package (``calibrations/*.json``), by file name."""
    return tuple(Calibration.load(p) for p in sorted(CALIBRATIONS.glob("*.json")))


def calibration_for(device: str) -> Calibration | None:
    """The shipped calibration measured on ``device`` (the same catalogue kind, or the same
    name), or ``None``."""
    for cal in shipped_calibrations():
        if cal.device and same_kind(cal.device, device):
            return cal
    return None


@dataclass(frozen=True)
class DeviceModel:
    """A device's peaks with a calibration's fractions (module docstring): it prices work.

    ``name``: the device it prices; ``kind``: its catalogue entry (``None`` for a device priced
    from its own calibration, a CPU); ``gpu``: whether float32 convolutions run in TF32 there."""

    name: str
    peak_flops: Mapping[str, float]
    memory_Bps: float
    calibration: Calibration
    kind: DeviceKind | None = None
    gpu: bool = True

    def dtype(self, cls: str, precision: str) -> str:
        """The dtype whose peak prices class ``cls`` in ``precision``: bf16 for the matrix
        classes of a graph that computes in bfloat16 (``bf16``, ``bf16-params``:
        :data:`~tensoropt.graph.COMPUTE_DTYPES`); TF32 for a float32 convolution on a GPU (cuDNN's
        default in PyTorch; matmuls stay float32, ``allow_tf32`` is off for them by default); else fp32."""
        if cls in COMPUTE_CLASSES and COMPUTE_DTYPES.get(precision) == "bfloat16":
            return "bf16"
        if cls == "conv" and self.gpu:
            return "tf32"
        return "fp32"

    def peak(self, dtype: str) -> float:
        if self.kind is not None:
            return self.kind.peak(dtype)
        return self.peak_flops.get(dtype) or self.peak_flops["fp32"]

    def seconds(self, op: str, work: Work, precision: str = "fp32", backward: bool = True) -> tuple[float, float]:
        """(forward, backward) seconds of one call of ``op`` doing ``work``; the backward is 0
        where the call has none (``backward=False``, or no backward work)."""
        cls = op_class(op)
        fit = self.calibration.fit_for(cls)
        peak = self.peak(self.dtype(cls, precision))
        fp = fit.seconds(work.fp_flops, work.fp_bytes, peak, self.memory_Bps, False)
        has_bp = backward and (work.bp_flops > 0 or work.bp_bytes > 0)
        bp = fit.seconds(work.bp_flops, work.bp_bytes, peak, self.memory_Bps, True) if has_bp else 0.0
        return fp, bp

    def copy_Bps(self) -> float:
        """Bytes per second one large copy moves (reads and writes each byte: half the achieved
        bandwidth of the ``movement`` class; its per-call floor left out, the rate is for
        :meth:`~tensoropt.measure.costmodel.CostModel.grad_copy_s`'s buffers, many gradients
        per call).  0 where the calibration has no bandwidth term for movement."""
        fraction = self.calibration.fit_for("movement").bytes_fraction
        return self.memory_Bps * fraction / 2 if fraction else 0.0

    def describe(self) -> str:
        """Where its times come from, for every output, and what its calibration was checked on
        (:meth:`Calibration.error_text` for this device): ``"Tesla V100-SXM2-16GB device model
        (calibration uncalibrated-gpu, literature defaults, not fitted; not checked on a Tesla
        V100-SXM2-16GB: checked only on 3 measured H100 steps (…))"``."""
        cal = self.calibration
        made = f"fitted on {cal.device}" if cal.device else cal.source.split(":")[0]
        return f"{self.name} device model (calibration {cal.name}, {made}; {cal.error_text(self.name)})"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "model", "name": self.name, "kind": self.kind.key if self.kind else "",
                "calibration": self.calibration.name, "calibration_device": self.calibration.device,
                "error": dict(self.calibration.error), "source": self.describe(),
                "peak_flops": dict(self.peak_flops), "memory_Bps": self.memory_Bps}


def device_model(name: str, calibration: Calibration | str | os.PathLike[str] | None = None) -> DeviceModel:
    """The device model of the catalogue kind ``name`` (a name, key or alias): its datasheet
    peaks with ``calibration`` (a :class:`Calibration` or a calibration file), else the shipped
    calibration measured on that kind, else :data:`UNCALIBRATED_GPU`.  A calibration measured
    on a CPU prices only that CPU (:func:`cpu_model`).  Unknown kinds raise naming the known ones."""
    kind = find_kind(name)
    if kind is None:
        known = ", ".join(k.name for k in load_kinds().values())
        raise TensorOptError(f"no device model for {name!r}; known kinds: {known}. Profile on that device instead "
                             "(tensoropt profile MODEL --device cuda -o profile.json, then --profile profile.json)")
    cal = _as_calibration(calibration) if calibration is not None else calibration_for(kind.name) or UNCALIBRATED_GPU
    if not cal.gpu:
        raise TensorOptError(f"calibration {cal.name!r} was measured on a CPU ({cal.device}); it cannot price a GPU "
                             f"({kind.name}): pass a calibration made on a GPU, or none")
    return DeviceModel(kind.name, dict(kind.peak_flops), kind.memory_Bps, cal, kind, True)


def cpu_model(calibration: Calibration | str | os.PathLike[str]) -> DeviceModel:
    """The device model of the device a calibration was measured on, at the peaks it measured
    (how a CPU — which no catalogue lists — is priced; used to check the model against its own
    measurements)."""
    cal = _as_calibration(calibration)
    return DeviceModel(cal.device or cal.name, dict(cal.peak_flops), cal.memory_Bps, cal, None, cal.gpu)


def _as_calibration(c: Calibration | str | os.PathLike[str]) -> Calibration:
    return c if isinstance(c, Calibration) else Calibration.load(c)


__all__ = ["CALIBRATION_FORMAT", "UNCALIBRATED_GPU", "Calibration", "ClassFit", "DeviceModel", "calibration_for",
           "cpu_model", "device_model", "shipped_calibrations"]
