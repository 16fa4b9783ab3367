"""Context management: head and latest turns kept, old tool outputs elided, then old turns dropped."""

from __future__ import annotations

from cuda_agent.agent.config import ContextConfig
from cuda_agent.agent.context import ContextView, apply_view, estimate_tokens, plan_view


def _history(turns: int, output_chars: int) -> list[dict]:
    messages = [{"role": "system", "content": "system"}, {"role": "user", "content": "task"}]
    for n in range(turns):
        messages.append({"role": "assistant", "content": f"step {n}",
                         "tool_calls": [{"id": f"c{n}", "type": "function",
                                         "function": {"name": "bash", "arguments": "{}"}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "name": "bash", "content": "x" * output_chars})
    return messages


def _fits(messages, config) -> bool:
    return sum(estimate_tokens(m) for m in messages) <= config.window_tokens - config.reply_tokens


def test_history_that_fits_is_untouched():
    messages = _history(3, 100)
    assert plan_view(messages, ContextConfig()) is None and apply_view(messages, None) == messages


def test_old_tool_outputs_are_elided_first_keeping_head_and_latest_turns():
    config = ContextConfig(window_tokens=8192, reply_tokens=1024, keep_turns=2)
    messages = _history(6, 6000)
    view = plan_view(messages, config)
    assert view is not None and view.dropped is None
    seen = apply_view(messages, view)
    assert _fits(seen, config) and seen[:2] == messages[:2] and seen[-4:] == messages[-4:]
    assert all("elided to fit the context window: 6000 characters" in seen[i]["content"] for i in view.elided)
    assert [m.get("tool_call_id") for m in seen] == [m.get("tool_call_id") for m in messages]
    assert ContextView.from_dict(view.to_dict()) == view


def test_whole_old_turns_are_dropped_when_elision_is_not_enough():
    config = ContextConfig(window_tokens=2048, reply_tokens=512, keep_turns=2)
    messages = _history(40, 400)
    seen = apply_view(messages, plan_view(messages, config))
    assert _fits(seen, config) and seen[:2] == messages[:2] and seen[-4:] == messages[-4:]
    assert "earlier turn(s) removed" in seen[2]["content"]
    for index, message in enumerate(seen):  # every tool call still has its result right after it
        if message.get("tool_calls"):
            assert seen[index + 1]["tool_call_id"] == message["tool_calls"][0]["id"]
