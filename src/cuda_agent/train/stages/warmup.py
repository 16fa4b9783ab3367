"""``train warmup``: single-turn PPO. The prompt is the task, the response one complete solution
file; the trusted evaluator scores it (through the environment's pool, while the trainer scores
the rows); GAE over the response tokens; the actor and a critic learn."""

from __future__ import annotations

from cuda_agent.train.environments import make_environment
from cuda_agent.train.rollout import generate_responses
from cuda_agent.train.sequences import generation_row
from cuda_agent.train.stages.common import StageContext, StageError, StageResult
from cuda_agent.train.stages.rl import RLRun, Rollout, run_rl_stage


def response_rollout(run: RLRun, step: int) -> Rollout:
    """``tasks_per_step`` tasks, ``samples_per_task`` responses each, each generated batch sent for
    scoring at once (scored while the next batch generates and the trainer scores the rows)."""
    rollout, environment = run.section.rollout, run.environment
    tasks = [environment.tasks[i] for i in run.sampler.take(rollout.tasks_per_step)
             for _ in range(rollout.samples_per_task)]
    responses = generate_responses(environment, run.policy, tasks, rollout.max_batch)
    rows = [generation_row(i, g.prompt_ids, g.completion_ids) for i, g in enumerate(responses.generations)]
    metrics = {"rollout/seconds": responses.seconds, "rollout/generated_tokens": float(responses.generated_tokens),
               "rollout/tokens_per_s": responses.generated_tokens / max(responses.seconds, 1e-9),
               "rollout/response_tokens_mean": responses.generated_tokens / max(len(tasks), 1),
               **run.policy.take_generation_metrics()}
    return Rollout(rows, lambda: [future.result().reward for future in responses.scores], metrics)


def run_warmup(context: StageContext) -> StageResult:
    """Warm up ``model.path`` (or the given previous stage's actor); hands on ``actor/`` and ``critic/``."""
    config = context.config
    actor = context.previous.actor if context.previous else config.model.path
    if actor is None:
        raise StageError("warmup needs a starting model: model.path in the config (or --model)")
    environment = make_environment(config, config.warmup.rollout.evaluation_slots)
    try:
        return run_rl_stage(context, "warmup", config.warmup, actor, config.model.critic_path or actor, environment,
                            len(environment.tasks), response_rollout, train_actor=True)
    finally:
        environment.close()
