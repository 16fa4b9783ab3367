"""``train value``: value pre-training. The actor is frozen; each step the critic regresses the
GAE returns (gamma, lambda from ``value.algorithm``) of a batch of the actor's episodes, sampled
fresh through the environment or, with ``value.trajectories``, read from recorded files."""

from __future__ import annotations

from typing import Callable

from cuda_agent.agent.trajectory import Trajectory, read_trajectories
from cuda_agent.train.environments import make_environment
from cuda_agent.train.sequences import trajectory_rows
from cuda_agent.train.stages.common import StageContext, StageError, StageResult
from cuda_agent.train.stages.ppo import episode_rewards, episode_rollout
from cuda_agent.train.stages.rl import RLRun, Rollout, run_rl_stage


def recorded_rollout(trajectories: list[Trajectory]) -> Callable[[RLRun, int], Rollout]:
    """Rollouts that draw ``tasks_per_step x samples_per_task`` recorded episodes per step."""

    def rollout(run: RLRun, step: int) -> Rollout:
        chosen = [trajectories[i] for i in run.sampler.take(run.section.rollout.episodes_per_step)]
        rows = [row for index, t in enumerate(chosen) for row in trajectory_rows(t, index, run.models.tokenizer)]
        rewards = episode_rewards(chosen)
        return Rollout(rows, lambda: rewards, {"rollout/rows": float(len(rows))})

    return rollout


def run_value(context: StageContext) -> StageResult:
    """Pre-train a critic for the previous stage's actor; hands on that actor and ``critic/``."""
    config, section = context.config, context.config.value
    actor = context.previous.actor if context.previous else config.model.path
    if actor is None:
        raise StageError("value needs the actor whose episodes it learns from: --from the rft folder, or model.path")
    critic_from = config.model.critic_path or actor
    if section.trajectories:
        recorded = [t for path in section.trajectories for t in read_trajectories(path)]
        if not recorded:
            raise StageError(f"value.trajectories: no episodes in {[str(p) for p in section.trajectories]}")
        return run_rl_stage(context, "value", section, actor, critic_from, None, len(recorded),
                            recorded_rollout(recorded), train_actor=False)
    environment = make_environment(config, section.rollout.evaluation_slots)
    try:
        return run_rl_stage(context, "value", section, actor, critic_from, environment, len(environment.tasks),
                            episode_rollout, train_actor=False)
    finally:
        environment.close()
