"""Check a plan: one training step of the planned module against the unmodified model.

:func:`check_plan` is the whole check (what ``tensoropt run --check`` runs): the model and its
floating inputs copied in the check's dtype (float64 by default), the plan applied to one copy,
and :func:`compare_with_model` — one forward + backward of each side on the same inputs, then
the loss, every parameter gradient (by name) and every floating buffer after the step (batch
norm's running statistics) compared elementwise.  :func:`check_tensor` is the one tolerance
rule, shared by the distributed backend (:func:`tensoropt.distributed.verify.compare_distributed`).

**The check loss** (:func:`check_loss`) is ``Σ over floating outputs of (output.double() * W).sum()``
with ``W`` a fixed random tensor of the output's shape (``N(0, 1) / sqrt(numel)``, drawn from a
``torch.Generator`` seeded with ``CHECK_SEED + i`` for the ``i``-th floating output): independent
of the model, the same for both sides, O(rms of the output).  Unlike the training loss (the sum
of each output's *mean*), its gradient reaches every parameter: after a final LayerNorm an
output's mean is ~0 whatever the weights before it, so their mean-loss gradients are rounding
noise (a Whisper encoder: loss −8.4e-9 against a mean |output| of 0.88).  A model whose outputs
hold the loss it computed itself (an HF ``ModelOutput`` with ``loss`` set) may be checked with
``loss_fn`` instead (e.g. ``lambda out: out.loss``).

**Tolerances** (:data:`TOLERANCES`, by the reference tensor's dtype).  A tensor ``a`` of the plan
passes against the model's ``b`` when, elementwise (``torch.allclose`` semantics)::

    |a − b| ≤ atol + rtol·|b|,   atol = rtol·max|b| + group·G + tiny

- ``rtol``: float64 1e-9 (a correct plan differs by summation order only: ~1e-15 relative),
  float32 1e-4 (sums of thousands of float32 terms in another order: ~1e-6 relative, worse
  under cancellation), float16 / bfloat16 1e-2;
- ``rtol·max|b|``: an entry is judged against its own tensor's scale, so the small entries of
  a tensor (rounding noise there is the large entries' size × eps) do not false-fail;
- ``group·G`` (float64 1e-12, float32 1e-5, half 1e-3): ``G`` is the largest |entry| over
  the whole group — every gradient of the model for a gradient, every floating buffer for a
  buffer, ``Σ|terms|`` of the check loss for the loss.  A gradient that is zero in exact
  arithmetic (a conv bias before batch norm: the normalisation removes any constant shift) is
  the rounding noise of a sum of O(G) terms, on both sides, and differently so: its own
  ``max|b|`` is that noise and cannot be its scale.  Noise of such a sum of ``n`` terms is
  ~``eps·sqrt(n)·G`` (≈ 1e-14·G in float64, 2e-5·G in float32 for a 32×56×56 activation;
  measured: a conv bias before batch norm of a 4×14×14 activation 1.3e-16·G in float64, 1.2e-7·G
  in float32); a wrong plan moves
  gradients by far more than 1e-12·G (a shard scaled by 1.001 moves its gradients by 1e-3 of
  their own size), except in a layer whose gradients are all below ~1e-9·G;
- ``tiny`` (1e-30): two exact zeros pass.

**Mixed precision.**  A ``bf16`` graph's plan runs its forward under autocast
(:class:`~tensoropt.execute.PlannedModule`), and the reference runs under the same autocast
(:func:`_forward_reference`, :func:`tensoropt.capture.precision_context`): both compute the same
bfloat16 function, in float32 master weights — so the check runs in float32 (float64 is no
check of it: autocast leaves float64 alone), and every tensor is held to the bfloat16 tolerance
(rtol 1e-2, group 1e-3; :func:`tolerance_precision` is bfloat16).  Why these suffice and are
not looser: each side rounds every autocast op's output to bfloat16 (unit roundoff 2⁻⁸ ≈
3.9e-3), and a plan changes the shapes those ops run at (a batch shard, a channel piece, a
partial sum rounded before it is added), so the two sides differ by about one rounding per op
on the way — a few 1e-3 of a tensor's scale, which ``rtol·max|b|`` = 1e-2 of it covers, while a
wrong plan (a shard scaled, a piece missing, a gradient not summed) moves tensors by 1e-1 and
more of their scale.  A parameter's gradient is float32 but made by bfloat16 ops, so it takes
the bfloat16 tolerance too.

A gradient on one side only, a buffer missing on the plan, a shape mismatch or a NaN fails.
:class:`Comparison` lists every tensor (:class:`TensorCheck`), ``passed`` overall and ``worst``;
``describe()`` names the failing tensors.

Random ops run as they train — dropout, attention dropout, stochastic depth on: the plan draws
keyed masks (:mod:`tensoropt.execute.randomness`), piece by piece, and the reference runs under
:class:`~tensoropt.execute.randomness.KeyedRandomMode` with the same step seed, so both draw
the same mask for every element.  A model that draws random numbers the executor cannot key
(``randperm``, ``multinomial``) fails the check with their names.  The forward of each side is
:func:`_forward_reference` / :func:`_forward_planned`; both are called as the model was
captured (:class:`~tensoropt.capture.ModelCall`: keyword inputs, the output the loss reads).

Owns: the check loss, the one tolerance rule (:func:`check_tensor`) and running both sides of
a check.  Must not: rewrite graphs or place values (it calls :func:`~tensoropt.execute.apply_plan`),
nor loosen a tolerance for one model: every caller, the distributed backend included, uses
these rules.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from ..capture import capture
from ..capture.call import ModelCall
from ..capture.precision import AUTOCAST_DTYPES, device_types, precision_context, precision_of
from ..errors import ExecutionError
from ..graph import OpGraph, ParamKind, Precision
from ..measure.step import _float_tensors
from ..plan import NodeConfig, Plan
from .randomness import KeyedRandomMode
from .replicas import call_for_capture

__all__ = ["CHECK_SEED", "CHECK_DTYPES", "TOLERANCES", "Tolerance", "TensorCheck", "Comparison", "CheckDtypeError",
           "check_loss", "check_weights", "check_tensor", "group_scale", "merge_checks", "rel_diff",
           "compare_with_model", "check_plan", "prepare_check", "to_check_dtype", "retarget_plan", "step_checks",
           "tolerance_precision", "tolerance_for", "loss_of"]

#: the seed of the check loss's weights (output ``i`` draws from ``CHECK_SEED + i``)
CHECK_SEED = 1234
CHECK_DTYPES = ("float64", "float32")


class CheckDtypeError(ExecutionError):
    """The model cannot be checked in the asked dtype (its capture in float64 differs from the
    float32 one, or fails): check in float32 (``check_dtype="float32"``).  ``reason``: why,
    without the advice (what a caller that falls back to float32 by itself reports)."""

    def __init__(self, reason: str):
        super().__init__(f"{reason}; check in float32 (--check-dtype float32)")
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return type(self), (self.reason,)


# ------------------------------------------------------------------------------------ tolerances

#: ``max_rel``'s denominator is at least this × the group's ``G``: a gradient that is zero up to
#: rounding is reported against the gradients' scale, not its own noise (a report, not the rule)
REL_FLOOR = 1e-6


@dataclass(frozen=True)
class Tolerance:
    """``|a − b| ≤ atol + rtol·|b|`` with ``atol = rtol·max|b| + group·G + tiny`` (module docstring)."""

    rtol: float
    group: float
    tiny: float = 1e-30

    def atol(self, own_max: float, group_max: float) -> float:
        return self.rtol * own_max + self.group * group_max + self.tiny


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(rtol=1e-9, group=1e-12),
    torch.float32: Tolerance(rtol=1e-4, group=1e-5),
    torch.float16: Tolerance(rtol=1e-2, group=1e-3),
    torch.bfloat16: Tolerance(rtol=1e-2, group=1e-3),
}


def tolerance_for(dtype: torch.dtype, precision: torch.dtype | None = None) -> Tolerance:
    """The tolerance of a tensor of ``dtype`` computed through ``precision`` (the least precise
    floating dtype on its way, e.g. a float64 model that casts to float32 inside: the looser of
    the two)."""
    tol = TOLERANCES.get(dtype, TOLERANCES[torch.float32])
    if precision is not None:
        other = TOLERANCES.get(precision, TOLERANCES[torch.float32])
        if other.rtol > tol.rtol:
            return other
    return tol


def _parameter_dtype(graph: OpGraph) -> torch.dtype | None:
    """The most precise floating dtype of the graph's parameters (what the model is "in")."""
    dts = [getattr(torch, p.dtype) for p in graph.params.values() if p.dtype.startswith(("float", "bfloat"))]
    return min(dts, key=lambda d: torch.finfo(d).eps) if dts else None


