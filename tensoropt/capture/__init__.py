"""Capture an ``nn.Module`` as an :class:`~tensoropt.graph.OpGraph`.

:func:`capture` tries ``torch.export.export`` (non-strict, batch dimension dynamic) first, then
``torch.fx.symbolic_trace`` + ShapeProp; :func:`load_onnx` reads ONNX files (analysis only).
When every door fails the error names the first unsupported op or Python construct, the module
path it came from and what to try.  ``precision="bf16"`` captures under autocast
(:mod:`tensoropt.capture.precision`: :func:`precision_context` is the one place that decides what
runs under autocast, for the capture, the profiler and the executors alike);
``precision="bf16-params"`` captures a copy whose parameters are bfloat16 (FSDP2's mixed precision).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import Dim, export
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.overrides import TorchFunctionMode

from ..errors import CaptureError
from ..graph import OpGraph, ParamKind, Precision
from .build import PlaceholderInfo, build_opgraph, flatten_nodes
from .call import ModelCall
from .canonical import canonicalize, update_signature
from .diagnose import describe_failure, failing_op, first_line, inputs_run_model, locate
from .fake import FakeTensorMode, fake_on, fake_twin, holds_no_data, on_meta
from .functionalize import functionalize
from .onnx import load_onnx
from .outside_torch import DrawsOutsideTorch, RandomOutsideTorchError
from .precision import PRECISIONS, bf16_parameters, check_precision, device_types, precision_context
from .symbolic import capture_fx

__all__ = ["capture", "capture_export", "capture_fx", "load_onnx", "quiet_torch_logs", "ModelCall",
           "PRECISIONS", "precision_context"]


def capture(model: torch.nn.Module, example_inputs: Any, *, batch_dim: int = 0, name: str | None = None,
            method: str = "auto", output: str | int | None = None, precision: str = "fp32") -> OpGraph:
    """Capture ``model`` called on ``example_inputs`` as an OpGraph.

    ``example_inputs``: a tensor, a tuple of positional inputs, a dict of keyword inputs, or a
    :class:`ModelCall`; ``output`` names the output the loss reads when the model returns a
    dict, ``ModelOutput`` or tuple (see :mod:`tensoropt.capture.call` for the default).
    ``batch_dim`` is the batch dimension of the inputs.  ``method`` is ``"auto"`` (torch.export,
    then torch.fx), ``"export"`` or ``"fx"``.  The returned graph keeps the captured
    ``GraphModule`` in ``.module`` (and the ``ExportedProgram`` in ``.exported``), the call in
    ``.call`` and its input tensors in ``.example_inputs``; ``graph.notes`` records the door it
    came through and anything it had to assume.  In-place ops on activations are rewritten out
    of place (:mod:`tensoropt.capture.functionalize`).

    A model on the meta device (or holding FakeTensors) is captured as its fake twin on the CPU
    (:mod:`tensoropt.capture.fake`): the graph of the model as the CPU would run it, nothing
    allocated; its example inputs are FakeTensors.

    ``precision``: ``"fp32"``, or ``"bf16"`` — mixed precision: the model is captured under
    ``torch.autocast(device_type=<the inputs' device type>, dtype=torch.bfloat16)``
    (:func:`precision_context`), so the activations autocast computes in bfloat16 are bfloat16
    in the graph (half the bytes) while the parameters stay float32; ``graph.precision`` says so
    and every later stage runs the graph under the same autocast.  ``"bf16-params"`` — FSDP2's
    mixed precision: a copy of the model whose floating-point parameters are bfloat16 (and its
    floating-point inputs) is captured, so every operator computes in bfloat16 where the model
    does not upcast; the graph's parameters record their float32 master dtype
    (:func:`~tensoropt.capture.precision.bf16_parameters`).

    Raises :class:`~tensoropt.errors.CaptureError` explaining the first failure.
    """
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"capture needs a torch.nn.Module, got {type(model).__name__}")
    call = ModelCall.of(example_inputs, output)
    name = name or type(model).__name__
    if method not in ("auto", "export", "fx"):
        raise CaptureError(f"method must be 'auto', 'export' or 'fx', got {method!r}")
    precision = check_precision(precision, CaptureError)
    copied = False
    if on_meta(model) or any(holds_no_data(t) for t in (*call.args, *call.kwargs.values())):
        # a model that holds no data is captured as its fake twin on the CPU (tensoropt.capture.fake):
        # the CPU's kernels and autocast policy, no values, no memory
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        model = fake_twin(model, mode)
        call = ModelCall(tuple(fake_on(mode, a) for a in call.args),
                         {k: fake_on(mode, v) for k, v in call.kwargs.items()}, call.output)
        copied = True
    masters: dict[str, str] = {}
    if precision == Precision.BF16_PARAMS:
        model, cast, masters = bf16_parameters(model, [*call.args, *call.kwargs.values()], copy_model=not copied)
        call = ModelCall(tuple(cast[:len(call.args)]), dict(zip(call.kwargs, cast[len(call.args):])), call.output)
    with quiet_torch_logs(), precision_context(precision, _input_devices(model, call)):
        graph = _capture(model, call, batch_dim, name, method)
    graph.example_inputs = call.tensors_for(model)
    graph.call = call
    graph.precision = Precision(precision)
    if masters:
        # the parameters as training keeps them: float32 masters, computed on as bfloat16 copies
        graph.params.update({q: dataclasses.replace(info, dtype=masters[q]) for q, info in graph.params.items()
                             if info.kind == ParamKind.PARAMETER and q in masters})
        graph.notes.append("bf16-params: every operator computes on bfloat16 copies of the parameters (FSDP2's "
                           "MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)); float32 master "
                           "weights, gradients and optimizer state")
    elif precision != Precision.FP32:
        graph.notes.append(f"{precision}: captured under torch.autocast (parameters float32); profiled and run "
                           "under the same autocast")
    return graph


def _input_devices(model: torch.nn.Module, call: ModelCall) -> list[str]:
    """The device types of the inputs (of the parameters where the inputs hold no tensor; the
    capture itself reports inputs that do not fit the model)."""
    try:
        tensors = list(call.tensors_for(model))
    except Exception:  # noqa: BLE001 - the capture explains inputs that do not bind
        tensors = []
    return device_types(tensors or list(model.parameters())[:1])


# torch logs a failing fake-tensor op with its traceback at ERROR level before raising;
# the exception itself reaches the user as a CaptureError, so the log is only noise
_NOISY_LOGGERS = ("torch._subclasses.fake_tensor", "torch.export", "torch._export",
                  "torch.fx.experimental.symbolic_shapes", "torch._dynamo")


@contextlib.contextmanager
def quiet_torch_logs() -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _capture(model: torch.nn.Module, call: ModelCall, batch_dim: int, name: str, method: str) -> OpGraph:
    errors: list[tuple[str, BaseException]] = []
    if method in ("auto", "export"):
        try:
            return capture_export(model, call, batch_dim=batch_dim, name=name)
        except CaptureError as e:
            if method == "export" or not _fx_may_help(e):
                raise
            errors.append(("torch.export", e))
        except Exception as e:  # noqa: BLE001 - any failure moves on to the next door
            errors.append(("torch.export", e))
    args = call.tensors_for(model)
    # a branch on tensor values stops export; torch.fx would run it on whatever the values are at
    # trace time and bake that branch in (a random LayerDrop: one layer silently gone)
    data_dependent = bool(errors) and _data_dependent(errors[0][1])
    if method in ("auto", "fx") and not call.kwargs and call.output is None and not data_dependent:
        try:
            g = capture_fx(model, args, batch_dim=batch_dim, name=name)
            if errors:
                g.notes.insert(0, f"torch.export failed ({first_line(errors[0][1])}); captured with torch.fx")
            return g
        except Exception as e:  # noqa: BLE001
            errors.append(("torch.fx", e))
    bad_inputs = inputs_run_model(model, args)
    message = describe_failure(model, errors, bad_inputs)
    if data_dependent and method == "auto" and bad_inputs is None:
        message += ("\n- torch.fx: not tried: it would take the example's values as constants (bake the branch "
                    "or size they give into the graph)")
    raise CaptureError(message) from errors[0][1]


def _data_dependent(e: BaseException) -> bool:
    text = f"{type(e).__name__} {e}"
    return "DataDependent" in text or "data-dependent" in text


def _fx_may_help(e: CaptureError) -> bool:
    """A CaptureError from the export door that another tracer would not meet again."""
    return "in place" not in str(e) and not isinstance(e, RandomOutsideTorchError)


def _batch_size(args: Sequence[Any], batch_dim: int) -> int | None:
    for a in args:
        if isinstance(a, torch.Tensor) and a.dim() > batch_dim:
            return int(a.shape[batch_dim])
    return None


def capture_export(model: torch.nn.Module, example_inputs: Any, *, batch_dim: int = 0,
                   name: str = "model") -> OpGraph:
    """The torch.export door: non-strict export with the batch dimension marked ``Dim.AUTO``.

    The model is exported through :meth:`ModelCall.capturable` (its inputs flattened to
    tensors named after its own parameters, the loss's output selected), then functionalized and
    put in canonical order with canonical node names (:mod:`tensoropt.capture.canonical`: the
    same graph and fingerprint in every process, whatever order the model's code traced in).
    The symbolic batch size lets every tensor's batch dimension be read from its shape
    expression (``32*s0`` is a batch dimension, ``32`` is not).  If the model specialises the
    batch size, or calls an op that needs concrete sizes where they come from the batch
    (:func:`_export_dynamic_batch`), the export still succeeds and the graph's notes say batch
    splits are unknown (and which op of which module fixed the batch).  A draw from a
    ``torch.Generator`` the model owns is a :class:`CaptureError` naming the module and the op;
    so is one with numpy or Python's ``random`` in ``forward`` (:mod:`.outside_torch`: the graph
    would keep one draw as a constant).
    """
    call = ModelCall.of(example_inputs)
    wrapper, args = call.capturable(model)
    batch = _batch_size(args, batch_dim)
    ep, export_s, static_reason = _export_dynamic_batch(wrapper, args, batch_dim, model)
    placeholders = _export_placeholders(ep)
    gm = ep.graph_module
    module_of = partial(_module_of, model_type=type(model).__qualname__)
    _refuse_own_generators(ep, module_of)
    batch_syms = _batch_symbols(gm, placeholders, batch_dim)
    tensor_meta = partial(_shape_and_batch_dim, batch_syms=batch_syms)

    _refuse_data_dependent_shapes(gm, module_of)
    renames = _functional_canonical_graph(ep, placeholders, module_of)
    user_outputs = _user_outputs(ep)
    notes = _export_notes(export_s, renames, batch, batch_syms, static_reason)
    return build_opgraph(gm, placeholders, tensor_meta=tensor_meta, module_of=module_of,
                         user_outputs=user_outputs, name=name, source="torch.export",
                         batch_size=batch, batch_dim=batch_dim, notes=notes, exported=ep)


def _export_dynamic_batch(wrapper: torch.nn.Module, args: tuple[Any, ...], batch_dim: int,
                          model: torch.nn.Module) -> tuple[torch.export.ExportedProgram, float, str | None]:
    """Non-strict ``torch.export`` of ``wrapper(*args)`` with the batch dimension of every tensor
    argument that has one (of size >= 2) marked ``Dim.AUTO``; the program, the seconds it took and,
    when an op of ``model`` needs concrete sizes where the batch is symbolic (a kernel without a
    symbolic-size form), why the batch had to be exported static.

    ``torch.rand`` / ``randn`` / ``randint`` called with ``generator=None`` are exported as called
    without it (:class:`_DefaultGeneratorOmitted`): the same draw, but only the form without a
    generator takes a symbolic size.  Any other op that needs concrete sizes makes the export
    fall back to the batch size of the example: the graph is still captured, its notes say which
    op of which module fixed the batch (and that no operator may then be split along it)."""
    dynamic = tuple({batch_dim: Dim.AUTO} if isinstance(a, torch.Tensor) and a.dim() > batch_dim
                    and a.shape[batch_dim] >= 2 else None for a in args)
    t0 = time.perf_counter()
    static_reason = None
    with _DefaultGeneratorOmitted(), _module_conversions_traced(), DrawsOutsideTorch(model) as draws:
        try:
            ep = export(wrapper, args, dynamic_shapes=dynamic, strict=False)
        except Exception as e:
            if not any(d is not None for d in dynamic) or not _needs_concrete_sizes(e):
                raise
            static_reason = _static_batch_reason(e, model)
            # new tensor objects: the failed export marked the batch dimension of these dynamic
            # (an attribute on the tensor), which a second export would follow again
            fresh = tuple(a.detach().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                          for a in args)
            ep = export(wrapper, fresh, strict=False)
    draws.refuse()
    return ep, time.perf_counter() - t0, static_reason


def _needs_concrete_sizes(e: BaseException) -> bool:
    """What a kernel without a symbolic-size form says when it is handed the symbolic batch."""
    return "SymIntArrayRef expected to contain only concrete integers" in str(e)


def _static_batch_reason(e: BaseException, model: torch.nn.Module) -> str:
    """``aten.op.overload in module 'path' at file:line: code``: the op that needed concrete sizes
    where the export made the batch symbolic, for the graph's note."""
    path, line = locate(e, model)
    return f"{failing_op(e) or 'an op'} in module {path or '<root>'!r}" + (f" at {line}" if line else "")


class _DefaultGeneratorOmitted(TorchFunctionMode):
    """``torch.rand`` / ``randn`` / ``randint`` called with ``generator=None`` (as diffusers'
    ``randn_tensor`` and VAEs' reparameterised sampling pass it) run as called without it: the
    same draw from the default generator, but ATen's ``.generator`` overloads have no kernel for
    a symbolic size ("SymIntArrayRef expected to contain only concrete integers" under the
    dynamic batch).  A real generator is passed on as it is."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _GENERATOR_FACTORIES and "generator" in kwargs and kwargs["generator"] is None:
            kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
        return func(*args, **kwargs)


_GENERATOR_FACTORIES = (torch.rand, torch.randn, torch.randint)


@contextlib.contextmanager
def _module_conversions_traced() -> Iterator[None]:
    """While exporting, ``nn.Module.to`` / ``float`` / ``half`` … called in ``forward`` (an MoE
    router's ``self.classifier = self.classifier.to(self.dtype)``, as Switch Transformers does)
    are traced instead of refused.

    Non-strict export swaps every parameter for a fake tensor; ``Module._apply`` puts a
    converted fake parameter back with ``torch.utils.swap_tensors``, which export's weak
    references make fail ("_apply(): Couldn't swap Linear.weight").  Here a module whose
    parameters are fake keeps a parameter the conversion leaves unchanged (``.to`` of its own
    dtype returns it: nothing happens, as in eager) and reads a changed one from the traced,
    differentiable conversion (a cast in the graph; the gradient reaches the parameter, which
    the model keeps in its dtype: export restores the module's own parameters afterwards).
    Every other module converts as torch does."""
    original = torch.nn.Module._apply

    def _apply(self: torch.nn.Module, fn: Any, recurse: bool = True) -> torch.nn.Module:
        if not any(isinstance(p, FakeTensor) for p in self._parameters.values()):
            return original(self, fn, recurse)
        if recurse:
            for child in self.children():
                child._apply(fn)
        for key, param in self._parameters.items():
            if param is not None and (converted := fn(param)) is not param:
                self._parameters[key] = converted
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    torch.nn.Module._apply = _apply    # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module._apply = original    # type: ignore[method-assign]


def _export_placeholders(ep: torch.export.ExportedProgram) -> dict[str, PlaceholderInfo]:
    """What each placeholder of the exported graph stands for (user input, parameter, buffer,
    constant), tied weights under one name."""
    sig = ep.graph_signature
    placeholders: dict[str, PlaceholderInfo] = {}
    # tied weights (an embedding shared with the LM head) may come as two placeholders of one
    # tensor: give both one name, the first in sorted order (not in spec order: a name that
    # depends on nothing but the names), so the parameter is one ParamInfo with one owner
    canonical: dict[int, str] = {}
    for spec in sig.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER) and spec.target in ep.state_dict:
            key = id(ep.state_dict[spec.target])
            canonical[key] = min(canonical.get(key, spec.target), spec.target)
    for spec in sig.input_specs:
        arg_name = getattr(spec.arg, "name", None)
        if arg_name is None:
            continue
        if spec.kind == InputKind.USER_INPUT:
            placeholders[arg_name] = PlaceholderInfo("input", arg_name)
        elif spec.kind == InputKind.PARAMETER:
            t = ep.state_dict[spec.target]
            placeholders[arg_name] = PlaceholderInfo("parameter", canonical[id(t)], bool(t.requires_grad))
        elif spec.kind == InputKind.BUFFER:
            t = ep.state_dict.get(spec.target)
            placeholders[arg_name] = PlaceholderInfo("buffer", canonical[id(t)] if t is not None else spec.target)
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            placeholders[arg_name] = PlaceholderInfo("constant", spec.target)
        else:  # tokens and script objects carry no tensor data
            placeholders[arg_name] = PlaceholderInfo("constant", spec.target or arg_name)
    return placeholders


def _batch_symbols(gm: fx.GraphModule, placeholders: dict[str, PlaceholderInfo], batch_dim: int) -> set:
    """The symbols of the user inputs' batch sizes (none when the export specialised the batch)."""
    nodes = {n.name: n for n in gm.graph.nodes}
    batch_syms: set = set()
    for ph, info in placeholders.items():
        val = nodes[ph].meta.get("val")
        if info.kind == "input" and isinstance(val, torch.Tensor) and val.dim() > batch_dim:
            s = val.shape[batch_dim]
            if isinstance(s, torch.SymInt):
                batch_syms |= s.node.expr.free_symbols
    return batch_syms


def _shape_and_batch_dim(t: torch.Tensor, batch_syms: set) -> tuple[tuple[int, ...], int | None]:
    """A (fake) tensor's concrete shape and its batch dimension, read from the shape expressions."""
    # a tensor with the batch in two dimensions (x @ x.T: every sample against every sample)
    # has no batch dimension: no piece of it is what a piece of the batch computes
    shape, bdim, batched = [], None, 0
    for i, s in enumerate(t.shape):
        if isinstance(s, torch.SymInt):
            if s.node.expr.free_symbols & batch_syms:
                # the batch times a constant (``32*s0``) is a batch dimension; the batch plus
                # something (``s0 + 1``: a cat of the samples and one more row) is not — no
                # piece of it is what a piece of the batch makes
                batched += 1 if s.node.expr.is_Symbol or s.node.expr.is_Mul else 2
                bdim = i if bdim is None else bdim
            hint = s.node.hint
            if hint is None:
                raise CaptureError(f"a tensor has a data-dependent size ({s}); tensoropt needs static shapes")
            shape.append(int(hint))
        else:
            shape.append(int(s))
    return tuple(shape), bdim if batched == 1 else None


def _module_of(n: fx.Node, model_type: str) -> tuple[str, str]:
    """The module path and type an exported node came from (the model's type outside modules)."""
    stack = n.meta.get("nn_module_stack")
    if not stack:
        return "", model_type
    path, mtype = list(stack.values())[-1]
    if path.startswith("_empty_nn_module_stack"):  # export's placeholder for ops outside modules
        return "", model_type
    mtype = mtype if isinstance(mtype, str) else f"{mtype.__module__}.{mtype.__qualname__}"
    return path, mtype


def _functional_canonical_graph(ep: torch.export.ExportedProgram, placeholders: dict[str, PlaceholderInfo],
                                module_of: Any) -> dict[str, str]:
    """Rewrite the exported graph in place: functionalized (the output specs following the
    renames), then in canonical order with canonical names (the signature updated); the renames
    of in-place ops."""
    # local: tensoropt.execute imports tensoropt.capture (a cycle at import time)
    from ..execute.randomness import record_random_keys

    gm = ep.graph_module
    kind_of = {ph: info.kind for ph, info in placeholders.items()}
    renames = functionalize(gm, kind_of, lambda n: _where(n, module_of))
    for spec in ep.graph_signature.output_specs:
        arg: Any = getattr(spec, "arg", None)   # an export argument spec (or None): a name to follow
        while getattr(arg, "name", None) in renames:
            arg.name = renames[arg.name]
    # the traced order (and the names fx gave in it) can depend on the process (a model iterating
    # a set): put the graph in an order and give it names that depend on its structure only, the
    # random draws keeping the keys of their traced order (the order the eager model draws in)
    record_random_keys(gm.graph.nodes)
    update_signature(ep, canonicalize(gm))
    return renames


def _user_outputs(ep: torch.export.ExportedProgram) -> list[fx.Node]:
    """The graph's user outputs (not the mutated buffers export also returns), in output order."""
    sig = ep.graph_signature
    user_out_names = {getattr(s.arg, "name", None) for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT}
    out_node = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    return [a for a in flatten_nodes(out_node.args) if a.name in user_out_names]


def _export_notes(export_s: float, renames: dict[str, str], batch: int | None, batch_syms: set,
                  static_reason: str | None = None) -> list[str]:
    """The graph's notes from the export door: time taken, in-place ops rewritten, a batch the
    export had to fix (and which op made it) or the model specialised."""
    notes = [f"captured with torch.export (non-strict) in {export_s:.2f} s"]
    if renames:
        notes.append(f"{len(renames)} in-place op(s) on activations rewritten out of place")
    if static_reason is not None:
        notes.append(f"exported with the batch size fixed at {batch}: {static_reason} needs concrete sizes, and the "
                     "batch's is symbolic in a dynamic-batch export; batch dimensions are unknown, so no operator may "
                     "be split along the batch (give that op sizes that do not come from the batch, or replace it, "
                     "to plan batch splits)")
    elif batch is not None and not batch_syms:
        notes.append("the model specialised the batch size during export: batch dimensions are unknown, "
                     "so no operator may be split along the batch")
    return notes


def _where(n: fx.Node, module_of: Any) -> str:
    """``module.path (Type)`` of a node, for messages."""
    path, mtype = module_of(n)
    return f"{path or '<root>'} ({mtype.rsplit('.', 1)[-1]})"


def _refuse_own_generators(ep: torch.export.ExportedProgram, module_of: Any) -> None:
    """A CaptureError naming the first op that draws from a ``torch.Generator`` of the model's own
    (export lifts it into the graph as an object, which no later stage can hold)."""
    owned = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.CUSTOM_OBJ
             and isinstance(ep.constants.get(s.target or ""), torch.Generator)}
    for n in ep.graph_module.graph.nodes:
        if n.op == "call_function" and any(getattr(a, "name", None) in owned for a in (*n.args, *n.kwargs.values())):
            raise CaptureError(f"{_where(n, module_of)}: {n.target} draws from the model's own torch.Generator, which "
                               "a captured graph cannot hold; draw from the default generator (generator=None, seeded "
                               "by torch.manual_seed): tensoropt's executor draws its own keyed random numbers anyway")


def _refuse_data_dependent_shapes(gm: fx.GraphModule, module_of: Any) -> None:
    """A CaptureError naming the first op whose output size depends on tensor values
    (``nonzero``, boolean indexing, ``unique``): plans are made for static shapes."""
    for n in gm.graph.nodes:
        if n.op == "call_function" and free_unbacked_symbols(n.meta.get("val")):
            raise CaptureError(f"{_where(n, module_of)}: {n.target} has a data-dependent shape (its size depends "
                               "on tensor values); tensoropt plans need static shapes: compute it with a fixed size "
                               "(e.g. torch.where / a mask instead of indexing with nonzero) or outside forward")
