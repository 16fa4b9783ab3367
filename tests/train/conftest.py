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
import torch

from cuda_agent.agent.policies.replay_policy import ReplayPolicy
from cuda_agent.agent.text_protocol import tool_instructions
from cuda_agent.agent.trajectory import append_trajectory
from cuda_agent.train.config import KeypadConfig, TrainConfig
from cuda_agent.train.environments.keypad import SYSTEM_PROMPT, KeypadEnvironment, PressTool
from cuda_agent.train.init_model import init_random_model
from cuda_agent.train.stages import StageContext, StageOutput, run_stage

KEYPAD = {"tasks": 6, "codes": ["7"]}
CALL_PREFIX = '<tool_call>\n{"name": "press", "arguments": {"key": "'
CALL_SUFFIX = '"}}\n</tool_call>'


def press(key: str) -> dict:
    """A replay turn that presses ``key`` in the text protocol."""
    return {"content": f"{CALL_PREFIX}{key}{CALL_SUFFIX}",
            "tool_calls": [{"function": {"name": "press", "arguments": {"key": key}}}]}


def keypad_config(model: Path, **sections) -> TrainConfig:
    """A keypad training config for ``model`` (shared critic: one network to run on CPU)."""
    return TrainConfig.from_dict({"environment": {"name": "keypad", "keypad": KEYPAD},
                                  "model": {"path": str(model), "critic": "shared"}, **sections})


@pytest.fixture(autouse=True)
def _two_threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def keypad_model(tmp_path_factory) -> Path:
    environment = KeypadEnvironment(KeypadConfig(**{**KEYPAD, "codes": tuple(KEYPAD["codes"])}))
    corpus = [SYSTEM_PROMPT, tool_instructions([PressTool.schema(PressTool)]), "pressed 4: the lock stays shut",
              "click: the lock opens", *(t.code for t in environment.tasks)]
    path = tmp_path_factory.mktemp("keypad-model")
    init_random_model(path, "tiny", corpus * 10, seed=0, whole_tokens=(CALL_PREFIX, CALL_SUFFIX))
    return path


@pytest.fixture(scope="session")
def keypad_demos(tmp_path_factory) -> Path:
    """48 recorded keypad episodes pressing uniformly random keys (the format, not the answer)."""
    environment = KeypadEnvironment(KeypadConfig(**{**KEYPAD, "codes": tuple(KEYPAD["codes"])}))
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
