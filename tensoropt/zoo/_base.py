"""The zoo's building blocks: :class:`ZooModel`, its errors, and helpers shared by the families.

It owns what a zoo entry is (a factory, its defaults and tiny settings, the inputs it builds)
and the errors a bad parameter raises; it must not register models (:mod:`tensoropt.zoo` does).

Example::

    >>> batch = 0
    >>> check(batch > 0, "batch must be positive")
    Traceback (most recent call last):
    tensoropt.zoo._base.ZooParamError: batch must be positive
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch


class UnknownModelError(ValueError):
    """No zoo model has the requested name."""


class ZooParamError(ValueError):
    """A zoo model was given a parameter it does not have, or a value it cannot use."""


class ZooDependencyError(ImportError):
    """A zoo model needs an optional package that is not installed."""


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: how to build it and where its default shapes come from."""

    name: str
    description: str
    build: Callable[..., tuple[torch.nn.Module, tuple]]
    tiny: Mapping[str, object]
    source: str
    requires: str | None = None

    def params(self) -> dict[str, object]:
        """The default parameters, read from ``build``'s signature."""
        return {
            name: p.default
            for name, p in inspect.signature(self.build).parameters.items()
            if p.default is not inspect.Parameter.empty
        }


def check(condition: bool, message: str) -> None:
    """Raise :class:`ZooParamError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ZooParamError(message)


def generator() -> torch.Generator:
    """A fresh local generator, so example inputs never touch the global RNG."""
    return torch.Generator().manual_seed(0)


def images(batch: int, image_size: int, channels: int = 3) -> tuple[torch.Tensor]:
    """Random ``(batch, channels, image_size, image_size)`` images."""
    return (torch.randn(batch, channels, image_size, image_size, generator=generator()),)


def tokens(batch: int, seq_len: int, vocab: int, count: int = 1) -> tuple[torch.Tensor, ...]:
    """``count`` random ``(batch, seq_len)`` token-id tensors with ids in ``[0, vocab)``."""
    g = generator()
    return tuple(torch.randint(0, vocab, (batch, seq_len), generator=g) for _ in range(count))


def scaled(channels: int, width: float) -> int:
    """``channels`` times a width multiplier, at least 1."""
    return max(1, int(channels * width))


def on_meta(meta: bool) -> contextlib.AbstractContextManager:
    """``torch.device("meta")`` when ``meta``, else nothing: what a builder builds under it, weights
    and example inputs alike, has shapes and dtypes but no storage (an 8B model costs no memory).
    Random draws made under it (:func:`tokens`, :func:`images`) are meta tensors too."""
    return torch.device("meta") if meta else contextlib.nullcontext()
