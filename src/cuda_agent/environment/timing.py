"""Timing a callable the same way for baselines and candidates.

Every timed sample lies between two device-wide synchronisations, so work a candidate leaves on
side streams is inside the measurement. A sample is a *batch* of ``k`` back-to-back calls, each on
its own freshly perturbed inputs prepared before the batch; ``k`` is chosen after the warm-up so
that a batch lasts at least ``timing.batch_min_ms``, which keeps the synchronisation round trip
(~20 µs, jittery) from swamping µs-scale kernels. Kernels longer than that get ``k = 1``: one
call per synchronisation, as before. On CUDA the L2 cache is flushed (a buffer twice its size is
overwritten) after the batch's inputs were prepared and before the first call, so every call reads
inputs no earlier call touched; parameters shared by the calls may be L2-resident from the second
call on (the same for baselines and candidates). The loop repeats until the relative standard
error of the mean, or the median's at the same precision (:func:`precise_enough`), reaches the
target or the budget runs out.
"""

from __future__ import annotations

import math
import statistics
import time
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

import torch

from cuda_agent.environment.call_seeds import call_seed
from cuda_agent.environment.config import TimingConfig
from cuda_agent.environment.device_clock import sm_clock_ramped
from cuda_agent.environment.loading import clone_tree, tensors_in
from cuda_agent.environment.reward import MEDIAN_TO_MEAN_ERROR
from cuda_agent.environment.verdict import TimingStats

Call = Callable[..., Any]


class Timer(ABC):
    """Measures a batch of calls of ``fn``, one per argument tuple, in milliseconds, including all
    work they leave on the device; returns the total time and the calls' outputs in order."""

    device = "cpu"
    """The backend whose clock it reads (``cuda`` for the device timers)."""
    stopped_ns: int = 0
    """``time.perf_counter_ns()`` once the last batch's calls returned and the device was synchronised:
    work still running in a thread then escaped the measurement (``thread_starts``)."""

    @abstractmethod
    def time_calls(self, fn: Call, arg_sets: Sequence[tuple]) -> tuple[float, list]: ...

    def clock_ramped(self) -> bool:
        """Whether the device's clock is up already, so the warm-up need not wait ``warmup_ms``
        for it (False: it waits; the CPU backend always does)."""
        return sm_clock_ramped(self.device)


class CpuTimer(Timer):
    """Host monotonic clock around the calls (the CPU backend runs synchronously)."""

    def time_calls(self, fn: Call, arg_sets: Sequence[tuple]) -> tuple[float, list]:
        start = time.perf_counter_ns()
        outputs = [fn(*args) for args in arg_sets]
        self.stopped_ns = time.perf_counter_ns()
        return (self.stopped_ns - start) / 1e6, outputs


