"""The CUDA Agent milestone reward (as in the paper), and the confidence bound ``strict`` decides it on.

A speed-up is a ratio of two medians, each with a standard error (``TimingStats.median_rel_err``).
With ``reward.confidence`` > 0 a milestone is awarded only when the speed-up's one-sided lower
confidence bound clears the milestone's threshold, so a candidate whose advantage is within the
noise gets the same (lower) reward every time instead of a coin flip. Each median also gets a
between-verdict spread (``reward.drift``): what differs from one verdict to the next and not inside
one timing loop (the machine's load, clocks, the core and memory a fresh worker gets, a cached
baseline timed minutes earlier). docs/environment.md states the rule and its false-award rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

from cuda_agent.environment.verdict import TimingStats
from cuda_agent.registry import Registry

if TYPE_CHECKING:  # config imports this module's milestones
    from cuda_agent.environment.config import RewardConfig

SPEEDUP_MARGIN = 1.05
""""More than 5 % faster" as a speed-up (``strict``): baseline time / candidate time > 1.05."""
TIME_SAVED_MARGIN = 0.05
""""More than 5 % faster" as the paper states it: (t0 - t) / t0 > 0.05, a speed-up above 1/0.95."""

MILESTONES: Registry[float] = Registry("reward milestone rule")
"""The speed-up (baseline time / candidate time) a candidate must exceed to count as faster."""
MILESTONES.register("speedup", SPEEDUP_MARGIN)
MILESTONES.register("time_saved", 1.0 / (1.0 - TIME_SAVED_MARGIN))

DRIFT = {"cpu": 0.02, "cuda": 0.01}
"""The between-verdict spread of one median (relative standard deviation beyond its loop's own
error) that ``reward.drift`` defaults to per backend: at ~1 ms, the size KernelBench's problems
run at, the 2-core CPU machine's candidate times varied 1.0-2.6 % between verdicts
(``bench/reward_stability.py``), an idle H100's 1.0-1.3 % (an H200's 2.1-2.5 % while the host's
other GPU ran verdicts); shorter kernels vary more (docs/environment.md)."""

MEDIAN_TO_MEAN_ERROR = math.sqrt(math.pi / 2)
"""The median's standard error over the mean's for normal samples: the timing loop stops on the
mean's (``target_rel_std_err``), so a median error of ``e`` asks for a target of ``e`` over this."""


def milestone_reward(correct: bool, speedup_vs_eager: float | None, speedup_vs_compile: float | None,
                     milestone: str = "speedup") -> int:
    """-1 failed (build, guard or correctness); 1 correct; 2 faster than eager by > 5 %;
    3 faster than both eager and ``torch.compile`` by > 5 %, "faster by > 5 %" as the
    ``milestone`` rule (a name in ``MILESTONES``) defines it.

    The evaluator passes the speed-ups' lower confidence bounds (the speed-ups themselves when the
    confidence is 0). A missing speed-up (baseline not measured) never earns the milestone that
    needs it. The raw speed-ups are reported next to the reward, never folded into it.
    """
    threshold = MILESTONES.get(milestone)
    if not correct:
        return -1
    if speedup_vs_eager is None or not speedup_vs_eager > threshold:
        return 1
    if speedup_vs_compile is None or not speedup_vs_compile > threshold:
        return 2
    return 3


def bound_z(confidence: float, looks: int) -> float:
    """Standard errors a lower bound lies below its speed-up: the one-sided ``confidence`` split
    evenly (Bonferroni) over the ``looks`` a verdict may take (a second one when it re-times a
    candidate near a threshold), so the chance of a false award stays at most ``1 - confidence``.
    0 when ``confidence`` is 0 (the point estimate decides)."""
    return 0.0 if confidence == 0 else NormalDist().inv_cdf(1 - (1 - confidence) / looks)


def drift_for(reward: RewardConfig, device: str) -> float:
    """The drift the bound counts: ``reward.drift`` as configured, the backend's measured default
    (``DRIFT``) when None, and 0 without a bound (``reward.confidence`` 0)."""
    if not reward.confidence:
        return 0.0
    return DRIFT["cuda" if device == "cuda" else "cpu"] if reward.drift is None else reward.drift


@dataclass(frozen=True)
class Speedup:
    """Baseline median over candidate median, and the relative standard error of that ratio: the
    two medians' relative errors and each one's between-verdict ``drift``, in quadrature (the
    delta method on its logarithm)."""

    value: float
    rel_err: float
    drift: float = 0.0

    @classmethod
    def of(cls, baseline: TimingStats, candidate: TimingStats, drift: float = 0.0) -> "Speedup":
        errors = [math.inf if s.median_rel_err is None else s.median_rel_err for s in (baseline, candidate)]
        return cls(baseline.median_ms / candidate.median_ms, math.hypot(*errors, drift, drift), drift)

    def lower_bound(self, z: float) -> float:
        """The one-sided lower confidence bound ``z`` standard errors below the speed-up (0 when
        its error is unknown)."""
        return self.value if z == 0 else self.value * math.exp(-z * self.rel_err)

    def candidate_err_to_clear(self, baseline: TimingStats, threshold: float, z: float) -> float | None:
        """The candidate median's relative error under which the bound would clear ``threshold``,
        when more candidate samples can get there: the speed-up is above the threshold, its bound
        is not, and the baseline's own error and both drifts leave room. None otherwise."""
        if not self.value > threshold or self.lower_bound(z) > threshold or baseline.median_rel_err is None:
            return None
        room = math.log(self.value / threshold) / z
        fixed = math.hypot(baseline.median_rel_err, self.drift, self.drift)
        return math.sqrt(room ** 2 - fixed ** 2) if room > fixed else None


def candidate_err_needed(baselines: list[TimingStats], candidate: TimingStats, threshold: float,
                         z: float, drift: float = 0.0) -> float | None:
    """The candidate median's relative error that another timing should reach, when one could
    change a milestone: the speed-up over a baseline clears ``threshold`` but its bound does not,
    and more candidate samples can close the gap. ``baselines`` in milestone order (eager, then
    compile): a later milestone counts only while the earlier speed-ups clear the threshold.
    None when no milestone can change."""
    needed = []
    for baseline in baselines:
        speedup = Speedup.of(baseline, candidate, drift)
        err = speedup.candidate_err_to_clear(baseline, threshold, z)
        needed += [err] if err is not None else []
        if not speedup.value > threshold:
            break
    return min(needed, default=None)
