"""The evaluator times short calls in audited batches, and only while side streams are forbidden."""

from __future__ import annotations

import pytest

from cuda_agent.environment import Status, TimingConfig

from support import FAST_TIMING, SMALL_RELU_TASK

pytestmark = pytest.mark.slow  # uses the shared fault-kernel build

BATCHED = TimingConfig(**{**FAST_TIMING.__dict__, "batch_min_ms": 5.0})
_WRONG_AFTER_TEN_CALLS = """
import torch
import torch.nn as nn

import cuda_extension

_calls = [0]


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        _calls[0] += 1
        if _calls[0] <= 10:
            cuda_extension.relu_ok(x.data_ptr(), out.data_ptr(), x.numel())
        else:
            cuda_extension.relu_slightly_wrong(x.data_ptr(), out.data_ptr(), x.numel())
        return out
"""


def test_short_calls_are_timed_in_batches_and_every_audit_passes(run_evaluation, fault_solution, make_config) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("relu_ok"), make_config(timing=BATCHED))
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.candidate_timing.calls_per_sample > 1  # a 64x256 ReLU takes microseconds
    assert all(b.calls_per_sample > 1 for b in verdict.baselines.values())  # like for like


def test_a_wrong_result_on_batched_timed_calls_is_caught_by_the_audit(run_evaluation, fault_solution,
                                                                      make_config) -> None:
    """Right when verified, wrong on every call after the first few (a call counter): every
    audited call inside the batches is wrong."""
    solution = fault_solution("relu_ok")
    (solution / "model_new.py").write_text(_WRONG_AFTER_TEN_CALLS)
    verdict = run_evaluation(SMALL_RELU_TASK, solution, make_config(timing=BATCHED))
    assert verdict.status is Status.GUARD_VIOLATION
    assert [v.code for v in verdict.violations] == ["timed-output-incorrect"], verdict.error


def test_batches_are_off_when_the_static_guards_allow_side_streams(run_evaluation, fault_solution,
                                                                  runtime_only_config) -> None:
    config = runtime_only_config.replace(timing=BATCHED)
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("relu_ok"), config)
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.candidate_timing.calls_per_sample == 1
