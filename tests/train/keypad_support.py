"""Helpers of the trainer tests (fixtures are in conftest.py): keypad configs, replay turns,
hand-made trajectories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cuda_agent.agent.trajectory import FORMAT, Step, Trajectory
from cuda_agent.train.config import KeypadConfig, TrainConfig
from cuda_agent.train.environments.keypad import KeypadEnvironment

KEYPAD = {"tasks": 6, "codes": ["7"]}
CALL_PREFIX = '<tool_call>\n{"name": "press", "arguments": {"key": "'
CALL_SUFFIX = '"}}\n</tool_call>'


def press(key: str) -> dict[str, Any]:
    """A replay turn that presses ``key`` in the text protocol."""
    return {"content": f"{CALL_PREFIX}{key}{CALL_SUFFIX}",
            "tool_calls": [{"function": {"name": "press", "arguments": {"key": key}}}]}


def keypad_environment() -> KeypadEnvironment:
    return KeypadEnvironment(KeypadConfig(tasks=KEYPAD["tasks"], codes=tuple(KEYPAD["codes"])))


def keypad_config(model: Path, **sections: Any) -> TrainConfig:
    """A keypad training config for ``model`` (shared critic: one network to run on CPU)."""
    return TrainConfig.from_dict({"environment": {"name": "keypad", "keypad": KEYPAD},
                                  "model": {"path": str(model), "critic": "shared"}, **sections})


def make_trajectory(steps: list[Step], messages: list[dict[str, Any]] | None = None, reward: int = 3,
                    tools: list[dict[str, Any]] | None = None) -> Trajectory:
    """A trajectory with the given steps and messages and placeholder bookkeeping."""
    return Trajectory(
        episode_id="e", task_id="t", task_origin="t.py", task_code_hash="0", device="cpu", policy={"name": "test"},
        messages=messages or [], tools=tools or [], steps=steps, evaluations=[], final=None, reward=reward,
        end_reason="finish", tokens={"prompt": 0, "completion": 0}, timings={}, sandbox="off", config={},
        started_at="", finished_at="", format=FORMAT)
