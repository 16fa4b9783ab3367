"""The service's job queue on a real SQLite file: only a job's owner stores its answer, a new
instance takes over what the old one left, an idempotency key returns the first submission's jobs,
and a queue file of the first schema is upgraded in place."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from cuda_agent.environment import load_task
from cuda_agent.pool import EvalJob, JobResult, JobStatus, SolutionFiles
from cuda_agent.serve.queue import IdempotencyConflict, JobQueue
from cuda_agent.serve.state_lock import StateDirBusy, StateDirLock

from support import SMALL_RELU_TASK

pytest.importorskip("fastapi")


def job(job_id: str) -> EvalJob:
    return EvalJob(job_id, load_task(SMALL_RELU_TASK), SolutionFiles.from_mapping({"model_new.py": "x = 1\n"}))


def answer(job_id: str) -> JobResult:
    return JobResult(job_id, JobStatus.FAILED, None, "no worker", "cpu:0", 1, 0.0, 0.0)


def test_only_the_owner_stores_an_answer_and_a_new_instance_takes_over(tmp_path: Path) -> None:
    old = JobQueue(tmp_path / "jobs.sqlite", "old")
    old.add([job("a"), job("b")])
    assert old.finish(answer("a"), answer("a").to_json_dict())
    new = JobQueue(tmp_path / "jobs.sqlite", "new")
    taken = new.take_over()
    assert [j.job_id for j in taken.jobs] == ["b"] and taken.previous_owners == ["old"]
    assert not old.finish(answer("b"), {"late": True}), "an instance that lost the job still stored its answer"
    assert new.finish(answer("b"), answer("b").to_json_dict())
    assert not new.finish(answer("b"), {"twice": True})
    assert new.get("b").result["error"] == "no worker" and new.counts()["failed"] == 2


def test_an_idempotency_key_returns_the_first_submission(tmp_path: Path) -> None:
    queue = JobQueue(tmp_path / "jobs.sqlite", "me")
    assert queue.add([job("a"), job("b")], "key-1", "digest-1") is None
    assert queue.add([job("c"), job("d")], "key-1", "digest-1") == ["a", "b"]
    with pytest.raises(IdempotencyConflict, match="Idempotency-Key"):
        queue.add([job("e")], "key-1", "another request")
    assert queue.counts()["queued"] == 2


def test_a_queue_of_the_first_schema_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, job_id TEXT UNIQUE NOT NULL, "
                   "state TEXT NOT NULL, request TEXT NOT NULL, result TEXT, accepted_at REAL NOT NULL, "
                   "finished_at REAL)")
        db.execute("INSERT INTO jobs (job_id, state, request, accepted_at) VALUES ('x', 'queued', ?, 1.0)",
                   (json.dumps(job("x").to_json_dict()),))
    taken = JobQueue(path, "me").take_over()
    assert [j.job_id for j in taken.jobs] == ["x"] and taken.previous_owners == ["an older version"]


def test_the_state_folder_has_one_holder(tmp_path: Path) -> None:
    held = StateDirLock(tmp_path)
    with pytest.raises(StateDirBusy, match="in use by another cuda-agent serve"):
        StateDirLock(tmp_path)
    held.release()
    StateDirLock(tmp_path).release()
