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

import hashlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.abc import Loader
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl

from ._cache import ContentCache, cache_root, code_digest, package_version
from .errors import GraphFormatError, ModelSpecError, TensorOptError
from .graph import OpGraph, check_precision

if TYPE_CHECKING:
    import torch

    from .capture.call import ModelCall

# torch, the zoo and the capture are imported where a model is built or captured: a spec whose
# graph is read from the capture cache needs none of them (tensoropt/__init__.py)

#: what decides a captured graph besides the model and its inputs: tensoropt's code that builds and captures it
_CAPTURE_CODE = ("capture", "zoo", "modelspec.py", "graph.py", "layouts.py")


@dataclass(frozen=True)
class Built:
    """A model built from a spec: the module, its example inputs (positional and keyword) and the
    output the loss reads (:mod:`tensoropt.capture.call`)."""

    model: torch.nn.Module
    args: tuple = ()
    kwargs: dict[str, Any] | None = None
    output: str | int | None = None

    @property
    def call(self) -> ModelCall:
        from .capture.call import ModelCall

        return ModelCall(tuple(self.args), dict(self.kwargs or {}), self.output)


class LoadedModel:
    """A resolved spec: a torch model with example inputs, or a file to read a graph from.

    The model is built when first asked for (:attr:`model`, :attr:`example_inputs`, …) where the
    spec was loaded ``lazy`` — a capture read from the cache never builds it.  ``identity`` is
    what the model and its inputs are, known without building it (the zoo name and its resolved
    parameters; an ``hf:`` file's content and query; a factory file's content, function and
    arguments), for the capture cache (``None``: not cached); ``depth`` the blocks of its stack
    where ``build(layers)`` builds it at another depth (the zoo's and ``hf:``'s ``layers``), and
    ``meta`` whether it holds no data (built on the meta device), where known without building.
    """

    def __init__(self, spec: str, name: str, model: torch.nn.Module | None = None, example_inputs: tuple = (),
                 path: Path | None = None, params: dict[str, Any] | None = None,
                 example_kwargs: dict[str, Any] | None = None, output: str | int | None = None, *,
                 build: Callable[[int | None], Built] | None = None, identity: dict[str, Any] | None = None,
                 resolve: Callable[[], dict[str, Any]] | None = None, depth: Callable[[], int | None] | None = None,
                 meta: Callable[[], bool | None] | None = None):
        self.spec = spec
        self.name = name
        self.path = path                       # ONNX or graph JSON
        self._params = dict(params) if params is not None else None
        self._resolve = resolve
        self.identity = identity
        self._meta = meta
        self._build = build
        self._depth = depth
        self._built = Built(model, tuple(example_inputs), dict(example_kwargs or {}), output) \
            if model is not None else None

    @property
    def params(self) -> dict[str, Any]:
        """The spec's parameters (a zoo model's resolved: its defaults, tiny variant and query)."""
        if self._params is None:
            self._params = self._resolve() if self._resolve is not None else {}
        return self._params

    @property
    def meta(self) -> bool | None:
        """Whether the model holds no data (built on the meta device), where the spec says without
        building it (the zoo's ``meta``; ``hf:``: always); ``None`` where it does not."""
        return self._meta() if self._meta is not None else None

    # ---- the model, built when first asked for ---------------------------------------------------
    def built(self) -> Built | None:
        """The model and its inputs (built now if not yet); ``None`` for a file."""
        if self._built is None and self._build is not None:
            self._built = self._build(None)
        return self._built

    @property
    def model(self) -> torch.nn.Module | None:
        built = self.built()
        return built.model if built is not None else None

    @property
    def example_inputs(self) -> tuple:
        """The positional inputs."""
        built = self.built()
        return built.args if built is not None else ()

    @property
    def example_kwargs(self) -> dict[str, Any]:
        """The keyword inputs."""
        built = self.built()
        return dict(built.kwargs or {}) if built is not None else {}

    @property
    def output(self) -> str | int | None:
        """The output the loss reads (:mod:`tensoropt.capture.call`)."""
        built = self.built()
        return built.output if built is not None else None

    @property
    def call(self) -> ModelCall:
        """How the model is called and which output the loss reads."""
        from .capture.call import ModelCall

        built = self.built()
        return built.call if built is not None else ModelCall()

    @property
    def is_file(self) -> bool:
        """Whether the spec names a file to read a graph from (ONNX, graph JSON), not a model."""
        return self.path is not None

    def holds_no_data(self) -> bool:
        """Whether the model is built on the meta device (no weights to run: untimed profiles
        only), known without building it where the spec says (the zoo's ``meta``, ``hf:``)."""
        meta = self.meta
        if meta is not None:
            return meta
        from .capture.fake import on_meta

        model = self.model
        return model is not None and on_meta(model)

    # ---- its graph ----------------------------------------------------------------------------
    def capture(self, *, batch_dim: int = 0, method: str = "auto", precision: str | None = None,
                cache: bool | str | os.PathLike[str] = False, call: Callable[[ModelCall], ModelCall] | None = None,
                call_key: str | None = None) -> OpGraph:
        """The model's OpGraph (captured, or read from the ONNX / JSON file).  ``precision``:
        ``fp32`` / ``bf16`` (:func:`tensoropt.capture`); ``None``: fp32 for a model, the saved
        graph's own for a JSON file.  A precision a file cannot give (bf16 of an ONNX file or of
        a graph saved in fp32) is a :class:`~tensoropt.errors.ModelSpecError`.

        ``call`` changes the call before it is captured (one host's slice of the batch), which
        ``call_key`` names for the cache.  A model on the meta device whose spec gives its depth
        is captured at 4 and 3 blocks and expanded (:mod:`tensoropt.capture.expand`: no module at
        full depth); where that does not fit, whole, the notes saying why.  ``cache``: ``True``
        (the default folder, :func:`tensoropt._cache.cache_root`) or a folder: the graph is read
        from the capture cache where one of the same model, inputs, precision and versions is
        there (then it has no module and the model is not built), else captured and kept;
        ``False``: captured."""
        if precision is not None:
            check_precision(precision, ModelSpecError)
        if self.path is not None:
            return self._read_file(batch_dim, precision)
        precision = precision or "fp32"
        kept = self._kept(cache, batch_dim, method, precision, call, call_key)
        if kept is not None:
            found = kept[0].get(kept[1])
            if found is not None:
                try:
                    graph = OpGraph.from_dict(found, "cached graph")
                    graph.notes.append("read from the capture cache")
                    return graph
                except GraphFormatError:
                    pass        # an older format: capture again, and overwrite it
        graph = self._capture(batch_dim, method, precision, call)
        if kept is not None:
            kept[0].put(kept[1], graph.to_dict())
        return graph

    def capture_identity(self, *, batch_dim: int = 0, method: str = "auto", precision: str = "fp32",
                         call_key: str | None = None) -> dict[str, Any] | None:
        """What a capture of this spec depends on — the model's identity, the precision, the batch
        dimension, the capture door, the call's change, the versions of torch and transformers,
        tensoropt's capture code — computed without building it; ``None`` where not known."""
        if self.identity is None:
            return None
        return {"what": "capture", "model": self.identity, "precision": precision, "batch_dim": batch_dim,
                "method": method, "call": call_key, "torch": package_version("torch"),
                "transformers": package_version("transformers"), "code": code_digest(*_CAPTURE_CODE)}

    def _kept(self, cache: bool | str | os.PathLike[str], batch_dim: int, method: str, precision: str,
              call: Callable[[ModelCall], ModelCall] | None,
              call_key: str | None) -> tuple[ContentCache, dict[str, Any]] | None:
        if cache is False or (call is not None and call_key is None):
            return None
        identity = self.capture_identity(batch_dim=batch_dim, method=method, precision=precision, call_key=call_key)
        if identity is None:
            return None
        return ContentCache(cache_root(None if cache is True else cache), "captures"), identity

    def _capture(self, batch_dim: int, method: str, precision: str,
                 call: Callable[[ModelCall], ModelCall] | None) -> OpGraph:
        from .capture import capture
        from .capture.expand import SHORT, NotExpandable, capture_by_expansion

        def capture_one(model: torch.nn.Module, c: ModelCall) -> OpGraph:
            return capture(model, c, batch_dim=batch_dim, name=self.name, method=method, precision=precision)

        depth = self._depth() if self._depth is not None else None
        why = None
        if depth is not None and depth > SHORT and method in ("auto", "export") and self._build is not None:
            if self.meta:
                build = self._build

                def at(layers: int) -> tuple[torch.nn.Module, ModelCall]:
                    b = build(layers)
                    return b.model, call(b.call) if call is not None else b.call
                try:
                    return capture_by_expansion(at, depth, capture_one)
                except NotExpandable as e:
                    why = str(e)
            else:
                why = "the model holds weights: a timed profile and a run need its module at full depth"
        built = cast(Built, self.built())
        graph = capture_one(built.model, call(built.call) if call is not None else built.call)
        if why is not None:
            graph.notes.append(f"captured whole ({depth} blocks), not expanded from {SHORT}: {why}")
        return graph

    def _read_file(self, batch_dim: int, precision: str | None) -> OpGraph:
        assert self.path is not None
        if self.path.suffix == ".onnx":
            from .capture import load_onnx

            if precision not in (None, "fp32"):
                raise ModelSpecError(f"{self.spec}: an ONNX file is read as it is (fp32); --precision {precision} "
                                     "needs the torch model (zoo:NAME or file.py:factory)")
            return load_onnx(self.path, batch_dim=batch_dim, batch_size=self.params.get("batch"))
        graph = OpGraph.load(self.path)
        if precision is not None and precision != graph.precision:
            raise ModelSpecError(f"{self.spec} is a graph saved in {graph.precision}, not {precision}: capture the "
                                 f"model itself with --precision {precision}, or drop --precision")
        return graph


