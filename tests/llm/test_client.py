"""The shared chat client (openai package) against the local test server: tool calls and headers.
Retries, backoff and the usage log are covered through the synth composer (tests/synth)."""

from __future__ import annotations

from cuda_agent.llm import ChatClient, LLMConfig

from openai_server import Conversation, OpenAITestServer, Reply


def test_client_parses_tool_calls_and_usage():
    script = Conversation([Reply("calling", (("bash", {"command": "ls"}),))])
    with OpenAITestServer(script) as server:
        reply = ChatClient(LLMConfig(base_url=server.base_url, model="m", api_key="test-key")).complete(
            [{"role": "user", "content": "hi"}], tools=[{"type": "function", "function": {"name": "bash"}}])
    assert reply.finish_reason == "tool_calls" and reply.content == "calling"
    (call,) = reply.tool_calls
    assert call.name == "bash" and call.arguments == '{"command": "ls"}'
    assert reply.to_message()["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"command": "ls"}'}
    assert reply.prompt_tokens == server.responses[0]["usage"]["prompt_tokens"]


def test_client_without_api_key_sends_no_authorization_header():
    with OpenAITestServer(Conversation([Reply("hi")]), api_key=None) as server:
        ChatClient(LLMConfig(base_url=server.base_url, model="m")).complete([{"role": "user", "content": "x"}])
    (request,) = server.requests
    assert "Authorization" not in request["headers"] and request["body"]["model"] == "m"
