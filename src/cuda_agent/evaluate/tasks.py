"""Benchmark task sets and the solutions that answer them.

A task set is a KernelBench checkout (the repository root or its ``KernelBench/`` folder, with
``level1/``, ``level2/``, ...), one level folder, any folder of problem files, or one of our
datasets (Parquet/JSONL). A solutions folder holds one solution per task, as a file or a workdir
folder, named ``level{L}_problem{N}`` after the KernelBench problem number or after the task id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.environment import Task, TaskLoadError, load_tasks

_LEVEL_DIR = re.compile(r"^level(\d+)$")
_PROBLEM_FILE = re.compile(r"^(\d+)_")

KERNELBENCH_LEVELS = (1, 2, 3)
"""Levels a KernelBench checkout contributes when none are named: the 250 problems the CUDA Agent
paper (and KernelBench's own leaderboard) report on. Level 4 (Hugging Face models) only on request."""


class TaskSetError(ValueError):
    """The task set or the solutions folder cannot be used; the message names the path and the fix."""


@dataclass(frozen=True)
class EvalTask:
    """One benchmark task. ``key`` is unique in its set: ``level{L}_problem{N}`` for KernelBench
    problems, else the task id. ``task`` is None when the problem could not be loaded (``error``)."""

    key: str
    level: int | None
    number: int | None
    origin: str
    task: Task | None
    error: str | None

    @property
    def solution_names(self) -> tuple[str, ...]:
        """Names a solution for this task may have (without ``.py``), in order of preference."""
        names = [self.key]
        if self.task is not None and self.task.id != self.key:
            names.append(self.task.id)
        return tuple(names)


def _kernelbench_levels(root: Path) -> dict[int, Path]:
    """``{level: folder}`` of a KernelBench checkout (its root or its ``KernelBench/`` folder)."""
    for base in (root / "KernelBench", root):
        levels = {int(m.group(1)): p for p in base.iterdir() if p.is_dir() and (m := _LEVEL_DIR.match(p.name))} \
            if base.is_dir() else {}
        if levels:
            return levels
    return {}


def load_task_set(path: Path, levels: tuple[int, ...] = ()) -> list[EvalTask]:
    """The tasks under ``path``, restricted to ``levels`` when given (KernelBench only). A whole
    checkout without ``levels`` gives :data:`KERNELBENCH_LEVELS` (those it has); a level folder
    gives that level.

    Raises:
        TaskSetError: no such path, ``levels`` on a set without levels, a level that does not
            exist, no task at all, or two tasks with the same id.
    """
    if not path.exists():
        raise TaskSetError(f"{path}: no such file or directory (expected a KernelBench checkout, a folder of "
                           "problem files, or a .parquet/.jsonl dataset)")
    found: dict[int, Path] = {}
    if path.is_dir():
        match = _LEVEL_DIR.match(path.name)
        found = {int(match.group(1)): path} if match else _kernelbench_levels(path)
    if not found:
        if levels:
            raise TaskSetError(f"{path}: --level needs a KernelBench checkout (a folder with level1/, level2/, ...)")
        tasks = [_eval_task(result, None) for result in _load(path)]
    else:
        unknown = sorted(set(levels) - set(found))
        if unknown:
            raise TaskSetError(f"{path}: no level {', '.join(map(str, unknown))}; available: "
                               f"{', '.join(map(str, sorted(found)))}")
        chosen = levels or tuple(level for level in KERNELBENCH_LEVELS if level in found) or tuple(found)
        tasks = [_eval_task(result, level) for level in sorted(chosen) for result in _load(found[level])]
    if not tasks:
        raise TaskSetError(f"{path}: no tasks found")
    duplicates = sorted({t.key for t in tasks if sum(u.key == t.key for u in tasks) > 1})
    if duplicates:
        raise TaskSetError(f"{path}: task ids must be unique; repeated: {', '.join(duplicates[:10])}")
    return tasks


def _load(path: Path):
    try:
        return load_tasks(path)
    except TaskLoadError as exc:
        raise TaskSetError(str(exc)) from None


def _eval_task(result, level: int | None) -> EvalTask:
    name = Path(result.origin.split("#")[0]).name if result.task is None else result.task.id
    match = _PROBLEM_FILE.match(name) if level is not None else None
    number = int(match.group(1)) if match else None
    if number is not None:
        key = f"level{level}_problem{number}"
    else:
        key = result.task.id if result.task is not None else _failed_key(result.origin)
    return EvalTask(key, level, number, result.origin, result.task, result.error)


def _failed_key(origin: str) -> str:
    """The key of an entry that did not load: the file stem, or ``<dataset file>#<row>``."""
    return Path(origin).name if "#" in Path(origin).name else Path(origin).stem


@dataclass(frozen=True)
class SolutionMatch:
    """Which solution answers each task (None: missing), and files that answer no task."""

    by_task: dict[str, Path | None]
    unmatched: list[Path]

    @property
    def n_found(self) -> int:
        return sum(path is not None for path in self.by_task.values())


def match_solutions(tasks: list[EvalTask], solutions_dir: Path) -> SolutionMatch:
    """Find each task's solution in ``solutions_dir``: ``<name>.py`` or a folder ``<name>/`` for a
    name in ``EvalTask.solution_names``.

    Raises:
        TaskSetError: the folder does not exist, matches no task at all, or holds two solutions for
            one task.
    """
    if not solutions_dir.is_dir():
        raise TaskSetError(f"{solutions_dir}: not a folder of solutions")
    entries = {p.stem if p.is_file() else p.name: p for p in solutions_dir.iterdir()
               if not p.name.startswith((".", "_")) and (p.is_dir() or p.suffix == ".py")}
    by_task: dict[str, Path | None] = {}
    used: set[Path] = set()
    for task in tasks:
        candidates = [entries[name] for name in task.solution_names if name in entries]
        for name in task.solution_names:
            if (solutions_dir / f"{name}.py").is_file() and (solutions_dir / name).is_dir():
                raise TaskSetError(f"{solutions_dir}: both {name}.py and {name}/ answer task {task.key}; keep one")
        if len(candidates) > 1:
            raise TaskSetError(f"{solutions_dir}: {' and '.join(c.name for c in candidates)} both answer task "
                               f"{task.key}; keep one")
        by_task[task.key] = candidates[0] if candidates else None
        used.update(candidates)
    if not used:
        example = tasks[0].solution_names[0]
        raise TaskSetError(f"{solutions_dir}: no solution matches any task; name them after the task, "
                           f"e.g. {example}.py or a folder {example}/")
    return SolutionMatch(by_task, sorted(set(entries.values()) - used))
