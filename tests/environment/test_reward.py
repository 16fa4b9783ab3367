"""The milestone reward: -1 failed, 1 correct, 2 faster than eager by > 5 %, 3 also faster than compile."""

from __future__ import annotations

import math

import pytest

from cuda_agent.environment.reward import SPEEDUP_MARGIN, milestone_reward


def test_speedup_margin_is_five_percent() -> None:
    assert SPEEDUP_MARGIN == 1.05


@pytest.mark.parametrize(
    ("correct", "vs_eager", "vs_compile", "reward"),
    [
        (False, 100.0, 100.0, -1),
        (False, None, None, -1),
        (True, None, None, 1),
        (True, 0.5, 10.0, 1),
        (True, 1.05, None, 1),  # exactly 5 % faster is not "more than 5 %"
        (True, 1.05, 2.0, 1),  # the compile milestone needs the eager one first
        (True, math.nextafter(1.05, 2.0), None, 2),
        (True, 1.06, None, 2),  # no compile baseline measured
        (True, 1.06, 1.05, 2),
        (True, 1.06, 0.9, 2),
        (True, 1.06, math.nextafter(1.05, 2.0), 3),
        (True, 50.0, 1.2, 3),
        (True, None, 3.0, 1),
    ],
)
def test_milestone_reward_boundaries(correct, vs_eager, vs_compile, reward) -> None:
    assert milestone_reward(correct, vs_eager, vs_compile) == reward
