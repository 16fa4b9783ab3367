"""The service's persistent job queue: every accepted job is in SQLite before the client hears
"accepted", and stays ``queued`` until its answer is stored, so a restart (or a crash) loses no job:
the jobs still queued are evaluated after the service starts again.

Each job has an owner, the service instance that dispatched it; only the owner may store its
answer, and a new instance takes jobs over only while it holds the state folder's lock
(``serve.state_lock``), i.e. once their previous owner is gone. A submission may carry an
idempotency key: a retried submission with the same key gets the jobs of the first, not new ones."""

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
CREATE TABLE IF NOT EXISTS submissions (
    idempotency_key TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    job_ids TEXT NOT NULL,
    created_at REAL NOT NULL
);
"""
_ADDED_COLUMNS = {"owner": "TEXT"}
"""Columns newer than the first schema, added to an older ``jobs.sqlite`` when it is opened."""


class IdempotencyConflict(ValueError):
    """An idempotency key came back with a different request than the one it was first used for."""


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


@dataclass(frozen=True)
class TakenOver:
    """Jobs a starting instance took over from the instances before it."""

    jobs: list[EvalJob]
    previous_owners: list[str]
    oldest_accepted_at: float | None


class JobQueue:
    """Thread-safe access to ``jobs.sqlite`` for the service instance ``owner``."""

    def __init__(self, path: Path, owner: str) -> None:
        self.path = path
        self.owner = owner
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))  # jobs hold users' sources: owner only
        os.chmod(path, 0o600)  # SQLite gives its -wal and -shm files the same mode
        self._db = Database(path, _SCHEMA)
        present = {row[1] for row in self._db.query("PRAGMA table_info(jobs)")}
        for column, kind in _ADDED_COLUMNS.items():
            if column not in present:
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")

    def add(self, jobs: list[EvalJob], idempotency_key: str | None = None, digest: str = "") -> list[str] | None:
        """Persist ``jobs`` as queued and owned by this instance, all or none (one transaction).

        With ``idempotency_key``: if that key was used before, nothing is added and the job ids of
        that first submission are returned (None: ``jobs`` were added).

        Raises:
            IdempotencyConflict: the key was first used for a request of another ``digest``.
        """
        now = time.time()
        rows = [(job.job_id, JobState.QUEUED.value, json.dumps(job.to_json_dict()), now, self.owner) for job in jobs]
        with self._db.transaction() as conn:
            if idempotency_key is not None:
                earlier = conn.execute("SELECT digest, job_ids FROM submissions WHERE idempotency_key=?",
                                       (idempotency_key,)).fetchone()
                if earlier is not None:
                    if earlier[0] != digest:
                        raise IdempotencyConflict("Idempotency-Key: already used for a different request")
                    return json.loads(earlier[1])
                conn.execute("INSERT INTO submissions VALUES (?, ?, ?, ?)",
                             (idempotency_key, digest, json.dumps([job.job_id for job in jobs]), now))
            conn.executemany("INSERT INTO jobs (job_id, state, request, accepted_at, owner) VALUES (?, ?, ?, ?, ?)",
                             rows)
        return None

    def take_over(self) -> TakenOver:
        """Make this instance the owner of every job not answered yet (call only while holding the
        state folder's lock: their previous owners are gone)."""
        with self._db.transaction() as conn:
            rows = conn.execute("SELECT request, owner, accepted_at FROM jobs WHERE state=? ORDER BY seq",
                                (JobState.QUEUED.value,)).fetchall()
            conn.execute("UPDATE jobs SET owner=? WHERE state=?", (self.owner, JobState.QUEUED.value))
        return TakenOver([EvalJob.from_json_dict(json.loads(row[0])) for row in rows],
                         sorted({row[1] or "an older version" for row in rows if row[1] != self.owner}),
                         min((row[2] for row in rows), default=None))

    def finish(self, result: JobResult, answer: dict[str, Any]) -> bool:
        """Store ``answer`` (``result``'s JSON form as clients see it) for a job still queued and
        owned by this instance; False (nothing stored) otherwise."""
        state = JobState.DONE if result.ok else JobState.FAILED
        with self._db.transaction() as conn:
            cursor = conn.execute("UPDATE jobs SET state=?, result=?, finished_at=? WHERE job_id=? AND state=? "
                                  "AND owner=?", (state.value, json.dumps(answer, allow_nan=False), time.time(),
                                                  result.job_id, JobState.QUEUED.value, self.owner))
            return cursor.rowcount == 1

    def get(self, job_id: str) -> StoredJob | None:
        rows = self._db.query("SELECT job_id, state, result, accepted_at, finished_at FROM jobs WHERE job_id=?",
                              (job_id,))
        if not rows:
            return None
        row = rows[0]
        return StoredJob(row[0], JobState(row[1]), None if row[2] is None else json.loads(row[2]), row[3], row[4])

    def counts(self) -> dict[str, int]:
        rows = self._db.query("SELECT state, COUNT(*) FROM jobs GROUP BY state")
        return {state.value: 0 for state in JobState} | dict(rows)

    def answered_since(self, since: float) -> int:
        return self._db.query("SELECT COUNT(*) FROM jobs WHERE finished_at >= ?", (since,))[0][0]

    def close(self) -> None:
        """Idempotent."""
        self._db.close()