def graph_precision(graph: OpGraph) -> torch.dtype | None:
    """The least precise floating dtype any node of ``graph`` computes in (``None``: none)."""
    dtypes = {t.dtype for n in graph.nodes.values() for t in n.outputs}
    floating = [getattr(torch, d) for d in dtypes if d.startswith(("float", "bfloat")) and hasattr(torch, d)]
    floating = [d for d in floating if d.is_floating_point]
    return max(floating, key=lambda d: torch.finfo(d).eps) if floating else None


# ------------------------------------------------------------------------------------ results

@dataclass(frozen=True)
class TensorCheck:
    """One compared tensor: ``kind`` ``loss`` / ``grad`` / ``buffer``, its ``name``, ``max_abs``
    (``max|a − b|``), ``max_rel`` (``max|a − b| / max(max|b|, REL_FLOOR·G)``), the ``atol`` / ``rtol`` it was held
    to, ``ratio`` (``max |a − b| / (atol + rtol·|b|)`` over its entries: ≤ 1 passes), ``note``
    (why it failed without a difference: missing, shape, NaN) and the check ``step``."""

    kind: str
    name: str
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    ratio: float
    passed: bool
    note: str = ""
    step: int = 0

    @property
    def label(self) -> str:
        what = "loss" if self.kind == "loss" else f"{self.kind} {self.name}"
        return f"step {self.step + 1}: {what}" if self.step else what

    def describe(self) -> str:
        if self.note:
            return f"{self.label}: {self.note}"
        return (f"{self.label}: max abs diff {self.max_abs:.3g}, max rel diff {self.max_rel:.3g} "
                f"(tolerance atol {self.atol:.3g} + rtol {self.rtol:.0e}·|ref|; {self.ratio:.3g}× of it)")


