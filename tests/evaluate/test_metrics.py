"""KernelBench / CUDA Agent metrics against hand-computed examples: every task in the denominator
(failed, missing and unfinished ones too), geometric means over correct tasks only, strict ``> p``."""

from __future__ import annotations

import math

import pytest

from cuda_agent.evaluate.metrics import (
    TaskOutcome, benchmark_metrics, fast_p, geometric_mean, group_metrics,
)


def correct(key: str, level: int | None, eager: float, compile_: float | None = None, **variants: float) -> TaskOutcome:
    speedups = {"eager": eager, **({"compile": compile_} if compile_ is not None else {}), **variants}
    return TaskOutcome(key, level, "correct", True, speedups)


LEVEL1 = [
    correct("t1", 1, 2.0, 1.2),
    correct("t2", 1, 0.5, 0.9),
    TaskOutcome.failed("t3", 1, "incorrect"),
    TaskOutcome.failed("t4", 1, "missing"),
]
LEVEL2 = [
    correct("u1", 2, 4.0, 1.0),  # exactly as fast as torch.compile: not faster
    TaskOutcome.failed("u2", 2, "harness_error"),
]


def test_level_metrics_count_failed_and_missing_tasks_in_the_denominator() -> None:
    level1 = benchmark_metrics(LEVEL1 + LEVEL2)["level1"].to_json_dict()
    assert level1["n_tasks"] == 4 and level1["n_correct"] == 2 and level1["n_missing"] == 1
    assert level1["pass_rate"] == 0.5
    assert level1["faster_rate_vs_eager"] == 0.25 and level1["faster_rate_vs_compile"] == 0.25
    assert level1["geomean_speedup_vs_eager"] == pytest.approx(1.0)  # sqrt(2.0 * 0.5)
    assert level1["geomean_speedup_vs_compile"] == pytest.approx(math.sqrt(1.2 * 0.9))
    assert level1["fast_p_vs_eager"] == {"0": 0.5, "0.5": 0.25, "0.8": 0.25, "1": 0.25, "1.5": 0.25, "2": 0.0}
    assert level1["fast_p_vs_compile"] == {"0": 0.5, "0.5": 0.5, "0.8": 0.5, "1": 0.25, "1.5": 0.0, "2": 0.0}


def test_speedup_equal_to_p_is_not_faster() -> None:
    level2 = benchmark_metrics(LEVEL1 + LEVEL2)["level2"].to_json_dict()
    assert level2["pass_rate"] == 0.5
    assert level2["faster_rate_vs_eager"] == 0.5 and level2["faster_rate_vs_compile"] == 0.0
    assert level2["geomean_speedup_vs_compile"] == pytest.approx(1.0)


def test_overall_pools_all_tasks_so_levels_weigh_by_task_count() -> None:
    metrics = benchmark_metrics(LEVEL1 + LEVEL2)
    overall = metrics["overall"].to_json_dict()
    assert list(metrics) == ["level1", "level2", "overall"]
    assert overall["n_tasks"] == 6 and overall["pass_rate"] == 0.5
    assert overall["faster_rate_vs_eager"] == pytest.approx(2 / 6)
    assert overall["faster_rate_vs_compile"] == pytest.approx(1 / 6)
    assert overall["geomean_speedup_vs_eager"] == pytest.approx((2.0 * 0.5 * 4.0) ** (1 / 3))
    assert overall["geomean_speedup_vs_compile"] == pytest.approx((1.2 * 0.9 * 1.0) ** (1 / 3))
    weighted = sum(metrics[f"level{i}"].n_tasks * metrics[f"level{i}"].to_json_dict()["faster_rate_vs_eager"]
                   for i in (1, 2)) / 6
    assert overall["faster_rate_vs_eager"] == pytest.approx(weighted)


def test_tf32_settings_are_reported_side_by_side_and_tf32_on_is_null_without_it() -> None:
    on_gpu = [correct("a", 1, 2.0, 1.5, eager_tf32_off=2.0, compile_tf32_off=1.5, eager_tf32_on=1.6,
                      compile_tf32_on=0.9),
              TaskOutcome.failed("b", 1, "compile_error")]
    data = group_metrics("overall", on_gpu).to_json_dict()
    assert data["tf32_off"]["geomean_speedup_vs_compile"] == pytest.approx(1.5)
    assert data["tf32_on"]["geomean_speedup_vs_eager"] == pytest.approx(1.6)
    assert data["tf32_on"]["faster_rate_vs_compile"] == 0.0 and data["tf32_off"]["faster_rate_vs_compile"] == 0.5
    on_cpu = [correct("a", None, 2.0, None, eager_tf32_off=2.0)]
    data = group_metrics("overall", on_cpu).to_json_dict()
    assert data["tf32_on"] is None
    assert data["faster_rate_vs_compile"] is None and data["geomean_speedup_vs_compile"] is None  # never timed


def test_a_group_with_no_correct_task_has_zero_rates_and_no_geomean() -> None:
    data = group_metrics("overall", [TaskOutcome.failed("a", None, "missing")]).to_json_dict()
    assert data["pass_rate"] == 0.0 and data["faster_rate_vs_eager"] == 0.0
    assert data["geomean_speedup_vs_eager"] is None


def test_outcome_from_verdict_json_takes_the_reward_and_variant_speedups() -> None:
    verdict = {"status": "correct", "correct": True, "speedup_vs_eager": 1.5, "speedup_vs_compile": None,
               "speedups": {"eager_tf32_off": 1.5, "eager_tf32_on": 1.2}}
    outcome = TaskOutcome.from_verdict("k", 3, verdict)
    assert outcome.speedups == {"eager": 1.5, "eager_tf32_off": 1.5, "eager_tf32_on": 1.2}
    assert outcome.correct and outcome.level == 3


def test_unleveled_tasks_form_their_own_group_when_mixed_with_levels() -> None:
    metrics = benchmark_metrics([correct("a", 1, 2.0), correct("b", None, 3.0)])
    assert list(metrics) == ["level1", "unleveled", "overall"]
    assert list(benchmark_metrics([correct("b", None, 3.0)])) == ["overall"]


def test_geometric_mean_and_fast_p_reject_undefined_inputs() -> None:
    assert geometric_mean([]) is None
    assert geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="positive finite"):
        geometric_mean([1.0, 0.0])
    with pytest.raises(ValueError, match="empty group"):
        fast_p([], "eager", 1.0)
    with pytest.raises(ValueError, match="has no tasks"):
        group_metrics("level1", [])
