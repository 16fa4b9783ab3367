"""The CUDA Agent milestone reward (as in the paper)."""

from __future__ import annotations

from typing import Callable

from cuda_agent.registry import Registry

SPEEDUP_MARGIN = 1.05
""""More than 5 % faster" as a speed-up (``strict``): baseline time / candidate time > 1.05."""
TIME_SAVED_MARGIN = 0.05
""""More than 5 % faster" as the paper states it: (t0 - t) / t0 > 0.05, a speed-up above 1/0.95."""

MILESTONES: Registry[Callable[[float], bool]] = Registry("reward milestone rule")
MILESTONES.register("speedup", lambda speedup: speedup > SPEEDUP_MARGIN)
MILESTONES.register("time_saved", lambda speedup: 1.0 - 1.0 / speedup > TIME_SAVED_MARGIN)


def milestone_reward(correct: bool, speedup_vs_eager: float | None, speedup_vs_compile: float | None,
                     milestone: str = "speedup") -> int:
    """-1 failed (build, guard or correctness); 1 correct; 2 faster than eager by > 5 %;
    3 faster than both eager and ``torch.compile`` by > 5 %, "faster by > 5 %" as the
    ``milestone`` rule (a name in ``MILESTONES``) defines it.

    A missing speed-up (baseline not measured) never earns the milestone that needs it. The raw
    speed-ups are reported next to the reward, never folded into it.
    """
    faster = MILESTONES.get(milestone)
    if not correct:
        return -1
    if speedup_vs_eager is None or speedup_vs_eager <= 0 or not faster(speedup_vs_eager):
        return 1
    if speedup_vs_compile is None or speedup_vs_compile <= 0 or not faster(speedup_vs_compile):
        return 2
    return 3
