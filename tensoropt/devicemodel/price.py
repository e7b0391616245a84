"""Pricing a profile for a cluster: never one device's timings priced as another's.

A profile's times were measured on one device (``costs.device["name"]``); a cluster's devices
name their kinds.  Three cases, decided by :func:`price` — the one place costs meet a cluster:

- **the same kind** (or a device of no stated kind, or one with an explicit ``speed`` — the
  cluster file's own override, shown where used): the measured costs, as they are;
- **another kind**, and ``costs_from`` is ``"auto"`` or ``"model"``: every time re-priced from
  the calls' work through that kind's device model (:func:`convert`); devices of a second kind
  in the same cluster get the speed the device models give them relative to the first;
- **another kind** and ``costs_from="measured"``, or a kind no device model knows: refused, with
  one message naming both kinds and the ways out (:class:`CostsKindError`).

:func:`check_costs_kind` is the guard frontier tracking, the placers and the simulator call, so
that the Python API cannot mix kinds either; :func:`costs_source` is the sentence every output
prints ("measured on …" or "… device model (calibration …)").

Example::

    >>> import torch
    >>> from tensoropt import capture, load_cluster, price, profile
    >>> model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> graph = capture(model, (torch.randn(8, 16),))
    >>> priced = price(profile(graph, timed=False), load_cluster("preset:v100-8-nvlink"))
    >>> priced.source
    'Tesla V100-SXM2-16GB device model (calibration uncalibrated-gpu, ...)'
    >>> priced.costs.settings["timed"], priced.costs.nodes["linear"].method
    (True, 'modelled')
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..cluster import Cluster, Device, is_cpu_kind
from ..errors import ProfileError, TensorOptError
from ..measure.costmodel import CostModel, NodeCost, ShardCost
from .calibration import Calibration, DeviceModel, device_model
from .fit import step_seconds
from .kinds import find_kind, same_kind

#: where a request's costs come from: decided by the kinds, the profile as measured, or a device model
COSTS_FROM = ("auto", "measured", "model")


class CostsKindError(TensorOptError):
    """Costs measured on one device kind used for devices of another, unconverted."""


def costs_kind(costs: CostModel) -> str:
    """The device the costs describe: the one measured on, or the one a device model priced."""
    return str(costs.device.get("name", "") or "")


def is_modelled(costs: CostModel) -> bool:
    return costs.device.get("type") == "model"


def costs_source(costs: CostModel) -> str:
    """Where the costs' times come from, in one line for headers, exports and banners."""
    if is_modelled(costs):
        return str(costs.device.get("source") or f"{costs_kind(costs)} device model")
    if not costs.settings.get("timed", True):
        return f"untimed profile made on {costs_kind(costs) or '?'} (memory and work only)"
    return f"measured on {costs_kind(costs) or 'an unnamed device'}"


def kind_matches(kind: str, measured_on: str, measured_type: str = "") -> bool:
    """Whether a device of ``kind`` is the kind costs ``measured_on`` describe: no kind stated,
    the same catalogue kind (:func:`~.kinds.same_kind`), or ``cpu`` for costs measured on a CPU."""
    if not kind or same_kind(kind, measured_on):
        return True
    return is_cpu_kind(kind) and measured_type == "cpu"


def prices_by_model(costs_from: str, cluster: Cluster, devices: Sequence[str] | None, measured_on: str,
                    measured_type: str = "") -> bool:
    """Whether :func:`price` will use a device model for costs measured on ``measured_on``
    (decided before profiling, so that a profile only a model will price need not be timed):
    ``costs_from`` is ``model``, or ``auto`` and some device is of another kind at speed 1."""
    if costs_from != "auto":
        return costs_from == "model"
    names = list(devices) if devices is not None else cluster.names
    return any(d.speed == 1.0 and not kind_matches(d.kind, measured_on, measured_type)
               for d in (cluster.device(n) for n in names))


def check_measured_fits(costs_from: str, cluster: Cluster, devices: Sequence[str] | None, measured_on: str,
                        measured_type: str = "") -> None:
    """Before profiling: refuse ``costs_from="measured"`` where a device is of another kind than
    the one that would measure (the message :func:`price` would give after a whole profile)."""
    if costs_from != "measured":
        return
    names = list(devices) if devices is not None else cluster.names
    wrong = [d for d in (cluster.device(n) for n in names)
             if d.speed == 1.0 and not kind_matches(d.kind, measured_on, measured_type)]
    if wrong:
        raise CostsKindError(_mismatch(f"to be measured on {measured_on} (this machine)", wrong))


