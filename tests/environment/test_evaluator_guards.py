"""Runtime guards, weight transfer and reward hacks, end to end on CPU.

Every cheating fixture (tests/fixtures/solutions, fault kernels) has a header explaining its trick.
"""

from __future__ import annotations

import pytest

from cuda_agent.environment import Status

from support import FIXTURES, SMALL_RELU_TASK

pytestmark = pytest.mark.slow  # builds (or reuses) compiled extensions

SOLUTIONS = FIXTURES / "solutions"
TASKS = FIXTURES / "tasks"


def violation_codes(verdict) -> list[str]:
    return [v.code for v in verdict.violations]


# -- runtime guards ----------------------------------------------------------------------------

def test_output_aliasing_the_input_is_a_guard_violation(run_evaluation, fault_solution) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("return_input"))
    assert verdict.status is Status.GUARD_VIOLATION, verdict.error
    assert violation_codes(verdict) == ["output-aliases-input"]
    assert verdict.reward == -1 and not verdict.correct
    assert "output 0 shares memory with an input" in verdict.error


def test_in_place_input_mutation_is_a_guard_violation(run_evaluation, fault_solution) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, fault_solution("relu_mutating_input"))
    assert verdict.status is Status.GUARD_VIOLATION, verdict.error
    assert violation_codes(verdict) == ["input-mutated"]
    assert verdict.reward == -1
    assert "forward() modified input 0 in place" in verdict.error


@pytest.mark.parametrize(
    ("solution", "code"),
    [("returns_parameter.py", "output-not-plain-tensor"), ("returns_numpy.py", "output-unsupported-type")],
)
def test_outputs_that_are_not_plain_tensors_are_guard_violations(run_evaluation, runtime_only_config,
                                                                 solution: str, code: str) -> None:
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / solution, runtime_only_config)
    assert verdict.status is Status.GUARD_VIOLATION, verdict.error
    assert code in violation_codes(verdict)
    assert verdict.reward == -1


def test_guards_hold_when_the_candidate_patches_the_worker(run_evaluation, runtime_only_config) -> None:
    """The candidate replaces the worker's ``_runtime_violations`` from inside its own process, then
    returns its (ReLU'd in place) input. Guards that the candidate can switch off do not guard."""
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / "guard_bypass_patches_worker.py", runtime_only_config)
    assert verdict.reward == -1, f"guard bypass earned reward {verdict.reward} ({verdict.status.value})"
    assert verdict.status is Status.GUARD_VIOLATION
    assert "output-aliases-input" in violation_codes(verdict)


# -- reward hacks on the trusted side ----------------------------------------------------------

def test_forged_output_file_is_the_candidates_failure_not_a_task_error(run_evaluation, runtime_only_config) -> None:
    """A candidate that swaps the harness's output sharing must fail as a candidate, never be
    reported as TASK_ERROR ("the reference itself failed: not the candidate's fault"). The swap
    itself is detected by the harness-integrity snapshot before the forged file is judged."""
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / "forged_output_file.py", runtime_only_config)
    assert verdict.reward == -1
    assert verdict.status is not Status.TASK_ERROR, verdict.error
    assert verdict.status is Status.GUARD_VIOLATION
    assert "harness-tampered" in violation_codes(verdict)
    assert "shared_tensors.share" in verdict.error


def test_timing_is_not_fooled_by_caching_on_input_identity(run_evaluation, plain_torch_config) -> None:
    """The fixture's real cost is > 50 ms per call, far slower than eager matmul; only a timing
    loop that re-feeds the same tensor objects can see it as faster than eager."""
    verdict = run_evaluation(TASKS / "small_matmul.py", SOLUTIONS / "cache_by_input_identity.py", plain_torch_config)
    assert verdict.reward < 2, (
        f"cached result timed as {verdict.candidate_ms:.4g} ms vs eager {verdict.eager_ms:.4g} ms "
        f"(speed-up {verdict.speedup_vs_eager:.3g}x, reward {verdict.reward})"
    )


@pytest.mark.parametrize("solution", [
    "cache_by_input_identity.py", "forged_output_file.py", "guard_bypass_patches_worker.py", "oom_in_forward.py",
    "returns_numpy.py", "returns_parameter.py", "segfault_ctypes.py",
])
def test_static_guards_reject_the_python_level_cheats_before_anything_runs(run_evaluation, solution: str) -> None:
    """Defence in depth: the cheats above are also rejected statically, before build or import."""
    verdict = run_evaluation(SMALL_RELU_TASK, SOLUTIONS / solution)
    assert verdict.status is Status.GUARD_VIOLATION, verdict.error
    assert verdict.reward == -1 and not verdict.compiled and verdict.violations
    assert "guards" in verdict.phase_seconds and "build" not in verdict.phase_seconds


# -- weights -----------------------------------------------------------------------------------

def test_renamed_parameter_with_equal_values_needs_no_note(run_evaluation, plain_torch_config) -> None:
    verdict = run_evaluation(TASKS / "scale.py", SOLUTIONS / "scale_renamed_same_init.py", plain_torch_config)
    assert verdict.status is Status.CORRECT, verdict.error
    assert not [n for n in verdict.notes if n.startswith("weights:")]


def test_renamed_parameter_with_other_values_gets_a_weights_note_in_the_error(run_evaluation, plain_torch_config) -> None:
    verdict = run_evaluation(TASKS / "scale.py", SOLUTIONS / "scale_renamed_other_init.py", plain_torch_config)
    assert verdict.status is Status.INCORRECT, verdict.error
    weight_notes = [n for n in verdict.notes if n.startswith("weights:")]
    assert weight_notes == [
        "weights: Model.weight (128,) was not transferred: ModelNew has no parameter or buffer of that name "
        "with equal values; its weights differ from the reference's, so outputs will differ"
    ]
    assert verdict.error.startswith("trial 0 (standard): ")
    assert weight_notes[0] in verdict.error


def test_parameter_with_another_shape_gets_a_note_even_when_outputs_match(run_evaluation, plain_torch_config,
                                                                         tmp_path) -> None:
    """ModelNew's ``weight`` is (1, dim) instead of (dim,): not transferable, but built from the same
    seed and broadcast the same way, so the outputs match; the note is informational only."""
    solution = tmp_path / "scale_other_shape.py"
    solution.write_text(
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, dim):\n        super().__init__()\n"
        "        self.weight = nn.Parameter(torch.randn(1, dim))\n\n"
        "    def forward(self, x):\n        return x * self.weight\n"
    )
    verdict = run_evaluation(TASKS / "scale.py", solution, plain_torch_config)
    assert verdict.status is Status.CORRECT, verdict.error
    assert any(n.startswith("weights: Model.weight (128,) was not transferred: ModelNew has shape (1, 128)")
               for n in verdict.notes), verdict.notes
