"""The loop of the three PPO-shaped stages (warm-up, value pre-training, agentic PPO): each step
takes a rollout, scores it with the models while its rewards are evaluated, estimates GAE
advantages and updates; only where the rollout comes from and whether the actor learns differ.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.train.base import Environment
from cuda_agent.train.checkpoint import seed_everything
from cuda_agent.train.config import PPOConfig, ValueConfig
from cuda_agent.train.metrics import read_metrics
from cuda_agent.train.models import ModelSet
from cuda_agent.train.ppo import PPOLearner
from cuda_agent.train.rollout import TrainingPolicy, training_policy
from cuda_agent.train.sequences import TokenRow
from cuda_agent.train.stages.common import (
    ACTOR_DIR, ADAPTER_DIR, CRITIC_DIR, StageContext, StageRecord, StageResult, stage_settings,
)
from cuda_agent.train.trainer import PeakMemory, TaskSampler, TrainingLoop

ROLLOUTS_DIR = "rollouts"
REWARD_LEVELS = (-1, 1, 2, 3)


@dataclass
class Rollout:
    """One step's samples: token rows, and a call that waits for their rewards."""

    rows: list[TokenRow]
    rewards: Callable[[], list[float | None]]
    """Per episode (``TokenRow.episode``); ``None`` leaves an episode out (no verdict reached).
    Called after the rows are scored, so evaluations overlap the forward passes."""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RLRun:
    """What a rollout function may use."""

    stage: str
    section: PPOConfig | ValueConfig
    models: ModelSet
    policy: TrainingPolicy
    sampler: TaskSampler
    environment: Environment | None
    out_dir: Path

    def save_trajectories(self, step: int, trajectories: list[Trajectory]) -> None:
        """The step's episodes, in ``rollouts/step-<n>.jsonl`` (rewritten if the step runs again)."""
        folder = self.out_dir / ROLLOUTS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(t.to_dict(), allow_nan=False, default=str) + "\n" for t in trajectories)
        (folder / f"step-{step:06d}.jsonl").write_text(lines)


def reward_metrics(rewards: list[float | None]) -> dict[str, float]:
    scored = [r for r in rewards if r is not None]
    metrics: dict[str, float] = {"reward/mean": statistics.fmean(scored) if scored else float("nan"),
                                 "reward/std": statistics.pstdev(scored) if scored else float("nan"),
                                 "episodes": float(len(rewards)), "episodes/unscored": float(len(rewards) - len(scored))}
    for level in REWARD_LEVELS:
        metrics[f"reward/count_{level}"] = float(sum(1 for r in scored if r == level))
    return metrics


def train_step(run: RLRun, learner: PPOLearner, rollout: Callable[[RLRun, int], Rollout], number: int) -> dict[str, float]:
    """One step: rollout, score (while the rewards are evaluated), GAE, update; its metrics."""
    memory = PeakMemory(run.models.device)
    step_started = time.monotonic()
    sample = rollout(run, number)
    started = time.monotonic()
    scored = learner.score(sample.rows)
    score_s = time.monotonic() - started
    rewards = sample.rewards()
    blocked_s = time.monotonic() - started - score_s
    batch = learner.estimate(scored, rewards)
    metrics = {**sample.metrics, **reward_metrics(rewards), "score/seconds": score_s,
               "score/tokens_per_s": scored.tokens / max(score_s, 1e-9), "step/verdict_blocked_seconds": blocked_s}
    gap = scored.outcome_value_gap(rewards)
    if gap is not None:
        metrics["critic/outcome_value_gap"] = gap
    metrics["episodes/harness_errors"] = metrics["episodes/unscored"] + sample.metrics.get("rollout/failures", 0.0)
    if batch.rows:
        epochs = learner.algorithm.epochs
        started = time.monotonic()
        metrics.update(learner.update(batch))
        update_s = time.monotonic() - started
        metrics.update({"update/seconds": update_s, "update/tokens": float(batch.tokens * epochs),
                        "update/tokens_per_s": batch.tokens * epochs / max(update_s, 1e-9),
                        "critic/explained_variance": batch.explained_variance()})
    metrics["step/verdict_blocked_share"] = blocked_s / max(time.monotonic() - step_started, 1e-9)
    metrics.update(memory.metrics())
    return metrics


def run_rl_stage(context: StageContext, stage: str, section: PPOConfig | ValueConfig, actor: Path,
                 critic_from: Path, environment: Environment | None, task_count: int,
                 rollout: Callable[[RLRun, int], Rollout], train_actor: bool) -> StageResult:
    """Run (or resume) a PPO-shaped stage and hand on its models.

    Args:
        actor: the actor to start from; critic_from: the critic folder, or a model folder to build one from.
        environment: where episodes run (None when the rollouts come from files).
        task_count: how many items the rollout function samples from (tasks, or recorded episodes).
        rollout: makes one step's :class:`Rollout`.
        train_actor: False freezes the actor (value pre-training) and hands on ``actor`` unchanged.
    """
    record = StageRecord(context, stage, stage_settings(context.config, stage))
    if record.completed:
        return StageResult(stage, context.out_dir, True, section.steps, section.steps,
                           summary=record.record["summary"], already_done=True)
    record.write(status="running")
    seed_everything(section.seed)
    algorithm = section.algorithm
    models = ModelSet(context.config.model, actor, critic_from, reference=train_actor and algorithm.kl_coef > 0,
                      train_actor=train_actor)
    learner = PPOLearner(models, algorithm, section.actor_optim if train_actor else None, section.critic_optim,
                         section.steps, section.rollout.temperature)
    run = RLRun(stage, section, models, training_policy(models, section.rollout), TaskSampler(task_count, section.seed),
                environment, context.out_dir)

    on_step = (lambda n, m: context.on_step(stage, n, section.steps, m)) if context.on_step else None
    loop = TrainingLoop(context.out_dir, section.steps, section.checkpoint, section.tensorboard,
                        {**learner.state(), "tasks": run.sampler}, on_step)
    outcome = loop.run(lambda number: train_step(run, learner, rollout, number), context.until_step, context.deadline)
    if not outcome.completed:
        record.write(status="stopped")
        return StageResult(stage, context.out_dir, False, outcome.step, section.steps, outcome.stopped)
    models.save_critic(context.out_dir / CRITIC_DIR)
    if train_actor:
        models.save_actor(context.out_dir / ACTOR_DIR, context.out_dir / ADAPTER_DIR)
    history = read_metrics(context.out_dir)
    summary = {"steps": section.steps, "resumed_from": outcome.resumed_from, "last_step": history[-1] if history else {}}
    record.finish(context.out_dir / ACTOR_DIR if train_actor else actor, context.out_dir / CRITIC_DIR, summary)
    return StageResult(stage, context.out_dir, True, section.steps, section.steps, summary=summary)
