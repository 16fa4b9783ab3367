"""``train ppo``: multi-turn agentic PPO. Episodes run through the agent loop with the actor as
the ``hf`` policy; each episode's reward is the trusted evaluator's verdict on its final workdir;
GAE runs over the policy's tokens with tool output masked from both losses."""

from __future__ import annotations

import logging

from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.train.environments import make_environment
from cuda_agent.train.rewards import harness_failure
from cuda_agent.train.rollout import collect_episodes
from cuda_agent.train.sequences import trajectory_rows
from cuda_agent.train.stages.common import StageContext, StageError, StageResult
from cuda_agent.train.stages.rl import RLRun, Rollout, run_rl_stage

logger = logging.getLogger(__name__)


def episode_rollout(run: RLRun, step: int) -> Rollout:
    """``tasks_per_step x samples_per_task`` episodes, concurrently; their trajectories are kept
    in ``rollouts/step-<n>.jsonl``."""
    rollout, environment = run.section.rollout, run.environment
    jobs = [(environment.tasks[i], sample) for i in run.sampler.take(rollout.tasks_per_step)
            for sample in range(rollout.samples_per_task)]
    episodes = collect_episodes(environment, run.policy, jobs, rollout.concurrency, f"{run.stage}{step}")
    run.save_trajectories(step, episodes.trajectories)
    tokenizer = run.models.tokenizer
    rows = [row for index, t in enumerate(episodes.trajectories) for row in trajectory_rows(t, index, tokenizer)]
    rewards = episode_rewards(episodes.trajectories)
    turns = [t.turns for t in episodes.trajectories]
    metrics = {"rollout/seconds": episodes.seconds, "rollout/generated_tokens": float(episodes.generated_tokens),
               "rollout/tokens_per_s": episodes.generated_tokens / max(episodes.seconds, 1e-9),
               "rollout/failures": float(len(episodes.failures)), "rollout/rows": float(len(rows)),
               "rollout/verdict_wait_share": verdict_wait_share(episodes.trajectories),
               "episodes/turns_mean": sum(turns) / max(len(turns), 1), **run.policy.take_generation_metrics()}
    return Rollout(rows, lambda: rewards, metrics)


def episode_rewards(trajectories: list[Trajectory]) -> list[float | None]:
    """Each episode's reward, ``None`` (left out of the update) where the harness reached no
    verdict on it (:func:`~cuda_agent.train.rewards.harness_failure`)."""
    rewards: list[float | None] = []
    for trajectory in trajectories:
        failure = harness_failure(trajectory)
        if failure is not None:
            logger.warning("episode %s left out of training: %s", trajectory.episode_id, failure)
        rewards.append(None if failure else float(trajectory.reward))
    return rewards


def verdict_wait_share(trajectories: list[Trajectory]) -> float:
    """The share of the episodes' wall time spent waiting for the evaluator (queued or running:
    builds, verifications, profiles and the final scoring); the rest is generation and tools."""
    waiting = sum(e.get("wait_s", 0.0) + e.get("seconds", 0.0) for t in trajectories
                  for e in [*t.evaluations, *([t.final] if t.final else [])])
    wall = sum(t.timings.get("wall_s", 0.0) for t in trajectories)
    return waiting / wall if wall > 0 else 0.0


def run_ppo(context: StageContext) -> StageResult:
    """Agentic PPO from the previous stage's actor and critic (a fresh critic, with a warning, when
    the previous stage has none: the paper's "without value pre-training" ablation)."""
    config = context.config
    if context.previous is None and config.model.path is None:
        raise StageError("ppo needs a starting actor: --from a previous stage's folder, or model.path")
    actor = context.previous.actor if context.previous else config.model.path
    critic = context.previous.critic if context.previous else None
    if critic is None:
        logger.warning("ppo: no pre-trained critic in the input; starting a fresh one from %s",
                       config.model.critic_path or actor)
    environment = make_environment(config, config.ppo.rollout.evaluation_slots)
    try:
        return run_rl_stage(context, "ppo", config.ppo, actor, critic or config.model.critic_path or actor,
                            environment, len(environment.tasks), episode_rollout, train_actor=True)
    finally:
        environment.close()