def _needs_conversion(costs: CostModel, dev: Device) -> bool:
    return dev.speed == 1.0 and not kind_matches(dev.kind, costs_kind(costs), str(costs.device.get("type", "")))


def check_costs_kind(costs: CostModel, cluster: Cluster, devices: Sequence[str] | None = None) -> None:
    """Refuse costs of one kind for devices of another (module docstring), naming both kinds
    and the ways out; and costs without times.  Devices of no stated kind, or with an explicit
    ``speed``, pass."""
    if not costs.settings.get("timed", True):
        raise CostsKindError(f"the profile of {costs.graph_name!r} holds no times (made with timing off): price it "
                             "through a device model first (tensoropt.devicemodel.price)")
    names = list(devices) if devices is not None else cluster.names
    wrong = [cluster.device(d) for d in names if _needs_conversion(costs, cluster.device(d))]
    if wrong:
        raise CostsKindError(_mismatch(costs_source(costs), wrong))


def _mismatch(source: str, wrong: Sequence[Device]) -> str:
    kinds = ", ".join(dict.fromkeys(d.kind for d in wrong))
    known = [k for k in dict.fromkeys(d.kind for d in wrong) if find_kind(k) is not None]
    model = (f"price them through the device model (--costs-from model; known for {', '.join(known)})"
             if known else "describe the devices by a kind the catalogue knows (tensoropt kinds)")
    names = ", ".join(d.name for d in wrong[:4])
    return (f"the costs were {source}, but the plan's devices are {kinds} ({names}"
            f"{' …' if len(wrong) > 4 else ''}); ways out: profile on that device (tensoropt profile MODEL --device "
            f"cuda -o profile.json) and pass --profile profile.json; or {model}; or set each device's speed in the "
            "cluster file (speed: 1.0 means as fast as the profiled device, written out it is used as given)")


def convert(costs: CostModel, model: DeviceModel) -> CostModel:
    """``costs`` with every time re-priced from the calls' work by ``model``: memory figures kept,
    ``method`` ``modelled`` (free calls stay free), ``device`` the model's description (with the
    device the work was recorded on).  Raises :class:`~tensoropt.errors.ProfileError` for a
    profile without work figures (made before they were recorded).  O(nodes × shards)."""
    precision = str(costs.settings.get("precision", "fp32"))
    missing = [n.name for n in costs.nodes.values() if n.work is None and n.method != "free"]
    if missing:
        raise ProfileError(f"the profile of {costs.graph_name!r} records no work for {len(missing)} operator(s) "
                           f"({', '.join(missing[:3])}…): it was made before work was recorded; re-profile it "
                           "(tensoropt profile MODEL -o profile.json) to price it through a device model")
    untimed = not costs.settings.get("timed", True)

    def priced(op: str, fp_s: float, bp_s: float, work_ok: bool, sc: ShardCost) -> ShardCost:
        if sc.method == "free" or sc.work is None or not work_ok:
            return sc
        fp, bp = model.seconds(op, sc.work, precision, backward=untimed or bp_s > 0)
        return dataclasses.replace(sc, fp_s=fp, bp_s=bp, method="modelled")

    nodes: dict[str, NodeCost] = {}
    for name, n in costs.nodes.items():
        if n.method == "free":
            nodes[name] = n
            continue
        full = priced(n.op, n.fp_s, n.bp_s, True, n.at())
        shards = {key: priced(n.op, s.fp_s, s.bp_s, True, s) for key, s in n.shards.items()}
        nodes[name] = dataclasses.replace(n, fp_s=full.fp_s, bp_s=full.bp_s, method=full.method, shards=shards)
    recorded_on = costs.device.get("work_recorded_on") if is_modelled(costs) else None
    device = {**model.to_dict(), "work_recorded_on": recorded_on or costs_kind(costs)}
    settings = {**costs.settings, "timed": True, "priced_by": model.describe()}
    # the measured device's gradient-copy rate is replaced by the model's (CostModel.grad_copy_s)
    settings.pop("in_sequence", None)
    settings["grad_copy_Bps"] = model.copy_Bps()
    return CostModel(nodes, graph_fingerprint=costs.graph_fingerprint, graph_name=costs.graph_name,
                     batch_size=costs.batch_size, device=device, settings=settings, profile_s=costs.profile_s)


