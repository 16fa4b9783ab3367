"""Token rows: exact step ids joined into one row while each prompt extends the last, split where
it does not; policy masks cover exactly what the policy generated, tool output is masked out."""

from __future__ import annotations

import torch

from cuda_agent.agent.trajectory import Step
from cuda_agent.train.config import ModelConfig, RolloutConfig
from cuda_agent.train.models import ModelSet
from cuda_agent.train.rollout import collect_episodes, training_policy
from cuda_agent.train.sequences import micro_batches, pad_rows, rows_from_steps, trajectory_rows

from keypad_support import keypad_environment, make_trajectory


def _step(turn: int, prompt: list[int], completion: list[int]) -> Step:
    return Step(turn=turn, message_index=0, prompt_tokens=len(prompt), completion_tokens=len(completion),
                policy_s=0.0, prompt_token_ids=prompt, completion_token_ids=completion)


def test_rows_join_extending_prompts_and_split_where_the_context_was_trimmed():
    trajectory = make_trajectory([
        _step(0, [1, 2, 3], [4, 5]),
        _step(1, [1, 2, 3, 4, 5, 6, 7], [8]),      # extends: tool output 6, 7 joins with mask 0
        _step(2, [1, 9], [10, 11]),                # the history was trimmed: a new row
    ])
    first, second = rows_from_steps(trajectory, episode=4)
    assert first.ids == (1, 2, 3, 4, 5, 6, 7, 8) and first.policy_mask == (0, 0, 0, 1, 1, 0, 0, 1)
    assert second.ids == (1, 9, 10, 11) and second.policy_mask == (0, 0, 1, 1)
    assert first.episode == second.episode == 4


def test_a_prompt_that_retokenises_the_last_reply_differently_starts_a_new_row():
    trajectory = make_trajectory([_step(0, [1, 2], [3, 4]), _step(1, [1, 2, 34, 5], [6])])
    rows = rows_from_steps(trajectory, 0)
    assert [r.ids for r in rows] == [(1, 2, 3, 4), (1, 2, 34, 5, 6)]


def test_keypad_episode_rows_mask_exactly_the_generated_tokens(warm_keypad):
    models = ModelSet(ModelConfig(device="cpu"), warm_keypad.actor)
    environment = keypad_environment()
    policy = training_policy(models, RolloutConfig(max_new_tokens=8, temperature=1.0))
    torch.manual_seed(0)
    episodes = collect_episodes(environment, policy, [(environment.tasks[0], s) for s in range(4)], 4, "t")
    assert len(episodes.trajectories) == 4 and not episodes.failures
    tokenizer = models.tokenizer
    for index, trajectory in enumerate(episodes.trajectories):
        rows = trajectory_rows(trajectory, index, tokenizer)
        generated = [token for step in trajectory.steps for token in step.completion_token_ids]
        assert [t for row in rows for t, m in zip(row.ids, row.policy_mask) if m] == generated
        unmasked = "".join(tokenizer.decode([t for t, m in zip(row.ids, row.policy_mask) if not m]) for row in rows)
        last_turn = trajectory.steps[-1].message_index  # tool output after the last turn is in no prompt
        for message in trajectory.messages[:last_turn]:
            if message["role"] == "tool":
                assert message["content"] in unmasked
        if trajectory.turns > 1:  # a canonical policy's turns join into one row per episode
            assert len(rows) == 1


def test_micro_batches_respect_the_token_budget_and_keep_every_row():
    lengths = [5, 50, 7, 30, 200, 6]
    groups = micro_batches(lengths, range(6), max_tokens=64)
    assert sorted(i for g in groups for i in g) == list(range(6))
    assert all(len(g) * max(lengths[i] for i in g) <= 64 or len(g) == 1 for g in groups)
    assert [4] in groups


def test_pad_rows_shifts_the_policy_mask_to_action_positions():
    from cuda_agent.train.sequences import TokenRow

    padded = pad_rows([TokenRow(0, (1, 2, 3), (0, 1, 1)), TokenRow(1, (4, 5), (0, 1))], pad_id=0,
                      device=torch.device("cpu"))
    assert padded.input_ids.tolist() == [[1, 2, 3], [4, 5, 0]]
    assert padded.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert padded.action_mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
