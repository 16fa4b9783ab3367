"""The timing loop: stopping rules and the statistics it reports (checked against ``statistics``),
and how the reference worker runs it for a request of several baselines."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import pytest
import torch

from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.reward import MEDIAN_TO_MEAN_ERROR
from cuda_agent.environment.timing import (
    CpuTimer, FreshInputs, Timer, batch_size, call_seed, measure, perturbed, precise_enough, summarize,
)

from support import SMALL_RELU_TASK


class ScriptedTimer(Timer):
    """Makes the calls but returns pre-set durations per call instead of measuring; counts batches."""

    def __init__(self, samples_ms):
        self.samples_ms = list(samples_ms)
        self.batches = 0

    def time_calls(self, fn, arg_sets):
        outputs = [fn(*args) for args in arg_sets]
        self.batches += 1
        return self.samples_ms[(self.batches - 1) % len(self.samples_ms)] * len(arg_sets), outputs


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
    config = TimingConfig(warmup_calls=2, warmup_ms=0, min_samples=4, budget_s=10, batch_min_ms=0)
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


def test_measure_stops_on_the_medians_precision_when_a_few_slow_samples_hold_the_means_back() -> None:
    # one slow sample in ten: the mean's error stays far above 0.5 %, the median's is within it
    timer = ScriptedTimer([1.0, 1.001, 0.999, 1.0, 1.002, 0.998, 1.0, 1.001, 0.999, 3.0])
    config = TimingConfig(warmup_calls=1, warmup_ms=0, min_samples=10, budget_s=60, batch_min_ms=0)
    stats = measure(lambda: None, timer, config)
    assert stats.n == 10 and not stats.budget_exhausted
    assert stats.rel_std_err > 10 * config.target_rel_std_err
    assert stats.median_rel_err <= config.target_rel_std_err * MEDIAN_TO_MEAN_ERROR


def test_a_loop_stops_only_when_the_mean_or_the_median_is_precise_enough() -> None:
    noisy = summarize([1.0, 1.2, 0.8, 1.1, 0.9, 1.3, 0.7, 1.0, 1.05, 0.95], budget_exhausted=False)
    assert not precise_enough(noisy, 0.005)
    assert precise_enough(noisy, noisy.rel_std_err)  # the mean alone
    assert precise_enough(noisy, noisy.median_rel_err / MEDIAN_TO_MEAN_ERROR)  # the median alone


def test_measure_skips_the_warm_up_wait_when_the_clock_is_up_already() -> None:
    class RampedTimer(ScriptedTimer):
        def clock_ramped(self) -> bool:
            return True

    calls = []
    config = TimingConfig(warmup_calls=2, warmup_ms=10_000, min_samples=3, budget_s=10, batch_min_ms=0)
    stats = measure(lambda: calls.append(1), RampedTimer([1.0]), config)
    assert len(calls) - stats.n == 2  # the warm-up calls only: no 10 s wait for a clock already up


def test_the_cpu_timer_always_waits_out_the_warm_up() -> None:
    assert not CpuTimer().clock_ramped()


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

    elapsed, outputs = CpuTimer().time_calls(lambda s: time.sleep(s) or s, [(0.02,)])
    assert outputs == [0.02]
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
    first, second = fresh.for_call(1)[0], fresh.for_call(2)[0]
    assert not torch.equal(first, second)
    assert torch.equal(second, perturbed([x], 2**-7, call_seed(11, 2))[0])


def test_after_call_sees_every_timed_call_in_order_outside_the_warmup() -> None:
    config = TimingConfig(warmup_calls=2, warmup_ms=0, min_samples=5, max_samples=5, target_rel_std_err=0.001,
                          batch_min_ms=0)
    seen = []
    stats = measure(lambda x: x * 10, ScriptedTimer([1.0, 2.0]), config, prepare=lambda n: (n,),
                    after_call=lambda n, out: seen.append((n, out)))
    assert stats.n == 5 and stats.calls_per_sample == 1
    assert seen == [(n, n * 10) for n in range(3, 8)]  # calls 1 and 2 were the warm-up


def test_short_calls_are_timed_in_batches_long_enough_for_batch_min_ms() -> None:
    config = TimingConfig(warmup_calls=2, warmup_ms=0, min_samples=4, max_samples=4, batch_min_ms=1.0)
    timer, seen = ScriptedTimer([0.01]), []
    stats = measure(lambda x: x, timer, config, prepare=lambda n: (n,), after_call=lambda n, out: seen.append(out))
    assert stats.calls_per_sample == 100 and stats.n == 4
    assert stats.median_ms == pytest.approx(0.01)  # a sample is the batch's time per call
    # 2 warm-up calls, one untimed batch to size the batches again, then 4 timed batches
    assert timer.batches == 2 + 1 + 4 and seen == list(range(103, 103 + 400))


@pytest.mark.parametrize(("call_ms", "call_bytes", "expected"), [
    (2.0, 1, 1),            # longer than a batch: one call per synchronisation
    (0.01, 1, 100),         # 1 ms of 10 µs calls
    (0.0001, 1, 256),       # capped by batch_max_calls
    (0.01, 2**20 * 40, 25), # capped by batch_mem_mb (1000 MB / 40 MB per call)
])
def test_batch_size_follows_duration_count_and_memory_caps(call_ms, call_bytes, expected) -> None:
    config = TimingConfig(batch_min_ms=1.0, batch_max_calls=256, batch_mem_mb=1000)
    assert batch_size(call_ms, call_bytes, config) == expected


def test_batching_off_times_one_call_per_sample() -> None:
    assert batch_size(0.001, 1, TimingConfig(batch_min_ms=0)) == 1


def test_median_rel_err_matches_the_normal_theory_and_ignores_a_few_outliers() -> None:
    """For normal samples the median's standard error is sqrt(pi/2) sigma / sqrt(n); a 5 % share of
    100x outliers (a loaded machine) barely moves it, while the mean's error grows tenfold."""
    import random

    rng = random.Random(7)
    samples = [rng.gauss(10.0, 1.0) for _ in range(400)]
    expected = math.sqrt(math.pi / 2) * 1.0 / math.sqrt(400) / 10.0
    clean = summarize(samples, budget_exhausted=False)
    assert clean.median_rel_err == pytest.approx(expected, rel=0.2)
    loaded = summarize(samples[:380] + [1000.0] * 20, budget_exhausted=False)
    assert loaded.median_rel_err < 1.3 * clean.median_rel_err
    assert loaded.rel_std_err > 10 * clean.rel_std_err


