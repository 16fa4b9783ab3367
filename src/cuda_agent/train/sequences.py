"""Token rows: what the losses see of an episode, and how rows become padded tensors.

A row is one token sequence and a same-length 0/1 ``policy_mask`` (1 on tokens the policy
generated). An ``hf`` episode becomes rows from the exact ids each step recorded: while a turn's
prompt extends the row built so far (the chat template renders the history prefix-stably and the
context window dropped nothing), the turn joins that row, its new prompt tokens (tool output,
reminders, template) with mask 0 and its completion with mask 1; otherwise it starts a new row.
So a typical episode is one row and every token's log-probability is taken in exactly the context
the policy saw. A trajectory without ids (an ``openai`` or replayed episode) is re-tokenised with
:func:`cuda_agent.agent.masks.token_masks`.

Rows are trained on in "action" coordinates: position ``t`` predicts token ``t + 1``, so a row of
``L`` tokens has ``L - 1`` positions and ``action_mask[t] = policy_mask[t + 1]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from cuda_agent.agent.masks import MaskError, token_masks
from cuda_agent.agent.trajectory import Trajectory
from cuda_agent.train import algorithms


@dataclass(frozen=True)
class TokenRow:
    """One training sequence of one episode."""

    episode: int
    """Index of the episode (in its batch) the row belongs to."""
    ids: tuple[int, ...]
    policy_mask: tuple[int, ...]
    """1 where the policy generated the token, else 0; as long as ``ids``."""

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.policy_mask):
            raise ValueError(f"row of episode {self.episode}: {len(self.ids)} ids but {len(self.policy_mask)} mask values")

    @property
    def policy_tokens(self) -> int:
        return sum(self.policy_mask)


def rows_from_steps(trajectory: Trajectory, episode: int) -> list[TokenRow]:
    """The rows of an episode whose steps carry ``prompt_token_ids``/``completion_token_ids``.

    Raises:
        ValueError: a step has no token ids.
    """
    rows: list[TokenRow] = []
    ids: list[int] = []
    mask: list[int] = []
    for step in trajectory.steps:
        if step.prompt_token_ids is None or step.completion_token_ids is None:
            raise ValueError(f"episode {trajectory.episode_id}: turn {step.turn} has no token ids")
        prompt = list(step.prompt_token_ids)
        if ids and len(prompt) >= len(ids) and prompt[: len(ids)] == ids:
            mask.extend([0] * (len(prompt) - len(ids)))
        else:
            if ids:
                rows.append(TokenRow(episode, tuple(ids), tuple(mask)))
            mask = [0] * len(prompt)
        ids = prompt + list(step.completion_token_ids)
        mask.extend([1] * len(step.completion_token_ids))
    if ids:
        rows.append(TokenRow(episode, tuple(ids), tuple(mask)))
    return rows


def trajectory_rows(trajectory: Trajectory, episode: int, tokenizer: Any) -> list[TokenRow]:
    """Rows from the stored token ids when every step has them, else from re-tokenising the
    conversation with ``tokenizer``'s chat template (the text tool protocol).

    Raises:
        MaskError: the trajectory has no ids and the template is not prefix-stable.
    """
    if trajectory.steps and all(s.prompt_token_ids is not None and s.completion_token_ids is not None
                                for s in trajectory.steps):
        return rows_from_steps(trajectory, episode)
    ids, mask = token_masks(trajectory.messages, trajectory.tools, tokenizer)
    return [TokenRow(episode, tuple(ids), tuple(mask))]


def generation_row(episode: int, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> TokenRow:
    """The row of a single-turn generation (warm-up): the prompt, then the completion."""
    return TokenRow(episode, tuple(prompt_ids) + tuple(completion_ids),
                    (0,) * len(prompt_ids) + (1,) * len(completion_ids))


@dataclass(frozen=True)
class PaddedRows:
    """Rows right-padded to one length, on a device."""

    input_ids: torch.Tensor
    """``[B, L]``."""
    attention_mask: torch.Tensor
    """``[B, L]``, 1 on real tokens."""
    action_mask: torch.Tensor
    """``[B, L - 1]`` float, 1 where the predicted token was the policy's."""

    @property
    def targets(self) -> torch.Tensor:
        """``[B, L - 1]``: the token each position predicts."""
        return self.input_ids[:, 1:]


def pad_rows(rows: Sequence[TokenRow], pad_id: int, device: torch.device) -> PaddedRows:
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    policy = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        ids[i, : len(row.ids)] = torch.tensor(row.ids)
        attention[i, : len(row.ids)] = 1
        policy[i, : len(row.ids)] = torch.tensor(row.policy_mask, dtype=torch.float32)
    return PaddedRows(ids.to(device), attention.to(device), policy[:, 1:].contiguous().to(device))


def micro_batches(lengths: Sequence[int], indices: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Split ``indices`` (rows) into groups whose padded size ``len(group) * longest`` stays within
    ``max_tokens``, rows of similar length together (little padding); a row longer than
    ``max_tokens`` forms a group of its own."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in sorted(indices, key=lambda i: (lengths[i], i)):
        longest_with = max(longest, lengths[index])
        if current and longest_with * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, longest_with = [], lengths[index]
        current.append(index)
        longest = longest_with
    if current:
        groups.append(current)
    return groups


def episode_gae(rows: Sequence[TokenRow], values: Sequence[torch.Tensor], rewards: Sequence[float],
                gamma: float, lam: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """GAE over each episode's policy tokens in order, across all of its rows.

    Args:
        rows: the rows of every episode, an episode's rows in conversation order.
        values: per row, ``[len(ids) - 1]`` critic values in action coordinates.
        rewards: per episode (indexed by ``TokenRow.episode``), placed on its last policy token.

    Returns:
        Per row, advantages and returns ``[len(ids) - 1]`` (0 off the policy tokens).
    """
    chains: dict[int, list[tuple[int, torch.Tensor]]] = {}
    for index, row in enumerate(rows):
        positions = torch.nonzero(torch.tensor(row.policy_mask[1:])).flatten()
        chains.setdefault(row.episode, []).append((index, positions))
    episodes = sorted(chains)
    length = max([sum(len(p) for _, p in chains[e]) for e in episodes] + [1])
    packed_values = torch.zeros((len(episodes), length))
    packed_rewards = torch.zeros((len(episodes), length))
    packed_mask = torch.zeros((len(episodes), length))
    for slot, episode in enumerate(episodes):
        flat = torch.cat([values[i].float().cpu()[p] for i, p in chains[episode]])
        packed_values[slot, : len(flat)] = flat
        packed_mask[slot, : len(flat)] = 1
        if len(flat):
            packed_rewards[slot, len(flat) - 1] = float(rewards[episode])
    advantages, returns = algorithms.gae(packed_rewards, packed_values, packed_mask, gamma, lam)
    row_advantages = [torch.zeros(len(r.ids) - 1) for r in rows]
    row_returns = [torch.zeros(len(r.ids) - 1) for r in rows]
    for slot, episode in enumerate(episodes):
        start = 0
        for index, positions in chains[episode]:
            row_advantages[index][positions] = advantages[slot, start: start + len(positions)]
            row_returns[index][positions] = returns[slot, start: start + len(positions)]
            start += len(positions)
    return row_advantages, row_returns


__all__ = ["MaskError", "PaddedRows", "TokenRow", "episode_gae", "generation_row", "micro_batches", "pad_rows",
           "rows_from_steps", "trajectory_rows"]
