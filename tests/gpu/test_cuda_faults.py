"""A CUDA kernel with an illegal memory access fails cleanly, and the GPU stays usable after it."""

from __future__ import annotations

import pytest

from cuda_agent.environment import Status

from support import EXAMPLES, FIXTURES

pytestmark = pytest.mark.gpu


def test_illegal_memory_access_is_a_runtime_error_and_next_evaluation_succeeds(run_evaluation,
                                                                               make_cuda_config) -> None:
    relu_task = EXAMPLES / "tasks" / "relu.py"
    verdict = run_evaluation(relu_task, FIXTURES / "cuda_illegal_access.py", make_cuda_config())
    assert verdict.compiled, verdict.error
    assert not verdict.correct and verdict.reward == -1
    assert verdict.status is Status.RUNTIME_ERROR, f"{verdict.status}: {verdict.error}"
    assert verdict.error and "illegal memory access" in verdict.error.lower()

    honest = run_evaluation(relu_task, EXAMPLES / "solutions" / "cuda" / "relu.py", make_cuda_config())
    assert honest.status is Status.CORRECT, honest.error
    assert honest.reward >= 1
