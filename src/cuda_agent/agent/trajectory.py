"""Trajectories: one episode per JSONL line, the record every later stage reads.

A line holds the task, the policy, the full chat history (``messages``: system, user, assistant
with ``tool_calls``, ``tool`` results), one :class:`Step` per assistant turn (tokens, latency, tool
calls and their outcomes, the evaluations they asked for, how the context was trimmed), every
evaluation result, the final verdict and reward, token totals and timings. Loss masks are not
stored: :mod:`cuda_agent.agent.masks` derives them from ``messages``. The format is documented
field by field in docs/agent.md; readers accept every ``cuda-agent-trajectory/1`` line.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

FORMAT = "cuda-agent-trajectory/1"


class TrajectoryError(ValueError):
    """A trajectory file or line is not in the documented format; the message names where."""


@dataclass
class ToolCallRecord:
    """One tool call of a step and what came of it."""

    id: str
    name: str
    arguments: str
    ok: bool
    output_chars: int
    latency_s: float
    overhead_s: float
    """Environment overhead: ``latency_s`` less the compile and timing seconds of the evaluations
    this call asked for (what the agent harness itself costs)."""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Step:
    """One assistant turn."""

    turn: int
    message_index: int
    """Index of the assistant message in ``Trajectory.messages``."""
    prompt_tokens: int
    completion_tokens: int
    policy_s: float
    finish_reason: str = ""
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    evaluations: list[int] = field(default_factory=list)
    """Numbers of the evaluations (``Trajectory.evaluations``) this turn's tool calls asked for."""
    context: dict[str, Any] | None = None
    """How the history was trimmed for this turn (:func:`cuda_agent.agent.context.apply_view`),
    ``None`` when the policy saw all of it."""
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Step:
        data = dict(data)
        data["tool_calls"] = [ToolCallRecord(**c) for c in data.get("tool_calls", [])]
        return cls(**data)


@dataclass
class Trajectory:
    """One episode (see the module docstring and docs/agent.md)."""

    episode_id: str
    task_id: str
    task_origin: str
    task_code_hash: str
    device: str
    policy: dict[str, Any]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    """The tool schemas the policy was offered."""
    steps: list[Step]
    evaluations: list[dict[str, Any]]
    """Every evaluation the agent asked for (``EvaluationRecord.to_dict()``), in order."""
    final: dict[str, Any] | None
    """The trusted evaluator's scoring of the final workdir (an ``EvaluationRecord``)."""
    reward: int
    end_reason: str
    """``finish``, ``max_turns``, ``max_episode_tokens``, ``wall_clock``, ``idle`` or ``policy_error``."""
    tokens: dict[str, int]
    timings: dict[str, float]
    sandbox: str
    config: dict[str, Any]
    started_at: str
    finished_at: str
    sample: int = 0
    """Which sample of its task this episode is (several per task in RL)."""
    error: str | None = None
    workdir: str | None = None
    """The kept episode directory (``keep_workdir``), else ``None``."""
    format: str = FORMAT

    @property
    def turns(self) -> int:
        return len(self.steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Trajectory:
        """Parse one line's object; ``where`` (``file:line``) names it in errors.

        Raises:
            TrajectoryError: not an object, wrong ``format``, or missing fields.
        """
        if not isinstance(data, dict):
            raise TrajectoryError(f"{where}: a trajectory line must be a JSON object")
        if data.get("format") != FORMAT:
            raise TrajectoryError(f"{where}: format is {data.get('format')!r}; expected {FORMAT!r}")
        missing = sorted(name for name in _REQUIRED if name not in data)
        if missing:
            raise TrajectoryError(f"{where}: missing fields {missing}")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        try:
            values["steps"] = [Step.from_dict(s) for s in data["steps"]]
            return cls(**values)
        except TypeError as exc:
            raise TrajectoryError(f"{where}: malformed step or field ({exc})") from None


_REQUIRED = ("episode_id", "task_id", "task_origin", "task_code_hash", "device", "policy", "messages", "tools",
             "steps", "evaluations", "final", "reward", "end_reason", "tokens", "timings", "sandbox", "config",
             "started_at", "finished_at")


def append_trajectory(path: Path, trajectory: Trajectory) -> None:
    """Append one line and flush it to disk (a crash later loses nothing written before)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(trajectory.to_dict(), allow_nan=False, default=str) + "\n")
        out.flush()
        os.fsync(out.fileno())


def read_trajectories(path: Path) -> Iterator[Trajectory]:
    """Every trajectory of a JSONL file, or of every ``*.jsonl`` file under a directory.

    Raises:
        TrajectoryError: unreadable file or a malformed line (naming file and line). A last line
            cut short by a crash is skipped, not an error.
    """
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    if not path.exists():
        raise TrajectoryError(f"{path}: no such file or directory")
    for file in files:
        try:
            lines = file.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise TrajectoryError(f"{file}: cannot read ({exc})") from None
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                if number == len(lines):
                    continue  # an interrupted append
                raise TrajectoryError(f"{file}:{number}: invalid JSON ({exc.msg})") from None
            yield Trajectory.from_dict(data, f"{file}:{number}")


@dataclass(frozen=True)
class TrajectoryStats:
    """A summary of many episodes (``cuda-agent traj stats``)."""

    episodes: int
    reward_histogram: dict[int, int]
    mean_reward: float
    turns_mean: float
    turns_median: float
    end_reasons: dict[str, int]
    tool_calls: dict[str, int]
    tool_errors: dict[str, int]
    unparsed_tool_calls: int
    """``<tool_call>`` blocks that did not parse (text tool protocol); each was reported back to the model."""
    evaluations: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    env_overhead_s_median: float | None
    """Median per-tool-call environment overhead (latency less compile and timing)."""


def summarize(trajectories: list[Trajectory]) -> TrajectoryStats:
    """Reward histogram, turns, end reasons, tool-call errors, evaluations and tokens."""
    if not trajectories:
        raise TrajectoryError("no trajectories to summarise")
    calls = [call for t in trajectories for step in t.steps for call in step.tool_calls]
    overheads = [call.overhead_s for call in calls]
    turns = [t.turns for t in trajectories]
    return TrajectoryStats(
        episodes=len(trajectories),
        reward_histogram=dict(sorted(Counter(t.reward for t in trajectories).items())),
        mean_reward=statistics.fmean(t.reward for t in trajectories),
        turns_mean=statistics.fmean(turns), turns_median=statistics.median(turns),
        end_reasons=dict(Counter(t.end_reason for t in trajectories).most_common()),
        tool_calls=dict(Counter(call.name for call in calls).most_common()),
        tool_errors=dict(Counter(call.name for call in calls if not call.ok).most_common()),
        unparsed_tool_calls=sum(len(step.parse_errors) for t in trajectories for step in t.steps),
        evaluations=dict(Counter(e["op"] for t in trajectories for e in t.evaluations).most_common()),
        prompt_tokens=sum(t.tokens.get("prompt", 0) for t in trajectories),
        completion_tokens=sum(t.tokens.get("completion", 0) for t in trajectories),
        env_overhead_s_median=statistics.median(overheads) if overheads else None,
    )
