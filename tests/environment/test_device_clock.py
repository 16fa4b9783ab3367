"""The GPU clock a verdict records beside its timings is read only for CUDA evaluations, and its
absence (no NVML, no driver) leaves the verdict without it instead of failing it."""

from __future__ import annotations

import pytest
import torch

from cuda_agent.environment.device_clock import sm_clock_mhz, sm_clock_ramped


def test_the_cpu_backend_has_no_gpu_clock() -> None:
    assert sm_clock_mhz("cpu") is None
    assert not sm_clock_ramped("cpu")  # its timing loops always wait out the warm-up


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU: NVML has nothing to read")
def test_without_a_gpu_the_clock_is_absent_not_an_error() -> None:
    assert sm_clock_mhz("cuda") is None
    assert not sm_clock_ramped("cuda")  # unread: the warm-up waits as before
