"""Benchmark metrics as KernelBench and the CUDA Agent paper define them (docs/evaluate.md).

For a group of ``n`` tasks (one level, or all of them), with ``s_i`` the speed-up of task ``i``'s
solution over a baseline (baseline time / solution time):

- pass rate = #correct / n
- fast_p = #(correct and s_i > p) / n, for p in ``FAST_P_THRESHOLDS``; fast_0 is the pass rate of
  the timed tasks
- faster rate = fast_1: the share of *all* tasks whose solution is correct and faster
- geomean speed-up = exp(mean(log s_i)) over the correct tasks

Every task counts in ``n``: a missing solution, a failed build and a task whose evaluation never
finished all count as not correct and not faster. "Overall" pools all tasks, which weights each
level by its task count (the paper's weighting). Pure functions; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FAST_P_THRESHOLDS: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
HEADLINE_BASELINES = ("eager", "compile")
"""Speed-ups the reward is taken against (the precision policy picks their TF32 setting)."""
TF32_BASELINES = {"tf32_off": ("eager_tf32_off", "compile_tf32_off"), "tf32_on": ("eager_tf32_on", "compile_tf32_on")}
"""Both TF32 settings of the fp32 baselines, reported side by side."""
MISSING = "missing"
"""Status of a task that has no solution."""


@dataclass(frozen=True)
class TaskOutcome:
    """What the metrics need from one task's result.

    ``speedups`` maps a baseline name to the speed-up over it: ``eager`` and ``compile`` (the
    reward's baselines) and every measured variant (``eager_tf32_off``, ``compile_tf32_on``, ...).
    """

    key: str
    level: int | None
    status: str  # a verdict status, ``missing``, or ``harness_error``
    correct: bool
    speedups: Mapping[str, float]

    @classmethod
    def from_verdict(cls, key: str, level: int | None, verdict: Mapping[str, Any]) -> "TaskOutcome":
        """From a verdict's JSON form (``Verdict.to_json_dict()``)."""
        speedups = {name: float(value) for name, value in (verdict.get("speedups") or {}).items() if value}
        for name in HEADLINE_BASELINES:
            if verdict.get(f"speedup_vs_{name}"):
                speedups[name] = float(verdict[f"speedup_vs_{name}"])
        return cls(key, level, str(verdict["status"]), bool(verdict["correct"]), speedups)

    @classmethod
    def failed(cls, key: str, level: int | None, status: str) -> "TaskOutcome":
        return cls(key, level, status, False, {})


@dataclass(frozen=True)
class SpeedupMetrics:
    """Speed metrics of a group against one baseline."""

    baseline: str
    n_timed: int  # correct tasks with a speed-up against this baseline
    faster_rate: float  # fast_1
    geomean_speedup: float | None  # None when no correct task was timed
    fast_p: dict[float, float]


@dataclass(frozen=True)
class GroupMetrics:
    """All metrics of one group of tasks (a level, or ``overall``)."""

    name: str
    n_tasks: int
    n_correct: int
    n_missing: int
    pass_rate: float
    speed: dict[str, SpeedupMetrics | None]  # by baseline name; None: not measured for any correct task

    def to_json_dict(self) -> dict[str, Any]:
        """Headline fields (``pass_rate``, ``faster_rate_vs_eager``, ...) flat, fast_p per baseline,
        and the same speed metrics against each TF32 setting (``tf32_on`` is null on CPU)."""
        data: dict[str, Any] = {"n_tasks": self.n_tasks, "n_correct": self.n_correct, "n_missing": self.n_missing,
                                "pass_rate": self.pass_rate}
        data.update(self._speed_fields(dict(zip(HEADLINE_BASELINES, HEADLINE_BASELINES))))
        for setting, names in TF32_BASELINES.items():
            if all(self.speed.get(name) is None for name in names):
                data[setting] = None
            else:
                data[setting] = self._speed_fields(dict(zip(HEADLINE_BASELINES, names)))
        return data

    def _speed_fields(self, baselines: dict[str, str]) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        for label, name in baselines.items():
            metrics = self.speed.get(name)
            fields[f"faster_rate_vs_{label}"] = None if metrics is None else metrics.faster_rate
            fields[f"geomean_speedup_vs_{label}"] = None if metrics is None else metrics.geomean_speedup
            fields[f"n_timed_vs_{label}"] = 0 if metrics is None else metrics.n_timed
        for label, name in baselines.items():
            metrics = self.speed.get(name)
            fields[f"fast_p_vs_{label}"] = None if metrics is None else {f"{p:g}": v for p, v in metrics.fast_p.items()}
        return fields


def geometric_mean(values: Iterable[float]) -> float | None:
    """exp(mean(log v)); None for no values.

    Raises:
        ValueError: a value is not a positive finite number.
    """
    values = list(values)
    if not values:
        return None
    if not all(v > 0 and math.isfinite(v) for v in values):
        raise ValueError(f"a geometric mean needs positive finite values, got {values}")
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def fast_p(outcomes: list[TaskOutcome], baseline: str, p: float) -> float:
    """Share of all ``outcomes`` that are correct with a speed-up over ``baseline`` above ``p``."""
    if not outcomes:
        raise ValueError("fast_p of an empty group is undefined")
    return sum(o.correct and o.speedups.get(baseline, 0.0) > p for o in outcomes) / len(outcomes)


def speedup_metrics(outcomes: list[TaskOutcome], baseline: str) -> SpeedupMetrics | None:
    """Speed metrics against ``baseline``; None if correct tasks exist but none was timed against
    it (the baseline was not measured, e.g. ``compile`` with the compile baseline off)."""
    timed = [o.speedups[baseline] for o in outcomes if o.correct and baseline in o.speedups]
    if not timed and any(o.correct for o in outcomes):
        return None
    thresholds = {p: fast_p(outcomes, baseline, p) for p in FAST_P_THRESHOLDS}
    return SpeedupMetrics(baseline, len(timed), thresholds[1.0], geometric_mean(timed), thresholds)


def group_metrics(name: str, outcomes: list[TaskOutcome]) -> GroupMetrics:
    """Metrics of one group; every outcome counts in the denominator.

    Raises:
        ValueError: ``outcomes`` is empty (rates of no tasks are undefined).
    """
    if not outcomes:
        raise ValueError(f"group {name!r} has no tasks")
    baselines = [*HEADLINE_BASELINES, *(b for names in TF32_BASELINES.values() for b in names)]
    n_correct = sum(o.correct for o in outcomes)
    return GroupMetrics(name, len(outcomes), n_correct, sum(o.status == MISSING for o in outcomes),
                        n_correct / len(outcomes), {b: speedup_metrics(outcomes, b) for b in baselines})


def level_name(level: int | None) -> str:
    return "unleveled" if level is None else f"level{level}"


def benchmark_metrics(outcomes: list[TaskOutcome]) -> dict[str, GroupMetrics]:
    """``{"level1": ..., "level2": ..., "overall": ...}``: one group per level present (tasks
    without a level form ``unleveled`` when mixed with leveled ones), and all tasks pooled."""
    groups: dict[str, list[TaskOutcome]] = {}
    if any(o.level is not None for o in outcomes):
        for outcome in sorted(outcomes, key=lambda o: (o.level is None, o.level or 0)):
            groups.setdefault(level_name(outcome.level), []).append(outcome)
    result = {name: group_metrics(name, members) for name, members in groups.items()}
    result["overall"] = group_metrics("overall", outcomes)
    return result
