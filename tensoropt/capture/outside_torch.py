"""Random numbers drawn outside torch while a model is captured: found, and refused.

torch.export records torch's random operators (``rand``, ``dropout``, ``bernoulli``) as operators:
every step draws anew.  A value drawn with numpy or Python's ``random`` inside ``forward`` is a
plain number or array when the graph is traced, so it enters the graph as a constant: every step
of every plan reuses that one draw, and a plan that shards the batch checks against a model that
draws afresh.  Hugging Face's WavLM draws SpecAugment's time mask with ``np.random`` in every
forward: it captured, both its two-device plans failed ``tensoropt run --check`` with the loss 88
times off, and the check named ``aten.log`` — not the cause.

Found while the model is exported: the global generators' states — numpy's legacy ``np.random``
and Python's ``random`` — are read before and after every module's ``forward`` (global module
hooks, which non-strict export runs), and every generator ``np.random.default_rng`` makes is
noted with the module that made it.  The innermost module that drew is named in one
:class:`RandomOutsideTorchError`.  Not seen: a generator made before capture and kept by the
model (``self.rng = np.random.default_rng(0)`` in ``__init__``) and names imported before
capture (``from numpy.random import default_rng``); such a draw is a captured constant, and a
plan's failed check then names it (:func:`tensoropt.execute.check.first_difference`).

>>> import numpy as np, torch
>>> class Mask(torch.nn.Module):
...     def forward(self, x):
...         return x * torch.from_numpy(np.random.rand(x.shape[-1]) < 0.5)
>>> model = torch.nn.Sequential(torch.nn.Identity(), Mask())
>>> with DrawsOutsideTorch(model) as draws:
...     _ = model(torch.ones(2, 3))
>>> draws.found
[('1', 'Mask', 'numpy')]
"""
from __future__ import annotations

import random
from types import TracebackType
from typing import Any

import numpy as np
import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from ..errors import CaptureError

__all__ = ["DrawsOutsideTorch", "RandomOutsideTorchError"]


class RandomOutsideTorchError(CaptureError):
    """The model draws random numbers outside torch in ``forward``: a capture would freeze one draw."""


def _states() -> tuple[Any, ...]:
    """What changes when numpy's legacy global generator or Python's ``random`` draws."""
    _, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return np.asarray(key).tobytes(), pos, has_gauss, gauss, random.getstate()


class DrawsOutsideTorch:
    """A context in which every module's ``forward`` that draws from numpy's or Python's global
    generator, or makes a ``np.random.default_rng``, is recorded in :attr:`found` as
    ``(path in model, class, numpy | random)``, innermost first; :meth:`refuse` raises for the first."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.paths = {id(m): p for p, m in model.named_modules()}
        self.found: list[tuple[str, str, str]] = []
        self._stack: list[tuple[torch.nn.Module, tuple[Any, ...], int]] = []
        self._made = 0      # generators default_rng made so far
        self._handles: list[Any] = []
        self._default_rng: Any = None

    def __enter__(self) -> DrawsOutsideTorch:
        self._handles = [register_module_forward_pre_hook(self._before), register_module_forward_hook(self._after)]
        self._default_rng = np.random.default_rng

        def default_rng(*args: Any, **kwargs: Any) -> np.random.Generator:
            self._made += 1
            return self._default_rng(*args, **kwargs)
        np.random.default_rng = default_rng
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        for h in self._handles:
            h.remove()
        np.random.default_rng = self._default_rng
        self._stack.clear()

    def _before(self, module: torch.nn.Module, args: Any) -> None:
        self._stack.append((module, _states(), self._made))

    def _after(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if not self._stack or self._stack[-1][0] is not module:
            return              # a hook registered inside forward, or a module called re-entrantly
        _, before, made = self._stack.pop()
        now = _states()
        if id(module) not in self.paths or (now == before and made == self._made):
            return
        which = "random" if now[:4] == before[:4] and made == self._made else "numpy"
        path = self.paths[id(module)]
        inner_found = any(p == path or p.startswith(f"{path}.") for p, _, _ in self.found) if path else self.found
        if not inner_found:     # an enclosing module's forward moved the state through this one's
            self.found.append((path, type(module).__name__, which))

    def refuse(self) -> None:
        """Raise :class:`RandomOutsideTorchError` for the first module found (nothing if none)."""
        if not self.found:
            return
        path, cls, which = self.found[0]
        lib = "numpy" if which == "numpy" else "Python's random"
        raise RandomOutsideTorchError(
            f"module {path or '<root>'!r} ({cls}) draws random numbers with {lib} in forward: the capture would "
            "freeze one draw into the graph as a constant, reused by every step of every plan, so plans would "
            "train wrong. Draw with torch instead (torch.rand / torch.bernoulli: the graph records them as "
            "operators), or switch the draw off for planning (SpecAugment: mask_time_prob=0 and "
            "mask_feature_prob=0 in the model's config)")
