"""Model specs: the one way every surface (CLI, API, dashboard) names a model.

- ``zoo:NAME`` with optional ``?key=value&…`` (``zoo:gpt2?layers=12&batch=8``, ``zoo:vgg16?tiny=1``);
- ``hf:path/to/config.json?batch=N&seq_len=N&layers=N``: the Hugging Face model a local
  ``config.json`` describes (or a directory holding one), built on the meta device — never
  materialised, nothing downloaded (:func:`tensoropt.zoo.hf.from_config`); ``batch`` (or
  ``--batch``) is required, ``seq_len`` too for a text model (no config states the length a
  model trains at, and ``max_position_embeddings`` — 131,072 for Llama 3.1 — is rarely it);
  ``layers`` shortens the stack;
- ``path/to/file.py:factory`` where ``factory()`` returns ``(model, example_inputs)`` or
  ``(model, example_inputs, output)``: ``example_inputs`` a tensor, a tuple of positional
  inputs or a dict of keyword inputs; ``output`` the key or index of the output the loss reads
  (see :mod:`tensoropt.capture.call`); a ``batch`` keyword is passed when the factory takes one
  and a batch is asked for;
- ``path/to/model.onnx`` (analysis only);
- ``path/to/graph.json``, an OpGraph saved by ``tensoropt graph --json``.

:meth:`LoadedModel.capture` takes the precision the graph trains in (``fp32`` / ``bf16``,
:mod:`tensoropt.capture.precision`); a saved graph keeps the one it was captured in.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass, field
from importlib.abc import Loader
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qsl

import torch

from . import zoo
from .capture import capture, load_onnx
from .capture.call import ModelCall
from .capture.precision import check_precision
from .errors import ModelSpecError, TensorOptError
from .graph import OpGraph


@dataclass
class LoadedModel:
    """A resolved spec: a torch model with example inputs, or a file to read a graph from."""
    spec: str
    name: str
    model: torch.nn.Module | None = None
    example_inputs: tuple = ()           # positional inputs
    path: Path | None = None             # ONNX or graph JSON
    params: dict[str, Any] = field(default_factory=dict)
    example_kwargs: dict[str, Any] = field(default_factory=dict)   # keyword inputs
    output: str | int | None = None      # the output the loss reads (tensoropt.capture.call)

    @property
    def call(self) -> ModelCall:
        """How the model is called and which output the loss reads."""
        return ModelCall(tuple(self.example_inputs), dict(self.example_kwargs), self.output)

    def capture(self, *, batch_dim: int = 0, method: str = "auto", precision: str | None = None) -> OpGraph:
        """The model's OpGraph (captured, or read from the ONNX / JSON file).  ``precision``:
        ``fp32`` / ``bf16`` (:func:`tensoropt.capture`); ``None``: fp32 for a model, the saved
        graph's own for a JSON file.  A precision a file cannot give (bf16 of an ONNX file or of
        a graph saved in fp32) is a :class:`~tensoropt.errors.ModelSpecError`."""
        if precision is not None:
            check_precision(precision, ModelSpecError)
        if self.model is not None:
            return capture(self.model, self.call, batch_dim=batch_dim, name=self.name, method=method,
                           precision=precision or "fp32")
        assert self.path is not None
        if self.path.suffix == ".onnx":
            if precision not in (None, "fp32"):
                raise ModelSpecError(f"{self.spec}: an ONNX file is read as it is (fp32); --precision {precision} "
                                     "needs the torch model (zoo:NAME or file.py:factory)")
            return load_onnx(self.path, batch_dim=batch_dim, batch_size=self.params.get("batch"))
        graph = OpGraph.load(self.path)
        if precision is not None and precision != graph.precision:
            raise ModelSpecError(f"{self.spec} is a graph saved in {graph.precision}, not {precision}: capture the "
                                 f"model itself with --precision {precision}, or drop --precision")
        return graph


def load_model(spec: str, *, batch: int | None = None) -> LoadedModel:
    """Resolve a model spec (see the module docstring); ``batch`` overrides the batch size.

    Raises :class:`~tensoropt.errors.ModelSpecError` with the cause and the fix.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError("empty model spec; use zoo:NAME, hf:path/to/config.json, path/to/file.py:factory or "
                             "path/to/model.onnx")
    spec = spec.strip()
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise ModelSpecError(f"batch must be a positive integer, got {batch!r}")
    if spec.startswith("zoo:"):
        return _load_zoo(spec, batch)
    if spec.startswith("hf:"):
        return _load_hf(spec, batch)
    if spec.endswith(".onnx"):
        path = _existing(spec)
        return LoadedModel(spec, path.stem, path=path, params={"batch": batch} if batch else {})
    if spec.endswith(".json"):
        if batch is not None:
            raise ModelSpecError(f"{spec} is a saved graph with a fixed batch size; --batch cannot change it")
        path = _existing(spec)
        return LoadedModel(spec, path.stem, path=path)
    if ".py:" in spec or spec.endswith(".py"):
        return _load_factory(spec, batch)
    raise ModelSpecError(f"cannot read model spec {spec!r}: use zoo:NAME (see `tensoropt zoo`), "
                         "hf:path/to/config.json?batch=N&seq_len=N, path/to/file.py:factory, path/to/model.onnx or "
                         "path/to/graph.json")


