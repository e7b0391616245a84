"""Keyed random numbers: the same mask for the same element, whichever device computes which piece.

A plan splits a dropout over devices; each shard must draw exactly the elements the unsplit op
would have drawn for its piece, or the plan trains a different function than the model (and no
check can tell a right plan from a wrong one).  Torch's generators are sequential streams: a
shard cannot ask for "elements 4096…8191 of the draw the whole op would make".  So random ops
run *keyed*: the draw of an op is made row by row (a row: one index of its first dimension,
for activations one sample), each row from its own generator seeded by

    mix(seed, key, row)

``seed`` drawn once per step (from torch's default generator, so ``torch.manual_seed`` fixes a
run), ``key`` the op's position among the random ops as they were traced (the order the eager
model draws in; recorded at capture in the node's meta, :func:`record_random_keys`, as the
captured graph is then put in canonical order), ``row`` the row's index in the op's *whole* output,
and ``mix`` SplitMix64
(Steele, Lea & Flood, "Fast splittable pseudorandom number generators").  A shard split along
the first dimension (the batch) draws only its own rows; a shard split along another dimension
draws its rows whole and keeps its slice (k times the random numbers, none of the other work).
Recomputation (activation checkpointing) draws the same mask again.  Values are the same on
every device of one kind (CPU generators, or CUDA's Philox); a CPU and a GPU draw differently.

Both sides of a check use it: the executor calls :func:`keyed_op` for every random node of the
rewritten graph, and the eager reference runs under :class:`KeyedRandomMode`, a
``TorchDispatchMode`` that answers the model's own random calls (``bernoulli_`` inside dropout
and attention dropout, ``rand`` of stochastic depth, …) with the same keyed draws in call order.

What it costs: one generator per row instead of one per op (a few microseconds a row), a
float32 uniform compared with ``p`` instead of torch's fused Bernoulli draw (measured in
``docs/measurements.md``), and attention with dropout runs the math kernel with an explicit
mask (the attention weights materialised), as PyTorch's own CPU path does with dropout.

Example::

    seed = draw_seed()
    with KeyedRandomMode(seed):
        reference_out = model(x)          # the model's dropouts, keyed
    planned_out = planned(x)              # a PlannedModule draws its seed the same way

Owns: the keyed draws (:func:`keyed_op`, :class:`KeyedRandomMode`) and the random nodes' keys.
Must not: import the rest of the executor (the capture imports it to record keys), nor draw
from torch's generators except for a step's seed (:func:`draw_seed`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..layouts import piece_range

aten = torch.ops.aten

_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def _stream(seed: int, key: int, row: int) -> int:
    """The seed of row ``row`` of op ``key``'s draw under step ``seed``: SplitMix64 of the three
    (Steele, Lea & Flood, "Fast splittable pseudorandom number generators"), non-negative."""
    z = (seed * _GOLDEN + (key + 1) * _M1 + (row + 1) * _M2) & _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def draw_seed() -> int:
    """A step's seed, from torch's default CPU generator (one draw)."""
    return int(torch.randint(0, 1 << 62, (), dtype=torch.int64).item())


def derive_seed(base: int, step: int) -> int:
    """The seed of step ``step`` from a run's ``base`` seed (processes that agree on the base
    agree on every step's seed without talking again)."""
    return _stream(base, -1, step)


def _rows(fill: str, seed: int, key: int, full_shape: Sequence[int], dim: int | None, k: int, index: int,
          device: Any) -> torch.Tensor:
    """Keyed draws (``fill``: ``"rand"`` or ``"randn"``, float32) for piece ``index`` of ``k``
    along ``dim`` of a draw of ``full_shape``: row ``r`` (index ``r`` along dimension 0) comes
    from its own generator seeded by :func:`_stream`, so a piece along dimension 0 draws only its
    rows; a piece along another dimension draws its rows whole and keeps its slice."""
    shape = [int(s) for s in full_shape]
    if not shape:
        return _row(fill, _stream(seed, key, 0), [], device)
    nd = len(shape)
    d = None if dim is None else dim % nd
    lo, hi = piece_range(shape[0], k, index) if d == 0 else (0, shape[0])
    rows = [_row(fill, _stream(seed, key, r), shape[1:], device) for r in range(lo, hi)]
    out = torch.stack(rows) if rows else torch.empty([0, *shape[1:]], device=device)
    if d is not None and d != 0:
        out = torch.tensor_split(out, k, d)[index]
    return out


def _row(fill: str, seed: int, shape: Sequence[int], device: Any) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    make = torch.rand if fill == "rand" else torch.randn
    return make(list(shape), generator=gen, device=device, dtype=torch.float32)


