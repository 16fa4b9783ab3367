"""Tasks in KernelBench format: loading files, directories and dataset tables.

A task is Python source defining ``class Model(nn.Module)``, ``get_inputs()`` and
``get_init_inputs()``. Loading here is static (AST only): the trusted parent never executes task or
candidate code; import-time failures are found by a worker process (see ``probe_tasks``).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from cuda_agent.python_source import parse_source

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
DATASET_SUFFIXES = (".parquet", ".jsonl")


class TaskLoadError(ValueError):
    """A task file or dataset row is not a valid KernelBench-format problem."""


@dataclass(frozen=True)
class Task:
    """One problem: its source and where it came from."""

    id: str
    code: str
    origin: str  # file path, or "<dataset path>#<row>"

    @property
    def code_hash(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()


@dataclass(frozen=True)
class TaskLoadResult:
    """Outcome of loading one entry: a task, or the reason it could not be loaded."""

    origin: str
    task: Task | None
    error: str | None


def check_source(code: str, origin: str) -> None:
    """Statically check that ``code`` parses and defines the KernelBench names at top level.

    Raises:
        TaskLoadError: naming ``origin``, the syntax error or the missing names.
    """
    try:
        tree = parse_source(code, filename=origin)
    except SyntaxError as exc:
        raise TaskLoadError(f"{origin}: syntax error at line {exc.lineno}: {exc.msg}") from None
    except UnicodeError:
        raise TaskLoadError(f"{origin}: not valid Unicode text (it holds a lone surrogate)") from None
    except (RecursionError, MemoryError, ValueError):
        raise TaskLoadError(f"{origin}: nested too deeply for the Python parser") from None
    defined = _top_level_names(tree.body)
    missing = [name for name in REQUIRED_NAMES if name not in defined]
    if missing:
        raise TaskLoadError(
            f"{origin}: missing top-level {', '.join(missing)}; a KernelBench problem defines "
            "class Model(nn.Module), get_inputs() and get_init_inputs()"
        )


def _top_level_names(body: list[ast.stmt]) -> set[str]:
    """Names bound at module level, including inside top-level ``if``/``try``/``with`` blocks."""
    defined: set[str] = set()
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in (getattr(node, "body", []), getattr(node, "orelse", []), getattr(node, "finalbody", []),
                          *[h.body for h in getattr(node, "handlers", [])]):
                defined |= _top_level_names(block)
    return defined


def load_task(path: str | Path) -> Task:
    """Load one problem file.

    Raises:
        TaskLoadError: unreadable file, syntax error or missing required names.
    """
    path = Path(path)
    try:
        code = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskLoadError(f"{path}: cannot read problem file ({exc})") from None
    check_source(code, str(path))
    return Task(id=path.stem, code=code, origin=str(path))


def _natural_key(path: Path) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path.name))


def load_tasks(path: str | Path) -> list[TaskLoadResult]:
    """Load every task under ``path``: a problem file, a directory of them, or a dataset file.

    Directories are scanned non-recursively for ``*.py`` in natural order (KernelBench's
    ``1_...py, 2_...py, 10_...py``). Entries that fail carry their error instead of a task.

    Raises:
        TaskLoadError: if ``path`` does not exist, has an unsupported suffix, or is a folder
            without problem files (the message names the task sets found beside or below them).
    """
    path = Path(path)
    if not path.exists():
        raise TaskLoadError(f"{path}: no such file or directory")
    if path.is_dir():
        files = sorted((p for p in path.glob("*.py") if not p.name.startswith("_")), key=_natural_key)
        if not files:
            raise TaskLoadError(_no_problem_files(path))
        return [_result(str(f), lambda f=f: load_task(f)) for f in files]
    if path.suffix in DATASET_SUFFIXES:
        return _load_dataset(path)
    if path.suffix == ".py":
        return [_result(str(path), lambda: load_task(path))]
    raise TaskLoadError(f"{path}: expected a .py problem, a directory, or a dataset ({', '.join(DATASET_SUFFIXES)})")


def _no_problem_files(folder: Path) -> str:
    """Why ``folder`` gives no task, naming the task sets in it and one folder down (a dataset's
    own folder, a KernelBench checkout's ``level1/``): the user meant one of them."""
    found = [str(p) for p in sorted(folder.iterdir()) if p.suffix in DATASET_SUFFIXES]
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        if any(not p.name.startswith("_") for p in child.glob("*.py")):
            found.append(f"{child}/")
        found += [str(p) for p in sorted(child.iterdir()) if p.suffix in DATASET_SUFFIXES]
    if not found:
        return (f"{folder}: no problem files (*.py) and no dataset ({', '.join(DATASET_SUFFIXES)}) here or one "
                "folder down")
    shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
    return f"{folder}: no problem files (*.py) in this folder; task sets found: {shown} (give one of them)"


def _result(origin: str, load) -> TaskLoadResult:
    try:
        return TaskLoadResult(origin, load(), None)
    except TaskLoadError as exc:
        return TaskLoadResult(origin, None, str(exc))


def _load_dataset(path: Path) -> list[TaskLoadResult]:
    """One result per row. A row's id is its ``id`` column when the table has one, else
    ``row<index>`` (0-based, blank JSONL lines not counted), so ids are unique and stable for any
    table with a ``code`` column, including CUDA-Agent-Ops-6K, whose rows share ``data_source``
    values such as ``torch#3``. A row whose id repeats an earlier row's fails to load."""
    rows = _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path)
    if rows and not any("code" in row for row in rows):
        raise TaskLoadError(f"{path}: dataset has no 'code' column (columns: {sorted(rows[0])})")
    first_row_of: dict[str, int] = {}
    results = []
    for index, row in enumerate(rows):
        origin = f"{path}#{index}"
        task_id = _row_id(row, index)
        repeated = first_row_of.setdefault(task_id, index) if task_id is not None else None

        def load(row=row, origin=origin, task_id=task_id, repeated=repeated, index=index) -> Task:
            if task_id is None:
                raise TaskLoadError(f"{origin}: 'id' must be a string or an integer, got {row['id']!r:.80}")
            if repeated != index:
                raise TaskLoadError(f"{origin}: id {task_id!r} repeats row {repeated}; ids must be unique")
            code = row.get("code")
            if code is None:
                raise TaskLoadError(f"{origin}: no 'code' (the row's columns: {sorted(row)})")
            if not isinstance(code, str):
                raise TaskLoadError(f"{origin}: 'code' must be a string, got {type(code).__name__}")
            check_source(code, origin)
            return Task(id=task_id, code=code, origin=origin)

        results.append(_result(origin, load))
    return results


def _row_id(row: dict, index: int) -> str | None:
    """The row's task id (see ``_load_dataset``); None when its ``id`` is neither text nor an integer."""
    if "id" not in row or row["id"] is None:
        return f"row{index}"
    value = row["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        return None
    return str(value)


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TaskLoadError(f"{path}:{number}: invalid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise TaskLoadError(f"{path}:{number}: each line must be a JSON object")
        rows.append(row)
    return rows


def _read_parquet(path: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise TaskLoadError(
            f"{path}: reading Parquet needs pyarrow; install it with: pip install 'cuda-agent[parquet]'"
        ) from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several unrelated types for corrupt files
        raise TaskLoadError(f"{path}: cannot read Parquet file ({exc})") from None
