"""What one real training step of a model costs: the ground truth the cost model is checked against.

:func:`measure_step` runs whole training steps of an ``nn.Module`` — forward, :func:`training_loss`,
backward, ``optimizer.step()``, ``optimizer.zero_grad()`` — and reports their median wall time,
the forward and backward parts of it, and the peak memory of one step with a per-category
breakdown (:class:`StepMeasurement`).

**Precision.**  ``precision="bf16"`` runs the model's forward under the autocast a bf16 graph
runs under (:func:`tensoropt.capture.precision_context`): parameters, gradients and optimizer
state stay float32, the ops autocast lists compute in bfloat16 on bfloat16 copies of their
inputs and weights (counted as ``activation`` while saved for backward); the loss and the
backward run outside it.

Order of work: ``warmup`` untimed steps (they also create the optimizer state — momentum
buffers, Adam's moments — which only exists after a first step), ``repeats`` timed steps, then
the memory step(s), each its own step because tracking slows every operator down.

**Timing.**  CPU: ``time.perf_counter`` around each phase of each step.  CUDA: a
``torch.cuda.Event`` before the forward, after the loss, after the backward and after
``zero_grad``, synchronised once per step.  ``time_s`` is the median of the whole steps,
``forward_s`` / ``backward_s`` the medians of the two phases inside the same steps (the
optimizer step and ``zero_grad`` make up the rest).

**Memory** (``memory=True``) with ``torch.distributed._tools.MemTracker`` (a private API: a
``TorchDispatchMode`` plus module / gradient / optimizer hooks).  The model, the optimizer and
the input tensors are registered with ``track_external`` before the step, so the tracked memory
at the start of the step (:attr:`StepMeasurement.baseline_bytes`) is parameters + buffers +
optimizer state + inputs.  Every storage an operator produces afterwards is counted, once per
storage (views share their base), with its exact byte size (CPU) or rounded up to the CUDA
allocator's 512-byte blocks, and freed when the storage is garbage-collected; after every
operator the running total is compared with the peak, whose per-category snapshot becomes
:attr:`StepMeasurement.breakdown`.  Categories (MemTracker's names → ours):

- ``Parameter`` → ``parameter``, ``Buffer`` → ``buffer``: the module's, from the start;
- ``Gradient`` → ``gradient``: parameter gradients once autograd has accumulated them into
  ``.grad`` (before that moment a gradient is counted as ``temp``);
- ``Activation`` → ``activation``: *everything created during the forward* (and the loss):
  the tensors autograd saved for backward, plus forward temporaries while they are alive —
  a saved tensor keeps this label through the backward until it is freed;
- ``Temp`` → ``temp``: everything created during the backward: activation gradients and the
  parameter gradients not yet accumulated;
- ``Optstate`` → ``optimizer``: optimizer state (α × parameters: 0 SGD, 1 momentum, 2 Adam, plus
  Adam's scalar ``step`` tensors) *and everything allocated inside* ``optimizer.step()`` —
  Adam's per-parameter temporaries are counted here while they live;
- ``Other`` → ``input``: the example inputs (the only external tensors registered).

What it does not count: memory that does not pass through the dispatcher as a tensor storage —
the CPU allocator's own overhead and alignment, CUDA caching-allocator reserve and
fragmentation, kernel workspaces allocated inside an operator (oneDNN / cuDNN / cuBLAS
scratch), the CUDA context, Python objects — and tensors created outside the step and not
registered.  Its peak is sampled after each operator returns, so an operator's inputs and its
output are seen together, but a transient buffer that lives and dies inside one kernel is not.

Independent checks: ``crosscheck=True`` (CPU) replays one more step under
``torch.profiler.profile(profile_memory=True)`` and adds the highest running total of the CPU
allocator's allocation / free events to the bytes held at the start of the step, counted
separately by summing the storages of parameters, buffers, optimizer state and inputs
(:attr:`StepMeasurement.profiler_peak_bytes`).  The allocator sees everything the c10 CPU
allocator hands out, in-kernel scratch included; on the test MLPs it agrees with MemTracker to
the byte.  On CUDA :attr:`StepMeasurement.peak_bytes` comes from the caching allocator itself
(``torch.cuda.max_memory_allocated``) and MemTracker only supplies the breakdown, so the two are
independent there too.

Side effects on the caller's objects: the model (and tensors in the inputs) are moved to
``device``; its weights are updated by ``warmup + repeats + 1..3`` optimizer steps of learning
rate ``lr``; its gradients are left ``None``; its train / eval mode is restored afterwards.
Pass a ``copy.deepcopy`` if the weights matter.

Example::

    >>> model, inputs = torch.nn.Linear(16, 4), (torch.randn(8, 16),)
    >>> m = measure_step(model, inputs, device="cpu", optimizer="adam", repeats=2)
    >>> m.peak_bytes, m.peak_phase, m.time_s > 0
    (2124, 'optimizer', True)
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils._pytree import tree_flatten, tree_map_only

from .._malloc import steady_malloc
from ..capture.precision import check_precision, precision_context
from ..errors import ProfileError
from ..graph import Precision
from ..optimizers import DEFAULT_OPTIMIZER
from ..plan import Plan

__all__ = ["OPTIMIZERS", "StepMeasurement", "make_optimizer", "measure_step", "plan_optimizer", "training_loss"]

#: optimizer name → (description, α = optimizer-state bytes per parameter byte)
OPTIMIZERS: dict[str, tuple[str, int]] = {
    "sgd": ("torch.optim.SGD(momentum=0)", 0),
    "momentum": ("torch.optim.SGD(momentum=0.9)", 1),
    "adam": ("torch.optim.Adam", 2),
    "adamw": ("torch.optim.AdamW", 2),
}

#: MemTracker's category names → the names used in :attr:`StepMeasurement.breakdown`
CATEGORY_NAMES = {
    "Parameter": "parameter",
    "Buffer": "buffer",
    "Gradient": "gradient",
    "Optstate": "optimizer",
    "Activation": "activation",
    "Temp": "temp",
    "Other": "input",
}

_PHASES = ("forward", "backward", "optimizer", "zero_grad")
_CUDA_BLOCK = 512  # the CUDA caching allocator rounds every allocation up to this


@dataclass(frozen=True)
class StepMeasurement:
    """One model's training step, measured (see the module docstring for how)."""
    time_s: float                 # median wall time of one full step
    times_s: tuple[float, ...]    # every timed step, in order
    forward_s: float              # median forward time (model(*inputs) + loss, grad enabled)
    backward_s: float             # median loss.backward() time, in the same steps
    peak_bytes: int               # peak memory of the step (0 when memory=False)
    breakdown: dict[str, int]     # bytes by category at MemTracker's peak ({} when memory=False)
    device: str                   # "cpu" / "cuda:0"
    optimizer: str                # "adamw" | "adam" | "momentum" | "sgd"
    threads: int                  # torch.get_num_threads() during the measurement
    #: bytes tracked at the start of the step: parameters + buffers + optimizer state + inputs
    baseline_bytes: int = 0
    #: the phase during which the peak was reached: forward / backward / optimizer / zero_grad
    peak_phase: str | None = None
    #: ``activation`` bytes alive at the end of the forward (the loss computed, the model's
    #: outputs dropped): what autograd saved for the backward, plus the loss
    saved_activation_bytes: int | None = None
    #: CUDA: ``torch.cuda.max_memory_allocated`` during the step, everything on the device
    #: (other tensors of the process included); None on CPU
    peak_absolute_bytes: int | None = None
    #: ``crosscheck=True``: the peak from the torch profiler's allocator events (CPU)
    profiler_peak_bytes: int | None = None
    #: CUDA: MemTracker's own peak (the breakdown's sum); on CPU it is ``peak_bytes``
    tracker_peak_bytes: int | None = None
    #: "fp32", or "bf16": the forward ran under autocast (module docstring)
    precision: str = "fp32"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (tuples as lists)."""
        out = dataclasses.asdict(self)
        out["times_s"] = list(self.times_s)
        out["breakdown"] = dict(self.breakdown)
        return out


# ------------------------------------------------------------------------------------ the loss

def _float_tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every floating-point tensor in a nested structure of tuples / lists / mappings /
    dataclasses (Hugging Face ``ModelOutput`` is a mapping), in order."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point():
            yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _float_tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _float_tensors(value)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _float_tensors(getattr(obj, f.name))


def loss_term(output: torch.Tensor) -> torch.Tensor:
    """One floating-point output's term of :func:`training_loss`: its mean, in float32 or wider."""
    return output.float().mean()


