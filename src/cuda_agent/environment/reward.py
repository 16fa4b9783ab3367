"""The CUDA Agent milestone reward (as in the paper)."""

from __future__ import annotations

SPEEDUP_MARGIN = 1.05
""""More than 5 % faster" means a speed-up strictly above 1.05."""


def milestone_reward(correct: bool, speedup_vs_eager: float | None, speedup_vs_compile: float | None) -> int:
    """-1 failed (build, guard or correctness); 1 correct; 2 faster than eager by > 5 %;
    3 faster than both eager and ``torch.compile`` by > 5 %.

    A missing speed-up (baseline not measured) never earns the milestone that needs it. The raw
    speed-ups are reported next to the reward, never folded into it.
    """
    if not correct:
        return -1
    if speedup_vs_eager is None or speedup_vs_eager <= SPEEDUP_MARGIN:
        return 1
    if speedup_vs_compile is None or speedup_vs_compile <= SPEEDUP_MARGIN:
        return 2
    return 3
