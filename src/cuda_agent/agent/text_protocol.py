"""Tool calling for models without native tool calls: a text format, its parser and renderer.

The model is told (in the system prompt) to write each call as a JSON object between
``<tool_call>`` and ``</tool_call>`` (the convention many open chat models are trained on); tool
results come back in a user message as ``<tool_response name="...">`` blocks. The assistant's raw
text stays the message ``content`` (so the tokens it generated are exactly what is stored), and the
parsed calls go into ``tool_calls`` like native ones. :func:`render_for_text_model` turns a history
into plain system/user/assistant messages any chat template accepts.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Sequence

from cuda_agent.agent.base import PolicyReply

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)


def tool_instructions(tools: list[dict[str, Any]]) -> str:
    """How to call ``tools`` (OpenAI function schemas) in text; appended to the system prompt."""
    schemas = "\n".join(json.dumps(tool["function"]) for tool in tools)
    return (
        "# Tools\n"
        f"To call a tool, write a JSON object with its name and arguments between {OPEN} and {CLOSE}, e.g.\n"
        f'{OPEN}\n{{"name": "bash", "arguments": {{"command": "./build"}}}}\n{CLOSE}\n'
        "You may make several calls in one reply; their results come back in <tool_response> blocks. "
        "Available tools (JSON schemas):\n" + schemas
    )


def parse_tool_calls(text: str, id_prefix: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The ``<tool_call>`` blocks of ``text`` as chat-completions tool calls, and why any failed.

    Args:
        id_prefix: call ids are ``<id_prefix>_<k>``; make it unique within the episode.
    """
    calls, errors = [], []
    for number, match in enumerate(_CALL.finditer(text)):
        body = match.group(1).strip()
        if not match.group(0).endswith(CLOSE):
            errors.append(f"tool call {number + 1} has no closing {CLOSE}")
            continue
        try:
            data = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call {number + 1} is not valid JSON ({exc.msg} at char {exc.pos}): {body[:200]}")
            continue
        name = data.get("name") if isinstance(data, dict) else None
        arguments = data.get("arguments", {}) if isinstance(data, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, (dict, str)):
            errors.append(f'tool call {number + 1} must be {{"name": "<tool>", "arguments": {{...}}}}: {body[:200]}')
            continue
        calls.append({"id": f"{id_prefix}_{number}", "type": "function",
                      "function": {"name": name,
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
    return calls, errors


def _call_text(call: dict[str, Any]) -> str:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"] or "{}")
    except json.JSONDecodeError:
        arguments = function["arguments"]
    return f"{OPEN}\n{json.dumps({'name': function['name'], 'arguments': arguments})}\n{CLOSE}"


def render_for_text_model(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as system/user/assistant messages with tool calls and results written as text."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "system":
            out.append({"role": "system", "content": f"{content}\n\n{tool_instructions(tools)}"})
        elif role == "assistant":
            calls = message.get("tool_calls") or []
            if calls and OPEN not in content:  # native calls (e.g. replayed from another policy)
                content = "\n".join([content, *map(_call_text, calls)]).strip()
            out.append({"role": "assistant", "content": content})
        elif role == "tool":
            block = f'<tool_response name="{message.get("name", "")}">\n{content}\n</tool_response>'
            if out and out[-1]["role"] == "user" and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": True})
        else:
            out.append({"role": role, "content": content})
    for message in out:
        message.pop("tool_results", None)
    return out


def reply_from_text(text: str, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                    finish_reason: str) -> PolicyReply:
    """The :class:`PolicyReply` of a locally generated turn: the raw text as the message content,
    its ``<tool_call>`` blocks parsed into ``tool_calls``, and the exact token ids kept."""
    calls, errors = parse_tool_calls(text, f"call_{uuid.uuid4().hex[:8]}")
    message = {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
    return PolicyReply(message, len(prompt_ids), len(completion_ids), finish_reason, tuple(errors),
                       tuple(prompt_ids), tuple(completion_ids))