@dataclass(frozen=True)
class Comparison:
    """How far a planned step is from the model's own: one :class:`TensorCheck` per compared
    tensor (the loss, every parameter gradient, every floating buffer after the step; per step
    when several).  ``passed``: every one within tolerance.  ``worst``: the label of the one
    closest to (or furthest over) its tolerance.  ``loss`` / ``grads`` / ``buffers`` /
    ``max_rel_diff``: the ``max_rel`` values (:class:`TensorCheck`), for reports."""

    checks: tuple[TensorCheck, ...]
    dtype: str = ""
    loss_kind: str = "weighted"
    #: where a failed check's forward first parts from the model's (:func:`first_difference`)
    first_difference: str = ""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failures(self) -> list[TensorCheck]:
        return [c for c in self.checks if not c.passed]

    def _worst(self) -> TensorCheck:
        return max(self.checks, key=lambda c: (not c.passed, c.ratio if not math.isnan(c.ratio) else math.inf))

    @property
    def worst(self) -> str:
        return self._worst().label if self.checks else ""

    @property
    def max_rel_diff(self) -> float:
        return max((c.max_rel if c.passed or not c.note else math.inf for c in self.checks), default=0.0)

    @property
    def loss(self) -> float:
        return max((c.max_rel for c in self.checks if c.kind == "loss"), default=0.0)

    @property
    def grads(self) -> dict[str, float]:
        return self._by_name("grad")

    @property
    def buffers(self) -> dict[str, float]:
        return self._by_name("buffer")

    def _by_name(self, kind: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for c in self.checks:
            if c.kind == kind:
                v = c.max_rel if not c.note else math.inf
                out[c.name] = max(out.get(c.name, 0.0), v)
        return out

    def summary(self) -> str:
        """One line: PASSED / FAILED, what was compared, the largest relative difference and
        the tensor closest to (or furthest over) its tolerance."""
        if not self.checks:
            return "nothing to compare"
        n = {k: sum(c.kind == k for c in self.checks) for k in ("loss", "grad", "buffer")}
        steps = 1 + max(c.step for c in self.checks)
        what = (f"{'the check loss' if self.loss_kind == 'weighted' else 'the loss'}, {n['grad'] // steps} gradients "
                f"and {n['buffer'] // steps} buffers" + (f" over {steps} steps" if steps > 1 else "")
                + (f" in {self.dtype}" if self.dtype else ""))
        bad, w = self.failures, self._worst()
        head = (f"PASSED: {what} within tolerance" if not bad else
                f"FAILED: {len(bad)} of {len(self.checks)} tensors out of tolerance over {what}")
        big = max(self.checks, key=lambda c: c.max_rel if not math.isnan(c.max_rel) else math.inf)
        return (f"{head}; largest relative difference {self.max_rel_diff:.3g} ({big.label}); "
                f"{'worst' if bad else 'closest to its tolerance'}: {w.label} ({w.ratio:.3g}× of it)")

    def describe(self, limit: int | None = 20) -> str:
        """The summary line, then one line per failing tensor (worst first, at most ``limit``)."""
        lines = [self.summary()]
        if self.first_difference:
            lines.append("  " + self.first_difference)
        bad = sorted(self.failures, key=lambda c: -c.ratio if not math.isnan(c.ratio) else -math.inf)
        shown = bad if limit is None else bad[:limit]
        lines += ["  " + c.describe() for c in shown]
        if len(shown) < len(bad):
            lines.append(f"  … and {len(bad) - len(shown)} more")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


# ------------------------------------------------------------------------------------ the rule

def _cpu64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def group_scale(tensors: Iterable[torch.Tensor | None]) -> float:
    """The largest ``|entry|`` over ``tensors`` (the ``G`` of :class:`Tolerance`); NaNs ignored."""
    out = 0.0
    for t in tensors:
        if t is not None and t.numel() and t.is_floating_point():
            m = torch.nan_to_num(t.detach().abs(), nan=0.0, posinf=0.0).max().item()
            out = max(out, float(m))
    return out


def check_tensor(kind: str, name: str, a: torch.Tensor | None, b: torch.Tensor | None, *, group: float = 0.0,
                 tolerance: Tolerance | None = None, step: int = 0,
                 precision: torch.dtype | None = None) -> TensorCheck:
    """Compare the plan's ``a`` with the model's ``b`` (see the module docstring): within
    tolerance when every entry has ``|a − b| ≤ atol + rtol·|b|``.  ``group``: the ``G`` of the
    tensor's group (:func:`group_scale`).  ``tolerance``: by ``b``'s dtype unless given.  A
    ``None`` on one side only fails (``note`` says which); both ``None`` passes."""
    if a is None or b is None:
        if a is None and b is None:
            return TensorCheck(kind, name, 0.0, 0.0, 0.0, 0.0, 0.0, True, step=step)
        note = "the plan has none, the model has one" if a is None else "the plan has one, the model has none"
        return TensorCheck(kind, name, math.inf, math.inf, 0.0, 0.0, math.inf, False, note, step)
    tol = tolerance or tolerance_for(b.dtype, precision)
    if tuple(a.shape) != tuple(b.shape):
        return TensorCheck(kind, name, math.inf, math.inf, 0.0, tol.rtol, math.inf, False,
                           f"shape {tuple(a.shape)} on the plan, {tuple(b.shape)} on the model", step)
    a64, b64 = _cpu64(a), _cpu64(b)
    if a64.numel() == 0:
        return TensorCheck(kind, name, 0.0, 0.0, 0.0, tol.rtol, 0.0, True, step=step)
    diff = (a64 - b64).abs()
    bad_nan = bool(torch.isnan(diff).any())
    own = float(b64.abs().max()) if not torch.isnan(b64).any() else math.nan
    atol = tol.atol(own if not math.isnan(own) else 0.0, group)
    allowed = atol + tol.rtol * b64.abs()
    ratio = float((diff / allowed).max()) if not bad_nan else math.nan
    max_abs = float(diff.max()) if not bad_nan else math.nan
    scale = max(own if not math.isnan(own) else 0.0, REL_FLOOR * group)
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    passed = not bad_nan and ratio <= 1.0
    note = "NaN on the plan or the model" if bad_nan else ""
    return TensorCheck(kind, name, max_abs, max_rel, atol, tol.rtol, ratio, passed, note, step)


def merge_checks(parts: Iterable[TensorCheck]) -> list[TensorCheck]:
    """One check per (step, kind, name) from several partial ones (pieces of a tensor compared
    on different ranks): the worst ratio's, failed if any failed."""
    out: dict[tuple, TensorCheck] = {}
    for c in parts:
        key = (c.step, c.kind, c.name)
        old = out.get(key)
        if old is None:
            out[key] = c
            continue
        worse = c if _badness(c) > _badness(old) else old
        out[key] = replace(worse, passed=old.passed and c.passed, max_abs=max(old.max_abs, c.max_abs),
                           max_rel=max(old.max_rel, c.max_rel))
    return list(out.values())


def _badness(c: TensorCheck) -> tuple:
    return (not c.passed, math.inf if math.isnan(c.ratio) else c.ratio)


def rel_diff(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    """``max|a − b| / max(max|b|, floor)`` (absolute when both are 0): a report's number, not a
    pass / fail rule (that is :func:`check_tensor`)."""
    a, b = _cpu64(a), _cpu64(b)
    scale = max(b.abs().max().item() if b.numel() else 0.0, floor)
    err = (a - b).abs().max().item() if b.numel() else 0.0
    return err / scale if scale > 0 else err


# ------------------------------------------------------------------------------------ the loss

@functools.lru_cache(maxsize=64)
def _weights_cpu(shape: tuple[int, ...], index: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(CHECK_SEED + index)
    numel = math.prod(shape)
    return torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(max(numel, 1))


def check_weights(shape: Sequence[int], index: int = 0, device: Any = "cpu") -> torch.Tensor:
    """The check loss's weights ``W`` of the ``index``-th floating output, of ``shape`` (float64,
    ``N(0, 1) / sqrt(numel)``, seeded by ``CHECK_SEED + index``: the same for any model)."""
    w = _weights_cpu(tuple(int(s) for s in shape), int(index))
    return w if torch.device(device).type == "cpu" else w.to(device)


def check_term(part: torch.Tensor, full_shape: Sequence[int], index: int, dim: int | None = None, k: int = 1,
               piece: int = 0) -> torch.Tensor:
    """One part's share of :func:`check_loss`: ``Σ part · W`` with ``W`` the weights of the
    ``index``-th floating output (whole shape ``full_shape``) cut to piece ``piece`` of ``k``
    along ``dim`` (``None``: the whole, for a replica or a partial sum).  The distributed backend
    computes the check loss as these terms, where the output's parts lie."""
    w = check_weights(full_shape, index, part.device)
    if dim is not None and k > 1:
        w = torch.tensor_split(w, k, dim)[piece]
    return (part.double() * w).sum()


def _floating_outputs(outputs: Any) -> list[torch.Tensor]:
    return list(_float_tensors(outputs))


def check_loss(outputs: Any) -> tuple[torch.Tensor, float]:
    """``(Σ_i (out_i.double() * W_i).sum(), Σ_i Σ |out_i * W_i|)``: the check loss (float64) of
    the floating tensors in ``outputs`` (any nesting of tuples, lists, dicts, dataclasses, as
    :func:`~tensoropt.measure.step.training_loss`) and the size of its terms (its tolerance's
    ``G``; the tolerance is the least precise output's: :func:`loss_of`).  Raises
    :class:`ExecutionError` when there is no floating output."""
    outs = _floating_outputs(outputs)
    if not outs:
        raise ExecutionError("the model's outputs hold no floating-point tensor to check "
                             f"(got {type(outputs).__name__})")
    loss: torch.Tensor | None = None
    scale = 0.0
    for i, t in enumerate(outs):
        w = check_weights(t.shape, i, t.device)
        term = t.double() * w
        scale += float(term.detach().abs().sum())
        s = term.sum()
        loss = s if loss is None else loss + s.to(loss.device)
    assert loss is not None   # outs is not empty
    return loss, scale


# ------------------------------------------------------------------------------------ one step

def _call(example_inputs: Any, captured: ModelCall | None = None) -> ModelCall:
    """The inputs as a :class:`~tensoropt.capture.ModelCall`, with the output choice of
    ``captured`` (the ModelCall a graph was captured with) unless they name one."""
    call = ModelCall.of(example_inputs)
    output = getattr(captured, "output", None)
    return ModelCall.of(call, output) if output is not None and call.output is None else call


def step_seed(step: int) -> int:
    """The seed of the keyed random draws of the check's ``step``-th step (both sides)."""
    return CHECK_SEED * 7919 + step


def _forward_reference(reference: nn.Module, call: ModelCall, seed: int, precision: str = "fp32") -> Any:
    """The model's side of the check (the one place it runs): its random draws keyed, under the
    autocast of ``precision`` (the plan's graph's: :func:`tensoropt.capture.precision_context`)."""
    where = device_types([*reference.parameters(), *call.tensors_for(reference)])
    with KeyedRandomMode(seed) as mode, precision_context(precision, where):
        out = call.run(reference)
    if mode.unkeyed:
        raise ExecutionError(f"the model draws random numbers with {', '.join(sorted(set(mode.unkeyed)))}, which "
                             "tensoropt cannot draw piece by piece; a check cannot match them (run without --check, "
                             "or replace that op)")
    return out


def _forward_planned(planned: nn.Module, call: ModelCall, seed: int) -> Any:
    """The plan's side of the check (the one place it runs): its keyed draws seeded as the model's."""
    if hasattr(planned, "seed"):
        # torch types Module.__setattr__'s value as Tensor | Module; an int attribute is fine
        planned.seed = seed  # type: ignore[assignment]
    try:
        return planned(*call.args, **call.kwargs)
    finally:
        if hasattr(planned, "seed"):
            planned.seed = None  # type: ignore[assignment]


def loss_of(outputs: Any, loss_fn: Callable[[Any], torch.Tensor] | None) -> tuple[torch.Tensor, float, Tolerance]:
    """(loss, its tolerance's ``G``, its tolerance): without ``loss_fn`` the check loss
    (:func:`check_loss`), summed in float64 from the outputs but held to the tolerance of the
    least precise floating output (a float32 model's check loss is a float64 sum of float32
    values: float32's tolerance); with it, ``loss_fn(outputs)`` at its own dtype's.  Both
    backends' checks take the loss's tolerance from here."""
    if loss_fn is None:
        loss, scale = check_loss(outputs)
        tols = [tolerance_for(t.dtype) for t in _floating_outputs(outputs)]
        return loss, scale, max(tols, key=lambda t: t.rtol)
    loss = loss_fn(outputs)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        raise ExecutionError(f"loss_fn must return a floating scalar tensor, got {type(loss).__name__}"
                             + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else ""))
    return loss.reshape(()), float(loss.detach().abs()), tolerance_for(loss.dtype)


def step_checks(ref_loss: torch.Tensor, loss: torch.Tensor | None, loss_scale: float,
                ref_grads: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor | None],
                ref_buffers: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor], *,
                grad_scale: float | None = None, buffer_scale: float | None = None, step: int = 0,
                missing_grads: bool = True, loss_tolerance: Tolerance | None = None,
                precision: torch.dtype | None = None) -> list[TensorCheck]:
    """The checks of one step: the loss (``None``: not compared here), every gradient named in
    ``grads`` or (with ``missing_grads``) in ``ref_grads``, every floating buffer of
    ``buffers`` (a reference buffer the plan lacks fails).  ``grad_scale`` / ``buffer_scale``:
    the groups' ``G`` (default: over ``ref_grads`` / the floating ``ref_buffers``).
    ``loss_tolerance``: by ``ref_loss``'s dtype unless given.  ``precision``: the least precise
    floating dtype the model computes in (:func:`graph_precision`), which loosens every tolerance
    to its own."""
    if grad_scale is None:
        grad_scale = group_scale(ref_grads.values())
    if buffer_scale is None:
        buffer_scale = group_scale(v for v in ref_buffers.values() if v.is_floating_point())
    out = []
    if loss is not None:
        if loss_tolerance is not None and precision is not None:
            loss_tolerance = max(loss_tolerance, tolerance_for(precision), key=lambda t: t.rtol)
        out.append(check_tensor("loss", "loss", loss, ref_loss, group=loss_scale, tolerance=loss_tolerance,
                                precision=precision,
                                step=step))
    names = list(grads) + ([k for k in ref_grads if k not in grads] if missing_grads else [])
    for k in names:
        out.append(check_tensor("grad", k, grads.get(k), ref_grads.get(k), group=grad_scale, step=step,
                                precision=precision))
    for k, v in buffers.items():
        if v.is_floating_point():
            out.append(check_tensor("buffer", k, v, ref_buffers.get(k), group=buffer_scale, step=step,
                                    precision=precision))
    return out