def load_model(spec: str, *, batch: int | None = None, lazy: bool = False) -> LoadedModel:
    """Resolve a model spec (see the module docstring); ``batch`` overrides the batch size.
    ``lazy``: build the model when first asked for (a capture read from the cache never does);
    errors the build finds (a config transformers rejects, a factory that raises) come then.

    Raises :class:`~tensoropt.errors.ModelSpecError` with the cause and the fix.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelSpecError("empty model spec; use zoo:NAME, hf:path/to/config.json, path/to/file.py:factory or "
                             "path/to/model.onnx")
    spec = spec.strip()
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise ModelSpecError(f"batch must be a positive integer, got {batch!r}")
    if spec.startswith("zoo:"):
        loaded = _load_zoo(spec, batch)
    elif spec.startswith("hf:"):
        loaded = _load_hf(spec, batch)
    elif spec.endswith(".onnx"):
        path = _existing(spec)
        return LoadedModel(spec, path.stem, path=path, params={"batch": batch} if batch else {})
    elif spec.endswith(".json"):
        if batch is not None:
            raise ModelSpecError(f"{spec} is a saved graph with a fixed batch size; --batch cannot change it")
        path = _existing(spec)
        return LoadedModel(spec, path.stem, path=path)
    elif ".py:" in spec or spec.endswith(".py"):
        loaded = _load_factory(spec, batch)
    else:
        raise ModelSpecError(f"cannot read model spec {spec!r}: use zoo:NAME (see `tensoropt zoo`), "
                             "hf:path/to/config.json?batch=N&seq_len=N, path/to/file.py:factory, path/to/model.onnx or "
                             "path/to/graph.json")
    if not lazy:
        loaded.built()
    return loaded


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

    def resolve() -> dict[str, Any]:
        from . import zoo

        try:
            return zoo.resolve_params(name, params, tiny=tiny)
        except (ValueError, ImportError) as e:
            raise ModelSpecError(str(e)) from None

    def build(layers: int | None) -> Built:
        from . import zoo

        resolve()       # an unknown name or parameter says so before anything is built
        try:
            model, inputs = zoo.build(name, {**params, "layers": layers} if layers is not None else params, tiny=tiny)
        except (ValueError, ImportError) as e:
            raise ModelSpecError(str(e)) from None
        return Built(model, _as_tuple(inputs))

    def depth() -> int | None:
        layers = loaded.params.get("layers")
        return layers if isinstance(layers, int) and not isinstance(layers, bool) else None

    def meta() -> bool | None:
        on = loaded.params.get("meta")
        return on if isinstance(on, bool) else None

    label = name + ("-tiny" if tiny else "")
    # what the model is, for the capture cache, without importing the zoo (torch): its name and
    # query as given — the zoo's code, which turns them into a model, is in the capture's identity
    loaded = LoadedModel(spec, label, build=build, resolve=resolve, depth=depth, meta=meta,
                         identity={"zoo": name, "tiny": tiny, "query": params, "name": label})
    return loaded


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
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem

    def build(layers: int | None) -> Built:
        from .zoo import hf

        try:
            model, inputs = hf.from_config(config, batch=params["batch"], seq_len=params.get("seq_len"),
                                               layers=layers if layers is not None else params.get("layers"))
        except (ValueError, ImportError) as e:
            raise ModelSpecError(f"{spec}: {e}") from None
        return Built(model, _as_tuple(inputs))

    def depth() -> int | None:
        from .zoo import hf

        try:
            return params.get("layers") or hf.layers_of(config)
        except (ValueError, ImportError) as e:
            raise ModelSpecError(f"{spec}: {e}") from None

    identity = {"hf": hashlib.sha256(path.read_bytes()).hexdigest(), "params": dict(params), "name": name}
    return LoadedModel(spec, name, params=dict(params), build=build, identity=identity, depth=depth,
                       meta=lambda: True)


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
    kwargs = {} if batch is None else {"batch": batch}
    # what the factory builds, for the capture cache: its file's content (not the helpers it imports)
    identity = {"factory": func, "file": hashlib.sha256(path.read_bytes()).hexdigest(), "kwargs": kwargs,
                "name": func}
    return LoadedModel(spec, func, params=kwargs, identity=identity,
                       build=lambda layers: _run_factory(spec, path, func, batch))


def _run_factory(spec: str, path: Path, func: str, batch: int | None) -> Built:
    import torch

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
    return Built(model, inputs, kw_inputs, output)
