"""What an optimizer keeps: state per parameter and the temporaries of one step.

The rule every stage sizes optimizer memory by (the measured training step, the memory walk,
the placers and frontier tracking):

- **state** = α × the trainable parameters' bytes, α = 0 for SGD, 1 for momentum, 2 for Adam and
  AdamW (``exp_avg`` and ``exp_avg_sq``, each the parameter's size and dtype; the step counter is
  a scalar): :data:`OPTIMIZER_ALPHA`, :func:`optimizer_alpha`;
- **temporaries** of the step: :func:`optimizer_temp_bytes`.

Example::

    >>> optimizer_alpha("adamw"), optimizer_temp_bytes("adam", [400, 100]), optimizer_temp_bytes("adam", [400, 400])
    (2, 800, 1200)
"""

from __future__ import annotations

from .errors import ProfileError

OPTIMIZER_ALPHA = {"adamw": 2, "adam": 2, "momentum": 1, "sgd": 0}
#: the optimizer every stage assumes unless told otherwise: what people train with
DEFAULT_OPTIMIZER = "adamw"


def optimizer_alpha(optimizer: str | int) -> int:
    """α for an optimizer name (``adamw`` / ``adam`` / ``momentum`` / ``sgd``) or an explicit integer."""
    if isinstance(optimizer, int) and optimizer >= 0:
        return optimizer
    try:
        return OPTIMIZER_ALPHA[str(optimizer).lower()]
    except KeyError:
        raise ProfileError(f"unknown optimizer {optimizer!r}; use one of {', '.join(OPTIMIZER_ALPHA)} "
                           "or α as a non-negative integer") from None


def optimizer_temp_bytes(optimizer: str | int, param_bytes: list[int], *, foreach: bool = False) -> int:
    """Temporaries of one optimizer step over parameters of the given sizes.

    SGD and momentum update in place (none).  Adam and AdamW compute
    ``denom = (exp_avg_sq.sqrt() / c).add_(eps)`` before the in-place ``addcdiv_`` (AdamW's
    decoupled weight decay is an in-place ``mul_``).  The per-tensor implementation (CPU default)
    loops over the parameters in ``param_bytes``' order (the optimizer's): while parameter ``i``'s
    ``sqrt`` and its quotient exist, the previous parameter's ``denom`` still does (the loop's
    variable is rebound only after them) — the largest of ``bytes[i − 1] + 2 · bytes[i]``,
    measured on a Llama layer's three equal MLP weights (three of their size at once, not two).
    With ``foreach`` (CUDA default): one list the size of every parameter.  An integer α > 1 is
    treated as Adam-like.
    """
    name = optimizer if isinstance(optimizer, str) else ("adam" if optimizer >= 2 else "sgd")
    if name.lower() not in ("adam", "adamw") or not param_bytes:
        return 0
    if foreach:
        return sum(param_bytes)
    return max(prev + 2 * b for prev, b in zip([0, *param_bytes], param_bytes))
