"""The page's controls as a :class:`~.pipeline.Request` — what the run button asks for, and what
``tensoropt app`` starts computing before the page opens — without Dash.

It owns reading the model and cluster controls (zoo name and parameters, spec, uploads, preset,
devices, optimizer, where the times come from) into a request, and the controls' values for a
default model and cluster; it must not import Dash or plotly: ``tensoropt app`` builds the
default's request and forks its run before the page's modules load (:mod:`.startup`).

Example::

    >>> first_request("zoo:gpt2?layers=2", "preset:titan-rtx-5", 1, 0, algos=()).devices
    ('gpu0', 'gpu1', 'gpu2', 'gpu3', 'gpu4')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl

from tensoropt import zoo
from tensoropt.cluster import list_presets
from tensoropt.errors import TensorOptError
from tensoropt.optimizers import DEFAULT_OPTIMIZER
from tensoropt.planmodel.pipelined import LOOPED
from tensoropt.request import DETECTED, default_of
from tensoropt.workflow import read_cluster

from .pipeline import DEFAULT_PRECISION, Request

#: where the operator times come from: the ``costs-from`` control's values and labels (the callbacks
#: turn a value into the request's ``costs_from``, ``profile`` and ``calibration``)
COSTS_CHOICES = {
    "auto": "automatic: measured where this machine is the cluster's kind, else the GPUs' device model",
    "measured": "measured on this machine",
    "profile": "an uploaded profile",
    "model": "a device model",
}


def split_zoo_spec(spec: str) -> tuple[str, str]:
    """``"zoo:gpt2?layers=2&batch=2"`` → ``("gpt2", "layers=2&batch=2")``."""
    body = spec[len("zoo:"):] if spec.startswith("zoo:") else spec
    name, _, query = body.partition("?")
    return name, query


def zoo_default_params(name: str) -> str:
    """The zoo model's default parameters as ``k=v&…`` (what the parameters box shows)."""
    try:
        params = zoo.get(name).params()
    except ValueError:
        return ""
    return "&".join(f"{k}={v}" for k, v in params.items())


def zoo_spec(name: str, params: str | None) -> str:
    """The model spec of a zoo name and a ``k=v&…`` string (blank parts dropped)."""
    pairs = parse_qsl((params or "").strip(), keep_blank_values=True)
    query = "&".join(f"{k}={v}" for k, v in pairs if k)
    return f"zoo:{name}" + (f"?{query}" if query else "")


def initial_controls(default_model: str, default_cluster: str,
                     default_precision: str | None = DEFAULT_PRECISION) -> dict[str, Any]:
    """The model and cluster controls' values when the page opens on ``default_model``,
    ``default_cluster`` and ``default_precision`` (the server's defaults; ``None``: fp32):
    ``model_source``, ``zoo_name``, ``zoo_params``, ``model_spec``, ``precision``, ``cluster_source``,
    ``cluster_preset`` and ``cluster_path``.  A zoo model fills
    the zoo controls, any other spec the spec box; a preset the preset list, ``detected`` the
    machine's GPUs, any other cluster (a file) stands as the uploaded cluster."""
    zoo_model = default_model.startswith("zoo:")
    zoo_name, zoo_params = split_zoo_spec(default_model) if zoo_model else ("gpt2", "")
    preset = default_cluster[len("preset:"):] if default_cluster.startswith("preset:") else list_presets()[0]
    source = ("preset" if default_cluster.startswith("preset:") else "detected" if default_cluster == DETECTED
              else "upload")
    return {"model_source": "zoo" if zoo_model else "spec", "zoo_name": zoo_name, "zoo_params": zoo_params,
            "model_spec": "" if zoo_model else default_model, "precision": default_precision or "fp32",
            "cluster_source": source, "cluster_preset": preset,
            "cluster_path": default_cluster if source == "upload" else None}


def cluster_spec(source: str, preset: str | None, uploaded: str | None) -> str:
    """The request's cluster string for the cluster controls' state."""
    if source == "detected":
        return DETECTED
    if source == "upload":
        if not uploaded:
            raise TensorOptError("upload a cluster YAML first, or choose a preset")
        return uploaded
    if not preset:
        raise TensorOptError("choose a cluster preset")
    return f"preset:{preset}"


def chosen_source(source: str, zoo_name: str | None, zoo_params: str | None, spec: str | None) -> str:
    """Which model source the controls mean: the radio's, except that a spec typed while ``zoo`` is
    chosen wins — a non-empty spec box that says something other than the zoo fields' spec.  The
    request decides this rather than a callback on the box alone, since the link also fills the box,
    and a blur or Enter races the run button's read of the radio; the radio then follows the request
    (and choosing the zoo empties the box, :mod:`.callbacks`).

    >>> chosen_source("zoo", "gpt2", "layers=2", "zoo:bert"), chosen_source("zoo", "gpt2", "layers=2", " ")
    ('spec', 'zoo')
    >>> chosen_source("zoo", "gpt2", "layers=2", "zoo:gpt2?layers=2"), chosen_source("onnx", "gpt2", "", "zoo:bert")
    ('zoo', 'onnx')
    """
    text = (spec or "").strip()
    if source == "zoo" and text and text != (zoo_spec(zoo_name, zoo_params) if zoo_name else None):
        return "spec"
    return source