def compare_with_model(reference: nn.Module, planned: nn.Module, example_inputs: Any, *,
                       loss_fn: Callable[[Any], torch.Tensor] | None = None, steps: int = 1,
                       lr: float = 0.1, precision: torch.dtype | None = None) -> Comparison:
    """One forward + loss + backward of ``reference`` (an unmodified copy of the model, e.g.
    ``copy.deepcopy(model)`` taken before :func:`~tensoropt.execute.apply_plan`) and of
    ``planned`` on the same inputs; the loss, every gradient (matched by name) and every floating
    buffer after the step compared by :func:`check_tensor`.  The loss is :func:`check_loss`
    unless ``loss_fn(outputs)`` gives one.  ``steps`` > 1: after each compared step both take
    the same SGD step of ``lr`` and the next step is compared too.  Both are left with the last
    step's gradients and updated buffers.  ``example_inputs``: a tuple, a dict of keyword inputs
    or a :class:`~tensoropt.capture.ModelCall`.  Random ops are on, drawn keyed on both sides
    (module docstring).  ``precision``: the least precise floating dtype the model computes in,
    when below its parameters' (:func:`graph_precision`; it loosens the tolerances to its own).
    A planned module that runs under autocast (``planned.precision == "bf16"``,
    :class:`~tensoropt.execute.PlannedModule`) has the reference run under the same autocast,
    and ``precision`` defaults to its dtype (module docstring, "Mixed precision")."""
    if steps < 1:
        raise ExecutionError(f"a check compares at least one step, got steps={steps}")
    call = _call(example_inputs, getattr(planned, "_call", None))
    mixed = precision_of(getattr(planned, "precision", None))
    if precision is None and mixed != Precision.FP32:
        precision = AUTOCAST_DTYPES[mixed]
    checks: list[TensorCheck] = []
    dtype = ""
    for step in range(steps):
        if step:
            for m in (reference, planned):
                with torch.no_grad():
                    for p in m.parameters():
                        if p.grad is not None:
                            p.add_(p.grad.to(p.device), alpha=-lr)
        reference.zero_grad(set_to_none=True)
        ref_loss, scale, loss_tol = loss_of(_forward_reference(reference, call, step_seed(step), mixed), loss_fn)
        ref_loss.backward()
        ref_grads = {k: p.grad for k, p in reference.named_parameters() if p.grad is not None}
        ref_buffers = dict(reference.named_buffers())
        dtype = dtype or next((str(p.dtype).removeprefix("torch.") for p in reference.parameters()), "")

        planned.zero_grad(set_to_none=True)
        loss, _, _ = loss_of(_forward_planned(planned, call, step_seed(step)), loss_fn)
        loss.backward()
        grads = {k: p.grad for k, p in planned.named_parameters() if p.grad is not None or k in ref_grads}
        checks += step_checks(ref_loss, loss, scale, ref_grads, grads, ref_buffers, dict(planned.named_buffers()),
                              step=step, loss_tolerance=loss_tol, precision=precision)
    return Comparison(tuple(checks), dtype, "weighted" if loss_fn is None else "loss_fn")


