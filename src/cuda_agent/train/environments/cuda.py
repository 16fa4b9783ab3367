"""The kernel environment: tasks in KernelBench format, episodes in the sandboxed workdir, every
reward from the trusted evaluator (the final workdir's verdict; for warm-up, the verdict on the
response as a single-file solution, evaluated on a pool)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from cuda_agent.agent.base import Policy
from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.prompts import device_note
from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.environment import EvalConfig, Task
from cuda_agent.pool import PoolConfig, open_pool
from cuda_agent.train.base import Environment, ResponseScore
from cuda_agent.train.rewards import PoolScorer

_WARMUP_PROMPT = """\
Write `ModelNew`, a faster drop-in replacement for `Model` below that computes the same outputs with
your own kernel. {device_note}
`ModelNew` takes the same constructor arguments as `Model`. Reply with the complete file model_new.py
in one ```python block (imports, kernel source, load_inline, class ModelNew) and nothing else.

model.py:
```python
{code}
```"""


def warmup_prompt(task: Task, device: str) -> list[dict[str, Any]]:
    """The single-turn prompt: the task, asking for one complete ``model_new.py``."""
    return [{"role": "user", "content": _WARMUP_PROMPT.format(device_note=device_note(device), code=task.code.rstrip())}]


class CudaEnvironment(Environment):
    """Args:
        tasks: the training tasks.
        eval_config: the trusted evaluator's settings (device, precision, timing, ...).
        agent_config: episode budgets and tools.
        pool_config: the pool that scores warm-up responses (opened on first use).
        evaluation_slots: evaluations at once over the episodes of a batch.
    """

    name = "cuda"

    def __init__(self, tasks: list[Task], eval_config: EvalConfig, agent_config: AgentConfig,
                 pool_config: PoolConfig, evaluation_slots: int) -> None:
        self.tasks, self.eval_config, self.agent_config = tasks, eval_config, agent_config
        self.pool_config, self.evaluation_slots = pool_config, evaluation_slots
        self.device = eval_config.device
        self._queue: EvaluationQueue | None = None
        self._scorer: PoolScorer | None = None

    async def start(self) -> None:
        self._queue = EvaluationQueue(self.eval_config, self.evaluation_slots)

    async def stop(self) -> None:
        if self._queue is not None:
            self._queue.close()
            self._queue = None

    async def episode(self, task: Task, policy: Policy, episode_id: str, sample: int) -> Trajectory:
        if self._queue is None:
            raise RuntimeError("CudaEnvironment.episode called outside start()/stop()")
        return await run_episode(task, policy, self.agent_config, self._queue, episode_id, sample)

    def single_turn_prompt(self, task: Task) -> list[dict[str, Any]]:
        return warmup_prompt(task, self.device)

    def score_responses(self, items: list[tuple[Task, str]]) -> list[Future[ResponseScore]]:
        if self._scorer is None:
            self._scorer = PoolScorer(open_pool(self.eval_config, self.pool_config))
        return [self._scorer.submit(task, text) for task, text in items]

    def close(self) -> None:
        if self._scorer is not None:
            self._scorer.pool.close()
            self._scorer = None
