"""The results store of ``cuda-agent eval``: one SQLite file, rows keyed by (run, task).

A result is written the moment its verdict arrives, in its own transaction, so a killed run loses
at most the evaluations in flight. Rerunning continues the run: a task with a result is never
evaluated again unless its solution changed since (each result records its solution's content hash)
or no verdict was reached (``harness_error``). A run remembers the settings it was started with and
refuses to continue under different ones.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.sqlite_wal import Database
from cuda_agent.evaluate.metrics import TaskOutcome

STORE_FILE = "results.sqlite"
HARNESS_ERROR = "harness_error"
"""Status of a task whose evaluation the harness could not finish (its worker died on every
attempt): not a verdict, so a resumed run tries it again."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    settings TEXT NOT NULL,
    info TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL,
    task_key TEXT NOT NULL,
    level INTEGER,
    origin TEXT NOT NULL,
    solution TEXT,
    solution_hash TEXT,
    status TEXT NOT NULL,
    correct INTEGER NOT NULL,
    verdict TEXT,
    error TEXT,
    worker TEXT,
    attempts INTEGER NOT NULL,
    eval_s REAL NOT NULL,
    finished_at REAL NOT NULL,
    PRIMARY KEY (run_id, task_key)
);
"""


class StoreError(ValueError):
    """The store cannot serve this request (unknown run, different settings); the message says why."""


@dataclass(frozen=True)
class ResultRecord:
    """One task's stored result. ``verdict`` is the verdict's JSON form, None without a verdict."""

    task_key: str
    level: int | None
    origin: str
    solution: str | None
    solution_hash: str | None  # content hash of the solution evaluated (None: no readable solution)
    status: str
    correct: bool
    verdict: dict[str, Any] | None
    error: str | None
    worker: str | None
    attempts: int
    eval_s: float
    finished_at: float

    def outcome(self) -> TaskOutcome:
        if self.verdict is None:
            return TaskOutcome.failed(self.task_key, self.level, self.status)
        return TaskOutcome.from_verdict(self.task_key, self.level, self.verdict)


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    created_at: float
    settings: dict[str, Any]  # what must match for a run to be continued
    info: dict[str, Any]  # details for reports (paths, environment)


def _is_results_store(file: Path) -> bool:
    try:
        with file.open("rb") as handle:
            if handle.read(16) != b"SQLite format 3\0":
                return False
        with contextlib.closing(sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)) as db:
            return db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='results'").fetchone() is not None
    except (OSError, sqlite3.Error):
        return False


class ResultsStore:
    """Thread-safe access to one results file (``results.sqlite`` in a run's folder)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db = Database(path, _SCHEMA)

    @classmethod
    def open_existing(cls, path: Path) -> "ResultsStore":
        """Open a run folder's store (or the ``.sqlite`` file itself) for reading.

        Raises:
            StoreError: no store there.
        """
        file = path / STORE_FILE if path.is_dir() else path
        if not file.is_file():
            raise StoreError(f"{path}: no results store (expected {STORE_FILE} written by `cuda-agent eval`)")
        if not _is_results_store(file):  # never turn someone's file into a store by opening it
            raise StoreError(f"{file}: not a results store written by `cuda-agent eval` (expected an SQLite file "
                             "with a results table, e.g. <run folder>/results.sqlite)")
        return cls(file)

    def close(self) -> None:
        self._db.close()

    # -- runs ----------------------------------------------------------------------------------
    def start_run(self, run_id: str, settings: dict[str, Any], info: dict[str, Any]) -> bool:
        """Create ``run_id``, or check that it was started with the same ``settings``; True if it
        already existed (the run continues).

        Raises:
            StoreError: the run exists with other settings (naming the ones that differ).
        """
        existing = self._run_row(run_id)
        if existing is None:
            self._db.execute("INSERT INTO runs VALUES (?, ?, ?, ?)",
                             (run_id, time.time(), json.dumps(settings, sort_keys=True), json.dumps(info)))
            return False
        before = json.loads(existing[2])
        now = json.loads(json.dumps(settings, sort_keys=True))
        if before != now:
            changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            raise StoreError(f"{self.path}: run {run_id!r} was started with other settings ({', '.join(changed)} "
                             "differ); continue it with the same ones, or start a new run (another --out)")
        return True

    def run(self, run_id: str | None = None) -> RunInfo:
        """The run ``run_id``, or the only run of the store.

        Raises:
            StoreError: no such run, or several runs and no ``run_id``.
        """
        if run_id is None:
            ids = [row[0] for row in self._db.query("SELECT run_id FROM runs ORDER BY created_at")]
            if len(ids) != 1:
                raise StoreError(f"{self.path}: holds {len(ids)} runs ({', '.join(ids) or 'none'}); name one with --run")
            run_id = ids[0]
        row = self._run_row(run_id)
        if row is None:
            raise StoreError(f"{self.path}: no run {run_id!r}")
        return RunInfo(row[0], row[1], json.loads(row[2]), json.loads(row[3]))

    def _run_row(self, run_id: str) -> tuple | None:
        rows = self._db.query("SELECT * FROM runs WHERE run_id=?", (run_id,))
        return rows[0] if rows else None

    # -- results -------------------------------------------------------------------------------
    def record(self, run_id: str, record: ResultRecord) -> None:
        """Store (or replace) one task's result, durably, in its own transaction."""
        row = (run_id, record.task_key, record.level, record.origin, record.solution, record.solution_hash,
               record.status, int(record.correct),
               None if record.verdict is None else json.dumps(record.verdict, allow_nan=False),
               record.error, record.worker, record.attempts, record.eval_s, record.finished_at)
        self._db.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)

    def finished(self, run_id: str) -> dict[str, str | None]:
        """Tasks of ``run_id`` with a final result (a verdict, or a missing or unreadable solution):
        task key -> content hash of the solution that result is for."""
        return dict(self._db.query("SELECT task_key, solution_hash FROM results WHERE run_id=? AND status != ?",
                                   (run_id, HARNESS_ERROR)))

    def records(self, run_id: str) -> list[ResultRecord]:
        rows = self._db.query(
            "SELECT task_key, level, origin, solution, solution_hash, status, correct, verdict, error, worker, "
            "attempts, eval_s, finished_at FROM results WHERE run_id=? ORDER BY level, finished_at", (run_id,))
        return [_record(row) for row in rows]


def _record(row: sqlite3.Row | tuple) -> ResultRecord:
    key, level, origin, solution, solution_hash, status, correct, verdict, error, worker, attempts, eval_s, at = row
    return ResultRecord(key, level, origin, solution, solution_hash, status, bool(correct),
                        None if verdict is None else json.loads(verdict), error, worker, attempts, eval_s, at)
