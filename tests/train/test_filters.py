"""RFT's filter on real keypad episodes (recorded through the agent loop with replayed turns):
the reward threshold, invalid tool calls, and loops."""

from __future__ import annotations

import asyncio

import pytest

from cuda_agent.agent.policies.replay_policy import ReplayPolicy
from cuda_agent.train.config import RFTFilterConfig, TrainConfigError
from cuda_agent.train.filters import decide, filter_trajectories, invalid_calls
from cuda_agent.train.rewards import harness_failure

from keypad_support import keypad_environment, press


def episode(*turns):
    environment = keypad_environment()
    return asyncio.run(environment.episode(environment.tasks[0], ReplayPolicy(list(turns)), "e", 0))


def call(name: str, content: str = "", **arguments) -> dict:
    return {"content": content, "tool_calls": [{"function": {"name": name, "arguments": arguments}}]}


def test_rewards_of_keypad_episodes():
    assert episode(press("7")).reward == 3
    assert episode(press("1"), press("7")).reward == 2
    assert episode(press("1"), press("2"), press("7")).reward == 1
    assert episode(press("1"), press("2"), press("3")).reward == -1


def test_filter_keeps_positive_rewards_by_default():
    config = RFTFilterConfig()
    assert decide(episode(press("7")), config).kept
    assert decide(episode(press("1"), press("2"), press("7")), config).kept  # reward 1 > 0 (the paper's rule)
    low = decide(episode(press("1"), press("2"), press("3")), config)
    assert not low.kept and low.reasons == ("low_reward",)
    strict = decide(episode(press("1"), press("2"), press("7")), RFTFilterConfig(min_reward=2))
    assert not strict.kept and strict.reasons == ("low_reward",)


def test_harness_failures_are_dropped_whatever_the_threshold():
    trajectory = episode(press("7"))
    trajectory.final = {**trajectory.final, "verdict": {"status": "task_error"}}
    assert harness_failure(trajectory) == "final verdict task_error"
    decision = decide(trajectory, RFTFilterConfig(min_reward=-1))
    assert not decision.kept and decision.reasons == ("harness_error",)
    trajectory.final = {**trajectory.final, "reward": None, "verdict": None}
    assert harness_failure(trajectory) == "no verdict on the final workdir"
    assert harness_failure(episode(press("1"), press("2"), press("3"))) is None  # a real -1


def test_unknown_tool_and_schema_violations_are_invalid_calls():
    unknown = episode(call("jump", key="7"), press("7"))
    assert unknown.reward == 2 and decide(unknown, RFTFilterConfig()).reasons == ("invalid_tool_call",)
    assert invalid_calls(unknown) == ["unknown tool 'jump'"]
    wrong_argument = episode(call("press", button="7"), press("7"))
    assert decide(wrong_argument, RFTFilterConfig()).reasons == ("invalid_tool_call",)
    assert "unknown ['button']" in invalid_calls(wrong_argument)[0]
    assert decide(unknown, RFTFilterConfig(drop_invalid_calls=False)).kept


def test_a_call_that_ran_and_failed_is_not_invalid():
    trajectory = episode(press("x"), press("7"))  # a schema-valid call the tool refused
    assert trajectory.steps[0].tool_calls[0].ok is False
    assert decide(trajectory, RFTFilterConfig()).kept


def test_unparsed_tool_call_blocks_are_invalid():
    trajectory = episode(press("7"))
    trajectory.steps[0].parse_errors = ["tool call 2 is not valid JSON"]
    assert decide(trajectory, RFTFilterConfig()).reasons == ("invalid_tool_call",)


def test_loops_repeated_calls_and_repeated_messages():
    config = RFTFilterConfig(min_reward=-1, max_repeats=3)
    same_calls = episode(press("1"), press("1"), press("1"))
    assert decide(same_calls, config).reasons == ("repeated_tool_calls", "repeated_message")
    native = episode(call("press", "", key="1"), call("press", "", key="1"), call("press", "", key="1"))
    assert decide(native, config).reasons == ("repeated_tool_calls",)  # empty text is never a repeat
    assert decide(same_calls, RFTFilterConfig(min_reward=-1, max_repeats=4)).kept
    two_in_a_row = episode(press("1"), press("1"), press("2"))
    assert decide(two_in_a_row, config).kept
    same_text = episode(call("press", "let me try", key="1"), call("press", "let me try", key="2"),
                        call("press", "let me try", key="3"))
    assert decide(same_text, config).reasons == ("repeated_message",)


def test_filter_report_counts_reasons():
    kept, report = filter_trajectories([episode(press("7")), episode(press("1"), press("2"), press("3"))],
                                       RFTFilterConfig())
    assert len(kept) == 1
    assert report.to_dict() == {"seen": 2, "kept": 1, "dropped": {"low_reward": 1},
                                "reward_histogram": {"-1": 1, "3": 1}}


def test_filter_config_is_validated():
    with pytest.raises(TrainConfigError, match="max_repeats must be >= 2"):
        RFTFilterConfig(max_repeats=1)
    with pytest.raises(TrainConfigError, match="min_reward must be -1, 1, 2 or 3"):
        RFTFilterConfig(min_reward=0)
