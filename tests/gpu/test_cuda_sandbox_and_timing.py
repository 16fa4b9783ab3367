"""On the GPU: the sandbox leaves CUDA usable, the clocks timing reads, and implausible speed-ups are
re-measured."""

from __future__ import annotations

import os

import pytest

from cuda_agent.environment import Status, VerifyConfig

from support import EXAMPLES

pytestmark = pytest.mark.gpu

RELU_TASK = EXAMPLES / "tasks" / "relu.py"
RELU_WORKDIR = EXAMPLES / "solutions" / "cuda_workdir" / "relu"


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox switches users only as root")
def test_sandboxed_candidate_runs_cuda_kernels(run_evaluation, make_cuda_config) -> None:
    verdict = run_evaluation(RELU_TASK, RELU_WORKDIR, make_cuda_config())
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.environment["sandbox"].startswith("uid ")
    assert int(verdict.environment["sm_clock_mhz_timing"]) > 0  # read from NVML by the parent, beside the timing


def test_host_clock_and_cuda_events_agree_on_a_kernel_of_known_length() -> None:
    import torch

    from cuda_agent.environment import TimingConfig
    from cuda_agent.environment.timing import make_timer, measure

    config = TimingConfig(warmup_ms=50, budget_s=1.0, flush_l2=False)
    run = lambda: torch.cuda._sleep(2_000_000)  # noqa: E731 - ~1 ms of GPU time, no memory traffic
    events = measure(run, make_timer("cuda", config), config).median_ms
    host = measure(run, make_timer("cuda", config, host_clock=True), config).median_ms
    assert events > 0.2 and host == pytest.approx(events, rel=0.2)


def test_a_busy_gpu_reads_its_clock_ramped_so_timing_loops_skip_the_warm_up_wait() -> None:
    import time

    import torch

    from cuda_agent.environment.device_clock import sm_clock_ramped

    x = torch.randn(2048, 2048, device="cuda")
    started = time.monotonic()
    while time.monotonic() - started < 0.5:  # NVML's reading averages over up to a second
        x @ x
        torch.cuda.synchronize()
    assert sm_clock_ramped("cuda")


def test_speedup_above_the_plausibility_bound_is_remeasured_with_the_host_clock(run_evaluation,
                                                                                 make_cuda_config) -> None:
    """A bound just above 1x makes the honest sample "implausible" whenever it beats eager."""
    verdict = run_evaluation(RELU_TASK, RELU_WORKDIR, make_cuda_config(verify=VerifyConfig(plausible_speedup=1.0001)))
    assert verdict.status is Status.CORRECT, verdict.error
    remeasured = [n for n in verdict.notes if "re-measured with the host clock" in n]
    print("plausibility notes:", remeasured or "none (the sample did not beat eager)")
    assert all("the slower one counts" in n for n in remeasured)
