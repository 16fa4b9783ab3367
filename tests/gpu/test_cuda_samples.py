"""Every bundled CUDA sample solution (single file and workdir) verifies on the GPU with reward >= 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.environment import Status
from cuda_agent.environment.reward import milestone_reward

from support import EXAMPLES

pytestmark = pytest.mark.gpu

CUDA_SAMPLES = [
    *[pytest.param(path, id=f"single-file/{path.stem}")
      for path in sorted((EXAMPLES / "solutions" / "cuda").glob("*.py"))],
    *[pytest.param(path, id=f"workdir/{path.name}")
      for path in sorted((EXAMPLES / "solutions" / "cuda_workdir").iterdir()) if path.is_dir()],
]


def sample_task(solution: Path) -> Path:
    return EXAMPLES / "tasks" / f"{solution.stem if solution.is_file() else solution.name}.py"


@pytest.mark.parametrize("solution", CUDA_SAMPLES)
def test_cuda_sample_solution_is_correct_and_rewarded(run_evaluation, make_cuda_config, solution: Path) -> None:
    verdict = run_evaluation(sample_task(solution), solution, make_cuda_config())
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.compiled and verdict.correct and verdict.violations == []
    assert verdict.reward >= 1
    assert verdict.reward == milestone_reward(True, verdict.speedup_vs_eager, verdict.speedup_vs_compile)
    assert all(t.passed for t in verdict.trials), [t.message for t in verdict.trials if not t.passed]
    assert verdict.candidate_ms > 0 and verdict.eager_ms > 0
    assert verdict.environment.get("gpu")