def test_median_rel_err_of_three_samples_spans_them_and_of_one_is_unknown() -> None:
    assert summarize([1.0, 2.0, 4.0], budget_exhausted=True).median_rel_err == pytest.approx(3.0 / (2 * 1.959964) / 2.0)
    assert summarize([1.0], budget_exhausted=True).median_rel_err == math.inf


_BASELINES_PROBE = """
import dataclasses, json, sys
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.reference_worker import ReferenceWorker
worker = ReferenceWorker()
worker.warm({"device": "cpu"})
worker.load({"task_file": sys.argv[1], "device": "cpu", "init_seed": 42, "precision": "faithful",
             "io_dir": sys.argv[2], "out_dir": sys.argv[2]})
timing = TimingConfig(warmup_ms=1500.0, warmup_calls=1, min_samples=3, budget_s=0.2, compile_baseline=False)
reply = worker.baselines({"variants": ["eager_tf32_off", "eager_tf32_on"], "seed": 42,
                          "timing": dataclasses.asdict(timing)})
print(json.dumps(reply["seconds"]))
"""


def test_a_baselines_request_warms_up_for_warmup_ms_before_its_first_loop_only(tmp_path) -> None:
    """The loops of one request run back to back: the first ramps the clocks, the next ones
    warm up by calls only (on a shared GPU the request holds it alone)."""
    probe = subprocess.run([sys.executable, "-c", _BASELINES_PROBE, str(SMALL_RELU_TASK), str(tmp_path)],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr[-3000:]
    seconds = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seconds["eager_tf32_off"] >= 1.5
    assert seconds["eager_tf32_on"] < 1.0, seconds
