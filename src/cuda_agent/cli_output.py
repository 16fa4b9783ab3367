"""Output that reads well whether or not a person watches a terminal.

On a terminal, progress is a live bar; anywhere else (CI logs, ``nohup``, ``> log``) a bar prints
nothing until it ends, so :func:`step_progress` prints a line when a step begins and one per
finished step instead, with the elapsed time. Tables wrap long cells instead of cutting them, at
any width. Help reads as usual at any typer version (:class:`CliApp`).
"""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperArgument, TyperCommand, TyperGroup

from cuda_agent.cli_support import err_console

BAR_COLUMNS = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())


class LineProgress(Progress):
    """A ``Progress`` without a live display: each task added and each step finished prints
    ``[  12.3 s] <description>: <done>/<total>`` (the first line comes at once, not after a cold
    step of a minute)."""

    def __init__(self, console: Console) -> None:
        super().__init__(console=console, disable=True)
        self._started = time.monotonic()

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> TaskID:
        task_id = super().add_task(description, *args, **kwargs)
        self._report(task_id)
        return task_id

    def update(self, task_id: TaskID, **changes: Any) -> None:
        before = self._tasks[task_id].completed
        super().update(task_id, **changes)
        self._report_if_advanced(task_id, before)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        before = self._tasks[task_id].completed
        super().advance(task_id, advance)
        self._report_if_advanced(task_id, before)

    def _report_if_advanced(self, task_id: TaskID, before: float) -> None:
        if self._tasks[task_id].completed > before:
            self._report(task_id)

    def _report(self, task_id: TaskID) -> None:
        task = self._tasks[task_id]
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


class _PlainFlags:
    """Help without a value type beside a flag, which takes no value (typer 0.29 shows ``<bool>``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class PlainHelpGroup(_PlainFlags, TyperGroup):
    """A command group with :class:`_PlainFlags` help."""


class PlainHelpCommand(_PlainFlags, TyperCommand):
    """A command whose usage line names its arguments as usual, ``verify [OPTIONS] PROBLEM
    SOLUTION`` (typer 0.27+ writes ``{problem} {solution}``), with :class:`_PlainFlags` help."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = (param.metavar or param.name or "").upper() + ("..." if param.nargs != 1 else "")
                pieces.append(name if param.required else f"[{name}]")
        return pieces


class CliApp(typer.Typer):
    """The ``typer.Typer`` of every ``cuda-agent`` command group: plain help on its commands and
    on itself (a ``cls`` given still wins)."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("cls", PlainHelpGroup)
        super().__init__(**options)

    def command(self, *args: Any, **options: Any) -> Any:
        options.setdefault("cls", PlainHelpCommand)
        return super().command(*args, **options)
