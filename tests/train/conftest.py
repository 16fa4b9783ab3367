"""Fixtures for the trainer tests: a tiny random Llama (built from a config, no download) with a
tokenizer trained on the keypad environment's text, keypad demonstrations recorded through the
agent loop, and that model after a short supervised warm start on them.

The tokenizer keeps the ``press`` call's fixed prefix and suffix as one token each (see
``init_model.build_tokenizer``): the tool-call syntax is then 4 tokens, which a 2-layer model
learns in a few dozen SFT steps; the agent loop, the text protocol parser, the tools and the
masks are the real ones.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from cuda_agent.agent.policies.replay_policy import ReplayPolicy
from cuda_agent.agent.text_protocol import tool_instructions
from cuda_agent.agent.trajectory import append_trajectory
from cuda_agent.train.environments.keypad import SYSTEM_PROMPT, PressTool
from cuda_agent.train.init_model import init_random_model
from cuda_agent.train.stages import StageContext, StageOutput, run_stage

from keypad_support import CALL_PREFIX, CALL_SUFFIX, keypad_config, keypad_environment, press


@pytest.fixture(scope="session")
def keypad_model(tmp_path_factory) -> Path:
    environment = keypad_environment()
    corpus = [SYSTEM_PROMPT, tool_instructions([PressTool.schema()]), "pressed 4: the lock stays shut",
              "click: the lock opens", *(t.code for t in environment.tasks)]
    path = tmp_path_factory.mktemp("keypad-model")
    init_random_model(path, "tiny", corpus * 10, seed=0, whole_tokens=(CALL_PREFIX, CALL_SUFFIX))
    return path


@pytest.fixture(scope="session")
def keypad_demos(tmp_path_factory) -> Path:
    """48 recorded keypad episodes pressing uniformly random keys (the format, not the answer)."""
    environment = keypad_environment()
    path = tmp_path_factory.mktemp("keypad-demos") / "demos.jsonl"
    rng = random.Random(0)

    async def record() -> None:
        for i in range(48):
            turns = [press(rng.choice("0123456789")) for _ in range(3)]
            trajectory = await environment.episode(environment.tasks[i % 6], ReplayPolicy(turns), f"demo{i}", 0)
            append_trajectory(path, trajectory)

    asyncio.run(record())
    return path


@pytest.fixture(scope="session")
def warm_keypad(keypad_model: Path, keypad_demos: Path, tmp_path_factory) -> StageOutput:
    """The keypad model after the RFT stage on the random-key demonstrations (kept whatever their
    reward): it calls ``press`` in the right syntax, with keys close to uniform."""
    out = tmp_path_factory.mktemp("keypad-warm") / "rft"
    config = keypad_config(keypad_model, rft={
        "sample": False, "trajectories": [str(keypad_demos)], "filter": {"min_reward": -1, "max_repeats": 4},
        "epochs": 5, "batch_size": 8, "optim": {"lr": 1e-2}, "tensorboard": False})
    result = run_stage("rft", StageContext(config, out))
    assert result.completed
    return StageOutput.read(out)