@dataclass
class Priced:
    """Costs fit for a cluster: the costs (converted or as measured), the cluster (speeds the
    device models gave to a second kind), where the times come from, and what was decided."""

    costs: CostModel
    cluster: Cluster
    source: str
    notes: list[str] = field(default_factory=list)

    @property
    def modelled(self) -> bool:
        return is_modelled(self.costs)


def price(costs: CostModel, cluster: Cluster, devices: Sequence[str] | None = None, *, costs_from: str = "auto",
          calibration: Calibration | str | os.PathLike[str] | None = None) -> Priced:
    """Costs fit for ``cluster``'s ``devices`` (module docstring).  ``costs_from``: ``auto``
    (measured where the kinds match, else the device model), ``measured`` (refuse a mismatch),
    ``model`` (always the device model of the devices' kind); ``calibration``: the device
    model's calibration (default: the shipped one for the kind, else the uncalibrated one)."""
    if costs_from not in COSTS_FROM:
        raise TensorOptError(f"costs_from must be one of {', '.join(COSTS_FROM)}, got {costs_from!r}")
    names = list(devices) if devices is not None else cluster.names
    devs = [cluster.device(d) for d in names]
    notes = [f"{d.name}: speed {d.speed:g} as the cluster gives it" for d in devs if d.speed != 1.0]
    wrong = [d for d in devs if _needs_conversion(costs, d)]
    untimed = not costs.settings.get("timed", True)
    if costs_from == "measured" or (costs_from == "auto" and not wrong and not untimed):
        if untimed:
            raise CostsKindError("costs_from='measured' with an untimed profile: profile with timing on")
        if wrong:
            raise CostsKindError(_mismatch(costs_source(costs), wrong))
        unnamed = [d.name for d in devs if not d.kind]
        if unnamed:
            notes.append(f"{', '.join(unnamed[:4])}: no kind stated, taken as the profiled device")
        return Priced(costs, cluster, costs_source(costs), notes)
    return _by_model(costs, cluster, devs, calibration, notes, keep_measured=costs_from == "auto" and not untimed)


def _by_model(costs: CostModel, cluster: Cluster, devs: list[Device],
              calibration: Calibration | str | os.PathLike[str] | None, notes: list[str], *,
              keep_measured: bool) -> Priced:
    """The costs priced by the device model of the first kind among the devices at speed 1; a
    second kind at speed 1 gets the ratio of the two models' step times as its speed.  With
    ``keep_measured``, where some device is the measured kind and the catalogue knows it, the
    measured costs stay and only the other kinds get speeds (the same ratio)."""
    at_one = [d for d in devs if d.speed == 1.0 and d.kind]
    measured_on = costs_kind(costs)
    if keep_measured and find_kind(measured_on) is not None and any(same_kind(d.kind, measured_on) for d in at_one):
        at_one = sorted(at_one, key=lambda d: not same_kind(d.kind, measured_on))   # the measured kind first
    unknown = list(dict.fromkeys(d.kind for d in at_one if find_kind(d.kind) is None))
    if unknown or not at_one:
        what = f"the device kind(s) {', '.join(unknown)}" if unknown else "devices without a stated kind"
        raise CostsKindError(f"no device model for {what}: the costs were {costs_source(costs)}; name a kind the "
                             "catalogue knows in the cluster file (kind: ...), or profile on the device and pass "
                             "--profile")
    ref = device_model(at_one[0].kind, calibration)
    as_measured = keep_measured and same_kind(ref.name, measured_on)
    converted = costs if as_measured else convert(costs, ref)
    speeds: dict[str, float] = {}
    ref_step = step_seconds(costs, ref)
    for d in at_one:
        if not same_kind(d.kind, ref.name):
            other = device_model(d.kind, calibration)
            speeds[d.name] = ref_step / step_seconds(costs, other)
            notes.append(f"{d.name}: {d.kind} at speed {speeds[d.name]:.2f} of {ref.name} (device models' step times)")
    for d in devs:
        if not d.kind and d.speed == 1.0:
            notes.append(f"{d.name}: no kind stated, taken as {ref.name}")
    if speeds:
        new = [dataclasses.replace(d, speed=speeds[d.name]) if d.name in speeds else d for d in cluster.devices]
        cluster = Cluster(cluster.name, new, cluster.links, source=cluster.source)
    return Priced(converted, cluster, costs_source(converted), notes)


__all__ = ["COSTS_FROM", "CostsKindError", "Priced", "check_costs_kind", "check_measured_fits", "convert",
           "costs_kind", "costs_source", "is_modelled", "kind_matches", "price", "prices_by_model"]