def model_spec(source: str, zoo_name: str | None, zoo_params: str | None, spec: str | None,
               onnx_path: str | None) -> str:
    """The request's model spec for the model controls' state (the source :func:`chosen_source` says)."""
    source = chosen_source(source, zoo_name, zoo_params, spec)
    if source == "onnx":
        if not onnx_path:
            raise TensorOptError("upload an ONNX file first, or choose a zoo model")
        return onnx_path
    if source == "spec":
        text = (spec or "").strip()
        if not text:
            raise TensorOptError("write a model spec (zoo:NAME?k=v or file.py:factory)")
        return text
    if not zoo_name:
        raise TensorOptError("choose a zoo model")
    return zoo_spec(zoo_name, zoo_params)


def costs_fields(choice: str | None, profile_path: str | None, calibration_path: str | None) -> dict[str, Any]:
    """The request's ``costs_from``, ``profile`` and ``calibration`` for the ``costs-from`` control
    (:data:`COSTS_CHOICES`): an uploaded profile is used only when that is the choice (and
    then priced as ``auto`` prices: as measured where its device is the cluster's kind); the
    calibration goes wherever a device model may price, so not with ``measured``."""
    choice = choice or "auto"
    if choice not in COSTS_CHOICES:
        raise TensorOptError(f"unknown choice of where the times come from: {choice!r}")
    if choice == "profile" and not profile_path:
        raise TensorOptError("upload a saved profile JSON first, or choose another source of the operator times")
    return {"costs_from": "auto" if choice == "profile" else choice,
            "profile": profile_path if choice == "profile" else None,
            "calibration": calibration_path if choice != "measured" else None}


def request_from_controls(source: str, zoo_name: str | None, zoo_params: str | None, spec: str | None,
                          onnx_path: str | None, profile_path: str | None, batch: Any, csource: str,
                          preset: str | None, cpath: str | None, devices: list[str] | None, optimizer: str | None,
                          repeats: Any, warmup: int | None, costs: str | None = "auto",
                          calibration_path: str | None = None, precision: str | None = None,
                          pipelines: Sequence[str] | None = None, *, algos: tuple[str, ...] | None) -> Request:
    """The :class:`~.pipeline.Request` the run button asks for, from the controls' state (``costs``:
    the ``costs-from`` choice, see :func:`costs_fields`; ``precision``: ``fp32`` — ``None`` in the
    request —, ``bf16`` or ``bf16-params``; ``pipelines``: the schedules ticked, kept in
    :data:`~tensoropt.planmodel.pipelined.LOOPED`'s order); bad input is a :class:`~tensoropt.errors.TensorOptError`
    saying what to fix."""
    cluster = cluster_spec(csource, preset, cpath)
    if not devices:
        # the device list is filled from the cluster after the page loads: all of them
        devices = list(read_cluster(cluster).names)
    return Request(model=model_spec(source, zoo_name, zoo_params, spec, onnx_path), cluster=cluster,
                   batch=int(batch) if batch not in (None, "") else None, devices=tuple(devices),
                   optimizer=optimizer or default_of("optimizer"),
                   repeats=int(repeats) if repeats else default_of("repeats"),
                   warmup=int(warmup) if warmup is not None else default_of("warmup"), algos=algos,
                   precision=None if precision in (None, "", "fp32") else precision,
                   pipelines=tuple(s for s in LOOPED if s in (pipelines or ())),
                   **costs_fields(costs, profile_path, calibration_path))


def first_request(default_model: str, default_cluster: str, repeats: int, warmup: int, *,
                  algos: tuple[str, ...] | None, default_precision: str | None = DEFAULT_PRECISION) -> Request:
    """The request the page runs when it opens with no link (:func:`request_from_controls` of the
    controls as :func:`initial_controls` sets them: every device of the cluster, the default
    optimizer, ``default_precision``, times from ``auto``): what ``tensoropt app`` starts computing
    with the server."""
    c = initial_controls(default_model, default_cluster, default_precision)
    return request_from_controls(c["model_source"], c["zoo_name"], c["zoo_params"], c["model_spec"], None, None, None,
                                 c["cluster_source"], c["cluster_preset"], c["cluster_path"], [], DEFAULT_OPTIMIZER,
                                 repeats, warmup, "auto", None, c["precision"], algos=algos)


__all__ = ["COSTS_CHOICES", "chosen_source", "cluster_spec", "costs_fields", "first_request", "initial_controls",
           "model_spec", "request_from_controls", "split_zoo_spec", "zoo_default_params", "zoo_spec"]
