"""The torch.compile baseline (slow on CPU, so exactly one test times it)."""

from __future__ import annotations

import dataclasses

import pytest

from cuda_agent.environment import Status
from cuda_agent.environment.reward import milestone_reward

from support import FAST_TIMING, SMALL_RELU_TASK

pytestmark = pytest.mark.slow


def test_compile_baseline_is_timed_and_the_reward_follows_both_speedups(run_evaluation, make_config,
                                                                         fault_solution) -> None:
    timing = dataclasses.replace(FAST_TIMING, compile_baseline=True)
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("relu_ok"), make_config(timing=timing))

    assert verdict.status is Status.CORRECT, verdict.error
    assert set(verdict.baselines) == {"eager_tf32_off", "compile_tf32_off"}
    assert isinstance(verdict.compile_ms, float) and verdict.compile_ms > 0
    assert verdict.compile_ms == verdict.baselines["compile_tf32_off"].median_ms
    assert verdict.eager_ms == verdict.baselines["eager_tf32_off"].median_ms
    assert verdict.speedup_vs_compile == pytest.approx(verdict.compile_ms / verdict.candidate_ms)
    assert verdict.speedups == pytest.approx({name: s.median_ms / verdict.candidate_ms
                                              for name, s in verdict.baselines.items()})
    expected = 1  # strict decides on the speed-ups' lower confidence bounds
    if verdict.speedup_vs_eager_lower > 1.05:
        expected = 3 if verdict.speedup_vs_compile_lower > 1.05 else 2
    assert verdict.reward == expected == milestone_reward(True, verdict.speedup_vs_eager_lower,
                                                          verdict.speedup_vs_compile_lower)
