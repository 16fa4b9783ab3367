"""What the trainers leave out and how: RFT drops a trajectory too long to train on whole (never
cuts its ending), both trainers leave harness failures out of the update, and the verl adapter
ends the response at its last generated token (where verl puts the reward)."""

from __future__ import annotations

import asyncio

from transformers import AutoTokenizer

from cuda_agent.agent.policies.replay_policy import ReplayPolicy
from cuda_agent.agent.trajectory import read_trajectories
from cuda_agent.train.config import RFTFilterConfig
from cuda_agent.train.filters import filter_trajectories
from cuda_agent.train.sequences import trajectory_rows
from cuda_agent.train.stages.ppo import episode_rewards, verdict_wait_share
from cuda_agent.train.stages.rft import training_rows
from cuda_agent.train.verl.policy import fit_response

from keypad_support import keypad_environment, press


def test_rft_drops_trajectories_longer_than_max_seq_tokens_whole(keypad_model, keypad_demos):
    tokenizer = AutoTokenizer.from_pretrained(keypad_model)
    kept, report = filter_trajectories(list(read_trajectories(keypad_demos)), RFTFilterConfig(min_reward=-1, max_repeats=4))
    lengths = sorted(max(len(r.ids) for r in trajectory_rows(t, 0, tokenizer)) for t in kept)
    limit = lengths[len(lengths) // 2]
    fitting, rows = training_rows(kept, tokenizer, limit, report)
    too_long = sum(1 for length in lengths if length > limit)
    assert 0 < too_long < len(kept) and len(fitting) == len(kept) - too_long
    assert report.to_dict()["dropped"]["too_long"] == too_long and report.kept == len(fitting)
    whole = [row for i, t in enumerate(fitting) for row in trajectory_rows(t, i, tokenizer)]
    assert rows == [row for row in whole if row.policy_tokens > 0]  # uncut: every ending is there
    assert all(len(row.ids) <= limit for row in rows)


def test_harness_failures_get_no_reward_and_real_failures_keep_theirs():
    environment = keypad_environment()
    episodes = [asyncio.run(environment.episode(environment.tasks[0], ReplayPolicy(turns), f"e{i}", 0))
                for i, turns in enumerate([[press("7")], [press("1"), press("2"), press("3")], [press("7")]])]
    episodes[2].final = {**episodes[2].final, "verdict": {"status": "task_error"}}
    assert episode_rewards(episodes) == [3.0, -1.0, None]
    assert verdict_wait_share(episodes) >= 0.0


def test_verl_response_ends_at_the_last_generated_token_and_failures_are_masked_out():
    ids, mask, logprobs = [5, 6, 7, 8, 9, 10], [1, 1, 0, 0, 1, 0], [-0.1, -0.2, 0.0, 0.0, -0.3, 0.0]
    assert fit_response(ids, mask, logprobs, 16, exclude=False) == ([5, 6, 7, 8, 9], [1, 1, 0, 0, 1],
                                                                     [-0.1, -0.2, 0.0, 0.0, -0.3])
    assert fit_response(ids, mask, None, 4, exclude=False) == ([5, 6], [1, 1], None)  # cut, then trailing tool output
    assert fit_response(ids, mask, None, 4, exclude=True) == ([5, 6, 7, 8], [0, 0, 0, 0], None)
