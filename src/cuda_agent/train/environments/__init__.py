"""Training environments by name: ``cuda`` (kernel tasks, the trusted evaluator) and ``keypad``
(a synthetic sanity check). Each module is imported only when its environment is made."""

from __future__ import annotations

from typing import Any, Callable

from cuda_agent.registry import Registry
from cuda_agent.train.base import Environment
from cuda_agent.train.config import TrainConfig


def _cuda(config: TrainConfig, slots: int) -> Environment:
    import logging

    import torch

    from cuda_agent.agent.config import AgentConfig
    from cuda_agent.environment import EvalConfig, load_tasks
    from cuda_agent.train.environments.cuda import CudaEnvironment

    section = config.environment
    if section.tasks is None:
        raise ValueError("environment.tasks: the cuda environment needs a task set (a dataset, folder or problem file)")
    results = load_tasks(section.tasks)
    tasks = [r.task for r in results if r.task is not None]
    for failed in (r for r in results if r.task is None):
        logging.getLogger(__name__).warning("skipping task %s: %s", failed.origin, failed.error)
    if not tasks:
        raise ValueError(f"environment.tasks: {section.tasks} has no loadable task")
    if section.task_limit:
        tasks = tasks[: section.task_limit]
    evaluation = {"device": "cuda" if torch.cuda.is_available() else "cpu", **config.evaluation}
    return CudaEnvironment(tasks, EvalConfig.from_dict(evaluation), AgentConfig.from_dict(config.agent),
                           _pool_config(config.pool), slots)


def _pool_config(data: dict[str, Any]) -> Any:
    import dataclasses

    from cuda_agent.pool import PoolConfig

    valid = {f.name for f in dataclasses.fields(PoolConfig)}
    unknown = set(data) - valid
    if unknown:
        raise ValueError(f"pool: unknown keys {sorted(unknown)}; valid: {sorted(valid)}")
    return PoolConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


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
    """
    return ENVIRONMENTS.get(config.environment.name)(config, evaluation_slots)
