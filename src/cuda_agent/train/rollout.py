"""Rollouts with the actor being trained, through the agent loop's ``hf`` policy.

Multi-turn: :func:`collect_episodes` runs episodes concurrently (the policy batches their turns)
and returns their trajectories, whose steps carry the exact prompt and completion token ids.
Single-turn (warm-up): :func:`generate_responses` generates one reply per prompt with
:meth:`HFPolicy.generate_batch`. Either way the policy generates with the live actor object, so
every rollout sees the weights of the latest update.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from cuda_agent.agent.policies.hf_policy import Generation, HFConfig, HFPolicy
from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.environment import Task
from cuda_agent.train.base import Environment, ResponseScore
from cuda_agent.train.config import RolloutConfig
from cuda_agent.train.models import ModelSet

logger = logging.getLogger(__name__)


class TrainingPolicy(HFPolicy):
    """The ``hf`` policy over the live actor, also counting the time and tokens of its generation
    calls (generation throughput, apart from the time episodes spend in tools and evaluations), the
    calls themselves and their sequential decoding steps (the longest completion of each call):
    episodes batched well make few calls, and seconds per decoding step is the model's latency."""

    generation_s = 0.0
    generated_tokens = 0
    generation_calls = 0
    decode_steps = 0

    def generate_batch(self, prompts: list[tuple[int, ...]]) -> list[Generation]:
        started = time.monotonic()
        generations = super().generate_batch(prompts)
        self.generation_s += time.monotonic() - started
        self.generated_tokens += sum(len(g.completion_ids) for g in generations)
        self.generation_calls += 1
        self.decode_steps += max(len(g.completion_ids) for g in generations)
        return generations

    def take_generation_metrics(self) -> dict[str, float]:
        """Seconds, tokens, calls and decoding steps of generation since the last call, and the rates."""
        seconds, tokens, steps = self.generation_s, self.generated_tokens, self.decode_steps
        calls = self.generation_calls
        self.generation_s, self.generated_tokens, self.generation_calls, self.decode_steps = 0.0, 0, 0, 0
        return {"rollout/generation_seconds": seconds, "rollout/generation_tokens_per_s": tokens / max(seconds, 1e-9),
                "rollout/generation_calls": calls,
                "rollout/decode_step_seconds": seconds / steps if steps else None}


def training_policy(models: ModelSet, rollout: RolloutConfig) -> TrainingPolicy:
    """The ``hf`` policy over the live actor, sampling as ``rollout`` says."""
    autocast = None
    if models.precision.autocast_dtype is not None:
        autocast = str(models.precision.autocast_dtype).removeprefix("torch.")
    config = HFConfig(model_path=models.actor_path, device=str(models.device), max_new_tokens=rollout.max_new_tokens,
                      temperature=rollout.temperature, top_p=rollout.top_p, max_batch=rollout.max_batch,
                      autocast=autocast)
    return TrainingPolicy(config, model=models.actor, tokenizer=models.tokenizer)


@dataclass
class EpisodeRollout:
    """The episodes of one step, in job order; infrastructure failures left out."""

    trajectories: list[Trajectory] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def generated_tokens(self) -> int:
        return sum(t.tokens.get("completion", 0) for t in self.trajectories)


def collect_episodes(environment: Environment, policy: HFPolicy, jobs: list[tuple[Task, int]], concurrency: int,
                     tag: str) -> EpisodeRollout:
    """Run one episode per ``(task, sample)`` job, ``concurrency`` at once.

    Args:
        tag: part of every episode id (e.g. the step), so ids are unique over a run.
    """
    started = time.monotonic()
    rollout = EpisodeRollout()

    async def main() -> list[Trajectory | BaseException]:
        await environment.start()
        slots = asyncio.Semaphore(concurrency)

        async def one(task: Task, sample: int) -> Trajectory:
            async with slots:
                return await environment.episode(task, policy, f"{tag}-{task.id}-s{sample}", sample)

        try:
            return await asyncio.gather(*(one(task, sample) for task, sample in jobs), return_exceptions=True)
        finally:
            await environment.stop()

    policy.model.eval()
    for (task, sample), result in zip(jobs, asyncio.run(main())):
        if isinstance(result, Trajectory):
            rollout.trajectories.append(result)
        else:
            logger.error("episode of %s (sample %d) failed: %r", task.id, sample, result)
            rollout.failures.append(f"{task.id}/{sample}: {type(result).__name__}: {result}")
    rollout.seconds = time.monotonic() - started
    return rollout


@dataclass
class ResponseRollout:
    """Single-turn generations of one step, in job order, and their scores (in evaluation)."""

    tasks: list[Task]
    generations: list[Generation]
    scores: list[Future[ResponseScore]]
    seconds: float

    @property
    def generated_tokens(self) -> int:
        return sum(len(g.completion_ids) for g in self.generations)


def generate_responses(environment: Environment, policy: HFPolicy, tasks: list[Task], max_batch: int) -> ResponseRollout:
    """One reply per task (repeat a task for several samples) to its single-turn prompt, in batches
    of ``max_batch``; each batch is sent for scoring as soon as it is generated, so the evaluator
    scores batch k while batch k + 1 generates."""
    started = time.monotonic()
    policy.model.eval()
    prompts = [policy.prompt_ids(environment.single_turn_prompt(task), []) for task in tasks]
    generations: list[Generation] = []
    scores: list[Future[ResponseScore]] = []
    for first in range(0, len(prompts), max_batch):
        batch = policy.generate_batch(prompts[first: first + max_batch])
        scores.extend(environment.score_responses([(task, g.text) for task, g in zip(tasks[first:], batch)]))
        generations.extend(batch)
    return ResponseRollout(tasks, generations, scores, time.monotonic() - started)
