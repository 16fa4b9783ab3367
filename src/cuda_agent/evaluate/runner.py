"""One benchmark run: every task's solution through a pool, every result into the store.

Tasks that already have a result in the store for the same solution are skipped, so a killed run
continues where it stopped. Tasks that need no evaluation (a task that does not load, a missing or
unreadable solution) get their result at once; the others go to the pool, and each result is
stored the moment it arrives.
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
class TaskPlan:
    """How one task gets its result: a job for the pool, or a result known without evaluating
    (the task does not load, the solution is missing or unreadable)."""

    task: EvalTask
    solution: Path | None
    solution_hash: str | None  # content hash of the solution's files (None: no readable solution)
    job: EvalJob | None
    settled: ResultRecord | None


@dataclass(frozen=True)
class RunProgress:
    """How a call to :func:`evaluate_plans` went."""

    evaluated: int  # results reached by the pool
    settled_without_pool: int  # missing solutions, unloadable tasks or solutions
    harness_errors: int  # tasks left without a verdict (a resumed run retries them)


def run_settings(tasks_path: Path, levels: tuple[int, ...], solutions_dir: Path, tasks: list[EvalTask],
                 config: EvalConfig) -> dict[str, Any]:
    """What must not change while a run is continued: the tasks (by content), where the solutions
    come from, and every evaluation setting except where files are kept."""
    evaluation = {k: v for k, v in config.to_dict().items() if k not in ("cache_dir", "scratch_dir", "sandbox")}
    return {"tasks": str(tasks_path.resolve()), "levels": list(levels), "solutions": str(solutions_dir.resolve()),
            "task_hashes": {t.key: t.task.code_hash if t.task else None for t in tasks}, "evaluation": evaluation}


def plan_run(tasks: list[EvalTask], solutions: dict[str, Path | None]) -> list[TaskPlan]:
    """One plan per task; ``solutions`` maps a task key to its solution path (None: missing)."""
    return [_plan(task, solutions.get(task.key)) for task in tasks]


def still_to_do(store: ResultsStore, run_id: str, plans: list[TaskPlan]) -> list[TaskPlan]:
    """Plans whose task has no final result in the store for this very solution (resuming skips the
    rest; a solution changed since its result was stored is evaluated again)."""
    finished = store.finished(run_id)
    return [p for p in plans if p.task.key not in finished or finished[p.task.key] != p.solution_hash]


def evaluate_plans(store: ResultsStore, run_id: str, plans: list[TaskPlan], pool: EvalPool,
                   on_result: Callable[[ResultRecord], None] | None = None) -> RunProgress:
    """Give every plan its result, storing each one the moment it is known.

    Args:
        on_result: called with each new result (progress bars).
    """
    counts = {"evaluated": 0, "settled": 0, "harness_errors": 0}

    def keep(record: ResultRecord) -> None:
        store.record(run_id, record)
        if on_result is not None:
            on_result(record)

    futures: dict[Future[JobResult], TaskPlan] = {}
    for plan in plans:
        if plan.settled is not None:
            keep(plan.settled)
            counts["settled"] += 1
        else:
            futures[pool.submit(plan.job)] = plan
    for future in as_completed(futures):
        record = _record_of(futures[future], future.result())
        keep(record)
        counts["evaluated"] += 1
        counts["harness_errors"] += record.status == HARNESS_ERROR
    return RunProgress(counts["evaluated"], counts["settled"], counts["harness_errors"])


def _plan(task: EvalTask, solution: Path | None) -> TaskPlan:
    if task.task is None:
        return TaskPlan(task, solution, None, None,
                        _settled(task, solution, Status.TASK_ERROR.value, f"the task does not load: {task.error}"))
    if solution is None:
        return TaskPlan(task, None, None, None, _settled(task, None, MISSING, "no solution for this task"))
    try:
        files = SolutionFiles.from_path(solution)
    except (SolutionError, JobInputError) as exc:
        return TaskPlan(task, solution, None, None, _settled(task, solution, Status.SOLUTION_ERROR.value, str(exc)))
    return TaskPlan(task, solution, files.content_hash(), EvalJob(task.key, task.task, files), None)


def _settled(task: EvalTask, solution: Path | None, status: str, error: str) -> ResultRecord:
    return ResultRecord(task.key, task.level, task.origin, None if solution is None else str(solution), None, status,
                        False, None, error, None, 0, 0.0, time.time())


def _record_of(plan: TaskPlan, result: JobResult) -> ResultRecord:
    task, solution = plan.task, str(plan.solution)
    if result.verdict is None:
        logger.warning("task %s has no verdict: %s", task.key, result.error)
        return ResultRecord(task.key, task.level, task.origin, solution, plan.solution_hash, HARNESS_ERROR, False,
                            None, result.error, result.worker or None, result.attempts, result.eval_s, time.time())
    verdict = result.verdict
    return ResultRecord(task.key, task.level, task.origin, solution, plan.solution_hash, verdict.status.value,
                        verdict.correct, verdict.to_json_dict(), verdict.error, result.worker, result.attempts,
                        result.eval_s, time.time())
