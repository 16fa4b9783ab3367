"""Fitting a long history into the policy's context window.

The system prompt and the task (the first two messages) and the latest ``keep_turns`` turns are
always kept whole. When the history does not fit, older tool outputs are elided first (oldest
first, each replaced by a marker saying how much was cut); if that is not enough, the oldest turns
are dropped whole (assistant message and its tool results together, so every tool call keeps its
result) behind one marker message. The trajectory keeps the full history and, per step, the
:class:`ContextView` that was applied, so what the policy saw can be rebuilt exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from cuda_agent.agent.config import ContextConfig

HEAD_MESSAGES = 2
"""System prompt and task."""


@dataclass(frozen=True)
class ContextView:
    """Which messages were changed for one policy call (indices into the full history)."""

    elided: tuple[int, ...] = ()
    """Tool messages whose content was replaced by a marker."""
    dropped: tuple[int, int] | None = None
    """``[start, end)`` of whole turns removed, replaced by one marker message."""

    def to_dict(self) -> dict[str, Any]:
        return {"elided": list(self.elided), "dropped": list(self.dropped) if self.dropped else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContextView:
        dropped = data.get("dropped")
        return cls(tuple(data.get("elided") or ()), tuple(dropped) if dropped else None)


def estimate_tokens(message: dict[str, Any]) -> int:
    """A tokenizer-free estimate (about 3.5 characters per token, plus per-message overhead)."""
    text = str(message.get("content") or "") + json.dumps(message.get("tool_calls") or "")
    return int(len(text) / 3.5) + 8


def elision_marker(message: dict[str, Any]) -> str:
    return f"[tool output elided to fit the context window: {len(str(message.get('content') or ''))} characters]"


def drop_marker(turns: int) -> dict[str, Any]:
    return {"role": "user", "content": f"[{turns} earlier turn(s) removed to fit the context window; their effects "
                                       "are in the workdir]"}


def turn_starts(messages: list[dict[str, Any]]) -> list[int]:
    """Indices of the assistant messages after the head: each starts a turn."""
    return [i for i in range(HEAD_MESSAGES, len(messages)) if messages[i]["role"] == "assistant"]


def plan_view(messages: list[dict[str, Any]], config: ContextConfig,
              count: Callable[[dict[str, Any]], int] = estimate_tokens) -> ContextView | None:
    """The view that fits ``messages`` into ``window_tokens - reply_tokens``, or ``None`` if all fit."""
    budget = config.window_tokens - config.reply_tokens
    sizes = [count(m) for m in messages]
    total = sum(sizes)
    if total <= budget:
        return None
    starts = turn_starts(messages)
    protected_from = starts[-config.keep_turns] if len(starts) >= config.keep_turns else HEAD_MESSAGES
    elided = []
    for index in range(HEAD_MESSAGES, protected_from):
        if total <= budget:
            break
        if messages[index]["role"] == "tool":
            saved = sizes[index] - count({"role": "tool", "content": elision_marker(messages[index])})
            if saved > 0:
                elided.append(index)
                total -= saved
    dropped_end = None
    for start in [s for s in starts if s <= protected_from][1:]:
        if total <= budget:
            break
        dropped_end = start
        removed = range(HEAD_MESSAGES, start)
        total = sum(sizes) - sum(sizes[i] for i in removed) + count(drop_marker(1)) \
            - sum(sizes[i] - count({"role": "tool", "content": elision_marker(messages[i])})
                  for i in elided if i >= start)
    return ContextView(tuple(i for i in elided if dropped_end is None or i >= dropped_end),
                       (HEAD_MESSAGES, dropped_end) if dropped_end else None)


def apply_view(messages: list[dict[str, Any]], view: ContextView | None) -> list[dict[str, Any]]:
    """The messages the policy sees under ``view`` (the full history when ``None``)."""
    if view is None:
        return list(messages)
    out = []
    elided = set(view.elided)
    for index, message in enumerate(messages):
        if view.dropped and view.dropped[0] <= index < view.dropped[1]:
            if index == view.dropped[0]:
                out.append(drop_marker(len([s for s in turn_starts(messages) if index <= s < view.dropped[1]])))
            continue
        out.append({**message, "content": elision_marker(message)} if index in elided else message)
    return out
