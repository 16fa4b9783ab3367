"""The text tool-call protocol: parsing replies and rendering histories for plain chat templates."""

from __future__ import annotations

import json

from cuda_agent.agent.text_protocol import parse_tool_calls, render_for_text_model

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run", "parameters": {}}}]


def test_parse_tool_calls_reads_blocks_and_reports_broken_ones():
    text = ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call> then '
            '<tool_call>{"name": "finish"}</tool_call><tool_call>{"arguments": {}}</tool_call><tool_call>{"name"')
    calls, errors = parse_tool_calls(text, "t")
    assert [c["function"]["name"] for c in calls] == ["bash", "finish"] and calls[1]["id"] == "t_1"
    assert json.loads(calls[0]["function"]["arguments"]) == {"command": "ls"}
    assert "must be" in errors[0] and "no closing" in errors[1]


def test_render_writes_native_calls_and_results_as_text():
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
                {"role": "assistant", "content": "go", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
                {"role": "tool", "tool_call_id": "a", "name": "bash", "content": "out1"},
                {"role": "tool", "tool_call_id": "b", "name": "bash", "content": "out2"}]
    rendered = render_for_text_model(messages, TOOLS)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert '"name": "bash"' in rendered[0]["content"] and "<tool_call>" in rendered[2]["content"]
    assert rendered[3]["content"].count("<tool_response") == 2 and "out2" in rendered[3]["content"]
    assert parse_tool_calls(rendered[2]["content"], "x")[0][0]["function"]["arguments"] == '{"command": "ls"}'
