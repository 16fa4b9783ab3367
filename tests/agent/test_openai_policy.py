"""The ``openai`` policy against a local OpenAI-compatible server speaking the real protocol over
HTTP on loopback, tool calls included (``tests/openai_server.py``)."""

from __future__ import annotations

import asyncio
import json

import pytest

from cuda_agent.agent.base import PolicyError
from cuda_agent.agent.evaluation import EvaluationQueue
from cuda_agent.agent.loop import run_episode
from cuda_agent.agent.policies.openai_policy import OpenAIPolicy
from cuda_agent.environment import load_task
from cuda_agent.llm import LLMConfig

from conftest import GUARD_FAILING_MODEL_NEW
from openai_server import Conversation, OpenAITestServer, Reply
from support import EXAMPLES


def _policy(server, **settings) -> OpenAIPolicy:
    config = LLMConfig(base_url=server.base_url, model="kernel-model", api_key="test-key", backoff_s=0.01,
                       max_backoff_s=0.05, timeout_s=5.0, **settings)
    return OpenAIPolicy(config, settings.pop("tool_protocol", "native"))


def test_openai_policy_runs_an_episode_with_native_tool_calls(make_config, agent_config):
    conversation = Conversation([
        Reply("Let me look around.", (("bash", {"command": "ls"}), ("read_file", {"path": "model.py"}))),
        Reply("", (("write_file", {"path": "model_new.py", "content": GUARD_FAILING_MODEL_NEW}),)),
        Reply("Done.", (("finish", {"summary": "wrote a solution"}),)),
    ])
    with OpenAITestServer(conversation) as server:
        policy = _policy(server)

        async def episode():
            queue = EvaluationQueue(make_config(), 1)
            try:
                return await run_episode(load_task(EXAMPLES / "tasks" / "relu.py"), policy, agent_config, queue)
            finally:
                queue.close()
                await policy.aclose()

        trajectory = asyncio.run(episode())
    assert trajectory.end_reason == "finish" and trajectory.turns == 3
    first, second = server.requests[0]["body"], server.requests[1]["body"]
    assert first["model"] == "kernel-model" and first["tool_choice"] == "auto"
    assert sorted(t["function"]["name"] for t in first["tools"]) == [
        "bash", "edit_file", "finish", "glob", "grep", "read_file", "write_file"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert "SKILL" in first["messages"][0]["content"] and "class Model" in first["messages"][1]["content"]
    # The second request carries the first reply's calls and their results, paired by id.
    assistant, *results = second["messages"][2:]
    call_ids = [c["id"] for c in assistant["tool_calls"]]
    assert [r["role"] for r in results] == ["tool", "tool"] and [r["tool_call_id"] for r in results] == call_ids
    assert "model_new.py" in results[0]["content"] and "class Model" in results[1]["content"]
    usage = [r["usage"] for r in server.responses]
    assert trajectory.tokens == {"prompt": sum(u["prompt_tokens"] for u in usage),
                                 "completion": sum(u["completion_tokens"] for u in usage)}
    assert trajectory.policy["model"] == "kernel-model" and trajectory.steps[0].finish_reason == "tool_calls"
    assert trajectory.reward == -1 and trajectory.final["verdict"]["status"] == "guard_violation"


def test_openai_policy_text_protocol_parses_calls_from_content():
    text = ('I will build.\n<tool_call>\n{"name": "bash", "arguments": {"command": "./build"}}\n</tool_call>\n'
            '<tool_call>{"name": broken}</tool_call>')
    with OpenAITestServer(Conversation([Reply(text)])) as server:
        policy = OpenAIPolicy(LLMConfig(base_url=server.base_url, model="m", api_key="test-key"), "text")
        tools = [{"type": "function", "function": {"name": "bash", "description": "d", "parameters": {}}}]
        reply = asyncio.run(policy.act([{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}],
                                       tools, "episode-1"))
    body = server.requests[0]["body"]
    assert "tools" not in body and "<tool_call>" in body["messages"][0]["content"]
    (call,) = reply.message["tool_calls"]
    assert call["function"]["name"] == "bash" and json.loads(call["function"]["arguments"]) == {"command": "./build"}
    assert reply.message["content"] == text and len(reply.parse_errors) == 1 and "not valid JSON" in reply.parse_errors[0]


def test_openai_policy_turns_endpoint_failure_into_policy_error():
    with OpenAITestServer(lambda number, body: Reply.error(500, "server_error", retry_after_s=0)) as server:
        policy = _policy(server, max_retries=1)
        with pytest.raises(PolicyError, match=r"failed 2 times.*HTTP 500"):
            asyncio.run(policy.act([{"role": "user", "content": "hi"}], [], "e"))
    assert len(server.requests) == 2
