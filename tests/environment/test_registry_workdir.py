"""The paper's released workdir layout (binding.cpp, binding_registry.h, kernels/ with
REGISTER_BINDING) builds with the harness's own registry and verifies on the CPU backend."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cuda_agent.environment import Status, load_solution
from cuda_agent.environment.solution import Layout, SolutionError

from support import EXAMPLES, FIXTURES

WORKDIR = FIXTURES / "paper_workdir" / "cpu_axpby"


def test_registry_files_mark_the_released_layout() -> None:
    solution = load_solution(WORKDIR)
    assert solution.layout is Layout.WORKDIR and solution.binding_style == "registry"
    assert [p.name for p in solution.kernel_files] == ["axpby.cpp", "axpby_binding.cpp"]
    ours = load_solution(EXAMPLES / "solutions" / "cpu_workdir" / "rmsnorm")
    assert ours.binding_style == "register" and ours.content_hash() != solution.content_hash()


def test_registry_workdir_without_kernels_is_a_solution_error(tmp_path: Path) -> None:
    (tmp_path / "model_new.py").write_text("class ModelNew:\n    pass\n")
    (tmp_path / "binding_registry.h").write_text("#pragma once\n")
    with pytest.raises(SolutionError, match="needs its kernels in kernels/"):
        load_solution(tmp_path)


@pytest.mark.slow
def test_released_layout_builds_and_verifies_and_its_own_registry_is_not_compiled(run_evaluation, tmp_path: Path) -> None:
    verdict = run_evaluation(WORKDIR / "model.py", WORKDIR)
    assert verdict.status is Status.CORRECT, verdict.error
    assert verdict.compiled and verdict.reward >= 1 and verdict.violations == []

    # The workdir's binding.cpp and binding_registry.h are infrastructure the candidate may not
    # change: broken copies change nothing (not even the build key: the same build serves).
    tampered = tmp_path / "tampered"
    shutil.copytree(WORKDIR, tampered)
    (tampered / "binding_registry.h").write_text('#error "the harness must not compile this"\n')
    (tampered / "binding.cpp").write_text('#error "nor this"\n')
    again = run_evaluation(WORKDIR / "model.py", tampered)
    assert again.status is Status.CORRECT, again.error
    assert again.build.cached
