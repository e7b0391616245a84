"""Errors tensoropt raises for bad input.

Every error a user can cause derives from :class:`TensorOptError`; its message names the cause
and the fix.  The CLI prints the message alone (no traceback unless ``--debug``) and exits with
:attr:`TensorOptError.exit_code`.

It owns the error types only: no module here raises a bare ``ValueError`` for a user's mistake,
and this module must not import anything of tensoropt's (every module imports it).

Example::

    >>> try:
    ...     raise ProfileError("no profile for graph 'x'; run tensoropt profile")
    ... except TensorOptError as e:
    ...     e.exit_code
    2
"""

from __future__ import annotations


class TensorOptError(Exception):
    """A problem with the user's input, explained in the message."""

    exit_code = 2


class ModelSpecError(TensorOptError):
    """A model spec (``zoo:NAME?k=v``, ``file.py:factory``, ``model.onnx``) cannot be resolved."""


class CaptureError(TensorOptError):
    """Neither torch.export nor torch.fx could turn the model into an operator graph."""


class GraphFormatError(TensorOptError):
    """A saved graph / profile / plan file is malformed; the message names the field."""


class ClusterSpecError(TensorOptError):
    """A cluster spec (``preset:NAME``, YAML / JSON file) is malformed; the message names the file
    and the field."""


class ProfileError(TensorOptError):
    """A profile cannot be made or used (e.g. it belongs to another graph: both fingerprints are
    named, with the command that re-profiles)."""


class ExecutionError(TensorOptError):
    """A plan cannot be executed as asked (a device map that misses a plan device or names a CUDA
    device that does not exist, a plan larger than the real devices' memory, an operator split the
    executor cannot run); the message names the device or node and the fix."""


class DistributedError(TensorOptError):
    """A plan cannot run across processes: a world size that does not match the plan's device map,
    a rendezvous port already in use, a rank that died or stopped answering within the timeout;
    the message names the rank or port and the fix."""
