"""Output that reads well whether or not a person watches a terminal.

On a terminal, progress is a live bar; anywhere else (CI logs, ``nohup``, ``> log``) a bar prints
nothing until it ends, so :func:`step_progress` prints one line per finished step instead, with the
elapsed time. Tables wrap long cells instead of cutting them, at any width.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from cuda_agent.cli_support import err_console

BAR_COLUMNS = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())


class LineProgress(Progress):
    """A ``Progress`` without a live display: each step finished prints
    ``[  12.3 s] <description>: <done>/<total>``."""

    def __init__(self, console: Console) -> None:
        super().__init__(console=console, disable=True)
        self._started = time.monotonic()

    def update(self, task_id: TaskID, **changes: Any) -> None:
        before = self._tasks[task_id].completed
        super().update(task_id, **changes)
        self._report_if_advanced(task_id, before)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        before = self._tasks[task_id].completed
        super().advance(task_id, advance)
        self._report_if_advanced(task_id, before)

    def _report_if_advanced(self, task_id: TaskID, before: float) -> None:
        task = self._tasks[task_id]
        if task.completed > before:
            total = "?" if task.total is None else f"{task.total:g}"
            self.console.print(f"[{time.monotonic() - self._started:7.1f} s] {task.description}: "
                               f"{task.completed:g}/{total}", markup=False, highlight=False, soft_wrap=True)


def step_progress(*columns: ProgressColumn, disable: bool = False) -> Progress:
    """Progress on stderr: a live bar of ``columns`` on a terminal, :class:`LineProgress` elsewhere,
    nothing when ``disable`` (``--json``, ``--quiet``)."""
    if disable or err_console.is_terminal:
        return Progress(*(columns or BAR_COLUMNS), console=err_console, disable=disable)
    return LineProgress(err_console)


class WrappingTable(Table):
    """A rich ``Table`` whose cells wrap (``overflow="fold"``) instead of ending in an ellipsis."""

    def add_column(self, header: Any = "", **options: Any) -> None:
        options.setdefault("overflow", "fold")
        super().add_column(header, **options)

    def add_row(self, *cells: Any, **options: Any) -> None:
        while len(self.columns) < len(cells):
            self.add_column()
        super().add_row(*cells, **options)
