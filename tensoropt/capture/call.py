"""How a model is called and which of its outputs the loss reads: the call as the user writes it.

People call models with keyword inputs (``input_ids=…, attention_mask=…``), wrap them in
``forward(self, *args)`` or ``forward(self, x, **kwargs)``, and get back tuples, dicts or Hugging
Face ``ModelOutput`` objects.  The capture needs one flat list of input tensors and one output
tensor (or a tuple of them); every stage that calls the *eager* model (the check's reference,
step measurements, ``tensoropt run``) must call it the same way and read the same output.
:class:`ModelCall` is that one place.

- Inputs: a tensor, a tuple / list of positional inputs, or a dict of keyword inputs.  Tensors
  become the captured graph's inputs, in the order the model's signature binds them; other values
  (``use_cache=False``, ``None``) are fixed at capture time.
- Output: ``output`` names the tensor the loss reads — a key of a dict / ``ModelOutput``
  (``"logits"``) or an index into a tuple.  By default a tensor or a tuple / list of tensors is
  kept as it is, and from a dict / ``ModelOutput`` the first present of ``"loss"``, ``"logits"``,
  ``"last_hidden_state"`` is taken, else its first floating-point tensor.

Example::

    call = ModelCall.of({"input_ids": ids, "attention_mask": mask}, output="logits")
    logits = call.run(model)                    # model(input_ids=ids, attention_mask=mask).logits
    wrapper, flat = call.capturable(model)      # what torch.export sees: wrapper(*flat) == logits
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import CaptureError

#: the keys taken from a dict / ModelOutput when no ``output`` is named, first present wins
DEFAULT_OUTPUT_KEYS = ("loss", "logits", "last_hidden_state")


@dataclass
class ModelCall:
    """Example inputs of a model (positional ``args`` and keyword ``kwargs``) and the output the
    loss reads (``output``: a key, an index, or ``None`` for the default rule above)."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    output: str | int | None = None

    @classmethod
    def of(cls, example_inputs: Any, output: str | int | None = None) -> ModelCall:
        """A call from what users pass: a tensor, a tuple / list, a dict (keyword inputs) or a
        :class:`ModelCall` (returned as it is unless ``output`` is given)."""
        if isinstance(example_inputs, ModelCall):
            if output is None:
                return example_inputs
            return cls(example_inputs.args, dict(example_inputs.kwargs), output)
        if isinstance(example_inputs, dict):
            return cls((), dict(example_inputs), output)
        if isinstance(example_inputs, (tuple, list)):
            return cls(tuple(example_inputs), {}, output)
        return cls((example_inputs,), {}, output)

    # ---- the eager model --------------------------------------------------------------------
    def run(self, model: nn.Module, args: tuple | None = None, kwargs: dict | None = None) -> Any:
        """``model(*args, **kwargs)`` (this call's inputs by default) with the loss's output
        selected (:meth:`select`)."""
        a = self.args if args is None else args
        kw = self.kwargs if kwargs is None else kwargs
        return self.select(model(*a, **kw))

    def select(self, out: Any) -> Any:
        """The part of a model output the loss reads (module docstring)."""
        if self.output is not None:
            try:
                if isinstance(self.output, int):
                    return out[self.output]
                return out[self.output] if isinstance(out, dict) else getattr(out, self.output)
            except (KeyError, IndexError, AttributeError, TypeError):
                raise CaptureError(f"the model's output ({type(out).__name__}) has no {self.output!r}; name one of "
                                   f"{', '.join(map(repr, _keys(out))) or 'its elements by index'}") from None
        if isinstance(out, torch.Tensor) or out is None:
            return out
        if isinstance(out, dict) or hasattr(out, "keys"):
            present = {k: out[k] for k in out.keys()  # noqa: SIM118 - an object with keys() need not iterate them
                       if isinstance(out[k], torch.Tensor)}
            for key in DEFAULT_OUTPUT_KEYS:
                if key in present:
                    return present[key]
            for v in present.values():
                if v.is_floating_point():
                    return v
            raise CaptureError(f"the model returns a {type(out).__name__} with no floating-point tensor "
                               f"(keys {', '.join(map(repr, _keys(out)))}); name the output the loss reads")
        return out

    def to(self, dtype: torch.dtype | None = None, device: Any = None) -> ModelCall:
        """The same call with floating-point tensors converted (``dtype``) and every tensor moved
        (``device``)."""
        def conv(v: Any) -> Any:
            if not isinstance(v, torch.Tensor):
                return v
            if dtype is not None and v.is_floating_point():
                v = v.to(dtype)
            return v.to(device) if device is not None else v
        return ModelCall(tuple(conv(a) for a in self.args), {k: conv(v) for k, v in self.kwargs.items()},
                         self.output)

    # ---- what the capture sees ----------------------------------------------------------------
    def input_names(self, model: nn.Module) -> tuple[str, ...]:
        """The captured graph's input names: the model's parameter names (``args_0`` … for a
        ``*args`` parameter, the key for a ``**kwargs`` one)."""
        return tuple(name for name, _ in self._bound_tensors(model))

    def flatten(self, model: nn.Module | None, args: tuple, kwargs: dict) -> tuple[torch.Tensor, ...]:
        """The tensors of a call ``model(*args, **kwargs)`` in the captured graph's input order."""
        return tuple(t for _, t in ModelCall(tuple(args), dict(kwargs))._bound_tensors(model))

    def _bound_tensors(self, model: nn.Module | None) -> Iterator[tuple[str, torch.Tensor]]:
        for name, value, _ in self._binding(model):
            if isinstance(value, torch.Tensor):
                yield name, value

    def _binding(self, model: nn.Module | None) -> list[tuple[str, Any, str | None]]:
        """``(name, value, keyword)`` of every argument in the signature's order: ``keyword`` is
        the key it is passed under, ``None`` for a positional one."""
        sig = _signature(model)
        if sig is None:
            return [(f"args_{i}", a, None) for i, a in enumerate(self.args)] + \
                [(k, v, k) for k, v in self.kwargs.items()]
        try:
            bound = sig.bind(*self.args, **self.kwargs)
        except TypeError as e:
            raise CaptureError(f"the example inputs do not fit {type(model).__name__}.forward{sig}: {e}") from None
        out: list[tuple[str, Any, str | None]] = []
        for pname, value in bound.arguments.items():
            kind = sig.parameters[pname].kind
            if kind == inspect.Parameter.VAR_POSITIONAL:
                out.extend((f"{pname}_{i}", v, None) for i, v in enumerate(value))
            elif kind == inspect.Parameter.VAR_KEYWORD:
                out.extend((k, v, k) for k, v in value.items())
            elif kind == inspect.Parameter.KEYWORD_ONLY or pname in self.kwargs:
                out.append((pname, value, pname))
            else:
                out.append((pname, value, None))
        return out

    def capturable(self, model: nn.Module) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        """A module whose ``forward(*tensors)`` calls ``model`` as this call does and returns the
        selected output, and the tensors to call it with.  It shares the model's submodules,
        parameters and buffers (the same objects under the same names, so a capture names them
        as the model does); its inputs are named after the model's own parameters."""
        binding = self._binding(model)
        names = [_identifier(n) for n, v, _ in binding if isinstance(v, torch.Tensor)]
        if len(set(names)) != len(names):
            raise CaptureError(f"two inputs of {type(model).__name__} have the same name: {names}")
        select = self.select

        def call(self_: nn.Module, env: dict[str, torch.Tensor]) -> Any:
            # a tensor argument is read from the wrapper's inputs, any other value is fixed
            value = {name: env[_identifier(name)] if isinstance(v, torch.Tensor) else v for name, v, _ in binding}
            a = [value[name] for name, _, key in binding if key is None]
            kw = {key: value[name] for name, _, key in binding if key is not None}
            return select(model(*a, **kw))

        namespace: dict[str, Any] = {}
        exec(f"def forward(self, {', '.join(names)}):\n"
             f"    return self._tensoropt_call({{{', '.join(f'{n!r}: {n}' for n in names)}}})\n", namespace)
        cls = type(type(model).__name__, (nn.Module,), {"forward": namespace["forward"], "_tensoropt_call": call,
                                                         "__module__": type(model).__module__,
                                                         "__qualname__": type(model).__qualname__})
        wrapper = cls()
        # share, don't copy: the capture names parameters by the wrapper's attributes
        wrapper._modules = model._modules
        wrapper._parameters = model._parameters
        wrapper._buffers = model._buffers
        wrapper._non_persistent_buffers_set = model._non_persistent_buffers_set
        wrapper.train(model.training)
        return wrapper, self.tensors_for(model)

    def tensors_for(self, model: nn.Module | None) -> tuple[torch.Tensor, ...]:
        """The input tensors in the order the captured graph of ``model`` takes them."""
        return tuple(t for _, t in self._bound_tensors(model))


def _signature(model: nn.Module | None) -> inspect.Signature | None:
    if model is None:
        return None
    try:
        return inspect.signature(model.forward)
    except (TypeError, ValueError):
        return None


def _identifier(name: str) -> str:
    """A Python identifier for an input name (keyword keys may be anything)."""
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"in_{out}"


def _keys(out: Any) -> list[str]:
    try:
        return [str(k) for k in out.keys()]  # noqa: SIM118 - any object with keys(), not only a dict
    except AttributeError:
        return []
