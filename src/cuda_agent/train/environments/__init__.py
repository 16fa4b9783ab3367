"""Training environments by name: ``cuda`` (kernel tasks, the trusted evaluator) and ``keypad``
(a synthetic sanity check). Each module is imported only when its environment is made."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from cuda_agent.registry import Registry
from cuda_agent.train.base import Environment
from cuda_agent.train.config import TrainConfig

logger = logging.getLogger(__name__)


def evaluation_settings(config: TrainConfig) -> tuple[Any, Any, Any]:
    """The ``EvalConfig``, ``AgentConfig`` and ``PoolConfig`` of the configuration's sections.

    Raises:
        ValueError: naming the section and field that is invalid.
    """
    import torch

    from cuda_agent.agent.config import AgentConfig
    from cuda_agent.environment import EvalConfig
    from cuda_agent.pool import PoolConfig

    evaluation = {"device": "cuda" if torch.cuda.is_available() else "cpu", **config.evaluation}
    try:
        eval_config = EvalConfig.from_dict(evaluation)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"evaluation settings: {exc}") from None
    agent = AgentConfig.from_dict(config.agent, "agent")
    valid = {f.name for f in dataclasses.fields(PoolConfig)}
    unknown = set(config.pool) - valid
    if unknown:
        raise ValueError(f"pool: unknown keys {sorted(unknown)}; valid: {sorted(valid)}")
    try:
        pool = PoolConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.pool.items()})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"pool: {exc}") from None
    return eval_config, agent, pool


def _cuda(config: TrainConfig, slots: int) -> Environment:
    from cuda_agent.environment import load_tasks
    from cuda_agent.train.environments.cuda import CudaEnvironment

    section = config.environment
    if section.tasks is None:
        raise ValueError("environment.tasks: the cuda environment needs a task set (a dataset, folder or problem file)")
    eval_config, agent, pool = evaluation_settings(config)
    results = load_tasks(section.tasks)
    for failed in (r for r in results if r.task is None):
        logger.warning("skipping task %s: %s", failed.origin, failed.error)
    tasks = [r.task for r in results if r.task is not None]
    if not tasks:
        raise ValueError(f"environment.tasks: {section.tasks} has no loadable task")
    return CudaEnvironment(tasks[: section.task_limit or None], eval_config, agent, pool, slots)


def _keypad(config: TrainConfig, slots: int) -> Environment:
    from cuda_agent.train.environments.keypad import KeypadEnvironment

    return KeypadEnvironment(config.environment.keypad)


ENVIRONMENTS: Registry[Callable[[TrainConfig, int], Environment]] = Registry("environment")
ENVIRONMENTS.register("cuda", _cuda)
ENVIRONMENTS.register("keypad", _keypad)


def make_environment(config: TrainConfig, evaluation_slots: int = 1) -> Environment:
    """The environment ``config.environment.name`` names.

    Raises:
        KeyError: unknown name (listing the valid ones).
        ValueError: its settings are invalid (naming the field), e.g. no loadable task.
        TaskLoadError: the task set cannot be read.
    """
    return ENVIRONMENTS.get(config.environment.name)(config, evaluation_slots)
