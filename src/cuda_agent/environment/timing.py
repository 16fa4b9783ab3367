"""Timing a callable the same way for baselines and candidates.

Every timed call is bracketed by a device-wide synchronisation, so work a candidate leaves on
side streams is inside the measurement. On CUDA the L2 cache is flushed (a buffer twice its size
is overwritten) before each call, so no call runs on data the previous one left in cache. The loop
repeats until the relative standard error of the mean reaches the target or the budget runs out.
"""

from __future__ import annotations

import math
import statistics
import time
from abc import ABC, abstractmethod
from typing import Any, Callable

import torch

from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.loading import clone_tree, shares_storage
from cuda_agent.environment.verdict import TimingStats


class Timer(ABC):
    """Measures one call of ``fn`` in milliseconds, including all work it leaves on the device."""

    @abstractmethod
    def time_call(self, fn: Callable[[], object]) -> float: ...


class CpuTimer(Timer):
    """Host monotonic clock around the call (the CPU backend runs synchronously)."""

    def time_call(self, fn: Callable[[], object]) -> float:
        start = time.perf_counter_ns()
        fn()
        return (time.perf_counter_ns() - start) / 1e6


class CudaTimer(Timer):
    """CUDA events around the call, the end event recorded after a device-wide synchronize.

    Recording the end event only after ``torch.cuda.synchronize()`` returns means kernels on any
    stream, not just the current one, finish inside the measured interval. The price is the
    synchronisation latency (a few µs) in every sample, paid equally by baseline and candidate.
    """

    def __init__(self, flush_l2: bool) -> None:
        self._flush_buffer = None
        if flush_l2:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            l2_bytes = getattr(props, "L2_cache_size", 0) or 64 * 1024 * 1024
            self._flush_buffer = torch.empty(2 * l2_bytes // 4, dtype=torch.int32, device="cuda")

    def time_call(self, fn: Callable[[], object]) -> float:
        if self._flush_buffer is not None:
            self._flush_buffer.fill_(0x5A5A5A5A)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        torch.cuda.synchronize()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


def make_timer(device: str, config: TimingConfig) -> Timer:
    return CudaTimer(config.flush_l2) if device == "cuda" else CpuTimer()


class FreshInputs:
    """Per-call inputs for timing: clones of the trial inputs, floats scaled by ``1 + k * 2**-20``.

    The scaling changes almost every value (so no cache can hit) without changing signs, magnitudes
    or domains. Also checks, between calls, that consecutive outputs do not share storage.
    """

    def __init__(self, inputs: list) -> None:
        self.inputs = inputs
        self.count = 0
        self.last_output: Any = None
        self._previous_output: Any = None
        self.reused_output = False

    def next(self) -> tuple:
        if self.last_output is not None:
            if self._previous_output is not None and shares_storage(self.last_output, self._previous_output):
                self.reused_output = True
            self._previous_output, self.last_output = self.last_output, None
        self.count += 1
        factor = 1.0 + (self.count % 1024 + 1) * 2.0 ** -20  # never exactly 1: trial values never recur
        return tuple(t * factor if isinstance(t, torch.Tensor) and t.is_floating_point()
                     else clone_tree(t) for t in self.inputs)


def summarize(samples_ms: list[float], budget_exhausted: bool) -> TimingStats:
    n = len(samples_ms)
    mean = statistics.fmean(samples_ms)
    std = statistics.stdev(samples_ms) if n > 1 else 0.0
    rse = std / math.sqrt(n) / mean if mean > 0 else math.inf
    return TimingStats(statistics.median(samples_ms), mean, std, n, rse, budget_exhausted)


def measure(fn: Callable[..., object], timer: Timer, config: TimingConfig,
            prepare: Callable[[], tuple] | None = None) -> TimingStats:
    """Warm up, then time ``fn(*prepare())`` until the relative standard error target or the budget
    is reached. ``prepare`` runs outside the timed region (fresh inputs per call)."""
    def args() -> tuple:
        return prepare() if prepare is not None else ()

    warmup_until = time.monotonic() + config.warmup_ms / 1e3
    calls = 0
    while calls < config.warmup_calls or time.monotonic() < warmup_until:
        timer.time_call(lambda: fn(*args()))  # timed like the samples, so the flush and syncs warm up too
        calls += 1
    samples: list[float] = []
    deadline = time.monotonic() + config.budget_s
    while True:
        call_args = args()
        samples.append(timer.time_call(lambda: fn(*call_args)))
        n = len(samples)
        if n >= config.min_samples:
            stats = summarize(samples, False)
            if stats.rel_std_err <= config.target_rel_std_err:
                return stats
            if n >= config.max_samples:
                return summarize(samples, True)
        if time.monotonic() > deadline and n >= 3:
            return summarize(samples, True)
