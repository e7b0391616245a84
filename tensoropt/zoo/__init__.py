"""Model zoo: the models of the papers tensoropt follows, at their published shapes.

Each entry's ``build(**params)`` returns ``(model, example_inputs)``: a plain ``nn.Module``
(random weights) whose ``forward`` takes the example tensors positionally (batch in dim 0) and
returns one tensor.  :func:`build` adds defaults, the ``tiny`` variant used by tests, and
checking / coercion of user parameters (which may arrive as strings from ``zoo:NAME?k=v``)::

    model, inputs = build("gpt2", {"layers": "6", "batch": "4"})
"""

from __future__ import annotations

import difflib
import importlib.util
import types
from collections.abc import Mapping

import torch
from torch import nn

from . import amoebanet, deeplab, gnmt, hf, inception, llm, rnnlm, transformer, unet, vgg, vit, wide_resnet
from ._base import UnknownModelError, ZooDependencyError, ZooModel, ZooParamError

__all__ = ["ZOO", "UnknownModelError", "ZooDependencyError", "ZooModel", "ZooParamError",
           "build", "get", "resolve_params"]

ZOO: Mapping[str, ZooModel] = types.MappingProxyType({
    entry.name: entry
    for entry in sorted(
        (entry for family in (amoebanet, deeplab, gnmt, hf, inception, llm, rnnlm, transformer, unet,
                              vgg, vit, wide_resnet)
         for entry in family.ENTRIES),
        key=lambda entry: entry.name,
    )
})


def get(name: str) -> ZooModel:
    """The entry called ``name``; :class:`UnknownModelError` lists the names otherwise."""
    try:
        return ZOO[name]
    except KeyError:
        close = difflib.get_close_matches(name, ZOO, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise UnknownModelError(
            f"unknown zoo model {name!r}.{hint} Available: {', '.join(ZOO)}"
        ) from None


_TRUE = {"1", "true", "yes"}
_FALSE = {"0", "false", "no"}
_EXPECTED = {bool: "true/false (or 1/0, yes/no)", int: "an integer", float: "a number",
             str: "a string"}


def _convert(value: object, kind: type) -> object | None:
    """``value`` as ``kind``, or None if it is not one: strings are parsed, ints widen to float."""
    if isinstance(value, str) and kind is not str:
        text = value.strip().lower()
        if kind is bool:
            return True if text in _TRUE else False if text in _FALSE else None
        try:
            return kind(text)
        except ValueError:
            return None
    if kind is bool:
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):  # True is an int to Python, not to the zoo
        return None
    if kind is float and isinstance(value, int):
        return float(value)
    return value if isinstance(value, kind) else None


def _coerce(model: str, key: str, value: object, default: object) -> object:
    """``value`` for parameter ``key`` as the type of its default, else :class:`ZooParamError`."""
    kind = type(default)
    result = _convert(value, kind)
    if result is None:
        expected = _EXPECTED.get(kind, f"of type {kind.__name__}")
        raise ZooParamError(f"zoo model {model!r}: parameter {key!r} must be {expected}, "
                            f"got {value!r}")
    # Every integer parameter of the zoo is a size or a count.
    if kind is int and isinstance(result, int) and result < 1:
        raise ZooParamError(f"zoo model {model!r}: parameter {key!r} must be a positive "
                            f"integer, got {value!r}")
    return result


def resolve_params(name: str, params: Mapping[str, object] | None = None, *,
                   tiny: bool = False) -> dict[str, object]:
    """The parameters :func:`build` would use: defaults <- tiny variant (if ``tiny``) <- ``params``,
    each coerced to the type of its default.  Raises :class:`UnknownModelError` or
    :class:`ZooParamError`."""
    entry = get(name)
    defaults = entry.params()
    merged = dict(defaults)
    if tiny:
        merged.update(entry.tiny)
    for key, value in (params or {}).items():
        if key not in defaults:
            accepted = ", ".join(f"{k}={v!r}" for k, v in defaults.items())
            raise ZooParamError(f"zoo model {name!r} has no parameter {key!r}; "
                                f"accepted: {accepted}")
        merged[key] = _coerce(name, key, value, defaults[key])
    return merged


def build(name: str, params: Mapping[str, object] | None = None, *,
          tiny: bool = False) -> tuple[nn.Module, tuple]:
    """Build zoo model ``name`` with defaults <- its tiny variant (if ``tiny``) <- ``params``.

    Raises :class:`UnknownModelError`, :class:`ZooParamError` (unknown parameter, or a value of
    the wrong type or out of range) or :class:`ZooDependencyError` (``transformers`` missing).
    Weights are initialised from a fixed seed without touching the global RNG.
    """
    entry = get(name)
    merged = resolve_params(name, params, tiny=tiny)
    if entry.requires and importlib.util.find_spec(entry.requires) is None:
        raise ZooDependencyError(f"zoo model {name!r} needs the `{entry.requires}` package: "
                                 f"pip install -e .[zoo]")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        try:
            return entry.build(**merged)
        except ZooParamError as exc:  # a value the builder rejects, e.g. depth=42
            raise ZooParamError(f"zoo model {name!r}: {exc}") from None
