"""Many episodes at once: asyncio tasks sharing one policy and one bounded evaluation queue,
each trajectory appended to a JSONL file as soon as its episode ends, and resume by skipping the
(task, sample) pairs already in that file.

    summary = asyncio.run(run_episodes(tasks, policy, AgentConfig(), EvalConfig(), Path("out/trajectories.jsonl")))
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cuda_agent.agent.base import Policy
from cuda_agent.agent.config import AgentConfig, AgentConfigError
from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.trajectory import Trajectory, append_trajectory, read_trajectories
from cuda_agent.environment import EvalConfig, Task

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunnerConfig:
    """How many episodes and evaluations run at once."""

    concurrency: int = 8
    """Episodes in flight at once (they share the policy; an endpoint or batch serves them)."""
    evaluation_slots: int = 1
    """Evaluations (protected commands and final scoring) running at once over all episodes: one
    per GPU on CUDA; on the CPU backend, timing needs the cores to itself, so keep it small."""
    samples_per_task: int = 1
    """Episodes per task (RL samples several)."""

    def __post_init__(self) -> None:
        for name in ("concurrency", "evaluation_slots", "samples_per_task"):
            if getattr(self, name) < 1:
                raise AgentConfigError(f"runner.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class RunSummary:
    """What a run did: the trajectories written now, the pairs skipped as already done, and the
    episodes that failed outside the agent's control (infrastructure; not written, so a rerun retries them)."""

    written: list[Trajectory] = field(default_factory=list)
    skipped: int = 0
    failures: list[tuple[str, int, str]] = field(default_factory=list)


def completed_pairs(out_path: Path) -> set[tuple[str, int]]:
    """``(task id, sample)`` of every trajectory already in ``out_path``."""
    if not out_path.exists():
        return set()
    return {(t.task_id, t.sample) for t in read_trajectories(out_path)}


async def run_episodes(tasks: list[Task], policy: Policy, agent_config: AgentConfig, eval_config: EvalConfig,
                       out_path: Path, runner_config: RunnerConfig = RunnerConfig(),
                       on_done: Callable[[Trajectory | None], None] | None = None) -> RunSummary:
    """Run ``samples_per_task`` episodes of every task, ``concurrency`` at once, appending each
    trajectory to ``out_path``; pairs already there are skipped (resume).

    Args:
        on_done: called after each episode with its trajectory (``None`` for a failed one), e.g.
            to advance a progress bar.
    """
    done = completed_pairs(out_path)
    jobs = [(task, sample) for task in tasks for sample in range(runner_config.samples_per_task)
            if (task.id, sample) not in done]
    summary = RunSummary(skipped=len(tasks) * runner_config.samples_per_task - len(jobs))
    queue = EvaluationQueue(eval_config, runner_config.evaluation_slots)
    slots = asyncio.Semaphore(runner_config.concurrency)

    async def one(task: Task, sample: int) -> None:
        async with slots:
            episode_id = f"{task.id}-s{sample}-{uuid.uuid4().hex[:6]}"
            try:
                trajectory = await run_episode(task, policy, agent_config, queue, episode_id, sample)
            except Exception as exc:  # an infrastructure failure ends this episode, not the run
                logger.exception("episode %s failed", episode_id)
                summary.failures.append((task.id, sample, f"{type(exc).__name__}: {exc}"))
                trajectory = None
            else:
                append_trajectory(out_path, trajectory)
                summary.written.append(trajectory)
            if on_done is not None:
                on_done(trajectory)

    try:
        await asyncio.gather(*(one(task, sample) for task, sample in jobs))
    finally:
        queue.close()
    return summary
