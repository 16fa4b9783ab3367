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

    def _flush_and_sync(self) -> None:
        if self._flush_buffer is not None:
            self._flush_buffer.fill_(0x5A5A5A5A)
        torch.cuda.synchronize()

    def time_call(self, fn: Callable[[], object]) -> float:
        self._flush_and_sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        torch.cuda.synchronize()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)


class HostSyncTimer(CudaTimer):
    """The host clock around the call and a device-wide synchronize: no CUDA events at all. Used to
    re-measure implausible speed-ups with an independent clock."""

    def time_call(self, fn: Callable[[], object]) -> float:
        self._flush_and_sync()
        start = time.perf_counter_ns()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter_ns() - start) / 1e6


def make_timer(device: str, config: TimingConfig, host_clock: bool = False) -> Timer:
    if device != "cuda":
        return CpuTimer()
    return HostSyncTimer(config.flush_l2) if host_clock else CudaTimer(config.flush_l2)


def call_seed(seed: int, call: int) -> int:
    """The noise seed of timed call ``call`` in a loop seeded with ``seed`` (shared with the reference)."""
    return (seed + call * 1_000_003) % 2**63


def perturbed(inputs: list, noise: float, seed: int) -> tuple:
    """``inputs`` with every floating-point element multiplied by its own factor drawn uniformly
    from ``1 ± noise`` (a generator seeded with ``seed`` on the tensor's device: the reference
    worker reproduces the exact values). Signs and domains are kept; other leaves are cloned."""
    out = []
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            generator = torch.Generator(device=t.device)
            generator.manual_seed((seed + i) % 2**63)
            factor = torch.empty(t.shape, dtype=torch.float32, device=t.device)
            factor.uniform_(1.0 - noise, 1.0 + noise, generator=generator)
            out.append((t * factor).to(t.dtype))
        else:
            out.append(clone_tree(t))
    return tuple(out)


class FreshInputs:
    """Per-call inputs for timing: :func:`perturbed` copies of the trial inputs, a new seed per call.

    Values never repeat and carry no global scale, so neither a cache nor an analytical shortcut
    (``(cA)B = c(AB)``) can serve a timed call. Also checks, between calls, that consecutive outputs
    do not share storage.
    """

    def __init__(self, inputs: list, noise: float, seed: int) -> None:
        self.inputs = inputs
        self.noise = noise
        self.seed = seed
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
        return perturbed(self.inputs, self.noise, call_seed(self.seed, self.count))


def summarize(samples_ms: list[float], budget_exhausted: bool) -> TimingStats:
    n = len(samples_ms)
    mean = statistics.fmean(samples_ms)
    std = statistics.stdev(samples_ms) if n > 1 else 0.0
    rse = std / math.sqrt(n) / mean if mean > 0 else math.inf
    return TimingStats(statistics.median(samples_ms), mean, std, n, rse, budget_exhausted)


def measure(fn: Callable[..., object], timer: Timer, config: TimingConfig,
            prepare: Callable[[], tuple] | None = None,
            after_sample: Callable[[], None] | None = None) -> TimingStats:
    """Warm up, then time ``fn(*prepare())`` until the relative standard error target or the budget
    is reached. ``prepare`` (fresh inputs) and ``after_sample`` (auditing a timed call's outputs)
    run outside the timed region."""
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
        if after_sample is not None:
            after_sample()
        n = len(samples)
        if n >= config.min_samples:
            stats = summarize(samples, False)
            if stats.rel_std_err <= config.target_rel_std_err:
                return stats
            if n >= config.max_samples:
                return summarize(samples, True)
        if time.monotonic() > deadline and n >= 3:
            return summarize(samples, True)