def training_loss(outputs: Any, *, term: Callable[[torch.Tensor], torch.Tensor] = loss_term) -> torch.Tensor:
    """The loss the project trains models that return logits with (the zoo models return logits,
    no loss): ``sum(t.float().mean() for every floating-point tensor t in outputs)``.

    ``outputs`` may be a tensor or any nesting of tuples, lists, dicts (``ModelOutput``) and
    dataclasses; integer / bool tensors (token ids, masks) and non-tensors are ignored.  The
    gradient it seeds is the constant ``1 / t.numel()`` on every element of every output, which
    is how the profiler seeds each operator's backward too: the backward's cost does not depend
    on the gradient's values, only on its shape.  ``term`` computes each output's term (the
    in-sequence profiler wraps :func:`loss_term` to time it).  Raises :class:`ProfileError` when
    the outputs hold no floating-point tensor.
    """
    terms = [term(t) for t in _float_tensors(outputs)]
    if not terms:
        raise ProfileError("the model's outputs hold no floating-point tensor to train on "
                           f"(got {type(outputs).__name__}); training_loss sums the mean of every "
                           "floating-point output")
    loss = terms[0]
    for more in terms[1:]:
        loss = loss + more
    return loss


# ------------------------------------------------------------------------------- the optimizer

def make_optimizer(name: str, params, *, lr: float = 1e-3) -> torch.optim.Optimizer:
    """``sgd`` = SGD without momentum (α=0), ``momentum`` = SGD(momentum=0.9) (α=1), ``adam`` =
    Adam, ``adamw`` = AdamW (α=2); torch's default implementation for the device (per-tensor on
    CPU, ``foreach`` on CUDA).  Unknown name → :class:`ProfileError`."""
    key = str(name).lower()
    if key == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.0)
    if key == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if key == "adam":
        return torch.optim.Adam(params, lr=lr)
    if key == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise ProfileError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)} "
                       f"({'; '.join(f'{k} = {v[0]}' for k, v in OPTIMIZERS.items())})")


