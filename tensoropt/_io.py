"""Small file helpers shared by every writer: atomic writes and JSON loading with clear errors.

It owns how files are written (a temporary file renamed into place: a reader never sees half a
file) and how JSON errors read; it must not know any file format beyond the ``format`` /
fingerprint header every tensoropt file carries.

Example::

    >>> path = write_json_atomic("plan.json", {"format": "tensoropt.plan/1", "nodes": {}})
    >>> path.name, read_json(path, "plan")["format"]
    ('plan.json', 'tensoropt.plan/1')
    >>> read_json("no-such-plan.json", "plan")
    Traceback (most recent call last):
    tensoropt.errors.GraphFormatError: plan file not found: no-such-plan.json
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .errors import GraphFormatError

#: libyaml's safe loader where PyYAML was built with it (the wheels are), else the pure-Python one: the
#: same documents and errors, ten times faster (the device-kind catalogue: 0.11 s of a page's first draw)
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never half.

    The text goes to a temporary file in the same folder, is flushed to disk, then renamed over
    ``path`` (rename is atomic on POSIX within one file system).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def json_text(data: Any) -> str:
    """``data`` as JSON text a person can read and a program writes fast: an object's or a list's
    entries one per line, each entry on its line in compact form (a plan's operator and its
    configuration per line).  The entries go through the json module's C encoder, where ``indent``
    sends the whole document through its pure-Python one: a plan of 300 operators takes 1.0 ms
    here, 1.5 ms with ``indent=1`` (0.36 ms all on one line, unreadable).

    >>> print(json_text({"format": "x/1", "configs": {"a": {"layout": "R"}, "b": {"layout": "B"}}}))
    {
     "format": "x/1",
     "configs": {
      "a": {"layout": "R"},
      "b": {"layout": "B"}
     }
    }
    """
    if isinstance(data, dict) and data:
        rows = [f" {_key(k)}: {_entries(v)}" for k, v in data.items()]
        return "{\n" + ",\n".join(rows) + "\n}"
    if isinstance(data, list) and data:
        return "[\n" + ",\n".join(f" {json.dumps(v)}" for v in data) + "\n]"
    return json.dumps(data)


def _key(k: Any) -> str:
    """An object's key as the json module writes it (a number, true, false or null as its text)."""
    return json.dumps(k if isinstance(k, str) else json.dumps(k))


class RawJSON(str):
    """Text that is already JSON, which :func:`json_text` writes as it is where it is an entry of an
    object of several entries: a plan's operator configurations, each encoded once and reused by
    every plan (Llama-3-8B's 130 plans of 1,728 operators: 1.1 s encoded entry by entry)."""


def _entries(value: Any) -> str:
    """A top-level value of :func:`json_text`: an object or list of more than one entry one entry
    per line (indented two), anything else compact."""
    if isinstance(value, dict) and len(value) > 1:
        return "{\n" + ",\n".join(f"  {_key(k)}: {v if isinstance(v, RawJSON) else json.dumps(v)}"
                                   for k, v in value.items()) + "\n }"
    if isinstance(value, list) and len(value) > 1 and any(isinstance(v, (dict, list)) for v in value):
        return "[\n" + ",\n".join(f"  {json.dumps(v)}" for v in value) + "\n ]"
    return json.dumps(value)


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as JSON (:func:`json_text`) to ``path``, atomically (:func:`write_atomic`)."""
    return write_atomic(path, json_text(data) + "\n")


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Load a JSON file, turning a missing file or bad JSON into a :class:`GraphFormatError`."""
    path = Path(path)
    if not path.is_file():
        raise GraphFormatError(f"{what} file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise GraphFormatError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None


def graph_file_header(d: Any, fmt: str | tuple[str, ...], where: str) -> str:
    """Check that a loaded profile / plan is a JSON object of format ``fmt`` (or one of several
    readable formats) and return the graph fingerprint it carries; a :class:`GraphFormatError`
    naming the field otherwise."""
    if not isinstance(d, Mapping):
        raise GraphFormatError(f"{where} must be a JSON object")
    formats = (fmt,) if isinstance(fmt, str) else fmt
    if d.get("format") not in formats:
        raise GraphFormatError(f"{where}.format must be {' or '.join(map(repr, formats))}, got {d.get('format')!r}")
    fp = d.get("graph_fingerprint")
    if not isinstance(fp, str) or len(fp) != 64:
        raise GraphFormatError(f"{where}.graph_fingerprint must be the graph's 64-hex-digit SHA-256")
    return fp


def load_yaml(text: str) -> Any:
    """``yaml.safe_load(text)``, through libyaml where PyYAML has it: the same values, the same
    :class:`yaml.YAMLError` on a malformed document."""
    return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader
