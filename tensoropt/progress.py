"""Progress: the one protocol every long stage reports through.

``progress(stage, done, total, message)``: ``stage`` names the work (``"profile"``,
``"frontier"``, ``"baselines"`` …), ``done`` of ``total`` units of it are finished (operators
while profiling, meshes while tracking, placers while comparing; ``0`` of ``1`` where the work
has no count), and ``message`` says in a line what runs now.  The library reports and never
draws: the CLI draws bars (:class:`tensoropt.cli._progress.ProgressBars`), the dashboard its
progress element.

Example::

    >>> seen = []
    >>> report: Progress = lambda stage, done, total, message: seen.append((stage, done, total))
    >>> report("profile", 3, 10, "aten.mm"); seen
    [('profile', 3, 10)]
"""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """What a long stage calls as it proceeds (module docstring); arguments by position."""

    def __call__(self, stage: str, done: int, total: int, message: str, /) -> None: ...


def no_progress(stage: str, done: int, total: int, message: str, /) -> None:
    """A :class:`Progress` that reports nothing."""


__all__ = ["Progress", "no_progress"]
