"""Replays recorded assistant turns: the policy of tests, demos and GPU validation runs.

The source is a trajectory JSONL (one of its episodes) or a replay script: a JSON list of
assistant messages (``{"content": ..., "tool_calls": [{"function": {"name", "arguments"}}]}``,
where ``arguments`` may be an object). The environment's answers are not checked: the replay
sends the same turns whatever the tools return, and fails the episode when it runs out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cuda_agent.agent.base import Policy, PolicyError, PolicyReply
from cuda_agent.agent.trajectory import TrajectoryError, read_trajectories


class ReplayPolicy(Policy):
    name = "replay"

    def __init__(self, turns: list[dict[str, Any]], source: str = "<memory>") -> None:
        self.turns = [_normalise(turn, i, source) for i, turn in enumerate(turns)]
        self.source = source
        self._next: dict[str, int] = {}

    @classmethod
    def from_path(cls, path: Path, episode: int = 0) -> ReplayPolicy:
        """Load the assistant turns of a trajectory file (its ``episode``-th line) or a script.

        Raises:
            TrajectoryError: unreadable file, malformed content, or no such episode.
        """
        if path.suffix == ".jsonl":
            trajectories = list(read_trajectories(path))
            if not 0 <= episode < len(trajectories):
                raise TrajectoryError(f"{path}: has {len(trajectories)} episode(s); episode {episode} does not exist")
            turns = [m for m in trajectories[episode].messages if m["role"] == "assistant"]
        else:
            try:
                turns = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise TrajectoryError(f"{path}: cannot read replay script ({exc})") from None
            if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
                raise TrajectoryError(f"{path}: a replay script is a JSON list of assistant messages")
        return cls(turns, str(path))

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "turns": len(self.turns)}

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], episode_id: str) -> PolicyReply:
        index = self._next.get(episode_id, 0)
        if index >= len(self.turns):
            raise PolicyError(f"replay of {self.source} has no turn {index + 1} (it recorded {len(self.turns)})")
        self._next[episode_id] = index + 1
        return PolicyReply(self.turns[index], prompt_tokens=0, completion_tokens=0, finish_reason="replay")


def _normalise(turn: dict[str, Any], index: int, source: str) -> dict[str, Any]:
    where = f"{source} turn {index}"
    message: dict[str, Any] = {"role": "assistant", "content": turn.get("content") or ""}
    calls = []
    for number, call in enumerate(turn.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise TrajectoryError(f"{where}: tool call {number} needs function.name")
        arguments = function.get("arguments", {})
        calls.append({"id": call.get("id") or f"replay_{index}_{number}", "type": "function",
                      "function": {"name": function["name"],
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    if calls:
        message["tool_calls"] = calls
    return message
