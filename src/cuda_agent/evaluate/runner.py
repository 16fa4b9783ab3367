"""One benchmark run: every task's solution through a pool, every result into the store.

Tasks that already have a result in the store are skipped, so a killed run continues where it
stopped. Tasks that need no evaluation (a task that does not load, a missing or unreadable
solution) get their result at once; the others go to the pool, and each result is stored the
moment it arrives.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cuda_agent.environment import EvalConfig, SolutionError, Status
from cuda_agent.evaluate.metrics import MISSING
from cuda_agent.evaluate.store import HARNESS_ERROR, ResultRecord, ResultsStore
from cuda_agent.evaluate.tasks import EvalTask
from cuda_agent.pool import EvalJob, EvalPool, JobInputError, JobResult, SolutionFiles

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunProgress:
    """How a call to :func:`evaluate_run` went."""

    total: int  # tasks in the run
    already_done: int  # had a result before this call (resumed)
    evaluated: int  # results reached by the pool in this call
    settled_without_pool: int  # missing solutions, unloadable tasks or solutions
    harness_errors: int  # tasks left without a verdict (a resumed run retries them)


def run_settings(tasks_path: Path, levels: tuple[int, ...], solutions_dir: Path, tasks: list[EvalTask],
                 config: EvalConfig) -> dict[str, Any]:
    """What must not change while a run is continued: the tasks (by content), where the solutions
    come from, and every evaluation setting except where files are kept."""
    evaluation = {k: v for k, v in config.to_dict().items() if k not in ("cache_dir", "scratch_dir", "sandbox")}
    return {"tasks": str(tasks_path.resolve()), "levels": list(levels), "solutions": str(solutions_dir.resolve()),
            "task_hashes": {t.key: t.task.code_hash if t.task else None for t in tasks}, "evaluation": evaluation}


def evaluate_run(store: ResultsStore, run_id: str, tasks: list[EvalTask], solutions: dict[str, Path | None],
                 pool: EvalPool, on_result: Callable[[ResultRecord], None] | None = None) -> RunProgress:
    """Evaluate every task of ``run_id`` that has no result yet; store each result as it arrives.

    Args:
        solutions: task key -> its solution path (None: missing).
        on_result: called with each new result (progress bars).
    """
    done = store.finished_keys(run_id)
    pending = [task for task in tasks if task.key not in done]
    counts = {"evaluated": 0, "settled": 0, "harness_errors": 0}

    def keep(record: ResultRecord) -> None:
        store.record(run_id, record)
        if on_result is not None:
            on_result(record)

    futures: dict[Future[JobResult], EvalTask] = {}
    for task in pending:
        path = solutions.get(task.key)
        job_or_record = _job_for(task, path)
        if isinstance(job_or_record, ResultRecord):
            keep(job_or_record)
            counts["settled"] += 1
        else:
            futures[pool.submit(job_or_record)] = task
    for future in as_completed(futures):
        task = futures[future]
        record = _record_of(task, solutions[task.key], future.result())
        keep(record)
        counts["evaluated"] += 1
        counts["harness_errors"] += record.status == HARNESS_ERROR
    return RunProgress(len(tasks), len(tasks) - len(pending), counts["evaluated"], counts["settled"],
                       counts["harness_errors"])


def _job_for(task: EvalTask, solution: Path | None) -> EvalJob | ResultRecord:
    """The job that evaluates ``task``, or its final result when there is nothing to evaluate."""
    if task.task is None:
        return _settled(task, solution, Status.TASK_ERROR.value, f"the task does not load: {task.error}")
    if solution is None:
        return _settled(task, None, MISSING, "no solution for this task")
    try:
        files = SolutionFiles.from_path(solution)
    except (SolutionError, JobInputError) as exc:
        return _settled(task, solution, Status.SOLUTION_ERROR.value, str(exc))
    return EvalJob(task.key, task.task, files)


def _settled(task: EvalTask, solution: Path | None, status: str, error: str) -> ResultRecord:
    return ResultRecord(task.key, task.level, task.origin, None if solution is None else str(solution), status,
                        False, None, error, None, 0, 0.0, time.time())


def _record_of(task: EvalTask, solution: Path | None, result: JobResult) -> ResultRecord:
    if result.verdict is None:
        logger.warning("task %s has no verdict: %s", task.key, result.error)
        return ResultRecord(task.key, task.level, task.origin, str(solution), HARNESS_ERROR, False, None, result.error,
                            result.worker or None, result.attempts, result.eval_s, time.time())
    verdict = result.verdict
    return ResultRecord(task.key, task.level, task.origin, str(solution), verdict.status.value, verdict.correct,
                        verdict.to_json_dict(), verdict.error, result.worker, result.attempts, result.eval_s,
                        time.time())
