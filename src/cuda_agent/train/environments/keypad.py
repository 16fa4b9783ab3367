"""``keypad``: a synthetic multi-turn environment for checking that training learns, in seconds,
without a GPU or a compiler.

Each task is a lock whose code (one key) the task states. The agent has one tool, ``press``; a
press of the right key opens the lock and ends the episode, a wrong one says so and the agent may
try again, up to ``max_turns`` turns. The reward is computed from the lock's record: 3 when it
opened on the first turn, 2 on the second, 1 later, -1 never, the same scale as the kernel
reward. Episodes run through the agent loop's :class:`~cuda_agent.agent.loop.Episode` with a real
:class:`~cuda_agent.agent.tools.ToolBox`, and are recorded as ordinary trajectories.
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.agent.base import Policy, Tool, ToolError, ToolResult
from cuda_agent.agent.config import AgentConfig
from cuda_agent.agent.evaluation import EvaluationRecord
from cuda_agent.agent.loop import Episode
from cuda_agent.agent.text_protocol import parse_tool_calls
from cuda_agent.agent.tools import ToolBox
from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.environment import Task
from cuda_agent.train.base import Environment, ResponseScore, resolved
from cuda_agent.train.config import KeypadConfig

SYSTEM_PROMPT = "You open keypad locks. Call the press tool with one key per turn until the lock opens."


@dataclass
class Lock:
    """One episode's lock; also the episode's (empty) evaluation log."""

    code: str
    presses: list[tuple[int, str]] = field(default_factory=list)
    """``(turn, key)`` of every press."""
    records: list[EvaluationRecord] = field(default_factory=list)
    turn: int = 0

    @property
    def opened_turn(self) -> int | None:
        return next((turn for turn, key in self.presses if key == self.code), None)

    @property
    def reward(self) -> int:
        """3, 2 or 1 for opening it on the first, second or a later turn; -1 for never."""
        turn = self.opened_turn
        return -1 if turn is None else max(1, 3 - turn)


class PressTool(Tool):
    name = "press"
    description = "Press one key of the lock's keypad."
    parameters = {"type": "object", "properties": {"key": {"type": "string", "description": "One key, e.g. 5."}},
                  "required": ["key"], "additionalProperties": False}

    def __init__(self, lock: Lock, keys: str) -> None:
        self.lock, self.keys = lock, keys

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        key = arguments["key"]
        if len(key) != 1 or key not in self.keys:
            raise ToolError(f"there is no key {key!r}; the keys are {' '.join(self.keys)}")
        self.lock.presses.append((self.lock.turn, key))
        if key == self.lock.code:
            return ToolResult("click: the lock opens", finish=True)
        return ToolResult(f"pressed {key}: the lock stays shut")


class KeypadEnvironment(Environment):
    name = "keypad"

    def __init__(self, config: KeypadConfig) -> None:
        self.config = config
        self.device = "cpu"
        self.tasks = [Task(f"lock-{i}", self._statement(i, config.codes[i % len(config.codes)]), f"keypad#{i}")
                      for i in range(config.tasks)]
        self._codes = {task.id: config.codes[i % len(config.codes)] for i, task in enumerate(self.tasks)}
        self.agent_config = AgentConfig(max_turns=config.max_turns, max_idle_replies=config.max_turns)

    @staticmethod
    def _statement(index: int, code: str) -> str:
        return f"Lock {index}: the code is {code}. Open the lock."

    async def episode(self, task: Task, policy: Policy, episode_id: str, sample: int) -> Trajectory:
        lock = Lock(self._codes[task.id])
        tools = ToolBox([PressTool(lock, self.config.keys)])
        messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.code}]
        episode = Episode(task, policy, self.agent_config, episode_id, tools, lock, messages)
        await episode.run()
        final = EvaluationRecord(len(lock.records), lock.turn, "final", lock.opened_turn is not None, lock.reward,
                                 f"presses {[key for _, key in lock.presses]}; reward {lock.reward}", 0.0, 0.0)
        return episode.trajectory(final.to_dict(), "off: synthetic environment", sample, self.device)

    def single_turn_prompt(self, task: Task) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"{task.code} Reply with one call of the press tool: "
                                            '<tool_call>{"name": "press", "arguments": {"key": "<key>"}}</tool_call>'}]

    def score_responses(self, items: list[tuple[Task, str]]) -> list[Future[ResponseScore]]:
        """The first ``press`` call of each response, scored as the first turn of an episode."""
        scores = []
        for task, text in items:
            calls, _ = parse_tool_calls(text, "call")
            keys = [_key(call) for call in calls if call["function"]["name"] == "press"]
            lock = Lock(self._codes[task.id], presses=[(0, keys[0])] if keys and keys[0] is not None else [])
            scores.append(resolved(ResponseScore(float(lock.reward), f"pressed {keys[:1]}")))
        return scores


def _key(call: dict[str, Any]) -> str | None:
    try:
        arguments = json.loads(call["function"]["arguments"])
    except json.JSONDecodeError:
        return None
    return arguments.get("key") if isinstance(arguments, dict) else None
