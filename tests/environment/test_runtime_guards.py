"""Runtime guards in the candidate worker, each tested with the static guards off (defence in depth)."""

from __future__ import annotations

from cuda_agent.environment import Status

from support import FIXTURES, SMALL_RELU_TASK

SOLUTIONS = FIXTURES / "solutions"


def _codes(verdict) -> list[str]:
    return [v.code for v in verdict.violations]


def test_forward_that_never_calls_the_extension_is_no_custom_kernel(run_evaluation, runtime_only_config) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / "no_extension_call.py", runtime_only_config)
    assert verdict.status is Status.GUARD_VIOLATION, verdict.error
    assert "no-custom-kernel" in _codes(verdict)
    assert verdict.reward == -1


def test_work_finished_by_a_background_thread_is_caught(run_evaluation, plain_torch_config) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / "deferred_thread.py", plain_torch_config)
    assert verdict.status is Status.GUARD_VIOLATION, verdict.error
    assert {"thread-left-running", "output-changed-after-return"} & set(_codes(verdict))
    assert verdict.reward == -1


def test_honest_workdir_kernel_passes_the_runtime_guards(run_evaluation, fault_solution) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("relu_ok"))
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.violations == []