def uniform(seed: int, key: int, full_shape: Sequence[int], dim: int | None = None, k: int = 1, index: int = 0, *,
            dtype: torch.dtype = torch.float32, device: Any = "cpu") -> torch.Tensor:
    """Keyed uniform numbers in [0, 1) for piece ``index`` of ``k`` along ``dim`` of a draw of
    ``full_shape`` (the module docstring)."""
    return _rows("rand", seed, key, full_shape, dim, k, index, device).to(dtype)


def normal(seed: int, key: int, full_shape: Sequence[int], dim: int | None = None, k: int = 1, index: int = 0, *,
           dtype: torch.dtype = torch.float32, device: Any = "cpu") -> torch.Tensor:
    """Keyed standard normal numbers, as :func:`uniform`."""
    return _rows("randn", seed, key, full_shape, dim, k, index, device).to(dtype)


# ------------------------------------------------------------------------------ the ops

@dataclass(frozen=True)
class Draw:
    """Where a node's draw sits in its op's whole draw: step ``seed``, the op's ``key``, the whole
    ``full_shape`` and piece ``index`` of ``k`` along ``dim`` (``None``: the whole)."""

    seed: int
    key: int
    full_shape: tuple[int, ...]
    dim: int | None = None
    k: int = 1
    index: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "full_shape", tuple(int(s) for s in self.full_shape))

    def uniform(self, dtype: torch.dtype, device: Any) -> torch.Tensor:
        return uniform(self.seed, self.key, self.full_shape, self.dim, self.k, self.index, dtype=dtype, device=device)

    def normal(self, dtype: torch.dtype, device: Any) -> torch.Tensor:
        return normal(self.seed, self.key, self.full_shape, self.dim, self.k, self.index, dtype=dtype, device=device)


def _bernoulli(draw: Draw, like: torch.Tensor, p: Any) -> torch.Tensor:
    """1 where the keyed uniform is below ``p`` (a number or a tensor of like's shape)."""
    u = draw.uniform(torch.float32, like.device)
    p = p.to(torch.float32) if isinstance(p, torch.Tensor) else float(p)
    return (u < p).to(like.dtype)


