"""The service's core, free of any web framework: accept jobs (persist, then queue them on the
pool), store each answer, report job states and metrics, and resume the queue after a restart."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from cuda_agent.environment.task import Task, TaskLoadError, check_source
from cuda_agent.pool import EvalJob, EvalPool, JobInputError, JobResult, PoolClosed, SolutionFiles
from cuda_agent.serve.queue import JobQueue, JobState, StoredJob
from cuda_agent.unicode_text import is_unicode

logger = logging.getLogger(__name__)

RUNNING = "running"
"""State reported for a queued job that a worker is evaluating right now."""


class BadJobRequest(ValueError):
    """A job request is malformed; ``field`` names the offending field (``jobs[2].task_code``)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class JobView:
    """What a client sees of a job."""

    job_id: str
    state: str  # queued | running | done | failed
    result: dict[str, Any] | None

    def to_json_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": self.state, "result": self.result}


def job_from_request(job_id: str, task_code: Any, task_id: Any, solution_files: Any, solution_code: Any,
                     field_prefix: str = "") -> EvalJob:
    """Validate one request's fields into a job.

    Raises:
        BadJobRequest: naming the field that is wrong and what was expected.
    """
    if (solution_files is None) == (solution_code is None):
        raise BadJobRequest(f"{field_prefix}solution_files", "give exactly one of solution_files (a mapping of "
                            "relative path to source) or solution_code (one .py defining ModelNew)")
    name = task_id or "task"
    if not is_unicode(name):
        raise BadJobRequest(f"{field_prefix}task_id", "not valid Unicode text (it holds a lone surrogate)")
    try:
        check_source(task_code, f"{field_prefix}task_code")
    except TaskLoadError as exc:
        raise BadJobRequest(f"{field_prefix}task_code", str(exc).split(": ", 1)[-1]) from None
    files = solution_files if solution_files is not None else {"model_new.py": solution_code}
    try:
        solution = SolutionFiles.from_mapping(files)
    except JobInputError as exc:
        raise BadJobRequest(f"{field_prefix}solution_files", str(exc)) from None
    return EvalJob(job_id, Task(id=name, code=task_code, origin=f"service:{job_id}"), solution)


class EvalService:
    """Jobs in, verdicts out, nothing lost.

    Args:
        queue: the persistent job queue.
        pool: where jobs are evaluated (its workers belong to the service from now on).
        redact: rewrites an answer's JSON before it is stored (this host's paths out).
    """

    def __init__(self, queue: JobQueue, pool: EvalPool,
                 redact: Callable[[dict[str, Any]], dict[str, Any]] = lambda answer: answer) -> None:
        self.queue = queue
        self.pool = pool
        self._redact = redact
        self.started_at = time.time()
        self._closing = False
        self._lock = threading.Lock()
        self._pending: dict[str, Future[JobResult]] = {}

    def resume(self) -> int:
        """Take over and queue again every job accepted before a restart and not answered, and log
        what was resumed; returns how many."""
        taken = self.queue.take_over()
        for job in taken.jobs:
            self._dispatch(job)
        counts = self.queue.counts()
        if taken.jobs:
            age = time.time() - taken.oldest_accepted_at
            logger.info("startup: resumed %d unanswered jobs from %s (left by %s; oldest accepted %.0f s ago); "
                        "%d answered before", len(taken.jobs), self.queue.path, ", ".join(taken.previous_owners),
                        age, counts[JobState.DONE.value] + counts[JobState.FAILED.value])
        else:
            logger.info("startup: no unanswered jobs in %s; %d answered before", self.queue.path,
                        counts[JobState.DONE.value] + counts[JobState.FAILED.value])
        return len(taken.jobs)

    def accept(self, jobs: list[EvalJob], idempotency_key: str | None = None, digest: str = "") -> list[str]:
        """Persist ``jobs`` (all or none), then queue them; returns their ids, or those of the first
        submission with ``idempotency_key`` (a retry: nothing new is queued).

        Raises:
            PoolClosed: the service is shutting down.
            IdempotencyConflict: the key was first used for another request.
        """
        if self._closing:
            raise PoolClosed("the service is shutting down")
        earlier = self.queue.add(jobs, idempotency_key, digest)
        if earlier is not None:
            return earlier
        for job in jobs:
            self._dispatch(job)
        return [job.job_id for job in jobs]

    def _dispatch(self, job: EvalJob) -> None:
        future = self.pool.submit(job)
        with self._lock:
            self._pending[job.job_id] = future
        future.add_done_callback(lambda done, job_id=job.job_id: self._store(job_id, done))

    def _store(self, job_id: str, future: Future[JobResult]) -> None:
        result = future.result()
        if not (self._closing and not result.ok):  # a job the closing pool did not run stays queued
            if not self.queue.finish(result, self._redact(result.to_json_dict())):
                logger.warning("job %s was answered already or is owned by another instance: answer dropped", job_id)
        with self._lock:
            self._pending.pop(job_id, None)

    def pending_future(self, job_id: str) -> Future[JobResult] | None:
        with self._lock:
            return self._pending.get(job_id)

    def view(self, job_id: str) -> JobView | None:
        stored: StoredJob | None = self.queue.get(job_id)
        if stored is None:
            return None
        state = stored.state.value
        if stored.state is JobState.QUEUED and any(lane.current_job == job_id for lane in self.pool.stats().lanes):
            state = RUNNING
        return JobView(job_id, state, stored.result)

    def metrics(self) -> dict[str, Any]:
        now = time.time()
        stats = self.pool.stats()
        hour_ago = max(self.started_at, now - 3600)
        answered_last_hour = self.queue.answered_since(hour_ago)
        window_h = max(now - hour_ago, 1e-9) / 3600
        lanes = max(1, sum(lane.alive for lane in stats.lanes))
        return {"jobs": self.queue.counts(), "uptime_s": now - self.started_at,
                "evaluations_per_hour": answered_last_hour / window_h,
                "evaluations_per_worker_hour": answered_last_hour / window_h / lanes,
                "pool": stats.to_json_dict()}

    def close(self) -> None:
        """Stop the pool; jobs it did not finish stay queued for the next start."""
        self._closing = True
        self.pool.close(cancel_pending=True)
        self.queue.close()
