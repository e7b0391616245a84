"""Explain why a capture failed: which op or Python construct, from which module, what to try.

It owns the message of a failed capture (the innermost user frame, the module path, a hint); it
must not retry or change the capture itself (:mod:`tensoropt.capture` decides what to try).

Example::

    >>> import torch
    >>> model = torch.nn.Linear(16, 4)
    >>> try:
    ...     model(torch.randn(8, 3))          # example inputs of the wrong width
    ... except RuntimeError as e:
    ...     bad_inputs = e
    >>> print(describe_failure(model, [], bad_inputs))
    the example inputs do not run Linear: RuntimeError: mat1 and mat2 shapes cannot be multiplied (8x3 and 16x4)
      in module '<root>'
      fix: pass example inputs of the shapes and dtypes the model's forward expects (check the batch and input sizes)
    >>> print(describe_failure(model, [("torch.export", ValueError("unsupported op"))], None))
    could not capture Linear:
    - torch.export: ValueError: unsupported op
        try: ...
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import traceback
from types import TracebackType
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode


def inputs_run_model(model: torch.nn.Module, args: tuple) -> BaseException | None:
    """Run ``model(*args)`` on FakeTensors (shapes only, no real compute or memory).

    Returns the exception when the example inputs do not run the model at all, else ``None``.
    """
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = tuple(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args)
            with torch.no_grad():
                model(*fake)
    except Exception as e:  # noqa: BLE001
        # data-dependent ops cannot run on fake tensors; that is not the inputs' fault
        if "data-dependent" in str(e) or "DataDependent" in type(e).__name__ or \
                "DynamicOutputShape" in type(e).__name__:
            return None
        return e
    return None


def locate(exc: BaseException, model: torch.nn.Module) -> tuple[str | None, str | None]:
    """The innermost module of ``model`` whose ``forward`` is on the exception's stack, and the
    user source line (``file:line: code``) nearest to the failure."""
    paths = {id(m): (name or "<root>") for name, m in model.named_modules()}
    module_path, line = None, None
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        tb: TracebackType | None = e.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            obj = frame.f_locals.get("self")
            if obj is not None and id(obj) in paths:
                module_path = paths[id(obj)]
                fn = frame.f_code.co_filename
                if "/torch/" not in fn:
                    src = traceback.extract_tb(tb, limit=1)[0]
                    line = f"{src.filename}:{src.lineno}: {(src.line or '').strip()}"
            tb = tb.tb_next
        e = e.__cause__ or e.__context__
    return module_path, line


def failing_op(exc: BaseException) -> str | None:
    """The ATen op (``aten.randn.generator``) the exception was raised in: the innermost
    ``OpOverload`` torch's dispatch frames on its stack were handling, or ``None``."""
    op = None
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        for name in ("func", "op_overload", "self"):
            value = tb.tb_frame.f_locals.get(name)
            if isinstance(value, torch._ops.OpOverload):
                op = str(value)
                break
        tb = tb.tb_next
    return op


def _advice(exc: BaseException) -> str:
    text = f"{type(exc).__name__} {exc}"
    if ("data-dependent" in text or "DataDependent" in text) and _branches_on_random(exc):
        return ("the model skips a whole layer at random in training (LayerDrop, `if torch.rand([]) < p:`), a "
                "branch on a random value that no tracer can capture; set that probability to 0 to plan and run it "
                "(Hugging Face: config.layerdrop = 0.0) — dropout and per-sample stochastic depth are captured and "
                "reproduced as they are")
    if "data-dependent" in text or "DataDependent" in text or "GuardOnDataDependent" in text:
        return ("the model branches or sizes a tensor on tensor *values*; replace the Python `if` on a "
                "tensor with torch.where / torch.cond, or compute that part outside forward")
    if "symbolically traced variables cannot be used as inputs to control flow" in text:
        return "the model has Python control flow on tensors; torch.fx cannot trace it"
    if "fake" in text.lower() and ("impl" in text.lower() or "kernel" in text.lower()) \
            or "Could not run" in text or "NotImplementedError" in text:
        return ("an operator has no shape (fake / meta) implementation; register one with "
                "torch.library.register_fake, or replace the op")
    if "Unsupported" in text or "not supported" in text:
        return "rewrite that construct in plain tensor operations, or move it out of forward"
    return ("run `torch.export.export(model, inputs, strict=False)` yourself to see the full error, "
            "or rerun with --debug for the traceback")


def _branches_on_random(exc: BaseException) -> bool:
    """Whether the user function the failure happened in draws a random number it may branch on
    (``torch.rand(...)`` / ``random.random()`` in its source: LayerDrop and the like)."""
    tb: TracebackType | None = exc.__traceback__
    source = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        # the capture's own frames (the export's TorchFunctionMode) are not the user's function
        if "/torch/" not in code.co_filename and not code.co_filename.startswith(_CAPTURE_DIR):
            with contextlib.suppress(OSError, TypeError):
                source = inspect.getsource(code)
        tb = tb.tb_next
    return bool(re.search(r"torch\.rand\(|random\.random\(|np\.random\.|layerdrop", source))


_CAPTURE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _summary(exc: BaseException, limit: int = 300) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    head = lines[0] if lines else ""
    return f"{type(exc).__name__}: {head}"[:limit]


def describe_failure(model: torch.nn.Module, errors: list[tuple[str, BaseException]],
                     bad_inputs: BaseException | None) -> str:
    """One message for a failed capture (see :func:`tensoropt.capture.capture`)."""
    name = type(model).__name__
    if bad_inputs is not None:
        where, line = locate(bad_inputs, model)
        msg = [f"the example inputs do not run {name}: {_summary(bad_inputs)}"]
        if where:
            msg.append(f"  in module {where!r}" + (f" at {line}" if line else ""))
        msg.append("  fix: pass example inputs of the shapes and dtypes the model's forward expects "
                   "(check the batch and input sizes)")
        return "\n".join(msg)
    msg = [f"could not capture {name}:"]
    for door, e in errors:
        where, line = locate(e, model)
        msg.append(f"- {door}: {_summary(e)}")
        if where or line:
            msg.append(f"    from module {where or '?'!r}" + (f" at {line}" if line else ""))
        msg.append(f"    try: {_advice(e)}")
    return "\n".join(msg)


def first_line(e: Any) -> str:
    return _summary(e, 200)
