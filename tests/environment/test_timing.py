"""The timing loop: stopping rules and the statistics it reports (checked against ``statistics``)."""

from __future__ import annotations

import math
import statistics

import pytest

from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.timing import CpuTimer, Timer, measure, summarize


class ScriptedTimer(Timer):
    """Returns pre-set durations instead of measuring, and counts the timed calls."""

    def __init__(self, samples_ms):
        self.samples_ms = list(samples_ms)
        self.calls = 0

    def time_call(self, fn) -> float:
        fn()
        self.calls += 1
        return self.samples_ms[(self.calls - 1) % len(self.samples_ms)]


def test_summarize_matches_the_statistics_module() -> None:
    samples = [1.0, 2.0, 2.5, 4.0, 10.0]
    stats = summarize(samples, budget_exhausted=False)
    assert stats.median_ms == statistics.median(samples)
    assert stats.mean_ms == pytest.approx(statistics.fmean(samples))
    assert stats.std_ms == pytest.approx(statistics.stdev(samples))
    assert stats.rel_std_err == pytest.approx(statistics.stdev(samples) / math.sqrt(5) / statistics.fmean(samples))
    assert stats.n == 5 and not stats.budget_exhausted


def test_measure_stops_at_min_samples_when_precise_enough() -> None:
    calls = []
    timer = ScriptedTimer([1.0])
    config = TimingConfig(warmup_calls=2, warmup_ms=0, min_samples=4, budget_s=10)
    stats = measure(lambda: calls.append(1), timer, config)
    assert stats.n == 4 and stats.median_ms == 1.0 and not stats.budget_exhausted
    assert len(calls) == 2 + 4  # warm-up calls are made but not counted in the statistics


def test_measure_warms_up_for_at_least_warmup_ms() -> None:
    import time

    calls = []
    config = TimingConfig(warmup_calls=1, warmup_ms=50, min_samples=3, budget_s=10)
    started = time.monotonic()
    stats = measure(lambda: calls.append(time.monotonic()), ScriptedTimer([1.0]), config)
    warmup_calls = len(calls) - stats.n
    assert warmup_calls > 1
    assert calls[warmup_calls] - started >= 0.05  # the first measured call comes after the warm-up time


def test_measure_stops_at_max_samples_and_flags_it() -> None:
    timer = ScriptedTimer([1.0, 3.0])
    config = TimingConfig(min_samples=3, max_samples=6, budget_s=60, target_rel_std_err=1e-6)
    stats = measure(lambda: None, timer, config)
    assert stats.n == 6 and stats.budget_exhausted


def test_measure_stops_on_the_budget_and_flags_it() -> None:
    timer = ScriptedTimer([1.0, 5.0])
    config = TimingConfig(min_samples=3, max_samples=10**9, budget_s=0.05, target_rel_std_err=1e-9)
    stats = measure(lambda: None, timer, config)
    assert stats.budget_exhausted and stats.n >= 3


def test_cpu_timer_measures_milliseconds() -> None:
    import time

    elapsed = CpuTimer().time_call(lambda: time.sleep(0.02))
    assert 19 <= elapsed < 200
