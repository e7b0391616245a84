"""The profiler: run every operator of a captured graph alone, forward and backward, at every
shard shape a configuration may give it, and return a :class:`~tensoropt.measure.costmodel.CostModel`.

How (the NetSplit thesis §4.4, FastT's profiled op times "CostModel"):

1. The captured ``GraphModule`` runs once on the example inputs under a ``torch.fx.Interpreter``
   (no autograd, values freed after their last use), so every node sees *real* argument values
   — token ids that index an embedding, masks, statistics — not random stand-ins.
2. At each node the op is called alone on copies of those arguments: inputs that carry a
   gradient in training (anything downstream of a trainable parameter, and the trainable
   parameters themselves) are autograd leaves, so the backward measured is the one training
   runs (the first convolution computes no input gradient).  Forward = the call with grad
   enabled; backward = ``torch.autograd.grad`` of the outputs with a random output gradient
   (``retain_graph`` so it can be repeated).  Median of repeats, CUDA events on GPU.
3. Saved-tensor hooks record what autograd keeps for backward, split into the node's inputs,
   its output and extra tensors (dropout masks, batch-norm statistics): the memory model's
   activation figures.
4. Shards: the same at the largest shard of every legal layout (``batch`` / ``channel`` /
   ``reduce``) and degree (:mod:`tensoropt.measure.shards`); a shard whose rule does not give the
   expected shape, or that raises, is not offered (the executors would run the op whole); a
   batch shard no rule can cut (a generator sized by the batch, a module call of a torch.fx
   capture) is the full cost scaled by ``1/k`` and marked ``scaled``.  A
   training batch norm's batch shard is timed as what the executors run there: its share of a
   synchronised batch norm (:func:`tensoropt.syncbn.local_step`; the exchange of statistics is a
   transfer, :func:`tensoropt.planmodel.reshard.stat_sync`).
5. Measurements are cached by (op, argument shapes / dtypes / gradient flags, other arguments)
   within the run — identical layers are measured once — and on disk per device kind
   (``~/.cache/tensoropt`` or ``$TENSOROPT_CACHE_DIR``).  Profiling a model whose calls are all
   cached walks the graph on FakeTensors only (no compute): nearly free.  A node that cannot run
   alone gets a roofline estimate (FLOPs from ``FlopCounterMode`` over the measured peak FLOP/s,
   bytes over the measured memory bandwidth) marked ``roofline``.
6. Precision: a ``bf16`` graph (:attr:`OpGraph.precision <tensoropt.graph.OpGraph.precision>`)
   is walked, and every call measured, under the autocast it was captured in
   (:func:`tensoropt.capture.precision_context`), so outputs, saved tensors — autocast's
   bfloat16 copies of the weights and inputs a matmul or convolution saves for backward
   included — and times are the bf16 ones.  ``settings["precision"]`` records it;
   :func:`check_precision` refuses a profile used with a graph of another precision.

Example::

    >>> from tensoropt import capture
    >>> graph = capture(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()), (torch.randn(8, 16),))
    >>> costs = profile(graph, device="cpu", shard_degrees=(2, 4), repeats=2)
    >>> costs.save("profile.json")
    >>> sorted(costs.nodes["linear"].shards), costs.settings["in_sequence"]["used"]
    ([('batch', 2), ('batch', 4), ('channel', 2), ('channel', 4), ('reduce', 2), ('reduce', 4)], True)
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from .. import syncbn
from .._cache import cache_root
from .._io import write_json_atomic
from .._malloc import steady_malloc
from ..capture import first_line, quiet_torch_logs
from ..capture.precision import precision_context, precision_of
from ..errors import ProfileError
from ..graph import OpGraph, OpNode, Precision, TensorMeta, grad_nodes, split_fits
from ..layouts import SPLIT_LAYOUTS, Layout
from ..progress import Progress, no_progress
from .costmodel import CostModel, NodeCost, ShardCost, Work
from .feed import fake_module, module_on, placeholder_values, runs_on_fake
from .flops import counting_flops
from .kept import keep_profile, kept_profile
from .sequence import SEQUENCE_VERSION, SequenceTimes, in_sequence_costs, shard_batch, time_in_sequence
from .shards import TensorArg, shard_args, shard_size
from .storage import node_scratch_bytes, scratch_bytes
from .timing import device_info, device_key, time_callable

#: 2: measured in :func:`~tensoropt._malloc.steady_malloc`'s allocator regime (version 1's
#: figures depended on which blocks the process had freed before); 4: shard arguments are copies
#: (version 3's leading pieces were views of the whole storage: their shards' bytes overstated);
#: 5: an activation needs a gradient only downstream of a trainable parameter (version 4 timed a
#: first layer's backward with an input gradient training never computes)
#: 6: every call records its work (forward and backward FLOPs and bytes, :class:`.costmodel.Work`)
#: 7: fused recurrent layers (LSTM, GRU) record their FLOPs (FlopCounterMode counts none for them)
#: 8: fused attention on the CPU records its FLOPs, causal attention the pairs it computes (:mod:`.flops`)
#: 9: every call records its scratch on every device (:func:`.storage.scratch_bytes`; version 8's was
#: the CUDA allocator's only, 0 on the CPU)
CACHE_VERSION = 9
#: an untimed profile of a large model with values runs on FakeTensors too (:func:`_fake_pays`):
#: its memory and work are the same as on real tensors, without the compute — GPT-2-12L's untimed
#: profile took 59.5 s on 2 cores computing what only shapes decide, 2.5 s on FakeTensors, every
#: node's figures equal; equal too on every zoo family but the fused recurrent layers, whose fake
#: kernel saves other tensors than the CPU's (tests/measure/test_meta.py; and PyTorch's fake batch
#: norm under bf16 autocast keeps its two statistics in bfloat16 where the CPU kernel keeps float32:
#: 4 bytes a channel).  ``False``: always on the real tensors
UNTIMED_ON_FAKE = True
#: the operators' outputs, in bytes, from which a fake run pays: FakeTensors cost about 4 ms an
#: operator whatever its size (a tiny Inception-v3: 3.3 s fake, 0.8 s real), a real run its compute
FAKE_MIN_OUTPUT_BYTES = 1 << 30


@dataclass(frozen=True)
class Measurement:
    """One op call measured alone (what the cache stores)."""
    fp_s: float
    bp_s: float
    output_bytes: int
    saved_bytes: int
    extra_saved_bytes: int
    saved_args: tuple[int, ...]   # positions (among the call's tensor arguments) of saved inputs
    saves_output: bool
    workspace_bytes: int
    flops: int
    out_shape: tuple[int, ...]    # first output's shape, to check a shard rule
    method: str = "measured"
    bp_flops: int = 0             # with ``flops`` and the bytes: the call's Work
    fp_bytes: int = 0
    bp_bytes: int = 0

    @property
    def work(self) -> Work:
        return Work(self.flops, self.bp_flops, self.fp_bytes, self.bp_bytes)


def profile(graph: OpGraph, *, device: str = "cpu", shard_degrees: Sequence[int] = (1, 2, 4, 8),
            repeats: int = 5, warmup: int = 1, cache: bool | str | os.PathLike = True,
            progress: Progress = no_progress, inputs: tuple | None = None,
            in_sequence: bool = True, timed: bool = True) -> CostModel:
    """Measure every node of ``graph`` alone, then (``in_sequence``) inside whole training steps;
    see the module docstring.

    ``graph`` must come from :func:`tensoropt.capture` (it needs the captured module), or be a
    graph expanded from a short capture (:mod:`tensoropt.capture.expand`; untimed only): the short
    graph is profiled and every copy of its repeated block takes its operators' costs — identical
    calls, which the profiler measures once anyway (:func:`expanded_costs`).  ``inputs`` overrides
    the example inputs it was captured with.  ``shard_degrees``: the degrees ``k > 1`` measured
    per legal layout.  ``cache``: ``True`` for the default folder
    (:func:`tensoropt._cache.cache_root`), a folder, or ``False``: the measured calls are kept
    there, and a whole untimed profile by what it depends on (the graph's fingerprint, the
    degrees, repeats and warm-up, the device, torch's version and the profiler's code) — found
    there, it is returned without running anything (the graph needs no module then).
    ``progress``: told ``("profile", done, total, node_name)`` as nodes are measured
    (:class:`~tensoropt.progress.Progress`).  ``in_sequence``: replace the isolated times by what
    each node costs inside a training step (:mod:`.sequence`; off, or when a whole step does not
    fit in memory, the isolated times stay and ``settings["in_sequence"]`` says why).
    ``timed=False``: run every call once for its memory figures and its work, time nothing
    (every time is 0, no in-sequence run, ``settings["timed"]`` false) — for a device model to
    price (:func:`tensoropt.devicemodel.convert`); such a profile is refused anywhere else.
    Everything runs in ``graph.precision`` (a bf16 graph under its autocast; module docstring,
    6.), recorded in ``settings["precision"]``.  Runs the model's forward once plus, per distinct
    op call, ``warmup + repeats`` forward and backward calls, plus ``2 + repeats`` training steps
    at the full batch and at each batch shard.
    """
    degrees = sorted({int(k) for k in shard_degrees if int(k) > 1})
    dev = profiling_device(device)
    keeps = not timed and inputs is None
    if keeps:
        hit = kept_profile(graph, device=device, shard_degrees=degrees, repeats=repeats, warmup=warmup, cache=cache)
        if hit is not None:
            progress("profile", len(graph.ops), len(graph.ops), "read from the profile cache")
            return hit
    if graph.expansion is not None:
        if timed:
            raise ProfileError(unmeasurable(graph.name))
        costs, calls = _profile(graph.expansion.template, dev, degrees, repeats, warmup, cache, progress, inputs,
                                in_sequence, timed)
        costs = expanded_costs(costs, calls, graph)
    else:
        costs, _ = _profile(graph, dev, degrees, repeats, warmup, cache, progress, inputs, in_sequence, timed)
    if keeps:
        keep_profile(costs, graph, device=device, shard_degrees=degrees, repeats=repeats, warmup=warmup, cache=cache)
    return costs


def _profile(graph: OpGraph, dev: torch.device, degrees: list[int], repeats: int, warmup: int,
             cache: bool | str | os.PathLike, progress: Progress, inputs: tuple | None, in_sequence: bool,
             timed: bool) -> tuple[CostModel, dict[str, int]]:
    """:func:`profile` of a captured graph, and the calls (measured or cached) each node made."""
    if graph.module is None:
        raise ProfileError(f"graph {graph.name!r} has no captured module (it was loaded from "
                           f"{graph.source or 'a file'}, or read from the capture cache); profile the model itself, "
                           "e.g. tensoropt profile zoo:NAME or tensoropt.profile(tensoropt.capture(model, inputs))")
    if timed and runs_on_fake(graph):
        raise ProfileError(unmeasurable(graph.name))
    steady_malloc()   # one allocator regime for the profile and the executors (why: tensoropt._malloc)
    t0 = time.perf_counter()
    load0 = _loadavg()
    basic = device_info(dev, measure=False)
    store = _DiskCache(cache, device_key(basic))
    total = len(graph.ops)

    def report(done: int, _total: int, name: str) -> None:
        progress("profile", done, total, name)

    runner = _measure_ops(graph, dev, degrees, repeats, warmup, store,
                          inputs if inputs is not None else graph.example_inputs, report, timed)
    info = runner.info
    costs = runner.costs
    sequence: dict[str, Any] = {"used": False}
    if in_sequence and timed:
        costs, sequence = _in_sequence(graph, costs, dev, inputs, degrees, repeats, store)
    store.save()
    settings = _profile_settings(graph, runner, repeats, warmup, degrees, sequence, load0)
    settings["timed"] = timed
    return CostModel(costs, graph_fingerprint=graph.fingerprint, graph_name=graph.name,
                     batch_size=graph.batch_size, device=info, settings=settings,
                     profile_s=time.perf_counter() - t0), runner.calls


def expanded_costs(costs: CostModel, calls: dict[str, int], graph: OpGraph) -> CostModel:
    """The profile of ``graph``, expanded from a short capture (:attr:`OpGraph.expansion`), from
    ``costs``, the profile of that capture: every node takes the costs of the node it copies (its
    saved inputs named as the copy's), and the calls of every extra copy count as cached — they
    are the calls of the copied node, which a whole run would find measured (``calls``: each
    template node's calls, :attr:`_Runner.calls`).  What profiling the whole graph would give."""
    exp = graph.expansion
    template = exp.template.nodes
    nodes: dict[str, NodeCost] = {}
    extra = -sum(calls.get(n.name, 0) for n in exp.template.ops)
    for e in graph.ops:
        t = exp.origin[e.name]
        c = costs.nodes[t]
        renamed = dict(zip(template[t].inputs, e.inputs))
        nodes[e.name] = dataclasses.replace(c, name=e.name, saved_inputs=tuple(renamed[s] for s in c.saved_inputs))
        extra += calls.get(t, 0)
    settings = {**costs.settings, "cached_calls": costs.settings.get("cached_calls", 0) + extra}
    return CostModel(nodes, graph_fingerprint=graph.fingerprint, graph_name=graph.name, batch_size=graph.batch_size,
                     device=costs.device, settings=settings, profile_s=costs.profile_s)


def _measure_ops(graph: OpGraph, dev: torch.device, degrees: list[int], repeats: int, warmup: int,
                 store: _DiskCache, inputs: Any, report: Callable[[int, int, str], None],
                 timed: bool = True) -> _Runner:
    """Every node measured alone, at full shape and each shard: a model on the meta device on
    FakeTensors only (:func:`~.feed.runs_on_fake`: it has no values to run); otherwise, when the
    cache holds entries, a dry run on FakeTensors first (no compute) — enough if every call is
    cached — else a real run (the device measured, its info stored)."""
    runner = None
    with quiet_torch_logs():  # a failing fake-tensor op logs its traceback before we handle it
        if runs_on_fake(graph):
            runner = _Runner(graph, dev, degrees, repeats, warmup, store, device_info(dev, measure=False),
                             timed=timed, fake=True)
            runner.run(inputs, report)
            return runner
        if not timed and UNTIMED_ON_FAKE and _fake_pays(graph):
            # an op FakeTensors cannot run (a size from values) is run for real instead
            runner = _Runner(graph, dev, degrees, repeats, warmup, store, device_info(dev, measure=False),
                             timed=False, fake=True)
            try:
                runner.run(inputs, report)
                return runner
            except ProfileError:
                runner = None
        if store.entries and store.info:  # everything cached? find out on FakeTensors, no compute
            runner = _Runner(graph, dev, degrees, repeats, warmup, store, store.info, dry=True, timed=timed)
            if not runner.run_dry(inputs, report):
                runner = None
        if runner is None:
            info = device_info(dev, measure=timed)
            if timed:
                store.info, store.dirty = info, True
            runner = _Runner(graph, dev, degrees, repeats, warmup, store, info, timed=timed)
            runner.run(inputs, report)
    return runner


def _fake_pays(graph: OpGraph) -> bool:
    """Whether an untimed profile of ``graph`` runs on FakeTensors (:data:`UNTIMED_ON_FAKE`): its
    operators write at least :data:`FAKE_MIN_OUTPUT_BYTES`, and none is a fused recurrent layer."""
    if any(_basename(op.op) in _RECURRENT for op in graph.ops):
        return False
    return sum(op.output_bytes for op in graph.ops) >= FAKE_MIN_OUTPUT_BYTES


def _profile_settings(graph: OpGraph, runner: _Runner, repeats: int, warmup: int, degrees: list[int],
                      sequence: dict[str, Any], load0: float) -> dict[str, Any]:
    """How the profile was made: precision, repeats, degrees, the in-sequence run, calls measured
    and cached, and the machine's load before and after."""
    return {"precision": precision_of(graph),
            "repeats": repeats, "warmup": warmup, "shard_degrees": [1, *degrees], "in_sequence": sequence,
            "measured_calls": runner.measured_calls, "cached_calls": runner.cached_calls,
            "from_cache_only": runner.dry,   # every call was cached: nothing ran on real tensors
            # other work on the machine inflates every time (an OpenMP region waits for a
            # descheduled thread): keep the load seen, so a busy profile can be told apart
            "load_average": [round(x, 2) for x in (load0, _loadavg())], "cpu_count": os.cpu_count()}


def check_precision(costs: CostModel, graph: OpGraph) -> None:
    """Refuse a profile measured in another precision than ``graph``'s (a profile made before
    precisions existed was fp32), naming both and the fix; the fingerprint check
    (:meth:`CostModel.check_graph`) would refuse it too, without saying why."""
    have, want = costs.settings.get("precision", "fp32"), precision_of(graph)
    if have != want:
        raise ProfileError(f"the profile of {costs.graph_name!r} was measured in {have}, but graph {graph.name!r} "
                           f"trains in {want}: profile it in {want} (tensoropt profile MODEL --precision {want} "
                           f"-o profile.json), or capture the graph in {have} (--precision {have})")


def _in_sequence(graph: OpGraph, costs: dict[str, NodeCost], dev: torch.device, inputs: tuple | None,
                 degrees: list[int], repeats: int, store: _DiskCache) -> tuple[dict[str, NodeCost], dict[str, Any]]:
    """``costs`` with in-sequence times (:func:`.sequence.in_sequence_costs`) from whole steps at
    the full batch and at every batch shard's batch (cached with the measurements), and what
    was done for the settings.  A full-batch step that fails (out of memory) leaves ``costs``;
    a shard batch the graph cannot run at leaves those shards to the ratio."""
    def run(batch: int | None) -> SequenceTimes:
        key = f"{graph.fingerprint}|batch={batch}|v{SEQUENCE_VERSION}"
        hit = store.sequences.get(key)
        if hit is None:
            hit = time_in_sequence(graph, device=dev, inputs=inputs, batch=batch, repeats=repeats)
            store.sequences[key] = hit
            store.dirty = True
        return hit

    try:
        with quiet_torch_logs():
            full = run(None)
    except (RuntimeError, ProfileError, torch.cuda.OutOfMemoryError) as e:   # a whole step does not fit / run
        return costs, {"used": False, "why": f"a whole training step failed ({first_line(e)}): isolated times kept"}
    by_batch: dict[int, SequenceTimes] = {}
    skipped: dict[int, str] = {}
    for k in degrees:
        b = shard_batch(graph, k)
        if b is None:
            continue
        try:
            with quiet_torch_logs():
                by_batch[k] = run(b)
        except Exception as e:  # noqa: BLE001 - sizes fixed in the graph: these shards take the ratio
            skipped[k] = first_line(e)
    adjusted = in_sequence_costs(costs, graph, full, by_batch)
    isolated = sum(c.fp_s + c.bp_s for c in costs.values())
    timed = sum(c.fp_s + c.bp_s for c in adjusted.values())
    return adjusted, {"used": True, "step_s": full.step_s, "isolated_sum_s": isolated, "in_sequence_sum_s": timed,
                      "grad_copy_Bps": full.grad_copy_Bps,
                      "batch_runs": {str(k): t.batch for k, t in by_batch.items()},
                      **({"batch_runs_failed": {str(k): why for k, why in skipped.items()}} if skipped else {})}


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def busy_warning(costs: CostModel) -> str | None:
    """A warning when the machine was busy while profiling (1-minute load above the core count
    plus our own process), else ``None``."""
    load, cpus = costs.settings.get("load_average"), costs.settings.get("cpu_count")
    if not load or not cpus or max(load) <= cpus + 0.5:
        return None
    return (f"the machine was busy while profiling (load average up to {max(load):.1f} on {cpus} cores): "
            "times may be inflated; profile again on a quiet machine (cached ops are not re-measured: use --no-cache)")


def profiling_device(device: str) -> torch.device:
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ProfileError(f"unknown device {device!r}; use cpu or cuda[:N]") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ProfileError(f"device {device!r} asked for, but torch sees no CUDA GPU here; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ProfileError(f"device {device!r} does not exist: torch sees {torch.cuda.device_count()} GPU(s)")
    elif dev.type != "cpu":
        raise ProfileError(f"device type {dev.type!r} is not supported; use cpu or cuda[:N]")
    return dev


class _DiskCache:
    """Measurements by call key, persisted per device kind as one JSON file."""

    def __init__(self, cache: bool | str | os.PathLike, key: str):
        self.entries: dict[str, Measurement] = {}
        #: in-sequence runs by graph fingerprint and batch (:mod:`.sequence`)
        self.sequences: dict[str, SequenceTimes] = {}
        self.info: dict[str, Any] = {}   # the device description (measured peaks) of the entries
        self.path: Path | None = None
        self.dirty = False
        self.key = key
        if cache is False:
            return
        folder = cache_root(None if isinstance(cache, bool) else cache)
        slug = re.sub(r"[^A-Za-z0-9]+", "-", key).strip("-")[:120]
        self.path = folder / f"profile-cache-{slug}.json"
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("version") == CACHE_VERSION and data.get("device") == key:
                self.info = data.get("info") or {}
                for k, v in data["entries"].items():
                    self.entries[k] = Measurement(**{**v, "saved_args": tuple(v["saved_args"]),
                                                     "out_shape": tuple(v["out_shape"])})
                for k, v in (data.get("sequences") or {}).items():
                    self.sequences[k] = SequenceTimes.from_dict(v)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # no cache yet, or one from another version: measure afresh and overwrite it

    def get(self, key: str) -> Measurement | None:
        return self.entries.get(key)

    def put(self, key: str, m: Measurement) -> None:
        self.entries[key] = m
        self.dirty = True

    def save(self) -> None:
        if self.path is None or not self.dirty:
            return
        with contextlib.suppress(OSError):   # a read-only home must not fail a profile; the next run measures again
            write_json_atomic(self.path, {"version": CACHE_VERSION, "device": self.key, "info": self.info,
                                          "entries": {k: asdict(m) for k, m in self.entries.items()},
                                          "sequences": {k: t.to_dict() for k, t in self.sequences.items()}})


def unmeasurable(name: str) -> str:
    """Why a model on the meta device cannot be profiled with timing, and what to do instead."""
    return (f"model {name!r} is on the meta device: its weights hold no values, so none of its operators can be "
            "timed; let a GPU kind's device model price them (tensoropt frontier / compare with a cluster of GPUs, "
            "or --costs-from model), or materialise a smaller variant (fewer layers) to measure that")


class _Runner(fx.Interpreter):
    """Runs the captured module once, measuring each node alone as it goes.  ``fake``: every
    value is a FakeTensor (a model on the meta device: shapes, memory and work, no values)."""

    def __init__(self, graph: OpGraph, dev: torch.device, degrees: list[int], repeats: int, warmup: int,
                 store: _DiskCache, info: dict[str, Any], dry: bool = False, timed: bool = True,
                 fake: bool = False):
        gm = graph.module
        self.exported = graph.exported
        if self.exported is None and not fake:  # torch.fx capture: the module holds the user's own
            gm = copy.deepcopy(gm)  # parameters and buffers; batch norm would update their running statistics
        self.mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
        gm = module_on(gm, dev)
        super().__init__(fake_module(gm, self.mode, dev) if self.mode is not None else gm.to(dev),
                         garbage_collect_values=True)
        self.fake = fake
        self.graph_ = graph
        self.dev = dev
        self.precision = precision_of(graph)   # every call runs under the graph's autocast
        self.degrees = degrees
        self.repeats, self.warmup = repeats, warmup
        self.store = store
        self.info = info
        self.needs_grad = grad_nodes(graph)
        self.param_of_placeholder: dict[str, str] = {}
        self.costs: dict[str, NodeCost] = {}
        self.seen: dict[str, Measurement] = {}
        self.measured_calls = self.cached_calls = 0
        #: the calls (measured or cached) each node made, by node name
        self.calls: dict[str, int] = {}
        self.report: Callable = lambda *a: None
        self.dry = dry  # only look calls up in the cache, on FakeTensors (raises _CacheMiss)
        self.timed = timed  # False: run each call once for memory and work, time nothing

    # ---- driving -----------------------------------------------------------------------------
    def run(self, inputs: tuple | None, report: Callable) -> None:  # type: ignore[override]
        self.report = report
        if self.mode is not None:
            self._run_fake(inputs, self.mode)
            return
        args = self._placeholder_values(inputs)
        with torch.no_grad(), precision_context(self.precision, self.dev):
            super().run(*args)

    def run_dry(self, inputs: tuple | None, report: Callable) -> bool:
        """Walk the graph on FakeTensors, taking every call from the cache; ``False`` (and no
        costs) as soon as one call is missing or anything cannot run on FakeTensors."""
        self.report = report
        try:
            self._run_fake(inputs, FakeTensorMode(allow_non_fake_inputs=True))
            return True
        except Exception:  # noqa: BLE001 - a miss, or an op FakeTensors cannot run: measure for real
            self.costs.clear()
            self.calls.clear()
            self.cached_calls = 0
            return False

    def _run_fake(self, inputs: tuple | None, mode: FakeTensorMode) -> None:
        with mode:
            args = self._placeholder_values(inputs, mode)
            with torch.no_grad(), precision_context(self.precision, self.dev):
                super().run(*args)

    def _placeholder_values(self, inputs: tuple | None, fake: FakeTensorMode | None = None) -> list[Any]:
        values, owners = placeholder_values(self.graph_, cast(fx.GraphModule, self.module), self.dev, inputs, fake)
        self.param_of_placeholder.update(owners)
        return values

    def run_node(self, n: fx.Node) -> Any:
        try:
            result = super().run_node(n)
        except Exception as e:
            if not self.fake:
                raise
            raise ProfileError(_no_fake_run(self.graph_, n, e)) from e
        op = self.graph_.nodes.get(n.name)
        if op is not None and op.kind == "op":
            before = self.measured_calls + self.cached_calls
            self.costs[n.name] = self._cost(n, op)
            self.calls[n.name] = self.measured_calls + self.cached_calls - before
            self.report(len(self.costs), len(self.graph_.ops), n.name)
        return result

    # ---- one node ----------------------------------------------------------------------------
    def _cost(self, n: fx.Node, op: OpNode) -> NodeCost:
        param_bytes = sum(self.graph_.params[p].nbytes for p in op.params)
        fn, args, kwargs, extra_params = self._callable(n)
        tinfo, producers = self._tensor_args(n, args, kwargs)
        if op.metadata_only:
            # a batch split always runs (the executors give a view its shard's batch through the
            # graph's symbolic batch size); a channel split only where the shard rule fits
            out0 = op.outputs[0] if op.outputs else None
            free = ShardCost(0.0, 0.0, 0, 0, 0, "free")
            free_shards = {(Layout.BATCH.value, k): free for k in self.degrees
                           if _shard_shape(op, out0, Layout.BATCH, k) is not None}
            free_shards.update({(Layout.CHANNEL.value, k): free for k in self.degrees
                                if self._view_shard_runs(n, op, fn, args, kwargs, tinfo, k)})
            return NodeCost(op.name, op.op, 0.0, 0.0, "free", param_bytes=param_bytes, shards=free_shards)
        grad = self.needs_grad.get(op.name, False) and not _in_place(op.op)
        full = self._measure(op.op, fn, args, kwargs, tinfo, extra_params, grad)
        saved_inputs = tuple(dict.fromkeys(producers[i] for i in full.saved_args if producers.get(i)))
        shards: dict[tuple[str, int], ShardCost] = {}
        out0 = op.outputs[0] if op.outputs else None
        base = _basename(op.op)
        for layout in SPLIT_LAYOUTS:
            legal = {Layout.BATCH: op.split.batch is not None, Layout.CHANNEL: op.split.channel is not None,
                     Layout.REDUCE: True}[Layout(layout)]
            if not legal or out0 is None:
                continue
            for k in self.degrees:
                if not split_fits(layout, k, self.graph_.batch_size):
                    continue
                sc = self._shard(n, op, base, fn, args, kwargs, tinfo, extra_params, grad, full, layout, k, out0)
                if sc is not None:
                    shards[(layout, k)] = sc
        return NodeCost(op.name, op.op, full.fp_s, full.bp_s, full.method, param_bytes=param_bytes,
                        output_bytes=full.output_bytes, saved_inputs=saved_inputs, saves_output=full.saves_output,
                        saved_bytes=full.saved_bytes, extra_saved_bytes=full.extra_saved_bytes,
                        workspace_bytes=full.workspace_bytes, flops=full.flops, shards=shards, work=full.work)

    def _view_shard_runs(self, n, op, fn, args, kwargs, tinfo, k: int) -> bool:
        """Whether a metadata-only node (a view) split ``k`` ways along its channels is one the
        executors can run: the shard rule cuts its arguments and the cut call gives the promised
        shape.  Where not (a view that folds the channels into another dimension), the executors
        run it whole, so the plan must not count it split for free."""
        out0 = op.outputs[0] if op.outputs else None
        expected = _shard_shape(op, out0, Layout.CHANNEL, k)
        if expected is None or n.op != "call_function":
            return False
        try:
            cut = shard_args(_basename(op.op), args, kwargs, tinfo, Layout.CHANNEL, k,
                             cast(TensorMeta, out0))   # not None: expected is not None
            if cut is None:
                return False
            got = fn(*cut[0], **cut[1])
        except Exception:  # noqa: BLE001 - any failure means the executors fall back to the whole view
            return False
        return isinstance(got, torch.Tensor) and list(got.shape) == expected

    def _shard(self, n, op, base, fn, args, kwargs, tinfo, extra_params, grad, full: Measurement,
               layout: str, k: int, out0: TensorMeta) -> ShardCost | None:
        expected = _shard_shape(op, out0, layout, k) if layout != Layout.REDUCE else list(out0.shape)
        if expected is None:
            return None
        cut = None
        if n.op == "call_function":
            try:
                cut = shard_args(base, args, kwargs, tinfo, layout, k, out0)
            except (IndexError, RuntimeError, TypeError, ValueError):
                cut = None
        if cut is None:
            if layout != Layout.BATCH:
                # no shard rule: the executors would run this op whole, so no plan may count it
                # split (partial sums and channel pieces exist only for the ops shard_args knows)
                return None
            return _scaled(full, k)
        cargs, ckwargs = cut
        ctinfo = {}
        for old, new in zip(_tensors((args, kwargs)), _tensors((cargs, ckwargs))):
            if id(old) in tinfo:
                ctinfo[id(new)] = tinfo[id(old)]
        opname = op.op
        if base == "batch_norm" and layout == Layout.BATCH and k > 1 and len(cargs) > 5 and cargs[5]:
            # the executors synchronise a batch-split training batch norm: time their share of it
            fn, opname = syncbn.local_step, "tensoropt.syncbn.local_step"
        try:
            m = self._measure(opname, fn, cargs, ckwargs, ctinfo, extra_params, grad, estimate=False)
        except _CacheMiss:
            raise   # a dry run missed the cache: the profiler measures for real instead
        except Exception:  # noqa: BLE001 - the shard rule does not fit this call: the executors run it whole
            return None
        if list(m.out_shape) != expected:
            return None     # nor where its shard is not the promised piece of the output
        return ShardCost(m.fp_s, m.bp_s, m.output_bytes, m.saved_bytes, m.extra_saved_bytes, m.method, m.work)

    def _callable(self, n: fx.Node) -> tuple[Callable, tuple, dict, list[torch.Tensor]]:
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        if n.op == "call_module":
            mod = self.fetch_attr(str(n.target))
            return mod, args, kwargs, [p for p in mod.parameters() if p.requires_grad]
        if n.op == "call_method":
            return (lambda self_, *a, _m=n.target, **kw: getattr(self_, _m)(*a, **kw)), args, kwargs, []
        if n.op == "get_attr":
            value = self.fetch_attr(str(n.target))
            return (lambda: value), (), {}, []
        return cast(Callable[..., Any], n.target), args, kwargs, []

    def _tensor_args(self, n: fx.Node, args: tuple, kwargs: dict) -> tuple[dict[int, TensorArg], dict[int, str]]:
        """What each tensor argument is, and the producer node of each (by tensor position)."""
        arg_nodes = [a for a in tree_flatten((n.args, n.kwargs))[0]]
        vals = tree_flatten((args, kwargs))[0]
        info: dict[int, TensorArg] = {}
        producers: dict[int, str] = {}
        pos = 0
        for a, v in zip(arg_nodes, vals):
            if not isinstance(v, torch.Tensor):
                continue
            if isinstance(a, fx.Node) and a.name in self.param_of_placeholder:
                info[id(v)] = TensorArg("param", None, self._is_trainable(v))
            elif isinstance(a, fx.Node) and a.name in self.graph_.nodes:
                src = self.graph_.nodes[a.name]
                info[id(v)] = TensorArg("activation", src.outputs[0] if len(src.outputs) == 1 else None,
                                        self.needs_grad.get(a.name, False))
                producers[pos] = a.name
            elif isinstance(a, fx.Node) and a.op == "get_attr":
                info[id(v)] = TensorArg("param", None, self._is_trainable(v))
            pos += 1
        return info, producers

    def _measure(self, opname: str, fn: Callable, args: tuple, kwargs: dict, tinfo: dict[int, TensorArg],
                 extra_params: list[torch.Tensor], grad: bool, estimate: bool = True) -> Measurement:
        """Measure one call (or reuse an identical one).  A call that fails gets a roofline
        estimate when ``estimate``, else the exception propagates (a shard rule that does not
        fit the op is the caller's to handle)."""
        grad_flags = self._grad_flags(args, kwargs, tinfo, grad)
        key = _call_key(opname, fn, args, kwargs, grad_flags, extra_params, self.precision)
        if not self.timed:
            key = f"untimed|{key}"    # never served to a timed profile
        hit = self.seen.get(key) or self.store.get(key)
        if hit is None and self.dry:
            raise _CacheMiss(key)
        if hit is not None:
            self.seen[key] = hit
            self.cached_calls += 1
            return Measurement(**{**asdict(hit), "method": "cached" if hit.method == "measured" else hit.method})
        try:
            param_flags = [tinfo.get(id(v), TensorArg("param")).kind == "param" for v in _tensors((args, kwargs))]
            m = _measure_call(fn, args, kwargs, grad_flags, param_flags, extra_params if grad else [], self.dev,
                              self.repeats, self.warmup, self.precision, self.timed)
            if _basename(opname) in _GATHERS:
                m = _gathered(m, args, kwargs)
            if _basename(opname) in _RECURRENT and m.flops == 0:
                m = _recurrent(m, fn, args, kwargs)
        except Exception:  # noqa: BLE001 - an op that cannot run alone: a roofline estimate
            if not estimate:
                raise
            m = _roofline(fn, args, kwargs, grad_flags, self.info, self.precision)
        self.measured_calls += 1
        self.seen[key] = m
        self.store.put(key, m)
        return m

    def _grad_flags(self, args: tuple, kwargs: dict, tinfo: dict[int, TensorArg], grad: bool) -> list[bool]:
        """Per tensor argument: is it an autograd leaf that needs a gradient in training?"""
        flags = []
        for v in _tensors((args, kwargs)):
            a = tinfo.get(id(v))
            # a trainable parameter, or an activation downstream of one (not a graph input: the
            # first layer computes no input gradient, and saves nothing for one — under bf16
            # autocast that is its weight's bfloat16 copy)
            ok = grad and v.is_floating_point() and a is not None and a.trainable
            flags.append(bool(ok))
        return flags

    def _is_trainable(self, v: torch.Tensor) -> bool:
        return bool(getattr(v, "requires_grad", False)) or isinstance(v, torch.nn.Parameter)


class _CacheMiss(Exception):
    pass


def _measure_call(fn: Callable, args: tuple, kwargs: dict, grad_flags: list[bool], param_flags: list[bool],
                  extra_params: list[torch.Tensor], dev: torch.device, repeats: int, warmup: int,
                  precision: str = "fp32", timed: bool = True) -> Measurement:
    """Time one call alone, forward and backward; record what autograd saves and the call's
    work (FLOPs counted on the first forward and backward, bytes from the tensors it touches;
    ``timed=False``: only those, every time 0).

    ``grad_flags`` / ``param_flags``: per tensor argument, whether it is a leaf needing a
    gradient and whether it is a parameter / buffer (not an activation);  ``extra_params``: the
    parameters of a called module (torch.fx capture).  ``precision``: every forward runs under
    :func:`~tensoropt.capture.precision_context` (the backward runs in the forward's dtypes by
    itself); a bf16 copy autocast makes of a weight or input and saves is an extra saved tensor,
    as in a training step.
    """
    cargs, ckwargs, in_tensors = _detached_args(args, kwargs, grad_flags)
    grad_inputs = [t for t, f in zip(in_tensors, grad_flags) if f] + list(extra_params)
    param_ptrs = {_ptr(p) for p in extra_params}
    in_ptrs = {_ptr(t): j for j, t in enumerate(in_tensors)}
    enable = bool(grad_inputs)

    def forward() -> Any:
        with torch.enable_grad() if enable else torch.no_grad(), precision_context(precision, dev):
            return fn(*cargs, **ckwargs)

    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), counting_flops() as count:
        outs, fp_scratch = scratch_bytes(forward)
    out_tensors = [t for t in tree_flatten(outs)[0] if isinstance(t, torch.Tensor)]
    out_ptrs = {_ptr(t) for t in out_tensors}
    out_bytes = _unique_bytes(t for t in out_tensors if _ptr(t) not in in_ptrs)
    saved_args, saves_output, extra_bytes, saved_bytes = _saved_by_kind(saved, in_ptrs, out_ptrs, param_ptrs,
                                                                         param_flags)
    fp_flops = int(count.get_total_flops())
    fp_bytes = _touched_bytes([*in_tensors, *extra_params, *out_tensors])
    fp_s = time_callable(forward, device=dev, repeats=repeats, warmup=warmup)[0] if timed else 0.0

    bp_s, workspace, bp_flops, bp_bytes = 0.0, fp_scratch, 0, 0
    diff = [t for t in out_tensors if t.requires_grad and t.grad_fn is not None]
    if enable and diff:
        # random output gradients where the backward is timed (as a training step's); untimed, only
        # shapes count (FLOPs, bytes: the same work, tests/measure/test_work.py) and zeros cost a memset
        # where drawing normals cost a third of the dashboard default's profile (0.38 of 1.13 s)
        gouts = [torch.randn_like(t) if timed else torch.zeros_like(t) for t in diff]

        def backward() -> Any:
            return torch.autograd.grad(diff, grad_inputs, gouts, retain_graph=True, allow_unused=True)
        with counting_flops() as count:
            grads, bp_scratch = node_scratch_bytes(diff, backward)
        bp_flops = int(count.get_total_flops())
        bp_bytes = _touched_bytes([*gouts, *saved]) + _touched_bytes(g for g in grads if g is not None)
        del grads
        # a composite backward's intermediate results (pow's: two tensors of its input's size), on
        # every device; the CUDA allocator's peak, where it is read, adds the libraries' workspaces
        workspace = max(fp_scratch, bp_scratch)
        if timed:
            bp_s, allocated = _time_backward(forward, backward, dev, repeats, warmup)
            workspace = max(workspace, allocated)
    shape = tuple(out_tensors[0].shape) if out_tensors else ()
    return Measurement(fp_s, bp_s, out_bytes, saved_bytes, extra_bytes,
                       saved_args, saves_output, workspace, fp_flops, shape,
                       bp_flops=bp_flops, fp_bytes=fp_bytes, bp_bytes=bp_bytes)


def _detached_args(args: tuple, kwargs: dict, grad_flags: list[bool]) -> tuple[Any, Any, list[torch.Tensor]]:
    """The call's arguments with every tensor detached — a fresh autograd leaf where
    ``grad_flags`` says it needs a gradient — and those tensors in order."""
    flat, spec = tree_flatten((args, kwargs))
    tensors = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]
    leaves = list(flat)
    for j, i in enumerate(tensors):
        v = flat[i]
        leaves[i] = v.detach().requires_grad_(True) if grad_flags[j] else v.detach()
    cargs, ckwargs = tree_unflatten(leaves, spec)
    return cargs, ckwargs, [leaves[i] for i in tensors]


def _saved_by_kind(saved: list[torch.Tensor], in_ptrs: dict[int, int], out_ptrs: set[int], param_ptrs: set[int],
                   param_flags: list[bool]) -> tuple[tuple[int, ...], bool, int, int]:
    """What autograd saved, parameters left out (they are counted as parameters, not as
    activations): ``(positions of the saved inputs, whether the output is saved, bytes of the other
    saved tensors, bytes of every saved tensor)``, each storage once."""
    saved_args: set[int] = set()
    saves_output = False
    extra: dict[int, int] = {}
    saved_total: dict[int, int] = {}
    for t in saved:
        p = _ptr(t)
        if p in param_ptrs or (p in in_ptrs and param_flags[in_ptrs[p]]):
            continue  # parameters are counted as parameters, not as activations
        if p in in_ptrs:
            saved_args.add(in_ptrs[p])
        elif p in out_ptrs:
            saves_output = True
        else:
            extra[p] = t.untyped_storage().nbytes()
        saved_total[p] = t.untyped_storage().nbytes()
    return tuple(sorted(saved_args)), saves_output, sum(extra.values()), sum(saved_total.values())


def _time_backward(forward: Callable, backward: Callable, dev: torch.device,
                   repeats: int, warmup: int) -> tuple[float, int]:
    """The backward's seconds (``backward``: the input gradients from fixed random output
    gradients, the graph kept) and, on CUDA, the call's workspace bytes (:func:`_cuda_workspace`)."""
    workspace = 0
    bp_s, _ = time_callable(backward, device=dev, repeats=repeats, warmup=warmup)
    if dev.type == "cuda":
        workspace = _cuda_workspace(forward, backward, dev)
    return bp_s, workspace


def _cuda_workspace(forward: Callable, backward: Callable, dev: torch.device) -> int:
    """Scratch memory one call allocates and frees inside itself (cuDNN / cuBLAS workspaces, a
    composite op's temporaries): the larger of the forward's and the backward's peak above what
    each leaves allocated when it returns.  What they return and keep — the output, the tensors
    saved for backward, the gradients — the memory model counts apart; counting them here too made
    VGG-16's whole-step estimate 32 % above the CUDA allocator's peak."""
    def scratch(call: Callable) -> int:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        kept = call()
        torch.cuda.synchronize(dev)
        extra = torch.cuda.max_memory_allocated(dev) - torch.cuda.memory_allocated(dev)
        del kept
        return max(0, extra)

    return max(scratch(forward), scratch(backward))


def _no_fake_run(graph: OpGraph, n: fx.Node, e: Exception) -> str:
    """Why node ``n`` of a meta model's graph cannot run on FakeTensors, naming its op and module."""
    op = graph.nodes.get(n.name)
    where = f"module {op.module_path or '(root)'} ({op.module_type})" if op is not None and op.module_type else \
        f"module {op.module_path or '(root)'}" if op is not None else "the model"
    what = f"{n.target}" if n.op == "call_function" else f"{n.op} {n.target}"
    name = type(e).__name__
    if "DataDependent" in name or "DynamicOutputShape" in name or "data-dependent" in str(e):
        why = ("its output depends on the values of its inputs, which a model on the meta device does not have; "
               "materialise the model (build it outside torch.device('meta'), a smaller variant if it does not fit) "
               "or compute that value without reading tensor data")
    else:
        why = f"{first_line(e)}; materialise the model (a smaller variant if it does not fit) to profile it"
    return f"operator {what} of {where} cannot run on fake tensors: {why}"


def _fake_run(fn: Callable, args: tuple, kwargs: dict, precision: str = "fp32") -> tuple[int, int]:
    """Forward FLOPs and output bytes of one call, on FakeTensors (no real compute), in
    ``precision``; (0, 0) when the op has no fake implementation."""
    if isinstance(fn, torch.nn.Module):
        return 0, 0  # a module's own parameters are real tensors; FLOPs are informative only
    given = next((t.fake_mode for t in _tensors((args, kwargs)) if isinstance(t, FakeTensor)), None)
    try:
        with given or FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fargs, fkwargs = _map(lambda t: mode.from_tensor(t), (args, kwargs))
            with torch.no_grad(), precision_context(precision, _tensors((args, kwargs))), \
                    counting_flops() as fc:
                out = fn(*fargs, **fkwargs)
            out_bytes = sum(t.numel() * t.element_size() for t in _tensors(out))
        return int(fc.get_total_flops()), out_bytes
    except Exception:  # noqa: BLE001
        return 0, 0


def _roofline(fn: Callable, args: tuple, kwargs: dict, grad_flags: list[bool], info: dict[str, Any],
              precision: str = "fp32") -> Measurement:
    """Estimate a call that cannot run alone: max(FLOPs / peak FLOP/s, bytes / memory bandwidth)
    forward, twice that backward (two products per forward product: the input and weight
    gradients)."""
    in_bytes = _unique_bytes(_tensors((args, kwargs)))
    flops, out_bytes = _fake_run(fn, args, kwargs, precision)
    peak, bw = info.get("peak_flops") or 1e11, info.get("memory_Bps") or 1e10
    fp = max(flops / peak, (in_bytes + out_bytes) / bw)
    grad = any(grad_flags)
    bp = 2 * fp if grad else 0.0
    return Measurement(fp, bp, out_bytes, 0, 0, (), False, 0, flops, (), "roofline",
                       bp_flops=2 * flops if grad else 0, fp_bytes=in_bytes + out_bytes,
                       bp_bytes=2 * (in_bytes + out_bytes) if grad else 0)


#: ops that read only the rows they gather from their largest argument (a table), not all of it
_GATHERS = frozenset({"embedding", "embedding_bag", "index", "index_select", "gather", "take", "take_along_dim"})


def _gathered(m: Measurement, args: tuple, kwargs: dict) -> Measurement:
    """``m`` with forward bytes of a gather: its other arguments, plus the rows it reads (as
    many bytes as it writes) and its output, instead of the whole table."""
    ts = _tensors((args, kwargs))
    table = max((t.numel() * t.element_size() for t in ts), default=0)
    return dataclasses.replace(m, fp_bytes=max(0, m.fp_bytes - table) + m.output_bytes)


#: fused recurrent layers, whose kernels (oneDNN's, cuDNN's) FlopCounterMode has no formula for
_RECURRENT = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu", "LSTM", "GRU", "RNN"})


def _recurrent(m: Measurement, fn: Callable, args: tuple, kwargs: dict) -> Measurement:
    """``m`` with the FLOPs of a fused recurrent layer: every weight matrix (input-to-hidden and
    hidden-to-hidden, each layer and direction) multiplies every token once — 2 · tokens · rows ·
    cols each — in the forward; the backward twice that (input and weight gradients).  Tokens:
    the input's elements over its feature size."""
    tensors = _tensors((args, kwargs))
    if isinstance(fn, torch.nn.Module):
        tensors = [*tensors, *fn.parameters()]
    if not tensors or tensors[0].dim() < 2:
        return m
    tokens = tensors[0].numel() // tensors[0].shape[-1]
    flops = sum(2 * tokens * t.numel() for t in tensors[1:] if t.dim() == 2)
    return dataclasses.replace(m, flops=flops, bp_flops=2 * flops if m.bp_bytes else 0)


def _shard_shape(op: OpNode, out0: TensorMeta | None, layout: str, k: int) -> list[int] | None:
    """The first output's shape in the largest of ``k`` shards along ``layout``'s dimension
    (``batch`` / ``channel``), or None where the node has no such dimension or too few along it."""
    d = op.split.batch if layout == Layout.BATCH else op.split.channel
    if out0 is None or d is None or d >= len(out0.shape) or out0.shape[d] < k:
        return None
    shape = list(out0.shape)
    shape[d] = shard_size(shape[d], k)
    return shape


def _scaled(full: Measurement, k: int) -> ShardCost:
    return ShardCost(full.fp_s / k, full.bp_s / k, full.output_bytes // k, full.saved_bytes // k,
                     full.extra_saved_bytes // k, "scaled", full.work.scaled(k))


def _call_key(opname: str, fn: Callable, args: tuple, kwargs: dict, grad_flags: list[bool],
              extra_params: list[torch.Tensor], precision: str = "fp32") -> str:
    """The cache key of one call: op, arguments' shapes / dtypes / gradient flags / layout, the
    other arguments, and the precision it runs in where not fp32 (a float32 linear under
    autocast is another call than one without; fp32 keys are what they were before)."""
    flags = iter(grad_flags)

    def enc(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            grad, layout = "g" if next(flags) else "-", "c" if v.is_contiguous() else "s"
            return f"T{tuple(v.shape)}:{str(v.dtype)[6:]}:{grad}:{layout}"
        if isinstance(v, (list, tuple)):
            return [enc(x) for x in v]
        if isinstance(v, dict):
            return {k: enc(x) for k, x in v.items()}
        return repr(v)
    target = opname if precision == Precision.FP32 else f"{opname}@{precision}"
    if isinstance(fn, torch.nn.Module):
        target += ":" + repr(fn) + str([tuple(p.shape) for p in extra_params])
    return json.dumps([target, enc(list(args)), enc(kwargs)], separators=(",", ":"))


def _in_place(opname: str) -> bool:
    return _basename(opname).endswith("_") and not _basename(opname).startswith("_")


def _basename(opname: str) -> str:
    """``aten.conv2d.default`` → ``conv2d``."""
    parts = opname.split(".")
    return parts[1] if len(parts) >= 3 and parts[0] == "aten" else parts[-1]


def _ptr(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage: the same for every view of it, on real tensors and on
    FakeTensors alike (a FakeTensor's data pointer is 0 for every storage)."""
    return t.untyped_storage()._cdata


def _unique_bytes(ts: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in ts:
        seen[_ptr(t)] = t.untyped_storage().nbytes()
    return sum(seen.values())


def _touched_bytes(ts: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct tensors (a view counts its own elements, not its storage's): what a
    kernel reading or writing them moves."""
    seen: dict[tuple[Any, ...], int] = {}
    for t in ts:
        seen[(_ptr(t), int(t.storage_offset()), tuple(t.shape), tuple(t.stride()))] = t.numel() * t.element_size()
    return sum(seen.values())


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [v for v in tree_flatten(obj)[0] if isinstance(v, torch.Tensor)]


def _map(fn: Callable, obj: Any) -> Any:

    return tree_map(lambda v: fn(v) if isinstance(v, torch.Tensor) else v, obj)