# ------------------------------------------------------------------------------------ a plan

def to_check_dtype(model: nn.Module, inputs: Any, check_dtype: str) -> tuple[nn.Module, ModelCall]:
    """A deep copy of ``model`` and the inputs (a :class:`~tensoropt.capture.ModelCall`) with
    every floating tensor in ``check_dtype`` (``float32``: as they are)."""
    if check_dtype not in CHECK_DTYPES:
        raise ExecutionError(f"check_dtype must be one of {', '.join(CHECK_DTYPES)}, got {check_dtype!r}")
    call = _call(inputs)
    model = copy.deepcopy(model)
    if check_dtype == "float32":
        return model, call
    dt = getattr(torch, check_dtype)
    return model.to(dt), call.to(dt)


def _structure(graph: OpGraph) -> dict[str, Any]:
    """What the fingerprint covers (:attr:`OpGraph.fingerprint`) with every floating dtype one."""
    def dt(d: str) -> str:
        return "floating" if d.startswith(("float", "bfloat")) else d

    return {
        "nodes": [[n.name, n.op, n.kind, list(n.inputs), [[list(t.shape), dt(t.dtype)] for t in n.outputs],
                   list(n.params), list(n.param_reads)] for n in graph.nodes.values()],
        "params": [[p.name, list(p.shape), dt(p.dtype), p.kind] for p in graph.params.values()],
    }


