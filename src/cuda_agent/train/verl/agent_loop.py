"""``CudaAgentLoop``: the cuda-agent episode as a verl agent loop (name ``cuda_agent``).

Register it with verl through ``actor_rollout_ref.rollout.agent.agent_loop_config_path`` pointing
at ``configs/verl/agent_loop.yaml`` (verl reads the name and class from there), and give the
dataset rows ``agent_name: cuda_agent`` (``cuda-agent train verl-data`` does). Each row's
``extra_info`` carries the task (``task_id``, ``task_code``). :func:`register` does the same
registration from Python.

One call of :meth:`CudaAgentLoop.run` is one episode of :func:`cuda_agent.agent.run_episode`:
the sandboxed workdir, the tools and the protected build/verify/profile commands, with
:class:`~.policy.VerlServerPolicy` generating through verl's server manager. The output is the
episode's token sequence with its response mask, ending at the last generated token (where verl
places the reward: :func:`~.policy.fit_response`), and ``reward_score`` is the trusted evaluator's
verdict on the final workdir (so verl's reward function is not called for these rows). An episode
the harness could not score (no verdict) is returned with an all-0 mask and reward 0, which leaves
it out of every loss; ``reward_extra_info.cuda_agent_harness_error`` marks it (1) in verl's batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import uuid
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput
from verl.experimental.agent_loop.agent_loop import register as verl_register

from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import initial_messages, run_episode
from cuda_agent.environment import Task
from cuda_agent.pool import PoolConfig, open_pool
from cuda_agent.train.rewards import PoolScorer, harness_failure, pool_evaluator
from cuda_agent.train.verl.data import task_from_row
from cuda_agent.train.verl.policy import VerlServerPolicy, fit_response
from cuda_agent.train.verl.settings import VerlSettings

logger = logging.getLogger(__name__)

AGENT_NAME = "cuda_agent"
SETTINGS_KEY = "cuda_agent"


class _Shared:
    """What the episodes of one worker process share: settings, and per event loop one evaluation
    queue (its slots bound the evaluations at once; its evaluator is the pool, if configured)."""

    lock = threading.Lock()
    queues: dict[int, EvaluationQueue] = {}
    evaluator: Any = None

    @classmethod
    def queue(cls, settings: VerlSettings) -> EvaluationQueue:
        loop = id(asyncio.get_running_loop())
        with cls.lock:
            if settings.pool is not None and cls.evaluator is None:
                cls.evaluator = pool_evaluator(open_pool(settings.evaluation, settings.pool))
            if loop not in cls.queues:
                cls.queues[loop] = EvaluationQueue(settings.evaluation, settings.evaluation_slots, cls.evaluator)
            return cls.queues[loop]

    scorers: dict[str, PoolScorer] = {}

    @classmethod
    def scorer(cls, settings: VerlSettings) -> PoolScorer:
        """The pool that scores warm-up replies (one per worker process and evaluation settings)."""
        key = repr((settings.evaluation, settings.pool))
        with cls.lock:
            if key not in cls.scorers:
                cls.scorers[key] = PoolScorer(open_pool(settings.evaluation, settings.pool or PoolConfig()))
            return cls.scorers[key]

    harness_errors = 0
    """Episodes of this worker process left out of training for a harness failure."""

    @classmethod
    def count_harness_error(cls) -> None:
        with cls.lock:
            cls.harness_errors += 1
            logger.warning("cuda-agent: %d episode(s) of this worker left out for harness failures", cls.harness_errors)


class CudaAgentLoop(AgentLoopBase):
    """One cuda-agent episode per dataset row (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = VerlSettings.from_section(self.config.get(SETTINGS_KEY))
        self.response_length = int(self.rollout_config.response_length)
        window = int(self.rollout_config.prompt_length) + self.response_length
        agent = self.settings.agent
        if agent.context.window_tokens < window:  # the policy needs the whole history (append-only ids)
            wide = agent.replace(context=dataclasses.replace(agent.context, window_tokens=window))
            self.settings = dataclasses.replace(self.settings, agent=wide)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task = task_from_row(kwargs.get("extra_info"))
        policy = VerlServerPolicy(self, sampling_params, self.response_length)
        queue = _Shared.queue(self.settings)
        try:
            trajectory = await run_episode(task, policy, self.settings.agent, queue)
            failure = harness_failure(trajectory)
            extra = {"end_reason": trajectory.end_reason, "turns": trajectory.turns,
                     "final": failure or (trajectory.final or {}).get("summary", "")[:500]}
        except Exception as exc:  # the harness failed (not the policy): no verdict for this episode
            logger.exception("cuda-agent episode of %s failed", task.id)
            failure, trajectory = f"{type(exc).__name__}: {exc}", None
            extra = {"end_reason": "harness_error", "turns": policy.generations, "final": failure[:500]}
        if failure is not None:  # left out of training (masked), not punished; counted in verl's metrics
            logger.warning("cuda-agent episode of %s left out of training: %s", task.id, failure)
            _Shared.count_harness_error()
        if not policy.token_ids:  # the episode ended before the first generation
            await policy.start(*self._first_messages(task))
        timings = trajectory.timings if trajectory is not None else {}
        metrics = AgentLoopMetrics(generate_sequences=timings.get("policy_s", 0.0),
                                   tool_calls=timings.get("tools_s", 0.0))
        ids, mask, logprobs = fit_response(policy.response_ids, policy.response_mask, policy.response_logprobs or None,
                                           self.response_length, exclude=failure is not None)
        reward = 0.0 if failure is not None else float(trajectory.reward)
        return AgentLoopOutput(
            prompt_ids=policy.prompt_ids, response_ids=ids, response_mask=mask, response_logprobs=logprobs,
            reward_score=reward, num_turns=len(trajectory.messages) if trajectory else 2, metrics=metrics,
            extra_fields={"turn_scores": [], "tool_rewards": [], "cuda_agent": extra,
                          "reward_extra_info": {"cuda_agent_harness_error": int(failure is not None)}})

    def _first_messages(self, task: Task) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        agent = self.settings.agent
        return initial_messages(task, self.settings.evaluation.device, agent.workdir_style, agent.skill_text()), []


class CudaSingleTurnLoop(AgentLoopBase):
    """One warm-up reply per dataset row (name ``cuda_agent_single_turn``): the reply is generated
    through verl's server manager and scored here by the trusted evaluator as a complete solution
    file (an evaluation pool, as :func:`~.reward.compute_score` uses), so that a reply the harness
    could not score is masked out like a failed episode: a reward function cannot drop a sample."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings = VerlSettings.from_section(self.config.get(SETTINGS_KEY))
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        task = task_from_row(kwargs.get("extra_info"))
        prompt_ids = list(await self.ct_build_initial_tokens(list(kwargs["raw_prompt"])))
        output = await self.server_manager.generate(request_id=uuid.uuid4().hex, prompt_ids=prompt_ids,
                                                    sampling_params=sampling_params)
        generated = list(output.token_ids)[: self.response_length]
        logprobs = list(output.log_probs)[: len(generated)] if output.log_probs else None
        text = self.tokenizer.decode(generated, skip_special_tokens=True)
        score = await asyncio.wrap_future(_Shared.scorer(self.settings).submit(task, text))
        failed = score.reward is None
        if failed:
            logger.warning("warm-up reply for %s left out of training: %s", task.id, score.detail)
            _Shared.count_harness_error()
        ids, mask, logprobs = fit_response(generated, [1] * len(generated), logprobs, self.response_length, failed)
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=ids, response_mask=mask, response_logprobs=logprobs,
            reward_score=0.0 if failed else float(score.reward), num_turns=2, metrics=AgentLoopMetrics(),
            extra_fields={"turn_scores": [], "tool_rewards": [], "cuda_agent": {"status": score.detail[:500]},
                          "reward_extra_info": {"cuda_agent_harness_error": int(failed)}})


def register(name: str = AGENT_NAME) -> type[CudaAgentLoop]:
    """Register :class:`CudaAgentLoop` in verl's agent-loop registry under ``name`` (what
    ``agent_loop_config_path`` does from a file)."""
    return verl_register(name)(CudaAgentLoop)