def _dropout(draw: Draw, x: torch.Tensor, p: float, train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Dropout as PyTorch's CPU path computes it (``x * (bernoulli(1 − p) / (1 − p))``) and its mask."""
    if not train or p == 0:
        return x, torch.ones_like(x, dtype=torch.bool)
    if p == 1:
        return x * 0, torch.zeros_like(x, dtype=torch.bool)
    keep = _bernoulli(draw, x, 1 - p)
    return x * keep.div(1 - p), keep.bool()


#: alpha dropout's SELU constant (PyTorch's ``_dropout_impl``)
_ALPHA = 1.7580993408473766


def _noise_dropout(draw: Draw, x: torch.Tensor, p: float, train: bool, alpha: bool) -> torch.Tensor:
    """Feature / alpha dropout as PyTorch computes them (``_dropout_impl`` in ATen's Dropout.cpp):
    a Bernoulli(1 − p) noise of the draw's shape (``[B, C, 1, …]`` for the feature forms, the
    input's for alpha dropout), scaled, multiplied in (and for the alpha forms shifted)."""
    if not train or p == 0 or x.numel() == 0:
        return x
    if p == 1:
        return x * torch.zeros((), dtype=x.dtype, device=x.device)
    noise = _bernoulli(draw, x, 1 - p)
    if not alpha:
        return x * noise.div(1 - p)
    a = 1.0 / math.sqrt((_ALPHA * _ALPHA * p + 1) * (1 - p))
    b = noise.add(-1).mul(_ALPHA * a).add(_ALPHA * a * p)
    return x * noise.mul(a) + b


def feature_noise_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """The noise of feature dropout: one draw per (sample, channel), ``[B, C, 1, …]``."""
    return (*[int(s) for s in shape[:2]], *([1] * (len(shape) - 2)))


def _sdpa(draw: Draw, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> torch.Tensor:
    """Scaled dot-product attention with a keyed dropout mask on the attention weights (the
    math kernel PyTorch's CPU path runs with dropout, given the mask explicitly)."""
    if not dropout_p:
        return aten.scaled_dot_product_attention.default(q, k, v, attn_mask, 0.0, is_causal, scale=scale,
                                                         enable_gqa=enable_gqa)
    keep = _bernoulli(draw, q, 1 - dropout_p).bool()
    if isinstance(attn_mask, torch.Tensor) and attn_mask.dtype == torch.bool:
        # what scaled_dot_product_attention does before its kernels (the math kernel adds the mask)
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~attn_mask, float("-inf"))
    out, _ = aten._scaled_dot_product_attention_math.default(q, k, v, attn_mask, dropout_p, is_causal, keep,
                                                             scale=scale, enable_gqa=enable_gqa)
    return out


def attention_weights_shape(q_shape: Sequence[int], k_shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of the attention weights (and so of the dropout mask): ``[..., L, S]``."""
    return (*q_shape[:-1], int(k_shape[-2]))


#: the random ATen ops the executor draws keyed (the rest run as torch draws them)
KEYED_OPS = {
    "dropout", "native_dropout", "bernoulli", "rand", "rand_like", "randn", "randn_like", "uniform", "normal",
    "scaled_dot_product_attention", "normal_functional", "feature_dropout", "alpha_dropout", "feature_alpha_dropout",
}


def is_keyed(target: Any) -> bool:
    """Whether a graph node's op is one :func:`keyed_op` draws."""
    if not isinstance(target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    return target._schema.name.split("::")[-1] in KEYED_OPS and target != aten.normal.float_float


def bind(target: Any, args: Sequence[Any], kwargs: dict) -> dict[str, Any]:
    """The arguments of a call of ATen op ``target`` by name, defaults filled in (a dispatcher
    leaves out arguments equal to their default: ``bernoulli_(0.5)`` arrives without ``p``)."""
    out: dict[str, Any] = {}
    for i, a in enumerate(target._schema.arguments):
        if not a.kwarg_only and i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def keyed_op(target: Any, draw: Draw, *args: Any, **kwargs: Any) -> Any:
    """``target(*args, **kwargs)`` — a random ATen op of :data:`KEYED_OPS`, possibly on one piece
    of its inputs — with its randomness from ``draw``."""
    name = target._schema.name.split("::")[-1]
    a = bind(target, args, kwargs)
    if name in ("dropout", "native_dropout"):
        out, mask = _dropout(draw, a["input"], a["p"], a["train"] if a["train"] is not None else True)
        return out if name == "dropout" else (out, mask)
    if name in ("feature_dropout", "alpha_dropout", "feature_alpha_dropout"):
        x = a["input"]
        if name != "alpha_dropout" and draw.dim is not None and draw.dim % len(draw.full_shape) > 1:
            draw = replace(draw, dim=None, k=1, index=0)   # the noise is whole (size 1) along that dim
        return _noise_dropout(draw, x, a["p"], a["train"], alpha=name != "feature_dropout")
    if name == "bernoulli":
        x = a["self"]
        return _bernoulli(draw, x, a.get("p", x))
    if name in ("rand", "randn", "rand_like", "randn_like"):
        like = a.get("self")
        dtype = a.get("dtype") or (like.dtype if like is not None else torch.get_default_dtype())
        device = a.get("device") or (like.device if like is not None else "cpu")
        return draw.uniform(dtype, device) if name in ("rand", "rand_like") else draw.normal(dtype, device)
    if name == "uniform":
        x = a["self"]
        return (a["from"] + (a["to"] - a["from"]) * draw.uniform(torch.float64, x.device)).to(x.dtype)
    if name == "normal" and target == aten.normal.Tensor_float:
        x = a["mean"]
        return x + a["std"] * draw.normal(x.dtype, x.device)
    if name == "normal_functional":
        x = a["self"]
        return (a["mean"] + a["std"] * draw.normal(torch.float64, x.device)).to(x.dtype)
    if name == "scaled_dot_product_attention":
        return _sdpa(draw, a["query"], a["key"], a["value"], a["attn_mask"], a["dropout_p"], a["is_causal"],
                     a.get("scale"), a.get("enable_gqa", False))
    raise NotImplementedError(f"{target} is not drawn keyed")


def draw_shape(target: Any, full_output_shape: Sequence[int], full_arg_shapes: Sequence[Sequence[int]]) -> tuple:
    """The whole shape of the op's random draw: its output's, except attention (its weights')."""
    name = target._schema.name.split("::")[-1]
    if name == "scaled_dot_product_attention":
        return attention_weights_shape(full_arg_shapes[0], full_arg_shapes[1])
    if name in ("feature_dropout", "feature_alpha_dropout"):
        return feature_noise_shape(full_output_shape)
    return tuple(full_output_shape)


# ------------------------------------------------------------------------------ the eager side

# in-place forms the eager model calls (below autograd): op → its out-of-place keyed form
_INPLACE = {"bernoulli_": "bernoulli", "uniform_": "uniform", "normal_": "normal"}


class KeyedRandomMode(TorchDispatchMode):
    """Run an eager model with its random ops keyed: the ``n``-th random call draws key ``n``
    at its whole shape (what the executor's ``n``-th random node draws, piece by piece).

    Random calls it does not know (``randperm``, ``multinomial``, …) run as torch draws them and
    are counted in :attr:`unkeyed` (a check cannot match those)."""

    def __init__(self, seed: int):
        super().__init__()
        self.seed = int(seed)
        self.calls = 0
        self.unkeyed: list[str] = []
        self._drawing = False     # inside a keyed draw: its own generator calls are not the model's

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self._drawing or not _draws(func, args, kwargs):
            return func(*args, **kwargs)
        self._drawing = True
        try:
            return self._keyed(func, args, kwargs)
        finally:
            self._drawing = False

    def _keyed(self, func: Any, args: tuple, kwargs: dict) -> Any:
        name = func._schema.name.split("::")[-1]
        key = self.calls
        self.calls += 1
        if name in _INPLACE:
            a = bind(func, args, kwargs)
            target = a["self"]
            draw = Draw(self.seed, key, target.shape)
            if _INPLACE[name] == "bernoulli":
                value = _bernoulli(draw, target, a["p"])
            elif _INPLACE[name] == "uniform":
                value = a["from"] + (a["to"] - a["from"]) * draw.uniform(torch.float64, target.device)
            else:
                value = a["mean"] + a["std"] * draw.normal(torch.float64, target.device)
            with torch.no_grad():
                target.copy_(value)
            return target
        if is_keyed(func) and name != "scaled_dot_product_attention":
            shapes = [tuple(a.shape) for a in args[:2] if isinstance(a, torch.Tensor)]
            full = draw_shape(func, _out_shape(func, args, kwargs), shapes)
            return keyed_op(func, Draw(self.seed, key, full), *args, **kwargs)
        self.unkeyed.append(str(func))
        return func(*args, **kwargs)


def _out_shape(func: Any, args: tuple, kwargs: dict) -> tuple[int, ...]:
    name = func._schema.name.split("::")[-1]
    if name in ("rand", "randn"):
        size = args[0] if args else kwargs["size"]
        return tuple(int(s) for s in size)
    return tuple(args[0].shape)


# ------------------------------------------------------------------------------ the graph side

def _draws(func: Any, args: Any, kwargs: Any) -> bool:
    """Whether a call of ``func`` draws random numbers: a seeded op, except a dropout outside
    training or with ``p`` 0 or 1, and attention with ``dropout_p`` 0 (PyTorch draws nothing
    there)."""
    if not isinstance(func, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded not in func.tags:
        return False
    a = bind(func, args, kwargs)
    if "dropout_p" in a:
        return bool(a["dropout_p"])
    if "train" in a and "p" in a and not func._schema.name.endswith("native_dropout"):
        return bool(a["train"]) and 0 < float(a["p"]) < 1
    return True


def draws(node: Any) -> bool:
    """Whether a captured node draws random numbers when it runs, as the eager op would
    (:func:`_draws`)."""
    return _draws(getattr(node, "target", None), node.args, node.kwargs)


#: ``node.meta`` key of a random node's key, recorded at capture (:func:`record_random_keys`)
RANDOM_KEY = "tensoropt_random_key"


def record_random_keys(nodes: Any) -> int:
    """Record in ``node.meta[RANDOM_KEY]`` the key of every node that draws (:func:`draws`): its
    position among them in ``nodes``' order, which must be the traced order — the order the
    eager model draws in.  The capture calls it before it puts the graph in canonical order
    (:mod:`tensoropt.capture.canonical`), which no longer is that order.  Returns how many."""
    count = 0
    for n in nodes:
        if draws(n):
            n.meta[RANDOM_KEY] = count
            count += 1
    return count


def random_keys(nodes: Any) -> dict[str, int]:
    """Node name → key for every node of a captured graph that draws (:func:`draws`): the key
    recorded at capture (:func:`record_random_keys`) where every such node has one, else its
    position among them in ``nodes``' order (a graph in traced order)."""
    drawing = [n for n in nodes if draws(n)]
    recorded = [n.meta.get(RANDOM_KEY) if isinstance(getattr(n, "meta", None), dict) else None for n in drawing]
    keys = [k for k in recorded if isinstance(k, int)]
    if drawing and len(keys) == len(drawing):   # every drawing node has its recorded key
        return {n.name: k for n, k in zip(drawing, keys)}
    return {n.name: i for i, n in enumerate(drawing)}


def keyed_call(target: Any, seed: int, key: int, full_shape: tuple, dim: int | None, k: int, index: int,
               *args: Any, **kwargs: Any) -> Any:
    """The executor's call of a random node's shard (the rewritten graph's form of :func:`keyed_op`)."""
    return keyed_op(target, Draw(seed, key, full_shape, dim, k, index), *args, **kwargs)
