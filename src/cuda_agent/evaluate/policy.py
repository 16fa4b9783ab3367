"""Evaluating a policy: the agent writes one solution per task into a folder, which is then
evaluated like any folder of solutions.

Splitting the two keeps the benchmark numbers independent of how solutions were produced (the
trusted evaluator scores the agent's final workdir once more), and makes a policy
run resumable in both halves: tasks that already have a solution in the folder are not given to
the agent again, and the evaluation continues through the results store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

from cuda_agent.agent import AgentConfig, EvaluationQueue, PolicySpec, make_policy
from cuda_agent.agent.optimize import optimize
from cuda_agent.environment import EvalConfig
from cuda_agent.evaluate.tasks import EvalTask

logger = logging.getLogger(__name__)

DEFAULT_TURNS = 200
"""Agent turns per task in evaluation (the paper: training uses 150, evaluation 200)."""


def tasks_without_solution(tasks: list[EvalTask], solutions_dir: Path) -> list[EvalTask]:
    """Loaded tasks with neither ``<key>.py`` nor ``<key>/`` in ``solutions_dir`` yet."""
    return [t for t in tasks if t.task is not None
            and not (solutions_dir / f"{t.key}.py").is_file() and not (solutions_dir / t.key).is_dir()]


def run_agent(tasks: list[EvalTask], spec: PolicySpec, agent_config: AgentConfig, solutions_dir: Path,
              eval_config: EvalConfig, concurrency: int = 8, solution_rule: str = "final") -> list[tuple[str, str]]:
    """Have the agent solve ``tasks`` with the policy ``spec``, ``concurrency`` episodes at once
    sharing one evaluation queue, writing the solution ``solution_rule`` picks from each episode
    (``agent.optimize.SOLUTION_RULES``: ``final`` by default, as training rewards an episode; or
    ``best``), with its report and trajectory, to ``solutions_dir/<task key>/``.

    A folder appears only once its episode is complete (written aside, then renamed), so a killed
    run leaves no half-written solution and a rerun gives the unsolved tasks to the agent again.

    Returns:
        ``(task key, error)`` for every episode that failed outside the agent's control (those
        tasks stay without a solution and count as failed).
    """
    return asyncio.run(_solve_all(tasks, spec, agent_config, solutions_dir, eval_config, concurrency, solution_rule))


async def _solve_all(tasks: list[EvalTask], spec: PolicySpec, agent_config: AgentConfig, solutions_dir: Path,
                     eval_config: EvalConfig, concurrency: int, solution_rule: str) -> list[tuple[str, str]]:
    solutions_dir.mkdir(parents=True, exist_ok=True)
    policy = make_policy(spec)
    queue = EvaluationQueue(eval_config, 1)
    slots = asyncio.Semaphore(concurrency)
    failures: list[tuple[str, str]] = []

    async def solve(task: EvalTask) -> None:
        partial = solutions_dir / f".{task.key}.partial"
        async with slots:
            shutil.rmtree(partial, ignore_errors=True)
            try:
                await optimize(task.task, policy, agent_config, eval_config, partial, queue=queue,
                               solution_rule=solution_rule)
            except Exception as exc:  # an infrastructure failure costs this task, not the run
                logger.exception("agent episode for %s failed", task.key)
                failures.append((task.key, f"{type(exc).__name__}: {exc}"))
                shutil.rmtree(partial, ignore_errors=True)
                return
            os.replace(partial, solutions_dir / task.key)

    try:
        await asyncio.gather(*(solve(task) for task in tasks))
    finally:
        queue.close()
        await policy.aclose()
    return failures
