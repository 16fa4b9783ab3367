"""The timing loop: stopping rules and the statistics it reports (checked against ``statistics``)."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.timing import CpuTimer, FreshInputs, Timer, call_seed, measure, perturbed, summarize


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


def test_perturbed_inputs_are_reproducible_per_seed_and_keep_signs_and_non_floats() -> None:
    x, idx = torch.randn(1000, generator=torch.Generator().manual_seed(0)), torch.arange(10)
    first, again, other = perturbed([x, idx], 2**-7, 5), perturbed([x, idx], 2**-7, 5), perturbed([x, idx], 2**-7, 6)
    assert torch.equal(first[0], again[0]) and not torch.equal(first[0], other[0])
    assert torch.equal(torch.sign(first[0]), torch.sign(x))
    assert torch.equal(first[1], idx) and first[1].data_ptr() != idx.data_ptr()
    ratio = first[0] / x
    assert float((ratio - 1).abs().max()) <= 2**-7 * 1.0001
    assert float(ratio.std()) > 2**-9  # a factor per element, not one global scale


def test_fresh_inputs_draw_a_new_seed_per_call() -> None:
    x = torch.ones(64)
    fresh = FreshInputs([x], 2**-7, seed=11)
    first, second = fresh.next()[0], fresh.next()[0]
    assert not torch.equal(first, second)
    assert torch.equal(second, perturbed([x], 2**-7, call_seed(11, 2))[0])


def test_after_sample_runs_once_per_timed_sample_outside_the_warmup() -> None:
    config = TimingConfig(warmup_calls=2, warmup_ms=0, min_samples=5, max_samples=5, target_rel_std_err=0.001)
    seen = []
    stats = measure(lambda: None, ScriptedTimer([1.0, 2.0]), config, after_sample=lambda: seen.append(1))
    assert len(seen) == stats.n == 5
