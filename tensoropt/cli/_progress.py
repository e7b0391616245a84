"""The workflow's progress (:class:`tensoropt.workflow.Progress`) drawn on the terminal: one rich
bar per stage — counts done of total, time so far and the time left at the rate so far — removed
when the work is done (Ctrl-C cancels: the command exits 130).  It only draws: it must not decide the stages
(the workflow does) nor print results (the commands do).

Example::

    with ProgressBars(console) as progress:
        result = explore(request, progress)
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class ProgressBars:
    """A :class:`~tensoropt.workflow.Progress` that draws a bar per stage on ``console`` (nothing
    is left on the screen afterwards; on a non-terminal rich draws nothing)."""

    def __init__(self, console: Console) -> None:
        self.bars = Progress(SpinnerColumn(), TextColumn("{task.fields[stage]:<9}"), BarColumn(),
                             MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                             TextColumn("{task.description}"),
                             console=console, transient=True)
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> ProgressBars:
        self.bars.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.bars.stop()

    def __call__(self, stage: str, done: int, total: int, message: str) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.bars.add_task("", total=max(total, 1), stage=stage)
        self.bars.update(self.tasks[stage], completed=done, total=max(total, 1), description=escape(message))