class CudaTimer(Timer):
    """CUDA events around the calls, the end event recorded after a device-wide synchronize.

    Recording the end event only after ``torch.cuda.synchronize()`` returns means kernels on any
    stream, not just the current one, finish inside the measured interval. The price is the
    synchronisation latency (a few µs) once per batch, paid equally by baseline and candidate.
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

    def time_calls(self, fn: Call, arg_sets: Sequence[tuple]) -> tuple[float, list]:
        self._flush_and_sync()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        outputs = [fn(*args) for args in arg_sets]
        torch.cuda.synchronize()
        end.record()
        self.stopped_ns = time.perf_counter_ns()
        end.synchronize()
        return start.elapsed_time(end), outputs


class HostSyncTimer(CudaTimer):
    """The host clock around the calls and a device-wide synchronize: no CUDA events at all. Used
    to re-measure implausible speed-ups with an independent clock."""

    def time_calls(self, fn: Call, arg_sets: Sequence[tuple]) -> tuple[float, list]:
        self._flush_and_sync()
        start = time.perf_counter_ns()
        outputs = [fn(*args) for args in arg_sets]
        torch.cuda.synchronize()
        self.stopped_ns = time.perf_counter_ns()
        return (self.stopped_ns - start) / 1e6, outputs


def make_timer(device: str, config: TimingConfig, host_clock: bool = False) -> Timer:
    if device != "cuda":
        return CpuTimer()
    if config.method == "profiler" and not host_clock:
        from cuda_agent.environment.profiler_timer import ProfilerTimer

        return ProfilerTimer()
    return HostSyncTimer(config.flush_l2) if host_clock else CudaTimer(config.flush_l2)


PERTURB_CHUNK_ELEMENTS = 1 << 24
"""Noise factors drawn at once: perturbing a 6 GB input needs a 64 MB temporary, not 6 GB more."""


def perturbed(inputs: list, noise: float, seed: int) -> tuple:
    """``inputs`` with every floating-point element multiplied by its own factor drawn uniformly
    from ``1 ± noise`` (a generator seeded with ``seed`` on the tensor's device, drawn chunk by
    chunk: the reference worker reproduces the exact values, see :func:`perturb_`). The copies are
    contiguous; signs and domains are kept; other leaves are cloned."""
    out = []
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            result = torch.empty(t.shape, dtype=t.dtype, device=t.device)
            source, flat = t.reshape(-1), result.view(-1)
            for part, factor in _noise_factors(source, noise, seed + i):
                flat[part] = source[part] * factor
            out.append(result)
        else:
            out.append(clone_tree(t))
    return tuple(out)


def perturb_(inputs: list, noise: float, seed: int) -> list:
    """:func:`perturbed` in place, bit for bit: for the reference's own private copy of an input
    set, which then costs no second copy (its contiguous floating-point tensors are changed)."""
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            if not t.is_contiguous():
                t = inputs[i] = t.contiguous()
            flat = t.view(-1)
            for part, factor in _noise_factors(flat, noise, seed + i):
                flat[part] *= factor
    return inputs


def _noise_factors(flat: torch.Tensor, noise: float, seed: int):
    """``(slice, factors)`` over ``flat``, the factors drawn chunk by chunk from one generator."""
    generator = torch.Generator(device=flat.device)
    generator.manual_seed(seed % 2**63)
    for start in range(0, flat.numel(), PERTURB_CHUNK_ELEMENTS):
        part = slice(start, min(start + PERTURB_CHUNK_ELEMENTS, flat.numel()))
        factor = torch.empty(part.stop - part.start, dtype=torch.float32, device=flat.device)
        yield part, factor.uniform_(1.0 - noise, 1.0 + noise, generator=generator)


class FreshInputs:
    """Per-call inputs for timing: :func:`perturbed` copies of the trial inputs, call ``n`` seeded
    with ``call_seed(seed, n)``.

    Values never repeat and carry no global scale, so neither a cache nor an analytical shortcut
    (``(cA)B = c(AB)``) can serve a timed call.
    """

    def __init__(self, inputs: list, noise: float, seed: int) -> None:
        self.inputs = inputs
        self.noise = noise
        self.seed = seed

    def for_call(self, call: int) -> tuple:
        return perturbed(self.inputs, self.noise, call_seed(self.seed, call))


_Z_95 = statistics.NormalDist().inv_cdf(0.975)


def median_rel_err(samples_ms: list[float]) -> float:
    """Standard error of the samples' median, relative to it (McKean and Schrader, 1984): the
    spread of the order statistics that bracket the median with 95 % confidence, over 2 × 1.96.

    The speed-ups use medians, and a loaded machine adds a few slow samples that inflate the
    standard deviation (``rel_std_err``) while barely moving the median; this error is what the
    median really carries. Infinite with fewer than 2 samples or a non-positive median."""
    n = len(samples_ms)
    middle = statistics.median(samples_ms)
    if n < 2 or middle <= 0:
        return math.inf
    ordered = sorted(samples_ms)
    c = max(1, round((n + 1) / 2 - _Z_95 * math.sqrt(n / 4)))  # 1-based rank of the lower order statistic
    return (ordered[n - c] - ordered[c - 1]) / (2 * _Z_95) / middle


def summarize(samples_ms: list[float], budget_exhausted: bool, calls_per_sample: int = 1) -> TimingStats:
    n = len(samples_ms)
    mean = statistics.fmean(samples_ms)
    std = statistics.stdev(samples_ms) if n > 1 else 0.0
    rse = std / math.sqrt(n) / mean if mean > 0 else math.inf
    return TimingStats(statistics.median(samples_ms), mean, std, n, rse, budget_exhausted, calls_per_sample,
                       median_rel_err(samples_ms))


def precise_enough(stats: TimingStats, target_rel_std_err: float) -> bool:
    """Whether a loop may stop: the mean's relative standard error is within the target, or the
    median's (what speed-ups and their bounds use) is within the precision that target gives the
    median of normal samples (``target × MEDIAN_TO_MEAN_ERROR``). A few slow samples from a loaded
    host inflate the mean's error while barely moving the median: on one H200's self-check, loops
    that ran to their budget short of the mean's target took half the baselines' time alone."""
    return stats.rel_std_err <= target_rel_std_err or (
        stats.median_rel_err is not None and stats.median_rel_err <= target_rel_std_err * MEDIAN_TO_MEAN_ERROR)


def tree_bytes(tree: Any) -> int:
    """Bytes held by the tensors in a (nested) tree."""
    return sum(t.numel() * t.element_size() for t in tensors_in(tree) if isinstance(t, torch.Tensor))


def batch_size(call_ms: float, call_bytes: int, config: TimingConfig) -> int:
    """Calls per timed sample: enough for ``batch_min_ms`` of work at ``call_ms`` per call, at
    most ``batch_max_calls``, and at most as many as fit ``batch_mem_mb`` (each call's inputs are
    prepared before the batch and its outputs are held until the batch ends)."""
    if config.batch_min_ms <= 0 or call_ms >= config.batch_min_ms:
        return 1
    wanted = math.ceil(config.batch_min_ms / max(call_ms, 1e-6))
    fits = config.batch_mem_mb * 2**20 // max(call_bytes, 1)
    return max(1, min(wanted, config.batch_max_calls, fits))


def measure(fn: Call, timer: Timer, config: TimingConfig,
            prepare: Callable[[int], tuple] | None = None,
            after_call: Callable[[int, Any], None] | None = None) -> TimingStats:
    """Warm up (``warmup_calls``, and ``warmup_ms`` unless the device's clock is up already), then
    time batches of ``fn(*prepare(n))`` until they are precise enough (:func:`precise_enough`) or
    the budget is reached; a sample is a batch's time divided by its calls.

    Calls are numbered from 1 over the whole loop, warm-up included. ``prepare(n)`` (fresh inputs
    for call ``n``) runs before the batch, outside the timed region; ``after_call(n, outputs)``
    (auditing a timed call's outputs) runs for every timed call, in order, after its batch."""
    next_call = 1

    def arg_sets(count: int) -> list[tuple]:
        nonlocal next_call
        sets = [prepare(next_call + j) if prepare is not None else () for j in range(count)]
        next_call += count
        return sets

    wait_s = config.warmup_ms / 1e3 if config.warmup_ms and not timer.clock_ramped() else 0.0
    warmup_until = time.monotonic() + wait_s
    warmup_ms: list[float] = []
    while len(warmup_ms) < config.warmup_calls or time.monotonic() < warmup_until:
        args = arg_sets(1)  # timed like the samples, so the flush and syncs warm up too
        elapsed, outputs = timer.time_calls(fn, args)
        warmup_ms.append(elapsed)
        call_bytes = tree_bytes(args) + tree_bytes(outputs)
        del args, outputs  # before the next call's inputs exist: one call's worth held at a time
    calls = batch_size(min(warmup_ms), call_bytes, config)
    if calls > 1:  # a single call's time includes a whole synchronisation: size again from one batch
        elapsed, outputs = timer.time_calls(fn, arg_sets(calls))
        del outputs
        calls = batch_size(elapsed / calls, call_bytes, config)
    samples: list[float] = []
    deadline = time.monotonic() + config.budget_s
    while True:
        first = next_call
        elapsed, outputs = timer.time_calls(fn, arg_sets(calls))
        samples.append(elapsed / calls)
        if after_call is not None:
            for j, out in enumerate(outputs):
                after_call(first + j, out)
        del outputs
        n = len(samples)
        if n >= config.min_samples:
            stats = summarize(samples, False, calls)
            if precise_enough(stats, config.target_rel_std_err):
                return stats
            if n >= config.max_samples:
                return summarize(samples, True, calls)
        if time.monotonic() > deadline and n >= 3:
            return summarize(samples, True, calls)
