"""Device busy time from ``torch.profiler`` (``timing.method: profiler``, the ``paper`` preset).

The CUDA Agent paper's harness times a model by recording its calls with ``torch.profiler`` and
summing the durations of the device-side events (kernels, memory copies and sets). That is busy
time: launch gaps, host overhead and idle waits between kernels are not counted, unlike the
default event timer's wall time on the device.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from cuda_agent.environment.timing import Call, Timer

_US_PER_MS = 1000.0


class ProfilerTimer(Timer):
    """Sum of the CUDA device events' durations over the calls, in milliseconds."""

    device = "cuda"

    def time_calls(self, fn: Call, arg_sets: Sequence[tuple]) -> tuple[float, list]:
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            outputs = [fn(*args) for args in arg_sets]
            torch.cuda.synchronize()
            self.stopped_ns = time.perf_counter_ns()
        busy_us = sum(event.device_time for event in profile.events()
                      if event.device_type == torch.autograd.DeviceType.CUDA)
        return busy_us / _US_PER_MS, outputs
