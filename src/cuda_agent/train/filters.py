"""Rejection fine-tuning's filter: which trajectories are worth imitating.

A trajectory is kept when all of these hold:

- **a verdict**: its final scoring reached a verdict about the candidate (not a harness failure);
- **reward**: its final reward (the trusted evaluator's) is at least ``min_reward``;
- **no invalid tool call** (with ``drop_invalid_calls``): every call names a tool the episode
  offered, with arguments that parse as a JSON object matching that tool's schema (the check the
  agent's ``ToolBox`` applies), and no ``<tool_call>`` block failed to parse;
- **no loop**: no ``max_repeats`` consecutive assistant turns make the same tool calls (names and
  arguments, compared as parsed JSON), and no ``max_repeats`` consecutive assistant messages have
  the same non-empty text.

A call that ran and failed (a build error, a missing file) is not invalid: fixing such failures is
what good trajectories show.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cuda_agent.agent.base import ToolError
from cuda_agent.agent.tools import check_arguments
from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.train.config import RFTFilterConfig
from cuda_agent.train.rewards import harness_failure


@dataclass(frozen=True)
class FilterDecision:
    kept: bool
    reasons: tuple[str, ...]
    """Why it was dropped: ``harness_error`` (no verdict on its outcome), ``low_reward``,
    ``invalid_tool_call``, ``repeated_tool_calls``, ``repeated_message`` (and, counted by RFT
    after filtering, ``too_long``)."""
    detail: str = ""


def invalid_calls(trajectory: Trajectory) -> list[str]:
    """Descriptions of the trajectory's invalid tool calls and unparsed ``<tool_call>`` blocks."""
    schemas = {tool["function"]["name"]: tool["function"].get("parameters") or {} for tool in trajectory.tools}
    problems = [f"turn {step.turn}: {error}" for step in trajectory.steps for error in step.parse_errors]
    calls = [call for m in trajectory.messages if m["role"] == "assistant" for call in m.get("tool_calls") or []]
    for call in calls:
        name = call["function"]["name"]
        if name not in schemas:
            problems.append(f"unknown tool {name!r}")
            continue
        try:
            check_arguments(schemas[name], json.loads(call["function"].get("arguments") or "{}"), name)
        except json.JSONDecodeError as exc:
            problems.append(f"{name}: arguments are not JSON ({exc.msg})")
        except ToolError as exc:
            problems.append(f"{name}: {exc}")
    return problems


def _call_signature(message: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    signature = []
    for call in message.get("tool_calls") or []:
        raw = call["function"].get("arguments") or "{}"
        try:
            canonical = json.dumps(json.loads(raw), sort_keys=True)
        except json.JSONDecodeError:
            canonical = raw
        signature.append((call["function"]["name"], canonical))
    return tuple(signature)


def _longest_run(items: list[Any]) -> int:
    """Length of the longest run of equal, truthy consecutive items."""
    longest = run = 0
    for index, item in enumerate(items):
        run = run + 1 if index and item and item == items[index - 1] else (1 if item else 0)
        longest = max(longest, run)
    return longest


def decide(trajectory: Trajectory, config: RFTFilterConfig) -> FilterDecision:
    """Whether RFT keeps ``trajectory``, and why not."""
    reasons: list[str] = []
    details: list[str] = []
    failure = harness_failure(trajectory)
    if failure is not None:
        reasons.append("harness_error")
        details.append(failure)
    elif trajectory.reward < config.min_reward:
        reasons.append("low_reward")
        details.append(f"reward {trajectory.reward} < {config.min_reward}")
    if config.drop_invalid_calls:
        problems = invalid_calls(trajectory)
        if problems:
            reasons.append("invalid_tool_call")
            details.append(problems[0])
    assistant = [m for m in trajectory.messages if m["role"] == "assistant"]
    if _longest_run([_call_signature(m) for m in assistant]) >= config.max_repeats:
        reasons.append("repeated_tool_calls")
    if _longest_run([(m.get("content") or "").strip() for m in assistant]) >= config.max_repeats:
        reasons.append("repeated_message")
    return FilterDecision(not reasons, tuple(reasons), "; ".join(details))


@dataclass
class FilterReport:
    """Counts of a filtering pass (written to ``rft/filter.json``)."""

    seen: int = 0
    kept: int = 0
    reasons: Counter = field(default_factory=Counter)
    reward_histogram: Counter = field(default_factory=Counter)

    def add(self, trajectory: Trajectory, decision: FilterDecision) -> None:
        self.seen += 1
        self.kept += decision.kept
        self.reasons.update(decision.reasons)
        self.reward_histogram[trajectory.reward] += 1

    def drop(self, reason: str) -> None:
        """Drop a trajectory the filter had kept, for ``reason`` (a check made after filtering)."""
        self.kept -= 1
        self.reasons[reason] += 1

    def to_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "kept": self.kept, "dropped": dict(self.reasons),
                "reward_histogram": {str(k): v for k, v in sorted(self.reward_histogram.items())}}


def filter_trajectories(trajectories: list[Trajectory], config: RFTFilterConfig) -> tuple[list[Trajectory], FilterReport]:
    report = FilterReport()
    kept = []
    for trajectory in trajectories:
        decision = decide(trajectory, config)
        report.add(trajectory, decision)
        if decision.kept:
            kept.append(trajectory)
    return kept, report
