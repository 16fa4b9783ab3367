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


def test_cold_cuda_builds_take_the_lean_path(run_evaluation, make_cuda_config, tmp_path: Path) -> None:
    """A fresh copy of each layout: the single file's C++ unit uses the precompiled header, the
    workdir (the fast contract) compiles no torch header, and each .cu unit compiles with nvcc's
    front ends side by side (not silently the slow way)."""
    import secrets
    import shutil

    run = secrets.token_hex(8)  # new sources even on a cache kept between test runs
    single = tmp_path / "relu.py"
    source = (EXAMPLES / "solutions" / "cuda" / "relu.py").read_text()
    single.write_text(source.replace('cuda_source = r"""', f'cuda_source = r"""\n// {run}\n', 1))
    workdir = tmp_path / "relu"
    shutil.copytree(EXAMPLES / "solutions" / "cuda_workdir" / "relu", workdir)
    kernel = workdir / "kernels" / "relu.cu"
    kernel.write_text(kernel.read_text() + f"\n// {run}\n")
    for solution in (single, workdir):
        verdict = run_evaluation(EXAMPLES / "tasks" / "relu.py", solution, make_cuda_config())
        assert verdict.status is Status.CORRECT, verdict.error
        stats = verdict.build.compile_stats
        print(solution.name, f"{verdict.build.seconds:.1f} s", stats)
        assert not verdict.build.cached and stats["phased_cuda_units"] == 1, stats
        if solution is single:
            assert stats["pch_units"] + stats["object_cache_hits"] >= 1, stats
        else:  # the fast contract: relu.cu and the launcher table, neither includes a torch header
            assert stats["units"] == 2 and stats["pch_units"] == 0, stats
