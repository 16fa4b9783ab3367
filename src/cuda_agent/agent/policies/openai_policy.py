"""Any OpenAI-compatible chat endpoint (hosted APIs, vLLM, SGLang) as a policy.

Requests go through the shared client (:mod:`cuda_agent.llm`: retries with backoff, usage log);
calls run in a thread pool of ``concurrency`` workers so that many episodes wait on the endpoint
at once. ``tool_protocol="native"`` sends the tool schemas and reads ``message.tool_calls``;
``"text"`` is for models served without tool calling: tools are described in the system prompt
and calls parsed from the reply (:mod:`cuda_agent.agent.text_protocol`).
"""

from __future__ import annotations

import asyncio
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from cuda_agent.agent.base import Policy, PolicyError, PolicyReply
from cuda_agent.agent.text_protocol import parse_tool_calls, render_for_text_model
from cuda_agent.llm import ChatClient, LLMConfig, LLMError, UsageLog

TOOL_PROTOCOLS = ("native", "text")
_WIRE_KEYS = {"system": ("role", "content"), "user": ("role", "content"),
              "assistant": ("role", "content", "tool_calls"), "tool": ("role", "content", "tool_call_id")}


class OpenAIPolicy(Policy):
    name = "openai"

    def __init__(self, config: LLMConfig, tool_protocol: str = "native", usage: UsageLog | None = None) -> None:
        if tool_protocol not in TOOL_PROTOCOLS:
            raise ValueError(f"tool_protocol must be one of {TOOL_PROTOCOLS}, got {tool_protocol!r}")
        self.config, self.tool_protocol = config, tool_protocol
        self.client = ChatClient(config, usage)
        self._pool = ThreadPoolExecutor(config.concurrency, thread_name_prefix="openai-policy")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.config.model, "base_url": self.config.base_url,
                "temperature": self.config.temperature, "max_tokens": self.config.max_tokens,
                "tool_protocol": self.tool_protocol}

    async def act(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], episode_id: str) -> PolicyReply:
        native = self.tool_protocol == "native"
        wire = [{k: m[k] for k in _WIRE_KEYS[m["role"]] if k in m} for m in messages] if native \
            else render_for_text_model(messages, tools)
        request = partial(self.client.complete, wire, tools=tools if native else None, tag=episode_id)
        try:
            reply = await asyncio.get_running_loop().run_in_executor(self._pool, request)
        except LLMError as exc:
            raise PolicyError(str(exc)) from None
        message, errors = reply.to_message(), ()
        if not native:
            calls, errors = parse_tool_calls(reply.content, f"call_{uuid.uuid4().hex[:8]}")
            message = {"role": "assistant", "content": reply.content, **({"tool_calls": calls} if calls else {})}
        return PolicyReply(message, reply.prompt_tokens, reply.completion_tokens, reply.finish_reason, tuple(errors))

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()
