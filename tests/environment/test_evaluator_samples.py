"""End to end on CPU: every bundled CPU sample solution builds, verifies, profiles and earns a reward.

Each sample compiles once per session (shared cache), so these are the slowest tests of the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cuda_agent.environment import Status
from cuda_agent.environment.reward import milestone_reward

from support import EXAMPLES, SMALL_RELU_TASK

pytestmark = pytest.mark.slow  # builds (or reuses) compiled extensions

CPU_SAMPLES = [
    *[pytest.param(path, id=f"single-file/{path.stem}")
      for path in sorted((EXAMPLES / "solutions" / "cpu").glob("*.py"))],
    *[pytest.param(path, id=f"workdir/{path.name}")
      for path in sorted((EXAMPLES / "solutions" / "cpu_workdir").iterdir()) if path.is_dir()],
]


def sample_task(solution: Path) -> Path:
    return EXAMPLES / "tasks" / f"{solution.stem if solution.is_file() else solution.name}.py"


def test_every_cpu_sample_has_a_task() -> None:
    assert len(CPU_SAMPLES) >= 2
    for param in CPU_SAMPLES:
        assert sample_task(param.values[0]).is_file()


@pytest.mark.parametrize("solution", CPU_SAMPLES)
def test_cpu_sample_solution_is_correct_and_rewarded(run_evaluation, solution: Path) -> None:
    verdict = run_evaluation(sample_task(solution), solution)

    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.compiled and verdict.correct and verdict.error is None
    assert verdict.violations == []
    assert verdict.reward >= 1
    assert verdict.reward == milestone_reward(True, verdict.speedup_vs_eager_lower, verdict.speedup_vs_compile_lower)
    assert verdict.speedup_vs_eager_lower <= verdict.speedup_vs_eager  # strict: a 95 % lower bound

    kinds = [t.kind for t in verdict.trials]
    assert kinds.count("standard") == 5 and "scaled" in kinds and kinds[-1] == "post_timing"
    assert all(t.passed for t in verdict.trials), [t.message for t in verdict.trials if not t.passed]

    assert verdict.candidate_ms is not None and verdict.candidate_ms > 0
    assert verdict.eager_ms is not None and verdict.eager_ms > 0
    assert verdict.speedup_vs_eager == pytest.approx(verdict.eager_ms / verdict.candidate_ms)
    assert verdict.compile_ms is None and verdict.speedup_vs_compile is None  # compile baseline off
    assert verdict.precision_policy == "faithful" and verdict.device == "cpu"
    assert verdict.build is not None
    phases = verdict.phase_seconds
    assert set(phases) >= {"guards", "workers", "prepare", "build_wait", "baselines", "load", "verify", "profile",
                           "post_timing", "teardown", "total"}
    # the phases partition the wall time
    assert sum(v for k, v in phases.items() if k != "total") == pytest.approx(phases["total"], rel=1e-6)


def test_second_evaluation_hits_the_build_cache(run_evaluation, fault_solution) -> None:
    first = run_evaluation(SMALL_RELU_TASK, fault_solution("relu_ok"))
    second = run_evaluation(SMALL_RELU_TASK, fault_solution("relu_ok"))
    assert first.status is Status.CORRECT and second.status is Status.CORRECT, (first.error, second.error)
    assert second.build is not None and second.build.cached
    assert second.build.key == first.build.key
    assert second.build.seconds < 5.0
