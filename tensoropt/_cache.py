"""The cache folder, and values kept in it by what they depend on.

Every cache of tensoropt lives under one folder, :func:`cache_root`: ``--cache-dir DIR`` where a
command is given one, else ``$TENSOROPT_CACHE_DIR``, else ``~/.cache/tensoropt``.  In it:

- ``profile-cache-<device>.json``: the profiler's measured calls (:mod:`tensoropt.measure.profiler`);
- ``captures/<key>.json``: captured graphs (:meth:`tensoropt.modelspec.LoadedModel.capture`);
- ``profiles/<key>.json``: untimed profiles (:func:`tensoropt.measure.profile`);
- ``app/``: the dashboard's results (:mod:`tensoropt.dashboard.pipeline`).

A :class:`ContentCache` keeps JSON values by their *identity* — a JSON object naming everything
the value depends on (the model's source or config, the input shapes, the precision, the
versions of torch and transformers, a digest of tensoropt's own code that computes it: :func:`code_digest`).
The file is named by the SHA-256 of the identity and holds the identity itself: an entry is
served only where its identity equals the one asked for (a changed field is a miss, never a
stale hit), and a file that is unreadable, of another format or of another identity is ignored
and overwritten.  Files are written atomically (:func:`tensoropt._io.write_json_atomic`); a
folder that cannot be written never fails the work (the value is computed again next time).

Example::

    >>> cache = ContentCache(cache_root("cache"), "captures")
    >>> cache.get({"model": "zoo:gpt2", "batch": 8}) is None
    True
    >>> cache.put({"model": "zoo:gpt2", "batch": 8}, {"nodes": []})
    >>> cache.get({"model": "zoo:gpt2", "batch": 8}), cache.get({"model": "zoo:gpt2", "batch": 4})
    ({'nodes': []}, None)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from ._io import write_json_atomic

__all__ = ["CACHE_FORMAT", "ContentCache", "cache_root", "code_digest", "package_version"]

#: the entries' format: a change makes every older entry a miss
CACHE_FORMAT = "tensoropt.cache/1"

_PACKAGE = Path(__file__).resolve().parent


def cache_root(folder: str | os.PathLike[str] | None = None) -> Path:
    """``folder``, else ``$TENSOROPT_CACHE_DIR``, else ``~/.cache/tensoropt``: the one folder every
    cache of tensoropt lives under (module docstring)."""
    if folder is not None:
        return Path(folder)
    return Path(os.environ.get("TENSOROPT_CACHE_DIR") or Path.home() / ".cache" / "tensoropt")


class ContentCache:
    """JSON values under ``root/kind/``, each kept by its identity (module docstring)."""

    def __init__(self, root: str | os.PathLike[str], kind: str):
        self.folder = Path(root) / kind

    def path(self, identity: Mapping[str, Any]) -> Path:
        """The file of the entry for ``identity``."""
        return self.folder / f"{hashlib.sha256(_canonical(identity).encode()).hexdigest()[:32]}.json"

    def get(self, identity: Mapping[str, Any]) -> Any | None:
        """The value kept for ``identity``, else ``None`` (no entry; an unreadable, old-format or
        other-identity file counts as none)."""
        try:
            with open(self.path(identity), encoding="utf-8") as f:
                entry = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT \
                or _canonical(entry.get("identity")) != _canonical(identity):
            return None
        return entry.get("value")

    def put(self, identity: Mapping[str, Any], value: Any) -> None:
        """Keep ``value`` (a JSON value) for ``identity``, atomically; an unwritable folder is let be."""
        with contextlib.suppress(OSError):
            write_json_atomic(self.path(identity), {"format": CACHE_FORMAT, "identity": identity, "value": value})


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


@cache
def code_digest(*parts: str) -> str:
    """SHA-256 (16 hex digits) of tensoropt's own source files under ``parts`` (package-relative
    folders or modules, e.g. ``"capture"``, ``"graph.py"``): what decides a cached value besides
    its inputs, so that an edit of that code is a miss.  Read once per process (about 1 ms)."""
    h = hashlib.sha256()
    for part in sorted(parts):
        path = _PACKAGE / part
        files: Iterable[Path] = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(str(f.relative_to(_PACKAGE)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


@cache
def package_version(name: str) -> str | None:
    """An installed distribution's version, read from its metadata without importing it
    (``transformers`` takes 2 s to import), ``None`` where it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
