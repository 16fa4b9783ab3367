"""Rewards from the trusted evaluator: warm-up responses scored through an evaluation pool.

A warm-up response is one complete solution file. :func:`extract_solution` takes it out of the
reply (the last fenced Python block that defines ``ModelNew``); :class:`PoolScorer` submits every
response of a batch to an :class:`~cuda_agent.pool.EvalPool` at once, so compiles run in the
pool's CPU threads and evaluations on its GPU lanes while the trainer computes log-probabilities
and values. A reply without a solution is -1 at once, with nothing evaluated. Multi-turn rewards
need no scorer here: the agent loop's final scoring of the workdir is the trajectory's reward.
"""

from __future__ import annotations

import itertools
import re
from concurrent.futures import Future
from pathlib import Path

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.environment import EvalConfig, Status, Task, Verdict
from cuda_agent.pool import EvalJob, EvalPool, JobResult, SolutionFiles
from cuda_agent.train.base import ResponseScore, resolved

SOLUTION_FILE = "model_new.py"
_FENCE = re.compile(r"```[ \t]*(?:python|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_solution(text: str) -> str | None:
    """The solution source in a response: the last fenced code block defining ``class ModelNew``,
    else the whole text if it defines it, else ``None``."""
    blocks = [block for block in _FENCE.findall(text) if "class ModelNew" in block]
    if blocks:
        return blocks[-1].strip() + "\n"
    return text.strip() + "\n" if "class ModelNew" in text else None


HARNESS_STATUSES = (Status.TASK_ERROR.value,)
"""Verdict statuses that say nothing about the candidate (the reference itself failed)."""


def score_from_result(result: JobResult) -> ResponseScore:
    """The reward of a finished pool job (``None`` when the harness reached no verdict or the
    verdict is about the harness, not the candidate)."""
    if not result.ok or result.verdict is None:
        return ResponseScore(None, f"no verdict: {result.error}")
    verdict = result.verdict
    if verdict.status.value in HARNESS_STATUSES:
        return ResponseScore(None, f"harness: {verdict.status.value}: {verdict.error or ''}".strip())
    return ResponseScore(float(verdict.reward), verdict.status.value)


def harness_failure(trajectory: Trajectory) -> str | None:
    """Why an episode's reward is not the policy's doing (its final scoring reached no verdict, or
    a verdict about the harness, e.g. the reference failed), or ``None`` for a real reward. Both
    trainers leave such episodes out of training instead of punishing the policy for them."""
    final = trajectory.final
    if final is None or final.get("reward") is None:
        return "no verdict on the final workdir"
    status = (final.get("verdict") or {}).get("status")
    if status in HARNESS_STATUSES:
        return f"final verdict {status}"
    return None


class PoolScorer:
    """Scores solution texts on an evaluation pool, many in flight at once."""

    def __init__(self, pool: EvalPool) -> None:
        self.pool = pool
        self._numbers = itertools.count()

    def submit(self, task: Task, response: str) -> Future[ResponseScore]:
        """Start scoring ``response`` as a solution of ``task``."""
        source = extract_solution(response)
        if source is None:
            return resolved(ResponseScore(-1.0, "no solution: the response defines no class ModelNew"))
        job = EvalJob(f"warmup-{next(self._numbers)}-{task.id}", task, SolutionFiles.from_mapping({SOLUTION_FILE: source}))
        scored: Future[ResponseScore] = Future()
        self.pool.submit(job).add_done_callback(lambda done: scored.set_result(score_from_result(done.result())))
        return scored


class HarnessError(RuntimeError):
    """A pool could not reach a verdict (its workers died on every attempt, a service failed)."""


def pool_evaluator(pool: EvalPool):
    """An :data:`~cuda_agent.agent.evaluation.Evaluate` for the agent's evaluation queue that
    sends each snapshot to ``pool`` (a GPU pool, a Ray cluster or a ``cuda-agent serve``). The
    pool's own settings apply; ``profile=False`` evaluations are profiled too (a pool always
    runs the full evaluation).

    Raises (from the returned callable):
        HarnessError: the pool answered without a verdict.
    """
    numbers = itertools.count()

    def evaluate(task: Task, path: Path, config: EvalConfig, profile: bool) -> Verdict:
        job = EvalJob(f"episode-{next(numbers)}-{task.id}", task, SolutionFiles.from_path(path))
        result = pool.submit(job).result()
        if not result.ok or result.verdict is None:
            raise HarnessError(f"no verdict for {task.id}: {result.error}")
        return result.verdict

    return evaluate
