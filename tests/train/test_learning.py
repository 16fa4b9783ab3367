"""The trainer learns: agentic PPO on the keypad environment raises the mean reward of a tiny
random model (after its warm start), and does not with the learning rate at 0.

Both runs use fixed seeds and the same rollouts budget; the warm-started policy presses keys
nearly uniformly (mean reward about 0), the best policy presses the stated code first (reward 3).
"""

from __future__ import annotations

import statistics

from cuda_agent.train.stages import StageContext, run_stage

from keypad_support import keypad_config

STEPS = 16


def _ppo_rewards(warm, out, actor_lr: float) -> list[float]:
    config = keypad_config(warm.actor, ppo={
        "steps": STEPS, "seed": 1, "rollout": {"tasks_per_step": 6, "samples_per_task": 2, "max_new_tokens": 8},
        "actor_optim": {"lr": actor_lr}, "critic_optim": {"lr": 1e-3}, "tensorboard": False,
        "checkpoint": {"every_steps": STEPS}})
    rewards: list[float] = []
    result = run_stage("ppo", StageContext(config, out, previous=warm,
                                           on_step=lambda stage, step, steps, m: rewards.append(m["reward/mean"])))
    assert result.completed
    return rewards


def test_ppo_raises_keypad_reward_and_not_with_zero_learning_rate(warm_keypad, tmp_path):
    learned = _ppo_rewards(warm_keypad, tmp_path / "lr", 1e-3)
    frozen = _ppo_rewards(warm_keypad, tmp_path / "lr0", 0.0)
    print("learned", [round(r, 2) for r in learned], "\nfrozen", [round(r, 2) for r in frozen])
    first, last = statistics.fmean(learned[:4]), statistics.fmean(learned[-4:])
    assert last - first > 1.0 and last > 1.0, learned
    frozen_first, frozen_last = statistics.fmean(frozen[:4]), statistics.fmean(frozen[-4:])
    assert abs(frozen_last - frozen_first) < 0.6, frozen
    assert last - frozen_last > 1.0
