"""Measuring a device to calibrate its device model.

A calibration is fitted (:mod:`.fit`) on profiles measured on the device: every timed call of a
set of models whose operators span the classes (:mod:`.opclass`) — matrix products of many
shapes, convolutions, attention, normalisation, gathers, elementwise work — at their full shape
and at each shard.  :func:`calibrate` profiles those models on a device (or takes saved
profiles), fits, and states how well the fit predicts: in sample (``error``) and, the figure a
user should believe, **leave one model out** (``error["holdout_step_pct"]``: each model's step
predicted by a fit on the others only).

The models: :data:`CPU_MODELS` are the zoo at sizes a 2-core machine profiles in about a minute
each; :data:`GPU_MODELS` the sizes a GPU step is made of (the H100 figures in the docs use the
same specs).

Example::

    >>> cal, profiles = calibrate("cpu", ["zoo:rnnlm?tiny=1", "zoo:transformer?tiny=1"], repeats=1)
    >>> cal.save("my-cpu.json")
    >>> cal.source
    'fitted on 2 profile(s) measured on ...: zoo:rnnlm?tiny=1, zoo:transformer?tiny=1'
    >>> sorted(cal.error["holdout_step_pct"])      # each model's step predicted by a fit on the other
    ['rnnlm-tiny', 'transformer-tiny']
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import TensorOptError
from ..measure import CostModel
from ..measure.profiler import profile, profiling_device
from ..measure.timing import device_name
from ..modelspec import load_model
from ..progress import Progress, no_progress
from .calibration import Calibration
from .fit import check, fit_calibration

#: calibration models for a CPU: every op class, about a minute each on two cores
CPU_MODELS = (
    "zoo:gpt2?layers=2&batch=4&seq_len=128",
    "zoo:bert?layers=2&batch=4&seq_len=128",
    "zoo:transformer?layers=2&batch=8&seq_len=64&vocab=8000",
    "zoo:vgg16?batch=4&image_size=64&width=0.25",
    "zoo:wide_resnet?depth=18&batch=4&image_size=64&width=1",
    "zoo:unet?batch=2&image_size=64&base_channels=16",
    "zoo:inception_v3?batch=2&image_size=96&width=0.5",
    "zoo:rnnlm?batch=16&seq_len=20&vocab=2000&hidden=256",
)
#: calibration models for a GPU: the sizes of a real step (the docs' H100 specs among them)
GPU_MODELS = (
    "zoo:gpt2?layers=6&batch=8&seq_len=512",
    "zoo:bert?layers=6&batch=16&seq_len=256",
    "zoo:transformer?layers=4&batch=64&seq_len=128",
    "zoo:vgg16?batch=32",
    "zoo:wide_resnet?batch=32",
    "zoo:unet?batch=16&image_size=128",
    "zoo:inception_v3?batch=32",
    "zoo:rnnlm?batch=64",
)


def calibration_models(device: str) -> tuple[str, ...]:
    """The default models for ``device`` (``cpu`` or ``cuda[:N]``)."""
    return GPU_MODELS if profiling_device(device).type == "cuda" else CPU_MODELS


def measure_profiles(models: Sequence[str], device: str = "cpu", *, repeats: int = 3,
                     shard_degrees: Sequence[int] = (1, 2), save_to: str | os.PathLike[str] | None = None,
                     progress: Progress = no_progress) -> list[CostModel]:
    """Each model (a model spec) captured and profiled, timed, on ``device``; with ``save_to``
    each profile is written there as ``NN-<graph name>.json`` as soon as it is made."""
    out = []
    folder = Path(save_to) if save_to is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    for i, spec in enumerate(models):
        progress("calibrate", i, len(models), f"profiling {spec}")
        graph = load_model(spec).capture()
        costs = profile(graph, device=device, shard_degrees=shard_degrees, repeats=repeats, progress=progress)
        costs.settings["model_spec"] = spec
        if folder is not None:
            costs.save(folder / f"{i:02d}-{graph.name}.json")
        out.append(costs)
    progress("calibrate", len(models), len(models), "profiled")
    return out


def holdout_errors(profiles: Sequence[CostModel], **fit_options: object) -> dict[str, float]:
    """Each profile's whole-step error (signed %, graph name → %) under a calibration fitted on
    the *other* profiles only: what the fit does on a model it has not seen."""
    if len(profiles) < 2:
        return {}
    out: dict[str, float] = {}
    for i, held in enumerate(profiles):
        rest = [p for j, p in enumerate(profiles) if j != i]
        cal = fit_calibration(rest, name="holdout", **fit_options)  # type: ignore[arg-type]
        steps = check(cal, [held])["step_pct"]
        assert isinstance(steps, dict)
        out.update(steps)
    return out


def fit_with_holdout(profiles: Sequence[CostModel], *, name: str, source: str = "",
                     **fit_options: object) -> Calibration:
    """:func:`~.fit.fit_calibration` on all ``profiles``, its ``error`` extended with the
    leave-one-model-out step errors (:func:`holdout_errors`)."""
    cal = fit_calibration(profiles, name=name, source=source, **fit_options)  # type: ignore[arg-type]
    holdout = holdout_errors(profiles, **fit_options)
    return Calibration(cal.name, cal.device, cal.gpu, cal.peak_flops, cal.memory_Bps, cal.classes,
                       {**cal.error, "holdout_step_pct": holdout}, cal.source)


def calibrate(device: str = "cpu", models: Sequence[str] | None = None, *, profiles: Sequence[CostModel] = (),
              repeats: int = 3, shard_degrees: Sequence[int] = (1, 2), name: str | None = None,
              save_profiles: str | os.PathLike[str] | None = None,
              progress: Progress = no_progress) -> tuple[Calibration, list[CostModel]]:
    """A calibration of ``device`` and the profiles it was fitted on: ``profiles`` given (saved
    profiles, measured on one device) or else ``models`` (default :func:`calibration_models`)
    profiled there now.  ``name`` defaults to the device's name."""
    measured = list(profiles)
    if not measured:
        measured = measure_profiles(models or calibration_models(device), device, repeats=repeats,
                                    shard_degrees=shard_degrees, save_to=save_profiles, progress=progress)
    names = {str(p.device.get("name", "")) for p in measured}
    if len(names) > 1:
        raise TensorOptError(f"the profiles were measured on different devices ({', '.join(sorted(names))}): "
                             "a calibration describes one device; pass the profiles of one")
    untimed = [p.graph_name for p in measured if not p.settings.get("timed", True)]
    if untimed:
        raise TensorOptError(f"profile(s) of {', '.join(untimed)} hold no times (made with timing off): "
                             "calibrate from profiles measured with timing on")
    on = next(iter(names)) or (device_name(profiling_device(device)) if not profiles else "unnamed device")
    specs = [str(p.settings.get("model_spec") or p.graph_name) for p in measured]
    source = f"fitted on {len(measured)} profile(s) measured on {on}: {', '.join(specs)}"
    cal = fit_with_holdout(measured, name=name or on, source=source)
    return cal, measured


__all__ = ["CPU_MODELS", "GPU_MODELS", "calibrate", "calibration_models", "fit_with_holdout", "holdout_errors",
           "measure_profiles"]