def plan_optimizer(plan: Plan) -> str:
    """The optimizer a plan was sized for (its ``options["optimizer"]``, an integer α read as the
    Adam-like / momentum / SGD optimizer of that state), :data:`~tensoropt.planmodel.memory.DEFAULT_OPTIMIZER`
    when it names none: what the executors train it with."""
    opt = (plan.options or {}).get("optimizer", DEFAULT_OPTIMIZER)
    if isinstance(opt, int):
        return {0: "sgd", 1: "momentum"}.get(opt, "adamw")
    return str(opt)


# ---------------------------------------------------------------------------------- measuring

def _resolve_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ProfileError(f"bad device {device!r}: {exc}; use 'cpu' or 'cuda[:N]'") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise ProfileError(f"device {device!r} is not supported; use 'cpu' or 'cuda[:N]'")
    if not torch.cuda.is_available():
        raise ProfileError(f"device {device!r} asked for but CUDA is not available here "
                           f"(torch {torch.__version__}, built with CUDA "
                           f"{torch.version.cuda or 'none'}); use device='cpu'")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ProfileError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def _storages(tensors) -> dict[Any, int]:
    """Storage key → bytes, each storage once (views and tied weights share one)."""
    out: dict[Any, int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            out[(t.device, st.data_ptr())] = st.nbytes()
    return out


def _held_tensors(model: nn.Module, opt: torch.optim.Optimizer, inputs: tuple) -> list[torch.Tensor]:
    """What is alive at the start of a step: parameters, buffers, optimizer state, inputs."""
    held = [*model.parameters(), *model.buffers()]
    for state in opt.state.values():
        held.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    held.extend(t for t in tree_flatten(inputs)[0] if isinstance(t, torch.Tensor))
    return held


class _Step:
    """One training step, split into phases that a caller can observe; the forward in
    ``precision`` on ``device`` (the loss and the backward outside the autocast)."""

    def __init__(self, model: nn.Module, inputs: tuple, opt: torch.optim.Optimizer, precision: str = "fp32",
                 device: torch.device | str = "cpu"):
        self.model, self.inputs, self.opt = model, inputs, opt
        self.precision, self.device = precision, device

    def run(self, mark: Callable[[str], None] = lambda phase: None) -> None:
        with precision_context(self.precision, self.device):
            outputs = self.model(*self.inputs)
        loss = training_loss(outputs)  # the outputs die here unless saved
        del outputs
        if not loss.requires_grad:
            raise ProfileError("the loss does not depend on any trainable parameter (no output "
                               "requires grad): nothing to train")
        mark("forward")
        loss.backward()
        mark("backward")
        self.opt.step()
        mark("optimizer")
        self.opt.zero_grad(set_to_none=True)
        del loss
        mark("zero_grad")


def _time_steps(step: _Step, dev: torch.device, repeats: int) -> list[tuple[float, float, float]]:
    """(step, forward, backward) seconds of ``repeats`` steps."""
    samples = []
    if dev.type == "cuda":
        for _ in range(repeats):
            events: dict[str, torch.cuda.Event] = {}

            def mark(phase: str, events: dict[str, torch.cuda.Event] = events) -> None:   # this step's
                events[phase] = torch.cuda.Event(enable_timing=True)
                events[phase].record()

            torch.cuda.synchronize(dev)
            mark("start")
            step.run(mark)
            events["zero_grad"].synchronize()
            s = events["start"]
            samples.append((s.elapsed_time(events["zero_grad"]) / 1e3,
                            s.elapsed_time(events["forward"]) / 1e3,
                            events["forward"].elapsed_time(events["backward"]) / 1e3))
        return samples
    for _ in range(repeats):
        stamps: dict[str, float] = {}

        def stamp(phase: str, stamps: dict[str, float] = stamps) -> None:   # this step's
            stamps[phase] = time.perf_counter()

        stamp("start")
        step.run(stamp)
        samples.append((stamps["zero_grad"] - stamps["start"],
                        stamps["forward"] - stamps["start"],
                        stamps["backward"] - stamps["forward"]))
    return samples


def _normalise(snapshot: Mapping[Any, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for key, value in snapshot.items():
        name = getattr(key, "value", key)
        if name == "Total":
            continue
        name = CATEGORY_NAMES.get(name, str(name).lower())
        out[name] = out.get(name, 0) + int(value)
    return out


def _tracked_step(step: _Step, dev: torch.device) -> dict[str, Any]:
    """One step under MemTracker: peak, breakdown at the peak, baseline, peak phase."""
    # local: a private torch.distributed tool, absent from builds without distributed support
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(step.model, step.opt,
                           *[t for t in tree_flatten(step.inputs)[0] if isinstance(t, torch.Tensor)])

    def total(kind: str) -> int:
        return int(tracker.get_tracker_snapshot(kind).get(dev, {}).get("Total", 0))

    phase_peak: dict[str, int] = {}
    saved: dict[str, int] = {}

    def mark(phase: str) -> None:
        phase_peak[phase] = total("peak")
        if phase == "forward":
            current = _normalise(tracker.get_tracker_snapshot("current").get(dev, {}))
            saved["activation"] = current.get("activation", 0)

    with tracker:
        baseline = total("current")
        step.run(mark)
    peak_snap = tracker.get_tracker_snapshot("peak").get(dev, {})
    peak = int(peak_snap.get("Total", 0))
    # the phase during which the running peak last rose
    where, before = None, baseline
    for phase in _PHASES:
        if phase_peak.get(phase, before) > before:
            where, before = phase, phase_peak[phase]
    return {"peak": peak, "breakdown": _normalise(peak_snap), "baseline": baseline,
            "phase": where, "saved": saved.get("activation")}


def _cuda_allocator_step(step: _Step, dev: torch.device) -> tuple[int, int]:
    """(peak held by the step, max_memory_allocated) from the CUDA caching allocator.

    ``peak = max_memory_allocated − memory_allocated before the step + the step's own resident
    bytes`` (parameters, buffers, optimizer state, inputs, each rounded to the allocator's
    512-byte blocks), i.e. the allocator's peak less whatever else the process keeps on the
    device — the same quantity MemTracker reports on CPU."""
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    resident = sum(math.ceil(b / _CUDA_BLOCK) * _CUDA_BLOCK for (d, _), b in
                   _storages(_held_tensors(step.model, step.opt, step.inputs)).items() if d == dev)
    step.run()
    torch.cuda.synchronize(dev)
    absolute = torch.cuda.max_memory_allocated(dev)
    return absolute - before + resident, absolute


def _profiler_peak(step: _Step) -> int | None:
    """Peak of one CPU step from the torch profiler's allocator events plus the resident bytes
    (parameters, buffers, optimizer state, inputs) summed by storage; None if the profiler's
    event API is not what this code expects."""
    resident = sum(b for (d, _), b in _storages(_held_tensors(step.model, step.opt, step.inputs)).items()
                   if d.type == "cpu")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step.run()
    try:
        events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
                  and str(e.device_type()).endswith("CPU")]
        events.sort(key=lambda e: e.start_ns())
        running = peak = 0
        for e in events:
            running += int(e.nbytes())
            peak = max(peak, running)
    except (AttributeError, TypeError):  # private API moved
        return None
    return resident + peak


def _to_device(inputs: tuple, dev: torch.device) -> tuple:
    """Tensors moved to ``dev`` with their dtype kept (token ids stay integer)."""
    moved = tree_map_only(torch.Tensor, lambda t: t.to(dev), tuple(inputs))
    return tuple(moved)


def measure_step(model: nn.Module, example_inputs: tuple, *, optimizer: str = DEFAULT_OPTIMIZER,
                 device: str = "cpu", repeats: int = 5, warmup: int = 2, memory: bool = True,
                 lr: float = 1e-3, crosscheck: bool = False, precision: str = "fp32") -> StepMeasurement:
    """Measure full training steps of ``model`` on ``example_inputs`` (positional, batch in dim 0).

    ``warmup`` untimed steps, ``repeats`` timed steps (medians), then — with ``memory`` — one
    step under MemTracker for the peak and its breakdown (on CUDA one more step first, whose
    peak comes from the caching allocator), and with ``crosscheck`` (CPU) one step under the
    torch profiler for :attr:`StepMeasurement.profiler_peak_bytes`.  ``precision``: ``fp32`` or
    ``bf16`` (the forward under autocast, as a bf16 graph runs).  See the module docstring for
    what is counted and for the side effects on ``model``.

    Raises :class:`ProfileError` for an unknown optimizer or precision, a device that is not ``cpu`` /
    available ``cuda``, ``repeats < 1`` or ``warmup < 0``, outputs without a floating-point
    tensor, or a loss that does not depend on any trainable parameter.
    """
    opt_name, precision = _checked_step_options(optimizer, repeats, warmup, precision)
    dev = _resolve_device(device)
    steady_malloc()   # the regime the profile and the executors share (tensoropt._malloc)
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)

    was_training = model.training
    step = _training_step(model, example_inputs, dev, opt_name, lr, precision)
    try:
        for _ in range(warmup):
            step.run()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        threads = torch.get_num_threads()
        samples = _time_steps(step, dev, repeats)
        figures = _step_memory(step, dev, memory, crosscheck)
    finally:
        step.opt.zero_grad(set_to_none=True)
        model.train(was_training)
    return _step_measurement(samples, figures, dev, opt_name, threads, precision)


def _checked_step_options(optimizer: str, repeats: int, warmup: int, precision: str) -> tuple[str, str]:
    """``(optimizer name, precision)`` checked: a :class:`ProfileError` for an unknown optimizer or
    precision, ``repeats < 1`` or ``warmup < 0``."""
    opt_name = str(optimizer).lower()
    if opt_name not in OPTIMIZERS:
        raise ProfileError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ProfileError(f"repeats must be a positive integer, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ProfileError(f"warmup must be a non-negative integer, got {warmup!r}")
    precision = check_precision(precision, ProfileError)
    if precision == Precision.BF16_PARAMS:
        raise ProfileError("a measured step runs the model as it is, under autocast for bf16; bf16-params (bfloat16 "
                           "copies of float32 masters) is FSDP2's, measured by running the exported plan: measure "
                           "in fp32 or bf16")
    return opt_name, precision


def _training_step(model: nn.Module, example_inputs: tuple | list, dev: torch.device, opt_name: str, lr: float,
                   precision: str) -> _Step:
    """``model`` on ``dev`` in training mode, its inputs moved there, a fresh optimizer over its
    trainable parameters and no gradients: the step to measure.  A :class:`ProfileError` when
    nothing is trainable."""
    model.to(dev)
    model.train()
    inputs = _to_device(tuple(example_inputs), dev)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise ProfileError(f"{type(model).__name__} has no trainable parameter: nothing to train")
    opt = make_optimizer(opt_name, trainable, lr=lr)
    for p in model.parameters():
        p.grad = None
    return _Step(model, inputs, opt, precision, dev)


@dataclass(frozen=True)
class _StepMemory:
    """The memory steps' figures: MemTracker's (``tracked``: peak — the allocator's on CUDA —,
    breakdown, baseline, phase, saved), the CUDA allocator's absolute peak, MemTracker's own
    peak and the torch profiler's (``None`` where not measured)."""
    tracked: dict[str, Any]
    absolute: int | None = None
    tracker_peak: int | None = None
    profiler_peak: int | None = None


def _step_memory(step: _Step, dev: torch.device, memory: bool, crosscheck: bool) -> _StepMemory:
    """With ``memory``, one step under MemTracker for the peak and its breakdown (on CUDA one
    more step first, whose peak comes from the caching allocator); with ``crosscheck`` (CPU) one
    step under the torch profiler."""
    mem: dict[str, Any] = {"peak": 0, "breakdown": {}, "baseline": 0, "phase": None,
                           "saved": None}
    absolute = tracker_peak = profiler_peak = None
    if memory:
        if dev.type == "cuda":
            allocator_peak, absolute = _cuda_allocator_step(step, dev)
        mem = _tracked_step(step, dev)
        tracker_peak = mem["peak"]
        if dev.type == "cuda":
            mem["peak"] = allocator_peak
    if crosscheck and dev.type == "cpu":
        profiler_peak = _profiler_peak(step)
    return _StepMemory(mem, absolute, tracker_peak, profiler_peak)


def _step_measurement(samples: list[tuple[float, float, float]], figures: _StepMemory, dev: torch.device,
                      opt_name: str, threads: int, precision: str) -> StepMeasurement:
    """The medians of the timed steps' (step, forward, backward) seconds with the memory figures."""
    mem = figures.tracked
    return StepMeasurement(
        time_s=statistics.median(s[0] for s in samples),
        times_s=tuple(s[0] for s in samples),
        forward_s=statistics.median(s[1] for s in samples),
        backward_s=statistics.median(s[2] for s in samples),
        peak_bytes=int(mem["peak"]),
        breakdown=mem["breakdown"],
        device=str(dev),
        optimizer=opt_name,
        threads=threads,
        baseline_bytes=int(mem["baseline"]),
        peak_phase=mem["phase"],
        saved_activation_bytes=mem["saved"],
        peak_absolute_bytes=figures.absolute,
        profiler_peak_bytes=figures.profiler_peak,
        tracker_peak_bytes=figures.tracker_peak,
        precision=precision,
    )
