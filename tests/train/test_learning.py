"""The trainer learns: agentic PPO on the keypad environment raises the mean reward of a tiny
random model (after its warm start), and does not with the learning rate at 0. With the default
epochs and minibatches (several optimizer steps per rollout batch) the ratio leaves 1 and the
asymmetric clip acts on a share of the tokens while the reward rises.

Both runs use fixed seeds and the same rollouts budget; the warm-started policy presses keys
nearly uniformly (mean reward about 0), the best policy presses the stated code first (reward 3).
"""

from __future__ import annotations

import statistics

from cuda_agent.train.stages import StageContext, run_stage

from keypad_support import keypad_config

STEPS = 12


def _ppo_run(warm, out, actor_lr: float) -> list[dict[str, float]]:
    config = keypad_config(warm.actor, ppo={
        "steps": STEPS, "seed": 1, "rollout": {"tasks_per_step": 6, "samples_per_task": 2, "max_new_tokens": 8},
        "actor_optim": {"lr": actor_lr}, "critic_optim": {"lr": 1e-3}, "tensorboard": False,
        "checkpoint": {"every_steps": STEPS}})
    assert config.ppo.algorithm.epochs > 1 and config.ppo.algorithm.minibatches > 1  # the defaults
    metrics: list[dict[str, float]] = []
    result = run_stage("ppo", StageContext(config, out, previous=warm,
                                           on_step=lambda stage, step, steps, m: metrics.append(m)))
    assert result.completed
    return metrics


def test_ppo_raises_keypad_reward_with_the_clip_acting_and_not_with_zero_learning_rate(warm_keypad, tmp_path):
    run = _ppo_run(warm_keypad, tmp_path / "lr", 3e-4)
    frozen_run = _ppo_run(warm_keypad, tmp_path / "lr0", 0.0)
    learned = [m["reward/mean"] for m in run]
    frozen = [m["reward/mean"] for m in frozen_run]
    clipped = [m["actor/clip_fraction"] for m in run]
    print("clip fraction", [round(c, 3) for c in clipped])
    assert statistics.fmean(clipped) > 0.01 and sum(c > 0 for c in clipped) >= STEPS // 2, clipped
    assert all(m["actor/clip_fraction"] == 0 for m in frozen_run)  # an unchanged policy: ratio 1, nothing clipped
    print("learned", [round(r, 2) for r in learned], "\nfrozen", [round(r, 2) for r in frozen])
    first, last = statistics.fmean(learned[:4]), statistics.fmean(learned[-4:])
    assert last - first > 1.0 and last > 1.0, learned
    frozen_first, frozen_last = statistics.fmean(frozen[:4]), statistics.fmean(frozen[-4:])
    assert abs(frozen_last - frozen_first) < 0.6, frozen
    assert last - frozen_last > 1.0