def retarget_plan(plan: Plan, graph: OpGraph, other: OpGraph) -> Plan:
    """``plan`` (checked against ``graph``) for ``other``, a capture of the same model in another
    floating dtype: the same plan with ``other``'s fingerprint, after checking that the two
    graphs are the same but for floating dtypes (node for node: names, operators, wiring,
    shapes, parameters).  Raises :class:`CheckDtypeError` naming the first difference."""
    plan.check(graph)
    if other.fingerprint == graph.fingerprint:
        return plan
    a, b = _structure(graph), _structure(other)
    if a != b:
        for key in ("nodes", "params"):
            if len(a[key]) != len(b[key]):
                raise CheckDtypeError(f"the model captured in {_dtype_name(other)} has {len(b[key])} {key}, "
                                      f"in {_dtype_name(graph)} {len(a[key])}: it cannot be checked in another "
                                      "dtype than its own")
            for x, y in zip(a[key], b[key]):
                if x != y:
                    raise CheckDtypeError(f"the model captured in {_dtype_name(other)} differs from its "
                                          f"{_dtype_name(graph)} capture at {key[:-1]} {x[0]!r} ({y} vs {x}): it "
                                          "cannot be checked in another dtype than its own")
    d = plan.to_dict()
    d["graph_fingerprint"] = other.fingerprint
    out = Plan.from_dict(d)
    out.check(other)
    return out