def load_graph(spec: str, *, batch: int | None = None, batch_dim: int = 0, precision: str | None = None) -> OpGraph:
    """``load_model(spec, batch=batch).capture(batch_dim=batch_dim, precision=precision)``."""
    return load_model(spec, batch=batch).capture(batch_dim=batch_dim, precision=precision)


def _existing(p: str) -> Path:
    path = Path(p)
    if not path.is_file():
        raise ModelSpecError(f"file not found: {path}")
    return path


def _query(spec: str, query: str, form: str) -> dict[str, str]:
    """The ``key=value&…`` of a spec as a dict; a malformed query or a key given twice is a
    :class:`ModelSpecError` (``form`` shows how to write one)."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ModelSpecError(f"cannot parse the parameters of {spec!r}: write {form}") from None
    params: dict[str, str] = {}
    for k, v in pairs:
        if k in params:
            raise ModelSpecError(f"parameter {k!r} given twice in {spec!r}")
        params[k] = v
    return params


def _load_zoo(spec: str, batch: int | None) -> LoadedModel:
    name, _, query = spec[len("zoo:"):].partition("?")
    params: dict[str, Any] = dict(_query(spec, query, "zoo:NAME?key=value&key=value"))
    tiny = _truthy(params.pop("tiny", "0"), "tiny", spec)
    if batch is not None:
        params["batch"] = batch
    try:
        merged = zoo.resolve_params(name, params, tiny=tiny)
        model, inputs = zoo.build(name, params, tiny=tiny)
    except (ValueError, ImportError) as e:
        raise ModelSpecError(str(e)) from None
    return LoadedModel(spec, name + ("-tiny" if tiny else ""), model=model, example_inputs=_as_tuple(inputs),
                       params=merged)


#: The keys of an ``hf:`` spec (precision is the separate ``--precision`` option).
HF_KEYS = ("batch", "seq_len", "layers")


def _load_hf(spec: str, batch: int | None) -> LoadedModel:
    target, _, query = spec[len("hf:"):].partition("?")
    form = "hf:path/to/config.json?batch=N&seq_len=N"
    params: dict[str, int] = {}
    for key, value in _query(spec, query, form).items():
        if key not in HF_KEYS:
            raise ModelSpecError(f"{spec}: unknown key {key!r}; an hf: spec takes {', '.join(HF_KEYS)} "
                                 "(precision is the --precision option)")
        try:
            params[key] = int(value)
        except ValueError:
            params[key] = 0
        if params[key] < 1:
            raise ModelSpecError(f"{spec}: {key} must be a positive integer, got {value!r}")
    if batch is not None:
        params["batch"] = batch
    if "batch" not in params:
        raise ModelSpecError(f"{spec}: give the batch size: {form} (or --batch N)")
    if not target:
        raise ModelSpecError(f"{spec!r} names no file: write {form}")
    path = Path(target)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelSpecError(f"{spec}: file not found: {path} (hf: reads a local config.json; nothing is "
                             "downloaded)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelSpecError(f"{spec}: cannot read {path} as JSON ({e}): give the config.json of a Hugging Face "
                             "model") from None
    if not isinstance(config, dict):
        raise ModelSpecError(f"{spec}: {path} holds a JSON {type(config).__name__}, not the object of a Hugging "
                             "Face config.json")
    try:
        model, inputs = zoo.hf.from_config(config, batch=params["batch"], seq_len=params.get("seq_len"),
                                           layers=params.get("layers"))
    except (ValueError, ImportError) as e:
        raise ModelSpecError(f"{spec}: {e}") from None
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return LoadedModel(spec, name, model=model, example_inputs=_as_tuple(inputs), params=dict(params))


def _truthy(v: str, key: str, spec: str) -> bool:
    s = str(v).strip().lower()
    if s in ("", "1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise ModelSpecError(f"{key}={v!r} in {spec!r} must be 1/0/true/false")


def _as_tuple(x: Any) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _load_factory(spec: str, batch: int | None) -> LoadedModel:
    file, _, func = spec.rpartition(":") if not spec.endswith(".py") else (spec, ":", "")
    if not func:
        raise ModelSpecError(f"{spec!r} names no factory: write {file}:FUNCTION, where FUNCTION() "
                             "returns (model, example_inputs)")
    path = _existing(file)
    mod_name = f"_tensoropt_factory_{abs(hash(str(path.resolve())))}"
    try:
        # None (not a Python file): the AttributeError below is reported as a failed import
        loader_spec = cast(ModuleSpec, importlib.util.spec_from_file_location(mod_name, path))
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        cast(Loader, loader_spec.loader).exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file failed to import
        sys.modules.pop(mod_name, None)
        raise ModelSpecError(f"importing {path} failed: {type(e).__name__}: {e}") from e
    factory = getattr(module, func, None)
    if not callable(factory):
        names = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                 and getattr(v, "__module__", None) == mod_name]
        raise ModelSpecError(f"{path} has no function {func!r}; functions defined there: "
                             f"{', '.join(names) or 'none'}")
    kwargs = {}
    if batch is not None:
        try:
            takes_batch = "batch" in inspect.signature(factory).parameters
        except (TypeError, ValueError):
            takes_batch = False
        if not takes_batch:
            raise ModelSpecError(f"{spec}: --batch was given but {func}() takes no `batch` parameter; "
                                 f"add `def {func}(batch=...)` or drop --batch")
        kwargs["batch"] = batch
    try:
        result = factory(**kwargs)
    except TensorOptError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ModelSpecError(f"{spec}: {func}() raised {type(e).__name__}: {e}") from e
    if not (isinstance(result, (tuple, list)) and len(result) in (2, 3) and isinstance(result[0], torch.nn.Module)):
        got = type(result).__name__ if not isinstance(result, (tuple, list)) else \
            f"a {type(result).__name__} of {len(result)} ({', '.join(type(r).__name__ for r in result)})"
        raise ModelSpecError(f"{spec}: {func}() must return (model, example_inputs) or (model, example_inputs, "
                             f"output) with model an nn.Module; it returned {got}")
    model, inputs, output = (*result, None) if len(result) == 2 else result
    if output is not None and not isinstance(output, (str, int)):
        raise ModelSpecError(f"{spec}: the third value {func}() returns names the output the loss reads: a key "
                             f"such as 'logits' or an index, got {type(output).__name__}")
    kw_inputs = dict(inputs) if isinstance(inputs, dict) else {}
    inputs = () if isinstance(inputs, dict) else _as_tuple(inputs)
    values = list(inputs) + list(kw_inputs.values())
    if not any(isinstance(a, torch.Tensor) for a in values) or \
            any(isinstance(a, (tuple, list, dict)) for a in values):
        raise ModelSpecError(f"{spec}: example_inputs must be a tensor, a tuple of inputs or a dict of keyword "
                             "inputs, with at least one tensor, got "
                             f"({', '.join(type(a).__name__ for a in values) or 'nothing'})")
    return LoadedModel(spec, func, model=model, example_inputs=inputs, params=kwargs, example_kwargs=kw_inputs,
                       output=output)
