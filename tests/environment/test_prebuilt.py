"""Single-file candidates load what the protected build compiled, never compile themselves."""

from __future__ import annotations

import pytest

from cuda_agent.environment import Status

from support import FIXTURES, SMALL_RELU_TASK

pytestmark = pytest.mark.slow  # builds an extension


def test_load_inline_with_other_sources_than_the_build_fails_to_load(run_evaluation, runtime_only_config) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, FIXTURES / "solutions" / "sources_differ_per_import.py",
                             runtime_only_config)
    assert verdict.compiled and verdict.status is Status.RUNTIME_ERROR, verdict.error
    assert "PrebuiltMismatch" in verdict.error and "other sources or flags" in verdict.error