def _dtype_name(graph: OpGraph) -> str:
    dts = sorted({p.dtype for p in graph.params.values() if p.dtype.startswith(("float", "bfloat"))})
    return "/".join(dts) or "its dtype"


def _sides(model: nn.Module, inputs: Any, plan: Plan, graph: OpGraph,
           device_map: Mapping[str, Any] | None) -> tuple[nn.Module, nn.Module]:
    """(reference, planned) for a check: an unmodified copy of ``model`` and the plan applied to
    ``model`` itself, random ops on in both (drawn keyed: the module docstring)."""
    # local: planned → rewrite → check (a cycle at import time)
    from .planned import apply_plan

    reference = copy.deepcopy(model)
    planned = apply_plan(model, _call(inputs).args, plan, device_map=device_map, graph=graph)
    return reference, planned


def prepare_check(model: nn.Module, inputs: Any, plan: Plan, graph: OpGraph | None = None,
                  check_dtype: str = "float64") -> tuple[nn.Module, ModelCall, Plan, OpGraph]:
    """``(model, call, plan, graph)`` to check ``plan`` in ``check_dtype``: a deep copy of
    ``model`` and the inputs (as a :class:`~tensoropt.capture.ModelCall`) in that dtype
    (:func:`to_check_dtype`), their torch.export capture and the plan for it
    (:func:`retarget_plan`); ``float32``: copies as captured, ``graph`` and ``plan`` as given.
    ``graph``: the capture the plan was made for (made here otherwise); a plan that does not fit
    it is a :class:`~tensoropt.plan.PlanError`, a model whose capture in ``check_dtype`` fails
    or differs a :class:`CheckDtypeError` — as is ``float64`` for a ``bf16`` graph (autocast
    leaves float64 alone: such a copy would not compute what the plan does)."""
    call = _call(inputs, getattr(graph, "call", None))
    if graph is None:
        graph = capture(model, call_for_capture(call, plan), method="export")
    plan.check(graph)
    if check_dtype == "float64" and precision_of(graph) != Precision.FP32:
        raise CheckDtypeError(f"the graph trains in {precision_of(graph)} under autocast, which leaves float64 alone: "
                              "a float64 copy would not compute what the plan computes")
    m, x = to_check_dtype(model, call, check_dtype)
    if check_dtype == "float32":
        return m, x, plan, graph
    try:
        g = capture(m, call_for_capture(x, plan, graph.batch_dim), name=graph.name, method="export")
    except Exception as e:  # noqa: BLE001 - any failure of the float64 capture: say which dtype to use
        first = str(e).splitlines()[0] if str(e) else ""
        raise CheckDtypeError(f"the model cannot be captured in {check_dtype} ({type(e).__name__}: {first})") from e
    return m, x, retarget_plan(plan, graph, g), g


def check_plan(model: nn.Module, inputs: Any, plan: Plan, graph: OpGraph | None = None, check_dtype: str = "float64",
               device_map: Mapping[str, Any] | None = None, steps: int = 1, *,
               loss_fn: Callable[[Any], torch.Tensor] | None = None, lr: float = 0.1) -> Comparison:
    """Check ``plan`` on ``model`` (left untouched: the check runs on copies) with ``inputs``
    (the example inputs the plan's graph was captured with: a tuple, a dict of keyword inputs or
    a :class:`~tensoropt.capture.ModelCall`).  ``graph``: that capture (made
    here otherwise), which the plan must fit (:class:`~tensoropt.plan.PlanError`).

    ``check_dtype``: ``"float64"`` (default) — the model and its floating inputs converted to
    float64 and captured again with torch.export.  A plan's fingerprint covers dtypes, so the
    plan is re-targeted to the float64 capture once that capture is shown to be the float32 one
    node for node but for dtypes (:func:`retarget_plan`; a model whose float64 capture differs,
    or fails, raises :class:`CheckDtypeError`: check it in float32).  ``"float32"``: the model as
    captured.  A ``bf16`` graph is checked in float32 with both sides under its autocast (module
    docstring, "Mixed precision").  ``device_map``, ``steps``, ``loss_fn``, ``lr``: as
    :func:`~tensoropt.execute.apply_plan` / :func:`compare_with_model`.  Returns the :class:`Comparison`
    (``.passed``; ``print`` it)."""
    m, x, p, g = prepare_check(model, inputs, plan, graph, check_dtype)
    reference, planned = _sides(m, x, p, g, device_map)
    precision = tolerance_precision(g)
    cmp = compare_with_model(reference, planned, x, loss_fn=loss_fn, steps=steps, lr=lr, precision=precision)
    dtype = check_dtype if check_dtype != "float32" else cmp.dtype
    if precision_of(g) != Precision.FP32:
        dtype += f" under {precision_of(g)} autocast ({str(precision).removeprefix('torch.')} tolerance)"
    elif precision is not None and str(precision).removeprefix("torch.") != dtype:
        dtype += f" (the model computes in {str(precision).removeprefix('torch.')} in places: its tolerance)"
    if not cmp.passed:   # on fresh copies: the check's step has moved the buffers of these
        m, x, p, g = prepare_check(model, inputs, plan, graph, check_dtype)
        cmp = replace(cmp, first_difference=first_difference(m, x, p, g, device_map, precision=precision))
    return replace(cmp, dtype=dtype)


