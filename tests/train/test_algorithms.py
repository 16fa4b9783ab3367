"""GAE and the PPO losses against values computed by hand, tool-output positions included."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.train import algorithms
from cuda_agent.train.sequences import TokenRow, episode_gae


def t(*values: float) -> torch.Tensor:
    return torch.tensor([list(values)], dtype=torch.float64)


def test_gae_skips_tool_tokens_and_matches_hand_computation():
    # policy, policy, tool, tool, policy, policy; reward 2 on the last token; gamma 1, lambda 0.5
    mask = t(1, 1, 0, 0, 1, 1)
    values = t(0.5, 0.2, 9.0, 9.0, 0.4, 0.1)  # the 9s sit on tool tokens and must be ignored
    rewards = t(0, 0, 0, 0, 0, 2)
    advantages, returns = algorithms.gae(rewards, values, mask, gamma=1.0, lam=0.5)
    # delta5 = 2 - 0.1 = 1.9; A5 = 1.9
    # delta4 = 0.1 - 0.4 = -0.3; A4 = -0.3 + 0.5 * 1.9 = 0.65
    # delta1 = 0.4 - 0.2 = 0.2 (the next policy value, across the tool tokens); A1 = 0.2 + 0.5 * 0.65 = 0.525
    # delta0 = 0.2 - 0.5 = -0.3; A0 = -0.3 + 0.5 * 0.525 = -0.0375
    assert advantages[0].tolist() == pytest.approx([-0.0375, 0.525, 0, 0, 0.65, 1.9])
    assert returns[0].tolist() == pytest.approx([0.4625, 0.725, 0, 0, 1.05, 2.0])


def test_gae_discounts_per_policy_token_not_per_tool_token():
    # gamma 0.5, lambda 1: A0 is the discounted return 0.5 * 4 minus V0, whatever sits between
    advantages, returns = algorithms.gae(t(0, 0, 0, 4), t(1, 7, 7, 2), t(1, 0, 0, 1), gamma=0.5, lam=1.0)
    assert advantages[0].tolist() == pytest.approx([1.0, 0, 0, 2.0])
    assert returns[0].tolist() == pytest.approx([2.0, 0, 0, 4.0])


def test_episode_gae_chains_an_episode_across_its_rows():
    one = [TokenRow(0, (1, 2, 3, 4, 5, 6, 7), (0, 1, 1, 0, 0, 1, 1))]
    split = [TokenRow(0, (1, 2, 3), (0, 1, 1)), TokenRow(0, (1, 2, 3, 9, 9, 6, 7), (0, 0, 0, 0, 0, 1, 1))]
    whole_values = [torch.tensor([0.5, 0.2, 0.0, 0.0, 0.4, 0.1])]
    split_values = [torch.tensor([0.5, 0.2]), torch.tensor([0.0, 0.0, 0.0, 0.0, 0.4, 0.1])]
    whole_adv, _ = episode_gae(one, whole_values, [2.0], gamma=1.0, lam=0.5)
    split_adv, split_ret = episode_gae(split, split_values, [2.0], gamma=1.0, lam=0.5)
    assert whole_adv[0].tolist() == pytest.approx([-0.0375, 0.525, 0, 0, 0.65, 1.9])
    assert split_adv[0].tolist() == pytest.approx([-0.0375, 0.525])
    assert split_adv[1].tolist() == pytest.approx([0, 0, 0, 0, 0.65, 1.9])
    assert split_ret[1].tolist() == pytest.approx([0, 0, 0, 0, 1.05, 2.0])


def test_policy_loss_clips_asymmetrically_and_ignores_masked_tokens():
    ratios = t(1.5, 0.5, 1.1, 2.0, 0.7, 1.25)
    advantages = t(1, 1, -1, -1, -1, 1)
    mask = t(1, 1, 1, 0, 1, 1)
    old = torch.zeros_like(ratios)
    loss, stats = algorithms.policy_loss(torch.log(ratios), old, advantages, mask, clip_low=0.2, clip_high=0.28)
    # 1.5, A=+1: max(-1.5, -1.28) = -1.28 (clipped at 1 + 0.28)
    # 0.5, A=+1: max(-0.5, -0.8) = -0.5
    # 1.1, A=-1: 1.1 (inside the range)
    # 2.0: masked out
    # 0.7, A=-1: max(0.7, 0.8) = 0.8 (clipped at 1 - 0.2)
    # 1.25, A=+1: -1.25 (inside the asymmetric range; a symmetric 0.2 clip would give -1.2)
    assert float(loss) == pytest.approx((-1.28 - 0.5 + 1.1 + 0.8 - 1.25) / 5)
    assert float(stats["clip_fraction"]) == pytest.approx(2 / 5)
    assert float(stats["ratio_max"]) == pytest.approx(1.5)


def test_policy_loss_gradient_is_zero_where_clipped_or_masked():
    log_ratio = torch.log(t(1.5, 0.9, 2.0)).requires_grad_(True)
    loss, _ = algorithms.policy_loss(log_ratio, torch.zeros_like(log_ratio), t(1, 1, 1), t(1, 1, 0), 0.2, 0.28)
    loss.backward()
    # d/dlog(r) of -A*r / 2 tokens at r = 0.9 is -0.45; clipped (1.5) and masked (2.0) give 0
    assert log_ratio.grad[0].tolist() == pytest.approx([0.0, -0.45, 0.0])


def test_value_loss_clipped_and_unclipped():
    values, old, returns, mask = t(1.0, 2.0, 5.0), t(0.5, 2.0, 0.0), t(2.0, 1.0, 0.0), t(1, 1, 0)
    plain, _ = algorithms.value_loss(values, old, returns, mask, clip=0.0)
    assert float(plain) == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    clipped, stats = algorithms.value_loss(values, old, returns, mask, clip=0.2)
    # token 0: clipped prediction 0.5 + 0.2 = 0.7, error 1.69 > 1
    assert float(clipped) == pytest.approx(0.5 * (1.69 + 1.0) / 2)
    assert float(stats["clip_fraction"]) == pytest.approx(0.5)


def test_kl_estimators():
    log_probs, ref = t(-1.0, -0.5), t(-2.0, -0.5)
    assert algorithms.kl_penalty(log_probs, ref, "k1")[0].tolist() == pytest.approx([1.0, 0.0])
    assert algorithms.kl_penalty(log_probs, ref, "k3")[0].tolist() == pytest.approx([torch.e ** -1, 0.0])
    with pytest.raises(ValueError, match="k1, k3"):
        algorithms.kl_penalty(log_probs, ref, "k2")


def test_token_count_makes_micro_batches_add_up_to_the_whole_batch():
    torch.manual_seed(0)
    log_probs = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    old, advantages = torch.randn(4, 5, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]], dtype=torch.float64)
    whole, _ = algorithms.policy_loss(log_probs, old, advantages, mask, 0.2, 0.28)
    count = float(mask.sum())
    parts = [algorithms.policy_loss(log_probs[s], old[s], advantages[s], mask[s], 0.2, 0.28, token_count=count)[0]
             for s in (slice(0, 1), slice(1, 4))]
    assert float(sum(parts).detach()) == pytest.approx(float(whole.detach()))


def test_whiten_uses_masked_positions_only():
    whitened = algorithms.whiten(t(1.0, 100.0, 3.0), t(1, 0, 1))
    assert whitened[0].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)


def test_token_log_probs_match_log_softmax_with_temperature():
    logits = torch.randn(2, 3, 7)
    targets = torch.randint(0, 7, (2, 3))
    expected = torch.log_softmax(logits / 0.5, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(algorithms.token_log_probs(logits, targets, 0.5), expected, atol=1e-6)
