"""The device-kind catalogue: datasheet figures for the accelerators people rent and own.

It owns :file:`kinds.yaml`, next to this module, and the :class:`DeviceKind` value read from it:
per kind, the name ``torch.cuda.get_device_name()`` / ``nvidia-smi`` reports, the other spellings
people use, dense peak FLOP/s per dtype (``fp32``, ``tf32``, ``bf16``, ``fp16``), peak memory
bandwidth, memory capacity, an estimate of the memory a PyTorch training process loses before
its first tensor, the usual box's interconnect, and a source for every figure.
:func:`load_kinds` checks every field when it reads the file (a bad file raises
:class:`~tensoropt.errors.TensorOptError` naming the kind and the field); :func:`find_kind`
and :func:`same_kind` match names the way people write them.

It must not measure, detect or price anything: the figures are nominal vendor numbers, and the
modules that time a real device or cost a plan read them from here, never the other way round.

Example::

    >>> kind = find_kind("Tesla V100-SXM2-16GB")
    >>> kind.key, kind.peak("fp32") / 1e12
    ('v100-sxm2-16gb', 15.7)
    >>> kind.peak("bf16") == kind.peak_flops["fp16"]     # no bf16 on Volta: falls back to fp16
    True
    >>> find_kind("nvidia h100 80gb hbm3").key
    'h100-sxm5-80gb'
    >>> same_kind("V100", "Tesla V100-SXM2-16GB"), find_kind("Graphcore IPU") is None
    (True, True)
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from .._io import load_yaml
from ..errors import TensorOptError

__all__ = ["DTYPES", "DeviceKind", "find_kind", "kind_from_dict", "load_kinds", "normalise_name", "same_kind"]

#: The dtypes a kind may give a peak for, in the order of :attr:`DeviceKind.peak_flops`.
DTYPES = ("fp32", "tf32", "bf16", "fp16")

#: What a dtype the kind lacks falls back to, in order (see :meth:`DeviceKind.peak`).
_FALLBACK: Mapping[str, tuple[str, ...]] = {
    "fp32": (),
    "tf32": ("fp32",),
    "bf16": ("fp16", "fp32"),
    "fp16": ("fp32",),
}

_PATH = Path(__file__).with_name("kinds.yaml")

_FIELDS = ("key", "name", "aliases", "vendor", "architecture", "peak_flops", "memory_Bps", "memory_bytes",
           "framework_bytes", "links", "sources")
_OPTIONAL = frozenset({"aliases"})
_LINK_GROUPS = {
    "nvlink": ("nvlink_generation", "nvlink_links", "nvlink_GBps_per_link_per_direction"),
    "xgmi": ("xgmi_links", "xgmi_GBps_per_link_per_direction"),
}
_LINK_INTS = frozenset({"nvlink_generation", "nvlink_links", "xgmi_links"})
_LINK_KEYS = frozenset({"pcie", "note"}.union(*_LINK_GROUPS.values()))
_KEY_RE = re.compile(r"[a-z0-9][a-z0-9.-]*\Z")
_PREFIX_RE = re.compile(r"^(?:(?:nvidia|tesla|amd)[\s_-]+)+")
_SEPARATORS_RE = re.compile(r"[\s_-]+")


def normalise_name(name: str) -> str:
    """``name`` as :func:`find_kind` compares it: lower case, any leading ``NVIDIA`` / ``Tesla`` /
    ``AMD`` words dropped, spaces, hyphens and underscores removed
    (``"NVIDIA Tesla V100-SXM2-16GB"`` → ``"v100sxm216gb"``)."""
    s = name.strip().lower()
    s = _PREFIX_RE.sub("", s)
    return _SEPARATORS_RE.sub("", s)


@dataclass(frozen=True)
class DeviceKind:
    """One device kind of the catalogue; figures are nominal (see :file:`kinds.yaml` for the
    conventions).

    ``peak_flops`` maps a dtype of :data:`DTYPES` to its dense peak in FLOP/s (``fp32`` always
    present); ``memory_Bps`` is peak DRAM bandwidth in bytes/s; ``memory_bytes`` the capacity;
    ``framework_bytes`` an estimate of what a PyTorch training process loses before any tensor;
    ``links`` the usual box's interconnect (``pcie`` always, ``nvlink_*`` / ``xgmi_*`` where the
    usual box has them, an optional ``note``); ``sources`` maps every figure
    (``peak_flops.<dtype>``, ``memory_Bps``, ``memory_bytes``, ``framework_bytes``, ``links``) to
    where it comes from.  The mappings are read-only.
    """

    key: str
    name: str
    aliases: tuple[str, ...]
    vendor: str
    architecture: str
    peak_flops: Mapping[str, float]
    memory_Bps: float
    memory_bytes: int
    framework_bytes: int
    links: Mapping[str, Any]
    sources: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "aliases", tuple(self.aliases))
        for field in ("peak_flops", "links", "sources"):
            object.__setattr__(self, field, MappingProxyType(dict(getattr(self, field))))

    def __hash__(self) -> int:
        return hash((self.key, self.name))

    def peak(self, dtype: str) -> float:
        """The dense peak FLOP/s for ``dtype`` (one of :data:`DTYPES`).

        A dtype the kind has no figure for falls back: ``tf32`` → ``fp32`` (no TF32 tensor cores:
        an FP32 matmul runs on the FP32 units), ``bf16`` → ``fp16`` → ``fp32``, ``fp16`` → ``fp32``.
        The ``bf16`` → ``fp16`` step is optimistic on chips without BF16 tensor cores (Volta,
        Turing), where PyTorch's BF16 matmuls do not reach the FP16 tensor-core rate; a caller
        for whom that matters checks ``"bf16" in kind.peak_flops`` first.
        """
        if dtype not in _FALLBACK:
            raise TensorOptError(f"device kind {self.key!r}: unknown dtype {dtype!r}; "
                                 f"expected one of {', '.join(DTYPES)}")
        for d in (dtype, *_FALLBACK[dtype]):
            if d in self.peak_flops:
                return self.peak_flops[d]
        raise AssertionError(f"device kind {self.key!r} has no fp32 peak")   # load_kinds requires it

    def to_dict(self) -> dict[str, Any]:
        """The :file:`kinds.yaml` entry (plain dicts and lists; reads back with :func:`kind_from_dict`)."""
        return {
            "key": self.key, "name": self.name, "aliases": list(self.aliases), "vendor": self.vendor,
            "architecture": self.architecture, "peak_flops": dict(self.peak_flops),
            "memory_Bps": self.memory_Bps, "memory_bytes": self.memory_bytes,
            "framework_bytes": self.framework_bytes, "links": dict(self.links), "sources": dict(self.sources),
        }


# ------------------------------------------------------------------------------------ reading


def _fail(where: str, field: str, message: str) -> TensorOptError:
    return TensorOptError(f"{where}: field {field!r} {message}")


def _text(raw: Mapping[str, Any], field: str, where: str) -> str:
    v = raw[field]
    if not isinstance(v, str) or not v.strip():
        raise _fail(where, field, f"must be a non-empty string, got {v!r}")
    return v.strip()


def _positive(v: Any, field: str, where: str, *, integer: bool = False) -> float | int:
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0
    if integer:
        ok = ok and isinstance(v, int)
    if not ok:
        what = "a positive integer" if integer else "a positive number"
        hint = (" (YAML reads 15.7e12 as a string: write the exponent with a sign, 15.7e+12)"
                if isinstance(v, str) and re.fullmatch(r"[0-9.]+[eE][0-9]+", v.strip()) else "")
        raise _fail(where, field, f"must be {what}, got {v!r}{hint}")
    return v


def _mapping(raw: Mapping[str, Any], field: str, where: str) -> Mapping[str, Any]:
    v = raw[field]
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise _fail(where, field, f"must be a mapping with string keys, got {v!r}")
    return v


def _links(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    links = dict(_mapping(raw, "links", where))
    for k in links:
        if k not in _LINK_KEYS:
            raise _fail(where, f"links.{k}", f"is not a known link field ({', '.join(sorted(_LINK_KEYS))})")
    if "pcie" not in links:
        raise _fail(where, "links.pcie", "is missing (the host link, e.g. \"4.0 x16\")")
    for k in ("pcie", "note"):
        if k in links and (not isinstance(links[k], str) or not links[k].strip()):
            raise _fail(where, f"links.{k}", f"must be a non-empty string, got {links[k]!r}")
    for group, keys in _LINK_GROUPS.items():
        present = [k for k in keys if k in links]
        if present and len(present) != len(keys):
            missing = next(k for k in keys if k not in links)
            raise _fail(where, f"links.{missing}", f"is missing (the {group} keys {', '.join(keys)} go together)")
        for k in present:
            _positive(links[k], f"links.{k}", where, integer=k in _LINK_INTS)
    return links


def kind_from_dict(raw: Any, where: str = "device kind") -> DeviceKind:
    """A :class:`DeviceKind` from its :file:`kinds.yaml` entry, every field checked;
    ``where`` starts the error message (the file and the kind)."""
    if not isinstance(raw, Mapping):
        raise TensorOptError(f"{where}: must be a mapping, got {raw!r}")
    if isinstance(raw.get("key"), str):
        where = f"{where} {raw['key']!r}"
    for field in _FIELDS:
        if field not in raw and field not in _OPTIONAL:
            raise _fail(where, field, "is missing")
    for field in raw:
        if field not in _FIELDS:
            raise _fail(where, str(field), f"is not a known field ({', '.join(_FIELDS)})")

    key = _text(raw, "key", where)
    if not _KEY_RE.match(key):
        raise _fail(where, "key", f"must be a lower-case slug (letters, digits, '.', '-'), got {key!r}")
    name = _text(raw, "name", where)
    aliases = raw.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a.strip() for a in aliases):
        raise _fail(where, "aliases", f"must be a list of non-empty strings, got {aliases!r}")

    peak = dict(_mapping(raw, "peak_flops", where))
    for d in peak:
        if d not in DTYPES:
            raise _fail(where, f"peak_flops.{d}", f"is not a known dtype ({', '.join(DTYPES)})")
    if "fp32" not in peak:
        raise _fail(where, "peak_flops.fp32", "is missing (every kind has an FP32 peak)")
    peak = {d: float(_positive(peak[d], f"peak_flops.{d}", where)) for d in DTYPES if d in peak}

    memory_Bps = float(_positive(raw["memory_Bps"], "memory_Bps", where))
    memory_bytes = int(_positive(raw["memory_bytes"], "memory_bytes", where, integer=True))
    framework_bytes = int(_positive(raw["framework_bytes"], "framework_bytes", where, integer=True))
    if framework_bytes >= memory_bytes:
        raise _fail(where, "framework_bytes", f"({framework_bytes}) must be less than memory_bytes ({memory_bytes})")
    links = _links(raw, where)

    sources = dict(_mapping(raw, "sources", where))
    figures = [f"peak_flops.{d}" for d in peak] + ["memory_Bps", "memory_bytes", "framework_bytes", "links"]
    for f in figures:
        if f not in sources:
            raise _fail(where, f"sources.{f}", "is missing (every figure needs a source, or 'unverified: ...')")
        if not isinstance(sources[f], str) or not sources[f].strip():
            raise _fail(where, f"sources.{f}", f"must be a non-empty string, got {sources[f]!r}")
    for f in sources:
        if f not in figures:
            raise _fail(where, f"sources.{f}", "names no figure of this kind")

    return DeviceKind(key=key, name=name, aliases=tuple(a.strip() for a in aliases),
                      vendor=_text(raw, "vendor", where), architecture=_text(raw, "architecture", where),
                      peak_flops=peak, memory_Bps=memory_Bps, memory_bytes=memory_bytes,
                      framework_bytes=framework_bytes, links=links,
                      sources={f: sources[f].strip() for f in figures})


def _spellings(kind: DeviceKind) -> Iterable[str]:
    yield kind.key
    yield kind.name
    yield from kind.aliases


def _build_index(kinds: Iterable[DeviceKind], where: str) -> dict[str, DeviceKind]:
    """normalised key / name / alias → kind; a spelling claimed by two kinds is an error."""
    index: dict[str, DeviceKind] = {}
    for kind in kinds:
        for spelling in _spellings(kind):
            n = normalise_name(spelling)
            if not n:
                raise TensorOptError(f"{where}: kind {kind.key!r}: {spelling!r} normalises to nothing")
            other = index.setdefault(n, kind)
            if other.key != kind.key:
                raise TensorOptError(f"{where}: kind {kind.key!r}: name or alias {spelling!r} is also a name or "
                                     f"alias of kind {other.key!r} (both normalise to {n!r})")
    return index


def _load(path: Path) -> dict[str, DeviceKind]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TensorOptError(f"cannot read the device-kind catalogue {path}: {e.strerror or e}") from None
    try:
        doc = load_yaml(text)
    except yaml.YAMLError as e:
        raise TensorOptError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("kinds"), list):
        raise TensorOptError(f"{path}: field 'kinds' must be a list of device kinds")
    for top in doc:
        if top not in ("version", "kinds") and not str(top).startswith("x-"):
            raise TensorOptError(f"{path}: field {top!r} is not a known top-level field "
                                 "(version, kinds, or x-* for shared anchors)")
    kinds: dict[str, DeviceKind] = {}
    for i, raw in enumerate(doc["kinds"]):
        kind = kind_from_dict(raw, f"{path}: kind #{i}")
        if kind.key in kinds:
            raise TensorOptError(f"{path}: kind #{i} {kind.key!r}: field 'key' repeats an earlier kind's key")
        kinds[kind.key] = kind
    _build_index(kinds.values(), str(path))
    return kinds


@functools.lru_cache(maxsize=1)
def _default() -> tuple[Mapping[str, DeviceKind], Mapping[str, DeviceKind]]:
    """The packaged catalogue and its name index, read once."""
    kinds = _load(_PATH)
    return MappingProxyType(kinds), MappingProxyType(_build_index(kinds.values(), str(_PATH)))


def load_kinds(path: str | os.PathLike[str] | None = None) -> dict[str, DeviceKind]:
    """key → :class:`DeviceKind`, in file order, from ``path`` or (``None``) the packaged
    :file:`kinds.yaml` (read once per process; a fresh dict each call).

    Raises :class:`~tensoropt.errors.TensorOptError` naming the kind and the field when a figure is
    missing, not a positive number, lacks a source, or a name / alias belongs to two kinds.
    """
    if path is None:
        return dict(_default()[0])
    return _load(Path(path))


def find_kind(name: str, kinds: Mapping[str, DeviceKind] | None = None) -> DeviceKind | None:
    """The kind whose key, name or an alias matches ``name`` after :func:`normalise_name`
    (case, a leading ``NVIDIA`` / ``Tesla`` / ``AMD``, spaces, hyphens and underscores do not
    matter), in ``kinds`` or the packaged catalogue; ``None`` when none does.

    A bare family name (``"V100"``, ``"A100"``, ``"H100"``) resolves to the SXM part, the one
    the papers and cloud training instances mean.
    """
    if not isinstance(name, str):
        return None
    index = _default()[1] if kinds is None else _build_index(kinds.values(), "device kinds")
    return index.get(normalise_name(name))


def same_kind(a: str, b: str, kinds: Mapping[str, DeviceKind] | None = None) -> bool:
    """Whether ``a`` and ``b`` name the same device kind: both resolve to one catalogue kind, or
    neither is in the catalogue and their normalised names are equal (``"Foo GPU"`` and
    ``"foo-gpu"``).  One known and one unknown name are different kinds."""
    ka, kb = find_kind(a, kinds), find_kind(b, kinds)
    if ka is not None or kb is not None:
        return ka is not None and kb is not None and ka.key == kb.key
    return normalise_name(a) == normalise_name(b)