def first_difference(model: nn.Module, inputs: Any, plan: Plan, graph: OpGraph,
                     device_map: Mapping[str, Any] | None = None, *, precision: torch.dtype | None = None) -> str:
    """Where ``plan``'s forward first parts from the model's: one forward of the model's own
    operators (every one whole on the plan's first device) and one of the plan, each keeping
    every operator's whole output (:func:`~tensoropt.execute.apply_plan` with ``probe``), the
    same keyed random draws on both; the first operator in the plan's order whose output is out
    of the check's tolerance (:func:`check_tensor`), named with its op and module, or a sentence
    saying every forward output agrees (the difference is in the backward or the gradient
    sums).  ``model`` is used as it is: pass a copy.  Two forwards, O(V) comparisons."""
    from .planned import apply_plan, resolve_device_map  # local: planned → rewrite → check (a cycle at import time)

    call = _call(inputs, getattr(graph, "call", None))
    first = plan.devices[0]
    whole = Plan({name: NodeConfig((first,)) for name in plan.configs}, graph_fingerprint=graph.fingerprint,
                 order=list(plan.order), algorithm="whole")
    dmap = resolve_device_map(plan, device_map)
    ref = apply_plan(copy.deepcopy(model), call.args, whole, device_map={first: dmap[first]}, graph=graph, probe=True)
    got = apply_plan(model, call.args, plan, device_map=dmap, graph=graph, probe=True)
    with torch.no_grad():
        for side in (ref, got):
            side.seed = step_seed(0)
            side(*call.args, **call.kwargs)
    for name in got.probes:
        if name not in ref.probed:
            continue
        c = check_tensor("output", name, got.probed[name], ref.probed[name], precision=precision)
        if not c.passed:
            node = graph.nodes[name]
            cfg = plan.configs[name]
            frozen = constants_upstream(graph, name)
            return (f"first operator whose output differs: {name} ({node.op}, in {_where(graph, name)}; planned "
                    f"{cfg.layout} over {cfg.degree} device(s)) — {c.describe()}"
                    + (f"; it is downstream of {_frozen(graph, frozen)}" if frozen else ""))
    return (f"every operator's forward output agrees with the model's captured graph ({len(got.probes)} compared): "
            "the difference arises in the backward or in the gradients' sums" + frozen_clause(graph))


def frozen_clause(graph: OpGraph) -> str:
    """What a check whose planned forward agrees with the capture adds where the graph reads
    constants the capture froze (:func:`constants_upstream`): the model may compute them anew;
    ``""`` where it reads none."""
    frozen = constants_upstream(graph)
    return (f" — or in the model itself computing anew what its capture froze: its forward reads "
            f"{_frozen(graph, frozen)}" if frozen else "")


def constants_upstream(graph: OpGraph, name: str | None = None) -> list[str]:
    """The constants the capture lifted (:attr:`~tensoropt.graph.ParamKind.CONSTANT`) that
    operator ``name`` reads, or one before it reads (``None``: that any operator reads): values
    frozen at capture, which every step replays.  O(V + E)."""
    import networkx as nx

    upstream = None if name is None else {name, *nx.ancestors(graph.nx, name)}
    return [p.name for p in graph.params.values() if p.kind == ParamKind.CONSTANT
            and any(r is not None and (upstream is None or r in upstream) for r in (p.owner, *p.readers))]


def _where(graph: OpGraph, name: str) -> str:
    node = graph.nodes[name]
    return f"module {node.module_path} ({node.module_type})" if node.module_path else "the model's forward"


def _frozen(graph: OpGraph, constants: Sequence[str]) -> str:
    """The sentence of :func:`first_difference` for ``constants`` (:func:`constants_upstream`)."""
    first = graph.params[constants[0]]
    reader = first.owner or (first.readers[0] if first.readers else None)
    by = f", read by {reader} ({graph.nodes[reader].op}, in {_where(graph, reader)})" if reader else ""
    more = f" and {len(constants) - 1} more" if len(constants) > 1 else ""
    return (f"the captured constant {first.name}{by}{more}: a value frozen at capture, which every step of a plan "
            "replays — where the model makes it anew in each forward (a draw with numpy or Python's random, "
            "from a generator it keeps), the plan cannot compute what the model does; make it a buffer, draw it "
            "with torch, or turn the draw off")


def tolerance_precision(graph: OpGraph) -> torch.dtype | None:
    """The dtype whose tolerance a check of ``graph`` is held to where it is coarser than the
    parameters' (``None``: theirs): the least precise floating dtype any node computes in — a
    float64 twin that casts to float32 inside (an explicit ``.to(torch.float32)``) computes those
    parts in float32 on both sides; a ``bf16`` graph computes in bfloat16 (autocast)."""
    lowest, own = graph_precision(graph), _parameter_dtype(graph)
    mixed = precision_of(graph)
    if mixed != Precision.FP32:
        lowest = max((d for d in (lowest, AUTOCAST_DTYPES[mixed]) if d is not None), key=lambda d: torch.finfo(d).eps)
    return lowest if lowest is not None and own is not None and \
        torch.finfo(lowest).eps > torch.finfo(own).eps else None
