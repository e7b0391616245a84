"""Uploaded files, checked as data: an ONNX model, a saved profile JSON, a cluster YAML / JSON, a
device-model calibration JSON.

:func:`accept_upload` decodes what ``dcc.Upload`` sends (``data:…;base64,…``), refuses it when it
is too large or of the wrong kind, saves it under the store's ``uploads/`` folder named by its
content hash, and reads it once with the library's own reader (``onnx.load``, JSON,
``yaml.safe_load``) so that a malformed file is reported at once, with the reader's message.
Nothing uploaded is executed or unpickled.

It owns the checks on uploaded bytes and where they are saved; it must not execute, import or
unpickle anything uploaded, nor start any work on it (the run button does).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensoropt.capture import load_onnx
from tensoropt.cluster import Cluster
from tensoropt.describe import fmt_bytes
from tensoropt.devicemodel import Calibration
from tensoropt.errors import TensorOptError
from tensoropt.measure import CostModel

from .pipeline import ResultStore, save_upload

#: kind → (accepted file suffixes, size limit in bytes)
UPLOAD_KINDS = {
    "onnx": ((".onnx",), 256 * 2 ** 20),
    "profile": ((".json",), 64 * 2 ** 20),
    "cluster": ((".yaml", ".yml", ".json"), 1 * 2 ** 20),
    "calibration": ((".json",), 1 * 2 ** 20),
}


class UploadError(TensorOptError):
    """An upload is too large, of the wrong kind, or malformed; the message says which and why."""


@dataclass(frozen=True)
class Accepted:
    """An accepted upload: where it was saved and a line describing what it holds."""

    path: Path
    message: str


def decode(contents: str | None, filename: str | None, kind: str) -> tuple[bytes, str]:
    """``(bytes, suffix)`` of a ``dcc.Upload`` payload of ``kind`` (a key of
    :data:`UPLOAD_KINDS`), after the name and size checks.  O(size)."""
    suffixes, limit = UPLOAD_KINDS[kind]
    name = filename or "upload"
    suffix = Path(name).suffix.lower()
    if suffix not in suffixes:
        raise UploadError(f"{name}: expected a {' / '.join(suffixes)} file for the {kind}")
    if not isinstance(contents, str) or "," not in contents:
        raise UploadError(f"{name}: the upload arrived empty or garbled; try again")
    b64 = contents.split(",", 1)[1]
    if len(b64) * 3 // 4 > limit:   # before decoding: do not allocate a huge buffer to refuse it
        raise UploadError(f"{name}: larger than the {fmt_bytes(limit)} allowed for a {kind} upload")
    try:
        data = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise UploadError(f"{name}: the upload is not valid base64 data; try again") from None
    if not data:
        raise UploadError(f"{name}: the file is empty")
    return data, suffix


def accept_upload(store: ResultStore, contents: str | None, filename: str | None, kind: str) -> Accepted:
    """Decode, save and read an upload (module docstring); :class:`UploadError` or the reader's
    :class:`~tensoropt.errors.TensorOptError` when it is not usable."""
    data, suffix = decode(contents, filename, kind)
    name = filename or "upload"
    path = save_upload(store, data, suffix)
    try:
        return _read(path, data, name, kind)
    except TensorOptError as e:   # the readers name the saved file: name the user's file instead
        raise type(e)(str(e).replace(str(path), name)) from None


def _read(path: Path, data: bytes, name: str, kind: str) -> Accepted:
    if kind == "onnx":
        graph = load_onnx(path)
        return Accepted(path, f"{name}: ONNX graph {graph.name!r}, {len(graph.ops)} operators")
    if kind == "profile":
        costs = CostModel.from_dict(_json(data, name), where=name)
        return Accepted(path, f"{name}: profile of {costs.graph_name!r} with {len(costs)} nodes "
                              "(used instead of profiling while the times come from an uploaded profile)")
    if kind == "calibration":
        cal = Calibration.from_dict(_json(data, name), where=name)
        made = f"fitted on {cal.device}" if cal.device else "not fitted"
        return Accepted(path, f"{name}: calibration {cal.name!r} ({made}; {cal.error_text()}), used by the device "
                              "model wherever one prices the times")
    if kind == "cluster":
        cluster = Cluster.load(path)
        return Accepted(path, f"{name}: cluster {cluster.name!r} with {len(cluster)} devices")
    raise UploadError(f"unknown upload kind {kind!r}")


def _json(data: bytes, name: str) -> Any:
    """The uploaded bytes as a JSON value; :class:`UploadError` when they are not JSON."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UploadError(f"{name}: not a JSON file ({e})") from None


__all__ = ["accept_upload", "decode", "Accepted", "UploadError", "UPLOAD_KINDS"]
