"""The service's persistent job queue: every accepted job is in SQLite before the client hears
"accepted", and stays ``queued`` until its answer is stored, so a restart (or a crash) loses no job:
the jobs still queued are evaluated after the service starts again."""

from __future__ import annotations

import enum
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.sqlite_wal import Database
from cuda_agent.pool.jobs import EvalJob, JobResult

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT UNIQUE NOT NULL,
    state TEXT NOT NULL,
    request TEXT NOT NULL,
    result TEXT,
    accepted_at REAL NOT NULL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs (state, seq);
"""


class JobState(str, enum.Enum):
    QUEUED = "queued"  # accepted, not answered yet (it may be running)
    DONE = "done"  # answered with a verdict
    FAILED = "failed"  # answered without a verdict (the harness failed on every attempt)


@dataclass(frozen=True)
class StoredJob:
    job_id: str
    state: JobState
    result: dict[str, Any] | None  # ``JobResult.to_json_dict()`` once answered
    accepted_at: float
    finished_at: float | None


class JobQueue:
    """Thread-safe access to ``jobs.sqlite``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))  # jobs hold users' sources: owner only
        os.chmod(path, 0o600)  # SQLite gives its -wal and -shm files the same mode
        self._db = Database(path, _SCHEMA)

    def add(self, jobs: list[EvalJob]) -> None:
        """Persist ``jobs`` as queued, all or none (one transaction)."""
        now = time.time()
        rows = [(job.job_id, JobState.QUEUED.value, json.dumps(job.to_json_dict()), now) for job in jobs]
        with self._db.transaction() as conn:
            conn.executemany("INSERT INTO jobs (job_id, state, request, accepted_at) VALUES (?, ?, ?, ?)", rows)

    def finish(self, result: JobResult, answer: dict[str, Any]) -> None:
        """Store ``answer`` (``result``'s JSON form as clients see it) for a job still queued."""
        state = JobState.DONE if result.ok else JobState.FAILED
        self._db.execute("UPDATE jobs SET state=?, result=?, finished_at=? WHERE job_id=? AND state=?",
                         (state.value, json.dumps(answer, allow_nan=False), time.time(), result.job_id,
                          JobState.QUEUED.value))

    def get(self, job_id: str) -> StoredJob | None:
        rows = self._db.query("SELECT job_id, state, result, accepted_at, finished_at FROM jobs WHERE job_id=?",
                              (job_id,))
        if not rows:
            return None
        row = rows[0]
        return StoredJob(row[0], JobState(row[1]), None if row[2] is None else json.loads(row[2]), row[3], row[4])

    def queued(self) -> list[EvalJob]:
        """Jobs accepted but not answered, in the order they were accepted."""
        rows = self._db.query("SELECT request FROM jobs WHERE state=? ORDER BY seq", (JobState.QUEUED.value,))
        return [EvalJob.from_json_dict(json.loads(row[0])) for row in rows]

    def counts(self) -> dict[str, int]:
        rows = self._db.query("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {state.value: 0 for state in JobState} | dict(rows)

    def answered_since(self, since: float) -> int:
        return self._db.query("SELECT COUNT(*) FROM jobs WHERE finished_at >= ?", (since,))[0][0]

    def close(self) -> None:
        """Idempotent."""
        self._db.close()
