"""Device models: what operators cost on a device kind you do not have.

A profile measures every operator on one device; planning for another kind of GPU needs its
times there.  This package holds the catalogue of device kinds (:mod:`.kinds`: datasheet peaks,
bandwidth, memory, with sources), the operator classes (:mod:`.opclass`), calibrations and the
device model that prices a call's work — FLOPs and bytes, recorded by the profiler — on a kind
(:mod:`.calibration`), the fit of a calibration to measured profiles (:mod:`.fit`), measuring a
device to make one (:mod:`.calibrate`), and :func:`price`, the one place costs meet a cluster:
measured costs where the kinds match, converted through a device model where they do not,
refused where neither is possible (:mod:`.price`).

It sits between measuring and the plan model: it reads profiles and clusters, and the plan
model, frontier tracking and the placers call its guard (:func:`check_costs_kind`).

Example::

    >>> import torch
    >>> from tensoropt import capture, load_cluster, price, profile
    >>> model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    >>> graph = capture(model, (torch.randn(8, 16),))
    >>> costs = profile(graph, timed=False)             # memory and work only: no V100 here to time on
    >>> priced = price(costs, load_cluster("preset:v100-8-nvlink"))
    >>> priced.source
    'Tesla V100-SXM2-16GB device model (calibration uncalibrated-gpu, ...)'
    >>> round(priced.costs.total_fp_s * 1e6, 1)      # seconds of the forward, every node whole
    21.0
"""

from .calibration import UNCALIBRATED_GPU, Calibration, ClassFit, DeviceModel, cpu_model, device_model
from .fit import fit_calibration, step_seconds
from .kinds import DeviceKind, find_kind, load_kinds, same_kind
from .opclass import OP_CLASSES, op_class
from .price import (
                    COSTS_FROM,
                    CostsKindError,
                    Priced,
                    check_costs_kind,
                    convert,
                    costs_kind,
                    costs_source,
                    is_modelled,
                    price,
)

__all__ = ["COSTS_FROM", "OP_CLASSES", "UNCALIBRATED_GPU", "Calibration", "ClassFit", "CostsKindError",
           "DeviceKind", "DeviceModel", "Priced", "check_costs_kind", "convert", "costs_kind", "costs_source",
           "cpu_model", "device_model", "find_kind", "fit_calibration", "is_modelled", "load_kinds", "op_class",
           "price", "same_kind", "step_seconds"]
